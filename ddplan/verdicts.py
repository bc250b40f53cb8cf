"""Every sentence ddplan prints about a result: verdicts, reasons, flags, notes and assumptions.

The rendering layer's words (ddplan.render formats tables): the logic modules (table, plan, sizing,
price, fitting) return rows and facts with numbers in SI units; this module turns them into lines.
"""

from __future__ import annotations

from pathlib import Path

from ddplan.calibration import memory_assumptions
from ddplan.evidence import widened
from ddplan.fp8 import fp8_stack_factor
from ddplan.layout import NATIVE_ZERO, breaks_world_size_rule
from ddplan import memory
from ddplan.frameworks import ZERO_LACKS, searched_recomputes
from ddplan.memory import DOES_NOT_FIT, FITS, MAY_NOT_FIT
from ddplan.params import active_params, total_params
from ddplan.price import MFU_CONVENTION, VALIDATED_RATIO_MOE, Flag, PricedLayout, validated_ratio
from ddplan.roofline import GROUPED_GEMM_STREAMS
from ddplan.run import LLAMA3_INTERRUPTIONS_PER_GPU_HOUR, eval_cadence
from ddplan.specs import DROPLESS_IMBALANCE, HardwareSpec, ModelSpec
from ddplan.units import GiB, hours_band
from ddplan.validation import BAND_LEVEL, inside_by_source, median_by_source, summarise

DISTRIBUTION_NAMES = {"sharded_optimizer": "nanochat's sharded optimizer (ZeRO-1 memory)", "ddp": "DDP",
                      "zero1": "ZeRO-1", "zero2": "ZeRO-2", "fsdp": "FSDP (ZeRO-3)"}


# --------------------------------------------------------------------------------------------
# ddplan table


def gpus_word(n: int) -> str:
    """'1 GPU', '8 GPUs', '1,024 GPUs'."""
    return f"{n:,} GPU" + ("" if n == 1 else "s")


def config_label(p: PricedLayout, native_zero: int | None = None) -> str:
    """A row's name: GPUs and hardware, any model parallelism, ZeRO if not the model's native stage,
    recompute if any, then attention and window."""
    lay = p.layout
    parts = [f"{lay.num_gpus}x {p.hardware}"]
    if lay.tp > 1:
        parts.append(f"tp {lay.tp}" + (" +SP" if lay.sequence_parallel else "")
                     + (" overlapped" if lay.tp_overlap else ""))
    if lay.pp > 1:
        parts.append(f"pp {lay.pp}" + schedule_words(lay))
    if lay.cp > 1:
        parts.append(f"cp {lay.cp}" + (" all-gather" if lay.cp_comm == "all_gather" else ""))
    if lay.ep > 1 or lay.expert_tp != lay.tp:
        parts.append(f"ep {lay.ep}" + (" (experts whole: etp 1)" if lay.expert_tp != lay.tp else ""))
    if native_zero is not None and lay.dp > 1 and lay.zero != native_zero:
        parts.append(f"ZeRO-{lay.zero}")
    parts += dp_option_words(lay)
    if lay.recompute != "none":
        parts.append(f"recompute {lay.recompute}")
    return ", ".join(parts + [lay.attention, p.window])


def moe_line(spec) -> str:
    """The assumptions of a mixture-of-experts model, in one line."""
    a = spec.architecture
    m = a.moe
    shared = f", {m.shared_experts} shared of {m.shared_hidden_dim or m.expert_hidden_dim}" if m.shared_experts else ""
    dense = f"; the first {m.dense_layers} layers dense" if m.dense_layers else ""
    if m.capacity_factor:
        routing = f"experts padded to capacity factor {m.capacity_factor:g}"
    elif m.load_imbalance == 1:
        routing = "routing dropless and forced balanced (load imbalance 1, `--moe-imbalance`)"
    else:
        i = m.load_imbalance if m.load_imbalance is not None else DROPLESS_IMBALANCE
        source = ("" if m.load_imbalance is not None else
                  ", fitted to the Megatron-MoE ModelZoo's forced-balance vs dropless runs, validation/moe_routing.yaml")
        routing = (f"routing dropless: under ep > 1 the busiest rank receives {i:g}x the mean rows and every rank "
                   f"waits for it at each all-to-all, so the experts' time and the exchange are {i:g}x balanced "
                   f"routing's (`--moe-imbalance`{source}; memory is the mean rank's)")
    return (f"Mixture of experts: {m.num_experts} experts of {m.expert_hidden_dim}, top {m.top_k}{shared}{dense}; "
            f"{active_params(a) / 1e9:.3g}B of {total_params(a) / 1e9:.3g}B parameters active, and MFU counts the "
            f"active ones (6N on the active N); {routing}; ep splits the routed experts over data-parallel GPUs, "
            f"and each MoE layer's two all-to-alls each way (dispatch, combine) are not overlapped with compute "
            f"(Megatron-Core's all-to-all dispatcher); each grouped expert GEMM runs one GEMM a local expert over "
            f"{GROUPED_GEMM_STREAMS} streams, as Transformer Engine's GroupedLinear does, and pays the call costs of "
            f"its busiest stream; with tp > 1 the experts split over tp as the dense MLP does "
            f"(expert tensor parallelism = tp; `--etp 1` keeps them whole, ep then spanning the tp GPUs) and run with "
            f"sequence parallelism, as Megatron-Core requires. "
            f"On ddplan's published MoE runs a step took up to {VALIDATED_RATIO_MOE[1]:g}x the prediction (`ddplan "
            f"validate`; host cost, the routing's many small kernels and host synchronisation, is not modelled): the "
            f"band, {VALIDATED_RATIO_MOE[0]:g}x-{VALIDATED_RATIO_MOE[1]:g}x, spans every one.")


def grad_bucket_words(rule: str) -> str:
    """A gradient-bucket rule (Layout.grad_bucket, not "group") in a row's words. e.g. "megatron" -> "Megatron-Core's
    grad buckets"; "chunk" -> "one grad bucket a chunk"; "134217728" -> "grad buckets of 134M params"."""
    if rule == "megatron":
        return "Megatron-Core's grad buckets"
    if rule == "chunk":
        return "one grad bucket a chunk"
    return f"grad buckets of {int(rule) / 1e6:.3g}M params"


def dp_option_words(lay) -> list[str]:
    """The data-parallel options a layout runs with, in words (none when it runs the defaults)."""
    out = []
    if lay.shard_group:
        out.append(f"sharded over {lay.shard_group}, replicated x{lay.grad_ranks // lay.shard_group}"
                   + (", all-reduced once a step" if lay.replica_reduce_once else ""))
    if not lay.reshard_after_forward:
        out.append("no reshard after forward")
    if lay.fsdp2:
        out.append("FSDP2")
    if lay.overlap_param_gather:
        out.append("param gather overlapped")
    if not lay.overlap_grad_reduce:
        out.append("grad reduce after backward")
    if lay.grad_bucket != "group":
        out.append(grad_bucket_words(lay.grad_bucket)
                   + (" (reduce and gather exposed)" if lay.grad_bucket == "chunk" and lay.pp_virtual_stages == 1
                      else ""))
    if lay.offload_activations:
        out.append(f"{lay.offload_activations} layers' activations offloaded")
    return out


