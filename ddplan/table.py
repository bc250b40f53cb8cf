"""The decision table: the layouts a user names -> priced rows (ddplan.price) and what they decide.

Rows are every combination of the lists given (GPUs x tp x pp x interleave x ZeRO x micro-batch x
recompute x attention x window); the default is the model's native data-parallel layout. Pure: returns
priced rows and facts (which row is the baseline, the fastest, ...); ddplan.render words them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ddplan import run
from ddplan.calibration import CalibrationSpec, StepMeasurement, measurement_for
from ddplan.errors import ImpossibleMeasurement, LayoutError, UsageError
from ddplan.evidence import Thin
from ddplan.fitting import MEASURED_FLAGS, Fit, fitted
from ddplan.fp8 import FP8_RECIPES, MX_RECIPES, TE_RECIPES
from ddplan.layout import (FP8_WEIGHTS_TWICE, NATIVE_ZERO, Layout, Options, check_layout, cp_attention_problem,
                           data_parallel, layout_for, split_batch)
from ddplan.memory import HEADROOM
from ddplan.gcpause import no_cycle_collection
from ddplan.offload import check_activation_offload, check_offload
from ddplan.price import Flag, PriceCache, PricedLayout, Pricer, RunPlan
from ddplan.runfields import OPTION_FIELDS
from ddplan.specs import Budget, HardwareSpec, ModelSpec, Price

MAX_ROWS = 1000  # rows one table builds (the product of its lists), checked before any work
CRITICAL_BATCH_WARN = 2.0  # flag a layout that forces the global batch past 2x the recipe's (McCandlish et al.)


def framework_options(values: Mapping[str, Any], expert_tp: int = 0) -> Options:
    """The framework options (ddplan.layout.Options) from run-field values by parameter name
    (ddplan.runfields.OPTION_FIELDS; one not given or None takes its field's default, else Options'), as a command's
    flags and a published run state them alike. Choices are spelled with '-' in flags and files (all-gather), with
    '_' in Options (all_gather); expert_tp comes from the model (ddplan.inputs.expert_tp), not a flag's value."""
    given = {f.option: values[f.param] for f in OPTION_FIELDS if values.get(f.param) is not None}
    defaults = {f.option: f.default for f in OPTION_FIELDS if f.default is not None}
    chosen = {**defaults, **given}
    return Options(expert_tp=expert_tp, **{k: v.replace("-", "_") if isinstance(v, str) else v
                                           for k, v in chosen.items()})


@dataclass(frozen=True)
class TableRequest:
    model: ModelSpec  # at the run's sequence length and dtype (ddplan.specs.run_variant)
    hardware: HardwareSpec
    gpus: tuple[int, ...]  # total GPUs per row: dp x tp x pp
    tps: tuple[int, ...] = (1,)
    pps: tuple[int, ...] = (1,)
    vps: tuple[int, ...] = (1,)  # interleaved chunks per pipeline stage (1: 1F1B)
    schedule: str | None = None  # the pipeline schedule (runfields.SCHEDULES; None: 1F1B, interleaved when vp > 1)
    cps: tuple[int, ...] = (1,)  # context-parallel degrees (each sequence split over cp GPUs)
    eps: tuple[int, ...] = (1,)  # expert-parallel degrees (routed experts split over ep of the dp x cp ranks)
    zeros: tuple[int, ...] = ()  # () = the model's native data-parallel setup
    micro_batches: tuple[int, ...] = ()  # () = the recipe's, halved until it fits in memory
    recomputes: tuple[str, ...] = ("none",)
    attentions: tuple[str, ...] = ()  # () = every implementation on the hardware
    windows: tuple[str, ...] = ()  # () = the model's pattern, and L when it differs
    total_batch_tokens: int | None = None
    batch_from: str = ""  # whose batch total_batch_tokens is, for the title ("" : inferred, ddplan.verdicts.table_title)
    budget: Budget | None = None
    price: Price | None = None
    overheads: run.RunOverheads = run.RunOverheads()
    compiled: bool | None = None
    measurement: StepMeasurement | None = None
    knob: str = "auto"
    calibration: CalibrationSpec | None = None
    calibration_path: str | None = None  # where the calibration came from, for error messages
    fp8: bool = False  # eligible GEMMs in fp8 (MFU stays against the compute dtype's peak)
    fp8_recipe: str | None = None  # how the fp8 casts run (ddplan.fp8.FP8_RECIPES); None: the model's
    headroom: float = HEADROOM
    options: Options = Options()  # sequence parallelism, TP overlap, hybrid sharding, ... where they apply
    framework: str | None = None  # the training stack's profile name: its published runs weigh in the band
    compile_offered: bool = True  # False: the stack has no whole-model torch.compile (its profile's lacks.compile)
    evidence: bool = True  # False: the base band, not widened where the evidence is thin (validation re-widens it)
    bands: bool = True  # False: each row's value only, its band collapsed to it (what a fit's cost reads)
    fp8_stack_kept: float | None = None  # a re-fit of ddplan.fp8.FP8_STACK_KEPT (validation's); None: the shipped one


