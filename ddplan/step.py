"""One training step of a layout: compute + exposed communication + pipeline bubble + optimizer.

    step = accum x (forward + backward [+ TP all-reduces]) + exposed data-parallel communication
           + pipeline bubble + optimizer (the part not hidden under communication)

Each term is reported. Communication follows DESIGN.md sec. 4: DDP buckets overlap backward except
the last; nanochat's optimizer reduce-scatters and all-gathers once per step after the last
micro-batch, overlapping only optimizer math; ZeRO-2 reduce-scatters every micro-batch; FSDP
all-gathers parameters in every micro-batch's forward and backward.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from ddplan import comm, pipeline
from ddplan.anatomy import Anatomy, adamw_bytes, muon_matrices, unsharded_grad_sum_bytes
from ddplan.layout import NATIVE_ZERO, Layout, Placement, placement
from ddplan.memory import (EMBEDDING_GROUPS, EXPERT_GROUP, HEAD_GROUPS, _stage_share, counts_of, expert_shard,
                           heaviest_stage, offloaded_bytes, state_share)
from ddplan.offload import activation_offload_exposed_s, offload_time_s
from ddplan.comm import CommPoints, GroupTimer
from ddplan.fp8 import fp8_weight_fractions
from ddplan.roofline import MicroBatchTime, OpTimes, Rates, gemm_call_s, gemm_fraction, micro_batch_time, op_times
from ddplan.specs import HardwareSpec, ModelSpec
from ddplan.units import dtype_bytes

DDP_BUCKET_BYTES = comm.DDP_DEFAULT_BUCKET_BYTES  # torch DDP bucket_cap_mb=25, in MiB
ZERO_POLICY = {0: "ddp", 1: "zero1", 2: "zero2", 3: "fsdp"}


@dataclass(frozen=True)
class StepTime:
    """Seconds of one optimizer step on one GPU, by term (all GPUs run in lockstep)."""

    fwd_s: float  # one micro-batch's forward
    bwd_s: float  # one micro-batch's backward (recompute included)
    accum: int
    compute_s: float  # accum x (fwd + bwd)
    # each communication term on the critical path: its exposed time plus what its hidden part costs the compute it
    # runs under (ddplan.comm.overlap_cost_s)
    tp_comm_s: float  # tensor-parallel all-reduces, on the critical path
    dp_comm_total_s: float  # data-parallel communication, all of it
    dp_comm_exposed_s: float  # the part not hidden under compute or optimizer math, and the hidden part's cost
    bubble_s: float
    optimizer_s: float
    by_kind_s: dict[str, float]  # compute_s by op kind (ddplan.roofline), and "fsdp2 copies" (fsdp2_copies_s)
    policy: str  # the data-parallel policy modelled (ddp, sharded_optimizer, zero1, zero2, fsdp)
    cp_comm_s: float = 0.0  # context-parallel KV exchange not hidden under attention
    offload_s: float = 0.0  # activation offload's copies to and from the host beyond the passes they run under
    ep_comm_s: float = 0.0  # mixture-of-experts token exchange (all-to-alls over ep, gathers over tp), not hidden
    # ZeRO-3: one micro-batch's parameter all-gathers (forward, and backward when resharded) and gradient
    # reduce-scatter; under a pipeline (pp > 1) a step's, which gathers and reduces once (comm.fsdp_pipelined_comm_s)
    mb_gather_s: float = 0.0
    mb_scatter_s: float = 0.0
    # a step's torch FSDP2 copies into and out of its collectives' buffers, on the compute stream (Layout.fsdp2);
    # part of compute_s, which runs them between the micro-batches' kernels
    fsdp2_copies_s: float = 0.0

    @property
    def total_s(self) -> float:
        return (self.compute_s + self.tp_comm_s + self.cp_comm_s + self.ep_comm_s + self.dp_comm_exposed_s
                + self.bubble_s + self.optimizer_s + self.offload_s)


def dp_policy(spec: ModelSpec, layout: Layout) -> str:
    """The communication policy of a layout: the model's native one at its native ZeRO stage."""
    native = spec.recipe.distribution
    return native if layout.zero == NATIVE_ZERO[native] else ZERO_POLICY[layout.zero]


def grad_sync_buffers(spec: ModelSpec, layout: Layout, experts: bool = False) -> list[tuple[str, float]]:
    """(collective, bytes) of one gradient synchronisation, per GPU's share of the model (group_sync_buffers without
    the groups)."""
    return [(c, size) for _, c, size in group_sync_buffers(spec, layout, experts)]


def group_sync_buffers(spec: ModelSpec, layout: Layout, experts: bool = False) -> list[tuple[str, str, float]]:
    """(parameter group, collective, bytes) of one gradient synchronisation, per GPU's share of the model.

    nanochat (sharded_optimizer): per Muon shape group, a reduce-scatter of the K stacked gradients
    zero-padded to ceil(K/N) N matrices; AdamW params of >= 1024 elements reduce-scatter, smaller ones
    all-reduce (optim.py @92d63d4 l.214-246). Then the same sizes all-gathered (the updated params).
    Generic ZeRO: one reduce-scatter of all gradients (+ all-gather of params, in the compute dtype; with
    layout.fp8_all_gather the weights of fp8 GEMMs at 1 byte an element, ddplan.fp8.fp8_weight_fractions:
    torchao's enable_fsdp_float8_all_gather casts each shard before the gather; with layout.fp8_params, ZeRO-1/2,
    too: Megatron-Core gathers the fp8 weights it keeps); DDP: all-reduce.
    experts: the routed experts' buffers alone (1 / ep of them a rank, reduced over the expert-data-parallel
    ranks, Layout.expert_ranks); else every other group's.
    """
    counts, dt, opt = counts_of(spec.architecture), spec.dtypes, spec.recipe.optimizer
    policy, n = dp_policy(spec, layout), (layout.expert_ranks if experts else layout.grad_ranks)
    fp8 = fp8_weight_fractions(spec) if layout.fp8_all_gather or layout.fp8_params else {}
    out: list[tuple[str, str, float]] = []
    stage = heaviest_stage(spec, layout)
    for group, algo in opt.algorithm.items():
        if not counts[group] or (group == EXPERT_GROUP) != experts:
            continue
        gb = dt.reduce_bytes(group)  # a gradient as the reductions carry it (grads "compute": the compute dtype's)
        kb = dt.grad_bytes(group)  # a gradient as it is kept: Muon's gathered shards
        pb = dtype_bytes(dt.params[group])  # a parameter as it is kept: the sharded optimizer's gathered updates
        share = _stage_share(group, layout, spec.architecture.num_layers, spec.architecture, stage)
        if experts:  # 1 / ep of the experts, split over the experts' tp degree (not tp when they are whole)
            share *= layout.expert_rows_split / layout.ep
        if policy == "sharded_optimizer" and algo == "muon":
            stacks = Counter(muon_matrices(spec, group))
            padded = sum(r * c * math.ceil(k / n) * n for (r, c), k in stacks.items())
            out += [(group, "reduce_scatter", padded * gb * share), (group, "all_gather", padded * pb * share)]
        elif policy == "sharded_optimizer":
            if counts[group] >= 1024:
                out += [(group, "reduce_scatter", counts[group] * gb * share),
                        (group, "all_gather", counts[group] * pb * share)]
            else:
                out.append((group, "all_reduce", counts[group] * gb * share))
        elif policy == "ddp":
            out.append((group, "all_reduce", counts[group] * gb * share))
        else:  # ZeRO / FSDP gather the parameters in the compute dtype (mixed precision), not the masters
            cb = dtype_bytes(dt.compute)
            if fp8:  # fp8 GEMMs' weights at 1 byte (torchao enable_fsdp_float8_all_gather; Megatron's fp8 params)
                cb -= (cb - 1) * fp8[group]
            out += [(group, "reduce_scatter", counts[group] * gb * share), (group, "all_gather", counts[group] * cb * share)]
            if algo == "muon":  # Newton-Schulz needs whole matrices: gather the reduced gradient shards back
                out.append((group, "all_gather", counts[group] * kb * share))
    return out