def flag_text(f: Flag) -> str:
    """One flag in words."""
    v = dict(f.values)
    if f.kind in ("memory", "memory_tight"):
        return memory_flag_text(v)
    if f.kind == "world_size":
        return f"world size {v['gpus']} is not a power of two (nanochat needs one)"
    if f.kind == "implausible":
        return (f"implausible: sustains {v['sustained_flops_per_s'] / 1e12:.3g} TFLOP/s, above the best measured "
                f"GEMM rate {v['best_flops_per_s'] / 1e12:.3g}")
    if f.kind == "beyond_measured":
        return (f"MFU {v['mfu_pct']:.1f}% is beyond anything measured on this GPU: the highest in ddplan's dataset "
                f"of published runs is {v['highest_pct']:.1f}% ({v['run']}, same MFU convention); treat it as "
                f"optimistic until calibrated")
    if f.kind == "micro_batch":
        return (f"device batch {v['asked']} does not fit in {v['usable_gib']:g} GiB; using {v['used']} (accumulation "
                f"{v['accum_before']} -> {v['accum_after']}, same total batch). Pin it with --device-batch-size.")
    if f.kind == "memory_vs_measured":
        return (f"measured running, yet the memory model puts it at {v['total_bytes'] / GiB:.0f} GiB, over the "
                f"{v['limit_bytes'] / GiB:.0f} GiB limit: the memory model overestimates this configuration")
    if f.kind == "batch" and v["change"] == "micro_batch":
        return (f"device batch {v['asked_micro_batch']} does not divide the sequences per data-parallel rank: "
                f"device batch {v['micro_batch']} keeps the total batch ({v['recipe_sequences']:,} sequences)")
    if f.kind == "batch":
        text = (f"the total batch of {v['recipe_sequences']:,} sequences does not split over the data-parallel "
                f"ranks: rounded up to {v['sequences']:,} (a token budget then takes fewer steps)"
                + (f"; device batch {v['micro_batch']}, not {v['asked_micro_batch']}"
                   if v["micro_batch"] != v["asked_micro_batch"] else ""))
        return text + ("; far past the recipe's batch: beware the critical batch size (McCandlish et al. 2018)"
                       if v["past_critical"] else "")
    return f.kind


def memory_flag_text(v: dict) -> str:
    """A row's memory verdict in words: the predicted peak, its band (ddplan.memory.PEAK_RATIO: the memory
    model's error on measured peaks) and the limit (usable memory less the headroom), or, where even the band's low
    end is over all of it, the GPU's usable memory (ddplan.memory.fit_verdict)."""
    total, limit = v["total_bytes"] / GiB, v["limit_bytes"] / GiB
    band = f"{v['low_bytes'] / GiB:.0f}-{v['high_bytes'] / GiB:.0f} GiB with the memory model's error on measured peaks"
    if v["verdict"] == DOES_NOT_FIT:
        return (f"does not fit: {total:.0f} GiB predicted ({band}), over the {v['capacity_bytes'] / GiB:.0f} GiB "
                f"the GPU has")
    over = "over" if total > limit else "under"
    return f"may not fit: {total:.0f} GiB predicted, {over} the {limit:.0f} GiB a layout may use ({band})"


def row_warnings(table) -> list[str]:
    """One line per flagged row, every flag of the row (json's `warnings`: data, row by row)."""
    native = NATIVE_ZERO[table.request.model.recipe.distribution]
    return [f"{config_label(p, native)}: {'; '.join(flag_text(f) for f in p.flags)}" for p in table.rows if p.flags]


# flag kinds, most important first: a prediction the GPU cannot deliver, a row that does not fit, a
# prediction past anything measured, then the changes ddplan made to the batch
FLAG_ORDER = ("implausible", "memory_vs_measured", "memory", "memory_tight", "beyond_measured", "batch", "micro_batch", "world_size")


def _flagged(table) -> dict[str, list[str]]:
    """Each flag's words -> the rows it applies to, in table order."""
    return {text: rows for text, (_, rows) in _flagged_by_family(table).items()}


def _flagged_by_family(table) -> dict[str, tuple[tuple, list[str]]]:
    """Each flag's words -> (its family: the kind, and for a batch change which change, whose words differ
    only in their figures; the rows it applies to, in table order)."""
    native = NATIVE_ZERO[table.request.model.recipe.distribution]
    out: dict[str, tuple[tuple, list[str]]] = {}
    for p in table.rows:
        for f in p.flags:
            family = (f.kind, dict(f.values).get("change"))
            out.setdefault(flag_text(f), (family, []))[1].append(config_label(p, native))
    return out


# distinct warnings of one family shown in full on stderr; the rest become one line (every row's flags
# are in --format json / csv)
WARNINGS_PER_FAMILY = 3


def grouped_row_warnings(table) -> list[str]:
    """The row warnings for people (stderr): each distinct flag once, counted over the rows it applies to:
    'device batch 32 does not fit ...; using 16 (...) (x16: 8x h100-sxm, sdpa-math, SSSL and 15 more)'.
    Past WARNINGS_PER_FAMILY distinct warnings of one family (a batch rounded up differently at each of
    twenty GPU counts), the rest (two or more) are one line naming how many, their rows and the last."""
    flagged = _flagged_by_family(table)
    count: dict[tuple, int] = {}
    for family, _ in flagged.values():
        count[family] = count.get(family, 0) + 1
    lines: list = []
    shown: dict[tuple, int] = {}
    held: dict[tuple, list] = {}  # a family's warnings past the limit; its line stands where the first was
    for text, (family, rows) in flagged.items():
        shown[family] = shown.get(family, 0) + 1
        if shown[family] <= WARNINGS_PER_FAMILY or count[family] == WARNINGS_PER_FAMILY + 1:  # one more: in full
            lines.append(f"{rows[0]}: {text}" if len(rows) == 1
                         else f"{text} (x{len(rows)}: {rows[0]} and {len(rows) - 1} more)")
            continue
        if family not in held:
            held[family] = []
            lines.append(family)  # its place, filled below
        held[family].append((text, rows))
    for i, line in enumerate(lines):
        if isinstance(line, tuple):
            rest = held[line]
            rows = [r for _, group in rest for r in group]
            lines[i] = (f"{len(rest)} more warnings of the kind above, on {len(rows)} rows ({rows[0]} to {rows[-1]}; "
                        f"each row's flags are in --format json); the last: {rest[-1][0]}")
    return lines


def _top_flag(table):
    """(row, flag) of the most important row warning (FLAG_ORDER, then table order); None when none."""
    flagged = [(FLAG_ORDER.index(f.kind) if f.kind in FLAG_ORDER else len(FLAG_ORDER), i, p, f)
               for i, p in enumerate(table.rows) for f in p.flags]
    return min(flagged, key=lambda t: t[:2])[2:] if flagged else None


def top_warning(table) -> str | None:
    """The most important row warning (FLAG_ORDER), as a verdict line; None when no row is flagged. On a
    terminal it stands in the verdict and not again among the warnings on stderr (top_warning_text)."""
    top = _top_flag(table)
    if top is None:
        return None
    p, f = top
    text = flag_text(f)
    others = len(_flagged(table)[text]) - 1
    more = f" (and {others} more rows)" if others else ""
    native = NATIVE_ZERO[table.request.model.recipe.distribution]
    return f"Warning: {config_label(p, native)}{more}: {text}; the other warnings follow on stderr."


def top_warning_text(table) -> str | None:
    """The words of top_warning's flag, to leave its line out of stderr's warnings when the verdict says it."""
    top = _top_flag(table)
    return None if top is None else flag_text(top[1])