@dataclass(frozen=True)
class Verdict:
    """What the table decides, as rows; None where there is nothing to say."""

    baseline: PricedLayout | None = None
    best_kernel: PricedLayout | None = None  # the fastest attention at the baseline's layout and window
    best_window: PricedLayout | None = None  # faster still with another window pattern: a model change
    compiled: PricedLayout | None = None  # an uncompiled baseline's layout torch.compile'd (where the stack can)
    more_gpus: PricedLayout | None = None  # the baseline's kernel on the most GPUs
    fastest: PricedLayout | None = None
    cheapest: PricedLayout | None = None
    largest_fitting: PricedLayout | None = None
    all_fit: bool = True  # every row with the baseline's attention fits in memory
    kernel_choices: int = 1  # runnable rows at the baseline's layout (attention x window) compared
    runnable: int = 0
    model_parallel: bool = False  # some row already uses tensor or pipeline parallelism
    blocked: tuple[str, ...] = ()  # when no row is runnable: the flag kinds that block them


@dataclass
class Table:
    request: TableRequest
    rows: list[PricedLayout]
    steps: int  # at the table's total batch (the recipe's unless --total-batch-size or a measurement sets it)
    total_batch_tokens: int
    budget: Budget
    price: Price
    compiled: bool
    fit: Fit | None = None
    verdict: Verdict = Verdict()
    notes: list[Flag] = field(default_factory=list)  # about the whole table (ddplan.render words them)
    thin: tuple[Thin, ...] = ()  # the thin evidence that widened the uncalibrated band (ddplan.price.Pricer.thin)


def check_fp8(spec: ModelSpec, hw: HardwareSpec, recipe: str | None = None) -> None:
    """Raise UsageError when the model's fp8 training path (recipe: --fp8-recipe, else the model's) cannot run on
    this hardware, saying why."""
    if hw.peak.fp8_tflops is None or not hw.fp8_formats:
        raise UsageError(f"{hw.name} has no fp8 tensor units; drop --fp8", field="--fp8")
    if (recipe or spec.recipe.fp8_recipe) in MX_RECIPES and not hw.mxfp8:
        raise UsageError(f"{hw.name}'s spec states no MXFP8 support (Transformer Engine's recipe and torchtitan's "
                         f"MXFP8 converters need Blackwell, SM 10.0+); use --fp8-recipe current or delayed "
                         f"(Transformer Engine) or rowwise (torchao)", field="--fp8-recipe")
    if spec.dtypes.compute not in ("bf16", "fp16"):
        raise UsageError(f"fp8 GEMMs come with a bf16 or fp16 run, not {spec.dtypes.compute}: drop --fp8 or --dtype",
                         field="--fp8")
    need = spec.recipe.fp8_formats
    if need and not set(need) <= set(hw.fp8_formats):
        raise UsageError(f"{spec.name}'s fp8 path needs {'/'.join(need)}, but {hw.name}'s tensor units take "
                         f"{'/'.join(hw.fp8_formats)} (e.g. nanochat's torch._scaled_mm with float8_e4m3fn does "
                         f"not run on MI300X, which has the fnuz formats)", field="--fp8")


