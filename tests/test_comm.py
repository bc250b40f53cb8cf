"""ddplan.comm: nccl-tests conventions, ring alpha-beta times, tiers from hardware specs, DDP overlap, TP.

Published numbers: nccl-tests doc/PERFORMANCE.md bus factors; stas00/ml-engineering @744d01e
network/README.md (MI300X RCCL all-reduce busbw 47.7 GB/s on 2 GPUs, 312.9 on 8; 32x H200 over EFA
364.7 GB/s all-reduce busbw), as recorded in /work/shared/reference/hardware.md sec. 2.3.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddplan import comm, units
from ddplan.comm import Tier
from ddplan.registry import builtin_names, load_hardware

COLLECTIVES = ["all_reduce", "reduce_scatter", "all_gather"]
T8 = Tier("intra_node", 312.9e9, 8e-6)  # 8x MI300X ring all-reduce busbw, alpha 8 us


@pytest.fixture(scope="module")
def mi300x():
    return load_hardware("mi300x")


@pytest.fixture(scope="module")
def h200():
    return load_hardware("h200")


# --------------------------------------------------------------------------------------------
# nccl-tests conventions


def test_bus_factor_nccl_tests_performance_md():
    """nccl-tests doc/PERFORMANCE.md: all-reduce 2(n-1)/n, reduce-scatter and all-gather (n-1)/n."""
    assert comm.bus_factor("all_reduce", 8) == pytest.approx(1.75)
    assert comm.bus_factor("reduce_scatter", 8) == pytest.approx(0.875)
    assert comm.bus_factor("all_gather", 8) == pytest.approx(0.875)
    assert comm.bus_factor("all_reduce", 2) == pytest.approx(1.0)
    assert comm.bus_factor("all_gather", 4) == pytest.approx(0.75)
    for c in COLLECTIVES:
        assert comm.bus_factor(c, 1) == 0.0


def test_ring_latency_steps():
    """Ring all-reduce: 2(n-1) steps (Patarasuk & Yuan 2009); ring RS/AG: n-1 (Thakur et al. 2005)."""
    assert comm.ring_latency_steps("all_reduce", 8) == 14
    assert comm.ring_latency_steps("reduce_scatter", 8) == 7
    assert comm.ring_latency_steps("all_gather", 32) == 31
    assert comm.ring_latency_steps("all_reduce", 1) == 0


def test_busbw_algbw_roundtrip_hand():
    """algbw 100 GB/s on 8 ranks: busbw 175 GB/s; busbw 312.9 -> algbw 178.8 GB/s."""
    assert comm.busbw_from_algbw("all_reduce", 100e9, 8) == pytest.approx(175e9)
    assert comm.algbw_from_busbw("all_reduce", 312.9e9, 8) == pytest.approx(178.8e9)
    assert comm.algbw_from_busbw("all_gather", 87.5e9, 8) == pytest.approx(100e9)


def test_busbw_from_time_hand():
    """4 GiB all-reduce on 8 ranks in 24 ms: 4 x 2**30 / 0.024 x 1.75 = 313.17 GB/s (docstring case)."""
    assert comm.busbw_from_time("all_reduce", 4 * units.GiB, 8, 0.024) == pytest.approx(313.1747e9, rel=1e-6)


def test_bytes_per_rank_hand():
    assert comm.bytes_per_rank("all_reduce", 1e9, 8) == pytest.approx(1.75e9)
    assert comm.bytes_per_rank("reduce_scatter", 1e9, 4) == pytest.approx(0.75e9)


@given(n=st.integers(2, 100_000), size=st.floats(1.0, 1e13))
def test_allreduce_bytes_per_rank_between_s_and_2s(n, size):
    """STYLE.md property: S <= all-reduce bytes per rank < 2S for n >= 2."""
    moved = comm.bytes_per_rank("all_reduce", size, n)
    assert size * (1 - 1e-12) <= moved < 2 * size


@given(c=st.sampled_from(COLLECTIVES), n=st.integers(2, 4096), algbw=st.floats(1e6, 1e13))
def test_busbw_algbw_inverse(c, n, algbw):
    assert comm.algbw_from_busbw(c, comm.busbw_from_algbw(c, algbw, n), n) == pytest.approx(algbw, rel=1e-12)


@pytest.mark.parametrize("call, names", [
    (lambda: comm.bus_factor("all_to_all", 8), ["all_to_all"]),
    (lambda: comm.bus_factor("all_reduce", 0), ["n=0"]),
    (lambda: comm.bus_factor("all_reduce", 2.5), ["n=2.5"]),
    (lambda: comm.algbw_from_busbw("all_reduce", 1e9, 1), ["n=1"]),
    (lambda: comm.busbw_from_time("all_reduce", 1e9, 8, 0.0), ["time_s=0.0"]),
    (lambda: comm.bytes_per_rank("all_reduce", -1.0, 8), ["size_bytes=-1.0"]),
    (lambda: Tier("intra_node", 0.0, 1e-6), ["busbw_bytes_per_s=0.0"]),
    (lambda: Tier("nvlink", 1e9, 1e-6), ["nvlink"]),
    (lambda: Tier("inter_node", 1e9, -1.0), ["latency_s=-1.0"]),
])
def test_impossible_input_names_values(call, names):
    with pytest.raises(ValueError) as e:
        call()
    for name in names:
        assert name in str(e.value)


# --------------------------------------------------------------------------------------------
# Times


def test_collective_time_hand():
    """1 GB all-reduce on 8 GPUs at 312.9 GB/s busbw, alpha 8 us: 14 x 8e-6 + 1e9 x 1.75 / 312.9e9."""
    t = comm.collective_time_s("all_reduce", 1e9, 8, T8)
    assert t == pytest.approx(1.12e-4 + 5.592841e-3, rel=1e-6)
    assert t == pytest.approx(5.704841e-3, rel=1e-6)
    # all-gather of the same buffer: 7 x 8e-6 + 1e9 x 0.875 / 312.9e9
    assert comm.collective_time_s("all_gather", 1e9, 8, T8) == pytest.approx(5.6e-5 + 2.796421e-3, rel=1e-6)


def test_collective_time_zero_cases():
    assert comm.collective_time_s("all_reduce", 1e9, 1, T8) == 0.0
    assert comm.collective_time_s("all_reduce", 0.0, 8, T8) == 0.0


@given(c=st.sampled_from(COLLECTIVES), n=st.integers(1, 1024),
       a=st.floats(0, 1e12), b=st.floats(0, 1e12))
def test_collective_time_non_decreasing_in_size(c, n, a, b):
    lo, hi = sorted((a, b))
    assert comm.collective_time_s(c, lo, n, T8) <= comm.collective_time_s(c, hi, n, T8)


def test_interpolate_hits_points_and_hand_cases():
    """Docstring cases: log-log midpoint sqrt(1e-4 x 1e-3); beyond the largest at the marginal bandwidth."""
    pts = [(1e8, 1e-3), (1e6, 1e-4)]  # unsorted on purpose
    assert comm.interpolate_time_s(pts, 1e6) == 1e-4
    assert comm.interpolate_time_s(pts, 1e8) == 1e-3
    assert comm.interpolate_time_s(pts, 1e7) == pytest.approx(math.sqrt(1e-4 * 1e-3), rel=1e-12)
    assert comm.interpolate_time_s(pts, 2e8) == pytest.approx(1e-3 + 1e8 * 9e-4 / 9.9e7, rel=1e-12)
    assert comm.interpolate_time_s(pts, 1e3) == 1e-4  # latency floor
    assert comm.interpolate_time_s(pts, 0.0) == 0.0
    assert comm.interpolate_time_s([(1e6, 1e-4)], 4e6) == pytest.approx(4e-4)  # one point: its algbw


def test_interpolate_recovers_alpha_beta_beyond_largest():
    """On an exact alpha-beta curve the extrapolation reproduces it: the slope is 1/busbw x factor."""
    sizes = [2**k for k in range(20, 31, 2)]
    pts = [(s, comm.collective_time_s("all_reduce", s, 8, T8)) for s in sizes]
    assert comm.interpolate_time_s(pts, 8 * units.GiB) == pytest.approx(
        comm.collective_time_s("all_reduce", 8 * units.GiB, 8, T8), rel=1e-9)


def test_interpolate_errors():
    with pytest.raises(ValueError, match="none"):
        comm.interpolate_time_s([], 1e6)
    with pytest.raises(ValueError, match="point_time_s=0.0"):
        comm.interpolate_time_s([(1e6, 0.0)], 1e6)
    with pytest.raises(ValueError, match="repeat sizes"):
        comm.interpolate_time_s([(1e6, 1e-4), (1e6, 2e-4)], 1e6)


monotone_points = st.lists(
    st.tuples(st.floats(1e3, 1e11), st.floats(1e-6, 1.0)), min_size=1, max_size=8,
    unique_by=lambda p: p[0],
).map(lambda pts: list(zip(sorted(s for s, _ in pts), sorted(t for _, t in pts))))


@given(pts=monotone_points)
def test_interpolate_hits_every_point(pts):
    for s, t in pts:
        assert comm.interpolate_time_s(pts, s) == pytest.approx(t, rel=1e-12)


@given(pts=monotone_points, a=st.floats(0, 1e12), b=st.floats(0, 1e12))
def test_interpolate_monotone_for_monotone_input(pts, a, b):
    lo, hi = sorted((a, b))
    assert comm.interpolate_time_s(pts, lo) <= comm.interpolate_time_s(pts, hi) * (1 + 1e-12)


# --------------------------------------------------------------------------------------------
# Tiers from hardware specs


def test_mi300x_pair_vs_node_busbw(mi300x):
    """stas00 network/README.md: MI300X RCCL all-reduce 47.7 GB/s busbw on 2 GPUs, 312.9 on 8."""
    pair = comm.tier_for(mi300x, "all_reduce", 2)
    node = comm.tier_for(mi300x, "all_reduce", 8)
    assert pair.name == "intra_node"
    assert pair.busbw_bytes_per_s == pytest.approx(47.7e9)
    assert pair.latency_s == pytest.approx(5e-6)
    assert node.busbw_bytes_per_s == pytest.approx(312.9e9)
    # a 1 GB all-reduce on the pair is ~6.6x slower per byte of S than on the node
    t2 = comm.collective_time_s("all_reduce", 1e9, 2, pair)
    t8 = comm.collective_time_s("all_reduce", 1e9, 8, node)
    assert t2 == pytest.approx(2 * 5e-6 + 1e9 * 1.0 / 47.7e9)
    assert t2 > 3 * t8


def test_intra_between_listed_sizes_uses_size_below(mi300x):
    """Group sizes in between take the nearest listed size at or below (specs.IntraNode)."""
    assert comm.tier_for(mi300x, "all_reduce", 3).busbw_bytes_per_s == pytest.approx(47.7e9)
    assert comm.tier_for(mi300x, "all_reduce", 7).busbw_bytes_per_s == pytest.approx(134.1e9)
    assert comm.tier_for(mi300x, "reduce_scatter", 8).busbw_bytes_per_s == pytest.approx(309.8e9)


def _with_only_size_8(hw, topology):
    busbw = {c: {8: pts[8]} for c, pts in hw.intra_node.busbw_gbyte_per_s.items()}
    intra = hw.intra_node.model_copy(update={"busbw_gbyte_per_s": busbw, "topology": topology})
    return hw.model_copy(update={"intra_node": intra})


def test_below_smallest_size_scales_on_mesh_only(mi300x):
    """A 2-GPU group on a full mesh owns 1 of 7 links: 312.9 x 1/7 = 44.7 GB/s (measured: 47.7)."""
    mesh = _with_only_size_8(mi300x, "full_mesh")
    assert comm.tier_for(mesh, "all_reduce", 2).busbw_bytes_per_s == pytest.approx(312.9e9 / 7)
    assert comm.tier_for(mesh, "all_reduce", 4).busbw_bytes_per_s == pytest.approx(312.9e9 * 3 / 7)
    assert comm.tier_for(mesh, "all_reduce", 1).busbw_bytes_per_s == pytest.approx(312.9e9)
    switch = _with_only_size_8(mi300x, "switch")
    assert comm.tier_for(switch, "all_reduce", 2).busbw_bytes_per_s == pytest.approx(312.9e9)


def test_h200_32_ranks_bounded_by_node_nics(h200):
    """stas00 network/README.md: 32x H200 (4 nodes) over EFA, 4 GiB all-reduce 364.7 GB/s busbw (Ring),
    under the node's 8 x 400 Gb/s = 400 GB/s of NICs; the tier gives 400 GB/s x 0.91."""
    assert h200.inter_node.node_bytes_per_s == pytest.approx(400e9)
    tier = comm.tier_for(h200, "all_reduce", 32)
    assert tier.name == "inter_node"
    assert tier.busbw_bytes_per_s == pytest.approx(400e9 * 0.91)
    assert tier.busbw_bytes_per_s == pytest.approx(364.7e9, rel=0.01)
    assert tier.busbw_bytes_per_s < comm.tier_for(h200, "all_reduce", 8).busbw_bytes_per_s  # NVLS 480
    assert tier.latency_s == pytest.approx(10e-6)
    low = comm.tier_for(h200, "all_reduce", 32, efficiency="low")
    high = comm.tier_for(h200, "all_reduce", 32, efficiency="high")
    assert low.busbw_bytes_per_s == pytest.approx(320e9)
    # high: 0.95 x 400 = 380, but a ring also cannot beat the intra-node ring all-gather (361.4)
    assert high.busbw_bytes_per_s == pytest.approx(380e9)
    assert comm.tier_for(h200, "all_gather", 32, efficiency="high").busbw_bytes_per_s == pytest.approx(361.4e9)


