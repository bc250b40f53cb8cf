"""`ddplan calibrate` end to end on the CPU, and its file round-tripping through --calibration.

The micro-benchmarks run with tiny shapes; the collectives (torchrun + gloo) are tested in
test_calibrate_collectives.py. Timings on a shared CPU are noisy, so these tests check structure and
consistency, not speed; benchmarks/bench_calibrate_cpu.py reports the prediction errors.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
import yaml

from ddplan import cli
from ddplan.registry import load_calibration

LOG = Path(__file__).parent / "data" / "nanochat_train.log"
pytestmark = pytest.mark.xdist_group("cpu_calibration")  # one worker: the calibration (conftest) runs once


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cpu_calibration_writes_every_section(cpu_calibration):
    path, stdout, _ = cpu_calibration
    cal = load_calibration(str(path))
    assert cal.hardware == "mi300x" and cal.provenance.backend == "cpu"
    assert cal.gemm and all(p.tflops > 0 for p in cal.gemm)
    # every GEMM of the model at micro-batch 2 x 128: c_fc forward is (256, 512, 128) for d2 (d_model 128)
    assert any((p.m, p.n, p.k) == (256, 512, 128) for p in cal.gemm)
    assert {p.implementation for p in cal.attention} == {"sdpa-math", "sdpa-fused"}
    assert cal.hbm_tbyte_per_s > 0 and cal.pointwise_tbyte_per_s > 0 and cal.optimizer_tbyte_per_s > 0
    assert cal.kernel_overhead_us > 0 and cal.peak_gemm_tflops > 0
    step = cal.step_times[0]
    assert step.model == "nanochat-d2" and step.step_time_s > 0 and step.device_batch_size == 2
    assert any("collectives: skipped" in f for f in cal.failures)  # one device: said, not silent
    # the context and the allocator's reserve are torch.cuda's figures: on CPU said, and the defaults stay
    assert cal.memory is None and any(f.startswith("memory: ") and "GPU only" in f for f in cal.failures)


def test_cpu_calibration_prints_the_held_out_step(cpu_calibration):
    _, stdout, _ = cpu_calibration
    assert "held-out training step" in stdout
    for term in ("forward", "backward", "optimizer", "step"):
        assert term in stdout


def test_calibration_file_round_trips_through_table(cpu_calibration, capsys):
    path, _, _ = cpu_calibration
    code, out, err = run(capsys, "table", "--model", "d2", "--hardware", "mi300x", "--gpus", "1",
                         "--attention", "sdpa-fused", "--window", "SSSL", "--calibration", str(path),
                         "--format", "json")
    assert code == 0, err
    result = json.loads(out)
    text = " ".join(result["assumptions"])
    assert "Calibration (" in text and "GEMM efficiency at" in text and "measured" in text
    # the step calibrate measured (held out there) is the table's measurement: one knob is fitted to it
    # (at its own micro-batch 2 x 128), the measured configuration is a row of its own, and the table's
    # rows (the recipe's batch, at the calibration's sequence length and dtype) derive from it
    assert "sequence 128" in text and "compute dtype fp32" in text
    if any("measured step is not fitted" in w for w in result["warnings"]):
        # a CPU timing so noisy that no efficiency factor explains it: said, and the rows stand on the
        # micro-benchmarks alone (ddplan.table: never an error for a calibration's own step)
        assert all(r["basis"] == "model" for r in result["rows"]) and "Measured:" not in text
        return
    assert "Measured:" in text
    measured, *derived = result["rows"]
    assert (measured["basis"], measured["micro_batch"], measured["global_batch_tokens"]) == ("measured", 2, 256)
    assert derived and all(r["basis"] == "fitted" for r in derived)


def test_table_with_only_a_calibration_prices_what_it_measured(cpu_calibration, capsys):
    """Issue 11: `ddplan table --calibration FILE` needs no other flag: its model, GPUs, micro-batch, batch,
    attention and window are the measured step's, so the one row is the measured configuration."""
    path, _, _ = cpu_calibration
    cal = load_calibration(str(path))
    step = cal.step_times[0]
    code, out, err = run(capsys, "table", "--calibration", str(path), "--format", "json")
    assert code == 0, err
    result = json.loads(out)
    text = " ".join(result["assumptions"])
    assert "nanochat-d2" in text and "sequence 128" in text and "compute dtype fp32" in text
    (row,) = result["rows"]
    assert (row["gpus"], row["micro_batch"], row["global_batch_tokens"]) == (1, step.device_batch_size,
                                                                             step.total_batch_tokens)
    assert row["attention"] == step.attention
    if row["basis"] == "measured":  # fitted to it (see the round-trip test for the noisy-CPU case)
        assert row["step_s"] == pytest.approx(step.step_time_s, rel=1e-3)
    # flags given win over the measured values (256 tokens split over 2 GPUs at micro-batch 1 x 128)
    code, out, err = run(capsys, "table", "--calibration", str(path), "--gpus", "2", "--device-batch-size", "1",
                         "--format", "json")
    assert code == 0, err
    assert [(r["gpus"], r["micro_batch"]) for r in json.loads(out)["rows"]
            if r["basis"] != "measured"] == [(2, 1)]


