"""Every sentence `ddplan plan` prints about a search: the choice, why each other family loses, what
memory forces, the Pareto front. The rendering layer's words (ddplan.verdicts has the table's, memory's
and calibrate's); ddplan.plan returns rows and facts.
"""

from __future__ import annotations

from ddplan import render
from ddplan.frameworks import LACK_WORDS, REFUSED
from ddplan.layout import FAMILIES, NATIVE_ZERO, context_parallel_degrees
from ddplan.price import TIE, best_per_pair
from ddplan.specs import ModelSpec
from ddplan.units import hours_band
from ddplan.verdicts import dp_option_words


def describe(r: dict) -> str:
    parts = [f"{r['gpus']}x {r['hardware']}", f"dp {r['dp']}"]
    if r["tp"] > 1:
        parts.append(f"tp {r['tp']}")
    if r["pp"] > 1:
        parts.append(f"pp {r['pp']} ({r['schedule']})")
    if r.get("cp", 1) > 1:
        parts.append(f"cp {r['cp']}")
    if r.get("ep", 1) > 1:
        parts.append(f"ep {r['ep']}" + (" (etp 1)" if r.get("etp", r["tp"]) != r["tp"] else ""))
    parts += [f"ZeRO-{r['zero']}{' (native)' if r['native'] else ''}", f"micro-batch {r['micro_batch']} x "
              f"{r['accum']}", r["attention"]]
    if r["recompute"] != "none":
        parts.append(f"recompute {r['recompute']}")
    if "_priced" in r:
        parts += dp_option_words(r["_priced"].layout)
    return ", ".join(parts)


def _terms(r: dict) -> dict[str, float]:
    return {"compute": r["compute_s"], "data-parallel communication": r["dp_comm_exposed_s"],
            "tensor-parallel all-reduces": r["tp_comm_s"], "context-parallel exchange": r["cp_comm_s"],
            "expert token exchange": r.get("ep_comm_s", 0.0),
            "pipeline bubble": r["bubble_s"],
            "optimizer": r["optimizer_s"]}


def expert_lines(r: dict, spec: ModelSpec) -> list[str]:
    """For a mixture-of-experts model: how many of each MoE block's routed experts a GPU holds, and what
    their token exchange costs a step (ddplan.comm.moe_layer_comm_s)."""
    moe = spec.architecture.moe
    if moe is None:
        return []
    ep = r.get("ep", 1)
    lay = r["_priced"].layout if "_priced" in r else None
    split = lay.expert_tp if lay is not None else 1
    held = moe.num_experts // ep
    rows = f", each split over {split} tensor-parallel GPUs" if split > 1 else ""
    if ep == 1:
        return [f"Experts: every GPU holds all {moe.num_experts} routed experts of each MoE block (no expert "
                f"parallelism{rows}); top {moe.top_k} of them run for each token."]
    return [f"Experts: ep {ep} splits each MoE block's {moe.num_experts} routed experts {held} a GPU{rows}; each "
            f"token's top {moe.top_k} reach theirs by all-to-all over the ep group (and gathers over tp where the "
            f"experts split over it): {1000 * r.get('ep_comm_s', 0.0):.0f} ms a step exposed."]


def zero3_lines(r: dict) -> list[str]:
    """For a ZeRO-3 choice: one micro-batch's parameter all-gathers and gradient reduce-scatter against its
    compute, and what of them is exposed (ddplan.comm.fsdp_comm_s), per micro-batch and per step; under a pipeline,
    the step's (ddplan.comm.fsdp_pipelined_comm_s)."""
    priced = r.get("_priced")
    if priced is None or r["zero"] != 3 or not priced.step.mb_gather_s + priced.step.mb_scatter_s:
        return []
    st, lay = priced.step, priced.layout
    if lay.pp > 1:  # torch.distributed.pipelining's FSDP2 (comm.fsdp_pipelined_comm_s)
        gathered = ("in each micro-batch's backward" if lay.reshard_after_forward else
                    "once, under the first micro-batch's forward, and keeps them")
        return [f"ZeRO-3 under the pipeline: each stage all-gathers its parameters {gathered} "
                f"({1000 * st.mb_gather_s:.1f} ms a step) and reduce-scatters its accumulated gradients once, after "
                f"its last backward ({1000 * st.mb_scatter_s:.1f} ms): {1000 * st.dp_comm_exposed_s:.0f} ms a step "
                f"exposed."]
    passes = "forward and backward" if lay.reshard_after_forward else "forward only, kept for backward"
    mb = st.fwd_s + st.bwd_s
    return [f"ZeRO-3: each micro-batch all-gathers its parameters in {1000 * st.mb_gather_s:.1f} ms ({passes}) and "
            f"reduce-scatters its gradients in {1000 * st.mb_scatter_s:.1f} ms, prefetched under its "
            f"{1000 * mb:.1f} ms of compute: {1000 * st.dp_comm_exposed_s / st.accum:.1f} ms a micro-batch exposed "
            f"({1000 * st.dp_comm_exposed_s:.0f} ms a step)."]