def test_inter_node_starts_above_gpus_per_node(h200):
    assert comm.tier_for(h200, "all_reduce", 8).name == "intra_node"
    assert comm.tier_for(h200, "all_reduce", 9).name == "inter_node"


def test_tier_for_rejects_bad_efficiency(h200):
    with pytest.raises(ValueError, match="'middle'"):
        comm.tier_for(h200, "all_reduce", 16, efficiency="middle")


@pytest.mark.parametrize("name", ["mi300x", "h200", "h100-sxm", "a100-sxm-80gb", "b200"])
@given(n=st.integers(1, 4096), c=st.sampled_from(COLLECTIVES))
def test_every_spec_gives_a_positive_tier(name, n, c):
    hw = load_hardware(name)
    tier = comm.tier_for(hw, c, n)
    lo = comm.tier_for(hw, c, n, efficiency="low").busbw_bytes_per_s
    hi = comm.tier_for(hw, c, n, efficiency="high").busbw_bytes_per_s
    assert 0 < lo <= tier.busbw_bytes_per_s <= hi


# --------------------------------------------------------------------------------------------
# DDP overlap


def test_ddp_exposed_hand():
    """1 GB grads, 25 MB buckets, 8 GPUs at 312.9 GB/s, 8 us, 3 ms of backward to hide behind:
    max(5.7048e-3 - 3e-3, 1.12e-4 + 25e6 x 1.75 / 312.9e9) = 2.7048e-3 s."""
    assert comm.ddp_exposed_s(1e9, 25e6, 8, T8, 3e-3) == pytest.approx(5.704841e-3 - 3e-3, rel=1e-6)


