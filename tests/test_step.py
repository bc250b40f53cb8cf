"""ddplan.step: optimizer time, gradient-sync buffers and the step's terms (DESIGN.md sec. 4).

nanochat's sharded optimizer (nanochat/optim.py @92d63d4 l.214-246, summarised in
/work/shared/reference/nanochat.md sec. 4): per Muon shape group the K stacked gradients are
zero-padded to ceil(K/N) N matrices and reduce-scattered, each rank owning ceil(K/N) whole matrices;
AdamW params of >= 1024 elements reduce-scatter, smaller ones all-reduce; then the updated params are
all-gathered. nanochat-d24: 24 layers of 1536-wide blocks, 4 square (1536 x 1536) attention matrices
and two 6144 x 1536 / 1536 x 6144 MLP matrices per layer, 12 value-embedding gates of 12 x 12.
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddplan import comm, step
from ddplan.anatomy import build_anatomy, for_tp, muon_flops
from ddplan.layout import NATIVE_ZERO, Layout, check_layout, placement
from ddplan.registry import load_hardware, load_model
from ddplan.roofline import Rates, rates
from ddplan.specs import run_variant
from ddplan.step import fsdp2_copy_bytes, fsdp2_copies_s, grad_sync_buffers, optimizer_time_s, step_time

SQ, MLP_IN, MLP_OUT, VE = (1536, 1536), (6144, 1536), (1536, 6144), (12, 12)


@lru_cache(maxsize=None)
def _spec(name):
    return load_model(name)


@lru_cache(maxsize=None)
def _hw(name="mi300x"):
    return load_hardware(name)


@lru_cache(maxsize=None)
def _anatomy(model, micro_batch, attention, recompute="none", compiled=True, tp=1):
    impl = _hw().attention_impl(attention)
    return build_anatomy(_spec(model), batch=micro_batch, attention=impl.kind, windows=impl.windows,
                         recompute=recompute, compiled=compiled, tp=tp)


def run_step(model, layout, scenario="value"):
    spec, hw = _spec(model), _hw()
    an = _anatomy(model, layout.micro_batch, layout.attention, layout.recompute, layout.compiled)
    an = for_tp(an, layout.tp, layout.sequence_parallel) if layout.tp > 1 else an
    return step_time(spec, hw, layout, an, rates(hw, layout.attention, scenario), comm_efficiency=scenario)


def d24(dp=8, zero=1, micro_batch=32, **kw):
    kw.setdefault("grad_accum", max(1, 512 // (dp * micro_batch)))
    return Layout(dp=dp, zero=zero, micro_batch=micro_batch, attention="sdpa-fused", compiled=True, **kw)


def gpt2(dp=2, zero=0, micro_batch=12, grad_accum=8, **kw):
    return Layout(dp=dp, zero=zero, micro_batch=micro_batch, grad_accum=grad_accum, attention="sdpa-fused",
                  compiled=True, **kw)


# compute-only rates: unbounded HBM and no launch overhead, GEMMs at `best` for any shape
FLOPS_ONLY = Rates(peak_flops_per_s=1e15, vector_flops_per_s=1e14, hbm_bytes_per_s=1e30, gemm_best=0.5,
                   gemm_half_dim=1e-9, hbm=1.0, attn_fwd=0.5, attn_bwd=0.5, kernel_overhead_s=0.0)


# --------------------------------------------------------------------------------------------
# optimizer_time_s


@pytest.mark.parametrize("model", ["d24", "gpt2-124m", "llama-3-8b"])
@pytest.mark.parametrize("dp", [2, 4, 8, 16])
def test_optimizer_ddp_not_faster_than_sharded(model, dp):
    """DDP (ZeRO-0) updates every parameter on every rank; ZeRO-1 / nanochat's sharding splits the work."""
    r = rates(_hw(), "sdpa-fused")
    lay = Layout(dp=dp, zero=0)
    assert optimizer_time_s(_spec(model), lay, r) >= optimizer_time_s(_spec(model), replace(lay, zero=1), r)


def test_optimizer_dp1_sharded_equals_ddp():
    r = rates(_hw(), "sdpa-fused")
    spec = _spec("d24")
    assert optimizer_time_s(spec, Layout(dp=1, zero=1), r) == pytest.approx(
        optimizer_time_s(spec, Layout(dp=1, zero=0), r), rel=1e-12)


def test_optimizer_step_moves_the_precision_aware_states_bytes():
    """AdamW is memory-bound (ddplan.anatomy.adamw_bytes: read p, g, m, v; write p, m, v) plus the master copy read
    and written. Llama-3-8B on one GPU, bf16 weights, fp32 gradients: 2 x 2 + 4 + 4 x 4 + 2 x 4 = 32 bytes a
    parameter with fp32 moments and masters; bf16 moments and 16-bit master remainders (Megatron-Core's
    --use-precision-aware-optimizer, under the distributed optimizer: ZeRO-1, one rank) 2 x 2 + 4 + 4 x 2 + 2 x 2 = 20.
    The time less its launch costs scales by 20/32."""
    from ddplan.specs import run_variant

    r = rates(_hw("h100-sxm"), "fa3")
    spec = run_variant(_spec("llama-3-8b"), weights="master", grads="fp32")
    lay = Layout(dp=1, zero=1)
    launches = sum(1 for g, n in step.counts_of(spec.architecture).items()
                   if n and g in spec.recipe.optimizer.algorithm) * r.kernel_overhead_s
    full = optimizer_time_s(spec, lay, r) - launches
    light = optimizer_time_s(run_variant(spec, weights="remainder", moments="bf16"), lay, r) - launches
    assert light / full == pytest.approx(20 / 32, rel=1e-12)


def test_measured_muon_steps_replace_the_gemm_estimate_per_matrix_owned():
    """A calibration's Muon step of a shape's stack replaces that shape's Newton-Schulz estimate, per matrix
    the rank owns: doubling every measured time adds exactly their sum on one GPU (owning every matrix), and
    on 8 GPUs under nanochat's sharding ceil(K / 8) / K of it (d24: 1536 x 1536, K = 96 -> 12 of 96)."""
    from collections import Counter

    from ddplan.anatomy import muon_matrices

    spec = _spec("d24")
    shapes = Counter(s for g in ("block_matrices", "ve_gates") for s in muon_matrices(spec, g))
    points = tuple((rows, cols, k, 1e-3 * (i + 1)) for i, ((rows, cols), k) in enumerate(sorted(shapes.items())))
    r = rates(_hw(), "sdpa-fused")
    one = replace(r, muon_points=points)
    two = replace(r, muon_points=tuple((a, b, k, 2 * t) for a, b, k, t in points))
    lay = Layout(dp=1, zero=NATIVE_ZERO["sharded_optimizer"])
    assert optimizer_time_s(spec, lay, two) - optimizer_time_s(spec, lay, one) == pytest.approx(
        sum(t for *_, t in points), rel=1e-9)
    lay8 = replace(lay, dp=8)
    assert optimizer_time_s(spec, lay8, two) - optimizer_time_s(spec, lay8, one) == pytest.approx(
        sum(t * math.ceil(k / 8) / k for _, _, k, t in points), rel=1e-9)
    # and they replace the estimate: the optimizer is the AdamW groups (Muon measured at ~0 s) plus the points
    adamw_only = optimizer_time_s(spec, lay, replace(r, muon_points=tuple((a, b, k, 1e-30) for a, b, k, _ in points)))
    assert optimizer_time_s(spec, lay, one) == pytest.approx(adamw_only + sum(t for *_, t in points), rel=1e-9)
    assert optimizer_time_s(spec, lay, r) > adamw_only + 0.01  # the GEMM estimate of the same Muon is not ~0


