"""`ddplan plan`: enumerate parallel layouts, keep those that fit and divide, rank them, and say why.

A layout is (hardware, GPUs, dp, tp, pp, ZeRO stage, micro-batch, accumulation, attention, recompute,
pipeline schedule). Each is priced by ddplan.price, the same pricer as `ddplan table`, whose cache
keeps what layouts share (anatomies, op times, memory). Rows are flat dicts (PricedLayout.row plus
the family); ranking and the Pareto front sort them in Python. Reasons are facts; ddplan.render words them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from ddplan import run
from ddplan.calibration import CalibrationSpec, measurement_for
from ddplan.errors import ImpossibleMeasurement, LayoutError, UsageError
from ddplan.fitting import fitted
from ddplan.frameworks import DEFAULT_RECOMPUTES, can_run
from ddplan.layout import (NATIVE_ZERO, Layout, Options, check_layout, context_parallel_degrees,
                           cp_attention_problem, expert_parallel_degrees, schedule_for)
from ddplan.memory import HEADROOM
from ddplan.pipeline import v_chunks
from ddplan.gcpause import no_cycle_collection
from ddplan.offload import check_activation_offload, check_offload
from ddplan.price import TIE, PricedLayout, Pricer, RunPlan, best_per_pair
from ddplan.runfields import RECOMPUTE, recompute_layers
from ddplan.sizing import fewest_layers
from ddplan.specs import Budget, HardwareSpec, ModelSpec, Price
from ddplan.table import check_attentions, check_fp8, check_fp8_options
from ddplan.units import GiB

MAX_SEARCHES = 64  # (hardware, GPU count) pairs one search covers, checked before any work
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
    band_every_row: bool = False  # price every kept row's band (csv lists them all), not only the rows shown
    # the stack re-runs some layers whole (its profile lists the block method: Megatron-Core's, NeMo's): where full
    # recompute is the least that fits, the fewest layers a chunk that fit (full:N) are priced too
    block_recompute: bool = False
    calibration: CalibrationSpec | None = None  # applies to the hardware it names
    calibration_path: str | None = None
    price: Price | None = None
    overheads: run.RunOverheads = run.RunOverheads()
    budget: Budget | None = None  # the training budget (steps, tokens or tokens per parameter); None: the recipe's
    total_batch_tokens: int | None = None
    tp_across_nodes: bool = False
    attentions: tuple[str, ...] = ()  # () = every implementation on each hardware
    # the attentions are a framework profile's choices in order (its stack's kernel, then what it runs where that
    # kernel is missing): each hardware takes the first its spec has, or searches its own implementations
    # (ddplan.inputs.profile_attention)
    attentions_where_available: bool = False
    recomputes: tuple[str, ...] = DEFAULT_RECOMPUTES
    # the pipeline schedules searched at pp > 1 (a run file's spelling, ddplan.runfields.SCHEDULES): 1F1B and
    # interleaved (2 chunks a stage) unless a stack's profile lists its own (FrameworkProfile.schedules_offered)
    schedules: tuple[str, ...] = ("1f1b", "interleaved")
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    headroom: float = HEADROOM  # keep this fraction of usable memory free (fragmentation, spikes, other processes)
    options: Options = Options()  # applied to every layout they can apply to (Options.for_layout)
    cps: tuple[int, ...] = ()  # context-parallel degrees to search; () = context_parallel_degrees(seq_len)
    eps: tuple[int, ...] = ()  # expert-parallel degrees to search; () = expert_parallel_degrees
    fp8: bool = False  # eligible GEMMs in fp8 (ddplan.fp8.fp8_eligible)
    fp8_recipe: str | None = None  # how their casts run; None: the model's
    framework: str | None = None  # the training stack's profile name: its published runs weigh in the band
    # what the stack cannot run (its profile's `lacks`, ddplan.frameworks.LACKS): not searched
    lacks: frozenset[str] = frozenset()

    @property
    def stages_run(self) -> tuple[int, ...]:
        """The ZeRO stages searched over more than one data-parallel rank: those asked that the stack runs."""
        return tuple(z for z in self.zero_stages if can_run(self.lacks, zero=z))


@dataclass
class PlanResult:
    rows: list[dict]  # every kept layout, ranked (PricedLayout.row + family, native; "_priced" the object)
    pareto: list[dict]
    request: PlanRequest | None = None
    considered: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    why_not: dict[str, str] = field(default_factory=dict)  # an example per rejection reason
    missed: list[tuple[str, float]] = field(default_factory=list)  # ("deadline", h) / ("budget", USD) not met
    memory_forces: dict[str, list[tuple[str, float]]] = field(default_factory=dict)
    ranked_by: str = "wall_clock_h"  # the column the rows are ranked by (and TIE applies to)


def family(layout: Layout, native_zero: int) -> str:
    """Which family a layout belongs to: pipeline first, then context parallel, expert parallel, tensor
    parallel, sharding."""
    if layout.pp > 1:
        return "+PP"
    if layout.cp > 1:
        return "+CP"
    if layout.ep > 1:
        return "+EP"
    if layout.tp > 1:
        return "+TP"
    if layout.zero > native_zero:  # sharding beyond what the model's own setup does
        return "+ZeRO/FSDP"
    return "pure DP"


def _powers_of_two_up_to(n: int) -> list[int]:
    return [2**i for i in range(int(math.log2(n)) + 1)] if n >= 1 else []


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@functools.lru_cache(maxsize=64)
def _checked_policies(recomputes: tuple[str, ...]) -> tuple[str, ...]:
    """The recompute policies as given, each checked once as Layout checks it (LayoutError if misspelt)."""
    for policy in recomputes:
        Layout(recompute=policy)
    return recomputes


class LayoutGroup(Sequence):
    """Candidate layouts that differ only in micro-batch (ascending) and, within one micro-batch, in recompute
    (the request's order): group[i] is the list at the i-th micro-batch, built when first read (a search
    rejects most groups from their first layout, ddplan.price.Pricer.cannot_fit; building every layout of
    them was a fifth of its time). len(group): micro-batches; group.size: layouts."""

    def __init__(self, first: Layout, micro_batches: list[int], per_dp: int, recomputes: tuple[str, ...]):
        """first: the group's checked layout at micro_batches[0] (accumulation per_dp / it) and recomputes[0]; the
        others are derived from it (Layout.at_batch), at recompute policies checked once (_checked_policies)."""
        assert (first.micro_batch, first.grad_accum, first.recompute) == (
            micro_batches[0], per_dp // micro_batches[0], recomputes[0]), first
        self._mbs, self._per_dp, self._recomputes = micro_batches, per_dp, _checked_policies(recomputes)
        self._first = first
        self._built: dict[int, list[Layout]] = {}
        self.size = len(micro_batches) * len(recomputes)

    def __len__(self) -> int:
        return len(self._mbs)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return self._at(range(len(self._mbs))[i])  # group[-1] is group[len - 1]; IndexError past the end

    def __iter__(self):
        return map(self._at, range(len(self._mbs)))

    def _at(self, i: int) -> list[Layout]:
        """The layouts at the i-th micro-batch (0 <= i < len), built once."""
        built = self._built.get(i)
        if built is None:
            mb = self._mbs[i]
            built = self._built[i] = [self._first.at_batch(mb, self._per_dp // mb, rc) if i or j else self._first
                                      for j, rc in enumerate(self._recomputes)]
        return built


def layouts_for(spec: ModelSpec, hw: HardwareSpec, gpus: int, total_batch: int, req: PlanRequest):
    """Candidate layouts on `gpus` GPUs of one kind, grouped (LayoutGroup): each group's layouts differ
    only in micro-batch (ascending) and, within one micro-batch, in recompute (none, selective, full).

    The grouping lets the search stop early: memory grows with the micro-batch, so once one does not
    fit the larger ones are skipped; and where no recompute fits, selective and full (same layout,
    strictly more compute) are dominated and skipped.
    """
    a, seq = spec.architecture, spec.recipe.seq_len
    sequences = total_batch // seq
    tp_cap = gpus if req.tp_across_nodes else min(gpus, hw.gpus_per_node)
    named, here = req.attentions, {x.name for x in hw.attention}
    if req.attentions_where_available:  # the profile's choices in order: the first this hardware has, else its own
        named = next(((a,) for a in named if a in here), ())
    else:  # the user's list: the ones this hardware has (_search checked each has one)
        named = tuple(a for a in named if a in here)
    impls = named or tuple(x.name for x in hw.default_attention_impls())
    native = NATIVE_ZERO[spec.recipe.distribution]
    cps = req.cps or context_parallel_degrees(seq)
    # context parallelism runs on fused attention kernels only: the implementations each cp degree runs on
    runs_on = {cp: [name for name in impls if not cp_attention_problem(
        Layout(cp=cp), hw.attention_impl(name).kind, hw.attention_impl(name).windows, spec)] for cp in cps}
    lacks, tied = req.lacks, a.tied_embeddings
    stages = req.stages_run
    for tp, cp in [(t, c) for t in _divisors(gpus) for c in cps if t <= tp_cap and a.num_heads % t == 0
                   and a.num_kv_heads % t == 0 and (gpus // t) % c == 0
                   and can_run(lacks, tp=t, cp=c)]:
        for pp in [p for p in _divisors(gpus // (tp * cp))
                   if a.num_layers % p == 0 and can_run(lacks, pp=p, tied=tied)]:
            dp = gpus // (tp * pp * cp)
            if sequences % dp:
                continue
            per_dp = sequences // dp
            schedules = searched_schedules(req.schedules, pp, a.num_layers)
            mbs = [m for m in _powers_of_two_up_to(min(per_dp, 64)) if per_dp % m == 0]
            for zero in (stages if dp * cp > 1 else (native,)):  # one rank: nothing to shard
                options = req.options.searched(tp, dp * cp, zero, cp, pp)
                pool = dp * cp * (tp if options["etp"] == 1 else 1)  # Layout.expert_pool
                # a hybrid shard group holds whole expert-parallel groups
                eps = [ep for ep in expert_parallel_degrees(spec, pool, req.eps) if options["shard_group"] % ep == 0
                       and can_run(lacks, tp=tp, ep=ep)]
                # each (schedule, ep)'s first layout is built with Layout's checks once, and copied to each
                # attention implementation (Layout.with_attention: no check reads it)
                checked = {(sched, ep): Layout(dp=dp, tp=tp, pp=pp, cp=cp, zero=zero, micro_batch=mbs[0],
                                               grad_accum=per_dp // mbs[0], attention=runs_on[cp][0],
                                               recompute=req.recomputes[0], compiled=spec.recipe.compiled,
                                               pp_schedule=sched, pp_virtual_stages=v, ep=ep, **options)
                           for sched, v in schedules for ep in eps} if runs_on[cp] else {}
                for attention in runs_on[cp]:
                    for sched, v in schedules:
                        for ep in eps:
                            first = checked[sched, ep]
                            yield LayoutGroup(first if first.attention == attention else first.with_attention(attention),
                                              mbs, per_dp, req.recomputes)


def searched_schedules(offered: tuple[str, ...], pp: int, num_layers: int) -> list[tuple[str, int]]:
    """(Layout.pp_schedule, chunks a stage) of each schedule searched at pp stages: 1F1B always (one stage has no
    schedule: only it), and where pp > 1 each other one offered, the two-chunk ones (interleaved, ZB-V) where 2 pp
    divides the layers, ZB-V where its chunks split them (pipeline.v_chunks, as check_layout has it).
    e.g. (("1f1b", "interleaved", "zb-v"), 4, 32): 1f1b, interleaved x2, zb_v x2."""
    out = [("1f1b", 1)]
    if pp == 1:
        return out
    for name in offered:
        schedule, chunks = schedule_for(name, 1)
        if schedule != "1f1b" and (_v_splits(num_layers, pp) if schedule == "zb_v" else
                                   chunks == 1 or num_layers % (chunks * pp) == 0):
            out.append((schedule, chunks))
    return out


def _v_splits(num_layers: int, pp: int) -> bool:
    """Whether ZB-V's chunks split num_layers over pp stages (pipeline.v_chunks, as check_layout asks)."""
    try:
        v_chunks(num_layers, pp)
    except ValueError:
        return False
    return True