def test_ddp_last_bucket_always_exposed():
    """A long backward hides everything except the last bucket: 1.12e-4 + 25e6 x 1.75 / 312.9e9."""
    assert comm.ddp_exposed_s(1e9, 25e6, 8, T8, 10.0) == pytest.approx(2.518210e-4, rel=1e-6)
    # gradients smaller than one bucket: the whole all-reduce is the last bucket
    assert comm.ddp_exposed_s(1e6, 25e6, 8, T8, 10.0) == pytest.approx(
        comm.collective_time_s("all_reduce", 1e6, 8, T8))
    assert comm.ddp_exposed_s(1e9, 25e6, 1, T8, 0.0) == 0.0
    assert comm.DDP_DEFAULT_BUCKET_BYTES == 25 * 2**20


@given(grad=st.floats(1, 1e11), bucket=st.floats(1, 1e9), window=st.floats(0, 10), n=st.integers(2, 512))
def test_ddp_exposed_bounds(grad, bucket, window, n):
    exposed = comm.ddp_exposed_s(grad, bucket, n, T8, window)
    total = comm.collective_time_s("all_reduce", grad, n, T8)
    assert 0 < exposed <= total * (1 + 1e-12)


def test_ddp_rejects_bad_bucket():
    with pytest.raises(ValueError, match="bucket_bytes=0"):
        comm.ddp_exposed_s(1e9, 0, 8, T8, 0.0)