def test_muon_flops_on_busiest_rank_d24_dp8_by_hand():
    """nanochat-d24 on 8 GPUs: each rank Newton-Schulz-orthogonalises ceil(K/8) matrices per shape group.

    muon_flops(m x n, 5 steps) = 5 (4 m^2 n + 2 m^3), m <= n:
      1536 x 1536: 30 x 1536^3 = 108,716,359,680;  K = 96 -> 12 per rank
      6144 x 1536 and 1536 x 6144: 5 (4 x 1536^2 x 6144 + 2 x 1536^3) = 326,149,079,040; K = 24 -> 3 each
      12 x 12 ve gates: 30 x 12^3 = 51,840; K = 12 -> ceil(1.5) = 2
    busiest rank: 12 x 108,716,359,680 + 6 x 326,149,079,040 + 2 x 51,840 = 3,261,490,894,080 FLOPs.
    Rates: HBM unbounded, no launch overhead, every GEMM at best = 0.5 of 1e15: time x 5e14 = FLOPs.
    """
    assert muon_flops(*SQ) == 108_716_359_680
    assert muon_flops(*MLP_IN) == muon_flops(*MLP_OUT) == 326_149_079_040
    assert muon_flops(*VE) == 51_840
    hand = 12 * 108_716_359_680 + 6 * 326_149_079_040 + 2 * 51_840
    assert hand == 3_261_490_894_080
    t = optimizer_time_s(_spec("d24"), d24(dp=8, zero=1), FLOPS_ONLY)
    assert t * 0.5e15 == pytest.approx(hand, rel=1e-9)


@pytest.mark.parametrize("dp, owned", [(1, (96, 24, 12)), (16, (6, 2, 1)), (32, (3, 1, 1)), (128, (1, 1, 1))])
def test_muon_busiest_rank_owns_ceil_k_over_n(dp, owned):
    sq, mlp, ve = owned
    hand = sq * muon_flops(*SQ) + 2 * mlp * muon_flops(*MLP_IN) + ve * muon_flops(*VE)
    t = optimizer_time_s(_spec("d24"), Layout(dp=dp, zero=1), FLOPS_ONLY)
    assert t * 0.5e15 == pytest.approx(hand, rel=1e-9)


def test_muon_ddp_every_rank_orthogonalises_everything():
    hand = 96 * muon_flops(*SQ) + 48 * muon_flops(*MLP_IN) + 12 * muon_flops(*VE)
    t = optimizer_time_s(_spec("d24"), Layout(dp=8, zero=0), FLOPS_ONLY)
    assert t * 0.5e15 == pytest.approx(hand, rel=1e-9)


def test_adamw_ddp_time_is_memory_bound_by_hand():
    """GPT-2 124M, fp32 params/grads/states, DDP: every rank reads p, g, m, v and writes p, m, v:
    124,439,808 x 7 x 4 B = 3,484,314,624 B at 5.3e12 x 0.775 B/s, plus one 8 us launch per group (5)."""
    r = rates(_hw(), "sdpa-fused")
    t = optimizer_time_s(_spec("gpt2-124m"), Layout(dp=8, zero=0), r)
    assert t == pytest.approx(3_484_314_624 / (5.3e12 * 0.775) + 5 * 8e-6, rel=1e-9)


# --------------------------------------------------------------------------------------------
# grad_sync_buffers


def test_grad_sync_buffers_nanochat_d24_dp8():
    """Muon groups padded to ceil(K/8) x 8 matrices (96 -> 96, 24 -> 24, 12 -> 16), in the master dtype;
    AdamW tables reduce-scatter then all-gather; smear gate (24) and scalars (50) all-reduce."""
    block = (96 * 1536 * 1536 + 24 * 6144 * 1536 + 24 * 1536 * 6144) * 4  # fp32
    assert block == 679_477_248 * 4 == 2_717_908_992
    ve_gates = 16 * 12 * 12 * 4  # K = 12 padded to 16, fp32: 9,216 B
    lm_head = 32768 * 1536 * 4  # fp32
    wte = 32768 * 1536 * 2  # bf16
    value_embeddings = 12 * 32768 * 1536 * 2  # 12 tables, bf16
    expect = [("reduce_scatter", block), ("all_gather", block), ("reduce_scatter", ve_gates),
              ("all_gather", ve_gates), ("reduce_scatter", lm_head), ("all_gather", lm_head),
              ("reduce_scatter", wte), ("all_gather", wte), ("reduce_scatter", value_embeddings),
              ("all_gather", value_embeddings), ("all_reduce", 24 * 4), ("all_reduce", 50 * 4)]
    assert sorted(grad_sync_buffers(_spec("d24"), d24(dp=8, zero=1))) == sorted(expect)


def test_grad_sync_buffers_carry_reduced_gradients_and_gathered_parameters_at_their_own_bytes():
    """d24 under nanochat's sharded optimizer, by hand from the buffers above: with grads compute (reduced in bf16,
    kept in the fp32 masters) the fp32 groups' reduce-scatters and all-reduces halve, while the all-gathers of the
    updated parameters stay at the parameters' bytes (fp32 block matrices, bf16 tables); with grads fp32 the bf16
    tables reduce-scatter at 4 bytes and still gather at 2. Under ZeRO-3 with Muon (GPT-2's blocks, fp32 weights),
    the reduced gradient shards gathered back for Newton-Schulz are the kept gradients' 4 bytes under grads compute."""
    from ddplan.specs import run_variant

    block = 679_477_248 * 4
    lm_head, wte, tables = 32768 * 1536 * 4, 32768 * 1536 * 2, 12 * 32768 * 1536 * 2

    def sized(grads):
        out: dict = {}
        for c, size in grad_sync_buffers(run_variant(_spec("d24"), grads=grads), d24(dp=8, zero=1)):
            out.setdefault(c, []).append(size)
        return out

    base, compute, fp32 = sized("param"), sized("compute"), sized("fp32")
    assert block in base["reduce_scatter"] and block // 2 in compute["reduce_scatter"]
    assert lm_head // 2 in compute["reduce_scatter"] and wte in compute["reduce_scatter"]
    assert sorted(compute["all_gather"]) == sorted(base["all_gather"])  # the parameters, as kept
    assert sorted(compute["all_reduce"]) == [24 * 2, 50 * 2]
    assert 2 * wte in fp32["reduce_scatter"] and 2 * tables in fp32["reduce_scatter"]
    assert wte in fp32["all_gather"] and tables in fp32["all_gather"]  # bf16 tables gathered at 2 bytes
    spec = _spec("gpt2-124m")
    spec = run_variant(spec.model_copy(update={"recipe": spec.recipe.model_copy(update={"optimizer": spec.recipe.optimizer.model_copy(
        update={"algorithm": {g: "muon" for g in spec.recipe.optimizer.algorithm}})})}), weights="fp32", grads="compute")
    gathers = [size for c, size in grad_sync_buffers(spec, gpt2(dp=8, zero=3)) if c == "all_gather"]
    reduced = sum(size for c, size in grad_sync_buffers(spec, gpt2(dp=8, zero=3)) if c == "reduce_scatter")
    assert reduced == 124_439_808 * 2 and sum(gathers) == 124_439_808 * (2 + 4)  # bf16 params + fp32 grad shards


