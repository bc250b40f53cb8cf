"""`ddplan calibrate` always finishes: tiny or failing measurements are recorded, SIGTERM leaves a valid
partial file that lists what was not measured, shapes are sized to the device, and the file is
self-contained (a CPU calibration carries its own hardware spec)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

pytest.importorskip("torch")

from ddplan.calibrate import bench, eta, runner  # noqa: E402
from ddplan.calibrate.runner import CalibrateRequest, pass_mean, plan_shapes, run, sig  # noqa: E402
from ddplan.registry import calibration_hardware, load_calibration, load_model  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def test_significant_figures_never_round_to_zero():
    assert sig(0.0000412345) == 4.1234e-05 and sig(123456.7) == 123460.0 and sig(3.0) == 3.0


def test_cpu_shapes_are_small_by_default():
    """The recipe's 32 x 2048 on a CPU took 22.9 GB (issue 11); the CPU default is 4 x 256."""
    req = CalibrateRequest(model=load_model("d4"), hardware=None, device="cpu", out=Path("unused.yaml"),
                           cpu_malloc="system")
    shapes = plan_shapes(req, None)
    assert (shapes.seq_len, shapes.step_batch, shapes.micro_batches) == (256, 4, (1, 2, 4))
    assert shapes.peak_bytes < 2 * 2**30
    # a full run keeps freed memory by default, and plans for the larger peak that costs
    kept = plan_shapes(replace(req, cpu_malloc=None), None)
    assert kept.peak_bytes == pytest.approx(runner.REUSE_PEAK_FACTOR * shapes.peak_bytes, rel=1e-9)


def test_gpu_shapes_shrink_to_the_free_memory():
    """d24's 32 x 2048 step needs ~90 GiB: with 48 GiB free the held-out micro-batch halves until it fits;
    with 16 GiB not even micro-batch 1 fits (its model states alone are ~12 GiB): the step is skipped, said."""
    req = CalibrateRequest(model=load_model("d24"), hardware=None, device="cuda", out=Path("unused.yaml"))
    shapes = plan_shapes(req, 48 * 2**30)
    assert 1 <= shapes.step_batch < 32 and shapes.peak_bytes <= runner.GPU_MEMORY_SHARE * 48 * 2**30
    assert not shapes.skip_step and "does not fit" in shapes.notes[0]
    small = plan_shapes(req, 16 * 2**30)
    assert small.skip_step and small.step_batch == 1 and "skipped" in small.notes[0]


def test_tiny_and_failing_measurements_are_recorded_and_the_run_completes(tmp_path, monkeypatch):
    """GEMMs at 1e-9 TFLOP/s (kept to significant figures, not rounded to 0), an attention benchmark
    that returns zero (fails validation: recorded, left out), HBM that raises: the run finishes, the
    file is valid, and every problem is listed."""
    def broken(*a, **k):
        raise RuntimeError("no bandwidth today")

    _stub_benchmarks(monkeypatch, bench_gemm_stats=lambda *a, **k: (1.234e-9, 0.5),
                     bench_attention=lambda *a, **k: (0.0, 0.0), bench_hbm=broken)
    out = tmp_path / "cal.yaml"
    req = CalibrateRequest(model=load_model("d2"), hardware=None, device="cpu", out=out, quick=True,
                           seq_len=64, step_batch=1, micro_batches=(1,))
    cal, hw, _ = run(req)
    again = load_calibration(str(out))
    assert again == cal
    assert cal.gemm and all(p.tflops == 1.234e-9 and p.spread_pct == 50.0 for p in cal.gemm)
    assert not cal.attention and cal.hbm_tbyte_per_s is None
    text = " | ".join(cal.failures)
    assert "attention" in text and "fwd_tflops" in text
    assert "HBM bandwidth: RuntimeError: no bandwidth today" in text
    assert "the machine looks busy" in text  # every GEMM spread 50%
    assert "training step: not in this test" in text
    # how host memory behaved is recorded even though the held-out step did not run
    assert cal.provenance.host_memory.startswith("system malloc as it is (the --quick default)")
    assert cal.hardware_spec is not None and calibration_hardware(cal, str(out)).name == "cpu-local"
    assert (cal.seq_len, cal.dtype) == (64, "fp32")
    assert oct(out.stat().st_mode & 0o777) == oct(0o666 & ~_umask())


