"""ddplan.price: the one pricer. `table` and `plan` agree on every layout; one anatomy build and one
price call per row; a measurement is pinned to what ran; published Megatron runs (Korthikanti et al.
2022, Table 5) priced through the CLI within 15%."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from ddplan import price as price_module
from ddplan import validation as V
from ddplan.layout import NATIVE_ZERO
from ddplan.plan import PlanRequest, search
from ddplan.price import Pricer, RunPlan
from ddplan.registry import load_hardware, load_model
from ddplan.replay import table_command
from ddplan.runs import load_runs
from ddplan.table import TableRequest, build_table

from cli_helpers import csv_rows, f, fails, run_ok

ROOT = Path(__file__).resolve().parent.parent
COMPARED = ("step_s", "step_low_s", "step_high_s", "compute_s", "dp_comm_exposed_s", "tp_comm_s", "bubble_s",
            "optimizer_s", "wall_clock_h", "wall_low_h", "wall_high_h", "cost_usd", "cost_low_usd", "cost_high_usd",
            "mfu_pct", "memory_gib", "steps", "global_batch_tokens")


# --------------------------------------------------------------------------------------------
# table and plan price a layout identically


@pytest.mark.parametrize("model, hardware, gpus", [("d24", "mi300x", 8), ("gpt2-124m", "h100-sxm", 16),
                                                   ("llama-3-8b", "h100-sxm", 8), ("d12", "mi300x", 4)])
def test_table_and_plan_give_identical_figures(model, hardware, gpus):
    """A sample of the layouts `plan` keeps (its top rows, every family's best, and every 50th), each
    asked of `table` with the same flags: every figure is the same float."""
    spec, hw = load_model(model), load_hardware(hardware)
    result = search(PlanRequest(model=spec, hardware=(hw,), gpus=(gpus,), top=5))
    assert result.rows
    sample = result.rows[:5] + result.rows[::50] + [r for r in result.rows if r["family"] != result.rows[0]["family"]][:3]
    for r in sample:
        lay = r["_priced"].layout
        table = build_table(TableRequest(model=spec, hardware=hw, gpus=(gpus,), tps=(lay.tp,), pps=(lay.pp,),
                                         vps=(lay.pp_virtual_stages,), cps=(lay.cp,), zeros=(lay.zero,),
                                         micro_batches=(lay.micro_batch,), recomputes=(lay.recompute,),
                                         attentions=(lay.attention,), windows=(spec.architecture.window_pattern,)))
        (row,) = [p.row() for p in table.rows]
        assert (row["dp"], row["tp"], row["pp"], row["cp"], row["zero"], row["micro_batch"], row["accum"]) == \
            (lay.dp, lay.tp, lay.pp, lay.cp, lay.zero, lay.micro_batch, lay.grad_accum)
        # the plan bands only the rows it shows; the others are compared on everything but the band
        banded = r["step_low_s"] < r["step_s"] < r["step_high_s"]
        for k in COMPARED:
            if banded or not k.endswith(("_low_s", "_high_s", "_low_h", "_high_h", "_low_usd", "_high_usd")):
                assert row[k] == r[k], (k, row[k], r[k], lay)
        assert banded or r is not result.rows[0]


# --------------------------------------------------------------------------------------------
# one anatomy build and one price call per row


def test_one_anatomy_build_and_one_price_call_per_row(monkeypatch):
    """The seed's table (12 rows, a fitted measurement): price() runs once per row, and the anatomy is
    built at most once per row (rows that share a micro-batch, attention and window share one)."""
    builds, prices = [], []
    real_build, real_price = price_module.build_anatomy, Pricer.price
    monkeypatch.setattr(price_module, "_SHARES", OrderedDict())  # nothing from earlier tests
    monkeypatch.setattr(price_module, "build_anatomy", lambda *a, **k: builds.append(k) or real_build(*a, **k))
    monkeypatch.setattr(Pricer, "price", lambda self, *a, **k: prices.append(a) or real_price(self, *a, **k))
    out = run_ok_plain(["table", "--model", "d24", "--gpus", "1,8", "--total-batch-size", "524288",
                        "--device-batch-size", "32", "--measured-step-time", "7.7", "--measured-window", "L",
                        "--window", "L,SSSL", "--format", "csv"])
    rows = csv_rows(out)
    assert len(rows) == 12
    assert len(prices) == len(rows)
    assert 1 <= len(builds) <= len(rows)
    # every build is a distinct (micro-batch, attention, window): nothing is built twice
    keys = [(k["batch"], k["attention"], k["windows"], k["window_pattern"], k["compiled"]) for k in builds]
    assert len(keys) == len(set(keys))


def test_pricers_of_one_process_share_anatomies_by_value(monkeypatch):
    """A second pricer of an equal spec (another object) builds nothing: its shares come from the
    process-wide memo; a spec that differs in anything (here the vocabulary) builds its own."""
    from ddplan.layout import Layout

    monkeypatch.setattr(price_module, "_SHARES", OrderedDict())
    builds = []
    real_build = price_module.build_anatomy
    monkeypatch.setattr(price_module, "build_anatomy", lambda *a, **k: builds.append(k) or real_build(*a, **k))
    spec, hw = load_model("d24"), load_hardware("mi300x")
    plan = RunPlan(spec.recipe.budget, hw.price)
    lay = Layout(dp=1, tp=2, micro_batch=4, grad_accum=1, attention=hw.default_attention)
    first = Pricer(spec, hw, plan).anatomy(lay, "SSSL")
    assert len(builds) == 1
    again = Pricer(spec.model_copy(deep=True), hw, plan).anatomy(lay, "SSSL")
    assert len(builds) == 1 and again.ops is first.ops
    other = spec.model_copy(update={"architecture": spec.architecture.model_copy(update={"vocab_size": 50304})})
    assert Pricer(other, hw, plan).anatomy(lay, "SSSL").ops != first.ops and len(builds) == 2
    monkeypatch.setattr(price_module, "SHARES_KEPT", 1)  # bounded: the oldest share goes
    Pricer(spec, hw, plan).anatomy(replace(lay, micro_batch=2, grad_accum=2), "SSSL")
    assert len(price_module._SHARES) == 1


def run_ok_plain(argv):
    from ddplan import cli
    import contextlib
    import io

    buf, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
        code = cli.main(argv)
    assert code == 0, err.getvalue()
    return buf.getvalue()


# --------------------------------------------------------------------------------------------
# a measurement is pinned to what ran


GPT3_1024 = ["table", "--model", "gpt3-175b", "--hardware", "a100-sxm-80gb", "--gpus", "1024",
             "--total-batch-size", "3145728", "--device-batch-size", "1", "--attention", "megatron-unfused",
             "--recompute", "full", "--steps", "100"]


def test_measured_batch_that_does_not_split_is_an_error_naming_the_flags(capsys):
    """Issue 9: 1,536 sequences over 1,024 data-parallel ranks cannot be what ran; the measured 30.72 s
    is never attached to a rounded 4,194,304-token batch."""
    code, line = fails(capsys, [*GPT3_1024, "--measured-step-time", "30.72"])
    assert code == 2
    assert "--measured-gpus" in line and "--measured-tp" in line and "--total-batch-size" in line
    assert "1,536 sequences" in line


def test_measured_layout_keeps_its_batch(capsys):
    """The same run stated with its layout (tp 8 x pp 8 -> dp 16, 96 micro-batches): the measured row
    keeps 3,145,728 tokens and 30.72 s, and its MFU follows from them by hand."""
    rows = csv_rows(run_ok(capsys, [*GPT3_1024, "--tp", "8", "--pp", "8", "--measured-step-time", "30.72",
                                    "--format", "csv"]))
    (m,) = [r for r in rows if r["basis"] == "measured"]
    assert (m["dp"], m["tp"], m["pp"], m["accum"], m["global_batch_tokens"]) == ("16", "8", "8", "96", "3145728")
    assert f(m, "step_s") == 30.72
    # MFU (6N + 12 L h T per token, dense fp16 peak 312 TFLOP/s): N = every Linear (174,563,733,504 weights
    # of the blocks and lm_head tied to wte) -- checked here as the ratio to tokens/s, not re-derived
    tokens_per_s = 3_145_728 / 30.72
    assert f(m, "tokens_per_s") == pytest.approx(tokens_per_s, rel=1e-12)
    assert f(m, "wall_clock_h") > 100 * 30.72 / 3600


def test_a_measured_step_above_peak_is_refused(capsys):
    """A stated step faster than the hardware can run its matmuls cannot have been measured: one line naming
    the flag, exit 2. The bound: 1,048,576 tokens x (6N + causal SSSL attention FLOPs per token, the lower
    bound flops.exact_flops_per_token) / (8 x 989.4e12 FLOP/s): just below it refused as faster than the peak;
    just above it refused too, as needing kernels faster than H100's best GEMM (issue 33: no "measured" row on an
    impossible fit); three times the bound (GEMMs near 0.6 of peak) is priced as measured."""
    from ddplan.flops import exact_flops_per_token

    spec = load_model("d24")
    bound = exact_flops_per_token(spec.architecture, 2048) * 1_048_576 / (8 * 989.4e12)
    assert bound == pytest.approx(0.6148, abs=1e-4)  # the figure the refusal prints (d24, SSSL)
    argv = ["table", "--model", "d24", "--hardware", "h100-sxm", "--gpus", "8", "--format", "csv"]
    code, err = fails(capsys, argv + ["--measured-step-time", f"{0.98 * bound:.6f}"])
    assert code == 2 and err.startswith("error: --measured-step-time: ") and "(102% of peak)" in err
    code, err = fails(capsys, argv + ["--measured-step-time", f"{1.02 * bound:.6f}"])
    assert code == 2 and "x the best GEMM ever measured on h100-sxm (0.80)" in err
    rows = csv_rows(run_ok(capsys, argv + ["--measured-step-time", f"{3 * bound:.6f}"]))
    assert any(r["basis"] == "measured" for r in rows)


def test_implausible_measurement_is_said_on_stdout_and_keeps_a_band(capsys, tmp_path):
    """d24 on one MI300X in 2.5 s/step (85% MFU) would sustain more than the best GEMM. Stated with
    --measured-step-time it is an error (test_strict_inputs); a calibration file's own step is priced: the verdict
    says so and the measured row's band is the model's, not zero-width."""
    cal = tmp_path / "cal.yaml"
    cal.write_text(yaml.safe_dump({"kind": "calibration", "version": 1, "hardware": "mi300x", "step_times": [
        {"model": "nanochat-d24", "gpus": 1, "step_time_s": 2.5, "device_batch_size": 32, "total_batch_tokens": 524288,
         "attention": "sdpa-fused", "window_pattern": "L", "source": "a test"}]}), encoding="utf-8")
    argv = ["table", "--model", "d24", "--gpus", "1", "--total-batch-size", "524288", "--fit", "compute",
            "--window", "L", "--attention", "sdpa-fused", "--calibration", str(cal)]
    out = run_ok(capsys, [*argv, "--format", "markdown"])
    assert "above the best measured GEMM" in out and "check the stated configuration" in out
    (m,) = csv_rows(run_ok(capsys, [*argv, "--format", "csv"]))
    assert m["basis"] == "measured" and f(m, "step_s") == 2.5
    assert f(m, "step_high_s") > f(m, "step_low_s")


# --------------------------------------------------------------------------------------------
# any layout through the CLI, with its terms visible


def test_gpt3_tp8_pp8_row_shows_bubble_and_comm(capsys):
    out = run_ok(capsys, ["table", "--model", "gpt3-175b", "--hardware", "a100-sxm-80gb", "--gpus", "1024",
                          "--tp", "8", "--pp", "8", "--vp", "2", "--zero", "1", "--device-batch-size", "1",
                          "--attention", "megatron-unfused", "--recompute", "selective", "--format", "markdown"])
    assert "1024 GPUs in total" in out and "bubble_s" in out
    (r,) = csv_rows(run_ok(capsys, ["table", "--model", "gpt3-175b", "--hardware", "a100-sxm-80gb", "--gpus", "1024",
                                    "--tp", "8", "--pp", "8", "--vp", "2", "--zero", "1", "--device-batch-size", "1",
                                    "--attention", "megatron-unfused", "--recompute", "selective", "--format", "csv"]))
    assert (r["dp"], r["tp"], r["pp"], r["vp"], r["zero"]) == ("16", "8", "8", "2", "1")
    assert f(r, "bubble_s") > 0 and f(r, "tp_comm_s") > 0 and f(r, "dp_comm_exposed_s") > 0
    parts = f(r, "compute_s") + f(r, "tp_comm_s") + f(r, "dp_comm_exposed_s") + f(r, "bubble_s") + f(r, "optimizer_s")
    assert f(r, "step_s") == pytest.approx(parts, rel=1e-12)


def test_comma_lists_give_one_row_each_and_impossible_layouts_are_skipped(capsys):
    code_out = run_ok(capsys, ["table", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8,16",
                               "--tp", "1,2", "--pp", "1,16", "--attention", "fa3", "--format", "csv"])
    rows = csv_rows(code_out)
    # pp 16 fits only 16 GPUs at tp 1 (32 layers / 16); tp 2 x pp 16 = 32 does not divide 8 or 16
    assert {(r["gpus"], r["tp"], r["pp"]) for r in rows} == {("8", "1", "1"), ("8", "2", "1"), ("16", "1", "1"),
                                                             ("16", "2", "1"), ("16", "1", "16")}


def test_no_layout_can_exist_is_one_line(capsys):
    _, line = fails(capsys, ["table", "--model", "d24", "--gpus", "8", "--tp", "16"])
    assert "--gpus/--tp/--pp" in line and "16" in line


def test_seq_len_and_dtype_are_asked_for_by_flags(capsys):
    """Issue 9: a CPU-calibrated fp32 run at T = 256 without hand-written YAML; MFU is against the fp32 peak."""
    (r,) = csv_rows(run_ok(capsys, ["table", "--model", "d4", "--gpus", "1", "--seq-len", "256", "--dtype", "fp32",
                                    "--attention", "sdpa-math", "--window", "L", "--format", "csv"]))
    assert int(r["global_batch_tokens"]) % 256 == 0
    out = run_ok(capsys, ["table", "--model", "d4", "--gpus", "1", "--seq-len", "256", "--dtype", "fp32",
                          "--attention", "sdpa-math", "--window", "L", "--format", "markdown"])
    assert "sequence 256, fp32" in out
    _, line = fails(capsys, ["table", "--model", "d4", "--seq-len", "99999"])
    assert line.startswith("error: --seq-len:")
    _, line = fails(capsys, ["memory", "--model", "d4", "--dtype", "fp64"])
    assert line.startswith("error: --dtype:") and "bf16, fp16 or fp32" in line


def test_memory_gpus_means_total_gpus(capsys):
    """`--gpus` is total GPUs everywhere: memory --gpus 8 --tp 2 is dp 4."""
    out = run_ok(capsys, ["memory", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--tp", "2",
                          "--format", "markdown"])
    assert "8 x h100-sxm in total (dp 4, tp 2, pp 1)" in out


# --------------------------------------------------------------------------------------------
# published: Korthikanti et al. 2022 (arXiv 2205.05198) Table 5, through the CLI as a user would ask for it

TABLE5 = [r for r in load_runs().runs if r.source.name == "korthikanti2022"]


@pytest.mark.parametrize("r", TABLE5, ids=[r.id for r in TABLE5])
def test_korthikanti_table5_within_10_percent(capsys, r):
    """Every Table 5 iteration time within 10% (issue 12; full recompute: 1.42 / 18.13 / 49.05 / 94.42 s for 22B /
    175B / 530B / 1T), priced by the `ddplan table` command the dataset row stands for, and that command's
    row is the one `ddplan validate` scores. The "present work" rows run sequence parallelism
    (--sequence-parallel) and, as they did, fit in 80 GB: the point estimate within the A100's 80 GiB and the
    verdict not "does not fit" (the 1T row, 76.0 GiB, sits at ddplan's 95% planning limit since recompute's
    brought-back attention core, 0.39 GiB, is counted: a reserve of ddplan's, not a fact of the paper)."""
    argv = table_command(r)
    assert argv is not None
    (row,) = csv_rows(run_ok(capsys, argv + ["--format", "csv"]))
    measured = r.measured.step_time_s
    err = (f(row, "step_s") - measured) / measured
    print(f"{r.id}: measured {measured} s, predicted {f(row, 'step_s'):.2f} s ({100 * err:+.1f}%)")
    assert abs(err) <= 0.10
    assert f(row, "step_low_s") <= measured <= f(row, "step_high_s")
    assert f(row, "step_s") == pytest.approx(V.score(r, "test").predicted_s, rel=1e-12)
    if r.layout.sequence_parallel:
        assert f(row, "memory_gib") <= 80 and row["memory_verdict"] != "does not fit" and row["sp"] == "True"


# --------------------------------------------------------------------------------------------
# the pricer's parts


def test_pricer_price_holds_its_terms():
    spec, hw = load_model("d24"), load_hardware("mi300x")
    pricer = Pricer(spec, hw, RunPlan(spec.recipe.budget, hw.price))
    from ddplan.layout import Layout

    lay = Layout(dp=8, zero=NATIVE_ZERO[spec.recipe.distribution], micro_batch=32, grad_accum=2,
                 attention="sdpa-fused", compiled=True)
    p = pricer.price(lay)
    st = p.step
    assert p.step_s == st.total_s == pytest.approx(st.compute_s + st.dp_comm_exposed_s + st.tp_comm_s + st.bubble_s
                                                   + st.optimizer_s)
    assert p.step_low_s <= p.step_s <= p.step_high_s
    assert p.hfu_pct >= p.mfu_pct
    assert p.basis == "model" and p.runnable
    assert pricer.price(lay) == p  # cached parts, same result


# --------------------------------------------------------------------------------------------
# review findings, kept as tests


def test_plan_fits_a_calibration_measurement_as_table_does(capsys, tmp_path):
    """A calibration file with a measured step: `plan` and `table` give the same fitted figures."""
    cal = tmp_path / "cal.yaml"
    cal.write_text(yaml.safe_dump({"kind": "calibration", "version": 1, "hardware": "mi300x", "step_times": [
        {"model": "nanochat-d24", "gpus": 1, "step_time_s": 7.7, "device_batch_size": 32, "total_batch_tokens": 524288,
         "attention": "sdpa-fused", "window_pattern": "L", "source": "the seed note"}]}), encoding="utf-8")
    rows = csv_rows(run_ok(capsys, ["table", "-m", "d24", "--gpus", "8", "--device-batch-size", "32", "--attention",
                                    "sdpa-fused", "--window", "SSSL", "--calibration", str(cal), "--format", "csv"]))
    (t,) = [r for r in rows if r["gpus"] == "8"]  # the other row is the measured configuration (1 GPU, L)
    import json

    rows = json.loads(run_ok(capsys, ["plan", "-m", "d24", "--gpus", "8", "--calibration", str(cal), "--top", "100000",
                                      "--format", "json"]))["rows"]
    (p,) = [r for r in rows if (r["dp"], r["tp"], r["pp"], r["zero"], r["micro_batch"], r["attention"], r["recompute"])
            == (8, 1, 1, 1, 32, "sdpa-fused", "none")]
    assert t["basis"] == p["basis"] == "fitted"
    assert f(t, "step_s") == p["step_s"] and f(t, "wall_clock_h") == p["wall_clock_h"]


def test_memory_and_table_split_a_device_batch_alike(capsys):
    """48 does not divide the 64 sequences per rank: both take 32 x 2, and agree on the memory."""
    (m,) = csv_rows(run_ok(capsys, ["memory", "-m", "d24", "--gpus", "8", "--device-batch-size", "48", "--zero", "1",
                                    "--format", "csv"]))
    (t,) = csv_rows(run_ok(capsys, ["table", "-m", "d24", "--gpus", "8", "--device-batch-size", "48", "--attention",
                                    "sdpa-fused", "--window", "SSSL", "--format", "csv"]))
    assert (t["micro_batch"], t["accum"]) == ("32", "2")
    assert f(m, "total_gib") == pytest.approx(f(t, "memory_gib"), rel=1e-12)


def test_the_measured_row_is_never_reshaped_and_says_when_memory_disagrees(capsys):
    """d24 at micro-batch 32 on H100 is over the memory model's limit, but it was measured: the row keeps
    32 x 2, is `measured`, and the flag blames the memory model, not the run."""
    rows = csv_rows(run_ok(capsys, ["table", "-m", "d24", "--hardware", "h100-sxm", "--gpus", "8",
                                    "--measured-step-time", "1.5", "--attention", "fa3", "--window", "L",
                                    "--format", "csv"]))
    (r,) = rows
    assert (r["basis"], r["micro_batch"], r["flags"]) == ("measured", "32", "memory_vs_measured")


def test_a_measured_single_gpu_row_is_measured_whatever_zero_says(capsys):
    rows = csv_rows(run_ok(capsys, ["table", "-m", "d24", "--gpus", "1", "--zero", "3", "--measured-step-time", "8",
                                    "--total-batch-size", "524288", "--attention", "flash-attn-ck", "--window", "L",
                                    "--format", "csv"]))
    assert [r["basis"] for r in rows] == ["measured"]


@pytest.mark.parametrize("argv, flag", [
    (["table", "-m", "d24", "--hardware", "h100-sxm", "--dtype", "fp32", "--fp8"], "--fp8"),
    (["table", "-m", "d24", "--vp", "2"], "--gpus/--tp/--pp/--vp/--cp/--ep"),
    (["memory", "-m", "d24", "--vp", "2"], "--gpus/--tp/--pp/--vp/--cp/--ep"),
    (["table", "-m", "d24", "--measured-step-time", "nan"], "--measured-step-time"),
    (["table", "-m", "d24", "--price", "inf"], "--price"),
    (["memory", "-m", "d24", "--measured-peak", "nan"], "--measured-peak"),
    (["table", "-m", "d24", "--gpus", "99999999999999999999"], "--gpus"),
    (["plan", "-m", "d24", "--headroom", "1"], "--headroom"),
])
def test_review_errors_are_one_line(capsys, argv, flag):
    _, line = fails(capsys, argv)
    assert line.startswith(f"error: {flag}: ")


def test_duplicate_layouts_give_one_row(capsys):
    rows = csv_rows(run_ok(capsys, ["table", "-m", "d24", "--gpus", "1,1", "--zero", "0,3", "--attention", "sdpa-fused",
                                    "--window", "L", "--format", "csv"]))
    assert len(rows) == 1


def test_memory_fixes_keep_the_gpus(capsys):
    """What memory suggests changes the layout on the GPUs asked about: TP/PP take ranks from dp."""
    from dataclasses import replace

    from ddplan.registry import load_hardware, load_model
    from ddplan.sizing import memory_setup, what_fits

    spec, hw = load_model("llama-3-8b"), load_hardware("h100-sxm")
    setup = memory_setup(spec, hw, gpus=8, micro_batch=4)
    _, fixes = what_fits(spec, hw, replace(setup, layout=setup.at_zero(0)), top=5)
    assert fixes and all(f.layout.num_gpus == 8 for f in fixes)
    out = run_ok(capsys, ["memory", "-m", "llama-3-8b", "--gpus", "8", "--hardware", "h100-sxm", "--zero", "0",
                          "--device-batch-size", "4", "--format", "markdown"])
    assert "Fastest way to fit" in out
    # a layout already past a node (tp 8 x pp 2 on 64 GPUs) keeps its degrees or grows them, pp across nodes
    setup = memory_setup(load_model("llama-3-70b"), hw, gpus=64, tp=8, pp=2, micro_batch=4)
    _, fixes = what_fits(load_model("llama-3-70b"), hw, replace(setup, layout=setup.at_zero(1)))
    assert fixes and all(f.layout.num_gpus == 64 and f.layout.tp >= 8 and f.layout.pp >= 2 for f in fixes)


def test_a_calibration_step_no_factor_explains_is_said_not_fatal(capsys, tmp_path):
    """A calibration file's measured step far slower than any efficiency allows (2e5 s, 10^5 times the model's):
    the table warns and prices from the model; the same figure stated with --measured-step-time is an error. A
    step faster than the hardware's peak (1e-6 s) is an error from the file too (issue 33)."""
    from cli_helpers import run

    def cal(step_s: float) -> str:
        path = tmp_path / f"cal-{step_s:g}.yaml"
        path.write_text(yaml.safe_dump({"kind": "calibration", "version": 1, "hardware": "mi300x", "step_times": [
            {"model": "nanochat-d24", "gpus": 1, "step_time_s": step_s, "device_batch_size": 32,
             "total_batch_tokens": 524288, "attention": "sdpa-fused", "window_pattern": "L", "source": "a typo"}]}),
            encoding="utf-8")
        return str(path)

    code, out, err = run(capsys, ["table", "-m", "d24", "--gpus", "1", "--calibration", cal(2e5), "--format", "csv"])
    assert code == 0 and "measured step is not fitted" in err
    assert {r["basis"] for r in csv_rows(out)} == {"model"}
    for argv in (["--calibration", cal(1e-6)], ["--total-batch-size", "524288", "--measured-step-time", "0.000001"],
                 ["--total-batch-size", "524288", "--measured-step-time", "200000"]):
        code, _ = fails(capsys, ["table", "-m", "d24", "--gpus", "1", *argv])
        assert code == 2


def _cal_file(tmp_path, **extra) -> str:
    data = {"kind": "calibration", "version": 1, "hardware": "mi300x", "seq_len": 1024, "dtype": "bf16",
            "step_times": [{"model": "nanochat-d24", "gpus": 1, "step_time_s": 3.3, "device_batch_size": 32,
                            "total_batch_tokens": 262144, "attention": "sdpa-fused", "window_pattern": "L",
                            "seq_len": 1024, "source": "a test"}], **extra}
    path = tmp_path / "cal.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return str(path)


def test_a_huge_held_out_error_never_makes_a_band_negative(capsys, tmp_path):
    rows = csv_rows(run_ok(capsys, ["table", "-m", "d24", "--gpus", "1,8", "--calibration",
                                    _cal_file(tmp_path, held_out_error_pct=5000), "--format", "csv"]))
    for r in rows:
        assert f(r, "step_low_s") > 0 and f(r, "cost_low_usd") > 0
        if r["basis"] == "fitted":  # x / 51 .. x * 51
            assert f(r, "step_high_s") == pytest.approx(51 * f(r, "step_s"), rel=1e-9)
        else:
            assert r["basis"] == "measured" and f(r, "step_low_s") == f(r, "step_high_s") == 3.3


def test_the_calibration_sequence_applies_only_to_the_model_it_measured(capsys, tmp_path):
    cal = _cal_file(tmp_path)
    assert "sequence 1024" in run_ok(capsys, ["table", "-m", "d24", "--gpus", "1", "--calibration", cal])
    assert "sequence 8192" in run_ok(capsys, ["table", "-m", "llama-3-8b", "--gpus", "8", "--calibration", cal])
    run_ok(capsys, ["memory", "-m", "gpt2-124m", "--calibration", cal])  # gpt2's max is 1024: no error


def test_plan_takes_several_hardware_in_any_order_with_a_calibration(capsys, tmp_path):
    cal = _cal_file(tmp_path)
    a = run_ok(capsys, ["plan", "-m", "d24", "--gpus", "8", "--hardware", "h100-sxm,mi300x", "--calibration", cal,
                        "--format", "csv"])
    b = run_ok(capsys, ["plan", "-m", "d24", "--gpus", "8", "--hardware", "mi300x,h100-sxm", "--calibration", cal,
                        "--format", "csv"])
    assert sorted(a.splitlines()) == sorted(b.splitlines())


def test_a_carried_hardware_spec_must_carry_the_name_the_file_gives(capsys, tmp_path):
    from ddplan.registry import builtin_dir

    hw = yaml.safe_load((builtin_dir("hardware") / "h100-sxm.yaml").read_text(encoding="utf-8"))
    _, line = fails(capsys, ["table", "-m", "d24", "--calibration", _cal_file(tmp_path, hardware_spec=hw)])
    assert "hardware_spec is named 'h100-sxm'" in line and "'mi300x'" in line


def test_validated_band_when_nothing_measured_the_model_error(capsys, tmp_path):
    """A calibration with micro-benchmarks but no held-out step error (and no step to fit) has not measured the
    model's error: its rows keep at least the validated out-of-sample band (ddplan.price.VALIDATED_RATIO);
    with a held-out error, that error sets the band instead (x / (1 + e) .. x (1 + e))."""
    from ddplan.price import VALIDATED_RATIO

    data = {"kind": "calibration", "version": 1, "hardware": "mi300x", "hbm_tbyte_per_s": 4.0}
    path = tmp_path / "bench.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    for r in csv_rows(run_ok(capsys, ["table", "-m", "d24", "--gpus", "1", "--calibration", str(path),
                                      "--format", "csv"])):
        assert f(r, "step_low_s") <= VALIDATED_RATIO[0] * f(r, "step_s") * (1 + 1e-9)
        assert f(r, "step_high_s") >= VALIDATED_RATIO[1] * f(r, "step_s") * (1 - 1e-9)
    data["held_out_error_pct"] = 10
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    for r in csv_rows(run_ok(capsys, ["table", "-m", "d24", "--gpus", "1", "--calibration", str(path),
                                      "--format", "csv"])):
        assert f(r, "step_high_s") >= 1.1 * f(r, "step_s") * (1 - 1e-9)
        assert f(r, "step_low_s") <= f(r, "step_s") / 1.1 * (1 + 1e-9)