def test_grad_sync_buffers_nanochat_d26_padding():
    """nanochat.md sec. 4: d26 MLP groups K = 26 over N = 8 pad to 32; the 13 ve gates (13 x 12) pad to 16."""
    buffers = grad_sync_buffers(_spec("d26"), Layout(dp=8, zero=1))
    rs = [s for c, s in buffers if c == "reduce_scatter"]
    assert (104 * 1664 * 1664 + 2 * 32 * 6656 * 1664) * 4 in rs
    assert 16 * 13 * 12 * 4 in rs
    assert [c for c, s in buffers].count("all_reduce") == 2


def test_grad_sync_buffers_ddp_gpt2_one_all_reduce_per_group():
    """DDP all-reduces every gradient: GPT-2 124M has 124,439,808 parameters (HF gpt2), fp32 grads."""
    buffers = grad_sync_buffers(_spec("gpt2-124m"), gpt2(dp=8, zero=0))
    assert [c for c, _ in buffers] == ["all_reduce"] * 5  # wte, wpe, block matrices, norms, biases
    assert sum(s for _, s in buffers) == 124_439_808 * 4


def test_grad_sync_buffers_under_a_pipeline_are_one_stage_s():
    """Under a pipeline the data-parallel collectives carry one stage's gradients, the stage holding the most
    (ddplan.memory.heaviest_stage), never the busiest stage's layers with both the embeddings and the head. Llama 3
    8B (HF config: 32 layers of 4096 x 4096 q/o, 4096 x 1024 k/v, 3 x 4096 x 14336 MLP, two 4096 norms = 218,112,000
    parameters; vocabulary 128,256 x 4096 = 525,336,576 each for the untied embeddings and head, a final norm of
    4096), pp 4, ZeRO-1 over dp 2, fp32 gradients: the first stage, 8 layers and the embeddings, reduce-scattered at 4
    bytes and gathered at 2. The optimizer step updates the same stage's parameters."""
    layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    spec = run_variant(_spec("llama-3-8b"), weights="master", grads="fp32")
    lay = Layout(dp=2, pp=4, zero=1, micro_batch=1, grad_accum=4)
    buffers = grad_sync_buffers(spec, lay)
    # the final norm is priced with the blocks' norms, spread over the layers: 8/32 of its 4096 on this stage
    first = 8 * layer + 128_256 * 4096 + 4096 * 8 // 32
    assert sum(s for c, s in buffers if c == "reduce_scatter") == pytest.approx(first * 4, rel=1e-12)
    assert sum(s for c, s in buffers if c == "all_gather") == pytest.approx(first * 2, rel=1e-12)
    # its AdamW step: 32 bytes an element (2 x 2 + 4 + 4 x 4 + 2 x 4, fp32 masters), half of them a rank at dp 2
    r = rates(_hw("h100-sxm"), "fa3")
    launches = sum(1 for g, n in step.counts_of(spec.architecture).items()
                   if n and g in spec.recipe.optimizer.algorithm) * r.kernel_overhead_s
    moved = (optimizer_time_s(spec, lay, r) - launches) * r.hbm_bytes_per_s * r.hbm
    assert moved == pytest.approx(first * 32 / 2, rel=1e-9)


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_grad_sync_buffers_generic_zero_reduce_scatter_and_gather_everything(zero):
    buffers = grad_sync_buffers(_spec("gpt2-124m"), gpt2(dp=8, zero=zero))
    assert sum(s for c, s in buffers if c == "reduce_scatter") == 124_439_808 * 4  # fp32 gradients
    assert sum(s for c, s in buffers if c == "all_gather") == 124_439_808 * 2  # params gathered in bf16
    assert not [c for c, _ in buffers if c == "all_reduce"]


def test_fsdp2_copy_bytes_gpt2_by_hand():
    """torch FSDP2's copies a step (fsdp2_copy_bytes), GPT-2 small (fp32 weights and gradients, bf16 compute), 8
    micro-batches. Per parameter element and micro-batch: the all-gather's copy-out reads and writes it in bf16 once
    per gather (2 x 2 B, twice when resharded after forward) and backward's copy-in reads the bf16 gradient and
    writes it in fp32 (2 + 4 B): 8 + 6 = 14 B resharded, 10 B not. With one shard rank FSDP2 skips the collective,
    not the copies: it casts the fp32 shard to bf16 (4 + 2 B) and copies that into the unsharded tensor (2 + 2 B)."""
    n = 124_439_808  # gpt2-124m's parameters (test_grad_sync_buffers_generic_zero_reduce_scatter_and_gather_everything)
    spec = _spec("gpt2-124m")
    assert fsdp2_copy_bytes(spec, gpt2(dp=8, zero=3, fsdp2=True)) == pytest.approx(8 * n * 14, rel=1e-12)
    assert fsdp2_copy_bytes(spec, gpt2(dp=8, zero=3, fsdp2=True, reshard_after_forward=False)) == pytest.approx(
        8 * n * 10, rel=1e-12)
    assert fsdp2_copy_bytes(spec, gpt2(dp=1, zero=3, fsdp2=True)) == pytest.approx(8 * n * (2 * 10 + 6), rel=1e-12)
    # flat-parameter FSDP (the default) gathers in place; ZeRO-1 has no FSDP units
    assert fsdp2_copy_bytes(spec, gpt2(dp=8, zero=3)) == 0 == fsdp2_copy_bytes(spec, gpt2(dp=8, zero=1))
    # tp 2 halves each group's share (ddplan.memory._stage_share, as grad_sync_buffers sizes the collectives)
    assert fsdp2_copy_bytes(spec, gpt2(dp=4, tp=2, zero=3, fsdp2=True)) == pytest.approx(8 * n * 14 / 2, rel=1e-12)
    # under a pipeline, per element of the stage's: kept after forward, one gather a step (2 x 2 B); the gradients
    # cast to fp32 after the first micro-batch (2 + 4 B), added in fp32 after each of the 7 others (2 + 4 + 4 B)
    # and copied in once (4 + 4 B): 4 + 6 + 70 + 8 = 88 B; resharded, a gather in each micro-batch's backward:
    # 8 x 4 + 84 = 116 B; one micro-batch: 4 + (2 + 4) = 10 B
    kept = fsdp2_copy_bytes(spec, gpt2(dp=2, pp=2, zero=3, fsdp2=True, reshard_after_forward=False))
    resharded = fsdp2_copy_bytes(spec, gpt2(dp=2, pp=2, zero=3, fsdp2=True))
    one = fsdp2_copy_bytes(spec, gpt2(dp=2, pp=2, zero=3, fsdp2=True, reshard_after_forward=False, grad_accum=1))
    assert resharded / kept == pytest.approx(116 / 88, rel=1e-12) and one / kept == pytest.approx(10 / 88, rel=1e-12)