def zero3_gathers(layout: Layout) -> int:
    """All-gathers of a ZeRO-3 rank's parameters in one step: every micro-batch's forward, and backward when resharded
    after forward (torch FSDP's default); under a pipeline (pp > 1: comm.fsdp_pipelined_comm_s) once a step when
    kept after forward, else each micro-batch's backward (the warm-up forwards' own gathers, at most pp, left out)."""
    if layout.pp > 1:
        return layout.grad_accum if layout.reshard_after_forward else 1
    return layout.grad_accum * (2 if layout.reshard_after_forward else 1)


def fsdp2_copy_bytes(spec: ModelSpec, layout: Layout) -> float:
    """Bytes one step's torch FSDP2 copies move on a rank's compute stream (Layout.fsdp2; 0 without it).

    fully_shard all-gathers each unit's shards into one flat buffer and copies it out into the parameters'
    unsharded tensors (foreach_all_gather_copy_out's split_with_sizes_copy, in FSDPParamGroup.wait_for_unshard on
    the current stream); with one shard rank it skips the collective, not the copies: it casts the shard to the
    compute dtype and copies it into the unsharded tensor (wait_for_unshard's world-size-1 path). Backward copies
    the unsharded gradients into the reduce-scatter buffer, cast to the reduce dtype (foreach_reduce_scatter_copy_in's
    chunk_cat, before reduce_scatter_stream.wait_stream), every micro-batch; under a pipeline (pp > 1) once a step,
    after each micro-batch's gradients were added up unsharded (post_backward with gradient sync off:
    to_accumulated_grad_if_needed casts the first to the reduce dtype, accumulate_unsharded_grad_if_needed adds each
    later one; in the compute dtype autograd adds them). torch 2.13 distributed/fsdp/_fully_shard/
    _fsdp_collectives.py, _fsdp_param_group.py, _fsdp_param.py. Per parameter element of the rank's share (tp, the
    busiest stage, 1 / ep of the routed experts: as grad_sync_buffers sizes the collectives), in a step:

        gathers x (2 g, or p + 3 c with one shard rank) + gradients
        gradients = accum x (c + r);  pp > 1: c + r with one micro-batch, else the sum of the micro-batches'
                    (anatomy.unsharded_grad_sum_bytes) + 2 r

    gathers: zero3_gathers; g: an element as gathered (c, the compute dtype's bytes; an fp8 GEMM's weight 1 with
    Layout.fp8_all_gather); p: the parameter's bytes; r: the reduce dtype's (Dtypes.reduce_bytes). The all-gather
    input's cast of the local shard runs on the copy-in stream, beside compute, and is left out; so is the reduced
    shard's copy on the reduce-scatter stream. Flat-parameter FSDP (FSDP1) gathers into the flat parameter the
    modules view and reduces the flat gradient in place: no copy.
    e.g. 8B parameters in bf16, one micro-batch, resharded, reduced in fp32: 8e9 x (2 x 2 x 2 + 2 + 4) = 112 GB, 33 ms
    at H100 SXM's 3.35 TB/s peak, 39 ms at its spec's HBM efficiency (0.866).
    """
    if not layout.fsdp2 or layout.zero != 3:
        return 0.0
    counts, dt = counts_of(spec.architecture), spec.dtypes
    fp8 = fp8_weight_fractions(spec) if layout.fp8_all_gather else {}
    c, accum, gathers = dtype_bytes(dt.compute), layout.grad_accum, zero3_gathers(layout)
    total, stage = 0.0, heaviest_stage(spec, layout)
    for group, n in counts.items():
        if not n:
            continue
        experts = group == EXPERT_GROUP
        share = _stage_share(group, layout, spec.architecture.num_layers, spec.architecture, stage)
        if experts:  # 1 / ep of the experts, split over the experts' tp degree
            share *= layout.expert_rows_split / layout.ep
        r = dt.reduce_bytes(group)
        if (expert_shard(layout) if experts else layout.shard_degree) > 1:
            gather = 2 * (c - (c - 1) * fp8.get(group, 0.0))
        else:
            gather = dtype_bytes(dt.params[group]) + 3 * c
        if layout.pp == 1 or accum == 1:
            grads = accum * (c + r)
        else:  # the micro-batches' gradients summed unsharded, then copied in once (read and written in r)
            grads = unsharded_grad_sum_bytes(c, r, accum) + 2 * r
        total += n * share * (gathers * gather + grads)
    return total