def test_a_wall_clock_mostly_outside_the_steps_is_said(capsys):
    """3,000 min of start-up against ~2.7 h of steps: the verdict says how much is outside the steps, with the
    baseline row's own step count (24 GPUs round the batch: 463 steps, not the table's 477)."""
    out = run_ok(capsys, ["table", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "24",
                          "--startup-min", "3000", "--tokens", "2e9", "--format", "markdown"])
    line = next(x for x in out.splitlines() if "are outside the" in x)
    assert line.startswith("- 50.0 h of those") and "outside the 463 steps" in line
    quiet = run_ok(capsys, ["table", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "24",
                            "--tokens", "2e9", "--format", "markdown"])
    assert "are outside the" not in quiet


def test_plan_refuses_a_calibration_for_other_hardware(capsys, tmp_path):
    cal = tmp_path / "cal.yaml"
    cal.write_text(yaml.safe_dump({"kind": "calibration", "version": 1, "hardware": "mi300x", "seq_len": 1024,
                                   "dtype": "bf16"}), encoding="utf-8")
    code, err = fails(capsys, ["plan", "--model", "d4", "--calibration", str(cal), "--hardware", "h100-sxm,b200"])
    assert code == 2 and "calibration file is for 'mi300x', not --hardware h100-sxm, b200" in err


