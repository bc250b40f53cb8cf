"""Does it fit? Memory rows per ZeRO stage, what else would fit, and what a measured peak matches.

Every figure is the pricer's (ddplan.price.Pricer.memory), so `ddplan memory`, `table` and `plan` agree
about one layout. Rows are plain dicts (units in the keys); ddplan.verdicts words the conclusion.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from ddplan.errors import LayoutError, UsageError
from ddplan.frameworks import can_run, searched_recomputes
from ddplan.layout import (NATIVE_ZERO, Layout, Options, check_layout, cp_attention_problem, data_parallel,
                           expert_parallel_degrees, layout_for, split_batch)
from ddplan.memory import FITS, HEADROOM, PEAK_KINDS, MemoryAssumptions, MemoryBreakdown, predicted_peak_bytes
from ddplan.price import Pricer, RunPlan
from ddplan.runfields import recompute_layers
from ddplan.specs import HardwareSpec, ModelSpec
from ddplan.units import GB, GiB

TERM_COLUMNS = {
    "params": "params_gib", "gradients": "gradients_gib", "optimizer": "optimizer_gib",
    "activations": "activations_gib", "activation_transient": "transient_gib", "comm_buffers": "buffers_gib",
    "framework": "framework_gib", "allocator_slack": "allocator_gib",
}
@dataclass(frozen=True)
class Setup:
    """Everything memory depends on besides the specs."""

    layout: Layout
    window_pattern: str | None = None
    headroom: float = HEADROOM
    asked_micro_batch: int | None = None  # when the batch split took a smaller one (ddplan.layout.split_batch)
    options: Options = Options()  # applied to each ZeRO stage asked about, where they apply
    # the terms outside the model (context, allocator slack, buffers): assumed, or a calibration's `memory:`
    # section (ddplan.calibration.memory_assumptions)
    assumptions: MemoryAssumptions = MemoryAssumptions()
    fp8: bool = False  # the fp8 GEMMs save their inputs as the recipe keeps them (ddplan.fp8.with_fp8_saves)
    fp8_recipe: str | None = None  # None: the model's

    def at_zero(self, zero: int) -> Layout:
        """The setup's layout at another ZeRO stage, with the options that apply there."""
        lay = self.layout
        options = self.options.for_layout(lay.tp, lay.grad_ranks, zero, lay.cp, lay.pp)
        if options["shard_group"] and lay.grad_ranks % options["shard_group"]:
            raise LayoutError(f"--shard-group {options['shard_group']} does not divide dp x cp = {lay.grad_ranks}",
                              field="--shard-group")
        return replace(lay, zero=zero, **options)


def attention_mode(hw: HardwareSpec, name: str) -> tuple[str, str]:
    """(kind, window support) of a named attention implementation on this hardware."""
    try:
        impl = hw.attention_impl(name)
    except KeyError:
        allowed = ", ".join(a.name for a in hw.attention)
        raise UsageError(f"attention implementation {name!r} is not available on {hw.name}; allowed: {allowed}",
                         field="--attention") from None
    return impl.kind, impl.windows


def memory_pricer(spec: ModelSpec, hw: HardwareSpec, setup: Setup) -> Pricer:
    """A pricer for memory questions about one setup (the recipe's run; memory does not depend on it)."""
    plan = RunPlan(spec.recipe.budget, hw.price, headroom=setup.headroom)
    return Pricer(spec, hw, plan, assumptions=setup.assumptions, fp8=setup.fp8, fp8_recipe=setup.fp8_recipe)


def breakdown(spec: ModelSpec, hw: HardwareSpec, setup: Setup, pricer: Pricer | None = None) -> MemoryBreakdown:
    """Memory per GPU of a setup, by term (the pricer's; pass one to share its cache)."""
    attention_mode(hw, setup.layout.attention)  # an unknown implementation: one line naming --attention
    pricer = pricer or memory_pricer(spec, hw, setup)
    return pricer.memory(setup.layout, setup.window_pattern or pricer.spec.architecture.window_pattern)