# --------------------------------------------------------------------------------------------
# Tensor parallelism


def test_tp_bytes_hand():
    """Megatron TP (Shoeybi et al. 1909.08053 sec. 3): 2 all-reduces of b s h fwd + 2 bwd per layer.
    b=1, s=2048, h=4096, bf16: one buffer 16,777,216 B; per layer 4x."""
    assert comm.tp_allreduce_size_bytes(1, 2048, 4096, 2) == 16_777_216
    assert comm.tp_allreduce_bytes_per_layer(1, 2048, 4096, 2) == 4 * 16_777_216


def test_tp_time_hand():
    """tp=8 at 312.9 GB/s, 8 us: each way 2 x (1.12e-4 + 16,777,216 x 1.75 / 312.9e9) = 4.1166e-4 s."""
    fwd, bwd = comm.tp_comm_time_per_layer_s(1, 2048, 4096, 2, 8, T8)
    assert fwd == pytest.approx(4.116646e-4, rel=1e-6)
    assert bwd == fwd
    assert comm.tp_comm_time_per_layer_s(1, 2048, 4096, 2, 1, T8) == (0.0, 0.0)


def test_tp_rejects_bad_shape():
    with pytest.raises(ValueError, match="seq=0"):
        comm.tp_allreduce_bytes_per_layer(1, 0, 4096, 2)