def test_table_without_model_or_calibration_says_which_flag(capsys):
    code, _, err = run(capsys, "table", "--gpus", "1")
    assert code == 2 and "--model" in err and "Traceback" not in err


def test_table_calibration_of_a_model_not_built_in_asks_for_its_spec(cpu_calibration, capsys, tmp_path):
    path, _, _ = cpu_calibration
    data = yaml.safe_load(path.read_text())
    for step in data["step_times"]:
        step["model"] = "my-own-model"
    custom = tmp_path / "custom.yaml"
    custom.write_text(yaml.safe_dump(data))
    code, _, err = run(capsys, "table", "--calibration", str(custom))
    (line,) = err.strip().splitlines()
    assert code == 2 and "my-own-model" in line and "--model PATH" in line


def test_table_with_only_a_calibration_takes_the_steps_sequence(cpu_calibration, capsys, tmp_path):
    """A calibration without a top-level sequence length (e.g. written by hand) prices at its step's (128 here),
    not at the recipe's (2048 for nanochat)."""
    path, _, _ = cpu_calibration
    data = yaml.safe_load(path.read_text())
    data.pop("seq_len", None)
    assert all(step["seq_len"] == 128 for step in data["step_times"])
    bare = tmp_path / "bare.yaml"
    bare.write_text(yaml.safe_dump(data))
    code, out, err = run(capsys, "table", "--calibration", str(bare), "--format", "json")
    assert code == 0, err
    assert "sequence 128" in " ".join(json.loads(out)["assumptions"])


def test_calibration_written_atomically_is_valid_yaml(cpu_calibration):
    path, _, _ = cpu_calibration
    data = yaml.safe_load(path.read_text())
    assert data["kind"] == "calibration" and data["version"] == 1
    assert not list(path.parent.glob(".*.tmp"))  # no temporary file left behind


def test_from_log_reads_nanochat_lines(tmp_path, capsys):
    """Median dt over steps > 10 (7700, 7690, 7720 ms -> 7.7 s); batch from tok/sec x dt = 68,089 x 7.7
    = 524,285 -> 524,288 (nearest multiple of 1024)."""
    out = tmp_path / "log.yaml"
    code, stdout, err = run(capsys, "calibrate", "--model", "d24", "--hardware", "mi300x", "--from-log", str(LOG),
                            "--gpus", "1", "--window", "L", "--log-attention", "sdpa-fused", "--out", str(out))
    assert code == 0, err
    cal = load_calibration(str(out))
    m = cal.step_times[0]
    assert m.step_time_s == pytest.approx(7.7)
    assert m.total_batch_tokens == 524_288
    assert m.window_pattern == "L" and m.attention == "sdpa-fused"


def test_from_log_round_trip_gives_the_seed_row(tmp_path, capsys):
    out = tmp_path / "log.yaml"
    assert run(capsys, "calibrate", "--model", "d24", "--hardware", "mi300x", "--from-log", str(LOG),
               "--window", "L", "--out", str(out))[0] == 0
    code, stdout, err = run(capsys, "table", "--model", "d24", "--gpus", "1,8", "--total-batch-size", "524288",
                            "--steps", "29000", "--price", "2", "--window", "L,SSSL", "--eval-every", "0",
                            "--startup-min", "0", "--calibration", str(out), "--format", "csv")
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO("".join(x for x in stdout.splitlines(True) if not x.startswith("#")))))
    measured = [r for r in rows if r["basis"] == "measured"]
    assert len(measured) == 1 and measured[0]["config"] == "1x mi300x, sdpa-fused, L"
    assert float(measured[0]["step_s"]) == pytest.approx(7.7)
    assert float(measured[0]["mfu_pct"]) == pytest.approx(27.5, abs=0.05)


def test_from_log_without_step_lines_is_one_line_error(tmp_path, capsys):
    log = tmp_path / "empty.log"
    log.write_text("nothing to see\n")
    code, out, err = run(capsys, "calibrate", "--model", "d24", "--hardware", "mi300x", "--from-log", str(log),
                         "--out", str(tmp_path / "x.yaml"))
    assert code == 1 and err.count("\n") == 1 and err.startswith("error:") and "empty.log" in err


def test_from_log_needs_hardware(capsys):
    code, out, err = run(capsys, "calibrate", "--model", "d24", "--from-log", str(LOG))
    assert code == 2 and "--hardware" in err and err.count("\n") == 1


