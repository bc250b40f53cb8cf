"""ddplan.sweeps: the published GEMM sweeps, the GEMM time ddplan prices them with, and the shape curve
(half_dim) and call cost (fixed_us) of each hardware spec fitted to them.

The sweeps are Azure's AI benchmarking guide's cuBLASLt / hipBLASLt tables (validation/gemm_sweeps.yaml
names file and commit of each): A100 in fp16, H100, H200, GB200 and MI300X in fp8."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from ddplan.anatomy import build_anatomy
from ddplan.calibration import calibrated_rates
from ddplan.errors import SpecError
from ddplan.registry import load_hardware, load_model
from ddplan.roofline import gemm_call_s, op_time_s, rates
from ddplan.fitting import golden_min
from ddplan.sweeps import fit_half_dim, load_sweeps, point_tflops, sweep_rates

SWEEPS = {s.hardware: s for s in load_sweeps().sweeps}


def test_golden_min_by_hand():
    assert golden_min(lambda x: (x - 2.0) ** 2, 0.0, 5.0, 1e-6) == pytest.approx(2.0, abs=1e-5)
    assert golden_min(lambda x: abs(x - 0.3), 0.0, 1.0, 1e-6) == pytest.approx(0.3, abs=1e-5)
    with pytest.raises(ValueError):
        golden_min(lambda x: x, 1.0, 0.0, 1e-3)


def test_the_shipped_sweeps_load_and_name_built_in_hardware():
    assert set(SWEEPS) == {"a100-sxm-80gb", "h100-sxm", "h200", "gb200", "mi300x"}
    for s in SWEEPS.values():
        load_hardware(s.hardware)
        assert s.source.commit and len(s.points) >= 8
    # the transcription: ND A100 v4 fp16 8192^3 = 253.7 TFLOP/s; ND MI300X v5 fp8 1024^3 = 53.13
    assert [1024 * 8, 1024 * 8, 1024 * 8, 253.7] in [list(p) for p in SWEEPS["a100-sxm-80gb"].points]
    assert [1024, 1024, 1024, 53.13] in [list(p) for p in SWEEPS["mi300x"].points]


def test_a_bad_sweeps_file_is_one_error(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("kind: gemm_sweeps\nsweeps:\n  - hardware: h100-sxm\n    dtype: fp8\n    source: {ref: a/b, where: table}\n"
                 "    points: [[1, 2, 3, 4.0], [1, 2, 3, -1.0], [4, 4, 4, 1.0]]\n")
    with pytest.raises(SpecError, match="must be positive"):
        load_sweeps(str(p))
    p.write_text("kind: gemm_sweeps\nsweeps:\n  - hardware: h100-sxm\n    dtype: int4\n")
    with pytest.raises(SpecError, match="'bf16', 'fp16' or 'fp8'"):
        load_sweeps(str(p))


def test_point_tflops_by_hand():
    """H100 fp8, 4096^3, level 0.7, half_dim 128, 5 us a call:
    efficiency 0.7 x (4096 / 4224)^3 = 0.638246; rate 0.638246 x 1978.9 TFLOP/s = 1263.03 TFLOP/s;
    work 2 x 4096^3 = 137.44 GFLOP -> 108.82 us; bytes 1 x 2 x 4096^2 (fp8 inputs) + 2 x 4096^2 (bf16
    output) = 67.1 MB at 3.35 TB/s x 0.866 -> 23.1 us, under the compute; 108.82 + 5 = 113.82 us;
    137.44 GFLOP / 113.82 us = 1207.5 TFLOP/s."""
    hw = load_hardware("h100-sxm")
    r = sweep_rates(SWEEPS["h100-sxm"], hw, 0.7, 128.0, 5e-6)
    flops = 2 * 4096**3
    eff = 0.7 * (4096 / 4224) ** 3
    t = flops / (eff * 1978.9e12) + 5e-6
    assert point_tflops(4096, 4096, 4096, "fp8", r) == pytest.approx(flops / t / 1e12, rel=1e-9)
    assert point_tflops(4096, 4096, 4096, "fp8", r) == pytest.approx(1207.5, abs=0.5)


def test_a_gemm_call_costs_the_spec_fixed_us_forward_once_and_backward_twice():
    """d4 (width 256) at 2 x 256 tokens on MI300X, h0.mlp.c_fc (512 x 1024 x 256): forward 2 x 512 x 1024 x 256 =
    268,435,456 FLOPs at 1307.4e12 x 0.511 x 0.783 x 512/609 x 1024/1121 x 256/353 (the shape curve at half_dim
    97) = 291.34 TFLOP/s -> 0.9214 us, plus one call's 33.3 us (efficiency.gemm.fixed_us), not the 8 us kernel
    launch; backward: dX and dW, two calls."""
    hw = load_hardware("mi300x")
    a = build_anatomy(load_model("d4"), batch=2, seq_len=256)
    r = replace(rates(hw, hw.default_attention), hbm_bytes_per_s=1e30)  # compute bound
    op = next(o for o in a.ops if o.name == "h0.mlp.c_fc")
    assert op.shape == (512, 1024, 256)
    rate = 1307.4e12 * 0.511 * 0.783 * (512 / 609) * (1024 / 1121) * (256 / 353)
    fwd, bwd = op_time_s(op, a, r)
    assert fwd == pytest.approx(268_435_456 / rate + 33.3e-6, rel=1e-9)
    assert 268_435_456 / rate == pytest.approx(0.9214e-6, rel=1e-3)
    dx = 268_435_456 / (1307.4e12 * 0.511 * 0.783 * (512 / 609) * (256 / 353) * (1024 / 1121))
    dw = 268_435_456 / (1307.4e12 * 0.511 * 0.783 * (256 / 353) * (1024 / 1121) * (512 / 609))
    assert bwd == pytest.approx(dx + dw + 2 * 33.3e-6, rel=1e-9)


def test_muons_newton_schulz_gemms_pay_the_call_cost():
    """nanochat d4's optimizer on MI300X: Muon runs one batched Newton-Schulz per shape group of its matrices
    (block matrices 256 x 256, 1024 x 256, 256 x 1024; the value-embedding gates 2 x 12: four groups), 5
    iterations of 3 GEMM calls each: 4 x 5 x 3 = 60 calls, each at the GEMM call cost."""
    from ddplan.layout import Layout
    from ddplan.step import optimizer_time_s

    hw = load_hardware("mi300x")
    spec = load_model("d4")
    r = rates(hw, hw.default_attention)
    base = optimizer_time_s(spec, Layout(dp=1), r)
    more = optimizer_time_s(spec, Layout(dp=1), replace(r, gemm_overhead_s=r.gemm_overhead_s + 1e-6))
    assert more - base == pytest.approx(60 * 1e-6, rel=1e-6)


def test_a_measured_launch_time_keeps_the_fitted_gemm_call_cost():
    """A calibration's empty-kernel launch time replaces the kernel overhead, not a GEMM call's fitted cost; with
    measured GEMM rates (timed call by call) the bf16 GEMMs take the launch time, fp8 GEMMs (still on the curve)
    the fitted cost."""
    from ddplan.calibration import CalibrationSpec, GemmPoint

    hw = load_hardware("mi300x")
    r = rates(hw, hw.default_attention)
    blank = dict(hbm_tbyte_per_s=None, pointwise_tbyte_per_s=None, optimizer_tbyte_per_s=None, peak_gemm_tflops=None,
                 attention=[])
    c = calibrated_rates(r, hw.default_attention, CalibrationSpec.model_construct(kernel_overhead_us=12.0, gemm=[],
                                                                                  **blank))
    assert c.kernel_overhead_s == pytest.approx(12e-6) and c.gemm_overhead_s == pytest.approx(33.3e-6)
    assert gemm_call_s(c) == pytest.approx(33.3e-6)
    point = GemmPoint.model_construct(m=512, n=1024, k=256, dtype="bf16", tflops=100.0)
    c = calibrated_rates(r, hw.default_attention, CalibrationSpec.model_construct(kernel_overhead_us=12.0,
                                                                                  gemm=[point], **blank))
    assert gemm_call_s(c) == pytest.approx(12e-6) and gemm_call_s(c, fp8=True) == pytest.approx(33.3e-6)
    a = build_anatomy(load_model("d4"), batch=2, seq_len=256)
    op = next(o for o in a.ops if o.name == "h0.mlp.c_fc")
    fwd, _ = op_time_s(op, a, replace(c, hbm_bytes_per_s=1e30))
    assert fwd == pytest.approx(268_435_456 / 100e12 + 12e-6, rel=1e-9)


@pytest.mark.parametrize("name", sorted(SWEEPS))
def test_each_spec_keeps_the_shape_curve_its_sweep_gives(name):
    """half_dim: the sweep's fit (rounded), or where the sweep does not bound it from below (its thin GEMM is
    memory-bound in fp8) a value within a point of the best rms; fixed_us: the fit at the spec's half_dim."""
    hw = load_hardware(name)
    g = hw.efficiency.gemm
    free = fit_half_dim(SWEEPS[name], hw)
    kept = fit_half_dim(SWEEPS[name], hw, half_dim=g.half_dim.value)
    if free.at_lower_edge:
        assert kept.rms() <= free.rms() + 0.01
    else:
        assert g.half_dim.value == pytest.approx(free.half_dim, abs=1.0)
    assert g.fixed_us.value == pytest.approx(kept.fixed_us, abs=0.1)
    assert "gemm_sweeps.yaml" in g.half_dim.source and "gemm_sweeps.yaml" in g.fixed_us.source