def fsdp2_copies_s(spec: ModelSpec, layout: Layout, r: Rates) -> float:
    """Seconds of one step's FSDP2 copies (fsdp2_copy_bytes) at the memory rate the roofline gives memory-bound
    kernels (HBM bandwidth x its efficiency), plus a launch a unit (torchtitan and OLMo-core wrap each block) for each
    copy-out (zero3_gathers) and each micro-batch's copy-in or accumulation (and under a pipeline the step's
    copy-in)."""
    moved = fsdp2_copy_bytes(spec, layout)
    if not moved:
        return 0.0
    units = math.ceil(spec.architecture.num_layers / layout.pp)
    copies = zero3_gathers(layout) + layout.grad_accum + (1 if layout.pp > 1 and layout.grad_accum > 1 else 0)
    return moved / (r.hbm_bytes_per_s * r.hbm) + units * copies * r.kernel_overhead_s


def optimizer_time_s(spec: ModelSpec, layout: Layout, r: Rates) -> float:
    """Optimizer step on the busiest rank: AdamW memory-bound, Muon's Newton-Schulz at GEMM efficiency.

    Sharding: nanochat gives each rank ceil(K/N) whole matrices per Muon shape group and 1/N of each
    AdamW tensor; ZeRO >= 1 splits everything by dp; DDP (ZeRO-0) updates everything on every rank.
    AdamW traffic: read p, g, m, v and write p, m, v (ddplan.anatomy.adamw_bytes).
    Muon: 5 Newton-Schulz iterations of three GEMMs, 4 m^2 n + 2 m^3 FLOPs each (newton_schulz_s), or the
    bytes it moves at the optimizer's rate, whichever is longer; calibrated, a shape's measured Muon step
    (ddplan.calibrate.bench.bench_muon_s) scaled by the matrices the rank owns.
    """
    counts, dt, opt = counts_of(spec.architecture), spec.dtypes, spec.recipe.optimizer
    policy = dp_policy(spec, layout)
    bw = r.optimizer_bytes_per_s or r.hbm_bytes_per_s * r.hbm  # measured AdamW rate when calibrated
    measured = {(rows, cols): (count, seconds) for rows, cols, count, seconds in r.muon_points}  # calibrated Muon
    total, stage = 0.0, heaviest_stage(spec, layout)
    for group, algo in opt.algorithm.items():
        if not counts[group]:
            continue
        share, n = state_share(spec, layout, group, stage)
        pb = dtype_bytes(dt.params[group])
        if algo == "adamw":
            split = n if policy != "ddp" and (policy != "sharded_optimizer" or counts[group] >= 1024) else 1
            moment, master = opt.adamw_bytes(dt.params[group], layout.distributed_optimizer)
            # the moments, and the master copy (fp32, or its low 16 bits) read and written as well
            moved = adamw_bytes(counts[group], pb, dt.grad_bytes(group), moment) + counts[group] * 2 * master
            total += moved * share / split / bw + r.kernel_overhead_s
            continue
        for (rows, cols), k in Counter(muon_matrices(spec, group)).items():
            owned = math.ceil(k / n) if policy == "sharded_optimizer" else (k / n if policy != "ddp" else k)
            if (rows, cols) in measured:  # calibrated: the measured step of this shape's stack, per matrix
                count, seconds = measured[(rows, cols)]
                total += seconds * owned * share / count
                continue
            compute = newton_schulz_s(rows, cols, opt.muon_ns_steps, r) * owned * share
            moved = owned * share * rows * cols * (6 * pb + 4 * opt.muon_ns_steps)
            total += max(compute, moved / bw) + 3 * opt.muon_ns_steps * gemm_call_s(r)
    return total


def muon_gemm_shapes(rows: int, cols: int) -> tuple[tuple[int, int, int], ...]:
    """The three GEMMs (m, n, k) of one Newton-Schulz iteration on the wide orientation (m = min, big = max):
    A = X X^T (m, m, big); A @ A (m, m, m); (b A + c A^2) @ X (m, big, m). Ref: Jordan et al., muon.py."""
    m, big = min(rows, cols), max(rows, cols)
    return (m, m, big), (m, m, m), (m, big, m)


def newton_schulz_s(rows: int, cols: int, ns_steps: int, r: Rates) -> float:
    """Seconds of Muon's Newton-Schulz on one rows x cols matrix: each of its three GEMMs at its own
    shape's efficiency (the nearest measured shape when calibrated, else the curve), ns_steps times.
    FLOPs add up to ddplan.anatomy.muon_flops: 2 m^2 big + 2 m^3 + 2 m^2 big per iteration."""
    return ns_steps * sum(2.0 * mm * nn * kk / (r.peak_flops_per_s * gemm_fraction(mm, nn, kk, r))
                          for mm, nn, kk in muon_gemm_shapes(rows, cols))


Cache = dict  # value-keyed results a caller keeps across layouts of one (model, hardware, calibration)