@pytest.mark.parametrize("noisy_small", [True, False], ids=["tiny-shapes-jitter", "large-shapes-spread"])
def test_the_busy_warning_weighs_shapes_by_their_time(tmp_path, monkeypatch, noisy_small):
    """Microsecond GEMMs (the smear and value-embedding gates) jitter by tens of percent on a quiet
    machine; the warning counts each shape by its time, so only a spread in the GEMMs that hold the time
    says the machine is busy."""
    small = 2e5  # m n k below this: the gates (d2 at sequence 64: 64 x 1 x 24 and the like)

    def stats(m, n, k, **_):
        tiny = m * n * k < small
        return 0.1, (0.5 if tiny == noisy_small else 0.01)

    _stub_benchmarks(monkeypatch, bench_gemm_stats=stats)
    monkeypatch.setattr(runner.os, "getloadavg", lambda: (0.0, 0.0, 0.0))  # not the load-average branch
    req = CalibrateRequest(model=load_model("d2"), hardware=None, device="cpu", out=tmp_path / "c.yaml", quick=True,
                           seq_len=64, step_batch=1, micro_batches=(1,))
    cal, _, _ = run(req)
    tiny = [p for p in cal.gemm if p.m * p.n * p.k < small]
    assert len(tiny) > len(cal.gemm) / 4  # by count alone, the tiny shapes would call the machine busy
    busy = [f for f in cal.failures if "looks busy" in f]
    if noisy_small:
        assert not busy
    else:
        assert len(busy) == 1 and "of the measured GEMM time" in busy[0]
    assert [runner.shape_count(p.label) for p in cal.gemm[:1]] == [1]
    assert runner.shape_count("h*.attn.c_q fwd (+7 same shape)") == 8


def test_pass_mean_is_the_rate_at_the_mean_time():
    """(1000, 1000, 1000) is 2e9 FLOP: passes of 10 ms and 30 ms average 20 ms, 0.1 TFLOP/s (not the mean of
    0.2 and 0.0667); the spread is the larger of the first pass's 5% and the passes' range, 20/20 ms = 100%."""
    assert pass_mean(1000, 1000, 1000, [0.01, 0.03], 5.0) == {"tflops": 0.1, "spread_pct": 100.0}
    assert pass_mean(1000, 1000, 1000, [0.02], 5.0) == {"tflops": 0.1, "spread_pct": 5.0}
    with pytest.raises(ValueError):
        pass_mean(1, 1, 1, [], 1.0)


def _stub_benchmarks(monkeypatch, **overrides) -> None:
    """Every micro-benchmark replaced by a fixed, plausible answer (no torch work): for tests of what the run
    does with its measurements, not of the measuring (test_calibrate_bench times the real ones); overrides
    replace any of them or add others (bench_probe_s)."""
    stubs = dict(
        bench_gemm_stats=lambda *a, **k: (0.1, 0.01),
        bench_peak_gemm=lambda *a, **k: (0.3, (256, 256, 256)), bench_attention=lambda *a, **k: (0.05, 0.05),
        bench_hbm=lambda *a, **k: 0.01, bench_loss_head_s=lambda *a, **k: (4e-4, 1e-3),
        bench_adamw_s=lambda *a, **k: 1e-3, bench_muon_s=lambda *a, **k: 2e-3,
        bench_kernel_overhead_us=lambda *a, **k: 10.0,
        bench_train_step=lambda *a, **k: {"skipped": "not in this test"})
    for name, fn in {**stubs, **overrides}.items():
        monkeypatch.setattr(bench, name, fn)


def test_a_full_run_times_every_gemm_twice_and_keeps_the_mean(tmp_path, monkeypatch):
    """Without --quick every GEMM shape is timed in GEMM_PASSES passes; a shape measured at 0.1 then 0.3
    TFLOP/s is recorded at the rate of its mean time, 2 / (1/0.1 + 1/0.3) = 0.15, with a 100% spread
    (times 1/0.1 and 1/0.3 around their mean 6.67: range 6.67 / 6.67). The second pass runs after the
    held-out step, so the rates and the step span the same minutes; each pass is in the file at once."""
    calls: dict[tuple, int] = {}

    def stats(m, n, k, **kw):
        calls[(m, n, k)] = calls.get((m, n, k), 0) + 1
        return (0.1 if calls[(m, n, k)] % 2 else 0.3), 0.01

    in_file_after_gemms = []

    def peak(*a, **k):  # the next stage: what the file holds once the GEMMs are done
        in_file_after_gemms.extend(p["tflops"] for p in yaml.safe_load((tmp_path / "c.yaml").read_text())["gemm"])
        return 0.3, (256, 256, 256)

    passes_before_step = []

    def step(*a, **k):
        passes_before_step.extend(calls.values())
        return {"skipped": "not in this test"}

    _stub_benchmarks(monkeypatch, bench_gemm_stats=stats, bench_peak_gemm=peak, bench_train_step=step)
    req = CalibrateRequest(model=load_model("d2"), hardware=None, device="cpu", out=tmp_path / "c.yaml",
                           seq_len=64, step_batch=1, micro_batches=(1,))
    cal, _, _ = run(req)
    assert calls and set(calls.values()) == {runner.GEMM_PASSES} == {2}
    assert passes_before_step and set(passes_before_step) == {1}  # one pass before the step, one after
    assert all(p.tflops == 0.15 and p.spread_pct == 100.0 for p in cal.gemm)
    assert in_file_after_gemms and set(in_file_after_gemms) == {0.1}  # the first pass is written at once
    assert {p["tflops"] for p in yaml.safe_load((tmp_path / "c.yaml").read_text())["gemm"]} == {0.15}
    assert load_calibration(str(tmp_path / "c.yaml")).gemm == cal.gemm