def pricer_for(req: PlanRequest, hw: HardwareSpec) -> Pricer:
    """The pricer of one hardware in a search: the request's budget (else the model's), price and overheads, and
    the calibration when it is for this hardware, with its measured step fitted as `table` fits it."""
    plan = RunPlan(req.budget or req.model.recipe.budget, req.price or hw.price, req.overheads, req.headroom,
                   req.framework)
    cal = req.calibration if req.calibration and req.calibration.hardware in (hw.name, *hw.aliases) else None
    pricer = Pricer(req.model, hw, plan, cal, req.fp8, fp8_recipe=req.fp8_recipe)
    m = measurement_for(cal, req.model)
    if m is None:
        return pricer
    try:
        return fitted(pricer, m, "auto", f"{req.calibration_path or 'calibration'}: step_times", req.options)[0]
    except ImpossibleMeasurement:
        raise
    except UsageError:  # as `table` does: a step no factor explains leaves the micro-benchmarks alone
        return pricer


def plan_row(p: PricedLayout, native_zero: int, usable_gib: float) -> dict:
    """A priced layout as a plan row: its data plus the family and whether it is the native setup."""
    lay = p.layout
    row = p.row()  # a new dict: the plan's columns go after its own
    row.update(family=family(lay, native_zero),
               native=lay.zero == native_zero, usable_gib=usable_gib, _priced=p)
    return row


