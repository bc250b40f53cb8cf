"""ddplan.calibration: the calibration file schema, its loading errors, and fit_factor."""

from __future__ import annotations

import copy
import math

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from ddplan.calibration import CalibrationSpec, fit_factor
from ddplan.errors import SpecError
from ddplan.registry import load_calibration

FULL = {
    "kind": "calibration",
    "version": 1,
    "hardware": "mi300x",
    "provenance": {"device_name": "AMD Instinct MI300X", "device_count": 8, "backend": "rocm",
                   "torch": "2.5.1+rocm6.2", "hip": "6.2.41133", "driver": "6.8.5", "tunableop": "1",
                   "date": "2026-06-01", "host": "node-0"},
    "hbm_tbyte_per_s": 4.1,
    "kernel_overhead_us": 6.5,
    "peak_gemm_tflops": 700.0,
    "gemm": [{"m": 65536, "n": 1536, "k": 1536, "dtype": "bf16", "tflops": 480.0, "label": "c_q fwd"},
             {"m": 65536, "n": 6144, "k": 1536, "tflops": 600.0}],
    "attention": [{"implementation": "sdpa-fused", "batch": 32, "heads": 12, "seq_len": 2048, "window": 2048,
                   "head_dim": 128, "fwd_tflops": 250.0, "bwd_tflops": 70.0}],
    "collectives": [{"collective": "all_reduce", "group_size": 8, "size_bytes": 1e9, "time_s": 0.0056},
                    {"collective": "all_gather", "group_size": 16, "size_bytes": 1e8, "time_s": 0.001,
                     "tier": "inter_node"}],
    "step_times": [{"model": "nanochat-d24", "gpus": 1, "step_time_s": 7.7, "device_batch_size": 32,
                    "total_batch_tokens": 524288, "attention": "sdpa-fused", "window_pattern": "L",
                    "seq_len": 2048, "compiled": True, "recompute": "none", "peak_memory_gb": 150.0,
                    "source": "stated by the user (seed note)"}],
    "failures": ["collectives: torch.distributed not initialised"],
}


def with_change(path, value):
    """FULL with the value at a dotted path (list indices as ints) replaced; value None deletes it."""
    data = copy.deepcopy(FULL)
    *parents, last = path
    node = data
    for p in parents:
        node = node[p]
    if value is None:
        del node[last]
    else:
        node[last] = value
    return data