@pytest.mark.parametrize("name, rms, worst", [("a100-sxm-80gb", 0.061, 0.14), ("h100-sxm", 0.075, 0.16),
                                              ("h200", 0.074, 0.16), ("gb200", 0.06, 0.11), ("mi300x", 0.113, 0.21)])
def test_ddplan_gemm_times_against_the_published_sweeps(name, rms, worst):
    """Every published point priced with the spec's half_dim and fixed_us (and the sweep's level): the rms and
    the worst error of ddplan's GEMM time (docs/reference.md's table of sweep residuals)."""
    hw = load_hardware(name)
    fit = fit_half_dim(SWEEPS[name], hw, half_dim=hw.efficiency.gemm.half_dim.value)
    assert fit.rms() <= rms
    assert max(abs(e) for *_, e in fit.residuals) <= worst


def test_h100_takes_the_h200_sweeps_curve_and_same_die_parts_follow():
    h200 = fit_half_dim(SWEEPS["h200"], load_hardware("h200"))
    for name in ("h100-sxm", "h100-pcie", "h200"):
        assert load_hardware(name).efficiency.gemm.half_dim.value == round(h200.half_dim)
    for a, b in (("a100-sxm-40gb", "a100-sxm-80gb"), ("b200", "gb200"), ("mi325x", "mi300x"), ("mi355x", "mi300x")):
        ga, gb = load_hardware(a).efficiency.gemm, load_hardware(b).efficiency.gemm
        assert (ga.half_dim.value, ga.fixed_us.value) == (gb.half_dim.value, gb.fixed_us.value)


def test_a_larger_fixed_cost_slows_small_gemms_far_more_than_large_ones():
    hw = load_hardware("mi300x")
    r = sweep_rates(SWEEPS["mi300x"], hw, 0.445, 97.0, 8e-6)
    slow = replace(r, gemm_overhead_s=33e-6)
    small = point_tflops(1024, 1024, 1024, "fp8", r) / point_tflops(1024, 1024, 1024, "fp8", slow)
    large = point_tflops(8192, 8192, 8192, "fp8", r) / point_tflops(8192, 8192, 8192, "fp8", slow)
    assert small > 2.0 and math.isclose(large, 1.0, rel_tol=0.03)  # 25 us of about 1 ms