def test_an_empty_gpu_count_is_refused(capsys):
    code, err = fails(capsys, ["table", "--model", "d24", "--gpus", "1,,8"])
    assert code == 2 and "an empty item between commas" in err


def test_a_per_module_recompute_row_prices_the_same_alone_and_in_a_list(capsys):
    """Found in review (2026-12-05): the op times a search shares were keyed without the recompute policy, so a
    per-module policy priced after a named one (or after another per-module one) re-used times with no re-run
    of its modules: Qwen3-30B-A3B with selective:moe read 32.95 s in `--recompute none,selective:moe` against
    37.93 s alone. Each row must be the row it is alone."""
    argv = ["table", "-m", "qwen3-30b-a3b", "--hardware", "h100", "--gpus", "16", "--ep", "8", "--attention", "fa3",
            "--device-batch-size", "1", "--format", "csv", "--recompute"]
    alone = {r["recompute"]: r for p in ("selective:moe", "selective:moe_act") for r in csv_rows(run_ok(capsys, argv + [p]))}
    listed = {r["recompute"]: r for r in csv_rows(run_ok(capsys, argv + ["none,selective:moe,selective:moe_act"]))}
    for policy, row in alone.items():
        assert float(listed[policy]["step_s"]) == pytest.approx(float(row["step_s"]), rel=1e-12), policy
    assert float(alone["selective:moe"]["compute_s"]) > float(listed["none"]["compute_s"])