def table_notes(table) -> list[str]:
    """The table's own notes and the fit's, in words."""
    out = []
    for n in table.notes:
        v = dict(n.values)
        if n.kind == "measured_batch":
            out.append(f"the measurement used total batch {v['measured_tokens']:,}, the table {v['table_tokens']:,}: "
                       f"rows are derived at the table's batch")
        elif n.kind == "per_node":
            out.append(f"the price ({v['provider']}) bills whole {v['gpus_per_node']}-GPU nodes: rows on part of a node "
                       f"(GPU counts {v['gpus']}) pay for full nodes; give --price for a per-GPU offer")
        elif n.kind == "unfitted":
            out.append(f"the calibration's measured step is not fitted ({v['reason']}): rows use its "
                       f"micro-benchmarks alone")
        elif n.kind == "skipped":
            out += [f"skipped: {s}" for s in v.values()]
    group = table.request.options.shard_group
    missed = [r for r in table.rows if not r.layout.shard_group]
    if group and missed:
        rule = "hybrid sharding needs ZeRO-3 and a shard group between 2 and half of dp x cp that divides it"
        missed_zero3 = [r for r in missed if r.layout.zero == 3]  # other stages never take one: no news
        if len(missed) == len(table.rows):
            ranks = max(r.layout.grad_ranks for r in table.rows)
            out.append(f"--shard-group {group} applies to no row: {rule} (the largest dp x cp here is {ranks}); rows "
                       f"are priced without it")
        elif missed_zero3:
            gpus = sorted({r.layout.num_gpus for r in missed_zero3})
            out.append(f"--shard-group {group} applies to {len(table.rows) - len(missed)} of {len(table.rows)} rows: "
                       f"{rule}; not to the ZeRO-3 rows on {', '.join(f'{g:,}' for g in gpus)} GPUs (priced without it)")
    fit = table.fit
    if fit is not None and fit.dropped:
        ends = ", ".join(f"{s:g}" for s in fit.dropped)
        out.append(f"fit: with the other efficiencies at {ends} of their ranges (0 = slow end), the measured step "
                   f"would need {fit.knob} efficiency above the best measured GEMM ({fit.ceiling:.2f} of peak): "
                   f"those worlds are ruled out, and the bands use the rest")
    return out


def fp8_words(fp8: bool, recipe: str | None, spec: ModelSpec) -> str:
    """A title's words for fp8 GEMMs and their recipe (the one given, else the model's); '' without fp8."""
    return f" with fp8 GEMMs ({recipe or spec.recipe.fp8_recipe})" if fp8 else ""


def table_title(table) -> str:
    spec, hw = table.request.model, table.request.hardware
    gpus = ", ".join(str(g) for g in table.request.gpus)
    given = table.request.total_batch_tokens
    whose = table.request.batch_from or (
             "the recipe's batch" if not given or given == spec.recipe.total_batch_tokens else
             "the measured step's batch" if table.fit is not None and given == table.fit.measurement.total_batch_tokens
             else "--total-batch-size")
    plural = "" if table.request.gpus == (1,) else "s"
    # fp8 GEMMs are a fact of every row, not only of the Assumptions: said as memory_title says it
    fp8 = fp8_words(table.request.fp8, table.request.fp8_recipe, spec)
    return (f"{spec.name} on {hw.name}: decision table ({gpus} GPU{plural} in total; {table.steps:,} steps of "
            f"{table.total_batch_tokens:,} tokens, {whose}; sequence {spec.recipe.seq_len}, "
            f"{spec.dtypes.compute}{fp8})")


def _interruptions_line(table) -> str:
    """How the wall-clock counts interruptions (ddplan.run.goodput), in words."""
    o = table.request.overheads
    lost = [p for p in table.rows if p.goodput.lost_s > 0]
    if not lost:
        why = ("set to 0" if o.interruptions_per_gpu_hour == 0 else
               "single-node rows; --interruptions-per-gpu-hour counts them")
        return f"Interruptions: none counted ({why})."
    rate = o.interruptions_per_gpu_hour
    source = (f"{rate:.3g} a GPU-hour (given)" if rate is not None else
              f"{LLAMA3_INTERRUPTIONS_PER_GPU_HOUR:.3g} a GPU-hour on more than one node (Llama 3, arXiv 2407.21783 "
              f"sec. 3.3.4: 419 unexpected in 54 days on 16,384 GPUs)")
    cadence = (f"every {o.checkpoint_every_steps} steps (given)" if o.checkpoint_every_steps else
               "at Young's optimal interval sqrt(2 x write time x MTBF) (CACM 1974)")
    return (f"Interruptions: {source}; each costs a {o.restart_s / 60:g}-minute restart and half a checkpoint "
            f"interval of work; checkpoints {cadence} at {o.checkpoint_gbyte_per_s:g} GB/s a node; the "
            f"'restarts h' column is in the wall-clock.")


def table_answer(table) -> str:
    """The verdict's first line: the fastest row and the cheapest, each with its band (wall-clock and cost at
    the band's ends), or the one row that can run."""
    v, native = table.verdict, NATIVE_ZERO[table.request.model.recipe.distribution]

    def priced(p: PricedLayout) -> str:
        return (f"{config_label(p, native)}: {_hours(p.wall_clock_h)} ({hours_band(p.wall_low_h, p.wall_high_h)}), "
                f"${p.cost_usd:,.0f} (${p.cost_low_usd:,.0f}-${p.cost_high_usd:,.0f})")

    f, c = v.fastest, v.cheapest
    if v.runnable == 1:
        return f"Answer: one row can run, {priced(f)}."
    if f is c:
        return f"Answer: fastest and cheapest, {priced(f)}."
    return f"Answer: fastest {priced(f)}; cheapest {priced(c)}."