# --------------------------------------------------------------------------------------------
# sharded data parallelism: exposure from the collectives' times (the docstrings' hand examples)


def test_zero1_by_hand():
    """rs 30 ms, ag 20 ms, last bucket 1 ms, backward 100 ms: rs hides under backward except the last
    bucket; the all-gather after the step is exposed: total 50 ms, exposed 21 ms."""
    assert comm.zero1_comm_s(0.030, 0.020, 0.001, 0.100) == pytest.approx((0.050, 0.021))
    # backward shorter than the reduce-scatter: the rest shows
    assert comm.zero1_comm_s(0.030, 0.020, 0.001, 0.010) == pytest.approx((0.050, 0.040))


def test_zero2_reduce_scatters_every_micro_batch_by_hand():
    """accum 4: total 4 x 30 + 20 = 140 ms; exposed 4 x max(30 - 100, 1) + 20 = 24 ms."""
    assert comm.zero2_comm_s(0.030, 0.020, 0.001, 0.100, 4) == pytest.approx((0.140, 0.024))
    assert comm.zero2_comm_s(0.030, 0.020, 0.001, 0.100, 1) == pytest.approx(comm.zero1_comm_s(0.030, 0.020, 0.001,
                                                                                              0.100))


def test_fsdp_by_hand():
    """2 ag + rs = 70 ms per micro-batch against 50 ms of compute: 20 ms shows, plus the first of 10 units'
    gathers (2 x 20 / 10 = 4 ms): accum 2 -> total 140 ms, exposed 48 ms."""
    assert comm.fsdp_comm_s(0.030, 0.020, 0.050, 2, 10) == pytest.approx((0.140, 0.048))
    # fully hidden under a long micro-batch: only the first gather of each pass remains
    assert comm.fsdp_comm_s(0.030, 0.020, 1.0, 1, 10)[1] == pytest.approx(0.004)


@pytest.mark.parametrize("fn, args", [(comm.zero1_comm_s, (-1.0, 0.0, 0.0, 0.0)),
                                      (comm.zero2_comm_s, (0.0, 0.0, 0.0, 0.0, 0)),
                                      (comm.fsdp_comm_s, (0.0, 0.0, 0.0, 1, 0))])
def test_sharded_comm_refuses_impossible_input(fn, args):
    with pytest.raises(ValueError):
        fn(*args)


def test_tier_time_is_the_alpha_beta_model():
    """Tier.time_s is collective_time_s: the timer ddp_exposed_s and tp_comm_time_per_layer_s take."""
    assert T8.time_s("all_reduce", 1e9, 8) == comm.collective_time_s("all_reduce", 1e9, 8, T8)