def test_fsdp2_copies_join_compute_at_hbm_speed():
    """The copies' seconds are their bytes at HBM bandwidth x its efficiency plus one launch a unit per copy-out
    and copy-in; the step adds them to compute_s, under by_kind_s["fsdp2 copies"], and nothing else moves. GPT-2
    small, dp 8, 8 micro-batches, resharded: 8 x 124,439,808 x 14 B, and 12 blocks x (16 copy-outs + 8 copy-ins)
    launches."""
    spec, hw = _spec("gpt2-124m"), _hw()
    lay = gpt2(dp=8, zero=3, fsdp2=True)
    r = rates(hw, lay.attention, "value")
    expect = 8 * 124_439_808 * 14 / (r.hbm_bytes_per_s * r.hbm) + 12 * (16 + 8) * r.kernel_overhead_s
    assert fsdp2_copies_s(spec, lay, r) == pytest.approx(expect, rel=1e-12)
    with_copies, without = run_step("gpt2-124m", lay), run_step("gpt2-124m", replace(lay, fsdp2=False))
    assert with_copies.fsdp2_copies_s == pytest.approx(expect, rel=1e-12)
    assert with_copies.compute_s - without.compute_s == pytest.approx(expect, rel=1e-9)
    assert with_copies.by_kind_s["fsdp2 copies"] == with_copies.fsdp2_copies_s
    assert with_copies.optimizer_s == without.optimizer_s and with_copies.tp_comm_s == without.tp_comm_s


def test_zero3_under_a_pipeline_gathers_and_reduces_once_a_step():
    """ZeRO-3 with pp > 1 runs as torch.distributed.pipelining's FSDP2 (comm.fsdp_pipelined_comm_s): kept after
    forward, the parameters are gathered once and the gradients reduced once a step, so the step's data-parallel
    traffic does not grow with the micro-batches; resharded, each micro-batch's backward gathers again."""
    kept = [run_step("gpt2-124m", gpt2(dp=2, pp=2, zero=3, grad_accum=k, reshard_after_forward=False)) for k in (4, 8)]
    assert kept[0].dp_comm_total_s == pytest.approx(kept[1].dp_comm_total_s, rel=1e-12)
    assert kept[0].dp_comm_total_s == pytest.approx(kept[0].mb_gather_s + kept[0].mb_scatter_s, rel=1e-12)
    resharded = [run_step("gpt2-124m", gpt2(dp=2, pp=2, zero=3, grad_accum=k)) for k in (4, 8)]
    assert resharded[1].mb_gather_s == pytest.approx(2 * resharded[0].mb_gather_s, rel=1e-12)
    assert resharded[1].mb_scatter_s == pytest.approx(resharded[0].mb_scatter_s, rel=1e-12)
    # the per-micro-batch rule (pp 1) sends two gathers and a reduce-scatter every micro-batch
    flat = run_step("gpt2-124m", gpt2(dp=4, zero=3, grad_accum=8))
    assert flat.dp_comm_total_s == pytest.approx(8 * (flat.mb_gather_s + flat.mb_scatter_s), rel=1e-12)


# --------------------------------------------------------------------------------------------
# step_time


STEP_CASES = [
    ("d24", d24(dp=1, zero=1)),
    ("d24", d24(dp=8, zero=1)),
    ("d24", d24(dp=8, zero=0)),
    ("d24", d24(dp=16, zero=2, micro_batch=16)),
    ("gpt2-124m", gpt2(dp=1)),
    ("gpt2-124m", gpt2(dp=8, zero=0)),
    ("gpt2-124m", gpt2(dp=8, zero=1)),
    ("gpt2-124m", gpt2(dp=8, zero=2)),
    ("gpt2-124m", gpt2(dp=8, zero=3)),
    ("gpt2-124m", gpt2(dp=8, zero=3, fsdp2=True)),
    ("gpt2-124m", gpt2(dp=2, tp=2, pp=2)),
    ("gpt2-124m", gpt2(dp=4, tp=2, pp=2, recompute="full")),
]


@pytest.mark.parametrize("model, layout", STEP_CASES)
def test_step_total_is_sum_of_terms(model, layout):
    s = run_step(model, layout)
    assert s.total_s == pytest.approx(s.compute_s + s.tp_comm_s + s.dp_comm_exposed_s + s.bubble_s + s.optimizer_s,
                                      rel=1e-12)
    assert s.compute_s == pytest.approx(layout.grad_accum * (s.fwd_s + s.bwd_s) + s.fsdp2_copies_s, rel=1e-12)
    assert (s.fsdp2_copies_s > 0) == layout.fsdp2
    assert sum(s.by_kind_s.values()) == pytest.approx(s.compute_s, rel=1e-12)
    assert 0 <= s.dp_comm_exposed_s <= s.dp_comm_total_s + 1e-15
    assert min(s.tp_comm_s, s.bubble_s, s.optimizer_s) >= 0


@pytest.mark.parametrize("model, layout", [("d24", d24(dp=1, zero=1)), ("d24", d24(dp=1, zero=0)),
                                           ("gpt2-124m", gpt2(dp=1, zero=3))])
def test_step_dp1_has_no_communication(model, layout):
    s = run_step(model, layout)
    assert s.dp_comm_total_s == s.dp_comm_exposed_s == s.tp_comm_s == s.bubble_s == 0.0
    assert s.total_s == pytest.approx(s.compute_s + s.optimizer_s, rel=1e-12)