def write(tmp_path, data, name="cal.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data), encoding="utf-8")
    return p


# --------------------------------------------------------------------------------------------
# schema


def test_full_example_validates():
    spec = CalibrationSpec.model_validate(FULL)
    assert spec.hardware == "mi300x" and spec.version == 1
    assert spec.provenance.backend == "rocm" and spec.provenance.device_count == 8
    assert spec.gemm[1].dtype == "bf16"  # default
    assert spec.collectives[0].tier == "intra_node" and spec.collectives[1].tier == "inter_node"
    assert spec.step_times[0].step_time_s == 7.7
    assert spec.failures == ["collectives: torch.distributed not initialised"]


def test_minimal_file_validates_with_empty_sections():
    spec = CalibrationSpec.model_validate({"kind": "calibration", "hardware": "h100-sxm"})
    assert (spec.gemm, spec.attention, spec.collectives, spec.step_times, spec.failures) == ([], [], [], [], [])
    assert spec.provenance is None and spec.hbm_tbyte_per_s is None
    assert spec.kernel_overhead_us is None and spec.peak_gemm_tflops is None


def test_spec_is_frozen():
    spec = CalibrationSpec.model_validate(FULL)
    with pytest.raises(ValidationError):
        spec.hardware = "h200"


@pytest.mark.parametrize("path, value", [
    (("gpu",), "mi300x"),  # unknown top-level key
    (("gemm", 0, "tflop"), 1.0),  # unknown key in a point
    (("provenance", "rocm"), "6.2"),
    (("step_times", 0, "step_s"), 1.0),
])
def test_rejects_unknown_keys(path, value):
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        CalibrationSpec.model_validate(with_change(path, value))


@pytest.mark.parametrize("path, value", [
    (("version",), 2),
    (("kind",), "hardware"),
    (("collectives", 0, "time_s"), -0.001),
    (("collectives", 0, "time_s"), 0.0),
    (("step_times", 0, "step_time_s"), -7.7),
    (("gemm", 0, "tflops"), -1.0),
    (("attention", 0, "bwd_tflops"), 0.0),
    (("hbm_tbyte_per_s",), -4.1),
    (("kernel_overhead_us",), 0.0),
    (("peak_gemm_tflops",), -700.0),
    (("collectives", 0, "group_size"), 1),
    (("collectives", 0, "collective"), "broadcast"),
    (("step_times", 0, "window_pattern"), "SXL"),
    (("step_times", 0, "recompute"), "some"),
    (("provenance", "backend"), "metal"),
    (("hardware",), None),  # required
])
def test_rejects_bad_values(path, value):
    with pytest.raises(ValidationError):
        CalibrationSpec.model_validate(with_change(path, value))


# --------------------------------------------------------------------------------------------
# loading through the registry: one-line SpecError naming the file and field


def test_load_calibration_reads_a_good_file(tmp_path):
    spec = load_calibration(str(write(tmp_path, FULL)))
    assert spec == CalibrationSpec.model_validate(FULL)


@pytest.mark.parametrize("path, value, field, what", [
    (("collectives", 0, "time_s"), -0.001, "collectives.0.time_s", "greater than 0"),
    (("step_times", 0, "step_time_s"), -7.7, "step_times.0.step_time_s", "greater than 0"),
    (("version",), 2, "version", "Input should be 1 (got 2)"),
    (("gemm", 0, "tflop"), 1.0, "gemm.0.tflop", "unknown key"),
])
def test_load_calibration_bad_file_is_one_line_spec_error(tmp_path, path, value, field, what):
    p = write(tmp_path, with_change(path, value))
    with pytest.raises(SpecError) as info:
        load_calibration(str(p))
    err = info.value
    assert err.file == str(p)
    assert err.field == field
    line = err.one_line()
    assert "\n" not in line
    assert line.startswith(f"error: {p}: {field}: ")
    assert what in line


def test_load_calibration_unknown_key_lists_allowed_keys(tmp_path):
    p = write(tmp_path, with_change(("gemm", 0, "tflop"), 1.0))
    with pytest.raises(SpecError, match="did you mean 'tflops'"):
        load_calibration(str(p))


def test_load_calibration_missing_file(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(SpecError) as info:
        load_calibration(str(missing))
    assert info.value.file == str(missing)
    assert "--calibration" in info.value.one_line()


def test_load_calibration_yaml_syntax_error_names_line(tmp_path):
    p = tmp_path / "broken.yaml"
    p.write_text("kind: calibration\nhardware: [mi300x\n", encoding="utf-8")
    with pytest.raises(SpecError) as info:
        load_calibration(str(p))
    assert info.value.file == str(p)
    assert info.value.field.startswith("line ")


def test_load_calibration_not_a_mapping(tmp_path):
    p = tmp_path / "list.yaml"
    p.write_text("- 1\n- 2\n", encoding="utf-8")
    with pytest.raises(SpecError, match="mapping"):
        load_calibration(str(p))


# --------------------------------------------------------------------------------------------
# fit_factor


def predict(f: float) -> float:
    """A decreasing synthetic step time: 2 s that no knob touches + 5 s of work at efficiency x f."""
    return 2.0 + 5.0 / f


def test_fit_factor_recovers_known_factor():
    """Measured 2 + 5 / 0.7 = 9.142857 s -> f = 0.7."""
    measured = predict(0.7)
    assert measured == pytest.approx(9.142857, rel=1e-6)
    assert fit_factor(predict, measured) == pytest.approx(0.7, rel=1e-6, abs=1e-6)


@given(f=st.floats(0.002, 900.0))
def test_fit_factor_recovers_any_factor_in_range(f):
    got = fit_factor(predict, predict(f))
    assert got == pytest.approx(f, rel=2e-6)


def test_fit_factor_exact_when_prediction_matches_at_one():
    assert fit_factor(predict, predict(1.0)) == pytest.approx(1.0, rel=1e-6)


@pytest.mark.parametrize("measured", [1.0, 2.0, 2.004, 6000.0, 1e9])
def test_fit_factor_outside_reachable_range(measured):
    """With f in [1e-3, 1e3] the prediction spans 2 + 5/1e3 = 2.005 s to 2 + 5/1e-3 = 5002 s."""
    with pytest.raises(ValueError, match="outside"):
        fit_factor(predict, measured)


@pytest.mark.parametrize("measured", [0.0, -1.0])
def test_fit_factor_rejects_non_positive_measurement(measured):
    with pytest.raises(ValueError, match="positive"):
        fit_factor(predict, measured)


def test_fit_factor_custom_bracket():
    assert fit_factor(predict, predict(0.7), lo=0.5, hi=2.0) == pytest.approx(0.7, rel=1e-6)
    with pytest.raises(ValueError):
        fit_factor(predict, predict(0.7), lo=0.8, hi=2.0)
    assert math.isfinite(fit_factor(predict, predict(1e-3)))  # the bracket's end is reachable


def test_allocator_fraction_is_the_reserve_over_the_predicted_activations():
    """Hand: allocated 30 GB, reserved 33 GB, activations 20 GB: (33 - 30) / 20 = 0.15."""
    from ddplan.calibration import allocator_fraction, memory_section

    assert allocator_fraction(30e9, 33e9, 20e9) == pytest.approx(0.15)
    assert allocator_fraction(30e9, 30e9, 20e9) == 0.0
    with pytest.raises(ValueError):
        allocator_fraction(30e9, 29e9, 20e9)  # reserved below allocated is not torch's figures
    with pytest.raises(ValueError):
        allocator_fraction(30e9, 33e9, 0.0)
    section = memory_section(30e9, 33e9, 20e9, 2**30 * 0.75, 16, 2048)
    assert section["framework_gib"] == pytest.approx(0.75) and section["allocator_fraction"] == pytest.approx(0.15)
    assert section["measured"] == {"allocated_gb": 30.0, "reserved_gb": 33.0, "predicted_activations_gb": 20.0,
                                   "outside_allocator_gb": pytest.approx(0.805306368), "batch": 16, "seq_len": 2048}


def test_memory_assumptions_take_what_the_section_states_and_assume_the_rest():
    from ddplan.calibration import memory_assumptions
    from ddplan.memory import MemoryAssumptions

    base = {"kind": "calibration", "version": 1, "hardware": "h100"}
    assert memory_assumptions(None) == MemoryAssumptions()
    assert memory_assumptions(CalibrationSpec.model_validate(base)) == MemoryAssumptions()
    cal = CalibrationSpec.model_validate({**base, "memory": {"framework_gib": 0.6}})
    assert memory_assumptions(cal) == MemoryAssumptions(framework_gib=0.6)
    measured = {"allocated_gb": 30.0, "reserved_gb": 33.0, "predicted_activations_gb": 20.0,
                "outside_allocator_gb": 0.8, "batch": 16, "seq_len": 2048}
    cal = CalibrationSpec.model_validate({**base, "memory": {"framework_gib": 0.75, "allocator_fraction": 0.15,
                                                             "measured": measured}})
    assert memory_assumptions(cal) == MemoryAssumptions(framework_gib=0.75, allocator_fraction=0.15)
    with pytest.raises(ValueError):  # a typo is refused, not ignored
        CalibrationSpec.model_validate({**base, "memory": {"framework_gb": 0.6}})