def test_the_second_gemm_pass_re_times_only_what_the_first_measured(tmp_path, monkeypatch):
    """A first GEMM pass that fails part-way is a recorded failure; the pass after the held-out step re-times
    the shapes the first one measured (and no other), and the run completes."""
    calls: dict[tuple, int] = {}

    def stats(m, n, k, **kw):
        calls[(m, n, k)] = calls.get((m, n, k), 0) + 1
        if len(calls) == 3 and calls[(m, n, k)] == 1:
            raise RuntimeError("a benchmark that fails")
        return 0.1, 0.01

    _stub_benchmarks(monkeypatch, bench_gemm_stats=stats)
    req = CalibrateRequest(model=load_model("d2"), hardware=None, device="cpu", out=tmp_path / "c.yaml",
                           seq_len=64, step_batch=1, micro_batches=(1,))
    cal, _, _ = run(req)
    assert len(cal.gemm) == 2 and all(p.tflops == 0.1 for p in cal.gemm)
    assert sorted(calls.values()) == [1, 2, 2]  # the two measured shapes twice, the failed one not again
    assert any("a benchmark that fails" in f for f in cal.failures)
    assert not any(f.startswith("GEMMs again") for f in cal.failures)



def test_a_quick_run_has_no_second_gemm_stage(tmp_path, monkeypatch):
    """--quick times each GEMM shape once: its progress names every stage but the second pass (nine of ten),
    and a full run's names all ten."""
    _stub_benchmarks(monkeypatch)
    for quick, expected in ((True, 9), (False, 10)):
        seen: list[str] = []
        req = CalibrateRequest(model=load_model("d2"), hardware=None, device="cpu", out=tmp_path / f"{quick}.yaml",
                               seq_len=64, step_batch=1, micro_batches=(1,), quick=quick)
        run(req, seen.append)
        assert len(seen) == expected
        assert any(s.startswith("GEMMs again") for s in seen) is not quick

