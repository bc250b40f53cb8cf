"""`ddplan memory`: reviewed goldens, nanochat d24's model states by hand, the ZeRO ordering, a measured
peak read back as a configuration, a model that fits nowhere, and the error paths.

Goldens live in tests/golden/ (STYLE.md); regenerate with `pytest --snapshot-update` and review every
diff as a change of behaviour.
"""

from __future__ import annotations


import json

import pytest


from cli_helpers import csv_rows, fails, run, run_ok

D24_8 = ["memory", "--model", "d24", "--gpus", "8"]
D24_PEAK = ["memory", "--model", "d24", "--window", "L", "--measured-peak", "105"]
LLAMA70_H100 = ["memory", "--model", "llama-3-70b", "--hardware", "h100-sxm", "--gpus", "8"]
MODEL_STATES = ("params_gib", "gradients_gib", "optimizer_gib")


# --------------------------------------------------------------------------------------------
# goldens


@pytest.mark.parametrize("fmt", ["csv", "markdown"])
def test_golden_d24_8_gpus(capsys, snapshot, fmt):
    assert run_ok(capsys, [*D24_8, "--format", fmt]) == snapshot


def test_golden_d24_measured_peak_markdown(capsys, snapshot):
    assert run_ok(capsys, [*D24_PEAK, "--format", "markdown"]) == snapshot


# --------------------------------------------------------------------------------------------
# by hand


def test_d24_params_by_hand(capsys):
    """nanochat d24 parameters on every GPU (stages 0-2), by dtype (DESIGN.md sec. 2):

    fp32 (4 B): block matrices 24 x 12 x 1,536^2 = 679,477,248; VE gates 12 x 12 x 12 = 1,728;
      smear gate 24; scalars 24 x 2 + 2 = 50; lm_head 32,768 x 1,536 = 50,331,648.
      -> 4 x 729,810,698 = 2,919,242,792 B
    bf16 (2 B): wte 32,768 x 1,536 = 50,331,648; value embeddings 12 x 32,768 x 1,536 = 603,979,776.
      -> 2 x 654,311,424 = 1,308,622,848 B
    total 4,227,865,640 B / 2^30 = 3.93750671... GiB; gradients the same (full gradients on every rank);
    ZeRO-3 keeps 1/8 of each on 8 GPUs.
    """
    fp32 = 679_477_248 + 1_728 + 24 + 50 + 50_331_648
    bf16 = 50_331_648 + 603_979_776
    assert (fp32, bf16) == (729_810_698, 654_311_424)
    params_bytes = 4 * fp32 + 2 * bf16
    assert params_bytes == 4_227_865_640
    expected_gib = params_bytes / 2**30

    rows = {int(r["zero"]): r for r in csv_rows(run_ok(capsys, [*D24_8, "--format", "csv"]))}
    assert sorted(rows) == [0, 1, 2, 3]
    for z in (0, 1, 2):
        assert float(rows[z]["params_gib"]) == pytest.approx(expected_gib, abs=1e-6)
    for z in (0, 1):
        assert float(rows[z]["gradients_gib"]) == pytest.approx(expected_gib, abs=1e-6)
    assert float(rows[3]["params_gib"]) == pytest.approx(expected_gib / 8, abs=1e-6)
    assert float(rows[2]["gradients_gib"]) == pytest.approx(expected_gib / 8, abs=1e-6)


def test_d24_native_row_is_zero_1(capsys):
    """nanochat shards optimizer state and keeps full gradients: ZeRO-1 in memory, the only native row."""
    rows = csv_rows(run_ok(capsys, [*D24_8, "--format", "csv"]))
    assert [(r["zero"], r["setup"]) for r in rows] == [("0", "what-if"), ("1", "native"), ("2", "what-if"),
                                                     ("3", "what-if")]
    assert all(r["fits"] == "True" for r in rows)
    for r in rows:
        terms = [k for k in r if k.endswith("_gib") and k not in ("total_gib", "usable_gib", "headroom_gib", "low_gib", "high_gib", "limit_gib")]
        assert float(r["total_gib"]) == pytest.approx(sum(float(r[k]) for k in terms), rel=1e-12)
        assert float(r["headroom_gib"]) == pytest.approx(float(r["usable_gib"]) - float(r["total_gib"]), abs=1e-9)