def test_calibrate_cuda_without_gpu_says_so(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    code, out, err = run(capsys, "calibrate", "--model", "d2", "--device", "cuda")
    assert code == 2 and "no GPU" in err and err.count("\n") == 1


def test_memory_takes_the_measured_peak_from_a_calibration_file(tmp_path, capsys):
    cal = tmp_path / "cal.yaml"
    cal.write_text(yaml.safe_dump({"kind": "calibration", "version": 1, "hardware": "mi300x", "step_times": [{
        "model": "nanochat-d24", "gpus": 1, "step_time_s": 7.7, "device_batch_size": 32,
        "total_batch_tokens": 524288, "attention": "sdpa-fused", "window_pattern": "L", "peak_memory_gb": 105,
        "peak_memory_kind": "device", "source": "the seed note"}]}))
    code, out, err = run(capsys, "memory", "--model", "d24", "--window-pattern", "L", "--calibration", str(cal),
                         "--format", "markdown")
    assert code == 0, err
    assert ("Measured 105 GB, a device reading (everything on the GPU), is consistent with: sdpa-fused, recompute "
            "none, compiled (97.1 GB" in out)


@pytest.mark.parametrize("model", [[], ["--model", "d24"]])
def test_memory_prices_the_shape_the_calibrated_peak_was_measured_at(tmp_path, capsys, model):
    """A peak is for the shape that ran: with no --model, memory takes the calibration's model, and either
    way its micro-batch (16, not the recipe's 32), GPUs, window and ZeRO stage, unless a flag says otherwise."""
    cal = tmp_path / "cal.yaml"
    cal.write_text(yaml.safe_dump({"kind": "calibration", "version": 1, "hardware": "mi300x", "step_times": [{
        "model": "nanochat-d24", "gpus": 8, "zero": 1, "step_time_s": 1.0, "device_batch_size": 16,
        "total_batch_tokens": 524288, "attention": "sdpa-fused", "window_pattern": "L", "peak_memory_gb": 60,
        "source": "a hand-made step"}]}))
    code, out, err = run(capsys, "memory", *model, "--calibration", str(cal), "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    assert "device batch 16 x 2048" in data["title"] and "8 x mi300x" in data["title"], data["title"]
    assert "Measured 60 GB" in " ".join(data["verdict"])
    code, out, err = run(capsys, "memory", *model, "--calibration", str(cal), "--device-batch-size", "4",
                         "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    assert "device batch 4 x 2048" in data["title"]
    verdict = " ".join(data["verdict"])  # a peak says nothing of another shape: not compared, and said so
    assert "Measured 60 GB" not in verdict and "--device-batch-size moved away from it, so it is not compared" in verdict


def test_the_table_title_says_whose_batch_it_prices(tmp_path, capsys):
    """The batch in the title is named for where it came from: the recipe's by default, the flag when given
    (also when it equals the recipe's), and the calibration's measured step when the table is built from it."""
    cal = tmp_path / "cal.yaml"
    cal.write_text(yaml.safe_dump({"kind": "calibration", "version": 1, "hardware": "mi300x", "step_times": [{
        "model": "nanochat-d24", "gpus": 1, "step_time_s": 7.7, "device_batch_size": 32,
        "total_batch_tokens": 524288, "attention": "sdpa-fused", "window_pattern": "L", "source": "the seed note"}]}))

    def title(*argv):
        code, out, err = run(capsys, "table", *argv, "--format", "json")
        assert code == 0, err
        return json.loads(out)["title"]

    assert "1,048,576 tokens, the recipe's batch;" in title("--model", "d24")
    assert "1,048,576 tokens, --total-batch-size;" in title("--model", "d24", "--total-batch-size", "1048576")
    assert "524,288 tokens, the measured step's batch;" in title("--calibration", str(cal))
    assert "262,144 tokens, --total-batch-size;" in title("--calibration", str(cal), "--total-batch-size", "262144")


def test_the_table_points_to_the_carried_hardware_spec_only_when_it_is_the_one_used(tmp_path, capsys):
    """A calibration carrying its hardware spec: the table says the file carries it. A --hardware file of the
    same name with other figures is not that spec: the table then points to `ddplan specs show`."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    spec = yaml.safe_load((root / "hardware" / "h100-sxm.yaml").read_text())
    spec.update(name="my-box", aliases=[])
    cal = tmp_path / "cal.yaml"
    cal.write_text(yaml.safe_dump({"kind": "calibration", "version": 1, "hardware": "my-box", "hardware_spec": spec}))

    def assumptions(*argv):
        code, out, err = run(capsys, "table", "--model", "d24", "--gpus", "8", "--calibration", str(cal), *argv,
                             "--format", "json")
        assert code == 0, err
        return " ".join(json.loads(out)["assumptions"])

    assert "(cal.yaml) carries the spec" in assumptions()
    same = tmp_path / "same.yaml"
    same.write_text(yaml.safe_dump(spec))
    assert "(cal.yaml) carries the spec" in assumptions("--hardware", str(same))
    spec["peak"]["bf16_tflops"]["value"] = 1.0 + spec["peak"]["bf16_tflops"]["value"]
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(spec))
    text = assumptions("--hardware", str(other))
    assert "carries the spec" not in text and "`ddplan specs show my-box`" in text


def _seed_step(**more) -> dict:
    return {"model": "nanochat-d24", "gpus": 1, "step_time_s": 7.7, "device_batch_size": 32,
            "total_batch_tokens": 524288, "attention": "sdpa-fused", "window_pattern": "L", "source": "by hand", **more}


def test_a_calibrations_memory_section_replaces_the_assumed_terms(tmp_path, capsys):
    """framework 0.5 GiB and allocator slack 10% of the activations, stated in the file: the framework column is
    0.5, the slack 10% of activations + transient, every other term as without the file; the words say where
    each term came from."""
    plain = tmp_path / "plain.yaml"
    plain.write_text(yaml.safe_dump({"kind": "calibration", "version": 1, "hardware": "mi300x"}))
    cal = tmp_path / "cal.yaml"
    cal.write_text(yaml.safe_dump({"kind": "calibration", "version": 1, "hardware": "mi300x",
                                   "memory": {"framework_gib": 0.5, "allocator_fraction": 0.10}}))
    rows = {}
    for name, path in (("plain", plain), ("cal", cal)):
        code, out, err = run(capsys, "memory", "--model", "d24", "--calibration", str(path), "--format", "json")
        assert code == 0, err
        rows[name] = json.loads(out)
    before, after = rows["plain"]["rows"][0], rows["cal"]["rows"][0]
    assert before["framework_gib"] == 1.0 and after["framework_gib"] == 0.5
    assert after["allocator_gib"] == pytest.approx(0.10 * (after["activations_gib"] + after["transient_gib"]))
    assert before["allocator_gib"] == pytest.approx(0.05 * (before["activations_gib"] + before["transient_gib"]))
    for term in ("params_gib", "gradients_gib", "optimizer_gib", "activations_gib", "transient_gib", "buffers_gib"):
        assert after[term] == before[term]
    words = rows["cal"]["assumptions"][0]
    assert "framework 0.5 GiB a GPU (CUDA/ROCm context, kernels; stated in cal.yaml)" in words
    assert "allocator slack 10% of the activations (stated in cal.yaml)" in words
    assert "NCCL/RCCL buffers 0.25 GiB with more than one GPU (assumed)" in words
    assert "(assumed)" in rows["plain"]["assumptions"][0] and "stated" not in rows["plain"]["assumptions"][0]


def test_a_calibrated_allocated_peak_is_compared_without_the_context_and_the_slack(tmp_path, capsys):
    """calibrate's step peak is torch's max_memory_allocated: its prediction is the total less the framework and
    allocator terms (the table's own columns), not the total a device tool would read."""
    cal = tmp_path / "cal.yaml"
    cal.write_text(yaml.safe_dump({"kind": "calibration", "version": 1, "hardware": "mi300x", "step_times": [
        _seed_step(peak_memory_gb=92.0)]}))
    code, out, err = run(capsys, "memory", "--model", "d24", "--calibration", str(cal), "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    row = data["rows"][0]
    allocated_gb = (row["total_gib"] - row["framework_gib"] - row["allocator_gib"]) * 2**30 / 1e9
    (asked,) = [m for m in data["measured_peak_matches"]
                if (m["attention"], m["recompute"], m["compiled"]) == ("sdpa-fused", "none", True)]
    assert asked["predicted_gb"] == pytest.approx(allocated_gb, rel=1e-9)
    assert "torch's allocated peak (tensors)" in " ".join(data["verdict"])
    # the same figure as a device reading is compared with the whole total
    code, out, err = run(capsys, "memory", "--model", "d24", "--measured-peak", "92", "--measured-peak-kind",
                         "device", "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    (asked,) = [m for m in data["measured_peak_matches"]
                if (m["attention"], m["recompute"], m["compiled"]) == ("sdpa-fused", "none", True)]
    assert asked["predicted_gb"] == pytest.approx(data["rows"][0]["total_gib"] * 2**30 / 1e9, rel=1e-9)


def test_a_memory_section_that_leaves_nothing_is_refused(tmp_path, capsys):
    cal = tmp_path / "cal.yaml"
    cal.write_text(yaml.safe_dump({"kind": "calibration", "version": 1, "hardware": "mi300x",
                                   "memory": {"framework_gib": 500}}))
    code, out, err = run(capsys, "memory", "--model", "d24", "--calibration", str(cal))
    assert code in (1, 2) and "memory.framework_gib" in err and err.count("\n") == 1
