"""`ddplan plan`: enumerate parallel layouts, keep those that fit and divide, rank them, and say why.

A layout is (hardware, GPUs, dp, tp, pp, ZeRO stage, micro-batch, accumulation, attention, recompute,
pipeline schedule). The same model as `ddplan table` prices each one (anatomy -> roofline -> step ->
run); what repeats across layouts (anatomies, rates, per-micro-batch times, memory) is computed once.
Rows are plain dicts; ranking and the Pareto front use pandas.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from ddplan import run
from ddplan.anatomy import build_anatomy, for_tp
from ddplan.calibration import CalibrationSpec
from ddplan.errors import LayoutError, UsageError
from ddplan.flops import mfu, nanochat_flops_per_token
from ddplan.layout import NATIVE_ZERO, Layout, check_layout
from ddplan.memory import MemoryAssumptions, memory_per_gpu, model_states
from ddplan.plan import _eval_cadence, calibrated_rates, comm_points
from ddplan.roofline import Rates, rates
from ddplan.specs import HardwareSpec, ModelSpec, Price
from ddplan.step import step_time
from ddplan.units import GiB

FAMILIES = ("pure DP", "+ZeRO/FSDP", "+TP", "+PP")
OBJECTIVES = ("time", "cost")


@dataclass(frozen=True)
class PlanRequest:
    model: ModelSpec
    hardware: tuple[HardwareSpec, ...]
    gpus: tuple[int, ...]
    objective: str = "time"
    deadline_h: float | None = None
    budget_usd: float | None = None
    top: int = 10
    calibration: CalibrationSpec | None = None
    price: Price | None = None
    overheads: run.RunOverheads = run.RunOverheads()
    total_batch_tokens: int | None = None
    tp_across_nodes: bool = False
    attentions: tuple[str, ...] = ()  # () = every implementation on each hardware
    recomputes: tuple[str, ...] = ("none", "selective", "full")
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    headroom: float = 0.05  # keep this fraction of usable memory free (fragmentation, spikes, other processes)


@dataclass
class PlanResult:
    rows: list[dict]  # every kept layout, ranked
    pareto: list[dict]
    reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    considered: int = 0
    rejected: dict[str, int] = field(default_factory=dict)


def family(layout: Layout, native_zero: int) -> str:
    """Which family a layout belongs to: pipeline first, then tensor parallel, then sharding."""
    if layout.pp > 1:
        return "+PP"
    if layout.tp > 1:
        return "+TP"
    if layout.zero > native_zero:  # sharding beyond what the model's own setup does
        return "+ZeRO/FSDP"
    return "pure DP"


def _powers_of_two_up_to(n: int) -> list[int]:
    return [2**i for i in range(int(math.log2(n)) + 1)] if n >= 1 else []


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def layouts_for(spec: ModelSpec, hw: HardwareSpec, gpus: int, total_batch: int, req: PlanRequest):
    """Candidate layouts on `gpus` GPUs of one kind, grouped: each yield is a list of layouts that differ
    only in micro-batch (ascending) and, within one micro-batch, in recompute (none, selective, full).

    The grouping lets the search stop early: memory grows with the micro-batch, so once one does not
    fit the larger ones are skipped; and where no recompute fits, selective and full (same layout,
    strictly more compute) are dominated and skipped.
    """
    a, seq = spec.architecture, spec.recipe.seq_len
    sequences = total_batch // seq
    tp_cap = gpus if req.tp_across_nodes else min(gpus, hw.gpus_per_node)
    impls = req.attentions or tuple(x.name for x in hw.attention)
    native = NATIVE_ZERO[spec.recipe.distribution]
    for tp in [t for t in _divisors(gpus) if t <= tp_cap and a.num_heads % t == 0 and a.num_kv_heads % t == 0]:
        for pp in [p for p in _divisors(gpus // tp) if a.num_layers % p == 0]:
            dp = gpus // (tp * pp)
            if sequences % dp:
                continue
            per_dp = sequences // dp
            schedules = [("1f1b", 1)] + ([("interleaved", 2)] if pp > 1 and a.num_layers % (2 * pp) == 0 else [])
            mbs = [m for m in _powers_of_two_up_to(min(per_dp, 64)) if per_dp % m == 0]
            for zero in (req.zero_stages if dp > 1 else (native,)):  # one rank: nothing to shard
                for attention in impls:
                    for sched, v in schedules:
                        yield [[Layout(dp=dp, tp=tp, pp=pp, zero=zero, micro_batch=mb, grad_accum=per_dp // mb,
                                       attention=attention, recompute=rc, compiled=spec.recipe.compiled,
                                       pp_schedule=sched, pp_virtual_stages=v) for rc in req.recomputes]
                               for mb in mbs]


class _Evaluator:
    """Prices layouts of one model on one hardware, caching what layouts share."""

    def __init__(self, req: PlanRequest, spec: ModelSpec, hw: HardwareSpec):
        self.req, self.spec, self.hw = req, spec, hw
        self.anatomies: dict = {}
        self.rates: dict[tuple[str, str], Rates] = {}
        self.memory: dict = {}
        self.states: dict = {}
        self.memo: dict = {}
        self.price = req.price or hw.price
        self.points = comm_points(req.calibration)
        self.native_zero = NATIVE_ZERO[spec.recipe.distribution]
        self.mfu_fpt = nanochat_flops_per_token(spec.architecture, spec.recipe.seq_len)

    def anatomy(self, layout: Layout):
        """The anatomy of a layout; recompute policies share one ops tuple (the ops do not change)."""
        key = (layout.micro_batch, layout.attention, layout.recompute, layout.tp)
        if key not in self.anatomies:
            base_key = (layout.micro_batch, layout.attention, "none", layout.tp)
            if base_key not in self.anatomies:
                one_key = (layout.micro_batch, layout.attention, "none", 1)
                if one_key not in self.anatomies:
                    impl = self.hw.attention_impl(layout.attention)
                    self.anatomies[one_key] = build_anatomy(self.spec, batch=layout.micro_batch, attention=impl.kind,
                                                            windows=impl.windows, compiled=layout.compiled)
                self.anatomies[base_key] = for_tp(self.anatomies[one_key], layout.tp)
            self.anatomies[key] = replace(self.anatomies[base_key], recompute=layout.recompute)
        return self.anatomies[key]

    def rate(self, attention: str, scenario: str) -> Rates:
        key = (attention, scenario)
        if key not in self.rates:
            self.rates[key] = calibrated_rates(rates(self.hw, attention, scenario), attention, self.req.calibration)
        return self.rates[key]

    def mem_gib(self, layout: Layout) -> float:
        in_flight = min(layout.pp, layout.grad_accum) if layout.pp > 1 else 1
        key = (layout.dp, layout.tp, layout.pp, layout.zero, layout.micro_batch, layout.attention,
               layout.recompute, in_flight, layout.pp_schedule, layout.pp_virtual_stages)
        if key not in self.memory:
            skey = (layout.dp, layout.tp, layout.pp, layout.zero)
            if skey not in self.states:
                self.states[skey] = model_states(self.spec, layout)
            mb = memory_per_gpu(self.spec, layout, self.anatomy(layout), self.hw.memory.usable_bytes,
                                MemoryAssumptions(), states=self.states[skey])
            self.memory[key] = mb.total / GiB
        return self.memory[key]

    def row(self, layout: Layout, gpus: int, steps: int, total_batch: int, bands: bool = False) -> dict:
        """A priced layout; the low-high band (two more step models) only when asked (the shown rows)."""
        an = self.anatomy(layout)
        times = {}
        for scen in (("value", "low", "high") if bands else ("value",)):
            times[scen] = step_time(self.spec, self.hw, layout, an, self.rate(layout.attention, scen),
                                    comm_efficiency=scen, comm_points=self.points, memo=self.memo)
        st = times["value"]
        o = self.req.overheads
        every, eval_tokens = _eval_cadence(self.spec, o)
        states = self.states[(layout.dp, layout.tp, layout.pp, layout.zero)]  # filled by mem_gib
        outside = run.outside_steps_s(
            o, steps=steps, eval_every=every, eval_tokens=eval_tokens,
            tokens_per_forward=layout.dp * layout.micro_batch * self.spec.recipe.seq_len, forward_s=st.fwd_s,
            checkpoint_bytes=(sum(states["params"].values()) + sum(states["optimizer"].values())) * gpus,
            nodes=-(-gpus // self.hw.gpus_per_node))
        wall = {k: run.hours(steps * v.total_s + outside) for k, v in times.items()}
        cost = {k: run.cost_usd(self.price, gpus, self.hw.gpus_per_node, h) for k, h in wall.items()}
        peak = self.hw.peak.flops_per_s(self.spec.dtypes.compute)
        return {
            "hardware": self.hw.name, "gpus": gpus, "dp": layout.dp, "tp": layout.tp, "pp": layout.pp,
            "zero": layout.zero, "micro_batch": layout.micro_batch, "accum": layout.grad_accum,
            "attention": layout.attention, "recompute": layout.recompute,
            "schedule": layout.pp_schedule if layout.pp > 1 else "-",
            "family": family(layout, self.native_zero),
            "native": layout.zero == self.native_zero,
            "step_s": st.total_s, "step_low_s": min(t.total_s for t in times.values()),
            "step_high_s": max(t.total_s for t in times.values()),
            "compute_s": st.compute_s, "dp_comm_exposed_s": st.dp_comm_exposed_s, "tp_comm_s": st.tp_comm_s,
            "bubble_s": st.bubble_s, "optimizer_s": st.optimizer_s,
            "mfu_pct": 100 * mfu(self.mfu_fpt, total_batch / st.total_s, peak, gpus),
            "wall_clock_h": wall["value"], "wall_low_h": min(wall.values()), "wall_high_h": max(wall.values()),
            "cost_usd": cost["value"], "cost_low_usd": min(cost.values()), "cost_high_usd": max(cost.values()),
            "memory_gib": self.mem_gib(layout), "usable_gib": self.hw.memory.usable_gib.value,
            "_layout": layout,
        }


def search(req: PlanRequest) -> PlanResult:
    """Every layout of every hardware and GPU count that fits and divides, ranked by the objective."""
    import pandas as pd

    if req.objective not in OBJECTIVES:
        raise UsageError(f"must be one of {', '.join(OBJECTIVES)}, got {req.objective!r}", field="--objective")
    spec = req.model
    total_batch = req.total_batch_tokens or spec.recipe.total_batch_tokens
    seq = spec.recipe.seq_len
    if total_batch < seq or total_batch % seq:
        raise UsageError(f"{total_batch:,} tokens is not a positive multiple of the sequence length {seq:,}",
                         field="--total-batch-size")
    steps = run.steps_for(spec, spec.recipe.budget, total_batch)
    rows, rejected, considered = [], {"memory": 0, "divisibility": 0, "dominated": 0}, 0
    why_not: dict[str, str] = {}
    evaluators = {}
    for hw in req.hardware:
        ev = evaluators[hw.name] = _Evaluator(req, spec, hw)
        limit = (1 - req.headroom) * hw.memory.usable_gib.value
        for gpus in req.gpus:
            for group in layouts_for(spec, hw, gpus, total_batch, req):
                n = sum(len(by_rc) for by_rc in group)
                considered += n
                try:
                    check_layout(group[0][0], spec)
                except LayoutError as e:
                    rejected["divisibility"] += n
                    why_not.setdefault("divisibility", e.message)
                    continue
                for i, by_rc in enumerate(group):  # micro-batch ascending
                    fitting = [lay for lay in by_rc if ev.mem_gib(lay) <= limit]
                    if not fitting:  # larger micro-batches need more memory still
                        rejected["memory"] += sum(len(rest) for rest in group[i:])
                        break
                    rejected["memory"] += len(by_rc) - len(fitting)
                    # the least recompute that fits; more recompute at the same micro-batch only adds compute
                    rejected["dominated"] += len(fitting) - 1
                    rows.append(ev.row(fitting[0], gpus, steps, total_batch))
    result = PlanResult(rows=[], pareto=[], considered=considered, rejected=rejected)
    if not rows:
        if rejected["memory"]:
            result.reasons.append(f"No layout fits in memory ({rejected['memory']:,} tried): more GPUs, a smaller "
                                  f"model or a larger-memory GPU.")
        if rejected["divisibility"]:
            result.reasons.append(f"{rejected['divisibility']:,} layouts do not divide evenly, e.g. "
                                  f"{why_not['divisibility']}.")
        if not considered:
            result.reasons.append("No candidate layout: check --gpus against the heads, layers and batch.")
        return result
    df = pd.DataFrame(rows)
    # simpler first among near-equals: the native setup, fewer parallel dimensions, no recompute
    df["_simplicity"] = (~df["native"]).astype(int) * 4 + (df["tp"] > 1) + (df["pp"] > 1) * 2 + (
        df["recompute"] != "none") * 1
    key = "wall_clock_h" if req.objective == "time" else "cost_usd"
    pool = df
    if req.deadline_h is not None:
        ok = df[df["wall_clock_h"] <= req.deadline_h]
        if ok.empty:
            result.warnings.append(f"no layout finishes within {req.deadline_h:g} h; ranked by time instead")
            key = "wall_clock_h"
        else:
            pool, key = ok, "cost_usd"
    if req.budget_usd is not None:
        ok = pool[pool["cost_usd"] <= req.budget_usd]
        if ok.empty:
            result.warnings.append(f"no layout costs at most ${req.budget_usd:,.0f}; ranked by cost instead")
            key = "cost_usd"
        else:
            pool, key = ok, "wall_clock_h"
    ranked = _rank(pool, key).drop(columns=["_simplicity"])
    ordered = ranked.to_dict("records")
    result.pareto = pareto_front(ordered)
    # bands for what is shown: the top rows, the Pareto front and each family's best
    shown = {id(r) for r in ordered[:req.top]} | {id(r) for r in result.pareto}
    seen: set = set()
    for r in ordered:  # each family's best at each GPU count and hardware (what the plot draws)
        key = (r["family"], r["gpus"], r["hardware"])
        if key not in seen:
            seen.add(key)
            shown.add(id(r))
    for i, r in enumerate(ordered):
        if id(r) in shown:
            banded = evaluators[r["hardware"]].row(r["_layout"], r["gpus"], steps, total_batch, bands=True)
            r.update({k: banded[k] for k in ("step_low_s", "step_high_s", "wall_low_h", "wall_high_h",
                                             "cost_low_usd", "cost_high_usd")})
    for r in ordered:
        r.pop("_layout", None)
    result.rows = ordered
    result.pareto = [r for r in ordered if any(r is p for p in result.pareto)]
    result.reasons = reasons(result.rows, spec) + memory_reasons(ordered[0], evaluators[ordered[0]["hardware"]])
    return result


def memory_reasons(top: dict, ev: _Evaluator) -> list[str]:
    """What memory forces: the choice's layout with less recompute, and with less sharding, in GiB."""
    layout = _layout_of(top, ev.spec)
    limit = (1 - ev.req.headroom) * ev.hw.memory.usable_gib.value
    out = []
    if layout.recompute != "none":
        lighter = [rc for rc in ("none", "selective") if rc != layout.recompute][: 1 if layout.recompute ==
                                                                                   "selective" else 2]
        figures = ", ".join(f"recompute {rc} needs {ev.mem_gib(replace(layout, recompute=rc)):.0f} GiB"
                            for rc in lighter)
        out.append(f"Memory forces recompute {layout.recompute}: with the same layout, {figures}, against "
                   f"{limit:.0f} GiB usable ({100 * (1 - ev.req.headroom):.0f}% of {ev.hw.memory.usable_gib.value:.0f}).")
    if layout.zero > 0 and layout.dp > 1:
        less = [z for z in range(layout.zero) if z in ev.req.zero_stages]
        if less and all(ev.mem_gib(replace(layout, zero=z)) > limit for z in less):
            out.append("Memory forces ZeRO-" + str(layout.zero) + ": " + ", ".join(
                f"ZeRO-{z} would need {ev.mem_gib(replace(layout, zero=z)):.0f} GiB" for z in less) + ".")
    return out