def table_verdict(table) -> list[str]:
    """The decision in words: baseline, fix the kernel first, then add GPUs, fastest and cheapest."""
    v, hw, spec = table.verdict, table.request.hardware, table.request.model
    native = NATIVE_ZERO[spec.recipe.distribution]

    def label(p: PricedLayout) -> str:
        return config_label(p, native)

    out = []
    fit = table.fit
    if fit is not None and fit.implausible:
        m = fit.measurement
        out.append(f"The measured {m.step_time_s:g} s/step needs {fit.knob} efficiency {fit.implied:.2f} of peak, above "
                   f"the best measured GEMM on {hw.name} ({fit.ceiling:.2f}): check the stated configuration; every "
                   f"band is widened to the model's own range.")
    if v.baseline is None:
        why = {"world_size": f"{spec.name} needs a power-of-two world size",
               "memory": "some rows do not fit in memory (see `ddplan memory`)",
               "implausible": "some rows are implausible"}
        out.append("No row can run as given: " + "; ".join(why[k] for k in v.blocked or ()) + ".")
        if v.compiled is not None:  # compiled, a row fits: the fix to try first
            tc = v.compiled
            out.append(f"Compile it: torch.compile lets {config_label(tc, native)} fit "
                       f"({tc.memory.total / GiB:.0f} GiB a GPU): {_hours(tc.wall_clock_h)}, ${tc.cost_usd:,.0f} "
                       f"(`--compile`).")
        return out
    out.insert(0, table_answer(table))
    base = v.baseline
    out.append(f"Baseline: {label(base)}: {base.step_s:.4g} s/step, MFU {base.mfu_pct:.1f}%, "
               f"{_hours(base.wall_clock_h)}, ${base.cost_usd:,.0f} ({base.basis}).")
    outside_h = base.outside_s / 3600
    if outside_h > OUTSIDE_SHARE_SAID * base.wall_clock_h:  # most users read the wall-clock as steps x step time
        lost_h = base.goodput.lost_s / 3600
        out.append(f"{outside_h:,.1f} h of those {base.wall_clock_h:,.1f} h ({100 * outside_h / base.wall_clock_h:.0f}%) "
                   f"are outside the {base.steps:,} steps (start-up, evaluation, checkpoints: see Outside steps); "
                   f"the steps themselves take {base.steps * base.step_s / 3600:,.1f} h"
                   + (f", and interruptions lose {lost_h:,.1f} h" if lost_h >= 0.05 else "") + ".")
    g0 = base.layout.num_gpus
    bk = v.best_kernel
    kernel = gpus = None
    if bk is not None and bk.wall_clock_h < 0.95 * base.wall_clock_h:
        gain = 1 - bk.wall_clock_h / base.wall_clock_h
        kernel = (f"{bk.layout.attention} on the same {gpus_word(g0)} and window cuts wall-clock by {100 * gain:.0f}% "
                  f"({_hours(bk.wall_clock_h)}) and cost by the same share (${bk.cost_usd:,.0f}): per-FLOP efficiency "
                  f"is a kernel problem that more GPUs cannot fix.")
    elif v.kernel_choices > 1:
        gemm = base.step.by_kind_s.get("gemm", 0.0)
        out.append(f"No attention implementation on {hw.name} beats the baseline by 5% or more: the step is dominated "
                   f"by GEMMs ({gemm:.3g} of {base.step_s:.3g} s).")
    if v.more_gpus is not None:
        r = v.more_gpus
        gpus = (f"{label(r)} runs {base.wall_clock_h / r.wall_clock_h:.1f}x faster "
                f"({_hours(r.wall_clock_h)}) for {r.cost_usd / base.cost_usd:.2f}x the cost: data parallelism "
                + (f"removes the serial accumulation ({base.layout.grad_accum} -> {r.layout.grad_accum} "
                   f"micro-batches) but " if base.layout.grad_accum != r.layout.grad_accum else
                   "keeps the micro-batches a GPU runs in turn and ")
                + f"multiplies whatever per-GPU efficiency you have (exposed communication "
                f"{1000 * (r.step.dp_comm_exposed_s + r.step.tp_comm_s + r.step.cp_comm_s + r.step.ep_comm_s):.0f} "
                f"ms/step"
                + (f", pipeline bubble {1000 * r.step.bubble_s:.0f} ms/step)." if r.step.bubble_s else ")."))
    # lead with the larger gain: more GPUs first when they cost less than the kernel fix does (faster and cheaper)
    gpus_lead = gpus is not None and (kernel is None or v.more_gpus.cost_usd < bk.cost_usd)
    if gpus_lead:
        out.append(("Add GPUs first: " if kernel is not None else "Add GPUs: ") + gpus)
    if kernel is not None:
        out.append(("Then fix the kernel: " if gpus_lead else "Fix the kernel first: ") + kernel)
    if gpus is not None and not gpus_lead:
        out.append("Then add GPUs: " + gpus)
    tc = v.compiled
    if tc is not None and tc.wall_clock_h < 0.95 * base.wall_clock_h:
        out.append(f"Compile it: torch.compile of the baseline's layout, at the same micro-batch, cuts wall-clock by "
                   f"{100 * (1 - tc.wall_clock_h / base.wall_clock_h):.0f}% ({_hours(tc.wall_clock_h)}, "
                   f"${tc.cost_usd:,.0f}): Inductor fuses each chain of the block's elementwise ops into one kernel "
                   f"and halves their traffic (an assumption: ddplan.roofline.COMPILED_POINTWISE_FRACTION); it needs "
                   f"{tc.memory.total / GiB:.0f} GiB a GPU against {base.memory.total / GiB:.0f}, and what it frees "
                   f"may take a larger micro-batch (`--compile`).")
    bw = v.best_window
    if bw is not None and bw.wall_clock_h < 0.95 * (bk or base).wall_clock_h:
        ref = bk if kernel is not None else base
        out.append(f"A model change, not a kernel one: window {bw.window} instead of {base.window} ({bw.layout.attention}, "
                   f"same {gpus_word(g0)}) cuts wall-clock by a further {100 * (1 - bw.wall_clock_h / ref.wall_clock_h):.0f}% "
                   f"({_hours(bw.wall_clock_h)}, ${bw.cost_usd:,.0f}), but trains another model: its sliding-window "
                   f"layers see less context.")
    cap = hw.memory.usable_gib.value
    if v.all_fit and v.largest_fitting is not None and v.model_parallel:
        out.append(f"Every row fits in memory: the largest uses {v.largest_fitting.memory.total / GiB:.0f} of "
                   f"{cap:.0f} GiB per GPU.")
    elif v.all_fit and v.largest_fitting is not None:
        out.append(f"TP/PP and higher ZeRO stages are not needed for memory: the largest fitting row uses "
                   f"{v.largest_fitting.memory.total / GiB:.0f} of {cap:.0f} GiB per GPU; they would only add "
                   f"communication.")
    elif not v.all_fit:
        out.append("Some rows do not fit in memory: run `ddplan memory` for the setup that would (ZeRO, recompute, "
                   "TP/PP).")
    return out


FUSIONS_WORDS = {  # how an uncompiled block's norms, rotary embedding and SwiGLU run (ddplan.specs.Recipe.fusions)
    "eager": "each norm, rotary embedding and SwiGLU one kernel",
    "transformer-engine": "Transformer Engine's fused norms, RoPE and SwiGLU",
    "decomposed": "norms and rotary embedding in float32 torch ops and SwiGLU op by op, each op a kernel",
    "fused-norm": "norms one fused kernel; rotary embedding in float32 torch ops and SwiGLU op by op",
}


def fusions_words(fusions: str) -> str:
    """The block's elementwise kernels in words, for the assumptions (--fusions)."""
    return f" ({FUSIONS_WORDS[fusions]}: --fusions {fusions})"


def _hours(h: float) -> str:
    """Hours, with days beside them once a run is longer than two days, years (of 365 days) from one year."""
    if h >= 24 * 365:
        return f"{h:,.1f} h ({h / (24 * 365):,.1f} years)"
    return f"{h:,.1f} h" + (f" ({h / 24:,.1f} days)" if h > 48 else "")


OUTSIDE_SHARE_SAID = 0.25  # a wall-clock more than this share outside the steps is said in the verdict


def _carried(req, hw: HardwareSpec) -> bool:
    """Whether the hardware spec is the one the calibration file carries (`hardware_spec`: on CPU, the
    measured spec, which `ddplan specs show` does not know by name): the same figures, not only the name
    (a --hardware file of that name with other figures is not the carried one)."""
    from pydantic import ValidationError

    cal = req.calibration
    if cal is None or cal.hardware_spec is None or req.calibration_path is None:
        return False
    try:
        return HardwareSpec.model_validate(cal.hardware_spec) == hw
    except ValidationError:
        return False


def _thin_evidence(table, spec) -> str:
    """Where the band was widened because few published runs stand behind the prediction (Table.thin,
    ddplan.evidence), in words: each thin value, its runs, and the group whose spread it took; "" where none is."""
    thin, req = table.thin, table.request
    if not thin:
        return "" if req.framework else "; the training stack, not stated (--framework), not weighed"
    lo, hi = widened(validated_ratio(spec, req.fp8), thin)
    parts = [f"{t.dimension} {t.value} has {_runs(t.runs, t.sources)} in the dataset: it takes the spread of the "
             f"{t.group_runs} runs ({t.group_sources} sources) whose {t.dimension} is as thinly evidenced, each priced "
             f"leaving its source out, {t.band[0]:g}-{t.band[1]:g} x (ddplan.evidence)" for t in thin]
    return f"; then to {lo:g}-{hi:g} x, as " + "; ".join(parts)


def _runs(runs: int, sources: int) -> str:
    """"no published run", "1 run from 1 source", "18 runs from 1 source"."""
    if runs == 0:
        return "no published run"
    return f"{runs} run{'s' if runs != 1 else ''} from {sources} source{'s' if sources != 1 else ''}"


def _placement_line(hw: HardwareSpec) -> str:
    nic = hw.inter_node.nic_gbit_per_s.value * hw.inter_node.nics_per_node / hw.gpus_per_node
    return (f"Across nodes: ranks ordered tp, cp, dp, pp (Megatron-Core's and torchtitan's order) on "
            f"{hw.gpus_per_node}-GPU nodes; a group crossing nodes runs at the NICs of its members on a node "
            f"({nic:g} Gb/s per GPU, {hw.inter_node.busbw_fraction_of_nics.value:g} of line rate as bus bandwidth), "
            f"the node's other NICs carrying the other groups at the same time.")