def test_tp_overlap_exposed_by_hand():
    """Megatron --tp-comm-overlap: communication hides under the layers' GEMMs; only the excess is exposed."""
    assert comm.tp_overlap_exposed_s(0.4, 1.9) == 0.0
    assert comm.tp_overlap_exposed_s(2.0, 1.5) == pytest.approx(0.5)
    assert comm.tp_overlap_exposed_s(0.0, 0.0) == 0.0
    with pytest.raises(ValueError):
        comm.tp_overlap_exposed_s(-1.0, 1.0)


def test_overlap_cost_by_hand_and_published():
    """comm.overlap_cost_s: (1 - kept) x the hidden time. Lee et al. (arXiv 2507.03114) measured compute 18.9% slower
    while communication overlapped it: kept = 1 / 1.189 = 0.841, so 100 ms hidden costs 15.9 ms (the docstring's
    example); at their worst, 40.0% slower, 100 ms costs 1 - 1 / 1.40 = 28.6 ms; kept 1 costs nothing."""
    assert comm.overlap_cost_s(0.100, 0.841) == pytest.approx(0.0159, rel=1e-9)
    assert comm.overlap_cost_s(0.100, 1 / 1.189) == pytest.approx(0.100 * 0.189 / 1.189, rel=1e-12)
    assert comm.overlap_cost_s(0.100, 1 / 1.40) == pytest.approx(0.02857, rel=1e-3)
    assert comm.overlap_cost_s(0.100, 1.0) == 0.0 and comm.overlap_cost_s(0.0, 0.841) == 0.0
    # collectives longer than the compute (H > C): the pair ends at max(H, C + (1 - kept) H), so it grows only by
    # max(0, C - kept x H). 379 ms beside 240 ms: 240 - 0.841 x 379 < 0, nothing; 320 ms beside 300 ms: 300 -
    # 0.841 x 320 = 30.88 ms, the formula's (1 - 0.841) x 300 - 0.841 x 20
    assert comm.overlap_cost_s(0.240, 0.841, outlasting_s=0.139) == 0.0
    assert comm.overlap_cost_s(0.300, 0.841, outlasting_s=0.020) == pytest.approx(0.300 - 0.841 * 0.320, rel=1e-12)
    assert 0.300 - 0.841 * 0.320 == pytest.approx(0.03088, rel=1e-9)
    for bad in ((-0.1, 0.841), (0.1, 0.0), (0.1, 1.2)):
        with pytest.raises(ValueError):
            comm.overlap_cost_s(*bad)


def test_collectives_that_outlast_the_compute_cost_nothing_more():
    """The review's case: Llama 3 8B on 512 A100s at ZeRO-3, one 1,024-token sequence a GPU: 0.379 s of collectives
    beside 0.24 s of compute. The slowed compute (0.24 / 0.841 = 0.29 s) still ends inside the collectives, so the
    step is what it is with overlap free (it was 9.6% longer when the whole hidden part was charged)."""
    from ddplan.layout import Layout
    from ddplan.price import Pricer, RunPlan
    from ddplan.registry import load_model

    spec, hw = load_model("llama-3-8b"), load_hardware("a100-sxm-80gb")
    spec = spec.model_copy(update={"recipe": spec.recipe.model_copy(update={"seq_len": 1024,
                                                                            "total_batch_tokens": 524288})})
    free = hw.model_copy(update={"efficiency": hw.efficiency.model_copy(update={"overlapped_compute": None})})
    lay = Layout(dp=512, zero=3, micro_batch=1, grad_accum=1, attention="fa2")
    slowed, alone = (Pricer(spec, h, RunPlan(spec.recipe.budget, h.price)).price(lay).step for h in (hw, free))
    assert slowed.dp_comm_total_s > slowed.compute_s / 0.841  # the collectives outlast even the slowed compute
    assert slowed.total_s == pytest.approx(alone.total_s, rel=1e-12)


def test_every_gpu_spec_states_the_published_overlap_slowdown():
    """Each shipped GPU spec takes Lee et al.'s average (0.841, 1 / 1.189) with their worst (0.714, 1 / 1.40) and no
    slowdown (1) as its range; the CPU spec calibrate writes has no collectives beside its compute and states none."""
    for name in builtin_names("hardware"):
        e = load_hardware(name).efficiency.overlapped_compute
        assert e is not None and (e.value, e.low, e.high) == (0.841, 0.714, 1.0) and "2507.03114" in e.source, name