FAMILY_LACK = {"+TP": "tp", "+CP": "cp", "+PP": "pp"}  # a layout family and what a stack lacks to run it


def _lack_of(fam: str, lacks: frozenset[str]) -> str | None:
    """What the stack lacks that rules the family out (ddplan.frameworks.LACKS), None where nothing does."""
    if FAMILY_LACK.get(fam) in lacks:
        return FAMILY_LACK[fam]
    return "tied_embeddings_with_pp" if fam == "+PP" and "tied_embeddings_with_pp" in lacks else None


def reasons(rows: list[dict], spec: ModelSpec, cps: tuple[int, ...] = (), lacks: frozenset[str] = frozenset(),
            framework: str | None = None) -> list[str]:
    """The top choice in plain words, and for the best of each other family why it loses, in figures.
    cps: the context-parallel degrees searched (() = layout.context_parallel_degrees of the sequence); lacks: what
    the `framework` stack cannot run (ddplan.plan.PlanRequest.lacks), whose families were not searched."""
    top = rows[0]
    out = [f"Choice: {describe(top)}{'' if top['native'] else ' (needs another training setup than the model ships)'}"
           f": {top['step_s']:.3f} s/step, {render.duration(top['wall_clock_h'])}"
           + (f" ({hours_band(top['wall_low_h'], top['wall_high_h'])})" if "wall_low_h" in top else "")
           + f", ${top['cost_usd']:,.0f}"
           + (f" (${top['cost_low_usd']:,.0f}-${top['cost_high_usd']:,.0f})" if "cost_low_usd" in top else "")
           + f", MFU {top['mfu_pct']:.1f}%, {top['memory_gib']:.0f} of "
           f"{top['usable_gib']:.0f} GiB per GPU."]
    t = _terms(top)
    main = max(t, key=t.get)
    out.append(f"Its step is {100 * t['compute'] / top['step_s']:.0f}% compute; the largest other term is "
               + (f"{max((k for k in t if k != 'compute'), key=t.get)} "
                  f"({1000 * max(v for k, v in t.items() if k != 'compute'):.0f} ms)." if main == "compute"
                  else f"{main} ({1000 * t[main]:.0f} ms)."))
    out += zero3_lines(top)
    out += expert_lines(top, spec)
    native_zero = NATIVE_ZERO[spec.recipe.distribution]
    searched_cp = max(cps or context_parallel_degrees(spec.recipe.seq_len)) > 1
    for fam in FAMILIES:
        if fam == "+CP" and not searched_cp:
            continue  # sequences too short for context parallelism (layout.context_parallel_degrees)
        cands = [r for r in rows if r["family"] == fam and r["gpus"] == top["gpus"] and r["hardware"] == top["hardware"]]
        if fam == top["family"] or not cands:
            if fam == "+ZeRO/FSDP" and native_zero == 3:
                out.append(f"{fam}: the model's own setup already shards everything (ZeRO-3 / FSDP); those "
                           f"layouts count as pure DP here.")
            elif not cands and fam != top["family"] and _lack_of(fam, lacks):
                lack = _lack_of(fam, lacks)
                verb = "refuses" if lack in REFUSED else "has no"
                out.append(f"{fam}: not searched, as {framework} {verb} {LACK_WORDS[lack]}.")
            elif not cands and fam != top["family"]:
                out.append(f"{fam}: no layout of this family fits and divides on {top['gpus']} GPUs.")
            continue
        best = cands[0]
        dt, dc = best["wall_clock_h"] - top["wall_clock_h"], best["cost_usd"] - top["cost_usd"]
        key = "wall_clock_h"
        if best[key] >= top[key] * (1 - TIE) and best[key] <= top[key] * (1 + TIE):
            out.append(f"{fam} ties: best is {describe(best)}: {render.duration(best['wall_clock_h'])} ({render.signed(dt)} h), "
                       f"${best['cost_usd']:,.0f} ({render.signed(dc)}), within {100 * TIE:.0f}% of the choice, inside the "
                       f"model's error: the simpler setup is kept"
                       + (f"; it would save {top['memory_gib'] - best['memory_gib']:.0f} GiB per GPU, not needed"
                          if best["memory_gib"] < top["memory_gib"] else "") + ".")
            continue
        diffs = {k: v - t[k] for k, v in _terms(best).items()}
        worst = max(diffs, key=diffs.get)
        why = (f"{worst} +{1000 * diffs[worst]:.0f} ms/step" if diffs[worst] > 0 else "no single term")
        extra = ""
        if fam == "+ZeRO/FSDP" and best["memory_gib"] < top["memory_gib"]:
            extra = f"; it saves {top['memory_gib'] - best['memory_gib']:.0f} GiB per GPU, which the choice does not need"
        out.append(f"{fam} loses: best is {describe(best)}: {render.duration(best['wall_clock_h'])} ({render.signed(dt)} h), "
                   f"${best['cost_usd']:,.0f} ({render.signed(dc)}); {why}{extra}.")
    return out