def search(req: PlanRequest, progress: Callable[[str, int, int], None] | None = None) -> PlanResult:
    """Every layout of every hardware and GPU count that fits and divides, ranked by the objective.

    progress(what, done, total) is called before each (hardware, GPU count) pair is searched.
    """
    pairs = len(req.hardware) * len(req.gpus)
    if pairs > MAX_SEARCHES:
        raise UsageError(f"{pairs} (hardware, GPU count) pairs asked ({len(req.hardware)} hardware x "
                         f"{len(req.gpus)} GPU counts); one search covers at most {MAX_SEARCHES}: name fewer hardware "
                         f"or GPU counts (e.g. --gpus 8-64)", field="--hardware/--gpus")
    with no_cycle_collection():
        return _search(req, progress or (lambda what, done, total: None))


def _search(req: PlanRequest, progress: Callable[[str, int, int], None], shortcuts: bool = True) -> PlanResult:
    """search's work. shortcuts=False prices every candidate without the exact bounds that skip work (tests
    compare the two: same rows, considered and rejected)."""
    if req.objective not in OBJECTIVES:
        raise UsageError(f"must be one of {', '.join(OBJECTIVES)}, got {req.objective!r}", field="--objective")
    spec = req.model
    total_batch = req.total_batch_tokens or spec.recipe.total_batch_tokens
    seq = spec.recipe.seq_len
    if total_batch < seq or total_batch % seq:
        raise UsageError(f"{total_batch:,} tokens is not a positive multiple of the sequence length {seq:,}",
                         field="--total-batch-size")

    if not req.attentions_where_available:
        # a list given for several GPUs: each takes the ones it has (fa3 on H100, flash-attn-ck on MI300X); a name
        # no GPU has, or a GPU with none of the names, is an error
        known = {a.name for hw in req.hardware for a in hw.attention}
        unknown = [a for a in req.attentions if a not in known]
        if unknown and len(req.hardware) > 1:
            raise UsageError(f"{unknown[0]!r} is not available on any of {', '.join(h.name for h in req.hardware)}; "
                             f"allowed: {', '.join(sorted(known))}", field="--attention")
        for hw in req.hardware:
            if len(req.hardware) == 1 or not set(req.attentions) & {a.name for a in hw.attention}:
                check_attentions(req.attentions, hw)
    if req.fp8:
        for hw in req.hardware:
            check_fp8(spec, hw, req.fp8_recipe)
    check_fp8_options(spec, req.fp8, req.fp8_recipe, req.options.fp8_all_gather, req.zero_stages, req.options.fp8_params)
    if req.options.offload_optimizer:
        for hw in req.hardware:
            check_offload(spec, hw, None)
    for hw in req.hardware:
        check_activation_offload(hw, req.options.offload_activations)
    window = spec.architecture.window_pattern
    native = NATIVE_ZERO[spec.recipe.distribution]
    rows, rejected, considered = [], {"memory": 0, "divisibility": 0, "dominated": 0}, 0
    why_not: dict[str, str] = {}
    pricers = {}
    done = 0
    for hw in req.hardware:
        pricer = pricers[hw.name] = pricer_for(req, hw)
        usable = hw.memory.usable_gib.value
        for gpus in req.gpus:
            progress(f"{gpus}x {hw.name}", done, len(req.hardware) * len(req.gpus))
            done += 1
            for group in layouts_for(spec, hw, gpus, total_batch, req):
                n, first = group.size, group[0][0]
                considered += n
                try:
                    check_layout(first, spec)
                except LayoutError as e:
                    rejected["divisibility"] += n
                    why_not.setdefault("divisibility", e.message)
                    continue
                if shortcuts and pricer.cannot_fit(first):  # model states alone: no micro-batch fits
                    rejected["memory"] += n
                    continue
                for i, by_rc in enumerate(group):  # micro-batch ascending
                    # the least recompute that fits; more recompute at the same micro-batch only adds compute, so
                    # it is dominated by that one whether or not it fits itself (its memory is not looked at)
                    least = pricer.least_fitting(by_rc, window)
                    if least is None:  # larger micro-batches need more memory still
                        rejected["memory"] += (len(group) - i) * len(by_rc)
                        break
                    rejected["memory"] += least
                    rows.append(plan_row(pricer.price(by_rc[least], window, bands=False), native, usable))
                    if req.block_recompute and by_rc[least].recompute == "full":
                        fewest = fewest_layers(pricer, by_rc[least], window, False, spec.architecture.num_layers)
                        if fewest is not None:  # fewer layers re-run than full: its own row, one more considered
                            considered += 1
                            rows.append(plan_row(pricer.price(fewest, window, bands=False), native, usable))
                    priced = [by_rc[least].recompute]
                    for later in by_rc[least + 1:]:  # a policy no priced one is known to re-run less than: its own row
                        if any(reruns_at_least(later.recompute, p) for p in priced):
                            rejected["dominated"] += 1
                        elif pricer.memory(later, window).fits:
                            rows.append(plan_row(pricer.price(later, window, bands=False), native, usable))
                            priced.append(later.recompute)
                        else:
                            rejected["memory"] += 1
    result = PlanResult(rows=[], pareto=[], request=req, considered=considered, rejected=rejected, why_not=why_not)
    if not rows:
        return result
    key = "wall_clock_h" if req.objective == "time" else "cost_usd"
    pool = rows
    # a deadline: the cheapest that finishes in time; a budget: the fastest within it (else rank by the limit)
    for column, limit, what, then in (("wall_clock_h", req.deadline_h, "deadline", "cost_usd"),
                                      ("cost_usd", req.budget_usd, "budget", "wall_clock_h")):
        if limit is None:
            continue
        ok = [r for r in pool if r[column] <= limit]
        if not ok:
            result.missed.append((what, limit))
            key = column
        else:
            pool, key = ok, then
    ordered = _rank(pool, key)
    result.ranked_by = key
    front = pareto_front(ordered)
    # bands for what is shown: the top rows, the Pareto front and each family's best (what the plot draws)
    shown = {id(r) for r in ordered[:req.top]} | {id(r) for r in front} | {id(r) for r in best_per_family(ordered)}
    shown |= {id(r) for r in best_per_pair(ordered)}  # the runner-up on other hardware or GPU count (reasons)
    for r in ordered:
        if req.band_every_row or id(r) in shown:
            banded = pricers[r["hardware"]].price(r["_priced"].layout, window)
            r.update({k: v for k, v in banded.row().items() if k.endswith(("_low_s", "_high_s", "_low_h", "_high_h",
                                                                           "_low_usd", "_high_usd"))})
            r["_priced"] = banded
    result.rows = ordered
    on_front = {id(r) for r in front}
    result.pareto = [r for r in ordered if id(r) in on_front]
    result.memory_forces = memory_forces(ordered[0], pricers[ordered[0]["hardware"]], req)
    return result