def test_a_spec_without_overlapped_compute_hides_communication_for_free():
    """Efficiencies.overlapped_compute None: the hidden part of a collective costs nothing (the model before it was
    priced); with the spec's 0.841 the exposed term grows by exactly (1 - 0.841) x the hidden part."""
    from ddplan.layout import Layout
    from ddplan.price import Pricer, RunPlan
    from ddplan.registry import load_model

    spec, hw = load_model("llama-3-8b"), load_hardware("h100-sxm")
    free = hw.model_copy(update={"efficiency": hw.efficiency.model_copy(update={"overlapped_compute": None})})
    lay = Layout(dp=16, zero=1, micro_batch=1, grad_accum=4, attention="fa3")
    steps = [Pricer(spec, h, RunPlan(spec.recipe.budget, h.price)).price(lay).step for h in (free, hw)]
    hidden = steps[0].dp_comm_total_s - steps[0].dp_comm_exposed_s
    assert hidden > 0 and steps[0].dp_comm_total_s == pytest.approx(steps[1].dp_comm_total_s, rel=1e-12)
    assert steps[1].dp_comm_exposed_s == pytest.approx(steps[0].dp_comm_exposed_s + (1 - 0.841) * hidden, rel=1e-9)
    assert steps[1].compute_s == pytest.approx(steps[0].compute_s, rel=1e-12)


def test_tp_comm_with_sequence_parallelism_is_reduce_scatter_plus_all_gather():
    """Sequence parallelism: each all-reduce of b s h becomes a reduce-scatter and an all-gather of the same
    buffer; on one ring tier (alpha 8 us, busbw 312.9 GB/s) that is (n-1) alpha + (n-1)/n S / busbw twice,
    the all-reduce's 2(n-1) alpha + 2(n-1)/n S / busbw exactly."""
    tier = Tier("intra_node", 312.9e9, 8e-6)
    sp = comm.tp_comm_time_per_layer_s(1, 2048, 4096, 2, 8, tier, sequence_parallel=True)
    ar = comm.tp_comm_time_per_layer_s(1, 2048, 4096, 2, 8, tier)
    size = 2048 * 4096 * 2
    one = 2 * (7 * 8e-6 + 7 / 8 * size / 312.9e9)
    assert sp[0] == pytest.approx(2 * one) and sp == pytest.approx(ar)


def test_reduce_scatter_across_nodes_pays_the_ring_s_latency_by_hand():
    """comm.ring_latency_s, NCCL's cost model (src/graph/tuning.cc@5067397c L411-432). 256 ranks, 8 a node (32
    nodes), alpha 10 us across and 4 us inside: a reduce-scatter's ring crosses the network on 31 of its 255 steps,
    31 x 10 + 224 x 4 = 1,206 us; all-reduce's tree, 2 (7 x 4 + log2 32 x 10) = 156 us, is shorter than its ring
    (2,412); inside a node every step is the node's alpha (7 x 4 us over 8 ranks); one rank a node, PAT: log2 256 x
    10 / 3.5 + 2.8 x 256 = 739.66 us, shorter than the ring's 255 x 10. The busbw an all-gather of a fixed size
    reaches then falls as nodes are added, as NVIDIA/nccl#1229 measured on H100 (360, 345, 320, 300, 280, 260 GB/s
    at 4 to 128 nodes)."""
    tier = Tier("inter_node", 364e9, 10e-6, per_node=8, intra_latency_s=4e-6)
    assert comm.ring_latency_s("reduce_scatter", 256, tier) == pytest.approx(31 * 10e-6 + 224 * 4e-6, rel=1e-12)
    assert comm.ring_latency_s("all_gather", 256, tier) == pytest.approx(1206e-6, rel=1e-12)
    assert comm.ring_latency_s("all_reduce", 256, tier) == pytest.approx(156e-6, rel=1e-12)
    assert comm.ring_latency_s("all_gather", 8, Tier("intra_node", 450e9, 4e-6)) == pytest.approx(28e-6, rel=1e-12)
    # without per_node every step is a network step (255 x 10 us); one rank a node runs PAT where shorter
    assert comm.ring_latency_s("all_gather", 256, Tier("inter_node", 364e9, 10e-6)) == pytest.approx(2550e-6)
    one = Tier("inter_node", 45e9, 10e-6, per_node=1, intra_latency_s=4e-6)
    assert comm.ring_latency_s("reduce_scatter", 256, one) == pytest.approx(8 * 10e-6 / 3.5 + 2.8e-6 * 256, rel=1e-12)
    size = 2**30  # 1 GiB gathered: busbw = S (n-1)/n / t
    busbw = [size * (n - 1) / n / comm.collective_time_s("all_gather", size, n, tier) for n in (32, 64, 128, 256, 512)]
    assert all(a > b for a, b in zip(busbw, busbw[1:])) and busbw[0] < 364e9