def test_d24_zero_ordering(capsys):
    """Model states never grow with the stage; the total only by ZeRO-3's gathered-parameter buffers."""
    rows = csv_rows(run_ok(capsys, [*D24_8, "--format", "csv"]))
    states = [sum(float(r[k]) for k in MODEL_STATES) for r in rows]
    assert all(b <= a for a, b in zip(states, states[1:])), states
    without_buffers = [float(r["total_gib"]) - float(r["buffers_gib"]) for r in rows]
    assert all(b <= a for a, b in zip(without_buffers, without_buffers[1:])), without_buffers
    totals = [float(r["total_gib"]) for r in rows]
    assert totals[0] >= totals[1] >= totals[2]
    assert float(rows[3]["buffers_gib"]) > float(rows[2]["buffers_gib"])


def test_d24_measured_peak_reads_as_fused_sdpa_compiled(capsys):
    """The seed's ~105 GB in use: consistent with a fused SDPA kernel under torch.compile, not with the
    unfused math kernel the note names (its s x s probabilities would not fit; DESIGN.md sec. 1)."""
    out = run_ok(capsys, [*D24_PEAK, "--format", "markdown"])
    line = next(t for t in out.splitlines() if "Measured 105 GB" in t)
    consistent = line.split("consistent with:", 1)[1]
    assert "sdpa-fused, recompute none, compiled" in consistent
    assert "sdpa-math, recompute none" not in consistent


def test_d24_measured_peak_json(capsys):
    import json

    data = json.loads(run_ok(capsys, [*D24_PEAK, "--format", "json"]))
    match = {(m["attention"], m["recompute"], m["compiled"]): m for m in data["measured_peak_matches"]}
    assert match[("sdpa-fused", "none", True)]["consistent"]
    assert not match[("sdpa-math", "none", True)]["consistent"]
    errors = [abs(m["error_pct"]) for m in data["measured_peak_matches"]]
    assert errors == sorted(errors)


def test_llama_70b_on_8_h100_fits_nowhere(capsys):
    """70B parameters with AdamW on 8 x 80 GB: no ZeRO stage alone fits; the verdict says so once, then what
    would fit on the same GPUs, or that nothing does."""
    rows = csv_rows(run_ok(capsys, [*LLAMA70_H100, "--format", "csv"]))
    assert len(rows) == 4 and not any(r["fits"] == "True" for r in rows)
    assert all(float(r["headroom_gib"]) < 0 for r in rows)
    out = run_ok(capsys, [*LLAMA70_H100, "--format", "markdown"])
    verdict = [t for t in out.splitlines() if t.startswith("- ")]
    assert verdict[0].startswith("- Does not fit as asked (ZeRO-3, ")
    assert not any(t.startswith("- Fits") for t in verdict)
    assert any(t.startswith("- Fastest way to fit: ") for t in verdict) or any(
        t.startswith("- Nothing fits on these 8 GPUs") for t in verdict), verdict


def test_one_rank_verdict_says_stages_do_not_differ(capsys):
    out = run_ok(capsys, ["memory", "--model", "d24", "--format", "markdown"])
    assert "nothing to shard" in out
    assert "save up to 0.0 GiB" not in out


# --------------------------------------------------------------------------------------------
# errors: one line on stderr, exit 1 (ddplan error) or 2 (usage)


@pytest.mark.parametrize("extra, words", [
    (["--zero", "5"], ("--zero", "0, 1, 2, 3")),
    (["--gpus", "-1"], ("--gpus", "-1")),
    (["--attention", "nope"], ("--attention", "'nope'", "sdpa-fused")),
    (["--gpus", "5", "--tp", "5"], ("tp=5", "num_heads=12")),
    (["--gpus", "4", "--tp", "8"], ("--gpus/--tp/--pp", "tp x pp = 8", "4 GPUs")),
], ids=["zero-5", "gpus-negative", "attention-unknown", "tp-not-dividing-heads", "tp-above-gpus"])
def test_errors_are_one_line(capsys, extra, words):
    code, line = fails(capsys, ["memory", "--model", "d24", *extra])
    assert code == 2  # every one a flag's value or a layout the flags make: usage errors, as in `table`
    for w in words:
        assert w in line, line