def memory_forces(top: dict, pricer: Pricer, req: PlanRequest) -> dict[str, list[tuple[str, float]]]:
    """What memory forces on the choice: GiB per GPU of its layout with less recompute, and with less
    sharding (only where every lighter option is over the limit). Keys: "recompute", "zero"."""

    layout, window = top["_priced"].layout, top["window"]
    out: dict[str, list[tuple[str, float]]] = {}
    if layout.recompute != "none":
        # none and the policies searched (a stack's own, ddplan.frameworks.searched_recomputes) it re-runs more than
        mems = [(rc, pricer.memory(replace(layout, recompute=rc), window))
                for rc in dict.fromkeys(("none", *req.recomputes))
                if rc != layout.recompute and reruns_at_least(layout.recompute, rc)]
        if mems and not any(m.fits for _, m in mems):
            out["recompute"] = [(rc, m.total / GiB) for rc, m in mems]
    if layout.zero > 0 and layout.grad_ranks > 1:
        less = [z for z in req.stages_run if z < layout.zero]
        mems = [(f"ZeRO-{z}", pricer.memory(req.options.at_zero(layout, z), window)) for z in less]
        if mems and not any(m.fits for _, m in mems):
            out["zero"] = [(name, m.total / GiB) for name, m in mems]
    return out