def check_attentions(names: tuple[str, ...], hw: HardwareSpec) -> None:
    """Raise UsageError naming the first attention implementation the hardware spec does not list, and those it
    does."""
    known = [a.name for a in hw.attention]
    for name in names:
        if name not in known:
            raise UsageError(f"{name!r} is not available on {hw.name}; allowed: {', '.join(known)}",
                             field="--attention")


def fp8_params_apply(spec: ModelSpec, fp8: bool, recipe: str | None, zeros: tuple[int, ...] | None) -> bool:
    """Whether fp8 weights (--fp8-params) can apply, by check_fp8_options' rules: fp8 on, fp32 masters, a Transformer
    Engine recipe, ZeRO-1 or 2 among the stages. A profile's (NeMo's) applies only then; a flag's is checked."""
    try:
        check_fp8_options(spec, fp8, recipe, False, zeros, True)
    except UsageError:
        return False
    return True


def check_fp8_options(spec: ModelSpec, fp8: bool, recipe: str | None, all_gather: bool,
                      zeros: tuple[int, ...] | None, params: bool = False, casts: bool = True) -> None:
    """Raise UsageError when --fp8-recipe, --fp8-all-gather or --fp8-params cannot apply, saying why. zeros: the ZeRO
    stages asked for (() = the model's native one; None: searched, as plan does). casts=False: the command prices no
    cast (memory), so the recipe is not checked. Also --weights remainder, which keeps 2 bytes of each fp32 master
    only where Megatron-Core lets Transformer Engine's FusedAdam keep the masters: without fp8 or with delayed
    scaling (optimizer_config.py@d98e8a64 L400-411, use_precision_aware_optimizer_no_fp8_or_ds_fp8), and of bf16
    weights, not fp8 ones (--fp8-params; Transformer Engine's FusedAdam docstring: store_param_remainders "works only
    when param type is BF16"). Rows without the distributed optimizer (ZeRO-0, or Megatron-FSDP's ZeRO-3) keep whole
    masters row by row (ddplan.specs.Optimizer.adamw_bytes), not refused."""
    if recipe is not None and recipe not in FP8_RECIPES:
        raise UsageError(f"must be one of {', '.join(FP8_RECIPES)}, got {recipe!r}", field="--fp8-recipe")
    if recipe is not None and not fp8:
        raise UsageError("needs --fp8 (it says how the fp8 GEMMs' casts run)", field="--fp8-recipe")
    if spec.recipe.optimizer.master_remainder:
        used = recipe or spec.recipe.fp8_recipe
        if params:  # TE FusedAdam: remainders "work only when param type is BF16", not an fp8 weight
            raise UsageError("with fp8 weights (--fp8-params) Transformer Engine's FusedAdam keeps the fp32 masters "
                             "whole: its remainders are of bf16 weights; use --weights master", field="--weights")
        if fp8 and used != "delayed":
            raise UsageError(f"with the {used} fp8 recipe Megatron-Core keeps the fp32 masters whole (only delayed "
                             f"scaling leaves them to Transformer Engine's FusedAdam): use --weights master",
                             field="--weights")
    if params:
        if not fp8:
            raise UsageError("needs --fp8 (it keeps the fp8 GEMMs' weights in fp8)", field="--fp8-params")
        if not spec.recipe.optimizer.master_weights:
            raise UsageError(f"keeps the weights in fp8 beside fp32 masters in the distributed optimizer; "
                             f"{spec.name} keeps fp32 weights without masters: add --weights master", field="--fp8-params")
        used = recipe or spec.recipe.fp8_recipe
        if casts and used not in TE_RECIPES:
            raise UsageError(f"Megatron-Core keeps fp8 weights with Transformer Engine's recipes, not {used} "
                             f"({'--fp8-recipe' if recipe else spec.name + ' default'}): add --fp8-recipe delayed or "
                             f"current (or mxfp8 on Blackwell)", field="--fp8-params")
        stages = zeros if zeros else (NATIVE_ZERO[spec.recipe.distribution],) if zeros is not None else (1, 2, 3)
        if not set(stages) & {1, 2, 3}:
            raise UsageError(f"needs the distributed optimizer (ZeRO-1 or 2) or Megatron-FSDP (ZeRO-3), which gather "
                             f"the fp8 weights (got ZeRO-{'/'.join(map(str, stages))}): add --zero 1",
                             field="--fp8-params")
        if all_gather:
            raise UsageError(FP8_WEIGHTS_TWICE, field="--fp8-params")
    if not all_gather:
        return
    if not fp8:
        raise UsageError("needs --fp8 (it gathers the weights of the fp8 GEMMs in fp8)", field="--fp8-all-gather")
    if casts and (recipe or spec.recipe.fp8_recipe) != "tensorwise":
        raise UsageError(f"torchao's enable_fsdp_float8_all_gather runs with the tensorwise recipe, not "
                         f"{recipe or spec.recipe.fp8_recipe} ({spec.name}'s fp8 path): add --fp8-recipe tensorwise",
                         field="--fp8-all-gather")
    stages = zeros if zeros else (NATIVE_ZERO[spec.recipe.distribution],) if zeros is not None else (3,)
    if 3 not in stages:
        raise UsageError(f"needs ZeRO-3, whose all-gathers it makes fp8 (got ZeRO-{'/'.join(map(str, stages))}): "
                         f"add --zero 3", field="--fp8-all-gather")