def step_time(spec: ModelSpec, hw: HardwareSpec, layout: Layout, anatomy: Anatomy, r: Rates,
              comm_efficiency: str = "value", comm_points: CommPoints | None = None,
              parts: OpTimes | None = None, optimizer_s: float | None = None, cache: Cache | None = None) -> StepTime:
    """Seconds of one optimizer step for a layout, by term. The anatomy is one tp rank's share.

    parts (op_times of this anatomy at these rates) and optimizer_s (optimizer_time_s at these rates)
    may be passed precomputed; with layout.offload_optimizer the step's optimizer_s is the offloaded step's
    critical path instead (ddplan.offload.offload_time_s: host copies and CPU Adam) and optimizer_s is unused;
    cache: a dict the caller keeps across layouts of the same model,
    hardware and calibration (ddplan.price.Pricer), keyed by values, for collective times and buffers.
    """
    if (anatomy.tp, anatomy.sequence_parallel, anatomy.cp, anatomy.ep, anatomy.expert_rows) != layout.rank_share:
        raise ValueError(f"the anatomy is for tp, sp, cp, ep, expert rows = {anatomy.tp}, {anatomy.sequence_parallel}, "
                         f"{anatomy.cp}, {anatomy.ep}, {anatomy.expert_rows}; "
                         f"the layout has {layout.rank_share}")
    cache = {} if cache is None else cache
    p, accum = layout.pp, layout.grad_accum
    parts = op_times(anatomy, r) if parts is None else parts

    a_layers = max(1, spec.architecture.num_layers)
    a, e = spec.architecture, dtype_bytes(spec.dtypes.compute)
    place = _placed(layout, hw, cache)  # where its tp, cp, ep and pipeline groups sit
    stage, stage_moe, mbt = _busiest_stage(spec, anatomy, r, parts, p, cache, v=layout.pp_schedule == "zb_v")
    copies = fsdp2_copies_s(spec, layout, r)
    compute = accum * mbt.total_s + copies

    tp_s = 0.0
    if layout.tp > 1:
        # Megatron: 2 all-reduces of b s h forward and 2 backward per layer; full recompute repeats the
        # forward pair (Korthikanti et al., arXiv 2205.05198, sec. 4.2.2); per-op recompute keeps reduce-scatter
        # outputs but re-runs all-gathers and all-reduces (anatomy.PER_OP_SOURCE's save list): with sequence
        # parallelism the forward's all-gather half again, without it the forward pair
        per_node = place.tp_per_node
        key = ("tp layer", layout.micro_batch, anatomy.seq_len, layout.tp, layout.sequence_parallel, per_node,
               comm_efficiency)
        if key not in cache:
            cache[key] = comm.tp_comm_time_per_layer_s(
                layout.micro_batch, anatomy.seq_len, a.d_model, e, layout.tp,
                _Cached(GroupTimer(hw, per_node, comm_efficiency, comm_points), cache), layout.sequence_parallel)
        fwd, bwd = cache[key]
        again = (fwd * anatomy.full_share if anatomy.whole_layers else  # full, full:N, every:K: the re-run layers'
                 {"per-op": fwd / 2 if layout.sequence_parallel else fwd}.get(anatomy.recompute, 0.0))
        per_layer = fwd + bwd + again
        # an MoE block without shared experts has no MLP-side pair: its dispatcher's gathers (ep_s) replace it
        swapped = stage_moe if a.moe is not None and not a.moe.shared_width else 0
        tp_s = accum * (stage - swapped / 2) * per_layer
        if layout.tp_overlap:  # hidden under this stage's layer GEMMs (recomputed ones included), which it slows
            gemm = parts.by_kind.get(("layers", "gemm"), 0.0) + parts.again_by_kind.get(
                ("layers", anatomy.recompute, "gemm"), 0.0)
            sent, tp_s = tp_s, comm.tp_overlap_exposed_s(tp_s, accum * gemm * stage / a_layers)
            tp_s += comm.overlap_cost_s(sent - tp_s, r.overlapped_compute, outlasting_s=tp_s)  # tp_s: beyond the GEMMs

    cp_s = 0.0
    if layout.cp > 1:
        # the same for every layout with these op times (one micro-batch and rank share) and this exchange
        key = ("cp layer", layout.cp_comm, place.cp_per_node, place.cp_crosses, comm_efficiency)
        if key not in parts.memo:
            parts.memo[key] = _cp_layer_s(spec, hw, layout, place, anatomy, parts, a_layers, comm_efficiency,
                                          comm_points, cache, r.overlapped_compute)
        fwd, bwd = parts.memo[key]
        # the layers whose attention re-runs: a share under a layer policy (full:N, every:K), else all or none
        attention_again = anatomy.full_share if anatomy.whole_layers else float(
            anatomy.recompute != "none" and (anatomy.modules is None or "core_attn" in anatomy.modules))
        cp_s = accum * stage * (fwd + bwd + fwd * attention_again)  # recompute re-sends

    ep_s = 0.0
    if a.moe is not None and (layout.ep > 1 or layout.expert_tp > 1):
        rows = comm.moe_rows_bytes(anatomy.tokens / layout.tp, a.moe.top_k, a.d_model, e, a.moe.rows_factor(layout.ep))
        fwd, bwd = comm.moe_layer_comm_s(
            rows, layout.ep, layout.expert_tp,
            _Cached(GroupTimer(hw, place.ep_per_node, comm_efficiency, comm_points), cache),
            _Cached(GroupTimer(hw, place.tp_per_node, comm_efficiency, comm_points), cache))
        # full recompute, and Megatron's moe module (its checkpoint re-runs the dispatch), send the tokens again
        moe_again = (anatomy.full_share if anatomy.whole_layers else
                     float(anatomy.modules is not None and "moe" in anatomy.modules))
        ep_s = accum * stage_moe * (fwd + bwd + fwd * moe_again)

    if p == 1:
        bubble = 0.0
    elif layout.pp_schedule in pipeline.ZERO_BUBBLE:  # W passes fill it: its terms are one micro-batch's on the stage
        bubble = pipeline.zero_bubble_time_s(layout.pp_schedule, p, accum, (compute + tp_s + cp_s + ep_s) / accum,
                                             mbt.wgrad_s)
    else:
        bubble = pipeline.bubble_time_s(compute + tp_s + cp_s + ep_s, p, accum, layout.pp_virtual_stages)
    if p > 1:  # activations to the next stage and gradients back, per micro-batch, not overlapped
        # neighbouring stages are tp x dp ranks apart (ddplan.layout.placement): once the job spans nodes
        # some boundary crosses them, and each GPU sends to its peer through its own NIC
        crosses = place.pp_crosses
        # the sends' seconds, by all they depend on besides the model (a search's layouts repeat them)
        p2p_key = ("p2p", comm_efficiency, crosses, layout.micro_batch, anatomy.seq_len, layout.tp, accum,
                   layout.pp_virtual_stages)
        p2p_s = cache.get(p2p_key)
        if p2p_s is None:
            tier_key = ("p2p tier", comm_efficiency, crosses)
            if tier_key not in cache:
                cache[tier_key] = comm.tier_for(hw, "all_gather", 2, efficiency=comm_efficiency,
                                                per_node=1 if crosses else 2)
            tier = cache[tier_key]
            sent = pipeline.p2p_bytes_per_microbatch(layout.micro_batch, anatomy.seq_len, a.d_model, e) / layout.tp
            p2p_s = cache[p2p_key] = pipeline.p2p_time_s(sent, tier.busbw_bytes_per_s, tier.latency_s, accum,
                                                         layout.pp_virtual_stages)
        bubble += p2p_s

    offload_s = 0.0
    if layout.offload_activations:  # the first N layers' saves go to the host and back (pp 1: the whole model)
        if hw.host is None:
            raise ValueError(f"{hw.name}'s spec has no host link (host.link_gbyte_per_s) to offload activations over")
        offload_s = accum * activation_offload_exposed_s(offloaded_bytes(anatomy, layout, a_layers),
                                                         hw.host.link_bytes_per_s, mbt.fwd_s, mbt.bwd_s)
    if layout.offload_optimizer:  # the step runs on the host (ddplan.offload); no optimizer math on the GPU
        opt_s = offload_time_s(spec, hw, layout, mbt.bwd_s)
    else:
        opt_s = optimizer_time_s(spec, layout, r) if optimizer_s is None else optimizer_s
    policy = dp_policy(spec, layout)
    total_comm, exposed, gather_s, scatter_s, beside, outlasting = dp_comm_s(
        spec, hw, layout, mbt.bwd_s, mbt.total_s, comm_efficiency, comm_points, cache, place)
    if policy == "sharded_optimizer":  # communication overlaps optimizer math only
        exposed = total_comm - min(opt_s, total_comm)
        beside, outlasting = min(opt_s, total_comm), exposed
    # what runs beside compute slows it (comm.overlap_cost_s), unless the compute still ends inside the collectives
    exposed += comm.overlap_cost_s(beside, r.overlapped_compute, outlasting_s=outlasting)
    return StepTime(fwd_s=mbt.fwd_s, bwd_s=mbt.bwd_s, accum=accum, compute_s=compute, tp_comm_s=tp_s,
                    dp_comm_total_s=total_comm, dp_comm_exposed_s=exposed, bubble_s=bubble, optimizer_s=opt_s,
                    by_kind_s={**{k: v * accum for k, v in mbt.by_kind_s.items()},
                               **({"fsdp2 copies": copies} if copies else {})}, policy=policy, cp_comm_s=cp_s,
                    ep_comm_s=ep_s, mb_gather_s=gather_s, mb_scatter_s=scatter_s, offload_s=offload_s,
                    fsdp2_copies_s=copies)