def plan_no_rows(result) -> list[str]:
    """Why a search kept nothing."""
    out = []
    if result.rejected.get("memory"):
        out.append(f"No layout fits in memory ({result.rejected['memory']:,} tried): more GPUs, a smaller model or a "
                   f"larger-memory GPU.")
    if result.rejected.get("divisibility"):
        out.append(f"{result.rejected['divisibility']:,} layouts do not divide evenly, e.g. "
                   f"{result.why_not['divisibility']}.")
    if not result.considered:
        cp = result.request.cps if result.request is not None else ()
        ep = result.request.eps if result.request is not None else ()
        out.append("No candidate layout: check --gpus against the heads, layers and batch"
                   + (f", and --cp {','.join(map(str, cp))} against the GPUs and the attention kernels" if cp else "")
                   + (f", and --ep {','.join(map(str, ep))} against the experts and the data-parallel GPUs (ep must "
                      f"divide both)" if ep else "")
                   + ".")
    return out


def plan_reasons(result) -> list[str]:
    """The choice, why each other family loses, what memory forces, and whether the choice's price is assumed (a
    spec's price whose source says so: no listing)."""
    if not result.rows:
        return plan_no_rows(result)
    headroom = result.request.headroom
    req = result.request
    out = reasons(result.rows, req.model, req.cps, req.lacks, req.framework)
    top = result.rows[0]
    price = next(hw.price for hw in result.request.hardware if hw.name == top["hardware"])
    if result.request.price is None and price.source.startswith("assumed"):  # a spec's price with no listing
        out.append(f"Its price is assumed, not a listing: ${price.usd_per_gpu_hour:g}/GPU-h for {top['hardware']} "
                   f"({price.provider}: its spec's price source says how); `--price` sets yours.")
    forced = result.memory_forces
    if "recompute" in forced:
        figures = ", ".join(f"recompute {rc} needs {gib:.0f} GiB" for rc, gib in forced["recompute"])
        out.append(f"Memory forces recompute {top['recompute']}: with the same layout, {figures}, against "
                   f"{(1 - headroom) * top['usable_gib']:.0f} GiB usable ({100 * (1 - headroom):.0f}% of "
                   f"{top['usable_gib']:.0f}).")
    if "zero" in forced:
        out.append(f"Memory forces ZeRO-{top['zero']}: " + ", ".join(f"{name} would need {gib:.0f} GiB"
                                                                  for name, gib in forced["zero"]) + ".")
    return out + runner_up(result) + edge(result)