@pytest.mark.parametrize("dp", [2, 4, 8, 16, 32])
def test_step_sharded_optimizer_hides_comm_under_optimizer_math_only(dp):
    s = run_step("d24", d24(dp=dp, zero=1))
    assert s.policy == "sharded_optimizer"
    assert s.dp_comm_total_s > 0
    exposed = max(0.0, s.dp_comm_total_s - s.optimizer_s)
    # the part beside the optimizer math slows it (mi300x's overlapped_compute 0.841, comm.overlap_cost_s), unless the
    # math still ends inside the collectives: max(0, (1 - 0.841) x beside - 0.841 x outlasting)
    beside = s.dp_comm_total_s - exposed
    cost = max(0.0, (1 - 0.841) * beside - 0.841 * exposed)
    assert s.dp_comm_exposed_s == pytest.approx(exposed + cost, rel=1e-12, abs=1e-15)


def test_step_d24_dp8_sharded_comm_total_by_hand():
    """Once per step, after the last micro-batch: the buffers of test_grad_sync_buffers_nanochat_d24_dp8
    through the ring model at the MI300X 8-GPU tier (RS/AG busbw 309.8 GB/s, AR 312.9 GB/s, alpha 5 us)."""
    spec, hw = _spec("d24"), _hw()
    total = 0.0
    for c, size in grad_sync_buffers(spec, d24(dp=8)):
        tier = comm.tier_for(hw, c, 8)
        total += comm.collective_time_s(c, size, 8, tier)
    # the big block-matrix pair alone: 2 x (7 x 5 us + 2,717,908,992 x 7/8 / 309.8e9) = 15.422 ms
    assert 2 * (7 * 5e-6 + 2_717_908_992 * 0.875 / 309.8e9) == pytest.approx(15.4222e-3, rel=1e-4)
    assert run_step("d24", d24(dp=8)).dp_comm_total_s == pytest.approx(total, rel=1e-12)


def test_step_ddp_exposes_at_least_the_last_bucket():
    s = run_step("gpt2-124m", gpt2(dp=8, zero=0))
    assert s.policy == "ddp"
    tier = comm.tier_for(_hw(), "all_reduce", 8)
    last = comm.collective_time_s("all_reduce", step.DDP_BUCKET_BYTES, 8, tier)
    assert s.dp_comm_exposed_s >= last - 1e-15
    assert s.dp_comm_total_s == pytest.approx(
        comm.collective_time_s("all_reduce", 124_439_808 * 4, 8, tier), rel=1e-12)


def test_ddp_bucket_matches_torch_default():
    assert step.DDP_BUCKET_BYTES == comm.DDP_DEFAULT_BUCKET_BYTES == 25 * 2**20


def test_step_tp2_adds_megatron_all_reduces_by_hand():
    """GPT-2 124M, tp = 2 (12 heads / 2), micro-batch 12 x 1024, bf16: each all-reduce is
    S = 12 x 1024 x 768 x 2 = 18,874,368 B; on an MI300X pair (47.7 GB/s busbw, 5 us):
    t = 2 x 1 x 5 us + S x 1 / 47.7e9 = 10 us + 395.689 us = 405.689 us. Megatron: 2 forward + 2 backward
    per layer, 12 layers, 8 micro-batches: 8 x 12 x 4 x 405.689 us = 0.155785 s."""
    lay = gpt2(dp=1, tp=2, grad_accum=8)
    check_layout(lay, _spec("gpt2-124m"))
    one = 2 * 5e-6 + 18_874_368 / 47.7e9
    assert one == pytest.approx(405.689e-6, rel=1e-6)
    s = run_step("gpt2-124m", lay)
    assert s.tp_comm_s > 0
    assert s.tp_comm_s == pytest.approx(8 * 12 * 4 * one, rel=1e-9)
    assert s.tp_comm_s == pytest.approx(0.155785, rel=1e-5)
    assert run_step("gpt2-124m", gpt2(dp=1, tp=1, grad_accum=8)).tp_comm_s == 0.0


def test_step_tp2_halves_the_per_gpu_gemm_time():
    """Megatron TP splits every block GEMM and the attention heads over the tp ranks: per-GPU compute
    must drop (GEMM time roughly halves, a little less for the smaller shapes)."""
    one = run_step("gpt2-124m", gpt2(dp=1, tp=1))
    two = run_step("gpt2-124m", gpt2(dp=1, tp=2))
    assert two.compute_s < 0.75 * one.compute_s


def test_step_tp_full_recompute_repeats_the_forward_all_reduces():
    none = run_step("gpt2-124m", gpt2(dp=1, tp=2))
    full = run_step("gpt2-124m", gpt2(dp=1, tp=2, recompute="full"))
    assert full.tp_comm_s == pytest.approx(1.5 * none.tp_comm_s, rel=1e-9)


def test_step_tp_per_op_recompute_repeats_the_gathers_not_the_reduce_scatters():
    """torchtitan's per-op SelectiveAC keeps reduce-scatter outputs (its save list) and re-runs the rest: without
    sequence parallelism the forward's two all-reduces again (as full recompute, x1.5 of 2 + 2), with it the two
    all-gathers only (a quarter of the 8 collectives: x1.25)."""
    none = run_step("gpt2-124m", gpt2(dp=1, tp=2))
    per_op = run_step("gpt2-124m", gpt2(dp=1, tp=2, recompute="per-op"))
    assert per_op.tp_comm_s == pytest.approx(1.5 * none.tp_comm_s, rel=1e-9)
    sp = run_step("gpt2-124m", gpt2(dp=1, tp=2, sequence_parallel=True))
    sp_per_op = run_step("gpt2-124m", gpt2(dp=1, tp=2, sequence_parallel=True, recompute="per-op"))
    assert sp.tp_comm_s > 0 and sp_per_op.tp_comm_s == pytest.approx(1.25 * sp.tp_comm_s, rel=1e-9)


def _p2p_s(model, layout):
    spec, hw = _spec(model), _hw()
    a = spec.architecture
    tier = comm.tier_for(hw, "all_gather", 2)
    sent = layout.micro_batch * spec.recipe.seq_len * a.d_model * 2 / layout.tp
    # interleaving: each micro-batch crosses v times as many stage boundaries (Narayanan et al. sec. 2.2.2)
    return layout.grad_accum * 2 * layout.pp_virtual_stages * (sent / tier.busbw_bytes_per_s + tier.latency_s)


@pytest.mark.parametrize("pp, m, v, tp", [(2, 8, 1, 1), (4, 8, 1, 1), (2, 4, 1, 2), (2, 8, 2, 1), (3, 6, 1, 1)])
def test_step_pipeline_bubble_is_megatron_bubble_over_ideal(pp, m, v, tp):
    """bubble / (compute + tp) = (p - 1) / (v m) (Narayanan et al., arXiv 2104.04473, sec. 2.2), once the
    stage-boundary sends (b s h / tp bf16 each way per micro-batch, MI300X pair link) are taken out."""
    lay = gpt2(dp=1, pp=pp, tp=tp, grad_accum=m, pp_virtual_stages=v,
               pp_schedule="interleaved" if v > 1 else "1f1b")
    check_layout(lay, _spec("gpt2-124m"))
    s = run_step("gpt2-124m", lay)
    assert s.bubble_s > 0
    ideal = s.compute_s + s.tp_comm_s
    assert (s.bubble_s - _p2p_s("gpt2-124m", lay)) / ideal == pytest.approx((pp - 1) / (v * m), rel=1e-9)