def reruns_at_least(more: str, less: str) -> bool:
    """Whether recompute policy `more` re-runs at least what `less` does at the same layout and micro-batch, so it is
    never the faster of the two: the search's dominance. The named policies in RECOMPUTE's order (none, selective,
    per-op, full); full above every policy; every policy above none; full:N above full:M for N >= M, every:K above
    every:J for K <= J (ddplan.runfields.recompute_layers). Other pairs (a per-module policy against another, a layer
    policy against selective or per-op, full:N against every:K) are not ordered: the search prices each that fits.
    e.g. (full:4, full:2) True; (full:2, selective) False; (selective, full:2) False."""
    if more == less or less == "none" or more == "full":
        return True
    if more in RECOMPUTE and less in RECOMPUTE:
        return RECOMPUTE.index(more) >= RECOMPUTE.index(less)
    a, b = recompute_layers(more), recompute_layers(less)
    if a is None or b is None or a[0] != b[0]:
        return False
    return a[1] >= b[1] if a[0] == "first" else a[1] <= b[1]


def _simplicity(row: dict) -> int:
    """How far a row is from the simplest setup, for ties: not the native setup 4, pipeline 2, tensor parallelism 1,
    recompute 1 (lower is simpler)."""
    return (not row["native"]) * 4 + (row["tp"] > 1) + (row["pp"] > 1) * 2 + (row["recompute"] != "none")