def _fp8_line(req, spec, e) -> str:
    """The fp8 assumption: which GEMMs, at what rate, with which recipe's casts (ddplan.fp8)."""
    recipe = req.fp8_recipe or spec.recipe.fp8_recipe
    gather = " ZeRO-3 weights all-gathered in fp8 (1 byte an element)." if req.options.fp8_all_gather else ""
    if req.options.fp8_params:
        gather += (" ZeRO-1/2: the fp8 GEMMs' weights kept in fp8 (with the transpose, 2 bytes an element),"
                   " all-gathered in fp8 and never cast (Megatron-Core --fp8-param-gather).")
    basis = f"({e.gemm.best_fp8.basis})" if e.gemm.best_fp8 else "(assumed: the bf16 fraction, no fp8 measurement)"
    return (f"fp8: GEMMs with every dim a multiple of 16 and min(k, n) >= 128, "
            f"{'the LM head included' if spec.recipe.fp8_lm_head else 'not the LM head'}, not the router, at the "
            f"dense fp8 peak x {(e.gemm.best_fp8 or e.gemm.best).value:.3f}"
            f" {basis}{_fp8_kept(e, req.framework)}, plus the {recipe} recipe's casts as memory-bound kernels; attention stays {spec.dtypes.compute}; "
            f"MFU still against the dense {spec.dtypes.compute} peak.{gather}")


def _fp8_kept(e, framework: str | None) -> str:
    """The fraction of the best fp8 rate fp8 training keeps, and where it comes from: the tuned stacks' fit, times
    what other stacks keep of it (ddplan.fp8.fp8_stack_factor)."""
    kept = e.gemm.sustained_fp8
    if kept is not None:
        factor = fp8_stack_factor(framework)
        if factor == 1.0:
            return f", of which fp8 training keeps {kept.value:.3f} ({kept.source.split(':')[0]}, on NeMo's tuned recipes)"
        stack = f"the {framework} stack" if framework else "a stack not stated (--framework)"
        return (f", of which fp8 training keeps {kept.value:.3f} x {factor:.3f} = {kept.value * factor:.3f}: NeMo's "
                f"tuned recipes' fraction ({kept.source.split(':')[0]}) times what other stacks keep of it, {stack} "
                f"(fitted on llm-foundry's, OLMo-core's and FP8-LM's H100 fp8 runs, assumed on other GPUs; "
                f"--framework nemo: the tuned fraction)")
    if e.gemm.sustained is not None:
        return f", of which it keeps {e.gemm.sustained.value:.3f} as 16-bit training does (no fp8 fit)"
    return ""


def state_words(spec) -> str:
    """How the run keeps its weights and optimizer state, in words (--weights, --moments: specs.Optimizer)."""
    opt = spec.recipe.optimizer
    kept = "/".join(sorted(set(spec.dtypes.params.values())))
    master = ("; fp32 masters, as 16-bit remainders on the distributed optimizer's rows (ZeRO-1/2) of bf16 weights"
              if opt.master_remainder else "; fp32 masters" if opt.master_weights else "")
    moments = ("each parameter's dtype" if opt.adamw_state_dtype == "param" else opt.adamw_state_dtype)
    adam = f"; AdamW moments in {moments}" if "adamw" in opt.algorithm.values() else ""
    return f"weights in {kept}{master}{adam}"


def table_assumptions(table) -> list[str]:
    req = table.request
    spec, hw, o, price, budget = req.model, req.hardware, req.overheads, table.price, table.budget
    how = ("given" if req.budget and req.budget.steps else "the recipe's step budget" if budget.steps
           else f"{budget.tokens:,} tokens" if budget.tokens
           else f"param:data ratio {budget.param_data_ratio:g} x {budget.ratio_params} params")

    every, tokens = eval_cadence(spec, o)
    evals = f"evaluation every {every:,} steps of {tokens:,} tokens (forward only)" if every and tokens else \
        "no evaluation"
    e = hw.efficiency
    out = [
        f"Model {spec.name}: recipe from {spec.recipe.source}.",
        f"Run: {table.steps:,} steps ({how}) of {table.total_batch_tokens:,} tokens; sequence {spec.recipe.seq_len}; "
        f"compute dtype {spec.dtypes.compute}; {'compiled' if table.compiled else 'eager'}"
        f"{'' if table.compiled else fusions_words(spec.recipe.fusions)}; native data-parallel "
        f"setup: {spec.recipe.distribution}; {state_words(spec)}.",
        f"Hardware {hw.name}: dense {spec.dtypes.compute} peak {hw.peak.flops_per_s(spec.dtypes.compute) / 1e12:g} "
        f"TFLOP/s; best GEMM efficiency "
        f"{e.gemm.best.value:.3f} ({e.gemm.best.basis}, range {e.gemm.best.range[0]:.3f}-{e.gemm.best.range[1]:.3f})"
        + (f", of which training keeps {e.gemm.sustained.value:.3f} ({e.gemm.sustained.source.split(':')[0]})"
           if e.gemm.sustained is not None else "") + "; "
        f"HBM efficiency {e.hbm.value:.2f} ({e.hbm.basis})"
        + (f"; compute beside a hidden collective keeps {e.overlapped_compute.value:.3f} of its rate "
           f"({e.overlapped_compute.basis}, range {e.overlapped_compute.range[0]:.3f}-{e.overlapped_compute.range[1]:.3f}: "
           f"a collective beside compute lengthens the step by 1 minus that of its overlap, less what the compute "
           f"still finishes inside it: ddplan.comm.overlap_cost_s)"
           if e.overlapped_compute is not None and any(r.layout.num_gpus > 1 for r in table.rows) else "") + ". "
        + (f"The calibration file ({Path(req.calibration_path).name}) carries the spec, every figure with its source "
           f"(`hardware_spec`)." if _carried(req, hw) else
           f"`ddplan specs show {hw.name}` lists every figure and its source."),
        f"Price: ${price.usd_per_gpu_hour:g}/GPU-h, billed {price.billing.replace('_', ' ')} ({price.provider}, "
        f"{price.date}).",
        f"Outside steps: start-up {o.startup_s:g} s, {evals}, checkpoints "
        f"{'at the end' if not o.checkpoint_every_steps else f'every {o.checkpoint_every_steps} steps'} "
        f"at {o.checkpoint_gbyte_per_s:g} GB/s.",
        f"Memory: a row fits when it leaves {100 * req.headroom:.0f}% of usable memory free. "
        + outside_terms(req.calibration, Path(req.calibration_path).name if req.calibration_path else None),
        *([_placement_line(hw)] if any(r.layout.num_gpus > hw.gpus_per_node for r in table.rows) else []),
        _interruptions_line(table),
        f"MFU convention: {MFU_CONVENTION}, at each row's window pattern.",
        *([moe_line(spec)] if spec.architecture.moe else []),
        *([_fp8_line(req, spec, e)] if req.fp8 else []),
        "Band (low-high): every efficiency at the fast and slow ends of its range in the hardware spec"
        + (" (but the best GEMM rate, at its value: the fraction training keeps of it was fitted at that value, and "
           "holds what real shapes lose: ddplan.roofline.best_gemm)"
           if e.gemm.sustained is not None and e.gemm.sustained.basis == "fitted" else "")
        + ("" if table.fit is not None or (req.calibration is not None and
                                            req.calibration.held_out_error_pct is not None) else
           f", widened to {validated_ratio(spec, req.fp8)[0]:g}-{validated_ratio(spec, req.fp8)[1]:g} x the prediction: "
           f"where the step time of a run from a source ddplan has not seen falls, at {100 * BAND_LEVEL:g}% (a "
           f"prediction interval from its dataset of published runs, each source priced with fits made without it "
           f"and its siblings: "
           f"`ddplan validate --leave-one-source-out`, which checks it on sources left out)"
           + ("; for a mixture of experts, the dense band stretched to every published MoE run's measured / "
              "predicted, on either side" if spec.architecture.moe else "")
           + ("; in fp8, the spread of the published fp8 runs (its own fit, its own band)" if req.fp8 else "")
           + _thin_evidence(table, spec)) + ".",
    ]
    cal = req.calibration
    if cal is not None:
        measured = [name for name, present in (
            (f"GEMM efficiency at {len(cal.gemm)} shapes (nearest shape per op)", cal.gemm),
            (f"attention at {len(cal.attention)} points", cal.attention),
            (f"HBM {cal.hbm_tbyte_per_s} TB/s", cal.hbm_tbyte_per_s),
            (f"kernel overhead {cal.kernel_overhead_us} us", cal.kernel_overhead_us),
            (f"elementwise {cal.pointwise_tbyte_per_s} TB/s", cal.pointwise_tbyte_per_s),
            (f"AdamW {cal.optimizer_tbyte_per_s} TB/s", cal.optimizer_tbyte_per_s),
            (f"collectives at {len(cal.collectives)} points (interpolated t(S))", cal.collectives)) if present]
        where = cal.provenance.device_name if cal.provenance else "no provenance"
        out.append(f"Calibration ({where}): measured {'; '.join(measured) or 'nothing but step times'}; "
                   f"everything else assumed from the hardware spec.")
        if cal.held_out_error_pct is not None:
            out.append(f"Calibrated bands are at least +-{abs(cal.held_out_error_pct):.3g}% on rows derived from the "
                       f"calibration: the error of the held-out training step predicted from the micro-benchmarks "
                       f"alone, the model error that remains on {where} (a measured row is its own measurement: no "
                       f"band).")
        if cal.failures:
            out.append("Calibration notes (what was shrunk, skipped or failed): " + "; ".join(cal.failures))
    fit = table.fit
    if fit is not None:
        m, lay = fit.measurement, fit.layout
        shape = f"dp {lay.dp}" + (f" x tp {lay.tp}" if lay.tp > 1 else "") + (f" x pp {lay.pp}" if lay.pp > 1 else "")
        out.append(f"Measured: {m.step_time_s:g} s/step on {gpus_word(m.gpus)} ({shape}), {m.attention}, window "
                   f"{fit.window}, device batch {m.device_batch_size} x {lay.grad_accum} micro-batches, "
                   f"{m.total_batch_tokens:,} tokens/step ({m.source}). Fitted knob: {fit.knob} efficiency "
                   f"x{fit.factors['value']:.3f} (x{min(fit.factors.values()):.3f}-x{max(fit.factors.values()):.3f} "
                   f"as the other efficiencies sweep their ranges); other rows derive from it, the other terms stay "
                   f"assumptions with their ranges.")
    return out