def _busiest_stage(spec: ModelSpec, anatomy: Anatomy, r: Rates, parts: OpTimes, p: int,
                   cache: Cache, v: bool = False) -> tuple[int, int, MicroBatchTime]:
    """(layers, MoE blocks, micro-batch time) of the pipeline stage that takes longest: the first (its layers +
    embeddings), a middle one (the one with most MoE blocks), or the last (+ head); the whole model at p = 1.
    v: ZB-V's placement (pipeline.v_stages), the first stage holding both end chunks with the embeddings and the head;
    its compute the slowest stage's, its tensor-, context- and expert-parallel exchanges over the most layers and MoE
    blocks any stage holds (a first stage of no layer and a heavy head is the slowest without exchanging anything:
    taken together, an upper bound).
    Kept in parts.memo by recompute policy, p and v (every layout with these op times and stages asks the same)."""
    key = ("busiest stage", anatomy.recompute, p, v)
    if key in parts.memo:
        return parts.memo[key]

    def mb_time(fraction: float, emb: bool, head: bool) -> MicroBatchTime:
        return micro_batch_time(anatomy, r, layer_fraction=fraction, include_embeddings=emb, include_head=head,
                                parts=parts)

    a = spec.architecture
    a_layers = max(1, a.num_layers)
    if p == 1:
        busiest = a_layers, a.moe_layers, mb_time(1.0, True, True)
    elif v:  # the slowest stage's compute; the layers and MoE blocks its exchanges run over, the most any stage has
        stages = pipeline.v_stages(a_layers, p, a_layers - a.moe_layers if a.moe is not None else None)
        kinds = sorted({(d == 0, n) for d, (n, _) in enumerate(stages)})  # the first's, and each other layer count
        slowest = max((mb_time(n / a_layers, first, first) for first, n in kinds), key=lambda t: t.total_s)
        busiest = max(n for n, _ in stages), max(k for _, k in stages), slowest
    else:
        if ("stages", p) not in cache:  # (layers, MoE blocks) per stage: the middle one with most MoE blocks
            cache[("stages", p)] = pipeline.stage_layers(a_layers, p), pipeline.moe_layers_by_stage(a, p)
        (first, middle, last), moe = cache[("stages", p)]
        busiest = max(((n, k, mb_time(n / a_layers, emb, head)) for n, k, emb, head in
                       ((first, moe[0], True, False), (middle, max(moe[1:-1], default=0), False, False),
                        (last, moe[-1], False, True))),
                      key=lambda c: c[2].total_s)
    parts.memo[key] = busiest
    return busiest