def zero_rows(spec: ModelSpec, hw: HardwareSpec, setup: Setup, stages: list[int]) -> list[dict]:
    """One row per ZeRO stage: each term in GiB, total against usable memory, the native stage marked."""
    native = NATIVE_ZERO[spec.recipe.distribution]
    pricer = memory_pricer(spec, hw, setup)
    rows = []
    for z in stages:
        mb = breakdown(spec, hw, replace(setup, layout=setup.at_zero(z)), pricer)
        row = {"zero": z, "setup": "native" if z == native else "what-if"}
        row.update({TERM_COLUMNS[k]: v / GiB for k, v in mb.terms.items()})
        row.update({"total_gib": mb.total / GiB, "usable_gib": mb.capacity / GiB,
                    "fits": mb.fits, "headroom_gib": mb.headroom / GiB, "verdict": mb.verdict,
                    "low_gib": mb.band[0] / GiB, "high_gib": mb.band[1] / GiB, "limit_gib": mb.limit / GiB})
        rows.append(row)
    return rows


@dataclass(frozen=True)
class Fix:
    """A set of changes to a setup that does not fit, and what the changed setup costs."""

    changes: tuple[str, ...]  # in words, one per knob changed
    layout: Layout
    total_gib: float
    step_s: float  # the changed setup's step time (seconds, the pricer's central estimate)


def what_fits(spec: ModelSpec, hw: HardwareSpec, setup: Setup, top: int = 3, certain: bool = False,
              block_recompute: bool = False, lacks: frozenset[str] = frozenset(),
              recomputes: tuple[str, ...] | None = None) -> tuple[float, list[Fix]]:
    """(the asked setup's step time, the cheapest sets of changes that make it fit, fastest first). certain: a
    change must make it fit with the memory model's error on it (ddplan.memory.fit_verdict FITS), as for a
    setup that may not fit; otherwise its central estimate must fit.

    On the same GPUs, every combination of: a smaller micro-batch (more accumulation, same total batch),
    recompute, a higher ZeRO stage, another attention implementation, more tensor parallelism inside a
    node and more pipeline stages (dp shrinks by the degree), of what the stack can run (`lacks`: none of those).
    Each that fits is priced at its step time. Kept: the fastest fix, then the fastest with one change, with two,
    ... (the smallest sets that fit), `top` in all. The step time of the setup as asked (which does not fit) is the
    reference. block_recompute: where full recompute fits, the fewest layers a chunk re-run whole that fit too
    (full:N, found by bisection: memory falls as N grows), less compute than full. recomputes: the recompute
    families the stack offers (None: unknown), the policies tried (ddplan.frameworks.searched_recomputes).
    """
    base = setup.layout
    pricer = memory_pricer(spec, hw, setup)
    window = setup.window_pattern or pricer.spec.architecture.window_pattern
    a = spec.architecture
    sequences = base.dp * base.micro_batch * base.grad_accum
    cp = base.cp
    tps = sorted({base.tp, *(t for t in (2, 4, 8, 16)
                             if base.tp < t <= hw.gpus_per_node and can_run(lacks, tp=t))})
    pps = sorted({base.pp, *(p for p in (2, 4, 8, 16, 32, 64)
                             if base.pp < p <= a.num_layers and can_run(lacks, pp=p, tied=a.tied_embeddings))})
    degrees = [(tp, pp) for tp in tps for pp in pps
               if base.num_gpus % (tp * pp * cp) == 0 and a.num_heads % tp == 0 and a.num_kv_heads % tp == 0]
    zeros = sorted({base.zero, *(z for z in (1, 2, 3) if z > base.zero and can_run(lacks, zero=z))})  # the stack's
    rcs = searched_recomputes(recomputes)
    found: list[Fix] = []
    for tp, pp in degrees:
        dp = base.num_gpus // (tp * pp * cp)
        if sequences % dp:
            continue
        per_rank = sequences // dp
        for zero in zeros if dp * cp > 1 else [base.zero]:
            for mb in [m for m in range(min(base.micro_batch, per_rank), 0, -1) if per_rank % m == 0]:
                eps = [e for e in _expert_degrees(spec, base, tp, dp * cp)
                       if e == base.ep or can_run(lacks, tp=tp, ep=e)]
                for rc, impl, ep in itertools.product(rcs, hw.default_attention_impls(), eps):
                    try:
                        lay = replace(setup.at_zero(zero), dp=dp, tp=tp, pp=pp, micro_batch=mb,
                                      grad_accum=per_rank // mb, recompute=rc, attention=impl.name, ep=ep,
                                      **setup.options.for_layout(tp, dp * cp, zero, cp, pp))
                        check_layout(lay, spec, world_size_rule=False)
                    except LayoutError:
                        continue
                    if lay == base:
                        continue
                    mem = pricer.memory(lay, window)
                    if (mem.verdict == FITS) if certain else mem.fits:
                        found.append(Fix(_changes(base, lay, spec), lay, mem.total / GiB,
                                         pricer.price(lay, window, bands=False).step_s))
                        if block_recompute and rc == "full":
                            fewest = fewest_layers(pricer, lay, window, certain, a.num_layers)
                            if fewest is not None:
                                mem = pricer.memory(fewest, window)
                                found.append(Fix(_changes(base, fewest, spec), fewest, mem.total / GiB,
                                                 pricer.price(fewest, window, bands=False).step_s))
    found.sort(key=lambda f: (f.step_s, len(f.changes)))
    fewest: dict[int, Fix] = {}
    for f in found:  # the fastest fix of each size
        fewest.setdefault(len(f.changes), f)
    kept = found[:1] + [f for n, f in sorted(fewest.items()) if n < len(found[0].changes)]
    return pricer.price(base, window, bands=False).step_s, kept[:top]