def test_step_pipeline_stage_holds_a_fraction_of_the_layers():
    one = run_step("gpt2-124m", gpt2(dp=1, pp=1))
    two = run_step("gpt2-124m", gpt2(dp=1, pp=2))
    assert two.compute_s < one.compute_s


def test_step_fsdp_llama_exposes_at_least_the_first_gather_per_micro_batch():
    """Llama-3-8B's native setup is FSDP (ZeRO-3): parameters all-gathered in every micro-batch's forward
    and backward, prefetched layer by layer, so at least one layer's gather per pass is exposed."""
    spec = _spec("llama-3-8b")
    assert spec.recipe.distribution == "fsdp"
    lay = Layout(dp=8, zero=3, micro_batch=1, grad_accum=64, attention="sdpa-fused", compiled=True)
    check_layout(lay, spec, spec.recipe.total_batch_tokens)
    s = run_step("llama-3-8b", lay)
    assert s.policy == "fsdp"
    hw = _hw()
    ag = sum(comm.collective_time_s(c, size, 8, comm.tier_for(hw, c, 8))
             for c, size in grad_sync_buffers(spec, lay) if c == "all_gather")
    first = 2 * ag / spec.architecture.num_layers
    assert s.dp_comm_exposed_s >= 64 * first * (1 - 1e-12)
    assert s.dp_comm_exposed_s <= s.dp_comm_total_s


def test_fsdp_gathers_and_reduces_a_unit_a_call_by_hand():
    """ZeRO-3 / FSDP issues one all-gather and one reduce-scatter a wrapped unit (step.fsdp_units: a transformer
    block; torch FSDP2's FSDPParamGroup, torchtitan's fully_shard per block), each paying its latency
    (comm.split_time_s); the embeddings and the head are the root's calls. Llama 3 8B on 8 MI300X, accumulating 4:
    every micro-batch gathers twice (forward, backward) and reduce-scatters once, so the step's total is
    4 x (2 x ag + rs), ag = 32 block calls of a 32nd of the blocks' bytes + the embedding's call + the head's."""
    spec = _spec("llama-3-8b")
    lay = Layout(dp=8, zero=3, micro_batch=1, grad_accum=4, attention="sdpa-fused", compiled=True)
    assert step.fsdp_units(spec, lay) == 32 and step.fsdp_units(spec, replace(lay, pp=4, dp=2)) == 8
    hw = _hw()
    groups = step.group_sync_buffers(spec, lay)

    def t(c, size):
        return comm.collective_time_s(c, size, 8, comm.tier_for(hw, c, 8))

    def kind(c):
        blocks = sum(size for g, k, size in groups if k == c and g not in ("wte", "lm_head"))
        return 32 * t(c, blocks / 32) + sum(t(c, size) for g, k, size in groups if k == c and g in ("wte", "lm_head"))

    assert {g for g, _, _ in groups} == {"wte", "lm_head", "block_matrices", "norms"}
    s = run_step("llama-3-8b", lay)
    assert s.dp_comm_total_s == pytest.approx(4 * (2 * kind("all_gather") + kind("reduce_scatter")), rel=1e-12)
    # 34 calls (32 blocks, the embedding, the head) against one a group (4): 30 more ring latencies, nothing else
    ag_a_group = sum(t("all_gather", size) for g, k, size in groups if k == "all_gather")
    alpha = comm.ring_latency_s("all_gather", 8, comm.tier_for(hw, "all_gather", 8))
    assert kind("all_gather") - ag_a_group == pytest.approx(30 * alpha, rel=1e-9)


def test_zero1_gradient_buckets_each_pay_a_latency_and_one_bucket_overlaps_nothing():
    """ZeRO-1 with the stack's buckets (Layout.grad_bucket): the reduce-scatter and the gather each run as
    comm.grad_buckets' calls (comm.split_time_s: a latency each, the bytes the same); one bucket a chunk ("chunk",
    Megatron-Core under --overlap-param-gather-with-optimizer-step) at vp 1 overlaps nothing: the whole reduce is
    exposed after backward and the whole gather before forward, however the gather is overlapped. Llama 3 8B on 16
    MI300X (two nodes), accumulating 4."""
    spec = _spec("llama-3-8b")
    base = Layout(dp=16, zero=1, micro_batch=1, grad_accum=4, attention="sdpa-fused", compiled=True,
                  overlap_param_gather=True)
    hw = _hw()
    groups = step.group_sync_buffers(spec, base)
    params = sum(size / spec.dtypes.reduce_bytes(g) for g, c, size in groups if c == "reduce_scatter")
    calls, last = comm.grad_buckets("megatron", params, 16)
    assert calls == math.ceil(params / 4e7) and last == 4e7
    timer = comm.GroupTimer(hw, placement(base, hw.gpus_per_node).dp_per_node)

    def total(c, k):
        return comm.split_time_s(timer.time_s, c, sum(size for _, kind, size in groups if kind == c), 16, k)

    bucketed = run_step("llama-3-8b", replace(base, grad_bucket="megatron"))
    assert bucketed.dp_comm_total_s == pytest.approx(total("reduce_scatter", calls) + total("all_gather", calls),
                                                     rel=1e-12)
    chunk = run_step("llama-3-8b", replace(base, grad_bucket="chunk"))
    whole = total("reduce_scatter", 1) + total("all_gather", 1)
    assert chunk.dp_comm_total_s == pytest.approx(whole, rel=1e-12)
    assert chunk.dp_comm_exposed_s == pytest.approx(whole, rel=1e-12)
    assert bucketed.dp_comm_exposed_s < chunk.dp_comm_exposed_s


def test_the_last_gradient_bucket_holds_the_embedding_and_later_stages_are_unbucketed():
    """Megatron-Core closes a bucket at the first parameter at or past its size, walking them in backward's order
    (param_and_grad_buffer.py@d98e8a6 L980-990): the last bucket, reduced when backward ends and gathered first, holds
    the whole input embedding. Llama 3 8B on 16 MI300X, ZeRO-1, 40M-parameter buckets: the last reduce-scatter is the
    embedding table's (525M parameters), not 40M's; the first gather is the table's too. And on a pipeline stage after
    the first Megatron-Core turns bucketing off (distributed_data_parallel.py@d98e8a6 L160-171): Llama 3.1 405B at pp
    16 is priced on a middle stage, whose buckets are one a chunk whatever the rule."""
    spec, hw = _spec("llama-3-8b"), _hw()
    lay = Layout(dp=16, zero=1, micro_batch=1, grad_accum=4, attention="sdpa-fused", compiled=True,
                 grad_bucket="megatron")
    place = placement(lay, hw.gpus_per_node)
    rs, ag, ar, last, first = step._dp_collectives(spec, hw, lay, "zero1", place, "value", None, {})
    timer = comm.GroupTimer(hw, place.dp_per_node)
    wte = {c: size for g, c, size in step.group_sync_buffers(spec, lay) if g == "wte"}
    assert last == pytest.approx(timer.time_s("reduce_scatter", wte["reduce_scatter"], 16), rel=1e-12)
    assert first == pytest.approx(timer.time_s("all_gather", wte["all_gather"], 16), rel=1e-12)
    big = load_model("llama-3.1-405b")
    mid = Layout(dp=2, tp=8, pp=16, zero=1, micro_batch=1, grad_accum=16, attention="sdpa-fused")
    assert step.heaviest_stage(big, mid).index > 0
    place = placement(mid, hw.gpus_per_node)
    rules = [step._dp_collectives(big, hw, replace(mid, grad_bucket=r), "zero1", place, "value", None, {})
             for r in ("megatron", "chunk")]
    assert rules[0] == rules[1]