def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.slow
def test_sigterm_leaves_a_valid_partial_file(tmp_path):
    """SIGTERM once the GEMMs are in the file: exit 1 with one error line, and the file loads and says
    which benchmarks were not measured."""
    out = tmp_path / "cal.yaml"
    proc = subprocess.Popen([sys.executable, "-m", "ddplan.cli", "calibrate", "--device", "cpu", "--quick", "--model",
                             "d2", "--seq-len", "64", "--device-batch-size", "1", "--out", str(out)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if out.exists() and "tflops:" in out.read_text(encoding="utf-8"):  # the first GEMM points are in
            break
        if proc.poll() is not None:
            pytest.fail(f"calibrate ended before it could be interrupted: {proc.stderr.read()}")
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 1 and len(errors) == 1 and "interrupted (SIGTERM)" in errors[0], err
    cal = load_calibration(str(out))
    assert cal.gemm
    (note,) = [f for f in cal.failures if f.startswith("interrupted")]
    assert "not measured:" in note and "training step (held out)" in note


def test_gpu_check_dry_run_on_cpu(tmp_path, monkeypatch, capsys):
    """benchmarks/gpu_check.py, the script to run on a CUDA or ROCm box, runs end to end with --device cpu and
    reports every figure. The benchmarks answer fixed figures here (the real ones run on CPU in
    test_calibrate_cli's calibration and the `calibrate` help example): this checks the script's report."""
    import runpy

    def step(*a, **k):
        return {"step_time_s": 0.05, "fwd_s": 0.015, "bwd_s": 0.03, "optimizer_s": 0.005, "peak_memory_bytes": None,
                "compiled": False, "compiled_optimizer": False, "first_step_s": 0.1, "page_faults": 0,
                "compile_notes": []}

    _stub_benchmarks(monkeypatch, bench_train_step=step)
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--device", "cpu", "--models", "d2", "--seq-len", "64",
                                      "--out-dir", str(tmp_path)])
    runpy.run_path(str(REPO / "benchmarks" / "gpu_check.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "GEMM fp32: best of the sweep 0.3 TFLOP/s" in out and "GEMM at the model's" in out
    assert "median 0.1 TFLOP/s" in out and "attention sdpa-fused: forward up to 0.05" in out
    assert "HBM copy 0.01 TB/s" in out and "held-out step, step: measured 0.05 s" in out
    assert (tmp_path / "calibration-nanochat-d2.yaml").is_file()


def test_the_cpu_spec_peak_is_the_best_gemm_measured_anywhere(tmp_path, monkeypatch):
    """The quick sweep (2 shapes) can be slower than the model's own shapes: the CPU spec's peak is the
    best of all, so no calibrated row claims to beat the machine's peak."""
    _stub_benchmarks(monkeypatch, bench_gemm_stats=lambda *a, **k: (0.15, 0.01),
                     bench_peak_gemm=lambda *a, **k: (0.02, (256, 256, 256)))
    req = CalibrateRequest(model=load_model("d2"), hardware=None, device="cpu", out=tmp_path / "c.yaml", quick=True,
                           seq_len=64, step_batch=1, micro_batches=(1,))
    cal, hw, _ = run(req)
    assert hw.peak.bf16_tflops.value == 0.15 and cal.hardware_spec["peak"]["bf16_tflops"]["value"] == 0.15


def test_calibrate_refuses_a_sequence_the_model_cannot_take(capsys):
    from cli_helpers import fails

    _, line = fails(capsys, ["calibrate", "--model", "d2", "--device", "cpu", "--seq-len", "4096"])
    assert line.startswith("error: --seq-len: ")


def test_the_held_out_step_runs_as_the_training_program_does():
    """nanochat compiles its model (the recipe) and its optimizer kernels; GPT-2's recipe compiles the model
    only (nanoGPT's torch AdamW); --quick and --eager-step run eager, --compiled-step compiles under --quick."""
    def program(name, **kw):
        p = runner.step_program(CalibrateRequest(model=load_model(name), hardware=None, device="cpu",
                                                 out=Path("unused.yaml"), **kw))
        return p.model, p.optimizer

    assert program("d2") == (True, True) and program("gpt2") == (True, False)
    assert program("d2", quick=True) == (False, False) and program("d2", compile_step=False) == (False, False)
    assert program("d2", quick=True, compile_step=True) == (True, True)


def _fake_step(compiled: bool, notes=()):
    def fake(*a, compile_model, compile_optimizer, **k):
        assert compile_model and compile_optimizer  # what the runner asked for
        return {"step_time_s": 0.05, "fwd_s": 0.015, "bwd_s": 0.03, "optimizer_s": 0.005, "peak_memory_bytes": None,
                "compiled": compiled, "compiled_optimizer": compiled, "first_step_s": 2.0, "page_faults": 12,
                "compile_notes": list(notes)}
    return fake


def test_a_compiled_step_is_recorded_and_compared_with_a_compiled_prediction(tmp_path, monkeypatch):
    """The file and the summary say the step ran compiled; check_step prices the compiled layout (what
    torch.compile saves and fuses), which differs from the eager prediction."""
    from ddplan.layout import NATIVE_ZERO, Layout
    from ddplan.price import Pricer, RunPlan
    from ddplan.specs import run_variant
    from ddplan.verdicts import calibrate_summary

    asked = {}

    def adamw_s(*a, compiled, **k):
        asked["adamw"] = compiled
        return 1e-3

    def head_s(*a, compiled, **k):
        asked["head"] = compiled
        return 4e-4, 1e-3  # forward, forward + backward

    _stub_benchmarks(monkeypatch, bench_adamw_s=adamw_s, bench_loss_head_s=head_s,
                     bench_train_step=_fake_step(compiled=True))
    spec = load_model("d2")
    req = CalibrateRequest(model=spec, hardware=None, device="cpu", out=tmp_path / "c.yaml", quick=True,
                           seq_len=64, step_batch=1, micro_batches=(1,), compile_step=True)
    cal, hw, held_out = run(req)
    assert asked["adamw"] is True  # the AdamW benchmark times the kernel the step runs
    assert asked["head"] is True and cal.pointwise_compiled  # and the elementwise chain as the step runs it
    from ddplan.anatomy import build_anatomy

    head = [op for op in build_anatomy(runner.spec_for_device(spec, "cpu"), batch=1, seq_len=64).ops
            if op.name in ("logits_cast", "logits_softcap", "cross_entropy")]
    fwd_bytes, bwd_bytes = sum(op.bytes_fwd for op in head), sum(op.bytes_bwd for op in head)
    # forward 0.4 ms, backward the other 0.6 ms: each direction's bytes over its own time
    assert cal.pointwise_fwd_tbyte_per_s == pytest.approx(fwd_bytes / 4e-4 / 1e12, rel=1e-4)
    assert cal.pointwise_bwd_tbyte_per_s == pytest.approx(bwd_bytes / 6e-4 / 1e12, rel=1e-4)
    assert cal.pointwise_tbyte_per_s == pytest.approx((fwd_bytes + bwd_bytes) / 1e-3 / 1e12, rel=1e-4)
    from collections import Counter

    from ddplan.anatomy import muon_matrices

    # one Muon step per shape stack of the Muon groups, each as measured (2 ms here)
    stacks = Counter(s for g in ("block_matrices", "ve_gates") for s in muon_matrices(spec, g))
    assert {(p.rows, p.cols, p.count) for p in cal.muon} == {(r, c, k) for (r, c), k in stacks.items()}
    assert all(p.seconds == 2e-3 for p in cal.muon)
    assert cal.step_program.compiled_model and cal.step_program.compiled_optimizer and cal.step_times[0].compiled
    assert "compiled model, compiled optimizer" in cal.step_times[0].source
    assert any("ran compiled model, compiled optimizer" in line and "priced compiled" in line
               for line in calibrate_summary(cal))
    # on CPU the file says how host memory behaved (malloc kept freed memory, on glibc) and the step's faults
    from ddplan.calibrate.allocator import REUSE, _glibc

    assert cal.step_program.page_faults_per_step == 12
    # --quick keeps the system's malloc by default (smaller); asked for, memory is reused
    assert cal.provenance.host_memory.startswith("system malloc as it is (the --quick default)")
    cal2, _, _ = run(replace(req, out=tmp_path / "c2.yaml", cpu_malloc="reuse"))
    assert cal2.provenance.host_memory == (REUSE if _glibc() else "system malloc as it is (not glibc's malloc: nothing set)")
    with pytest.raises(ValueError, match="cpu_malloc must be reuse, system or None"):
        run(replace(req, out=tmp_path / "c3.yaml", cpu_malloc="jemalloc"))
    assert any(line.startswith("calibrate: host memory: ") and "12 minor page faults" in line
               for line in calibrate_summary(cal))
    (step,) = [r for r in runner.check_step(spec, hw, cal, held_out, "cpu") if r["term"] == "step"]
    run_spec = run_variant(runner.spec_for_device(spec, "cpu"), seq_len=64)
    after = Pricer(run_spec, hw, RunPlan(run_spec.recipe.budget, hw.price), cal.model_copy(update={"step_times": []}))

    def predicted(compiled: bool) -> float:
        layout = Layout(dp=1, zero=NATIVE_ZERO[spec.recipe.distribution], micro_batch=1, grad_accum=1,
                        attention="sdpa-fused", compiled=compiled)
        return after.step(layout, run_spec.architecture.window_pattern).total_s

    assert step["after_s"] == pytest.approx(predicted(True), rel=1e-9)
    assert predicted(True) != pytest.approx(predicted(False), rel=1e-3)
    assert step["after_error_pct"] == pytest.approx(100 * (predicted(True) - 0.05) / 0.05, rel=1e-9)


def test_a_compile_that_falls_back_is_recorded(tmp_path, monkeypatch):
    """Compilation failed (the step ran eager): the file says what ran and what was asked, the reason is a
    note, and the prediction is the eager one."""
    _stub_benchmarks(monkeypatch, bench_train_step=_fake_step(False, ["the model ran eager, torch.compile failed: "
                                                                      "RuntimeError: no C++ compiler"]))
    spec = load_model("d2")
    req = CalibrateRequest(model=spec, hardware=None, device="cpu", out=tmp_path / "c.yaml", quick=True,
                           seq_len=64, step_batch=1, micro_batches=(1,), compile_step=True)
    cal, hw, held_out = run(req)
    prog = load_calibration(str(tmp_path / "c.yaml")).step_program
    assert (prog.compiled_model, prog.compiled_optimizer, prog.asked) == (False, False,
                                                                          "compiled model, compiled optimizer")
    assert not cal.step_times[0].compiled
    assert any(f.startswith("training step: the model ran eager") and "no C++ compiler" in f for f in cal.failures)
    assert held_out["compiled"] is False


def test_a_loss_head_that_does_not_compile_is_timed_eager_and_said(tmp_path, monkeypatch):
    """torch.compile of the elementwise chain fails: it is timed eager and the file says so (pointwise_compiled
    false, a note); ddplan.roofline.pointwise_rate then converts that eager rate for a compiled step."""
    def head_s(*a, compiled=False, **k):
        if compiled:
            raise RuntimeError("no C++ compiler")
        return 4e-4, 1e-3

    _stub_benchmarks(monkeypatch, bench_loss_head_s=head_s, bench_train_step=_fake_step(compiled=True))
    req = CalibrateRequest(model=load_model("d2"), hardware=None, device="cpu", out=tmp_path / "c.yaml", quick=True,
                           seq_len=64, step_batch=1, micro_batches=(1,), compile_step=True)
    cal, _, _ = run(req)
    assert cal.pointwise_tbyte_per_s and cal.pointwise_compiled is False
    assert any(f.startswith("elementwise ops: timed eager") and "no C++ compiler" in f for f in cal.failures)


def _estimates(name: str = "d2", **kw) -> tuple[float, ...]:
    """stage_estimates_s of a CPU run of model `name`, at the shapes calibrate would time."""
    from ddplan.calibrate.bench import gemm_shapes

    req = CalibrateRequest(model=load_model(name), hardware=None, device="cpu", out=Path("unused.yaml"), **kw)
    shapes = plan_shapes(req, None)
    listed = gemm_shapes(runner.spec_for_device(req.model, "cpu"), list(shapes.micro_batches), shapes.seq_len)
    return runner.stage_estimates_s(req, shapes, listed, runner.compile_estimate_s(req.model, runner.step_program(req)))


def test_the_plan_counts_compilation_in_its_estimate():
    """Compilation is not timed but takes time: the pre-run estimate includes it in the held-out step's stage,
    and the plan says how the step runs; a full run's second GEMM pass is its own stage."""
    from ddplan.verdicts import calibrate_plan

    compiled, eager = _estimates(), _estimates(compile_step=False)
    assert len(compiled) == len(runner.STAGES)
    held_out = runner.HELD_OUT_STAGE
    assert compiled[held_out] - eager[held_out] == pytest.approx(
        runner.compile_estimate_s(load_model("d2"), runner.StepProgram(True, True)), rel=1e-9)
    assert [a for i, a in enumerate(compiled) if i != held_out] == [e for i, e in enumerate(eager) if i != held_out]
    # the second pass: each shape once more, at the full run's cost a shape (the first pass's, here)
    assert compiled[-1] == pytest.approx((runner.GEMM_PASSES - 1) * compiled[0], rel=1e-9)
    req = CalibrateRequest(model=load_model("d2"), hardware=None, device="cpu", out=Path("unused.yaml"))
    line = calibrate_plan(req.model, req, plan_shapes(req, None), runner.STAGES, 10, runner.step_program(req), 40.0,
                          sum(compiled))[0]
    assert f"roughly {sum(compiled):.0f} s;" in line
    assert "held-out step compiled model, compiled optimizer (torch.compile up to about 40 s of it" in line


# Quiet quick runs per stage (runner.stages_for(True)), seconds: this project's 2-core EPYC VM, torch 2.13 CPU,
# `ddplan calibrate --device cpu --quick -m dN` in its own scheduler group at autogroup nice -20 (another
# session's tests were running), stage times from the progress lines
QUIET_QUICK_RUNS = {"d2": (22.5, 1.2, 3.7, 2.4, 5.4, 4.6, 2.4, 0.1, 5.8),  # 2026-12-03, 48 s in all
                    "d4": (27.1, 0.8, 4.4, 0.7, 5.0, 5.1, 2.2, 0.0, 8.8),  # 54 s
                    "d6": (28.0, 0.4, 3.8, 2.5, 4.9, 10.0, 0.7, 0.0, 22.2)}  # 73 s


def test_the_quick_estimate_is_near_the_measured_runs_it_comes_from():
    """stage_estimates_s against the quick runs it was made from (QUIET_QUICK_RUNS, ddplan.calibrate.eta's
    figures): each stage within 25% or 2 s, the whole within 15%. A pre-run estimate; this fails if the shape
    list or a stage changes without being re-measured."""
    for name, measured_s in QUIET_QUICK_RUNS.items():
        estimates = _estimates(name, quick=True)
        assert len(estimates) == len(runner.stages_for(True))
        for stage, est, got in zip(runner.STAGES, estimates, measured_s):
            assert abs(est - got) <= max(2.0, 0.25 * got), (name, stage, est, got)
        assert sum(estimates) == pytest.approx(sum(measured_s), rel=0.15), (name, estimates)


def test_the_run_says_how_far_into_each_stage_it_is(tmp_path, monkeypatch):
    """within(fraction) after every GEMM shape, attention point and training step (warm-up steps included), rising
    to 1 in each of those stages: what ddplan.calibrate.eta measures the run's speed from."""
    seen: list[tuple[str, float]] = []
    stage = {"name": ""}

    def fake_step(*a, after_step, warmup, steps, **k):
        for i in range(warmup + steps):
            after_step(i)
        return {"skipped": "not in this test"}

    _stub_benchmarks(monkeypatch, bench_train_step=fake_step,
                     bench_probe_s=lambda *a, **k: 1e-3)
    req = CalibrateRequest(model=load_model("d2"), hardware=None, device="cpu", out=tmp_path / "c.yaml", quick=True,
                           seq_len=64, step_batch=1, micro_batches=(1,))
    run(req, lambda name: stage.update(name=name), within=lambda f: seen.append((stage["name"], f)))
    by_stage: dict[str, list[float]] = {}
    for name, f in seen:
        by_stage.setdefault(name, []).append(f)
    gemms = by_stage[runner.STAGES[0]]
    assert len(gemms) == len(bench.gemm_shapes(runner.spec_for_device(req.model, "cpu"), [1], 64))
    assert gemms == sorted(gemms) and gemms[-1] == pytest.approx(1.0)
    assert by_stage["attention"] == [0.5, 1.0]  # sdpa-math and sdpa-fused, one window at sequence 64
    step = by_stage[runner.STAGES[runner.HELD_OUT_STAGE]]
    assert len(step) == runner.STEP_WARMUP + runner.step_count(True) and step[-1] == pytest.approx(1.0)
    assert step == sorted(step) and step[0] > step[1] - step[0]  # the first step also builds the model


def test_progress_lines_re_estimate_from_the_run_s_own_speed(capsys):
    """Off a terminal: a line at each stage's start and, within a stage, once PROGRESS_EVERY_S has passed without
    one; the time left is the stages' estimates scaled by the run's speed so far (ddplan.calibrate.eta). Stages
    estimated at 10 and 20 s; half the first done after 10 s (twice its estimate): ratio (10 + 5) / (5 + 5) = 1.5,
    2 s later 1.5 x (5 + 20) - 2 = 35.5 s left; the first stage done at 20 s: (20 + 5) / (10 + 5) x 20 = 33 s."""
    now = {"t": 0.0}
    lines = eta.StageLines(("a", "b"), (10.0, 20.0), ("bench", "bench"), clock=lambda: now["t"])
    lines.beat()  # before the first stage: nothing to say
    lines.stage("a")
    now["t"] = 10.0
    lines.within(0.5)
    lines.beat()  # 10 s since the last line: a line
    now["t"] = 12.0
    lines.beat()  # 2 s since the last line: none
    now["t"] = 15.5
    lines.beat()
    now["t"] = 20.0
    lines.within(1.0)
    lines.stage("b")
    now["t"] = 50.0
    lines.within(1.0)
    lines.beat()
    assert capsys.readouterr().err.splitlines() == [
        "calibrate: a (1/2, 0 s, about 30 s left)", "calibrate: a (1/2, 10 s, about 38 s left)",
        "calibrate: a (1/2, 16 s, about 32 s left)", "calibrate: b (2/2, 20 s, about 33 s left)",
        "calibrate: b (2/2, 50 s, finishing)"]


def test_the_machine_speed_probe_moves_the_same_speed_prediction(tmp_path, monkeypatch):
    """The probe takes 2.0 ms through the benchmarks and 2.4 ms between the held-out step's timed steps (the
    machine 20% slower during the step): the file records both medians, and the same-speed error is the
    after prediction x 1.2 against the measured step, by hand: (1.2 a - m) / m, with a and m from the table."""
    during = {"step": False}

    def fake_step(*a, between, **k):
        during["step"] = True
        for _ in range(3):
            between()
        during["step"] = False
        return _fake_step(compiled=True)(*a, **k)

    _stub_benchmarks(monkeypatch, bench_train_step=fake_step,
                     bench_probe_s=lambda *a, **k: 2.4e-3 if during["step"] else 2.0e-3)
    req = CalibrateRequest(model=load_model("d2"), hardware=None, device="cpu", out=tmp_path / "c.yaml", quick=True,
                           seq_len=64, step_batch=1, micro_batches=(1,), compile_step=True)
    cal, hw, held_out = run(req)
    speed = load_calibration(tmp_path / "c.yaml").machine_speed
    assert (speed.benchmarks_s, speed.step_s, speed.step_probes) == (2.0e-3, 2.4e-3, 3)
    assert speed.benchmark_probes >= 9  # each stage's start but the step's, and every 4th GEMM shape
    assert speed.step_vs_benchmarks == pytest.approx(1.2)
    step = next(r for r in runner.check_step(req.model, hw, cal, held_out, "cpu") if r["term"] == "step")
    assert step["same_speed_s"] == pytest.approx(1.2 * step["after_s"])
    assert cal.held_out_error_same_speed_pct == pytest.approx(100 * (1.2 * step["after_s"] - 0.05) / 0.05, rel=1e-3)
    assert cal.held_out_error_pct == pytest.approx(100 * (step["after_s"] - 0.05) / 0.05, rel=1e-3)
    from ddplan.verdicts import calibrate_summary, held_out_title

    line = next(s for s in calibrate_summary(cal) if "machine speed" in s)
    assert "took 2.4 ms between the held-out step's timed steps against 2 ms" in line and "20% slower" in line
    assert "same speed = after x 1.200" in held_out_title(cal)


def test_no_step_no_machine_speed(tmp_path, monkeypatch):
    """Without a held-out step there is nothing to compare the benchmarks' speed with: no machine_speed."""
    _stub_benchmarks(monkeypatch)
    req = CalibrateRequest(model=load_model("d2"), hardware=None, device="cpu", out=tmp_path / "c.yaml", quick=True,
                           seq_len=64, step_batch=1, micro_batches=(1,))
    cal, _, _ = run(req)
    assert cal.machine_speed is None and cal.held_out_error_same_speed_pct is None


def test_a_gpu_steps_allocator_figures_make_the_memory_section_a_calibration_file_takes(tmp_path):
    """The held-out step's result as bench_train_step returns it on a GPU (figures by hand: 30 GB allocated, 33 GB
    reserved, 0.75 GiB outside the allocator, 20 GB of predicted activations): framework 0.75 GiB, slack 0.15, and
    the file validates with it; a CPU result (no allocator statistics) gives no section."""
    from ddplan.calibrate.runner import step_memory
    from ddplan.calibration import CalibrationSpec, memory_assumptions

    res = {"peak_memory_bytes": 30e9, "peak_reserved_bytes": 33e9, "outside_allocator_bytes": 0.75 * 2**30}
    section = step_memory(res, 20e9, 16, 2048)
    assert section == {"framework_gib": 0.75, "allocator_fraction": 0.15, "measured": {
        "allocated_gb": 30.0, "reserved_gb": 33.0, "predicted_activations_gb": 20.0,
        "outside_allocator_gb": 0.80531, "batch": 16, "seq_len": 2048}}
    cal = CalibrationSpec.model_validate({"kind": "calibration", "version": 1, "hardware": "h100", "memory": section})
    assert (memory_assumptions(cal).framework_gib, memory_assumptions(cal).allocator_fraction) == (0.75, 0.15)
    assert step_memory({"peak_memory_bytes": None, "peak_reserved_bytes": None, "outside_allocator_bytes": None},
                       20e9, 16, 2048) is None


def test_device_names_map_to_their_specs():
    """torch.cuda.get_device_name() strings as the devices report them (cudnn-frontend's benchmark csvs: "NVIDIA
    GB200", "NVIDIA GB300", "NVIDIA B200"; a B300: "NVIDIA B300 SXM6 AC"): a Grace superchip is not taken for the HGX
    part whose name its own contains ("GB200" holds "B200"); an unknown device maps to none."""
    from ddplan.calibrate.runner import guess_hardware

    assert {name: guess_hardware(name) for name in ("NVIDIA GB200", "NVIDIA GB300", "NVIDIA B200",
                                                    "NVIDIA B300 SXM6 AC", "NVIDIA H100 80GB HBM3",
                                                    "AMD Instinct MI300X", "NVIDIA L4")} == {
        "NVIDIA GB200": "gb200", "NVIDIA GB300": "gb300", "NVIDIA B200": "b200", "NVIDIA B300 SXM6 AC": "b300",
        "NVIDIA H100 80GB HBM3": "h100-sxm", "AMD Instinct MI300X": "mi300x", "NVIDIA L4": None}