def measurement_of(req: TableRequest) -> StepMeasurement | None:
    """The measurement behind the table: the flags', else the calibration file's for this model."""
    return req.measurement or measurement_for(req.calibration, req.model)


def build_table(req: TableRequest, progress: Callable[[str, int, int], None] | None = None,
                shared: dict | None = None) -> Table:
    """Price the rows the request names; progress(what, done, total) is called before each row.

    shared: the rate-independent cache (anatomies, memory, collectives: ddplan.price.PriceCache.shared) of an
    earlier table of the same model and layouts on the same hardware up to its efficiencies, to reuse (what
    validation's fits re-price at other GEMM efficiencies)."""
    with no_cycle_collection():
        return _build_table(req, progress, shared)


def _build_table(req: TableRequest, progress: Callable[[str, int, int], None] | None,
                 shared: dict | None) -> Table:
    spec, hw = req.model, req.hardware
    seq = spec.recipe.seq_len
    total_batch = req.total_batch_tokens or spec.recipe.total_batch_tokens
    if total_batch % seq:
        raise UsageError(f"{total_batch:,} is not a multiple of the sequence length {seq}", field="--total-batch-size")
    budget = req.budget or spec.recipe.budget
    compiled = spec.recipe.compiled if req.compiled is None else req.compiled
    attentions = req.attentions or tuple(a.name for a in hw.default_attention_impls())
    check_attentions(attentions, hw)
    pattern = spec.architecture.window_pattern
    windows = req.windows or ((pattern, "L") if pattern != "L" else ("L",))
    rows = math.prod(len(x) for x in (req.gpus, req.tps, req.pps, req.vps, req.cps, req.eps, req.zeros or (0,),
                                      req.micro_batches or (0,), req.recomputes, attentions, windows))
    if rows > MAX_ROWS:
        raise UsageError(f"{rows:,} rows asked (the product of the lists); a table has at most {MAX_ROWS:,}: "
                         f"shorten a list, or use `ddplan plan` to search", field="--gpus/--tp/--pp/--zero/...")
    price = req.price or hw.price
    if req.fp8:
        check_fp8(spec, hw, req.fp8_recipe)
    check_fp8_options(spec, req.fp8, req.fp8_recipe, req.options.fp8_all_gather, req.zeros, req.options.fp8_params)
    if req.options.offload_optimizer:
        check_offload(spec, hw, req.zeros)
    check_activation_offload(hw, req.options.offload_activations)
    pricer = Pricer(spec, hw, RunPlan(budget, price, req.overheads, req.headroom, req.framework, req.evidence,
                                     req.fp8_stack_kept),
                    req.calibration, req.fp8, fp8_recipe=req.fp8_recipe,
                    _caches=PriceCache(shared=shared) if shared is not None else None)
    table = Table(request=req, rows=[], steps=pricer.steps(total_batch), total_batch_tokens=total_batch,
                  budget=budget, price=price, compiled=compiled, thin=pricer.thin)
    m = measurement_of(req)
    if m is not None:
        where = MEASURED_FLAGS if req.measurement is not None else f"{req.calibration_path or 'calibration'}: step_times"
        try:
            pricer, table.fit = fitted(pricer, m, req.knob, where, req.options)
        except UsageError as e:
            # stated on the command line, or impossible on this hardware: the user must hear it as an error
            if req.measurement is not None or isinstance(e, ImpossibleMeasurement):
                raise
            # a calibration's own held-out step that no efficiency factor explains: the micro-benchmarks
            # still stand; say so and go on without the fit
            table.notes.append(Flag("unfitted", (("reason", e.message),)))
        if (table.fit is not None and req.measurement is not None
                and table.fit.implied > IMPLAUSIBLE_MARGIN * table.fit.ceiling):
            raise implausible_measurement(table.fit, hw, spec, req)
        if table.fit is not None and m.total_batch_tokens != total_batch:
            table.notes.append(Flag("measured_batch", (("measured_tokens", m.total_batch_tokens),
                                                       ("table_tokens", total_batch))))
    native = NATIVE_ZERO[spec.recipe.distribution]
    skipped: list[str] = []
    seen: set = set()
    for i, (gpus, tp, pp, vp, cp, ep, zero, asked_mb, rc, att, win) in enumerate(itertools.product(
            req.gpus, req.tps, req.pps, req.vps, req.cps, req.eps, req.zeros or (native,),
            req.micro_batches or (spec.recipe.device_batch_size,), req.recomputes, attentions, windows)):
        if progress:
            progress(f"{gpus} GPUs, tp {tp}, pp {pp}, {att}, {win}", i, rows)
        try:
            layout, flags = _layout(pricer, total_batch // seq, gpus, tp, pp, vp, cp, zero, asked_mb, rc, att, win,
                                    compiled, pinned=bool(req.micro_batches), options=req.options, ep=ep,
                                    schedule=req.schedule)
        except LayoutError as e:
            skipped.append(f"{gpus} GPUs, tp {tp}, pp {pp}, " + (req.schedule if req.schedule else f"interleave {vp}")
                           + (f", cp {cp}" if cp > 1 else "")
                           + (f", ep {ep}" if ep > 1 else "") + f": {e.message}")
            continue
        if (layout, win) in seen:  # e.g. --zero 0,3 on one GPU: the same layout twice
            continue
        seen.add((layout, win))
        table.rows.append(pricer.price(layout, win, bands=req.bands, flags=flags))
    fit = table.fit
    if (fit is not None and fit.seq_len == seq and not any(r.basis == "measured" for r in table.rows)
            and (fit.layout, fit.window) not in seen):  # the measured configuration is always a row
        table.rows.insert(0, pricer.price(fit.layout, fit.window, bands=req.bands))
    if not table.rows:
        raise UsageError(f"no layout can exist: {skipped[0]}", field="--gpus/--tp/--pp/--vp/--cp/--ep")
    if skipped:
        table.notes.append(Flag("skipped", tuple((f"layout {i}", s) for i, s in enumerate(dict.fromkeys(skipped)))))
    small = [g for g in req.gpus if g % hw.gpus_per_node]
    if price.billing == "per_node" and small:
        table.notes.append(Flag("per_node", (("provider", price.provider), ("gpus_per_node", hw.gpus_per_node),
                                             ("gpus", ", ".join(map(str, small))))))
    table.verdict = decide(table.rows, hw.default_attention, pattern)
    base = table.verdict.baseline
    if base is not None and not base.layout.compiled and req.compile_offered and base.basis == "model":
        # the same layout compiled: what Inductor's fusion of the elementwise ops would gain (verdicts words it)
        twin = pricer.price(replace(base.layout, compiled=True), base.window, bands=req.bands)
        if twin.runnable:
            table.verdict = replace(table.verdict, compiled=twin)
    elif (base is None and not compiled and req.compile_offered and "memory" in table.verdict.blocked
          and table.fit is None):
        # nothing fits eager: the fastest row that fits compiled, if any (compiled keeps fewer activations)
        twins = [pricer.price(replace(r.layout, compiled=True), r.window, bands=req.bands) for r in table.rows]
        fitting = [t for t in twins if t.runnable]
        if fitting:
            table.verdict = replace(table.verdict, compiled=min(fitting, key=lambda t: t.wall_clock_h))
    return table