def test_step_zero2_reduce_scatters_every_micro_batch():
    z1 = run_step("gpt2-124m", gpt2(dp=8, zero=1, grad_accum=8))
    z2 = run_step("gpt2-124m", gpt2(dp=8, zero=2, grad_accum=8))
    assert z2.dp_comm_total_s > z1.dp_comm_total_s
    assert z2.dp_comm_exposed_s >= z1.dp_comm_exposed_s


def test_group_timer_measured_curve_replaces_the_model_never_both():
    """Calibrated: log-log interpolation of measured t(S) (comm.interpolate_time_s), no latency added;
    otherwise the ring model at the tier; nothing for one rank or an empty buffer."""
    hw = _hw()
    pts = {("all_reduce", 8, "intra_node"): [(1e6, 1e-4), (1e8, 1e-3)]}
    assert comm.GroupTimer(hw, 8, "value", pts).time_s("all_reduce", 1e7, 8) == pytest.approx(math.sqrt(1e-4 * 1e-3))
    model = comm.collective_time_s("all_reduce", 1e7, 8, comm.tier_for(hw, "all_reduce", 8))
    assert comm.GroupTimer(hw, 8, "value", None).time_s("all_reduce", 1e7, 8) == pytest.approx(model)
    assert comm.GroupTimer(hw, 8, "value", pts).time_s("reduce_scatter", 1e7, 8) == pytest.approx(
        comm.collective_time_s("reduce_scatter", 1e7, 8, comm.tier_for(hw, "reduce_scatter", 8)))  # no points
    assert comm.GroupTimer(hw, 1, "value", pts).time_s("all_reduce", 1e7, 1) == 0.0
    assert comm.GroupTimer(hw, 8, "value", pts).time_s("all_reduce", 0.0, 8) == 0.0
    # 8 ranks one per node: a single-node measurement says nothing about them
    assert comm.GroupTimer(hw, 1, "value", pts).time_s("all_reduce", 1e7, 8) == pytest.approx(
        comm.collective_time_s("all_reduce", 1e7, 8, comm.tier_for(hw, "all_reduce", 8, per_node=1)))


def test_group_timer_spanning_nodes_uses_the_inter_node_tier():
    """A group with fewer members on a node than it has ranks crosses nodes, on the NICs of its members there."""
    hw = _hw()
    inter = comm.tier_for(hw, "all_reduce", 16)
    assert inter.name == "inter_node"
    assert comm.GroupTimer(hw, 8, "value", None).time_s("all_reduce", 1e9, 16) == pytest.approx(
        comm.collective_time_s("all_reduce", 1e9, 16, inter))
    one_nic = comm.tier_for(hw, "all_reduce", 2, per_node=1)
    assert one_nic.name == "inter_node"
    assert comm.GroupTimer(hw, 1, "value", None).time_s("all_reduce", 1e9, 2) == pytest.approx(
        comm.collective_time_s("all_reduce", 1e9, 2, one_nic))


def test_step_ddp_with_measured_all_reduce_curve():
    """GPT-2 124M DDP on 8 GPUs with a measured all-reduce curve: the total is the curve at 497,759,232 B
    (124,439,808 fp32 grads), above its largest point: t_n + (S - S_n) x slope of the last segment."""
    pts = {("all_reduce", 8, "intra_node"): [(1e6, 1e-4), (1e8, 1e-3)]}
    spec, hw, lay = _spec("gpt2-124m"), _hw(), gpt2(dp=8, zero=0)
    an = _anatomy("gpt2-124m", lay.micro_batch, lay.attention)
    s = step_time(spec, hw, lay, an, rates(hw, lay.attention), comm_points=pts)
    size = 124_439_808 * 4
    assert s.dp_comm_total_s == pytest.approx(1e-3 + (size - 1e8) * 9e-4 / 9.9e7, rel=1e-12)
    assert s.dp_comm_exposed_s <= s.dp_comm_total_s


# --------------------------------------------------------------------------------------------
# properties

GPT2_ATTENTION = ["sdpa-math", "sdpa-fused", "flash-attn-ck"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dp=st.sampled_from([1, 2, 4, 8, 16]), tp=st.sampled_from([1, 2, 3, 4]), pp=st.sampled_from([1, 2, 3, 4]),
       zero=st.integers(0, 3), micro_batch=st.integers(1, 4), grad_accum=st.integers(1, 8),
       recompute=st.sampled_from(["none", "selective", "full"]), attention=st.sampled_from(GPT2_ATTENTION),
       scenario=st.sampled_from(["value", "low", "high"]))
