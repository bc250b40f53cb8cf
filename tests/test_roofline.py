"""ddplan.roofline: the GEMM shape curve, the roofline, per-op times, attention FLOP convention, rates.

Hand cases use hardware/mi300x.yaml: dense bf16 peak 1307.4 TFLOP/s, HBM 5.3 TB/s at efficiency
0.775, GEMM best 0.511 (MAMF, stas00/ml-engineering @744d01e), half_dim 256 (assumed), kernel
overhead 8 us (assumed).
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddplan.anatomy import attention_pairs, build_anatomy
from ddplan.registry import builtin_names, load_hardware, load_model
from ddplan.roofline import (
    FLASH_SEQ_HALF,
    GROUPED_GEMM_STREAMS,
    SCENARIOS,
    best_gemm,
    attention_efficiency_flops,
    attention_seq_factor,
    gemm_efficiency,
    gemm_fraction,
    grouped_call_waves,
    micro_batch_time,
    op_time_s,
    pointwise_rate,
    rates,
    roofline_s,
    wgrad_share,
)

IMPL_OF_KIND = {"sdpa_math": "sdpa-math", "unfused_math": "megatron-unfused", "fused_sdpa": "sdpa-fused",
                "flash_package": "flash-attn-ck"}
dims = st.integers(min_value=1, max_value=1 << 20)


@pytest.fixture(scope="module")
def mi300x():
    return load_hardware("mi300x")


@lru_cache(maxsize=None)
def d24_anatomy(kind: str, recompute: str = "none", batch: int = 32, compiled: bool = True):
    hw = load_hardware("mi300x")
    impl = hw.attention_impl(IMPL_OF_KIND[kind])
    return build_anatomy(load_model("d24"), batch=batch, attention=impl.kind, windows=impl.windows,
                         recompute=recompute, compiled=compiled)


def op_named(anatomy, name):
    return next(op for op in anatomy.ops if op.name == name)


# --------------------------------------------------------------------------------------------
# gemm_efficiency


def test_gemm_efficiency_mi300x_c_q_shape_by_hand():
    """nanochat d24 c_q at micro-batch 32: (65536 x 1536) @ (1536 x 1536) on MI300X.

    best x prod d/(d + 256) = 0.511 x 65536/65792 x (1536/1792)^2
                            = 0.511 x 256/257 x (6/7)^2 = 0.511 x 0.996109 x 0.734694 = 0.373968
    """
    eff = gemm_efficiency(65536, 1536, 1536, best=0.511, half_dim=256)
    assert eff == pytest.approx(0.511 * 256 / 257 * 36 / 49, rel=1e-12)
    assert eff == pytest.approx(0.373968, abs=1e-6)


def test_gemm_efficiency_each_dim_at_half_dim_halves():
    """A dimension equal to half_dim halves the efficiency; all three at half_dim give best / 8."""
    assert gemm_efficiency(256, 256, 256, best=0.8, half_dim=256) == pytest.approx(0.1)
    huge = 10**12
    assert gemm_efficiency(256, huge, huge, best=0.8, half_dim=256) == pytest.approx(0.4, rel=1e-9)


@given(m=dims, n=dims, k=dims)
def test_gemm_efficiency_symmetric_in_m_n_k(m, n, k):
    ref = gemm_efficiency(m, n, k, 0.511, 256)
    for perm in ((m, k, n), (n, m, k), (n, k, m), (k, m, n), (k, n, m)):
        assert gemm_efficiency(*perm, 0.511, 256) == pytest.approx(ref, rel=1e-12)


@given(m=dims, n=dims, k=dims, which=st.integers(0, 2), grow=st.integers(1, 1 << 20))
def test_gemm_efficiency_monotone_non_decreasing_in_each_dim(m, n, k, which, grow):
    shape = [m, n, k]
    bigger = list(shape)
    bigger[which] += grow
    assert gemm_efficiency(*bigger, 0.511, 256) >= gemm_efficiency(*shape, 0.511, 256)


@given(best=st.floats(0.05, 1.0), half=st.floats(1.0, 4096.0))
def test_gemm_efficiency_bounded_by_best_and_tends_to_it(best, half):
    assert 0 < gemm_efficiency(1, 1, 1, best, half) < best
    big = 10**15
    assert gemm_efficiency(big, big, big, best, half) == pytest.approx(best, rel=1e-9)


@pytest.mark.parametrize("shape", [(0, 1, 1), (1, 0, 1), (1, 1, 0), (-5, 10, 10)])
def test_gemm_efficiency_rejects_non_positive_dims(shape):
    with pytest.raises(ValueError, match="positive"):
        gemm_efficiency(*shape, best=0.5, half_dim=256)


@pytest.mark.parametrize("best, half", [(0.0, 256), (-0.1, 256), (0.5, 0.0)])
def test_gemm_efficiency_rejects_non_positive_parameters(best, half):
    with pytest.raises(ValueError):
        gemm_efficiency(10, 10, 10, best=best, half_dim=half)


# --------------------------------------------------------------------------------------------
# roofline_s


def test_roofline_compute_bound_and_memory_bound_by_hand():
    # 1e12 FLOPs at 1e15 FLOP/s = 1 ms; 1e9 bytes at 4e12 B/s = 0.25 ms -> compute bound
    assert roofline_s(1e12, 1e9, 1e15, 4e12) == pytest.approx(1e-3)
    # 1e9 FLOPs = 1 us; 4e9 bytes = 1 ms -> memory bound
    assert roofline_s(1e9, 4e9, 1e15, 4e12) == pytest.approx(1e-3)
    assert roofline_s(0.0, 0.0, 1e15, 4e12) == 0.0


@given(f=st.floats(0, 1e18), b=st.floats(0, 1e15), fr=st.floats(1e6, 1e18), br=st.floats(1e6, 1e15))
def test_roofline_is_max_of_the_two(f, b, fr, br):
    assert roofline_s(f, b, fr, br) == max(f / fr, b / br)


@pytest.mark.parametrize("args", [(-1, 0, 1, 1), (0, -1, 1, 1), (1, 1, 0, 1), (1, 1, 1, 0)])
def test_roofline_rejects_bad_input(args):
    with pytest.raises(ValueError):
        roofline_s(*args)


# --------------------------------------------------------------------------------------------
# op_time_s


def test_op_time_gemm_equals_hand_roofline_plus_launches(mi300x):
    """d24 h0.attn.c_q at micro-batch 32, MI300X central rates.

    Forward: 2 x 65536 x 1536 x 1536 = 309,237,645,312 FLOPs at 1307.4e12 x 0.511 (MAMF best) x 0.783 (the
    fraction training keeps, mi300x's assumed `sustained`) x 65536/65633 x (1536/1633)^2 (the shape curve at
    the half_dim 97 fitted to the MI300X hipBLASLt sweep: 0.883421) = 462.12 TFLOP/s -> 0.669165 ms;
    bytes 65536x1536x2 (x) + 1536^2 x 2 (W bf16) + 65536x1536x2 (y) + 1536^2 x (4+2)
    (fp32 master read, bf16 cast written) = 421,527,552 B at 5.3e12 x 0.775 -> 0.102624 ms: compute
    bound. + one GEMM call's fixed 33.3 us (the sweep's fit). Backward: twice the FLOPs (dX and dW), two calls.
    """
    an = d24_anatomy("fused_sdpa")
    op = op_named(an, "h0.attn.c_q")
    assert op.shape == (65536, 1536, 1536)
    assert op.flops_fwd == 309_237_645_312 and op.bytes_fwd == 421_527_552
    r = rates(mi300x, "sdpa-fused")
    rate = 1307.4e12 * 0.511 * 0.783 * 65536 / 65633 * (1536 / 1633) ** 2  # best x sustained x shape curve
    fwd, bwd = op_time_s(op, an, r)
    assert fwd == pytest.approx(309_237_645_312 / rate + 33.3e-6, rel=1e-9)
    assert fwd == pytest.approx(0.669165e-3 + 33.3e-6, rel=1e-5)
    hand_bwd = max(2 * 309_237_645_312 / rate, op.bytes_bwd / (5.3e12 * 0.775)) + 2 * 33.3e-6
    assert bwd == pytest.approx(hand_bwd, rel=1e-9)


def test_op_time_gemm_memory_bound_when_hbm_is_slow(mi300x):
    an = d24_anatomy("fused_sdpa")
    op = op_named(an, "h0.attn.c_q")
    r = replace(rates(mi300x, "sdpa-fused"), hbm_bytes_per_s=1e9, kernel_overhead_s=0.0, gemm_overhead_s=None)
    fwd, bwd = op_time_s(op, an, r)
    assert fwd == pytest.approx(op.bytes_fwd / (1e9 * 0.775))
    assert bwd == pytest.approx(op.bytes_bwd / (1e9 * 0.775))


def test_op_time_flash_attention_uses_convention_flops_and_one_launch(mi300x):
    an = d24_anatomy("flash_package")
    op = op_named(an, "h0.attn.core")
    r = replace(rates(mi300x, "flash-attn-ck"), hbm_bytes_per_s=1e30)  # compute bound
    f, b = attention_efficiency_flops(op, an)
    fwd, bwd = op_time_s(op, an, r)
    g = (512 / 752) / (8192 / 8432)  # layer 0's window (S: 512 keys) against the spec's 8,192-token measurement
    assert fwd == pytest.approx(f / (1307.4e12 * 0.28 * g) + 8e-6, rel=1e-9)
    assert bwd == pytest.approx(b / (1307.4e12 * 0.19 * g) + 8e-6, rel=1e-9)


# H100 forward TFLOP/s by sequence length, B x S = 16k, H x D = 2048, head dim 128 (pytorch/benchmark commit
# ff65cb675209d2308f7d27c6920af8a32de9aa90, PR #2391, test plan): FA3 and the Triton tutorial's FA2
SEQ_SWEEP = (512, 1024, 2048, 4096, 8192, 16384)
FA3_TFLOPS = (430.32, 517.099, 565.544, 590.233, 614.234, 620.73)
TRITON_FA2_TFLOPS = (328.882, 389.723, 433.721, 458.359, 470.732, 476.753)


def test_attention_seq_factor_by_hand():
    assert attention_seq_factor(8192, 8192) == 1.0
    assert attention_seq_factor(2048, 8192, 240) == pytest.approx((2048 / 2288) / (8192 / 8432), rel=1e-12)
    assert attention_seq_factor(512, 512, 240) == 1.0
    with pytest.raises(ValueError):
        attention_seq_factor(0, 8192)


@pytest.mark.parametrize("measured", [FA3_TFLOPS, TRITON_FA2_TFLOPS], ids=["fa3", "triton-fa2"])
def test_flash_seq_half_fits_the_published_sweep(measured):
    """Each series is a x s / (s + seq_half) within 1.1% at every length at the shipped FLASH_SEQ_HALF, whose
    own best fit is within 10 of it (233.8 for FA3, 243.7 for the Triton FA2: 240 between them)."""
    from ddplan.fitting import golden_min

    def fit(h: float) -> tuple[float, float]:
        g = [s / (s + h) for s in SEQ_SWEEP]
        a = math.exp(sum(math.log(y / x) for y, x in zip(measured, g)) / len(g))
        return sum(math.log(a * x / y) ** 2 for y, x in zip(measured, g)), a

    h = math.exp(golden_min(lambda lh: fit(math.exp(lh))[0], math.log(10), math.log(20000), 1e-6))
    assert h == pytest.approx(FLASH_SEQ_HALF, abs=10)
    a = fit(FLASH_SEQ_HALF)[1]
    for s, y in zip(SEQ_SWEEP, measured):
        assert a * s / (s + FLASH_SEQ_HALF) == pytest.approx(y, rel=0.011)


def test_only_fused_kernels_follow_the_sequence_curve(mi300x):
    assert rates(mi300x, "flash-attn-ck").attn_reference_seq == 8192
    assert rates(mi300x, "sdpa-fused").attn_reference_seq == 8192
    assert rates(mi300x, "sdpa-math").attn_reference_seq == 0
    an = d24_anatomy("flash_package")  # SSSL: layer 0 visits a 512-token window, layer 3 all 2,048 tokens
    r = replace(rates(mi300x, "flash-attn-ck"), hbm_bytes_per_s=1e30, kernel_overhead_s=0.0)
    per_flop = []
    for name in ("h0.attn.core", "h3.attn.core"):
        op = op_named(an, name)
        f, _ = attention_efficiency_flops(op, an)
        per_flop.append(op_time_s(op, an, r)[0] / f)
    assert per_flop[0] / per_flop[1] == pytest.approx((2048 / 2288) / (512 / 752), rel=1e-9)


def test_unfused_math_splits_attention_into_scores_and_pv():
    an = d24_anatomy("unfused_math")
    ops = [op for op in an.ops if op.kind == "attention" and op.layer == 0]
    assert [op.name for op in ops] == ["h0.attn.scores", "h0.attn.pv"]
    # together they are the whole attention's model FLOPs at all s^2 pairs: 4 b h s^2 hd
    assert sum(op.flops_fwd for op in ops) == 4 * 32 * 12 * 2048**2 * 128


def test_op_time_unfused_math_charges_the_convention_flops_once_per_layer(mi300x):
    """The efficiency is defined on the whole attention's causal FLOPs of the processed window
    (hardware/mi300x.yaml header: sdpa-math 0.10 fwd is 0.9 x the measured 145.9 TFLOP/s fwd+bwd rate
    on causal/2 FLOPs), so a layer's forward attention takes 4 b h pairs hd / (peak x 0.10), however
    many kernels the implementation splits it into."""
    an = d24_anatomy("unfused_math")
    r = replace(rates(mi300x, "sdpa-math"), hbm_bytes_per_s=1e30, kernel_overhead_s=0.0, gemm_overhead_s=None)
    ops = [op for op in an.ops if op.kind == "attention" and op.layer == 0]  # h0.attn.scores, h0.attn.pv
    conv_fwd, conv_bwd = (sum(x) for x in zip(*(attention_efficiency_flops(op, an) for op in ops)))
    b, h, s, w, hd = ops[0].shape
    assert conv_fwd == 4 * b * h * (s * (s + 1) // 2) * hd  # the whole layer's causal count, once
    assert sum(op_time_s(op, an, r)[0] for op in ops) == pytest.approx(conv_fwd / (1307.4e12 * 0.10), rel=1e-6)
    assert sum(op_time_s(op, an, r)[1] for op in ops) == pytest.approx(conv_bwd / (1307.4e12 * 0.09), rel=1e-6)


def test_op_time_pointwise_compiled_halves_traffic_and_launch(mi300x):
    eager, compiled = d24_anatomy("fused_sdpa", compiled=False), d24_anatomy("fused_sdpa", compiled=True)
    op = op_named(eager, "h0.resid_add1")
    r = rates(mi300x, "sdpa-fused")
    bw = 5.3e12 * 0.775
    fwd, _ = op_time_s(op, eager, r)
    assert fwd == pytest.approx(max(op.flops_fwd / 163.4e12, op.bytes_fwd / bw) + 8e-6)
    fwd_c, _ = op_time_s(op, compiled, r)
    assert fwd_c == pytest.approx(max(op.flops_fwd / 163.4e12, op.bytes_fwd * 0.5 / bw) + 4e-6)


def test_pointwise_rate_converts_only_across_compile_modes():
    """A rate measured in the step's own mode is used as it is; eager 2 GB/s runs 2 / 0.5 = 4 GB/s compiled,
    compiled 4 GB/s runs 4 x 0.5 = 2 GB/s eager (COMPILED_POINTWISE_FRACTION = 0.5, assumed)."""
    assert pointwise_rate(2e9, measured_compiled=False, compiled=False) == 2e9
    assert pointwise_rate(4e9, measured_compiled=True, compiled=True) == 4e9
    assert pointwise_rate(2e9, measured_compiled=False, compiled=True) == pytest.approx(4e9)
    assert pointwise_rate(4e9, measured_compiled=True, compiled=False) == pytest.approx(2e9)
    with pytest.raises(ValueError):
        pointwise_rate(0.0, False, False)


def test_op_time_pointwise_at_a_rate_measured_compiled(mi300x):
    """A compiled calibration's elementwise rate prices a compiled step's op at the anatomy's full bytes
    (the measurement already holds Inductor's fusion) and an eager step's at half that rate."""
    eager, compiled = d24_anatomy("fused_sdpa", compiled=False), d24_anatomy("fused_sdpa", compiled=True)
    op = op_named(eager, "h0.resid_add1")
    r = replace(rates(mi300x, "sdpa-fused"), pointwise_bytes_per_s=1e12, pointwise_compiled=True, kernel_overhead_s=0.0)
    assert op_time_s(op, compiled, r)[0] == pytest.approx(op.bytes_fwd / 1e12)
    assert op_time_s(op, eager, r)[0] == pytest.approx(op.bytes_fwd / 0.5e12)
    # forward and backward measured apart: each direction at its own rate
    r = replace(r, pointwise_fwd_bytes_per_s=2e12, pointwise_bwd_bytes_per_s=0.5e12)
    assert op_time_s(op, compiled, r) == pytest.approx((op.bytes_fwd / 2e12, op.bytes_bwd / 0.5e12))


def test_gemm_fraction_curve_when_uncalibrated(mi300x):
    r = rates(mi300x, "sdpa-fused")
    assert gemm_fraction(65536, 1536, 1536, r) == pytest.approx(gemm_efficiency(65536, 1536, 1536, 0.511 * 0.783, 97))


def test_gemm_fraction_nearest_measured_shape_in_log_space(mi300x):
    pts = ((1024, 1024, 1024, 0.2), (8192, 8192, 8192, 0.5))
    r = replace(rates(mi300x, "sdpa-fused"), gemm_points=pts)
    assert gemm_fraction(1500, 1024, 1024, r) == 0.2
    assert gemm_fraction(4096, 4096, 4096, r) == 0.5  # log distance 3 x ln2^2 < 3 x (2 ln2)^2
    assert gemm_fraction(65536, 8192, 8192, r) == 0.5
    assert r.scaled("gemm", 1.2).gemm_points == pts
    assert gemm_fraction(1024, 1024, 1024, r.scaled("gemm", 1.2)) == pytest.approx(0.24)


def test_op_time_gemm_backward_times_dx_and_dw_at_their_own_shapes(mi300x):
    """Backward is dX = dY W^T ((m x n) @ (n x k): shape (m, k, n)) and dW = X^T dY ((k x m) @ (m x n):
    shape (k, n, m)), each half of the 4 m n k FLOPs. With measured fractions 0.5 (forward shape),
    0.25 (dX) and 0.125 (dW) at peak 1e15: fwd 2mnk / 5e14, bwd 2mnk / 2.5e14 + 2mnk / 1.25e14."""
    an = d24_anatomy("fused_sdpa")
    op = op_named(an, "h0.mlp.c_fc")
    m, n, k = op.shape
    assert (m, n, k) == (65536, 6144, 1536)
    pts = ((m, n, k, 0.5), (m, k, n, 0.25), (k, n, m, 0.125))
    r = replace(rates(mi300x, "sdpa-fused"), peak_flops_per_s=1e15, hbm_bytes_per_s=1e30, kernel_overhead_s=0.0, gemm_overhead_s=None,
                gemm_points=pts)
    fwd, bwd = op_time_s(op, an, r)
    two_mnk = 2.0 * m * n * k
    assert fwd == pytest.approx(two_mnk / 5e14, rel=1e-12)
    assert bwd == pytest.approx(two_mnk / 2.5e14 + two_mnk / 1.25e14, rel=1e-12)


# --------------------------------------------------------------------------------------------
# attention_efficiency_flops: causal pairs of the window the kernel processes


def test_attention_pairs_hand_values_d24():
    """s = 2048: a full causal window has 2048 x 2049 / 2 = 2,098,176 pairs; the short window
    w = 512 has w + 1 = 513 keys per query once full: 513 x 514 / 2 + (2048 - 513) x 513
    = 131,841 + 787,455 = 919,296 pairs."""
    assert attention_pairs(2048, 2048, "flash_package", "native") == 2_098_176
    assert attention_pairs(2048, 512, "flash_package", "native") == 919_296


@pytest.mark.parametrize("kind", ["sdpa_math", "unfused_math", "fused_sdpa", "flash_package"])
def test_attention_efficiency_flops_convention(kind):
    """d24 (SSSL, S = 512), b = 32, 12 heads of 128. Forward 4 b h pairs hd, backward 8 b h pairs hd.

    Unfused math and mask-only kernels process the full sequence in every layer:
    4 x 32 x 12 x 2,098,176 x 128 = 412,518,187,008. Flash native processes the short window:
    4 x 32 x 12 x 919,296 x 128 = 180,740,947,968 in S layers; the full count in L layers.
    """
    an = d24_anatomy(kind)
    short = next(op for op in an.ops if op.kind == "attention" and op.layer == 0)
    long_ = next(op for op in an.ops if op.kind == "attention" and op.layer == 3)
    assert short.shape[3] == 512 and long_.shape[3] == 2048
    full = 4 * 32 * 12 * 2_098_176 * 128
    assert full == 412_518_187_008
    total_long = [sum(x) for x in zip(*(attention_efficiency_flops(op, an) for op in an.ops
                                        if op.kind == "attention" and op.layer == 3))]
    assert total_long == [full, 2 * full]
    windowed = 4 * 32 * 12 * 919_296 * 128
    assert windowed == 180_740_947_968
    expect = windowed if kind == "flash_package" else full
    # the unfused core is two ops (scores, probabilities @ v), each carrying half of the FLOPs
    total = [sum(x) for x in zip(*(attention_efficiency_flops(op, an) for op in an.ops
                                   if op.kind == "attention" and op.layer == 0))]
    assert total == [expect, 2 * expect]


def test_attention_efficiency_flops_full_window_equals_flash_model_flops():
    """For a flash kernel the convention count is exactly the model FLOPs of the op (no waste)."""
    an = d24_anatomy("flash_package")
    for op in an.ops:
        if op.kind == "attention":
            assert attention_efficiency_flops(op, an) == (op.flops_fwd, op.flops_bwd)


# --------------------------------------------------------------------------------------------
# rates and Rates.scaled


def test_rates_mi300x_central_values(mi300x):
    r = rates(mi300x, "flash-attn-ck")
    assert r.peak_flops_per_s == pytest.approx(1307.4e12)
    assert r.vector_flops_per_s == pytest.approx(163.4e12)
    assert r.hbm_bytes_per_s == pytest.approx(5.3e12)
    # best GEMM (MAMF) x the fraction training keeps (mi300x: assumed 0.783, no run to fit; see its spec)
    assert r.gemm_best == pytest.approx(0.511 * 0.783)
    assert (r.gemm_half_dim, r.hbm) == (97, 0.775)
    assert r.gemm_overhead_s == pytest.approx(33.3e-6)  # a GEMM call, fitted to the MI300X sweep
    assert (r.attn_fwd, r.attn_bwd) == (0.28, 0.19)
    assert r.kernel_overhead_s == pytest.approx(8e-6)


@pytest.mark.parametrize("hw_name", builtin_names("hardware"))
def test_rates_pick_value_low_high_and_low_le_value_le_high(hw_name):
    hw = load_hardware(hw_name)
    e = hw.efficiency
    for impl in hw.attention:
        by = {s: rates(hw, impl.name, s) for s in SCENARIOS}
        kept = e.gemm.sustained.range if e.gemm.sustained is not None else (1.0, 1.0)
        # a fraction fitted to runs was fitted at the best rate's value: the band keeps that value (best_gemm)
        fitted = e.gemm.sustained is not None and e.gemm.sustained.basis == "fitted"
        best = (e.gemm.best.value,) * 2 if fitted else e.gemm.best.range
        for scen, idx in (("low", 0), ("high", 1)):
            assert by[scen].gemm_best == pytest.approx(best[idx] * kept[idx])
            assert by[scen].hbm == e.hbm.range[idx]
            assert by[scen].attn_fwd == impl.efficiency_fwd.range[idx]
            assert by[scen].attn_bwd == impl.efficiency_bwd.range[idx]
        assert by["value"].gemm_best == pytest.approx(e.gemm.best.value * (e.gemm.sustained.value if e.gemm.sustained
                                                                          else 1.0))
        # fp8 keeps its own fitted fraction of its own best rate, or the 16-bit fraction where none is fitted
        kept_fp8 = e.gemm.sustained_fp8 or e.gemm.sustained
        assert by["value"].gemm_best_fp8 == pytest.approx((e.gemm.best_fp8 or e.gemm.best).value
                                                          * (kept_fp8.value if kept_fp8 else 1.0))
        assert by["value"].attn_fwd == impl.efficiency_fwd.value
        for knob in ("gemm_best", "gemm_best_fp8", "hbm", "attn_fwd", "attn_bwd"):
            assert getattr(by["low"], knob) <= getattr(by["value"], knob) <= getattr(by["high"], knob), knob
        # the peaks and the shape curve do not move with the scenario
        for fixed in ("peak_flops_per_s", "hbm_bytes_per_s", "gemm_half_dim", "kernel_overhead_s"):
            assert getattr(by["low"], fixed) == getattr(by["value"], fixed) == getattr(by["high"], fixed)


def test_rates_rejects_unknown_scenario(mi300x):
    with pytest.raises(ValueError, match="scenario"):
        rates(mi300x, "sdpa-fused", "mid")


def test_rates_scaled_each_knob(mi300x):
    r = rates(mi300x, "sdpa-fused")
    assert r.gemm_best_fp8 > 0
    assert (r.gemm_scale, r.attention_scale) == (1.0, 1.0)

    def gemm(f):
        return dict(gemm_best=r.gemm_best * f, gemm_best_fp8=r.gemm_best_fp8 * f, gemm_scale=f)

    def attn(f):
        return dict(attn_fwd=r.attn_fwd * f, attn_bwd=r.attn_bwd * f, attention_scale=f)

    assert r.scaled("gemm", 1.5) == replace(r, **gemm(1.5))
    assert r.scaled("attention", 0.5) == replace(r, **attn(0.5))
    assert r.scaled("compute", 2.0) == replace(r, **gemm(2.0), **attn(2.0))
    assert r.scaled("gemm", 1.0) == r


@pytest.mark.parametrize("knob", ["hbm", "GEMM", "", "overhead"])
def test_rates_scaled_unknown_knob(mi300x, knob):
    with pytest.raises(ValueError, match="unknown knob"):
        rates(mi300x, "sdpa-fused").scaled(knob, 1.1)


# --------------------------------------------------------------------------------------------
# micro_batch_time


def _fwd(an, r, pred):
    return sum(op_time_s(op, an, r)[0] for op in an.ops if pred(op))


@pytest.mark.parametrize("kind", ["sdpa_math", "unfused_math", "fused_sdpa", "flash_package"])
def test_micro_batch_time_no_recompute_is_sum_of_ops(mi300x, kind):
    an = d24_anatomy(kind)
    r = rates(mi300x, IMPL_OF_KIND[kind])
    m = micro_batch_time(an, r)
    assert m.recompute_s == 0.0
    assert m.fwd_s == pytest.approx(sum(op_time_s(op, an, r)[0] for op in an.ops), rel=1e-12)
    assert m.bwd_s == pytest.approx(sum(op_time_s(op, an, r)[1] for op in an.ops), rel=1e-12)
    assert sum(m.by_kind_s.values()) == pytest.approx(m.total_s, rel=1e-12)


@pytest.mark.parametrize("kind", ["sdpa_math", "unfused_math", "fused_sdpa", "flash_package"])
@pytest.mark.parametrize("policy", ["selective", "full"])
def test_micro_batch_time_recompute_goes_into_backward(mi300x, kind, policy):
    r = rates(mi300x, IMPL_OF_KIND[kind])
    base = micro_batch_time(d24_anatomy(kind), r)
    m = micro_batch_time(d24_anatomy(kind, policy), r)
    assert m.fwd_s == pytest.approx(base.fwd_s, rel=1e-12)
    assert m.recompute_s > 0
    assert m.bwd_s == pytest.approx(base.bwd_s + m.recompute_s, rel=1e-12)


@pytest.mark.parametrize("kind", ["fused_sdpa", "flash_package"])
def test_micro_batch_time_selective_adds_attention_core_forward(mi300x, kind):
    """Fused kernels: one attention-core op per layer, re-run whole (nothing skipped)."""
    an = d24_anatomy(kind, "selective")
    r = rates(mi300x, IMPL_OF_KIND[kind])
    m = micro_batch_time(an, r)
    assert m.recompute_s == pytest.approx(_fwd(an, r, lambda op: op.attention_core), rel=1e-12)
    assert m.recompute_s == pytest.approx(_fwd(an, r, an.recomputes), rel=1e-12)


def test_micro_batch_time_selective_unfused_skips_pv(mi300x):
    """Selective recompute of unfused math re-runs the scores and softmax but not the PV product
    (its inputs, the probabilities and v, are back once the scores are)."""
    an = d24_anatomy("unfused_math", "selective")
    r = rates(mi300x, "sdpa-math")
    assert not an.recomputes(op_named(an, "h0.attn.pv")) and an.recomputes(op_named(an, "h0.attn.scores"))
    m = micro_batch_time(an, r)
    assert m.recompute_s == pytest.approx(_fwd(an, r, an.recomputes), rel=1e-9)
    assert m.recompute_s < _fwd(an, r, lambda op: op.attention_core)


FULL_SKIPPED = {f"h{i}.{n}" for i in range(24) for n in ("mlp.c_proj", "resid_add2")}


@pytest.mark.parametrize("kind", ["sdpa_math", "unfused_math", "fused_sdpa", "flash_package"])
def test_anatomy_full_recompute_reruns_every_block_op_but_the_last_gemm_and_residual(kind):
    """The cross-check the time model should follow: torch's non-reentrant checkpoint stops once
    backward's saved tensors are back, so a block's last GEMM and its residual add are not re-run."""
    an = d24_anatomy(kind, "full")
    rerun = {op.name for op in an.ops if an.recomputes(op)}
    assert rerun == {op.name for op in an.ops if op.layer is not None} - FULL_SKIPPED


@pytest.mark.parametrize("kind", ["sdpa_math", "unfused_math", "fused_sdpa", "flash_package"])
def test_micro_batch_time_full_recompute_skips_last_gemm_and_residual(mi300x, kind):
    """Full recompute adds the forward time of every block op except the block's last GEMM and residual."""
    an = d24_anatomy(kind, "full")
    r = rates(mi300x, IMPL_OF_KIND[kind])
    expect = _fwd(an, r, lambda op: op.layer is not None and op.name not in FULL_SKIPPED)
    assert micro_batch_time(an, r).recompute_s == pytest.approx(expect, rel=1e-9)


def test_micro_batch_time_layer_fraction_is_linear_and_parts_add(mi300x):
    an = d24_anatomy("fused_sdpa")
    r = rates(mi300x, "sdpa-fused")
    whole = micro_batch_time(an, r).total_s
    none = micro_batch_time(an, r, layer_fraction=0.0).total_s
    half = micro_batch_time(an, r, layer_fraction=0.5).total_s
    assert half - none == pytest.approx((whole - none) / 2, rel=1e-12)
    emb = micro_batch_time(an, r, 0.0, include_embeddings=True, include_head=False).total_s
    head = micro_batch_time(an, r, 0.0, include_embeddings=False, include_head=True).total_s
    assert emb + head == pytest.approx(none, rel=1e-12)
    assert micro_batch_time(an, r, 0.0, include_embeddings=False, include_head=False).total_s == 0.0
    assert math.isfinite(whole) and whole > half > none > 0


def test_under_context_parallelism_a_ring_step_sees_one_chunk_of_keys():
    """Llama-3-8B at 8,192 tokens over cp 4: each ring step's kernel call visits one 2,048-token chunk of keys,
    whether the kernel takes native windows (fa2) or a mask (sdpa-fused); without cp, all 8,192."""
    from ddplan.anatomy import for_cp
    from ddplan.roofline import keys_per_call

    spec = load_model("llama-3-8b")
    for attention, windows in (("flash_package", "native"), ("fused_sdpa", "mask")):
        full = build_anatomy(spec, batch=1, seq_len=8192, attention=attention, windows=windows)
        short = build_anatomy(spec, batch=1, seq_len=2048, attention=attention, windows=windows)
        cp = for_cp(full, short, 4)
        assert keys_per_call(op_named(full, "h0.attn.core"), full) == 8192
        assert keys_per_call(op_named(cp, "h0.attn.core"), cp) == 2048


def test_a_measured_attention_point_follows_the_curve_to_other_lengths():
    """A calibration measured sdpa-fused at 256 tokens: priced at 256 it is the point itself; at 1,024 tokens
    the point's efficiency x g(1024) / g(256) = (1024/1264) / (256/496)."""
    hw = load_hardware("h100-sxm")
    base = replace(rates(hw, "sdpa-fused"), hbm_bytes_per_s=1e30, kernel_overhead_s=0.0)
    r = replace(base, attention_points=((2 * 32, 256, 256, 128, 0.2, 0.1),))
    spec = load_model("llama-3-8b")
    times = []
    for seq in (256, 1024):
        an = build_anatomy(spec, batch=2, seq_len=seq, attention="fused_sdpa", windows="mask")
        op = op_named(an, "h0.attn.core")
        f, _ = attention_efficiency_flops(op, an)
        times.append(op_time_s(op, an, r)[0] / f)
    assert times[0] == pytest.approx(1 / (hw.peak.flops_per_s("bf16") * 0.2), rel=1e-9)
    assert times[0] / times[1] == pytest.approx((1024 / 1264) / (256 / 496), rel=1e-9)


def test_calibrates_cpu_spec_has_no_sequence_anchor():
    """calibrate's CPU spec measures attention at the model's own shapes: no 8k-token anchor to scale from."""
    from ddplan.calibrate.runner import cpu_hardware

    hw = cpu_hardware(1.0, 0.02, 5.0, "measured", {"device_name": "cpu"})
    assert all(a.measured_seq_len is None for a in hw.attention)
    assert rates(hw, "sdpa-fused").attn_reference_seq == 0


# --------------------------------------------------------------------------------------------
# Blackwell attention from NVIDIA/cudnn-frontend's training SDPA sweep (benchmark/sdpa_benchmark_training/
# artifacts/sdpa_bf16_benchmark_results_NVIDIA_GB200.csv @d48a60eb: cuDNN 9.17, causal, batch 1, 128 query and
# 8 KV heads of 128). Forward and backward times in ms, transcribed; the csv's TFLOP/s count the causal
# forward FLOPs 2 b h s^2 d and the backward as 2.5x them, ddplan's convention 2x.
BW_SEQS = (1024, 2048, 4096, 8192, 16384, 32768)
GB200_CUDNN_MS = ((0.047, 0.163), (0.129, 0.525), (0.397, 1.304), (1.389, 4.542), (5.273, 16.863), (20.937, 65.277))
GB200_PYT_FLASH_MS = ((0.135, 0.416), (0.409, 1.284), (1.422, 4.414), (5.308, 16.249), (20.445, 62.397),
                      (80.322, 244.331))


def _fractions(times_ms, peak_tflops):
    """(forward, backward) fractions of peak in ddplan's convention at each of BW_SEQS."""
    out = []
    for s, (f, b) in zip(BW_SEQS, times_ms):
        flops = 2 * 128 * s * s * 128  # causal forward: 4 b h s^2 d / 2
        out.append((flops / (f * 1e-3) / (peak_tflops * 1e12), 2 * flops / (b * 1e-3) / (peak_tflops * 1e12)))
    return out


@pytest.mark.parametrize("impl, times, worst", [("cudnn", GB200_CUDNN_MS, (0.09, 0.22)),
                                                ("sdpa-fused", GB200_PYT_FLASH_MS, (0.03, 0.02))])
def test_gb200_attention_is_the_published_sweep(impl, times, worst):
    """The gb200 spec's cudnn and sdpa-fused (PyTorch flash) efficiencies are the sweep's at its 8192 anchor
    (the csv's 1,584 and 414 TFLOP/s forward), and their seq_half carries them along the sweep: each length
    within the stated share (cuDNN: forward within 4% to 16k and +8% at 32k, backward +22% at 2k, where it jumps
    between 2k and 4k, else within 4%; PyTorch flash within 2.5%)."""
    hw = load_hardware("gb200")
    a = hw.attention_impl(impl)
    points = _fractions(times, 2500)
    anchor = points[BW_SEQS.index(8192)]
    assert (a.efficiency_fwd.value, a.efficiency_bwd.value) == pytest.approx(anchor, abs=0.002)
    r = rates(hw, impl)
    assert r.attn_seq_half == a.seq_half and r.attn_reference_seq == 8192
    for s, (f, b) in zip(BW_SEQS, points):
        g = attention_seq_factor(s, 8192, a.seq_half)
        assert a.efficiency_fwd.value * g == pytest.approx(f, rel=worst[0])
        assert a.efficiency_bwd.value * g == pytest.approx(b, rel=worst[1])
    assert load_hardware("h100-sxm").attention_impl("fa3").seq_half is None
    assert rates(load_hardware("h100-sxm"), "fa3").attn_seq_half == FLASH_SEQ_HALF


def test_gb200_cudnn_seq_half_is_the_sweeps_best_fit():
    """One a x s / (s + h) through the forward and backward points of 1k-32k: h within 2% of the spec's."""
    from ddplan.fitting import golden_min

    points = _fractions(GB200_CUDNN_MS, 2500)

    def cost(h: float) -> float:
        total = 0.0
        for k in (0, 1):
            ys = [p[k] for p in points]
            g = [s / (s + h) for s in BW_SEQS]
            a = math.exp(sum(math.log(y / x) for y, x in zip(ys, g)) / len(g))
            total += sum(math.log(a * x / y) ** 2 for y, x in zip(ys, g))
        return total

    h = math.exp(golden_min(lambda lh: cost(math.exp(lh)), math.log(10), math.log(50000), 1e-7))
    assert h == pytest.approx(load_hardware("gb200").attention_impl("cudnn").seq_half, rel=0.02)


# B200 (the same repository's ..._NVIDIA_B200.csv @bb37575d: cuDNN 9.13 through PyTorch's cuDNN SDPA backend, and
# PyTorch's flash backend), forward and backward ms at BW_SEQS, transcribed
B200_CUDNN_MS = ((0.135, 0.278), (0.287, 0.925), (0.642, 1.960), (1.877, 5.833), (6.602, 20.460), (24.795, 79.338))
B200_PYT_FLASH_MS = ((0.208, 0.798), (0.567, 1.844), (1.692, 5.360), (5.889, 18.395), (22.297, 68.724),
                     (87.146, 265.902))


@pytest.mark.parametrize("impl, times, near, far", [
    ("cudnn", B200_CUDNN_MS, 0.08, 0.29),  # within 8% at 4k-16k; +29% at 1k (its curve is not this shape)
    ("sdpa-fused", B200_PYT_FLASH_MS, 0.08, 0.19),  # within 8% from 2k on; backward +19% at 1k
])
def test_b200_attention_is_the_published_sweep(impl, times, near, far):
    hw = load_hardware("b200")
    a = hw.attention_impl(impl)
    points = _fractions(times, 2250)
    assert (a.efficiency_fwd.value, a.efficiency_bwd.value) == pytest.approx(points[BW_SEQS.index(8192)], abs=0.002)
    for s, (f, b) in zip(BW_SEQS, points):
        g = attention_seq_factor(s, 8192, a.seq_half)
        tol = near if 4096 <= s <= 16384 else far
        assert a.efficiency_fwd.value * g == pytest.approx(f, rel=tol), (s, "fwd")
        assert a.efficiency_bwd.value * g == pytest.approx(b, rel=tol), (s, "bwd")


def test_grouped_call_waves_by_hand():
    """Transformer Engine's grouped GEMM: one cuBLAS GEMM a local expert, round-robin over 4 streams, so the
    busiest stream runs ceil(experts / 4) of them back to back."""
    assert GROUPED_GEMM_STREAMS == 4
    assert [grouped_call_waves(c) for c in (1, 2, 4, 5, 8, 32, 128)] == [1, 1, 1, 2, 2, 8, 32]
    assert grouped_call_waves(5, streams=1) == 5
    for bad in ((0, 4), (4, 0), (-1, 4)):
        with pytest.raises(ValueError):
            grouped_call_waves(*bad)


@pytest.mark.parametrize("model, fp8", [("d24", False), ("llama-3-8b", True), ("qwen3-30b-a3b", False)])
def test_op_times_over_the_merged_repeats_equal_the_walk_over_every_op(model, fp8):
    """op_times prices each of Anatomy.op_repeats once: the same per-part sums as pricing every op."""
    from ddplan.anatomy import build_anatomy, recomputed_under
    from ddplan.registry import load_hardware, load_model
    from ddplan.roofline import _part, op_time_s, op_times, rates

    spec, hw = load_model(model), load_hardware("h100-sxm")
    a = build_anatomy(spec, batch=2, seq_len=1024, ep=4 if spec.architecture.moe else 1)
    r = rates(hw, hw.default_attention, "value", fp8=fp8)
    got = op_times(a, r)
    fwd, bwd, again = {}, {}, {}
    for op in a.ops:
        f, b = op_time_s(op, a, r)
        fwd[_part(op)] = fwd.get(_part(op), 0.0) + f
        bwd[_part(op)] = bwd.get(_part(op), 0.0) + b
        for policy in ("selective", "full", "per-op"):
            if recomputed_under(op, policy):
                again[(_part(op), policy)] = again.get((_part(op), policy), 0.0) + f
    assert got.fwd == pytest.approx(fwd, rel=1e-12) and got.bwd == pytest.approx(bwd, rel=1e-12)
    assert got.again == pytest.approx(again, rel=1e-12)


def test_weight_gradient_share_of_a_backward():
    """The zero-bubble schedules' W: a GEMM's dW against its dX (roofline.wgrad_share), each at its own shape's rate.
    On the efficiency curve the two shapes have the same three dimensions, so half; at calibrated GEMM points a dW
    shape measured at half its dX's rate takes two thirds; attention, norms and the loss have none (the paper's B:
    Qi et al., arXiv 2401.10241, Table 1)."""
    from ddplan.roofline import Rates

    r = Rates(peak_flops_per_s=1e15, vector_flops_per_s=1e14, hbm_bytes_per_s=1e12, gemm_best=0.8,
              gemm_half_dim=128.0, hbm=1.0, attn_fwd=0.5, attn_bwd=0.5, kernel_overhead_s=0.0)
    an = build_anatomy(load_model("gpt2-124m"), batch=4, attention="fused_sdpa")
    gemms = [op for op in an.ops if op.kind == "gemm"]
    others = [op for op in an.ops if op.kind != "gemm"]
    assert gemms and others and all(wgrad_share(op, r) == 0.0 for op in others)
    assert all(wgrad_share(op, r) == pytest.approx(0.5) for op in gemms)
    m, n, k = gemms[0].shape
    measured = replace(r, gemm_points=((m, k, n, 0.8), (k, n, m, 0.4)), gemm_scale=1.0)
    assert wgrad_share(gemms[0], measured) == pytest.approx((1 / 0.4) / (1 / 0.8 + 1 / 0.4))


def test_best_gemm_counts_real_shapes_once():
    """roofline.best_gemm: where the fraction training keeps is fitted to runs (A100: best 0.869, low 0.695 = 0.8 x, the
    "real training shapes"), every scenario takes the best rate's value, at which the fraction was fitted; where it
    is assumed (B200: 0.783, the fitted GPUs' geometric mean) the scenario's end of the range. By hand: the A100's
    low GEMM rate 0.869 x 0.885 = 0.769 of peak, not 0.695 x 0.885 = 0.615."""
    a100, b200 = load_hardware("a100-sxm-80gb"), load_hardware("b200")
    assert a100.efficiency.gemm.sustained.basis == "fitted" and b200.efficiency.gemm.sustained.basis == "assumed"
    assert rates(a100, "fa2", "low").gemm_best == pytest.approx(0.869 * 0.885)
    assert rates(a100, "fa2", "low").gemm_best == rates(a100, "fa2", "value").gemm_best
    g = b200.efficiency.gemm
    assert rates(b200, b200.default_attention, "low").gemm_best == pytest.approx(g.best.range[0] * g.sustained.range[0])
    assert best_gemm(g.best, g.sustained, "low") == g.best.range[0]
    assert best_gemm(g.best, a100.efficiency.gemm.sustained, "low") == g.best.value