def test_fp8_and_16_bit_pricers_sharing_a_cache_keep_their_own_memory():
    """Found in review (2026-12-05): under delayed scaling an fp8 GEMM saves a 1-byte copy of its input, so the
    memory of one layout differs with fp8; two pricers sharing one cache (build_table's `shared`) must not hand
    each other their figures, in either order."""
    from ddplan.layout import Layout
    from ddplan.registry import load_hardware, load_model

    spec, hw = load_model("llama-3-8b"), load_hardware("h100-sxm")
    plan = price_module.RunPlan(spec.recipe.budget, hw.price)
    lay = Layout(dp=8, tp=1, pp=1, zero=3, micro_batch=2, grad_accum=1, attention="fa3", recompute="none")
    alone = {fp8: price_module.Pricer(spec, hw, plan, fp8=fp8, fp8_recipe="delayed").memory(lay, "L").total
             for fp8 in (False, True)}
    assert alone[True] < alone[False]
    for first in (False, True):
        shared = {}
        got = {fp8: price_module.Pricer(spec, hw, plan, fp8=fp8, fp8_recipe="delayed",
                                        _caches=price_module.PriceCache(shared=shared)).memory(lay, "L").total
               for fp8 in (first, not first)}
        assert got == alone


def test_a_pricer_takes_a_calibrations_memory_terms_unless_given_its_own():
    from ddplan.calibration import CalibrationSpec
    from ddplan.layout import Layout
    from ddplan.memory import MemoryAssumptions
    from ddplan.price import Pricer, RunPlan
    from ddplan.registry import load_hardware, load_model
    from ddplan.units import GiB

    spec, hw = load_model("d24"), load_hardware("mi300x")
    cal = CalibrationSpec.model_validate({"kind": "calibration", "version": 1, "hardware": "mi300x",
                                          "memory": {"framework_gib": 0.5}})
    plan = RunPlan(spec.recipe.budget, hw.price)
    lay = Layout(dp=1, zero=1, micro_batch=4, attention="sdpa-fused")
    assert Pricer(spec, hw, plan).memory(lay, "L").terms["framework"] == 1.0 * GiB
    assert Pricer(spec, hw, plan, cal).memory(lay, "L").terms["framework"] == 0.5 * GiB
    given = MemoryAssumptions(framework_gib=2.0)
    assert Pricer(spec, hw, plan, cal, assumptions=given).memory(lay, "L").terms["framework"] == 2.0 * GiB