# --------------------------------------------------------------------------------------------
# ddplan memory


FIXES_TRIED = "micro-batch, recompute, ZeRO stage, attention, TP inside a node and PP"


def fixes_tried(lacks: frozenset[str], recomputes: tuple[str, ...] | None) -> str:
    """What memory's fixes change (ddplan.sizing.what_fits), in words, of what the stack runs: recompute where it
    offers more than none (ddplan.frameworks.searched_recomputes), ZeRO stage where it runs more than one, TP and PP
    where its `lacks` does not name them. e.g. nanochat's: "micro-batch and attention"."""
    words = ["micro-batch"]
    if searched_recomputes(recomputes) != ("none",):
        words.append("recompute")
    if sum(k not in lacks for k in ZERO_LACKS) > 1:
        words.append("ZeRO stage")
    words.append("attention")
    words += [w for k, w in (("tp", "TP inside a node"), ("pp", "PP")) if k not in lacks]
    return ", ".join(words[:-1]) + " and " + words[-1]


def memory_verdict(spec: ModelSpec, hw: HardwareSpec, rows: list[dict], fixes: list, asked_step_s: float | None,
                   layout, headroom: float, tried: str = FIXES_TRIED) -> list[str]:
    """Plain-words conclusion about the setup asked (its ZeRO stage: `layout.zero`): it fits, with headroom,
    or the cheapest sets of changes that make it fit, ranked by step time (ddplan.sizing.what_fits); tried: what
    the fixes changed, in words (fixes_tried: what the stack runs)."""
    asked = next((r for r in rows if r["zero"] == layout.zero), None)
    name = DISTRIBUTION_NAMES[spec.recipe.distribution]
    native_zero = NATIVE_ZERO[spec.recipe.distribution]
    setup = f"the model's native setup ({name})" if layout.zero == native_zero else f"ZeRO-{layout.zero} as asked"
    lines = []
    band = (f"{asked['low_gib']:.1f}-{asked['high_gib']:.1f} GiB with the memory model's error on measured peaks, "
            f"x{memory.PEAK_RATIO[0]:g}-x{memory.PEAK_RATIO[1]:g} (`ddplan validate --memory`)") if asked else ""
    if asked and asked["verdict"] == FITS:
        lines.append(f"Fits with {setup}: {asked['total_gib']:.1f} of {asked['usable_gib']:.1f} "
                     f"GiB, {asked['headroom_gib']:.1f} GiB headroom; {band}.")
        more = [r for r in rows if r["zero"] > asked["zero"]]
        if more and len({round(r["total_gib"], 2) for r in rows}) == 1:
            lines.append("ZeRO stages do not differ here: with one data-parallel rank there is nothing to shard.")
        elif more:
            saved = asked["total_gib"] - min(r["total_gib"] for r in more)
            lines.append(f"Higher ZeRO stages would save up to {saved:.1f} GiB per GPU: not needed while memory is "
                         f"not the limit (they {'add' if native_zero > asked['zero'] else 'need another training setup and add'} "
                         f"communication).")
    else:
        certain = bool(asked and asked["fits"])  # fits as predicted, not with the error on it
        if certain:
            lines.append(f"May not fit with {setup}: {asked['total_gib']:.1f} GiB predicted, under the "
                         f"{asked['limit_gib']:.1f} GiB a layout may use, but {band}.")
        else:
            word = "May not fit" if asked and asked["verdict"] == MAY_NOT_FIT else "Does not fit"
            over = (f"{asked['limit_gib']:.1f} GiB a layout may use" if word == "May not fit" else
                    f"{asked['usable_gib']:.1f} GiB the GPU has, even at the low end" if asked else "")
            total = f": {asked['total_gib']:.1f} GiB predicted, over the {over}; {band}" if asked else ""
            lines.append(f"{word} as asked (ZeRO-{layout.zero}, device batch {layout.micro_batch}, recompute "
                         f"{layout.recompute}, {layout.attention}){total}.")
        for i, f in enumerate(fixes):
            pct = 100 * (f.step_s / asked_step_s - 1) if asked_step_s else 0.0
            change = f"{pct:+.0f}% on" if round(pct) else "within 0.5% of"  # never '+0%'
            cost = (f", {change} the {asked_step_s:.3g} s/step it would take as asked if it fit" if asked_step_s
                    else "")
            n = len(f.changes)
            goal = "to fit for certain" if certain else "to fit"
            lead = f"Fastest way {goal}" if i == 0 else f"Fastest {goal} with {n} change{'s' if n > 1 else ''}"
            lines.append(f"{lead}: {' + '.join(f.changes)}: {f.total_gib:.1f} GiB, {f.step_s:.3g} s/step{cost}.")
        if not fixes:
            lines.append(f"Nothing {'fits for certain' if certain else 'fits'} on these {layout.num_gpus} GPUs "
                         f"({tried} tried together): add GPUs or shorten the sequence.")
    if layout is not None and breaks_world_size_rule(layout, spec):
        lines.append(f"{spec.name} needs a power-of-two world size: it cannot run on {layout.num_gpus} GPUs as is.")
    return lines