def test_split_time_s_pays_one_latency_a_call_by_hand():
    """comm.split_time_s: 1 GB in 32 equal calls over 256 ranks (8 a node, alpha 10 us across and 4 us inside: 1,206
    us a reduce-scatter, test above) at 300 GB/s busbw: 32 x 1,206 us + 1e9 x 255/256 / 300e9 s = 41.91 ms, against
    1,206 us + 3.32 ms as one call; nothing sent costs nothing; calls must be a positive integer."""
    tier = Tier("inter_node", 300e9, 10e-6, per_node=8, intra_latency_s=4e-6)
    one = comm.collective_time_s("reduce_scatter", 1e9, 256, tier)
    split = comm.split_time_s(tier.time_s, "reduce_scatter", 1e9, 256, 32)
    assert one == pytest.approx(1206e-6 + 1e9 * 255 / 256 / 300e9, rel=1e-12)
    assert split == pytest.approx(32 * 1206e-6 + 1e9 * 255 / 256 / 300e9, rel=1e-12)
    assert comm.split_time_s(tier.time_s, "reduce_scatter", 1e9, 256, 1) == pytest.approx(one, rel=1e-12)
    assert comm.split_time_s(tier.time_s, "all_gather", 0.0, 256, 32) == 0.0
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="calls"):
            comm.split_time_s(tier.time_s, "all_gather", 1e9, 256, bad)


def test_grad_buckets_as_megatron_core_buckets_by_hand():
    """comm.grad_buckets (Megatron-Core's DDP buckets, training.py@d98e8a6 L2179-2194, L2504-2515): the first chunk in
    buckets of B, each later chunk one bucket. "megatron" at dp x cp 256: B = max(4e7, 256 x 1e6) = 2.56e8, so 8.03e9
    parameters take ceil(31.37) = 32 calls, the last 2.56e8; at 8 ranks the 4e7 floor: 201 calls. 4e9 in buckets of
    7.68e8: 6 calls (5.2 rounded up), the last 7.68e8. "chunk" with 8 chunks of a 1e9 stage: 8 calls, the last 1.25e8;
    buckets of 1e8 over the same 8 chunks: ceil(1.25) = 2 for the first + 7 = 9 calls, the last 1e8."""
    assert comm.grad_buckets("megatron", 8.03e9, 256) == (32, 2.56e8)
    assert comm.grad_buckets("megatron", 8.03e9, 8) == (201, 4e7)
    assert comm.grad_buckets("768000000", 4e9, 64) == (6, 7.68e8)
    assert comm.grad_buckets("chunk", 1e9, 64, chunks=8) == (8, 1.25e8)
    assert comm.grad_buckets("100000000", 1e9, 64, chunks=8) == (9, 1e8)
    assert comm.grad_buckets("chunk", 1e9, 64) == (1, 1e9)
    for rule, params, ranks, chunks in (("bogus", 1e9, 8, 1), ("", 1e9, 8, 1), ("megatron", 0.0, 8, 1),
                                        ("megatron", 1e9, 0, 1), ("megatron", 1e9, 8, 0)):
        with pytest.raises(ValueError):
            comm.grad_buckets(rule, params, ranks, chunks)


def test_bucketed_exposed_s_by_hand():
    """What outlasts the backward beside it, at least the last bucket: 30 ms beside 25 ms, last 2 ms: 5 ms; beside
    100 ms: 2 ms."""
    assert comm.bucketed_exposed_s(30e-3, 2e-3, 25e-3) == pytest.approx(5e-3)
    assert comm.bucketed_exposed_s(30e-3, 2e-3, 100e-3) == pytest.approx(2e-3)