def _layout_of(r: dict, spec: ModelSpec) -> Layout:
    return Layout(dp=r["dp"], tp=r["tp"], pp=r["pp"], zero=r["zero"], micro_batch=r["micro_batch"],
                  grad_accum=r["accum"], attention=r["attention"], recompute=r["recompute"],
                  compiled=spec.recipe.compiled, pp_schedule="1f1b" if r["schedule"] in ("-", "1f1b") else
                  r["schedule"], pp_virtual_stages=1 if r["schedule"] in ("-", "1f1b") else 2)


TIE = 0.02  # layouts within 2% of the best are equivalent: far inside the model's band


def _rank(df, key: str):
    """Sort by key, but among the layouts within TIE of the best put the simplest first."""
    import pandas as pd

    best = df[key].min()
    near = df[df[key] <= best * (1 + TIE)].sort_values(["_simplicity", key, "gpus", "hardware"], kind="stable")
    rest = df[df[key] > best * (1 + TIE)].sort_values([key, "_simplicity", "gpus", "hardware"], kind="stable")
    return pd.concat([near, rest])


def pareto_front(rows: list[dict]) -> list[dict]:
    """Layouts no other layout beats on both wall-clock and cost (ties: the first by time)."""
    front, best_cost = [], math.inf
    for r in sorted(rows, key=lambda r: (r["wall_clock_h"], r["cost_usd"])):
        if r["cost_usd"] < best_cost - 1e-9:
            front.append(r)
            best_cost = r["cost_usd"]
    return front