def test_a_calibrations_pipeline_schedule_is_the_tables_and_the_memorys(capsys, tmp_path):
    """A measured step that ran a zero-bubble schedule (StepMeasurement.pp_schedule) is priced as it ran by `table`
    and `memory` without a model (the calibration's run, ddplan.inputs.step_values): d24's 24 layers over pp 4 as
    ZB-V, one row, named so, and memory's title names ZB-V too; a flag given wins."""
    data = {"kind": "calibration", "version": 1, "hardware": "mi300x", "seq_len": 1024, "dtype": "bf16",
            "step_times": [{"model": "nanochat-d24", "gpus": 8, "step_time_s": 3.3, "device_batch_size": 4,
                            "total_batch_tokens": 262144, "pp": 4, "pp_virtual_stages": 2, "pp_schedule": "zb-v",
                            "attention": "sdpa-fused", "window_pattern": "L", "seq_len": 1024, "source": "a test"}]}
    path = tmp_path / "cal.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    rows = csv_rows(run_ok(capsys, ["table", "--calibration", str(path), "--format", "csv"]))
    assert [r["config"].split(", ")[1] for r in rows] == ["pp 4 ZB-V"], [r["config"] for r in rows]
    assert "pp 4 ZB-V" in run_ok(capsys, ["memory", "--calibration", str(path)])
    rows = csv_rows(run_ok(capsys, ["table", "--calibration", str(path), "--schedule", "zb-h1", "--vp", "1",
                                    "--format", "csv"]))
    assert "pp 4 ZB-H1" in {r["config"].split(", ")[1] for r in rows}