PEAK_KIND_WORDS = {"device": "a device reading (everything on the GPU)",
                   "reserved": "torch's reserved peak (no context)", "allocated": "torch's allocated peak (tensors)"}


def peak_matches(measured_gb: float, kind: str, matches: list[dict], tolerance: float) -> str:
    """Which setups a measured peak is consistent with (ddplan.sizing.consistent_with rows), compared as `kind`
    (device, reserved, allocated: ddplan.memory.NOT_COUNTED)."""
    ok = [m for m in matches if m["consistent"]]
    if ok:
        listed = "; ".join(f"{m['attention']}, recompute {m['recompute']}, {'compiled' if m['compiled'] else 'eager'} "
                           f"({m['predicted_gb']:.1f} GB, {m['error_pct']:+.0f}%)" for m in ok[:4])
    else:
        c = matches[0]
        listed = (f"none of the configurations within {100 * tolerance:.0f}% (closest: {c['attention']}, {c['recompute']}, "
                  f"{c['predicted_gb']:.1f} GB)")
    return f"Measured {measured_gb:g} GB, {PEAK_KIND_WORDS[kind]}, is consistent with: {listed}."


def outside_terms(calibration=None, calibration_name: str | None = None) -> str:
    """The memory terms outside the tensor counts (ddplan.calibration.memory_assumptions), each with where it comes
    from: assumed (ddplan.memory's defaults) or a calibration's `memory:` section (measured by calibrate at its
    held-out step, or stated)."""
    section = calibration.memory if calibration is not None else None
    given = set() if section is None else {k for k, v in section.model_dump(exclude={"measured"}).items()
                                           if v is not None}
    how = ("measured by `ddplan calibrate`" if section is not None and section.measured is not None
           else "stated") + (f" in {calibration_name}" if calibration_name else " in the calibration")

    def src(name: str) -> str:
        return how if name in given else "assumed"

    a = memory_assumptions(calibration)
    return (f"Outside the tensor counts: framework {a.framework_gib:g} GiB a GPU (CUDA/ROCm context, kernels; "
            f"{src('framework_gib')}), NCCL/RCCL buffers {a.comm_gib:g} GiB with more than one GPU "
            f"({src('comm_gib')}), allocator slack {100 * a.allocator_fraction:.3g}% of the activations "
            f"({src('allocator_fraction')})"
            + ("" if {"framework_gib", "allocator_fraction"} <= given else
               "; `ddplan calibrate` on the GPU measures the framework and the slack, and its file (--calibration) "
               "replaces them") + ".")


def profile_set(command: str, profile, flags: list[str]) -> str:
    """The info line of a --framework profile: which flags it set (as flags: --zero 3, --no-compile)."""
    return (f"{command}: the {profile.name} profile (@{profile.commit[:7]}, {profile.commit_date}) sets "
            + (", ".join(flags) or "nothing a flag or the run file left open"))


def profile_unread(command: str, profile, unread: list[str]) -> str:
    """The warning for a profile's fields the command has no flag for: said, not dropped silently."""
    return (f"the {profile.name} profile states {', '.join(unread)}, which `ddplan {command}` has no flag "
            f"for: {'it is' if len(unread) == 1 else 'they are'} not applied")


def assumptions_shown(assumptions: list[str], explain: bool) -> list[str]:
    """The assumptions under a table: all of them with --explain; else what the measurement ran (always said) and
    how many more lie behind the figures."""
    if explain:
        return ["Assumptions:"] + assumptions
    measured = [a for a in assumptions if a.startswith("Measured:")]
    return measured + [f"Assumptions: {len(assumptions) - len(measured)} more lie behind these figures "
                       f"(recipe, hardware efficiencies, price, band); --explain prints them."]


def schedule_words(lay) -> str:
    """A pipelined layout's schedule in a row's name: '' for 1F1B, ' x4 interleaved', ' ZB-H1', ' ZB-V'."""
    if lay.pp_schedule.startswith("zb_"):
        return " " + lay.schedule.upper()
    return f" x{lay.pp_virtual_stages} interleaved" if lay.pp_virtual_stages > 1 else ""


def memory_title(spec: ModelSpec, hw: HardwareSpec, setup) -> str:
    lay = setup.layout
    vp = schedule_words(lay)
    asked = f" (asked {setup.asked_micro_batch}: it does not divide the sequences per rank)" \
        if setup.asked_micro_batch else ""
    fp8 = fp8_words(setup.fp8, setup.fp8_recipe, spec)
    offload = f", {lay.offload_activations} layers' activations offloaded" if lay.offload_activations else ""
    return (f"{spec.name} on {lay.num_gpus} x {hw.name} in total (dp {lay.dp}, tp {lay.tp}, pp {lay.pp}{vp}), device "
            f"batch {lay.micro_batch}{asked} x {spec.recipe.seq_len}, {spec.dtypes.compute}{fp8}, {lay.attention}, "
            f"recompute {lay.recompute}{offload}, {'compiled' if lay.compiled else 'eager'}: memory per GPU (GiB = 2^30 "
            f"bytes; fits = at most {100 * (1 - setup.headroom):.0f}% of usable)")


# --------------------------------------------------------------------------------------------
# ddplan calibrate


def from_log_line(m, out: str) -> str:
    """What `calibrate --from-log` read from a training log."""
    return (f"{m.step_time_s:.4g} s/step (median over the logged steps after step 10), {gpus_word(m.gpus)}, "
            f"{m.total_batch_tokens:,} tokens/step -> {out}")


def calibrate_plan(spec: ModelSpec, req, shapes, stages: tuple[str, ...], gemm_shapes: int, program,
                   compile_s: float, estimate_s: float) -> list[str]:
    """What a calibration will measure, before it starts: shapes, predicted peak memory, how the held-out step
    runs, a rough duration (estimate_s: ddplan.calibrate.runner.stage_estimates_s, summed)."""
    compile_s = 0.0 if shapes.skip_step else compile_s
    how = f"held-out step {program.words()}" + (f" (torch.compile up to about {compile_s:.0f} s of it, not timed)"
                                                if compile_s else " (no compilation)")
    return [
        f"calibrate: {spec.name} on {req.device}, sequence {shapes.seq_len}, held-out step at micro-batch "
        f"{shapes.step_batch} (predicted peak {shapes.peak_bytes / 2**30:.2f} GiB), {gemm_shapes} GEMM shapes at "
        f"micro-batches {', '.join(map(str, shapes.micro_batches))} and the optimizer's; "
        f"{'quick' if req.quick else 'full'} run, roughly {estimate_s:.0f} s; {how}",
        "calibrate: measures " + "; ".join(stages) + (f". Note: {'; '.join(shapes.notes)}" if shapes.notes else ""),
    ]


def peak_not_compared(m, moved: list[str]) -> str:
    """Why a calibration's measured peak is not compared: flags moved the run away from the shape it ran."""
    zero = m.zero if m.zero is not None else "native"
    return (f"The calibration's measured peak ({m.peak_memory_gb:g} GB) is for the shape its step ran "
            f"({gpus_word(m.gpus)}, micro-batch {m.device_batch_size}, ZeRO-{zero}); "
            f"{', '.join(moved).replace('--compiled', '--compile')} moved away from it, so it is not compared.")