def _band(r: dict, key: str) -> tuple[float, float] | None:
    low, high = ("wall_low_h", "wall_high_h") if key == "wall_clock_h" else ("cost_low_usd", "cost_high_usd")
    return (r[low], r[high]) if low in r and high in r else None


def _ranked_by(result) -> str:
    """The row column the search ranked by, as ddplan.plan.search decides it: a deadline met ranks by cost,
    a budget met by time, a limit missed by the limit's own column."""
    req, missed = result.request, {what for what, _ in result.missed}
    key = "wall_clock_h" if req.objective == "time" else "cost_usd"
    for column, limit, what, then in (("wall_clock_h", req.deadline_h, "deadline", "cost_usd"),
                                      ("cost_usd", req.budget_usd, "budget", "wall_clock_h")):
        if limit is not None:
            key = column if what in missed else then
    return key


def runner_up(result) -> list[str]:
    """The best layout on other hardware or another GPU count, and whether its band overlaps the choice's
    (then the ranking between the two is inside ddplan's uncertainty, not a finding)."""
    pairs = best_per_pair(result.rows)
    if len(pairs) < 2:
        return []
    top, other = pairs[0], pairs[1]
    key = _ranked_by(result)
    mine, theirs = _band(top, key), _band(other, key)
    if mine is None or theirs is None:
        return []
    unit = (lambda x: f"{x:,.3g} h") if key == "wall_clock_h" else (lambda x: f"${x:,.0f}")
    figures = (f"{describe(other)}: {other['wall_clock_h']:,.3g} h ({other['wall_low_h']:,.3g}-"
               f"{other['wall_high_h']:,.3g}), ${other['cost_usd']:,.0f} ({other['cost_low_usd']:,.0f}-"
               f"{other['cost_high_usd']:,.0f})")
    if theirs[0] <= mine[1] and mine[0] <= theirs[1]:
        return [f"Runner-up, within uncertainty: {figures}; its band overlaps the choice's ({unit(mine[0])} to "
                f"{unit(mine[1])}), so ddplan cannot tell them apart: weigh the price and availability, or "
                f"calibrate both (`ddplan calibrate`)."]
    return [f"Runner-up: {figures}; outside the choice's band ({unit(mine[0])} to {unit(mine[1])}): the "
            f"choice wins beyond ddplan's uncertainty."]


def edge(result) -> list[str]:
    """Whether the choice sits at the largest or smallest GPU count searched (when more than one was)."""
    counts = sorted(set(result.request.gpus))
    gpus = result.rows[0]["gpus"]
    if len(counts) < 2 or counts[0] < gpus < counts[-1]:
        return []
    if gpus == counts[-1]:
        return [f"The choice is at the edge of the search, the most GPUs searched ({gpus:,}): try more GPUs "
                f"(e.g. --gpus {gpus}-{4 * gpus})."]
    return [f"The choice is at the edge of the search, the fewest GPUs searched ({gpus:,}): try fewer GPUs "
            f"(e.g. --gpus {max(1, gpus // 4)}-{gpus})."]


def pareto_lines(result, limit: int = 8) -> list[str]:
    """The layouts no other beats on both wall-clock and cost, one line each, the choice marked. The choice
    can be off the front: among layouts within TIE of the best, plan keeps the simplest (ddplan.plan._rank),
    which a slightly faster and cheaper but harder setup may dominate; then a last line says so."""
    top = result.rows[0] if result.rows else None
    out = [f"{describe(r)}: {render.duration(r['wall_clock_h'])}, ${r['cost_usd']:,.0f}"
           + (" (the choice)" if r is top else "") for r in result.pareto[:limit]]
    if top is not None and not any(r is top for r in result.pareto):
        by = next((r for r in result.pareto if r["wall_clock_h"] <= top["wall_clock_h"]
                   and r["cost_usd"] <= top["cost_usd"]), None)
        if by is not None:  # it dominates the choice: neither difference is positive
            dh, dc = top["wall_clock_h"] - by["wall_clock_h"], top["cost_usd"] - by["cost_usd"]
            took = f"{render.num(dh, 2)} h less" if dh > 0 else "as long"
            cost = f"${render.num(dc, 2)} less" if dc > 0 else "as much"
            key = "time" if result.ranked_by == "wall_clock_h" else "cost"
            out.append(f"The choice is off the front: {describe(by)} takes {took} and costs {cost}; within "
                       f"{100 * TIE:.0f}% of each other in {key} (the ranking's), inside the model's error, ddplan "
                       f"keeps the simpler setup (the model's own, fewer parallel dimensions, no recompute).")
    return out