LLAMA8_ZERO2 = ["memory", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--zero", "2",
                "--device-batch-size", "4", "--seq-len", "8192"]


def test_memory_finds_the_cheapest_changes_that_fit(capsys):
    """Issue 14: Llama-3-8B on 8 x H100 at ZeRO-2, micro-batch 4, sequence 8192 does not fit; the verdict names the
    fastest set of changes that fits, then the fastest with fewer changes, each with its memory and its step time
    against the setup as asked; every suggestion, priced by `ddplan table` with those flags, fits."""
    from ddplan.registry import load_hardware, load_model
    from ddplan.sizing import memory_setup, what_fits
    from ddplan.specs import run_variant

    out = run_ok(capsys, [*LLAMA8_ZERO2, "--format", "markdown"])
    verdict = [t for t in out.splitlines() if t.startswith("- ") and not t.startswith("- Produced")]
    assert verdict[0].startswith("- Does not fit as asked (ZeRO-2, device batch 4, recompute none")
    assert verdict[1].startswith("- Fastest way to fit: ")
    assert not any(t.startswith("- Fits") for t in verdict)
    spec, hw = run_variant(load_model("llama-3-8b"), seq_len=8192), load_hardware("h100-sxm")
    setup = memory_setup(spec, hw, gpus=8, micro_batch=4)
    from dataclasses import replace

    asked_s, fixes = what_fits(spec, hw, replace(setup, layout=setup.at_zero(2)))
    assert fixes and all(f.step_s >= fixes[0].step_s for f in fixes)
    assert [len(f.changes) for f in fixes[1:]] == sorted(len(f.changes) for f in fixes[1:])
    assert all(len(f.changes) < len(fixes[0].changes) for f in fixes[1:])
    for f in fixes:
        lay = f.layout
        argv = ["table", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--seq-len", "8192",
                "--tp", str(lay.tp), "--pp", str(lay.pp), "--zero", str(lay.zero), "--device-batch-size",
                str(lay.micro_batch), "--recompute", lay.recompute, "--attention", lay.attention, "--format", "csv"]
        (row,) = csv_rows(run_ok(capsys, argv))
        assert row["fits"] == "True" and float(row["memory_gib"]) == pytest.approx(f.total_gib)
        assert float(row["step_s"]) == pytest.approx(f.step_s, rel=1e-9)


def test_a_fitting_setup_gets_no_fixes(capsys):
    out = run_ok(capsys, ["memory", "--model", "d24", "--gpus", "8", "--format", "markdown"])
    assert "Fastest way to fit" not in out and "Does not fit" not in out


def test_grads_flag_sets_the_gradient_dtype(capsys):
    """Qwen3-30B-A3B (bf16 params, 30.53B) under ZeRO-3 on 8 GPUs: gradients in the params' bf16 are
    30.53e9 x 2 B / 8 = 7.11 GiB a GPU (Megatron --grad-reduce-in-bf16); in fp32, twice that."""
    argv = ["memory", "--model", "qwen3-30b-a3b", "--hardware", "gb200", "--gpus", "8", "--ep", "4", "--zero", "3",
            "--format", "json"]
    got = {g: json.loads(run_ok(capsys, argv + ["--grads", g]))["rows"][0]["gradients_gib"] for g in ("param", "fp32")}
    assert got["param"] == pytest.approx(30.53e9 * 2 / 8 / 2**30, rel=2e-3)
    assert got["fp32"] == pytest.approx(2 * got["param"], rel=1e-9)
    code, line = fails(capsys, ["memory", "--model", "d24", "--grads", "bf16"])
    assert code == 2 and "--grads" in line and "'bf16' is not one of 'param', 'fp32', 'compute'" in line