def fixes_for(spec: ModelSpec, hw: HardwareSpec, setup: Setup, asked: dict | None,
              block_recompute: bool = False, lacks: frozenset[str] = frozenset(),
              recomputes: tuple[str, ...] | None = None) -> tuple[float | None, list[Fix]]:
    """What `ddplan memory` proposes for the setup asked (its zero_rows row, None if its stage was not priced):
    nothing when it fits even with the memory model's error on it; when it fits only as predicted (may not fit),
    the changes that make it certain; otherwise the changes that make its predicted peak fit (what_fits).
    block_recompute: the stack can re-run some layers whole (full:N), tried where full recompute fits. lacks: what
    the stack cannot run (ddplan.frameworks.LACKS), which no fix uses; recomputes: the recompute families it offers
    (None: unknown), which the fixes try (ddplan.frameworks.searched_recomputes)."""
    if asked is not None and asked["verdict"] == FITS:
        return None, []
    return what_fits(spec, hw, setup, certain=asked is not None and asked["fits"], block_recompute=block_recompute,
                     lacks=lacks, recomputes=recomputes)


def fewest_layers(pricer, full: Layout, window: str, certain: bool, layers: int) -> Layout | None:
    """The layout `full` (full recompute, which fits) under full:N with the smallest N that fits too (bisection over
    1 .. a chunk's layers - 1: memory falls as N grows, ddplan.anatomy.Anatomy.layer_again), None where even N one
    below the chunk does not fit. e.g. 80 layers at pp 4: N in 1..19."""
    chunk = -(-layers // (full.pp * full.pp_virtual_stages))

    def fits(n: int) -> bool:
        mem = pricer.memory(replace(full, recompute=f"full:{n}"), window)
        return mem.verdict == FITS if certain else mem.fits

    lo, hi = 1, chunk - 1
    if hi < lo or not fits(hi):
        return None
    while lo < hi:  # the smallest n in [lo, hi] that fits; hi always fits
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid + 1, hi)
    return replace(full, recompute=f"full:{lo}")


def _expert_degrees(spec: ModelSpec, base: Layout, tp: int, ranks: int) -> list[int]:
    """The ep degrees tried for a fix: the asked one and every other that divides the experts and the ranks ep
    is carved from (ddplan.layout.expert_parallel_degrees); a dense model: the asked one (1)."""
    if spec.architecture.moe is None:
        return [base.ep]

    pool = ranks * (tp if base.etp == 1 else 1)
    return sorted({base.ep, *expert_parallel_degrees(spec, pool)})


def _changes(base: Layout, lay: Layout, spec: ModelSpec) -> tuple[str, ...]:
    out = []
    if lay.micro_batch != base.micro_batch:
        out.append(f"device batch {lay.micro_batch} (accumulation {base.grad_accum} -> {lay.grad_accum})")
    if lay.recompute != base.recompute:
        layers = recompute_layers(lay.recompute)
        out.append(f"recompute {lay.recompute}" + (f" (the first {layers[1]} layers of each pipeline chunk re-run)"
                                                    if layers and layers[0] == "first" else ""))
    if lay.zero != base.zero:
        other = "" if NATIVE_ZERO[spec.recipe.distribution] == lay.zero else " (another training setup)"
        out.append(f"ZeRO-{lay.zero}{other}")
    if lay.attention != base.attention:
        out.append(f"attention {lay.attention}")
    if (lay.tp, lay.pp) != (base.tp, base.pp):
        out.append(f"tp {lay.tp} x pp {lay.pp} (dp {lay.dp}, same {lay.num_gpus} GPUs)")
    if lay.ep != base.ep:
        out.append(f"ep {lay.ep}")
    return tuple(out)