def _cp_layer_s(spec: ModelSpec, hw: HardwareSpec, layout: Layout, place: Placement, anatomy: Anatomy,
                parts: OpTimes, layers: int, efficiency: str, points: CommPoints | None,
                cache: Cache, kept: float = 1.0) -> tuple[float, float]:
    """(forward, backward) seconds of one layer's context-parallel exchange on the critical path: the ring's
    sends beyond the attention they overlap (comm.cp_ring_exposed_s) plus what the overlapped sends cost that
    attention (comm.overlap_cost_s at kept, Rates.overlapped_compute), or the all-gather variant's collectives
    (comm.cp_all_gather_s, not overlapped). The KV block: this tp rank's KV heads for its s / cp tokens."""
    a = spec.architecture
    block = comm.cp_kv_block_bytes(layout.micro_batch, anatomy.seq_len, max(1, a.num_kv_heads // layout.tp),
                                   a.head_dim, dtype_bytes(spec.dtypes.compute))
    if layout.cp_comm == "all_gather":
        return comm.cp_all_gather_s(block, layout.cp, _Cached(GroupTimer(hw, place.cp_per_node, efficiency, points),
                                                              cache))
    tier_key = ("p2p tier", efficiency, place.cp_crosses)  # the ring's sends: to the next rank, as a pipeline's
    if tier_key not in cache:
        cache[tier_key] = comm.tier_for(hw, "all_gather", 2, efficiency=efficiency,
                                        per_node=1 if place.cp_crosses else 2)
    tier = cache[tier_key]
    send = tier.latency_s + block / tier.busbw_bytes_per_s  # to the next rank of the ring, both directions at once
    attn_fwd = parts.fwd_by_kind.get(("layers", "attention"), 0.0) / layers
    attn_bwd = parts.by_kind.get(("layers", "attention"), 0.0) / layers - attn_fwd
    fwd, bwd = comm.cp_ring_exposed_s(send, layout.cp, attn_fwd, attn_bwd)
    sent_fwd, sent_bwd = comm.cp_ring_sent_s(send, layout.cp)
    # what outlasts the attention: the steps' excess (backward's last hop home runs after it, beside nothing)
    return (fwd + comm.overlap_cost_s(sent_fwd - fwd, kept, outlasting_s=fwd),
            bwd + comm.overlap_cost_s(sent_bwd - bwd, kept, outlasting_s=bwd - send))


@dataclass(frozen=True)
class _Cached:
    """A collective timer whose results are kept in the caller's value-keyed cache."""

    timer: GroupTimer
    cache: Cache

    def time_s(self, collective: str, size_bytes: float, n: int) -> float:
        t = self.timer
        key = ("collective", collective, size_bytes, n, t.per_node, t.efficiency)
        if key not in self.cache:
            self.cache[key] = t.time_s(collective, size_bytes, n)
        return self.cache[key]

    def all_to_all_s(self, size_bytes: float, n: int) -> float:
        t = self.timer
        key = ("collective", "all_to_all", size_bytes, n, t.per_node, t.efficiency)
        if key not in self.cache:
            self.cache[key] = t.all_to_all_s(size_bytes, n)
        return self.cache[key]


def dp_comm_s(spec: ModelSpec, hw: HardwareSpec, layout: Layout, bwd_s: float, mb_s: float,
              efficiency: str = "value", points: CommPoints | None = None, cache: Cache | None = None,
              place: Placement | None = None) -> tuple[float, float, float, float, float, float]:
    """(total, exposed, gather, scatter, beside, outlasting) seconds of data-parallel communication in one step, by
    the layout's policy; gather and scatter: one micro-batch's ZeRO-3 parameter all-gathers (every pass) and gradient
    reduce-scatter (with pp > 1 a step's: comm.fsdp_pipelined_comm_s; 0 for the other policies); beside: the
    collectives' time beside the compute they overlap (at most that compute), outlasting: the time they run on past
    it (comm.overlap_cost_s takes both).

    DDP: comm.ddp_exposed_s; ZeRO-1/2 and FSDP: comm.zero1_comm_s, zero2_comm_s, fsdp_comm_s (under a pipeline,
    fsdp_pipelined_comm_s: torch.distributed.pipelining's FSDP2, gathered and reduced once a step); nanochat's
    sharded optimizer: everything after the last micro-batch (the caller hides it under optimizer math, and works
    out beside and outlasting there). Without layout.overlap_grad_reduce (ZeRO 0-2: Megatron-LM's local DDP and
    distributed optimizer, which reduce after the whole backward, training.py@b83477a L425-429 and @0609f27 L453),
    the gradient all-reduce or reduce-scatters have no backward beside them: all exposed.
    place: the layout's placement on hw's nodes where the caller has it (step_time), else worked out here.
    """
    n = layout.grad_ranks  # dp x cp ranks hold the same parameters
    if n == 1 and layout.expert_ranks == 1:  # (whole experts may still be shared by tp ranks: --etp 1)
        return 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
    cache = {} if cache is None else cache
    policy = dp_policy(spec, layout)
    if place is None:
        place = _placed(layout, hw, cache)  # ranks ordered tp, dp, pp: a dp group strides by tp
    if policy == "ddp":
        buffers, expert = (_buffers(spec, layout, policy, experts, cache) for experts in (False, True))
        # the routed experts' gradients reduce over their own group (Layout.expert_ranks, etp x ep ranks apart)
        timer = _Cached(GroupTimer(hw, place.dp_per_node, efficiency, points), cache)
        n_e, timer_e = layout.expert_ranks, _Cached(GroupTimer(hw, place.edp_per_node, efficiency, points), cache)
        size, size_e = sum(s for _, _, s in buffers), sum(s for _, _, s in expert)
        if layout.grad_bucket != "group":  # the stack's buckets: a collective each (_bucketed_s)
            (total, last), (total_e, last_e) = (_bucketed_s(spec, layout, b, "all_reduce", t, m, n)
                                                for b, t, m in ((buffers, timer, n), (expert, timer_e, n_e)))
            exposed = comm.bucketed_exposed_s(total, last, bwd_s)
            if size_e:  # after the other buckets, under what is left of backward
                exposed += comm.bucketed_exposed_s(total_e, last_e, max(0.0, bwd_s - total))
            return (total + total_e, exposed, 0.0, 0.0, _beside(total + total_e, exposed, bwd_s),
                    max(0.0, total + total_e - bwd_s))
        total, total_e = timer.time_s("all_reduce", size, n), timer_e.time_s("all_reduce", size_e, n_e)
        if not layout.overlap_grad_reduce:  # after the last backward (Megatron-LM's default): nothing to hide under
            return total + total_e, total + total_e, 0.0, 0.0, 0.0, 0.0
        exposed = comm.ddp_exposed_s(size, DDP_BUCKET_BYTES, n, timer, bwd_s)
        if size_e:  # after the other buckets, under what is left of backward
            exposed += comm.ddp_exposed_s(size_e, DDP_BUCKET_BYTES, n_e, timer_e, max(0.0, bwd_s - total))
        return (total + total_e, exposed, 0.0, 0.0, _beside(total + total_e, exposed, bwd_s),
                max(0.0, total + total_e - bwd_s))
    key = ("dp collectives", policy, layout.dp, layout.tp, layout.pp, layout.cp, layout.ep, layout.etp,
           layout.shard_group, layout.fp8_all_gather, layout.fp8_params, layout.grad_bucket, layout.pp_virtual_stages,
           hw.gpus_per_node, efficiency)  # what they depend on
    times = cache.get(key)
    if times is None:
        times = cache[key] = _dp_collectives(spec, hw, layout, policy, place, efficiency, points, cache)
    rs, ag, ar, last, first_gather = times
    if policy == "fsdp" and layout.pp > 1:  # torch.distributed.pipelining's FSDP2: gathered and reduced once a step
        units = fsdp_units(spec, layout)
        total, exposed = comm.fsdp_pipelined_comm_s(rs, ag, mb_s - bwd_s, bwd_s, layout.grad_accum, units,
                                                    reshard=layout.reshard_after_forward, replica_all_reduce_s=ar)
        # the reduce-scatter and all-reduce after the last backward outlast the stage's compute; the gathers do not
        gathers = zero3_gathers(layout) * ag
        return total, exposed, gathers, rs, _beside(total, exposed, layout.grad_accum * mb_s), rs + ar
    if policy == "fsdp":
        total, exposed, gather, scatter = _fsdp_comm_s(rs, ag, ar, layout, place, mb_s, spec.architecture.num_layers)
        # each pass's first gather waits before any compute: exposed, but not outlasting the compute
        first = layout.grad_accum * gather / max(1, spec.architecture.num_layers)
        return (total, exposed, gather, scatter, _beside(total, exposed, layout.grad_accum * mb_s),
                max(0.0, exposed - first))
    if policy == "sharded_optimizer":
        return rs + ag + ar, rs + ag + ar, 0.0, 0.0, 0.0, 0.0  # overlap with optimizer math applied by the caller
    forward = (mb_s - bwd_s) if layout.overlap_param_gather else None  # the next step's first forward
    accum = 1 if policy == "zero1" else layout.grad_accum  # ZeRO-1 reduces once a step, ZeRO-2 every micro-batch
    # the reduce-scatters run beside backward, or after it (not overlap_grad_reduce: no backward to hide under)
    bwd_s = bwd_s if layout.overlap_grad_reduce else 0.0
    if policy == "zero1":
        total, exposed = comm.zero1_comm_s(rs, ag, last, bwd_s, forward, first_gather)
    else:
        total, exposed = comm.zero2_comm_s(rs, ag, last, bwd_s, layout.grad_accum, forward, first_gather)
    # the reduce-scatters run beside backward, the gathers (when overlapped) beside the next forward
    window = accum * bwd_s + (forward or 0.0)
    outlasting = accum * max(0.0, rs - bwd_s) + (max(0.0, ag - forward) if forward is not None else 0.0)
    return total, exposed, 0.0, 0.0, _beside(total, exposed, window), outlasting


def _beside(total: float, exposed: float, window: float) -> float:
    """Seconds of a policy's collectives beside the compute they overlap (comm.overlap_cost_s's `overlapped`): what
    of them is not exposed, at most that compute window (a hybrid FSDP's two streams on their own links overlap each
    other too, so their sum can exceed it)."""
    return min(max(0.0, total - exposed), window)


def _dp_collectives(spec: ModelSpec, hw: HardwareSpec, layout: Layout, policy: str, place: Placement,
                    efficiency: str, points: CommPoints | None, cache: Cache
                    ) -> tuple[float, float, float, float, float]:
    """(rs, ag, ar, last, first) seconds of a sharded policy's collectives (dp_comm_s, every policy but DDP): the
    gradient reduce-scatters, parameter all-gathers and all-reduces of one synchronisation (FSDP: of one micro-batch,
    ar the hybrid replicas' all-reduce, _fsdp_collectives), ZeRO-1/2's last reduce-scatter bucket and its first
    gather bucket (0 otherwise; the last bucket's reduce time under the generic "group" rule). They depend on the
    layout's degrees, sharding and buckets only (dp_comm_s keeps them by those)."""
    buffers, expert = (_buffers(spec, layout, policy, experts, cache) for experts in (False, True))
    if policy == "fsdp":
        return (*_fsdp_collectives(spec, buffers, expert, hw, layout, place, efficiency, points, cache), 0.0, 0.0)
    n = layout.grad_ranks
    # the routed experts' gradients reduce over their own group (Layout.expert_ranks, etp x ep ranks apart)
    timer = _Cached(GroupTimer(hw, place.dp_per_node, efficiency, points), cache)
    n_e, timer_e = layout.expert_ranks, _Cached(GroupTimer(hw, place.edp_per_node, efficiency, points), cache)
    rs, ag, ar = (sum(timer.time_s(c, s, n) for _, c, s in buffers if c == kind)
                  + sum(timer_e.time_s(c, s, n_e) for _, c, s in expert if c == kind)
                  for kind in ("reduce_scatter", "all_gather", "all_reduce"))
    if policy == "sharded_optimizer":
        return rs, ag, ar, 0.0, 0.0
    if layout.grad_bucket != "group":  # the stack's buckets: a reduce-scatter and a gather each (_bucketed_s)
        (rs, last), (rs_e, _) = (_bucketed_s(spec, layout, b, "reduce_scatter", t, m, n)
                                 for b, t, m in ((buffers, timer, n), (expert, timer_e, n_e)))
        (ag, first), (ag_e, _) = (_bucketed_s(spec, layout, b, "all_gather", t, m, n)
                                  for b, t, m in ((buffers, timer, n), (expert, timer_e, n_e)))
        return rs + rs_e, ag + ag_e, ar, last, first
    last = timer.time_s("reduce_scatter", min(DDP_BUCKET_BYTES, sum(s for _, c, s in buffers if c == "reduce_scatter")),
                        n)
    return rs, ag, ar, last, last


def _bucketed_s(spec: ModelSpec, layout: Layout, buffers: list[tuple[str, str, float]], collective: str,
                timer: "_Cached", n: int, ranks: int) -> tuple[float, float]:
    """(all, last bucket) seconds of one kind of ZeRO 0-2 collective over a rank's buffers in the stack's buckets
    (comm.grad_buckets over its gradients' parameters, `ranks` its dp x cp; the parameter gathers follow the same
    buckets): every bucket one call paying its latency (comm.split_time_s), and the last bucket's time alone, the one
    backward fills last and forward gathers first. Megatron-Core closes a bucket at the first parameter at or past
    its size, walking them in backward's order (param_and_grad_buffer.py@d98e8a6 L980-990), so the last holds
    the whole input embedding: at least the embedding's parameters (Llama 3.1 8B: 525M at tp 1, against 134M
    buckets). On a pipeline stage after the first Megatron-Core turns bucketing off (distributed_data_parallel.py
    @d98e8a6 L160-171): one bucket a chunk where the priced stage is such a one. Nothing to reduce: (0, 0)."""
    reduce = "all_reduce" if collective == "all_reduce" else "reduce_scatter"
    params = sum(size / spec.dtypes.reduce_bytes(g) for g, c, size in buffers if c == reduce)
    total = sum(size for _, c, size in buffers if c == collective)
    if not params or not total or n <= 1:
        return 0.0, 0.0
    stage = heaviest_stage(spec, layout)
    rule = "chunk" if stage is not None and stage.index > 0 else layout.grad_bucket
    calls, last = comm.grad_buckets(rule, params, ranks, layout.pp_virtual_stages)
    embedding = sum(size / spec.dtypes.reduce_bytes(g) for g, c, size in buffers
                    if c == reduce and g in EMBEDDING_GROUPS)
    last = min(params / layout.pp_virtual_stages, max(last, embedding))
    return (comm.split_time_s(timer.time_s, collective, total, n, calls),
            timer.time_s(collective, total * last / params, n))


def _placed(layout: Layout, hw: HardwareSpec, cache: Cache) -> Placement:
    """placement(layout, hw.gpus_per_node), kept in the caller's cache by Layout.parallel_key (a search's group
    shares it)."""
    key = ("placement", layout.parallel_key, hw.gpus_per_node)
    place = cache.get(key)
    if place is None:
        place = cache[key] = placement(layout, hw.gpus_per_node)
    return place


def _buffers(spec: ModelSpec, layout: Layout, policy: str, experts: bool, cache: Cache) -> list[tuple[str, str, float]]:
    """group_sync_buffers, kept in the caller's cache (by what they depend on)."""
    key = ("buffers", policy, layout.grad_ranks, layout.tp, layout.pp, layout.ep if experts else 1,
           layout.etp if experts else 0, experts, layout.fp8_all_gather, layout.fp8_params)
    if key not in cache:
        cache[key] = group_sync_buffers(spec, layout, experts)
    return cache[key]


def fsdp_units(spec: ModelSpec, layout: Layout, experts: bool = False) -> int:
    """The wrapped units of a ZeRO-3 / FSDP rank's blocks: its stage's transformer blocks (with experts=True, its
    mixture-of-experts blocks), each one fully_shard / FSDP unit, gathered and reduced in one collective of its own
    (torchtitan parallelize.py, Composer's and fms-fsdp's auto-wrap per block, OLMo-core; torch FSDP2
    FSDPParamGroup: one all-gather and one reduce-scatter a group). e.g. Llama 3 8B (32 blocks) at pp 4: 8."""
    arch, stage = spec.architecture, heaviest_stage(spec, layout)
    if stage is not None:  # the stage the buffers are priced on
        return max(1, stage.moe_layers if experts else stage.layers)
    return max(1, arch.moe_layers if experts and arch.moe is not None else arch.num_layers)


def _unit_calls_s(timer: "_Cached", collective: str, buffers: list[tuple[str, str, float]], n: int,
                  units: int, divide: int = 1) -> float:
    """Seconds of one kind of ZeRO-3 collective over a rank's buffers: the blocks' groups in `units` calls, one a
    unit (comm.split_time_s: each call pays its latency), the embedding and head groups one call each (the root
    unit's); the bytes over `divide` (the hybrid replicas' all-reduce carries a 1 / shard share)."""
    blocks = sum(size for g, c, size in buffers if c == collective and g not in EMBEDDING_GROUPS + HEAD_GROUPS)
    rest = sum(timer.time_s(collective, size / divide, n)
               for g, c, size in buffers if c == collective and g in EMBEDDING_GROUPS + HEAD_GROUPS)
    return rest + comm.split_time_s(timer.time_s, collective, blocks / divide, n, units)


def _fsdp_collectives(spec: ModelSpec, buffers: list[tuple[str, str, float]], expert: list[tuple[str, str, float]],
                      hw: HardwareSpec, layout: Layout, place: Placement, efficiency: str, points: CommPoints | None,
                      cache: Cache) -> tuple[float, float, float]:
    """(rs, ag, ar) seconds of one micro-batch's ZeRO-3 / FSDP collectives: its gradient reduce-scatter, one
    pass's parameter all-gather and the hybrid replicas' all-reduce (0 without hybrid sharding).

    The gathers and reduce-scatters run over the shard group (all of dp, or the hybrid shard group,
    its members placed as ddplan.layout.placement says), one call a unit (fsdp_units; the embeddings and head in
    the root's calls: _unit_calls_s); hybrid sharding adds an all-reduce of each unit's gradient shard across the
    dp / shard replicas (ar: one all-reduce a unit; _fsdp_comm_s runs it every micro-batch, torch FSDP2's default
    set_requires_all_reduce(True), or once a step). The routed experts' buffers (expert) gather and reduce over
    shard / ep ranks, placed as the expert-data-parallel group, one call a mixture-of-experts block.
    """
    s = layout.shard_degree
    units, units_e = fsdp_units(spec, layout), fsdp_units(spec, layout, experts=True)
    shard = _Cached(GroupTimer(hw, place.shard_per_node, efficiency, points), cache)
    s_e, shard_e = expert_shard(layout), _Cached(GroupTimer(hw, place.edp_per_node, efficiency, points), cache)
    rs, ag = (_unit_calls_s(shard, kind, buffers, s, units) + _unit_calls_s(shard_e, kind, expert, s_e, units_e)
              for kind in ("reduce_scatter", "all_gather"))
    replicas = layout.grad_ranks // s
    ar = 0.0
    if replicas > 1:  # each replica group holds one rank per shard group: a stride of tp x shard ranks
        per_node = max(1, min(replicas, hw.gpus_per_node // (layout.tp * s)))
        across = _Cached(GroupTimer(hw, per_node, efficiency, points), cache)
        reduced = [(g, "all_reduce", size) for g, c, size in buffers if c == "reduce_scatter"]
        reduced_e = [(g, "all_reduce", size) for g, c, size in expert if c == "reduce_scatter"]
        ar = (_unit_calls_s(across, "all_reduce", reduced, replicas, units, divide=s)
              + _unit_calls_s(across, "all_reduce", reduced_e, replicas, units_e, divide=s_e))
    return rs, ag, ar


def _fsdp_comm_s(rs: float, ag: float, ar: float, layout: Layout, place: Placement, mb_s: float,
                 num_layers: int) -> tuple[float, float, float, float]:
    """(total, exposed, gather, scatter) seconds of ZeRO-3 / FSDP communication (comm.fsdp_comm_s) from its
    collectives (_fsdp_collectives): total and exposed in one step; gather and scatter in one micro-batch (its
    all-gathers, every pass, and its reduce-scatter). The hybrid replicas' all-reduce runs after every micro-batch, or
    once a step (layout.replica_reduce_once), on the NICs: while the
    shard group stays inside a node (NVLink) the two streams overlap; when it crosses nodes too, both use the NICs
    and add up.
    """
    gathers = 2 if layout.reshard_after_forward else 1
    total, exposed = comm.fsdp_comm_s(rs, ag, mb_s, layout.grad_accum, max(1, num_layers), gathers=gathers,
                                      replica_all_reduce_s=ar, separate_links=not place.shard_crosses,
                                      replica_once=layout.replica_reduce_once)
    return total, exposed, gathers * ag, rs