def test_moments_and_remainder_masters_set_the_optimizer_state(capsys):
    """--moments bf16 --weights remainder (Megatron-Core's precision-aware optimizer: 2-byte moments, the fp32
    masters' low 16 bits): Llama-3-8B's 8,030,261,248 parameters under ZeRO-1 over 8 keep 6 / 8 bytes each of
    optimizer state, 5.61 GiB, against 12 / 8 (11.22 GiB) with --weights master. Where Megatron-Core keeps the
    masters whole, or the weights are not bf16, remainder is refused in one line naming --weights."""
    argv = ["memory", "--model", "llama-3-8b", "--hardware", "h100", "--gpus", "8", "--zero", "1", "--format", "json"]
    got = json.loads(run_ok(capsys, argv + ["--weights", "remainder", "--moments", "bf16"]))["rows"][0]
    assert got["optimizer_gib"] == pytest.approx(8_030_261_248 * 6 / 8 / 2**30, rel=1e-9)
    master = json.loads(run_ok(capsys, argv + ["--weights", "master"]))["rows"][0]
    assert master["optimizer_gib"] == pytest.approx(2 * got["optimizer_gib"], rel=1e-9)
    # remainders are kept row by row where Megatron-Core keeps them: bf16 weights under the distributed optimizer;
    # a ZeRO-3 (Megatron-FSDP) or ZeRO-0 row keeps whole masters, the same alone or in a list (found in review)
    rows = {r["zero"]: r["optimizer_gib"] for r in json.loads(run_ok(capsys, [*argv[:-2], "--zero", "0,1,3",
            "--weights", "remainder", "--format", "json"]))["rows"]}
    n = 8_030_261_248
    assert rows[1] == pytest.approx(n * 10 / 8 / 2**30, rel=1e-9)
    assert rows[3] == pytest.approx(n * 12 / 8 / 2**30, rel=1e-9) and rows[0] == pytest.approx(n * 12 / 2**30, rel=1e-9)
    alone = json.loads(run_ok(capsys, [*argv[:-2], "--zero", "3", "--weights", "remainder", "--format", "json"]))
    assert alone["rows"][0]["optimizer_gib"] == pytest.approx(rows[3], rel=1e-12)
    # a profile's remainders (nemo's perf scripts, for bf16) on an fp16 model are kept whole, not refused
    fp16 = run(capsys, ["memory", "--model", "gpt3-175b", "--hardware", "h100-sxm", "--gpus", "1024", "--tp", "8",
                        "--pp", "8", "--framework", "nemo"])
    assert fp16[0] == 0, fp16[2]
    for extra, says in ((["--moments", "fp64"], "'fp64' is not one of 'param', 'fp32', 'bf16', 'fp16', 'fp8'"),
                        (["--weights", "remainder", "--dtype", "fp16"], "compute dtype is fp16"),
                        (["--weights", "remainder", "--fp8", "--fp8-recipe", "current"], "keeps the fp32 masters whole"),
                        (["--weights", "remainder", "--fp8", "--fp8-recipe", "delayed", "--fp8-params"],
                         "with fp8 weights (--fp8-params)")):
        code, line = fails(capsys, argv[:-2] + extra)
        assert code == 2 and says in line and ("--moments" if "fp64" in extra else "--weights") in line, extra
    assert "fp8 recipe" in fails(capsys, argv[:-2] + ["--weights", "remainder", "--fp8", "--fp8-recipe", "current"])[1]


def test_a_run_file_s_gradient_and_weight_dtypes_are_checked_where_they_are_written(capsys, tmp_path):
    """precision.grads and precision.weights in a run file: a value outside the allowed ones is one line naming the
    file and the field (not a flag the user never typed)."""
    for field, allowed in (("grads", "'param', 'fp32' or 'compute'"), ("weights", "'fp32', 'master' or 'remainder'"),
                           ("moments", "'param', 'fp32', 'bf16', 'fp16' or 'fp8'")):
        path = tmp_path / f"{field}.yaml"
        path.write_text(f"kind: run\nversion: 1\nmodel: llama-3-8b\nhardware: h100-sxm\ngpus: 8\n"
                        f"precision: {{{field}: bogus}}\n", encoding="utf-8")
        code, line = fails(capsys, ["memory", "--config", str(path)])
        assert code == 1 and line.startswith(f"error: {path}: precision.{field}: ") and allowed in line, line