def _layout(pricer: Pricer, sequences: int, gpus: int, tp: int, pp: int, vp: int, cp: int, zero: int, asked_mb: int,
            rc: str,
            attention: str, window: str, compiled: bool, pinned: bool,
            options: Options = Options(), ep: int = 1, schedule: str | None = None) -> tuple[Layout, tuple[Flag, ...]]:
    """The layout of one row, its batch split by the one rule (ddplan.layout.split_batch), and what changed.

    Unless the micro-batch is pinned, the largest divisor of the sequences per rank that fits in memory
    is taken; a measured layout is never reshaped (it ran).
    """
    spec = pricer.spec
    split = split_batch(sequences, data_parallel(gpus, tp, pp, cp), asked_mb)
    layout = layout_for(spec, gpus=gpus, tp=tp, pp=pp, vp=vp, cp=cp, ep=ep, zero=zero, micro_batch=split.micro_batch,
                        grad_accum=split.accum, attention=attention, recompute=rc, compiled=compiled,
                        options=options, schedule=schedule)
    check_layout(layout, spec, world_size_rule=False)
    impl = pricer.hw.attention_impl(attention)
    problem = cp_attention_problem(layout, impl.kind, impl.windows, spec, window)
    if problem:
        raise LayoutError(f"{attention}: {problem}")
    flags = []
    if split.change:
        flags.append(Flag("batch", (("change", split.change), ("asked_micro_batch", asked_mb),
                                    ("micro_batch", split.micro_batch), ("sequences", split.sequences),
                                    ("recipe_sequences", sequences),
                                    ("past_critical", int(split.sequences > CRITICAL_BATCH_WARN * sequences)))))
    measured = pricer.fit is not None and pricer.fit.layout == layout and pricer.fit.window == window
    if not pinned and not measured and not pricer.memory(layout, window).fits:
        per_rank = split.accum * split.micro_batch
        for mb in sorted((d for d in range(1, split.micro_batch) if per_rank % d == 0), reverse=True):
            smaller = replace(layout, micro_batch=mb, grad_accum=per_rank // mb)
            if pricer.memory(smaller, window).fits or mb == 1:
                flags.append(Flag("micro_batch", (("asked", split.micro_batch), ("used", mb),
                                                  ("accum_before", split.accum), ("accum_after", per_rank // mb),
                                                  ("usable_gib", pricer.hw.memory.usable_gib.value))))
                layout = smaller
                break
    return layout, tuple(flags)


def decide(rows: list[PricedLayout], default_attention: str, pattern: str) -> Verdict:
    """Baseline, the kernel fix on its layout, more GPUs with its kernel, fastest and cheapest runnable rows."""
    ok = [r for r in rows if r.runnable]
    if not ok:
        return Verdict(blocked=tuple(sorted({f.kind for r in rows for f in r.flags
                                             if f.kind in ("memory", "world_size", "implausible")})))
    g0 = min(r.layout.num_gpus for r in ok)
    measured = [r for r in ok if r.basis == "measured"]
    first = [r for r in ok if r.layout.num_gpus == g0 and r.layout.attention == default_attention
             and r.window == pattern]
    base = (measured or first or [max((r for r in ok if r.layout.num_gpus == g0), key=lambda r: r.wall_clock_h)])[0]
    same = _shape(base)
    kernels = [r for r in ok if _shape(r) == same]
    best_kernel = min((r for r in kernels if r.window == base.window), key=lambda r: r.wall_clock_h)
    windows = [r for r in kernels if r.window != base.window and r.wall_clock_h < best_kernel.wall_clock_h]
    best_window = min(windows, key=lambda r: r.wall_clock_h) if windows else None
    more = [r for r in ok if r.layout.num_gpus > base.layout.num_gpus and r.layout.attention == base.layout.attention
            and r.window == base.window]
    more_gpus = None
    if more:
        top = max(r.layout.num_gpus for r in more)
        more_gpus = min((r for r in more if r.layout.num_gpus == top), key=lambda r: r.wall_clock_h)
    fitting = [r for r in rows if r.memory.fits]
    return Verdict(
        baseline=base, best_kernel=best_kernel if best_kernel is not base else None, best_window=best_window,
        more_gpus=more_gpus,
        fastest=min(ok, key=lambda r: r.wall_clock_h), cheapest=min(ok, key=lambda r: r.cost_usd),
        largest_fitting=max(fitting, key=lambda r: r.memory.total) if fitting else None,
        all_fit=all(r.memory.fits for r in rows if r.layout.attention == base.layout.attention),
        kernel_choices=len(kernels), runnable=len(ok),
        model_parallel=any(r.layout.tp > 1 or r.layout.pp > 1 or r.layout.cp > 1 for r in rows))


def _shape(r: PricedLayout) -> tuple:
    """A row's layout apart from its kernel choices (attention, window) and the micro-batch that follows."""
    lay = r.layout
    return (lay.num_gpus, lay.dp, lay.tp, lay.pp, lay.pp_virtual_stages, lay.pp_schedule, lay.cp, lay.zero,
            lay.recompute)


# A stated step whose fit needs kernels more than this factor above the device's best measured GEMM is refused
# (assumed: past the model's own out-of-sample spread on the fast side, 0.86 x on the published runs: 1 / 0.86 =
# 1.16 x, with room). Between
# the best GEMM and this factor it is priced, flagged implausible, with the model's band (ddplan.fitting).
IMPLAUSIBLE_MARGIN = 1.25


def implausible_measurement(fit: Fit, hw: HardwareSpec, spec: ModelSpec, req: TableRequest) -> ImpossibleMeasurement:
    """The error for a step stated with --measured-step-time whose fit needs its kernels more than
    IMPLAUSIBLE_MARGIN x faster than the device's best measured GEMM: the figures it was tied to, each with where
    it came from, so the wrong one can be found. Most often the batch or the window was left at the recipe's."""
    m = fit.measurement
    batch = (f"{m.total_batch_tokens:,} tokens a step ("
             + ("--total-batch-size" if req.total_batch_tokens else "the recipe's default; --total-batch-size") + ")")
    window = f"window {fit.window} (" + ("--measured-window/--window" if req.windows else
                                        "the model's default; --measured-window") + ")"
    micro = (f"micro-batch {m.device_batch_size} (" + ("--device-batch-size" if req.micro_batches else
                                                    "the recipe's default; --device-batch-size") + ")")
    layout = f"{m.gpus} GPU{'s' if m.gpus > 1 else ''}, tp {m.tp}, pp {m.pp} (--measured-gpus/--measured-tp/--measured-pp)"
    return ImpossibleMeasurement(
        f"the measured {m.step_time_s:g} s/step needs {fit.knob} efficiency {fit.implied:.2f} of peak, "
        f"{fit.implied / fit.ceiling:.2f}x the best GEMM ever measured on {hw.name} ({fit.ceiling:.2f}): it cannot "
        f"have run as stated. It was tied to "
        f"{batch}, {window}, {micro}, {layout}, attention {m.attention}, recompute {m.recompute}: state what ran",
        field="--measured-step-time")