COMM_TERMS = ("dp_comm_exposed_s", "tp_comm_s", "cp_comm_s", "ep_comm_s")  # a plan row's exposed communication
# assumed: the 22 runs of ddplan's dataset (validation/published_runs.yaml) that state their MFU report 12.0%
# (megatron-fsdp-qwen3-30b-a3b-gb200-8g) to 53.3% (llmfoundry-mpt70b-A100-80GB-64g-s2048-bf16); below 10% is under them all
LOW_MFU_PCT = 10.0


def plan_warnings(result) -> list[str]:
    out = []  # a missed deadline or budget is the command's error (missed_limit), not a warning
    if result.rows and result.rows[0]["mfu_pct"] < LOW_MFU_PCT:
        top = result.rows[0]
        out.append(f"the choice ({top['gpus']:,} GPUs) runs at MFU {top['mfu_pct']:.1f}%, far below the "
                   f"{LOW_MFU_PCT:g}% and more that real pre-training runs reach: {result.request.model.name} "
                   f"is too small for this many GPUs (exposed communication "
                   f"{100 * sum(top[k] for k in COMM_TERMS) / top['step_s']:.0f}% of the step, micro-batch "
                   f"{top['micro_batch']} x {top['accum']}); fewer GPUs cost less "
                   f"per token (see the Pareto lines), or search a smaller --gpus range")
    return out


def plan_title(spec: ModelSpec, result, top: int, headroom: float, objective: str) -> str:
    rej = result.rejected
    return (f"{spec.name}: best {min(top, len(result.rows))} of {len(result.rows):,} layouts that fit "
            f"({result.considered:,} considered; rejected: {rej['memory']:,} memory (> {100 * (1 - headroom):.0f}% "
            f"of usable), {rej['divisibility']:,} divisibility, {rej['dominated']:,} dominated by less recompute), "
            f"{ranking_words(result)}")


RANKED = {"wall_clock_h": "by time", "cost_usd": "by cost"}


def ranking_words(result) -> str:
    """How the rows are ranked, with the limits asked and whether each was met: 'by time', 'by time within the
    $500 budget', 'by cost within the 10 h deadline (no layout meets the $1 budget)'."""
    req, missed = result.request, dict(result.missed)
    words = RANKED[getattr(result, "ranked_by", None) or _ranked_by(result)]
    named = {"deadline": None if req.deadline_h is None else f"the {req.deadline_h:g} h deadline",
             "budget": None if req.budget_usd is None else f"the ${req.budget_usd:,.0f} budget"}
    met = [text for what, text in named.items() if text and what not in missed]
    lost = [text for what, text in named.items() if text and what in missed]
    if met:
        words += f" within {' and '.join(met)}"
    if lost:
        words += f" (no layout meets {' and '.join(lost)})"
    return words


def missed_limit(result) -> str | None:
    """When no layout meets the deadline or budget: how far the layout nearest to each missed limit is from it
    (the cheapest for a budget, the fastest for a deadline, over every kept layout), one sentence."""
    if not result.missed or not result.rows:
        return None
    parts = []
    for what, limit in result.missed:
        if what == "budget":
            near = min(result.rows, key=lambda r: r["cost_usd"])
            parts.append(f"no layout costs at most ${limit:,.0f}: the cheapest, {describe(near)}, costs "
                         f"${near['cost_usd']:,.0f} ({near['cost_usd'] / limit:.1f}x the budget)")
        else:
            near = min(result.rows, key=lambda r: r["wall_clock_h"])
            parts.append(f"no layout finishes within {limit:g} h: the fastest, {describe(near)}, takes "
                         f"{near['wall_clock_h']:,.1f} h ({near['wall_clock_h'] / limit:.1f}x the deadline)")
    return "; ".join(parts)