def test_a_setup_that_fits_only_as_predicted_may_not_fit_and_gets_the_changes_that_make_it_certain(capsys,
                                                                                                  monkeypatch):
    """Issue 36: with the memory model's error band at x0.8-x1.5, Llama-3-8B at FSDP on 8 x H100 (59.0 GiB
    predicted, under the 75.7 GiB limit, 88.5 GiB at the band's high end) may not fit; every change proposed
    fits even at the band's high end (at most 75.7 / 1.5 = 50.4 GiB predicted), and a row says 'may not fit'."""
    import ddplan.memory as memory

    monkeypatch.setattr(memory, "PEAK_RATIO", (0.8, 1.5))
    argv = ["memory", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8"]
    rows = {r["zero"]: r for r in csv_rows(run_ok(capsys, [*argv, "--format", "csv"]))}
    assert rows["3"]["fits"] == "True" and rows["3"]["verdict"] == "may not fit"
    assert float(rows["3"]["high_gib"]) == pytest.approx(1.5 * float(rows["3"]["total_gib"]))
    assert rows["0"]["verdict"] == "does not fit"  # 192.7 GiB: even x0.8 is over
    out = run_ok(capsys, [*argv, "--format", "markdown"])
    verdict = [t for t in out.splitlines() if t.startswith("- ") and not t.startswith("- Produced")]
    assert verdict[0].startswith("- May not fit with the model's native setup (FSDP (ZeRO-3)): 59.0 GiB predicted, "
                                 "under the 75.7 GiB a layout may use, but 47.2-88.5 GiB"), verdict[0]
    fixes = [t for t in verdict[1:] if t.startswith("- Fastest")]
    assert fixes and fixes[0].startswith("- Fastest way to fit for certain: ")
    assert all(float(t.split(": ")[-1].split(" GiB")[0]) <= 75.67 / 1.5 for t in fixes)
    table = ["table", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--zero", "3",
             "--device-batch-size", "1", "--recompute", "none", "--attention", "sdpa-fused", "--format", "csv"]
    (row,) = csv_rows(run_ok(capsys, table))
    assert row["memory_verdict"] == "may not fit" and "memory_tight" in row["flags"]


def test_a_stack_with_block_recompute_is_offered_thefewest_layers_that_fit(capsys):
    """Under a stack that re-runs some layers whole (the megatron-core profile lists the block method), memory's
    fixes include full:N: Llama 3 70B on 64 H100s at tp 8 x pp 4 (20 layers a chunk) does not fit without recompute.
    Without the profile, no full:N is offered. The N is the smallest that fits (sizing.fewest_layers: full:N fits,
    full:N-1 does not, on the same layout)."""
    import re
    from dataclasses import replace

    from ddplan.registry import load_hardware, load_model
    from ddplan.sizing import fewest_layers, memory_pricer, memory_setup

    argv = ["memory", "-m", "llama-3-70b", "--hardware", "h100-sxm", "--gpus", "64", "--tp", "8", "--pp", "4",
            "--zero", "1"]
    out = run_ok(capsys, argv + ["--framework", "megatron-core"])
    assert re.search(r"recompute full:\d+ \(the first \d+ layers of each pipeline chunk re-run\)", out), out
    assert "full:" not in run_ok(capsys, argv)
    spec, hw = load_model("llama-3-70b"), load_hardware("h100-sxm")
    setup = memory_setup(spec, hw, gpus=64, tp=8, pp=4, micro_batch=2)  # the spec as shipped, 2 sequences a GPU
    pricer, window = memory_pricer(spec, hw, setup), spec.architecture.window_pattern
    full = replace(setup.at_zero(1), recompute="full")
    assert pricer.memory(full, window).fits and not pricer.memory(replace(full, recompute="none"), window).fits
    fewest = fewest_layers(pricer, full, window, False, spec.architecture.num_layers)
    n = int(fewest.recompute.partition(":")[2])
    assert 1 <= n < 20 and pricer.memory(fewest, window).fits
    assert n == 1 or not pricer.memory(replace(full, recompute=f"full:{n - 1}"), window).fits
    # at 4 sequences a GPU even 19 of 20 layers a chunk re-run leave it over: no full:N to offer
    big = memory_setup(spec, hw, gpus=64, tp=8, pp=4, micro_batch=4)
    big_pricer = memory_pricer(spec, hw, big)
    assert fewest_layers(big_pricer, replace(big.at_zero(1), recompute="full"), window, False, 80) is None