PEAK_TOLERANCE = 0.10  # a measured peak matches a configuration predicted within +-10%


def consistent_with(spec: ModelSpec, hw: HardwareSpec, setup: Setup, measured_gb: float, what: str = "device",
                    tolerance: float = PEAK_TOLERANCE) -> list[dict]:
    """Every (attention, recompute, compiled) combination, its predicted peak, and whether it matches.

    A measured peak (GB = 1e9 bytes) is consistent with a configuration when the prediction, in the terms the
    measurement counts (`what`: device, as nvidia-smi / rocm-smi report; reserved, torch.cuda.max_memory_reserved;
    allocated, torch.cuda.max_memory_allocated; ddplan.memory.predicted_peak_bytes), is within +-tolerance of it.
    """
    if measured_gb <= 0:
        raise UsageError(f"must be positive, got {measured_gb}", field="--measured-peak")
    if what not in PEAK_KINDS:
        raise UsageError(f"{what!r} is not a kind of peak; allowed: {', '.join(PEAK_KINDS)}",
                         field="--measured-peak-kind")
    out = []
    pricer = memory_pricer(spec, hw, setup)
    for impl in hw.default_attention_impls():
        for rc in ("none", "selective", "full"):
            for compiled in (True, False):
                layout = replace(setup.layout, attention=impl.name, recompute=rc, compiled=compiled)
                terms = breakdown(spec, hw, replace(setup, layout=layout), pricer).terms
                t = predicted_peak_bytes(terms, what) / GB
                err = (t - measured_gb) / measured_gb
                out.append({"attention": impl.name, "recompute": rc, "compiled": compiled, "predicted_gb": t,
                            "error_pct": 100 * err, "consistent": abs(err) <= tolerance})
    return sorted(out, key=lambda r: abs(r["error_pct"]))


def memory_setup(spec: ModelSpec, hw: HardwareSpec, *, gpus: int, tp: int = 1, pp: int = 1, vp: int = 1, cp: int = 1,
                 ep: int = 1,
                 micro_batch: int | None = None, attention: str | None = None, recompute: str = "none",
                 compiled: bool | None = None, window_pattern: str | None = None,
                 headroom: float = HEADROOM, options: Options = Options(),
                 assumptions: MemoryAssumptions = MemoryAssumptions(), fp8: bool = False,
                 fp8_recipe: str | None = None, schedule: str | None = None) -> Setup:
    """The setup `ddplan memory` asks about: gpus in total (ddplan.layout.layout_for), the recipe's batch split
    by the one rule (ddplan.layout.split_batch), as `table` splits it."""
    attention = attention or hw.default_attention
    asked = micro_batch or spec.recipe.device_batch_size
    try:
        split = split_batch(spec.recipe.total_batch_tokens // spec.recipe.seq_len, data_parallel(gpus, tp, pp, cp),
                            asked)
        layout = layout_for(spec, gpus=gpus, tp=tp, pp=pp, vp=vp, cp=cp, ep=ep, micro_batch=split.micro_batch,
                            grad_accum=split.accum, attention=attention, recompute=recompute, compiled=compiled,
                            options=options, schedule=schedule)
        check_layout(layout, spec, world_size_rule=False)
        problem = cp_attention_problem(layout, *attention_mode(hw, attention), spec, window_pattern)
        if problem:
            raise LayoutError(f"{attention}: {problem}", field="--cp/--attention")
    except LayoutError as e:  # the layout comes from the flags: a usage error (exit 2), as in `table`
        raise UsageError(e.message, field=e.field or "--gpus/--tp/--pp/--vp/--cp/--ep") from None
    return Setup(layout=layout, window_pattern=window_pattern, headroom=headroom,
                 asked_micro_batch=asked if split.micro_batch != asked else None, options=options,
                 assumptions=assumptions, fp8=fp8, fp8_recipe=fp8_recipe)