def _rank(rows: list[dict], key: str) -> list[dict]:
    """Sort by key, but among the layouts within TIE of the best put the simplest first (then by key, fewer GPUs,
    hardware name); sorts are stable: equal rows keep the search's order."""
    cut = min(r[key] for r in rows) * (1 + TIE)
    near = sorted((r for r in rows if r[key] <= cut), key=lambda r: (_simplicity(r), r[key], r["gpus"], r["hardware"]))
    rest = sorted((r for r in rows if r[key] > cut), key=lambda r: (r[key], _simplicity(r), r["gpus"], r["hardware"]))
    return near + rest


def pareto_front(rows: list[dict]) -> list[dict]:
    """Layouts no other layout beats on both wall-clock and cost (ties: the first by time)."""
    front, best_cost = [], math.inf
    for r in sorted(rows, key=lambda r: (r["wall_clock_h"], r["cost_usd"])):
        if r["cost_usd"] < best_cost - 1e-9:
            front.append(r)
            best_cost = r["cost_usd"]
    return front


def best_per_family(rows: list[dict]) -> list[dict]:
    """The fastest layout of each family at each GPU count and hardware (what the plan plot draws)."""
    best: dict = {}
    for r in rows:
        key = (r["family"], r["gpus"], r["hardware"])
        if key not in best or r["wall_clock_h"] < best[key]["wall_clock_h"]:
            best[key] = r
    return list(best.values())