def test_step_at_least_compute_for_random_small_layouts(dp, tp, pp, zero, micro_batch, grad_accum, recompute,
                                                       attention, scenario):
    lay = Layout(dp=dp, tp=tp, pp=pp, zero=zero, micro_batch=micro_batch, grad_accum=grad_accum,
                 attention=attention, recompute=recompute, compiled=True)
    check_layout(lay, _spec("gpt2-124m"))
    s = run_step("gpt2-124m", lay, scenario)
    assert math.isfinite(s.total_s)
    assert s.total_s >= s.compute_s > 0
    assert 0 <= s.dp_comm_exposed_s <= s.dp_comm_total_s * (1 + 1e-12)
    if dp == 1:
        assert s.dp_comm_total_s == 0.0
    if pp == 1:
        assert s.bubble_s == 0.0
    if tp == 1:
        assert s.tp_comm_s == 0.0


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(log_dp=st.integers(0, 8), attention=st.sampled_from(["sdpa-fused", "flash-attn-ck"]))
def test_d24_per_gpu_compute_non_increasing_in_dp_at_fixed_total_batch(log_dp, attention):
    """nanochat-d24's 1,048,576-token batch = 512 sequences of 2048: device batch min(32, 512 / dp),
    accumulation 512 / (dp x device batch). Doubling dp never adds per-GPU compute."""

    def compute(dp):
        mb = min(32, 512 // dp)
        lay = Layout(dp=dp, zero=1, micro_batch=mb, grad_accum=512 // (dp * mb), attention=attention, compiled=True)
        check_layout(lay, _spec("d24"), 1_048_576)
        return run_step("d24", lay).compute_s

    dp = 2**log_dp
    assert compute(2 * dp) <= compute(dp)


def test_full_n_re_runs_its_share_of_the_layers_in_the_step_and_memory():
    """Llama 3 70B on 64 H100s, tp 8, pp 4 x vp 5: full:1 re-runs 20 of the 80 layers (0.25). Every layer is alike, so
    the busiest stage's recompute time is a quarter of full recompute's and its saved activations a quarter of the
    way from none to full; full:4 (every layer of each 4-layer chunk) prices as full."""
    from ddplan.price import Pricer, RunPlan
    from ddplan.specs import Budget

    spec, hw = load_model("llama-3-70b"), load_hardware("h100-sxm")
    pricer = Pricer(spec, hw, RunPlan(Budget(steps=10), hw.price))
    lay = {rc: Layout(dp=2, tp=8, pp=4, pp_virtual_stages=5, pp_schedule="interleaved", zero=1, micro_batch=1, grad_accum=16, attention="fa3",
                      recompute=rc, sequence_parallel=True) for rc in ("none", "full:1", "full:4", "full")}
    window = spec.architecture.window_pattern
    st = {rc: pricer.step(layout, window) for rc, layout in lay.items()}
    rec = {rc: pricer.anatomy(layout, window).full_share for rc, layout in lay.items()}
    assert rec == {"none": 0.0, "full:1": 0.25, "full:4": 1.0, "full": 1.0}
    assert st["full:4"].total_s == pytest.approx(st["full"].total_s, rel=1e-12)
    assert st["none"].total_s < st["full:1"].total_s < st["full"].total_s
    # on one stage (the first: under full recompute the last, with the head, is the fullest, so the layout's peak
    # moves to another stage), and the layout's peak the fullest stage's
    from ddplan.memory import memory_per_gpu, pipeline_stages

    stages = pipeline_stages(lay["none"], spec.architecture)
    mem = {rc: [memory_per_gpu(spec, layout, pricer.anatomy(layout, window), hw.memory.usable_bytes, stage=s)
                for s in stages] for rc, layout in lay.items()}
    saved = {rc: m[0].terms["activations"] for rc, m in mem.items()}
    assert saved["full:1"] == pytest.approx(saved["none"] + 0.25 * (saved["full"] - saved["none"]), rel=1e-3)
    for rc, layout in lay.items():
        assert pricer.memory(layout, window).total == max(m.total for m in mem[rc])
    # the compute of one micro-batch on the busiest stage: forward, backward, and a quarter of full's re-run
    mb = {rc: st[rc].compute_s / st[rc].accum for rc in st}
    assert mb["full:1"] - mb["none"] == pytest.approx(0.25 * (mb["full"] - mb["none"]), rel=1e-9)


def test_unsharded_gradient_sums_by_hand():
    """anatomy.unsharded_grad_sum_bytes (torch _fsdp_param.py): bf16 gradients summed in fp32 over 8: the first cast
    (2 + 4 B), then each of 7 read with the fp32 sum and written back (2 + 4 + 4): 76 B; summed in bf16 by autograd,
    7 x (2 + 2 + 2) = 42 B; one gradient is no sum."""
    from ddplan.anatomy import unsharded_grad_sum_bytes

    assert unsharded_grad_sum_bytes(2, 4, 8) == 76 and unsharded_grad_sum_bytes(2, 2, 8) == 42
    assert unsharded_grad_sum_bytes(2, 2, 1) == 0
    with pytest.raises(ValueError):
        unsharded_grad_sum_bytes(2, 4, 0)


def test_zero_bubble_schedules_move_the_weight_gradients_into_the_bubble():
    """The same layout under 1F1B, ZB-H1, ZB-H2 and ZB-V (pipeline.zero_bubble_time_s): the compute and the sends are
    the same, and the bubbles differ by whole W passes of the busiest stage (p 4, m 8 >= 2p - 1): ZB-H1 takes
    2 (p-1) W off 1F1B's, ZB-H2 3 (p-1) W; W, one micro-batch's weight-gradient GEMMs, is under its backward and
    over a quarter of it (dW and dX each near half of a GEMM's backward, the GEMMs most of it). ZB-V places GPT-2's
    12 layers 3 a stage (pipeline.v_stages), the first stage holding the embeddings and the head with its 3: its
    busiest stage is 1F1B's last (3 layers and the head) and the embeddings' lookup, a little slower; its bubble,
    ZB-H2's closed form on that stage, under ZB-H1's."""
    base = gpt2(dp=1, pp=4, grad_accum=8)
    one, h1, h2 = (run_step("gpt2-124m", replace(base, pp_schedule=s)) for s in ("1f1b", "zb_h1", "zb_h2"))
    assert one.compute_s == h1.compute_s == h2.compute_s
    w = (one.bubble_s - h1.bubble_s) / (2 * 3)
    assert 0.25 * one.bwd_s < w < one.bwd_s
    assert one.bubble_s - h2.bubble_s == pytest.approx(3 * 3 * w)
    v = run_step("gpt2-124m", replace(base, pp_schedule="zb_v", pp_virtual_stages=2))
    assert one.compute_s < v.compute_s < 1.02 * one.compute_s and 0 < v.bubble_s < h1.bubble_s


def test_zb_v_exchanges_run_over_the_stage_with_the_most_moe_blocks():
    """A mixture of experts whose first 12 of 48 blocks are dense (moe.dense_layers 12) over pp 4 under ZB-V
    (pipeline.v_stages: (12, 6), (12, 6), (12, 12), (12, 12)): its expert-parallel exchange runs over 12 MoE blocks a
    micro-batch, as under 1F1B's last stages (0, 12, 12, 12), not the first stage's 6, whichever stage ties on time."""
    from ddplan.registry import load_model

    base = load_model("qwen3-30b-a3b")
    a = base.architecture
    spec = base.model_copy(update={"architecture": a.model_copy(update={"moe": a.moe.model_copy(
        update={"dense_layers": 12})})})
    assert spec.architecture.num_layers == 48 and spec.architecture.moe_layers == 36
    hw = load_hardware("h100-sxm")

    def ep_s(schedule: str, vp: int) -> float:
        lay = Layout(dp=8, pp=4, ep=8, zero=1, micro_batch=1, grad_accum=8, attention="fa3", pp_schedule=schedule,
                     pp_virtual_stages=vp)
        an = build_anatomy(spec, batch=1, attention="flash_package", ep=8)
        return step_time(spec, hw, lay, an, rates(hw, "fa3")).ep_comm_s

    assert ep_s("zb_v", 2) == pytest.approx(ep_s("1f1b", 1)) and ep_s("zb_v", 2) > 0