def calibration_rows(cal) -> list[dict]:
    """What a calibration measured, a figure a row with its unit (calibrate's summary table)."""
    best = max(cal.gemm, key=lambda g: g.tflops, default=None)
    return [{"figure": "peak GEMM (square sweep)", "value": cal.peak_gemm_tflops, "unit": "TFLOP/s"},
            *([{"figure": f"best GEMM at the model's shapes ({best.m}x{best.n}x{best.k}"
                          f"{', ' + best.label if best.label else ''})", "value": best.tflops, "unit": "TFLOP/s"}]
              if best is not None else []),
            {"figure": "GEMM shapes measured", "value": len(cal.gemm), "unit": "shapes"},
            {"figure": "attention points", "value": len(cal.attention), "unit": "points"},
            {"figure": "HBM copy", "value": cal.hbm_tbyte_per_s, "unit": "TB/s"},
            {"figure": "elementwise ops", "value": cal.pointwise_tbyte_per_s, "unit": "TB/s"},
            {"figure": "AdamW step", "value": cal.optimizer_tbyte_per_s, "unit": "TB/s"},
            {"figure": "kernel overhead", "value": cal.kernel_overhead_us, "unit": "us"},
            {"figure": "collective points", "value": len(cal.collectives), "unit": "points"},
            *([{"figure": "outside the allocator (context, kernels)", "value": cal.memory.framework_gib,
                "unit": "GiB"},
               {"figure": "allocator reserve over allocated, of the activations",
                "value": cal.memory.allocator_fraction, "unit": "fraction"}] if cal.memory is not None else [])]


def held_out_title(cal) -> str:
    """The held-out step table's title: how the step ran, and that the prediction is priced the same way."""
    ran = cal.step_program
    mode = ""
    if ran is not None:
        model = "compiled" if ran.compiled_model else "eager"
        mode = (f" ({model} model, {'compiled' if ran.compiled_optimizer else 'eager'} optimizer; "
                f"predicted {model})")
    same = (f", same speed = after x {cal.machine_speed.step_vs_benchmarks:.3f}, the machine's speed during the step "
            f"over its speed during the benchmarks" if cal.machine_speed is not None else "")
    return (f"held-out training step{mode}: measured vs predicted (before = hardware spec, after = micro-benchmarks"
            f"{same})")


def calibrate_summary(cal) -> list[str]:
    """What a calibration measured and what it did not, in a few lines."""
    measured = [name for name, present in (
        (f"{len(cal.gemm)} GEMM shapes", cal.gemm), ("peak GEMM", cal.peak_gemm_tflops),
        (f"{len(cal.attention)} attention points", cal.attention), ("HBM", cal.hbm_tbyte_per_s),
        ("elementwise", cal.pointwise_tbyte_per_s), ("AdamW", cal.optimizer_tbyte_per_s),
        (f"{len(cal.muon)} Muon shapes", cal.muon),
        ("kernel overhead", cal.kernel_overhead_us), (f"{len(cal.collectives)} collective points", cal.collectives),
        ("the held-out step", cal.step_times), ("memory outside the tensors", cal.memory)) if present]
    out = ["calibrate: measured " + (", ".join(measured) or "nothing")]
    ran = cal.step_program
    if ran is not None:
        did = (f"{'compiled' if ran.compiled_model else 'eager'} model, "
               f"{'compiled' if ran.compiled_optimizer else 'eager'} optimizer")
        out.append(f"calibrate: the held-out step ran {did}" + (f" (asked: {ran.asked})" if did != ran.asked else "")
                   + (f"; its first step, compilation included, took {ran.first_step_s:.3g} s and was not timed"
                      if (ran.compiled_model or ran.compiled_optimizer) and ran.first_step_s else "")
                   + "; the prediction it is compared with is priced "
                   + ("compiled" if ran.compiled_model else "eager"))
    speed = cal.machine_speed
    if speed is not None:
        f = speed.step_vs_benchmarks
        how = (f"{100 * (f - 1):.0f}% slower" if f > 1.005 else f"{100 * (1 - f):.0f}% faster" if f < 0.995
               else "at the same speed")
        out.append(f"calibrate: machine speed: the probe ({speed.probe}) took {1e3 * speed.step_s:.3g} ms between the "
                   f"held-out step's timed steps against {1e3 * speed.benchmarks_s:.3g} ms over the benchmarks "
                   f"(median of {speed.step_probes} and {speed.benchmark_probes}): the machine ran the step {how}"
                   + (f"; the held-out error at the step's speed is {cal.held_out_error_same_speed_pct:+.3g}% "
                      f"(as measured {cal.held_out_error_pct:+.3g}%; bands use the latter)"
                      if cal.held_out_error_same_speed_pct is not None and cal.held_out_error_pct is not None else ""))
    host = cal.provenance.host_memory if cal.provenance else None
    if host:
        faults = (f"; {ran.page_faults_per_step:,.0f} minor page faults a timed step"
                  if ran is not None and ran.page_faults_per_step is not None else "")
        out.append(f"calibrate: host memory: {host}{faults}")
    out += [f"calibrate: note: {f}" for f in cal.failures]  # what failed or was skipped, and why
    return out


# --------------------------------------------------------------------------------------------
# ddplan validate


VALIDATION_COLUMNS_NOTE = (
    "error = predicted / measured - 1 on the step time (negative: ddplan optimistic, the run was slower); "
    "band = the prediction's band; MFU in the source's own convention (its FLOPs per token and peak); "
    "assumed = layout facts the source does not state (see the dataset's `assumed`).")


def peaks_title(peaks: int, ran: int, where: str, dataset: str, loso: bool) -> str:
    """The title of `validate --memory`'s table: the measured peaks, the published runs that ran, the band."""
    return (f"ddplan's memory model against {peaks} measured peaks per GPU ({where})"
            + (f" and {ran} published runs' configurations (validation/{dataset}: they ran; no peak measured), "
               if ran else ", ")
            + ("each source's verdicts by a band fitted without it" if loso else "in sample"))


def peaks_columns_note(loso: bool) -> str:
    """What `validate --memory`'s columns mean."""
    return ("error = predicted / measured - 1 in what the measurement counts (allocated: tensors; reserved: and the "
            "allocator's slack; device: and the CUDA context); verdict = the predicted peak with its band (measured / "
            "predicted: " + ("the band fitted on the other sources' peaks, each source left out in turn"
                             if loso else "the shipped band, fitted on every peak, --in-sample") + "): fits when its "
            "high end is within the limit (usable memory less the headroom), does not fit when its low end is over all "
            "of usable memory; wrong when it says does not fit for a run that ran, or fits for one that ran out of "
            "memory.")


def validation_bottom_line(scored, held=None) -> list[str]:
    """validate's first line: how far to trust a prediction. Out of sample (held: each source priced with fits
    made without it, ddplan.validation.leave_one_source_out) when given, with the in-sample figure beside it;
    in sample alone otherwise, said as such."""
    sources = len({s.source for s in scored})
    inside = summarise(scored)
    if held is None:
        worst = max(scored, key=lambda s: abs(s.error))
        return [f"Bottom line, in sample (the fits saw every run; leaving each source out, the default, is the "
                f"figure a new run can expect): on {len(scored)} published runs from {sources} sources, the step "
                f"time is off by {100 * inside.median_abs_error:.1f}% (median), at most "
                f"{100 * inside.max_abs_error:.1f}% ({worst.id}); {100 * inside.inside_share:.0f}% of the runs lie "
                f"inside their band."]
    out = summarise(held)
    worst = max(held, key=lambda s: abs(s.error))
    return [f"Bottom line: on {len(held)} published runs from {sources} sources, each priced with fits made without "
            f"its source and its siblings, the step time is off by {100 * out.median_abs_error:.1f}% (median; "
            f"{100 * median_by_source(held):.1f}% counting each source once), at most "
            f"{100 * out.max_abs_error:.1f}% ({worst.id}); {100 * out.inside_share:.0f}% of the runs lie inside "
            f"their band ({100 * inside_by_source(held):.0f}% of a source's runs, on average; median half-width "
            f"{100 * out.median_half_width:.0f}%). In sample: "
            f"{100 * inside.median_abs_error:.1f}% (median)."]