def describe(r: dict) -> str:
    parts = [f"{r['gpus']}x {r['hardware']}", f"dp {r['dp']}"]
    if r["tp"] > 1:
        parts.append(f"tp {r['tp']}")
    if r["pp"] > 1:
        parts.append(f"pp {r['pp']} ({r['schedule']})")
    parts += [f"ZeRO-{r['zero']}{' (native)' if r['native'] else ''}", f"micro-batch {r['micro_batch']} x "
              f"{r['accum']}", r["attention"]]
    if r["recompute"] != "none":
        parts.append(f"recompute {r['recompute']}")
    return ", ".join(parts)


def _terms(r: dict) -> dict[str, float]:
    return {"compute": r["compute_s"], "data-parallel communication": r["dp_comm_exposed_s"],
            "tensor-parallel all-reduces": r["tp_comm_s"], "pipeline bubble": r["bubble_s"],
            "optimizer": r["optimizer_s"]}


def reasons(rows: list[dict], spec: ModelSpec) -> list[str]:
    """The top choice in plain words, and for the best of each other family why it loses, in figures."""
    top = rows[0]
    out = [f"Choice: {describe(top)}{'' if top['native'] else ' (needs another training setup than the model ships)'}"
           f": {top['step_s']:.3f} s/step, {top['wall_clock_h']:.1f} h, "
           f"${top['cost_usd']:,.0f}, MFU {top['mfu_pct']:.1f}%, {top['memory_gib']:.0f} of "
           f"{top['usable_gib']:.0f} GiB per GPU."]
    t = _terms(top)
    main = max(t, key=t.get)
    out.append(f"Its step is {100 * t['compute'] / top['step_s']:.0f}% compute; the largest other term is "
               + (f"{max((k for k in t if k != 'compute'), key=t.get)} "
                  f"({1000 * max(v for k, v in t.items() if k != 'compute'):.0f} ms)." if main == "compute"
                  else f"{main} ({1000 * t[main]:.0f} ms)."))
    native_zero = NATIVE_ZERO[spec.recipe.distribution]
    for fam in FAMILIES:
        cands = [r for r in rows if r["family"] == fam and r["gpus"] == top["gpus"] and r["hardware"] == top["hardware"]]
        if fam == top["family"] or not cands:
            if fam == "+ZeRO/FSDP" and native_zero == 3:
                out.append(f"{fam}: the model's own setup already shards everything (ZeRO-3 / FSDP); those "
                           f"layouts count as pure DP here.")
            elif not cands and fam != top["family"]:
                out.append(f"{fam}: no layout of this family fits and divides on {top['gpus']} GPUs.")
            continue
        best = cands[0]
        dt, dc = best["wall_clock_h"] - top["wall_clock_h"], best["cost_usd"] - top["cost_usd"]
        key = "wall_clock_h"
        if best[key] >= top[key] * (1 - TIE) and best[key] <= top[key] * (1 + TIE):
            out.append(f"{fam} ties: best is {describe(best)}: {best['wall_clock_h']:.1f} h ({dt:+.2f} h), "
                       f"${best['cost_usd']:,.0f} ({dc:+,.0f}), within {100 * TIE:.0f}% of the choice, inside the "
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
        out.append(f"{fam} loses: best is {describe(best)}: {best['wall_clock_h']:.1f} h ({dt:+.1f} h), "
                   f"${best['cost_usd']:,.0f} ({dc:+,.0f}); {why}{extra}.")
    return out


def best_per_family(rows: list[dict]) -> list[dict]:
    """The fastest layout of each family at each GPU count and hardware (what the plan plot draws)."""
    best: dict = {}
    for r in rows:
        key = (r["family"], r["gpus"], r["hardware"])
        if key not in best or r["wall_clock_h"] < best[key]["wall_clock_h"]:
            best[key] = r
    return list(best.values())
