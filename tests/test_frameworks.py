"""Framework profiles (ddplan/frameworks.py, frameworks/*.yaml): each item sourced at the profile's commit,
`--framework` (or a run file's `framework:`) filling only what nothing else states, and what a stack runs that
ddplan does not price said, not dropped."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from cli_helpers import csv_rows, fails, run, run_ok

from ddplan.frameworks import APPLIES, FrameworkProfile
from ddplan.registry import builtin_names, load_framework
from ddplan.specfile import validate

ROOT = Path(__file__).resolve().parent.parent
SEED = ROOT / "examples" / "seed-d24-mi300x.yaml"
LLAMA = ["-m", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--format", "csv"]


def test_every_shipped_profile_names_its_source_at_its_commit():
    """Every item of every profile says where (path@commit), and that commit is the profile's (or one of the
    other repositories it read, `also`): a profile is one stack at one commit."""
    names = builtin_names("frameworks")
    assert set(names) >= {"torchtitan", "megatron-core", "nemo", "composer", "nanochat", "olmo-core"}
    for name in names:
        p = load_framework(name)
        commits = [p.commit, *p.also.values()]
        items = [*p.applies.values(), *p.unpriced.values(), *p.recompute_policies, *p.lacks.values()]
        assert items, name
        for item in items:
            short = item.where.split("@", 1)[1].split()[0]
            assert any(c.startswith(short) for c in commits), (name, item.where)


def test_a_profile_item_ddplan_cannot_price_must_say_so():
    """An `applies` item ddplan has no field for is refused, naming the ones it has (and where the rest go)."""
    data = yaml.safe_load((ROOT / "frameworks" / "nanochat.yaml").read_text(encoding="utf-8"))
    data["applies"]["cuda_graphs"] = {"value": True, "where": "x.py@92d63d4"}
    with pytest.raises(Exception) as e:
        validate(FrameworkProfile, data, "nanochat.yaml")
    assert "cuda_graphs is not an item ddplan prices" in str(e.value) and "unpriced" in str(e.value)
    assert set(APPLIES) >= {"zero", "compiled", "recompute"}


def test_the_profile_fills_what_nothing_states_and_a_flag_wins(capsys):
    """Llama 3's own recipe shards fully (its spec: FSDP, ZeRO-3); Megatron-LM's command line without
    --use-distributed-optimizer is plain DDP: with --framework megatron-core the rows are ZeRO-0, priced exactly as
    the flags the profile stands for price them (its cuDNN attention by FA3 on H100); --zero 1 given with the
    profile wins."""
    assert {r["zero"] for r in csv_rows(run_ok(capsys, ["table", *LLAMA]))} == {"3"}
    rows = csv_rows(run_ok(capsys, ["table", *LLAMA, "--framework", "megatron-core"]))
    assert {r["zero"] for r in rows} == {"0"}
    by_flags = csv_rows(run_ok(capsys, ["table", *LLAMA, "--zero", "0", "--grads", "fp32", "--no-compile",
                                        "--recompute", "none", "--no-sequence-parallel", "--no-tp-comm-overlap",
                                        "--no-overlap-param-gather", "--no-fp8-all-gather", "--weights", "master",
                                        "--no-overlap-grad-reduce", "--attention", "fa3"]))
    assert [r["step_s"] for r in rows] == [r["step_s"] for r in by_flags]
    rows = csv_rows(run_ok(capsys, ["table", *LLAMA, "--framework", "megatron-core", "--zero", "1"]))
    assert {r["zero"] for r in rows} == {"1"}


def test_a_run_file_field_wins_over_the_profile_and_a_run_file_can_name_it(capsys, tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("kind: run\nmodel: llama-3-8b\nhardware: h100-sxm\ngpus: [8]\nframework: torchtitan\n"
                    "layout: {zero: 0}\n", encoding="utf-8")
    rows = csv_rows(run_ok(capsys, ["table", "--config", str(path), "--format", "csv"]))
    assert {r["zero"] for r in rows} == {"0"}  # torchtitan's FSDP2 at shard degree 1, not its default 3
    rows = csv_rows(run_ok(capsys, ["table", "--config", str(path), "--framework", "megatron-core", "--format",
                                    "csv"]))
    assert {r["zero"] for r in rows} == {"0"}  # the file's field over the other profile too


def test_what_the_profile_set_and_what_it_leaves_out_are_said(capsys):
    code, _, err = run(capsys, ["table", *LLAMA, "--framework", "torchtitan", "--zero", "0"])
    assert code == 0
    lines = err.splitlines()
    said = next(line for line in lines if line.startswith("table: the torchtitan profile (@b5bcd76, 2026-08-21) sets"))
    assert "--zero" not in said and "--sequence-parallel" in said and "--no-compile" in said
    assert "--attention flex" in said  # FlexAttention, priced on H100 (the spec's flex: a ratio to FA3)
    assert any("runs cuda graphs = True" in line and "ddplan does not price it yet" in line for line in lines)
    # the expert items only for a mixture of experts
    _, _, err = run(capsys, ["table", *LLAMA, "--framework", "megatron-core"])
    assert "moe dispatcher" not in err and "--no-overlap-grad-reduce" in err  # priced now, not "unpriced"
    assert "overlap grad reduce = False" not in err
    _, _, err = run(capsys, ["table", "-m", "mixtral-8x7b", "--hardware", "h100-sxm", "--gpus", "64", "--tp", "2",
                             "--ep", "8", "--framework", "megatron-core", "--format", "csv"])
    assert "moe dispatcher = allgather" in err


def test_nemo_overlaps_tp_communication_where_it_can(capsys):
    """NeMo's recipes turn TP communication overlap on and its callback turns it off without tp > 1 or sequence
    parallelism (frameworks/nemo.yaml): a tp-2 layout is overlapped, a tp-1 one runs (no refusal), the flag wins."""
    args = ["table", *LLAMA, "--framework", "nemo"]
    def tp_of(*more: str) -> set[str]:
        return {r["config"].split(", ")[1] for r in csv_rows(run_ok(capsys, [*args, *more]))}

    assert tp_of("--tp", "2") == {"tp 2 +SP overlapped"}
    assert tp_of("--tp", "2", "--no-tp-comm-overlap") == {"tp 2 +SP"}
    assert all("tp" not in r["config"] for r in csv_rows(run_ok(capsys, [*args, "--tp", "1"])))
    _, _, err = run(capsys, [*args, "--tp", "2", "--no-sequence-parallel"])
    assert "tp comm overlap" not in err and "needs --sequence-parallel" not in err
    # Transformer Engine's cuDNN attention has figures on Blackwell only: on Hopper FA3's stand in (elsewhere), as the
    # dataset's NeMo and Megatron-Core H100 runs are priced, not each spec kernel with SDPA as the baseline
    for name in ("nemo", "megatron-core"):
        assert {r["attention"] for r in csv_rows(run_ok(capsys, ["table", *LLAMA, "--framework", name]))} == {"fa3"}
        assert load_framework(name).attention_on({"cudnn", "fa3"}) == "cudnn"
    # memory takes the overlap too (the step times of its fixes are priced with it, as table prices them)
    _, _, err = run(capsys, ["memory", *LLAMA[:-2], "--framework", "nemo", "--tp", "2"])
    assert "no flag" not in err
    with pytest.raises(ValueError, match="unpriced: tp_comm_overlap is an item ddplan prices"):
        FrameworkProfile.model_validate({**load_framework("nemo").model_dump(),
                                         "unpriced": {"tp_comm_overlap": {"value": True, "where": "x.py@8cfedd7"}}})


def test_the_seed_prices_the_same_under_nanochat_s_profile(capsys):
    """nanochat's defaults (ZeRO-1-like sharded optimizer, torch.compile, no recompute) are what the nanochat
    model specs already state, and on MI300X its attention is SDPA (no FA3 there: flash_attention.py@92d63d4
    L23-71): under its profile the seed's table is the plain table's SDPA rows, each priced the same."""
    plain = csv_rows(run_ok(capsys, ["table", "--config", str(SEED), "--format", "csv"]))
    stack = csv_rows(run_ok(capsys, ["table", "--config", str(SEED), "--framework", "nanochat", "--format", "csv"]))
    assert len(stack) == 4 and stack == [r for r in plain if r["attention"] == "sdpa-fused"]


def test_a_profile_does_not_narrow_plan_s_search(capsys):
    """A profile's recompute and ZeRO stage are its defaults, not the only choices: plan still searches every
    stage (Megatron-LM's default, plain DDP, would leave one)."""
    rows = csv_rows(run_ok(capsys, ["plan", "-m", "d20", "--hardware", "h100-sxm", "--gpus", "8",
                                    "--framework", "megatron-core", "--format", "csv"]))
    assert len({r["zero"] for r in rows}) > 1


def test_print_config_keeps_the_framework_not_what_it_filled(capsys, tmp_path):
    text = run_ok(capsys, ["table", *LLAMA[:-2], "--framework", "torchtitan", "--print-config"])
    data = yaml.safe_load(text)
    assert data["framework"] == "torchtitan" and "layout" not in data and "compiled" not in data
    path = tmp_path / "run.yaml"
    path.write_text(text, encoding="utf-8")
    assert run_ok(capsys, ["table", "--config", str(path), "--format", "csv"]) == run_ok(
        capsys, ["table", *LLAMA, "--framework", "torchtitan"])


def test_an_unknown_framework_is_one_line(capsys):
    _, err = fails(capsys, ["table", *LLAMA, "--framework", "torchtitn"])
    assert "--framework" in err and "did you mean torchtitan" in err


def test_a_zero_stage_a_stack_has_no_setup_for_is_refused_or_not_searched(capsys, tmp_path):
    """torchtitan's only data-parallel wrapper is FSDP2 (models/llama3/parallelize.py@b5bcd76 L57-78): no ZeRO-1 or 2;
    nanochat shards its optimizer state on more than one GPU, always (optim.py@92d63d4): ZeRO-1 only; Megatron-LM in
    2023 (@0609f27) has DDP and the distributed optimizer, no FSDP: 0 and 1. `table` and `memory` refuse a --zero
    stage the stack has no setup for in one line naming --zero and the stages it runs (exit 2); `plan` searches only
    those and says what it leaves out; `memory` shows only those by default. Every profile runs its own stage, and
    every published run with a profile states a stage its stack runs (the llm-foundry MPT-1B run on 512 H100, FSDP1's
    SHARD_GRAD_OP, is ZeRO-3 kept after forward, not ZeRO-2)."""
    from ddplan.frameworks import ZERO_LACKS
    from ddplan.replay import run_zero
    from ddplan.runs import load_runs

    titan = load_framework("torchtitan")
    assert titan.zero_stages() == (0, 3) and titan.lacked(zero=1) == ["zero1"] and titan.lacked(zero=3) == []
    assert load_framework("nanochat").zero_stages() == (1,) and load_framework("megatron-lm").zero_stages() == (0, 1)
    assert load_framework("megatron-core").zero_stages() == (0, 1, 2, 3)
    g16 = ["-m", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "16", "--framework", "torchtitan"]
    for argv in (["table", *g16, "--zero", "1"], ["memory", *g16, "--zero", "3,2"], ["plan", *g16, "--zero", "1"]):
        code, err = fails(capsys, argv)
        assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("error: --zero: torchtitan"), err
        assert "has no ZeRO-" in err and "choose --zero 0 or 3 (what it runs" in err
    # one data-parallel rank shards nothing: no stage is refused there (nanochat runs ZeRO-0 on one GPU)
    for argv in (["memory", "-m", "d20", "--hardware", "h100-sxm", "--gpus", "1", "--framework", "nanochat", "--zero",
                  "0"], ["table", *g16[:-4], "--gpus", "8", "--pp", "8", "--framework", "torchtitan", "--zero", "1"]):
        assert run(capsys, argv)[0] == 0, argv
    # a run file's stage is named as its field; a profile that runs a stage it lacks is refused at load
    runfile = tmp_path / "run.yaml"
    runfile.write_text("kind: run\nmodel: llama-3-8b\nhardware: h100-sxm\ngpus: [16]\nframework: torchtitan\n"
                       "layout: {zero: 2}\n", encoding="utf-8")
    assert fails(capsys, ["table", "--config", str(runfile)])[1].startswith(
        "error: the run file's layout.zero: torchtitan (@b5bcd76) has no ZeRO-2")
    # a calibration's measured step, priced as it ran, names the step, not a flag the user never typed
    cal = tmp_path / "cal.yaml"
    cal.write_text(yaml.safe_dump({"kind": "calibration", "version": 1, "hardware": "h100-sxm", "step_times": [
        {"model": "nanochat-d24", "gpus": 8, "zero": 2, "step_time_s": 1.0, "device_batch_size": 16,
         "total_batch_tokens": 524_288, "attention": "fa3", "window_pattern": "L", "source": "a test"}]}),
        encoding="utf-8")
    assert fails(capsys, ["table", "--calibration", str(cal), "--framework", "torchtitan"])[1].startswith(
        f"error: {cal}'s measured step (zero: 2): torchtitan (@b5bcd76) has no ZeRO-2")
    bad = yaml.safe_load((ROOT / "frameworks" / "torchtitan.yaml").read_text(encoding="utf-8"))
    bad["applies"]["zero"]["value"] = 1
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad), encoding="utf-8")
    assert "applies.zero: 1 is a stage its `lacks` names (zero1)" in fails(
        capsys, ["table", *g16[:-2], "--framework", str(tmp_path / "bad.yaml")])[1]
    rows = csv_rows(run_ok(capsys, ["plan", *g16, "--format", "csv"]))
    assert rows and {r["zero"] for r in rows} == {"0", "3"}
    assert {r["zero"] for r in csv_rows(run_ok(capsys, ["plan", *g16[:-2], "--format", "csv"]))} == {"0", "1", "2", "3"}
    # what memory forces on the choice is weighed against what the stack runs: ZeRO-0 (not 1 or 2), per-op's
    # lighter policy none (not Megatron's selective)
    forced = " ".join(run(capsys, ["plan", "-m", "llama-3-70b", "--hardware", "h100-sxm", "--gpus", "64",
                                   "--framework", "torchtitan"])[1].split())
    assert "Memory forces ZeRO-3: ZeRO-0 would need" in forced and "ZeRO-1 would" not in forced
    assert "Memory forces recompute per-op: with the same layout, recompute none needs" in forced
    assert "selective" not in forced.split("Memory forces recompute")[1].split(".")[0]
    for name in ("megatron-core", "megatron-bridge", "nemo"):  # they lack nothing: no empty "cannot run" line
        assert "cannot run" not in run(capsys, ["plan", *g16[:-1], name])[2]
    text = " ".join(run(capsys, ["plan", *g16])[2].split())
    assert "plan leaves out what torchtitan (@b5bcd76) cannot run: ZeRO-1 (the optimizer state sharded alone), " \
           "ZeRO-2 (the gradients sharded too, the parameters whole) (torchtitan/models/llama3/parallelize.py" in text
    # a profile that sets no stage (a user's own file): memory shows the stages its stack runs
    data = yaml.safe_load((ROOT / "frameworks" / "megatron-lm.yaml").read_text(encoding="utf-8"))
    del data["applies"]["zero"]
    path = tmp_path / "fw.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    mem = ["memory", "-m", "gpt2-1.5b", "--hardware", "h100-sxm", "--gpus", "8", "--format", "csv"]
    assert [r["zero"] for r in csv_rows(run_ok(capsys, [*mem, "--framework", str(path)]))] == ["0", "1"]
    assert [r["zero"] for r in csv_rows(run_ok(capsys, mem))] == ["0", "1", "2", "3"]
    for name in builtin_names("frameworks"):
        p = load_framework(name)
        assert "zero" not in p.applies or f"zero{p.applies['zero'].value}" not in p.lacks, name
    for r in load_runs().runs:
        zero, p = run_zero(r), load_framework(r.framework) if r.framework in builtin_names("frameworks") else None
        if p is not None and zero is not None and r.layout.gpus > r.layout.tp * r.layout.pp:
            assert ZERO_LACKS[zero] not in p.lacks, r.id


def test_plan_and_memory_s_fixes_search_the_recompute_a_stack_offers(capsys, tmp_path):
    """Each profile's recompute policies say what ddplan prices them as (priced_as): torchtitan's selective is its
    per-op save list (distributed/activation_checkpoint.py@b5bcd76 L31-94), not Megatron's core-attention one;
    nanochat has none (scripts/base_train.py@92d63d4). `plan` searches, unless told, the stack's among none,
    selective, per-op and full, and says so where they differ from its own three; memory's fixes try the stack's
    (per-op in selective's place for torchtitan); a policy given that the stack has none of is priced as asked and
    said once. Every published run and measured peak with a profile ran a policy its stack offers."""
    from ddplan.frameworks import recompute_family, searched_recomputes
    from ddplan.runs import load_peaks, load_runs

    assert load_framework("torchtitan").recompute_offered() == ("none", "per-op", "full")
    assert load_framework("nanochat").recompute_offered() == ("none",)
    assert load_framework("megatron-core").recompute_offered() == ("none", "selective", "selective:MODULES", "full",
                                                                   "full:N")
    assert load_framework("olmo-core").recompute_offered() == ("none", "selective:MODULES", "per-op", "full",
                                                               "every:K")  # its module globs, not core attention
    assert [recompute_family(p) for p in ("selective:mlp+core_attn", "selective", "full:4", "every:2", "per-op")] == [
        "selective:MODULES", "selective", "full:N", "every:K", "per-op"]
    assert searched_recomputes(("none", "per-op", "full")) == ("none", "per-op", "full")
    assert searched_recomputes(("none", "selective", "full", "full:N")) == ("none", "selective", "full")
    g16 = ["plan", "-m", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "16", "--format", "csv"]
    assert {r["recompute"] for r in csv_rows(run_ok(capsys, [*g16, "--framework", "torchtitan"]))} == {
        "none", "per-op", "full"}
    assert {r["recompute"] for r in csv_rows(run_ok(capsys, g16))} == {"none", "selective", "full"}
    text = " ".join(run(capsys, ["plan", "-m", "d32", "--hardware", "h100-sxm", "--gpus", "8", "--framework",
                                 "nanochat"])[2].split())
    assert "plan searches the recompute policies nanochat offers, as ddplan prices them: none" in text
    # a profile written before priced_as (its policies unpriced): nothing is known, the defaults search as before
    old = yaml.safe_load((ROOT / "frameworks" / "megatron-core.yaml").read_text(encoding="utf-8"))
    for policy in old["recompute_policies"]:
        del policy["priced_as"]
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(old), encoding="utf-8")
    assert {r["recompute"] for r in csv_rows(run_ok(capsys, [*g16, "--framework", str(tmp_path / "old.yaml")]))} >= {
        "none", "selective", "full"}  # and its block method's full:N
    assert searched_recomputes(None) == ("none", "selective", "full") and searched_recomputes(()) == ("none",)
    code, _, err = run(capsys, ["table", *LLAMA, "--framework", "torchtitan", "--recompute", "selective"])
    assert code == 0 and ("warning: --recompute selective: torchtitan (@b5bcd76) has no policy priced as it (its "
                          "policies, as ddplan prices them: selective = per-op, full = full, none = none); priced as "
                          "asked") in " ".join(err.split())
    # what memory forces is weighed against none and the lighter policies searched, and said only where none fits:
    # with --recompute full alone, none (over the 76 GiB usable) is named; a user's own policy that none would fit
    # is not "forced"
    g70 = ["plan", "-m", "llama-3-70b", "--hardware", "h100-sxm", "--gpus", "64"]
    text = " ".join(run_ok(capsys, [*g70, "--recompute", "full"]).split())
    forced = re.search(r"Memory forces recompute full: with the same layout, recompute none needs (\d+) GiB, against "
                       r"(\d+) GiB usable", text)
    assert forced and int(forced[1]) > int(forced[2]) == 76
    runfile = tmp_path / "run.yaml"
    runfile.write_text("kind: run\nmodel: llama-3-8b\nhardware: h100-sxm\ngpus: [8]\nframework: torchtitan\n"
                       "recompute: [selective]\n", encoding="utf-8")
    assert "Memory forces recompute" not in run_ok(capsys, ["plan", "--config", str(runfile)])
    names = set(builtin_names("frameworks"))
    for r in [*load_runs().runs, *load_peaks().peaks]:
        offered = load_framework(r.framework).recompute_offered() if r.framework in names else None
        if offered is not None and r.layout.recompute:
            assert recompute_family(r.layout.recompute) in offered, r.id


@pytest.mark.parametrize("key, value, words", [("zero", 7, "applies.zero.value: Input should be 0, 1, 2 or 3"),
                                               ("compiled", 3, "applies.compiled.value: must be true or false")])
def test_a_profile_value_its_field_refuses_is_said_at_load(capsys, tmp_path, key, value, words):
    """A bad value in a profile names the profile's item, not a flag the user never typed (a review)."""
    data = yaml.safe_load((ROOT / "frameworks" / "nanochat.yaml").read_text(encoding="utf-8"))
    data["applies"][key]["value"] = value
    path = tmp_path / "fw.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    _, err = fails(capsys, ["table", "-m", "d20", "--framework", str(path)])
    assert err.startswith(f"error: {path}: ") and words in err


def test_a_profile_never_overrides_what_a_calibration_measured(capsys, tmp_path):
    """A calibration's measured step states the run it priced (the seed's log: d24 compiled, as nanochat runs): a
    profile's defaults rank below it, so `table --calibration` prices the measured run as it ran with or without
    --framework (a review: torchtitan's --no-compile had replaced the measured compiled step)."""
    cal = tmp_path / "log.yaml"
    assert run(capsys, ["calibrate", "--model", "d24", "--hardware", "mi300x", "--from-log",
                        str(ROOT / "tests" / "data" / "nanochat_train.log"), "--window", "L", "--out", str(cal)])[0] == 0
    plain = csv_rows(run_ok(capsys, ["table", "--calibration", str(cal), "--format", "csv"]))
    framed = csv_rows(run_ok(capsys, ["table", "--calibration", str(cal), "--framework", "torchtitan", "--format",
                                      "csv"]))
    assert [(r["config"], r["basis"], r["step_s"]) for r in framed] == [
        (r["config"], r["basis"], r["step_s"]) for r in plain]


def test_nemo_s_performance_scripts_reduce_gradients_in_bf16_under_the_distributed_optimizer(capsys):
    """Hand: Llama 3 8B (8,030,261,248 parameters) on 8 GPUs, dp 8: NeMo's profile keeps bf16 gradients
    (grad_reduce_in_fp32 False) under ZeRO-1, 2 bytes each, where Megatron-LM's command line keeps them in fp32,
    4 bytes each (both unsharded at ZeRO-1); the optimizer's two fp32 Adam moments and, its scripts turning on the
    precision-aware optimizer for bf16 (scripts/performance/helpers.py@8cfedd7 L216-218), the fp32 masters' low 16
    bits, 4 + 4 + 2 = 10 bytes, sharded over 8 (12 under fp8, whose masters stay whole); sequence parallelism on with
    tp > 1 and the parameter all-gather overlapped."""
    from ddplan.params import total_params
    from ddplan.registry import load_model

    n = total_params(load_model("llama-3-8b").architecture)
    assert n == 8_030_261_248
    common = ["memory", "-m", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--attention", "fa2",
              "--format", "json"]
    nemo = json.loads(run_ok(capsys, [*common, "--framework", "nemo"]))
    asked = next(r for r in nemo["rows"] if r["zero"] == 1)
    assert asked["gradients_gib"] == pytest.approx(2 * n / 2**30, rel=1e-9)
    assert asked["optimizer_gib"] == pytest.approx(10 * n / 8 / 2**30, rel=1e-9)
    fp8 = json.loads(run_ok(capsys, [*common, "--framework", "nemo", "--fp8"]))
    assert next(r for r in fp8["rows"] if r["zero"] == 1)["optimizer_gib"] == pytest.approx(12 * n / 8 / 2**30,
                                                                                              rel=1e-9)
    # the assumptions say so
    explain = run_ok(capsys, ["table", "-m", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--framework",
                              "nemo", "--explain"])
    assert "fp32 masters, as 16-bit remainders on the distributed optimizer's rows" in explain
    # Megatron-FSDP keeps whole masters too: --zero 3 alone is priced so, not refused
    fsdp = json.loads(run_ok(capsys, [*common, "--framework", "megatron-bridge", "--zero", "3"]))
    assert fsdp["rows"][0]["optimizer_gib"] == pytest.approx(12 * n / 8 / 2**30, rel=1e-9)
    mcore = json.loads(run_ok(capsys, [*common, "--framework", "megatron-core", "--zero", "1"]))
    assert next(r for r in mcore["rows"] if r["zero"] == 1)["gradients_gib"] == pytest.approx(4 * n / 2**30, rel=1e-9)
    rows = csv_rows(run_ok(capsys, ["table", "-m", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--tp", "2",
                                    "--framework", "nemo", "--format", "csv"]))
    assert {(r["zero"], r["sp"]) for r in rows} == {("1", "True")}


def test_olmo_core_s_hybrid_sharding_all_reduces_once_a_step(capsys):
    """OLMo-core's profile (train_module.py@fa6c501 L565-578: set_requires_all_reduce(is_last_mb) under HSDP): on 64
    H100s sharded over 8 (8 replicas) at 4 micro-batches a step, the replicas' all-reduce runs once, not four times
    as torch FSDP2's default does, so the data-parallel total is 3 all-reduces less (comm.fsdp_comm_s; at 2
    micro-batches, 1 less: the saving at 4 is 3x the saving at 2); compute does not move. Every dataset run on
    OLMo-core is priced with the profile (replay.run_framework)."""
    from ddplan.replay import run_framework
    from ddplan.runs import load_runs

    common = ["table", "-m", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "64", "--zero", "3", "--shard-group",
              "8", "--device-batch-size", "1", "--total-batch-size", str(64 * 4 * 8192), "--attention", "fa3",
              "--format", "json"]
    olmo = json.loads(run_ok(capsys, [*common, "--framework", "olmo-core"]))["rows"][0]
    fsdp2 = json.loads(run_ok(capsys, [*common, "--framework", "olmo-core", "--no-replica-reduce-once"]))["rows"][0]
    assert "all-reduced once a step" in olmo["config"] and "once a step" not in fsdp2["config"]
    assert olmo["accum"] == 4 and olmo["compute_s"] == fsdp2["compute_s"] and olmo["step_s"] <= fsdp2["step_s"]
    # four micro-batches: FSDP2 all-reduces 4 times, OLMo-core once; so the totals differ by 3 all-reduces, and
    # at 2 micro-batches by 1: the difference at 4 is 3x the difference at 2
    two = [*common[:common.index("--total-batch-size") + 1], str(64 * 2 * 8192), *common[common.index("--attention"):]]
    olmo2 = json.loads(run_ok(capsys, [*two, "--framework", "olmo-core"]))["rows"][0]
    fsdp2_2 = json.loads(run_ok(capsys, [*two, "--framework", "olmo-core", "--no-replica-reduce-once"]))["rows"][0]
    saved_4 = fsdp2["dp_comm_total_s"] - olmo["dp_comm_total_s"]
    saved_2 = fsdp2_2["dp_comm_total_s"] - olmo2["dp_comm_total_s"]
    assert saved_2 > 0 and saved_4 == pytest.approx(3 * saved_2, rel=1e-9)
    olmo_runs = [r for r in load_runs().runs if r.framework == "olmo-core"]
    assert len(olmo_runs) == 10 and {run_framework(r) for r in olmo_runs} == {"olmo-core"}


def test_torchtitan_s_flex_attention_is_priced_where_the_spec_has_it(capsys):
    """torchtitan's profile names FlexAttention (torchtitan/models/llama3/__init__.py@b5bcd76 L371). Its efficiencies
    are the PyTorch team's ratios to FA2 (A100: 0.90 forward, 0.85 backward; Hopper: 1.25 and 1.03) of the spec's own
    fa2 entry, value, low and high each rounded half up to 0.01 (by hand with Decimal), and on H100 its attention
    time lies between fa3's and fa2's. On MI300X, whose spec has no flex, the profile's attention gives way to the
    spec's own implementations, said in one warning; a user's own --attention flex there is still an error."""
    from decimal import ROUND_HALF_UP, Decimal

    from ddplan.registry import load_hardware

    def half_up(x: Decimal) -> float:
        return float(x.quantize(Decimal("0.01"), rounding=ROUND_HALF_UP))

    for name, fwd, bwd in (("h100-sxm", "1.25", "1.03"), ("h100-pcie", "1.25", "1.03"), ("h200", "1.25", "1.03"),
                           ("a100-sxm-80gb", "0.90", "0.85"), ("a100-sxm-40gb", "0.90", "0.85")):
        impls = {a.name: a for a in load_hardware(name).attention}
        flex, base = impls["flex"], impls["fa2"]
        assert not flex.by_default and flex.kind == "flash_package" and flex.windows == "native"
        for got, of, r in ((flex.efficiency_fwd, base.efficiency_fwd, fwd), (flex.efficiency_bwd, base.efficiency_bwd, bwd)):
            want = tuple(half_up(Decimal(r) * Decimal(str(x))) for x in (of.value, of.low, of.high))
            assert (got.value, got.low, got.high) == want, name
    h100 = LLAMA
    rows = {a: csv_rows(run_ok(capsys, ["table", *h100, "--zero", "3", "--attention", a]))[0] for a in ("fa2", "fa3", "flex")}
    assert float(rows["fa3"]["attention_s"]) < float(rows["flex"]["attention_s"]) < float(rows["fa2"]["attention_s"])
    titan = csv_rows(run_ok(capsys, ["table", *h100, "--framework", "torchtitan"]))
    assert {r["attention"] for r in titan} == {"flex"}
    code, _, err = run(capsys, ["table", "-m", "llama-3-8b", "--hardware", "mi300x", "--gpus", "8", "--framework",
                                "torchtitan", "--format", "csv"])
    assert code == 0 and err.count("the torchtitan profile's attention, flex, has no efficiency in the mi300x spec") == 1
    assert "--attention flex" not in err  # not said as set: it was not
    code, err = fails(capsys, ["table", "-m", "llama-3-8b", "--hardware", "mi300x", "--gpus", "8", "--attention", "flex"])
    assert code == 2 and "'flex' is not available on mi300x" in err


def test_nemo_s_fp8_weights_come_with_fp8_only(capsys):
    """NeMo's profile keeps the fp8 GEMMs' weights in fp8 (mixed_precision.py@8cfedd7 L70, fp8_param_gather), which
    ddplan prices (--fp8-params, ZeRO-1/2): applied with --fp8 only, as the profile's recipe is. Without --fp8 the
    profile neither turns fp8 on nor is refused (a user's own --fp8-params without --fp8 still is); with it, the
    step is the one --fp8-params gives by hand, and --no-fp8-params wins over the profile."""
    base = ["table", "-m", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--attention", "fa3",
            "--format", "csv"]
    bf16 = csv_rows(run_ok(capsys, [*base, "--framework", "nemo"]))
    plain = csv_rows(run_ok(capsys, [*base, "--framework", "nemo", "--no-fp8-params"]))
    assert [r["step_s"] for r in bf16] == [r["step_s"] for r in plain]
    fp8 = csv_rows(run_ok(capsys, [*base, "--framework", "nemo", "--fp8"]))
    stated = csv_rows(run_ok(capsys, [*base, "--framework", "nemo", "--fp8", "--fp8-params"]))
    unstated = csv_rows(run_ok(capsys, [*base, "--framework", "nemo", "--fp8", "--no-fp8-params"]))
    assert [r["step_s"] for r in fp8] == [r["step_s"] for r in stated] != [r["step_s"] for r in unstated]
    code, err = fails(capsys, [*base[:-2], "--fp8-params"])
    assert code == 2 and "--fp8-params" in err


def test_plan_and_memory_take_a_profile_s_values_only_where_they_apply(capsys):
    """plan searches the profile's attention (the stack's kernel: torchtitan's flex on H100), not every kernel; over
    hardware one of which lacks it, flex on the one that has it and every kernel on the other, said once. memory with NeMo's profile, --fp8 and a recipe fp8
    weights cannot take (tensorwise: not Transformer Engine's) prices without them and says so, where a user's own
    --fp8-params is refused."""
    rows = csv_rows(run_ok(capsys, ["plan", "-m", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8",
                                    "--framework", "torchtitan", "--format", "csv"]))
    assert {r["attention"] for r in rows} == {"flex"}
    code, out, err = run(capsys, ["plan", "-m", "llama-3-8b", "--hardware", "h100-sxm,mi300x", "--gpus", "8",
                                  "--framework", "torchtitan", "--format", "csv"])
    assert code == 0 and err.count("flex, has no efficiency in the mi300x spec") == 1
    by_hw = {(r["hardware"], r["attention"]) for r in csv_rows(out)}
    assert {a for h, a in by_hw if h == "h100-sxm"} == {"flex"} and "flex" not in {a for h, a in by_hw if h == "mi300x"}
    memory = ["memory", "-m", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--fp8", "--fp8-recipe",
              "tensorwise", "--format", "csv"]
    code, _, err = run(capsys, [*memory, "--framework", "nemo"])
    assert code == 0 and "keeps the fp8 GEMMs' weights in fp8 (--fp8-params), which this run cannot take" in err
    assert "--fp8-params" not in next(line for line in err.splitlines() if "profile (@" in line)
    code, err = fails(capsys, [*memory, "--fp8-params", "--zero", "1"])
    assert code == 2 and "--fp8-params" in err


def test_a_profile_s_attention_elsewhere_is_what_the_stack_runs_off_its_kernel(capsys, tmp_path):
    """nanochat runs FlashAttention-3 on Hopper in bf16 and SDPA elsewhere (nanochat/flash_attention.py@92d63d4
    L23-71): its profile's attention is fa3 in bf16 (`dtypes`) with `elsewhere: sdpa-fused`. table takes fa3 on H100
    and sdpa-fused on MI300X (said in one warning, not as set); plan over both takes each one's own, one kernel a hardware; a published run that states
    no attention takes the same (replay.run_attention). `elsewhere` on another item is refused."""
    from ddplan.errors import DdplanError
    from ddplan.registry import load_framework, load_hardware
    from ddplan.replay import run_attention

    profile = load_framework("nanochat")
    assert profile.attention_on({"fa3", "sdpa-fused"}) == "fa3"
    assert profile.attention_on({"sdpa-fused", "fa2"}) == "sdpa-fused"
    assert profile.attention_on({"fa2"}) is None
    base = ["table", "-m", "d24", "--gpus", "8", "--framework", "nanochat", "--format", "csv"]
    h100 = csv_rows(run_ok(capsys, [*base, "--hardware", "h100-sxm"]))
    assert {r["attention"] for r in h100} == {"fa3"}
    code, out, err = run(capsys, [*base, "--hardware", "mi300x"])
    assert code == 0 and {r["attention"] for r in csv_rows(out)} == {"sdpa-fused"}
    assert err.count("the nanochat profile's attention, fa3, has no efficiency in the mi300x spec: priced with "
                     "mi300x: sdpa-fused, as the profile prices it there") == 1
    assert "--attention fa3" not in err
    code, out, err = run(capsys, ["plan", "-m", "d24", "--hardware", "h100-sxm,mi300x", "--gpus", "8", "--framework",
                                  "nanochat", "--format", "csv"])
    assert code == 0 and err.count("has no efficiency in the mi300x spec") == 1
    by_hw = {}
    for r in csv_rows(out):
        by_hw.setdefault(r["hardware"], set()).add(r["attention"])
    assert by_hw == {"h100-sxm": {"fa3"}, "mi300x": {"sdpa-fused"}}

    class Run:  # the fields run_attention reads
        class layout:
            attention = None
        framework = "nanochat"
    Run.compute_dtype = "bf16"
    assert run_attention(Run, load_hardware("h100-sxm")) == "fa3"
    assert run_attention(Run, load_hardware("mi300x")) == "sdpa-fused"
    Run.compute_dtype = "fp16"  # nanochat runs FA3 in bf16 only (flash_attention.py@92d63d4 L63-68): SDPA on Hopper too
    assert run_attention(Run, load_hardware("h100-sxm")) == "sdpa-fused"
    assert profile.attention_on({"fa3", "sdpa-fused"}, "fp16") == "sdpa-fused"
    assert profile.attention_on({"fa3", "sdpa-fused"}, "bf16") == profile.attention_on({"fa3", "sdpa-fused"}) == "fa3"
    code, out, err = run(capsys, [*base, "--hardware", "h100-sxm", "--dtype", "fp16"])
    assert code == 0 and {r["attention"] for r in csv_rows(out)} == {"sdpa-fused"}
    assert "the nanochat profile's attention, fa3, runs in bf16 only, not fp16" in err
    from ddplan.registry import builtin_dir
    text = (Path(builtin_dir("frameworks")) / "nanochat.yaml").read_text()
    bad = tmp_path / "odd.yaml"
    bad.write_text(text.replace("  recompute:\n    value: none\n", "  recompute:\n    value: none\n    elsewhere: full\n"))
    with pytest.raises(DdplanError, match="`elsewhere` and `dtypes` are for applies.attention only"):
        load_framework(str(bad))


def test_megatron_s_full_recompute_re_runs_the_whole_block(capsys):
    """Megatron's checkpoint is reentrant (CheckpointFunction re-runs the region whole): the megatron-core, nemo,
    megatron-lm, megatron-deepspeed and torchtitan profiles state recompute_early_stop false, Composer (llm-foundry's
    yamls), OLMo-core and fms-fsdp true (torch's early stop, the default). --no-recompute-early-stop under full
    recompute lengthens the step (each block's down projection re-runs: on Llama-3-8B its 14,336 x 4,096 weights
    are 27% of the block's 53,248 x 4,096, 2 x 4096^2 + 2 x 4096 x 1024 + 3 x 4096 x 14336); without recompute it
    changes nothing."""
    stated = {name: load_framework(name).applies["recompute_early_stop"].value
              for name in ("megatron-core", "nemo", "megatron-lm", "megatron-deepspeed", "torchtitan", "composer",
                           "olmo-core", "fms-fsdp")}
    assert stated == {"megatron-core": False, "nemo": False, "megatron-lm": False, "megatron-deepspeed": False,
                      "torchtitan": False, "composer": True, "olmo-core": True, "fms-fsdp": True}
    base = ["table", "-m", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--attention", "fa3", "--zero", "3",
            "--format", "csv"]
    (early,) = csv_rows(run_ok(capsys, base + ["--recompute", "full"]))
    (whole,) = csv_rows(run_ok(capsys, base + ["--recompute", "full", "--no-recompute-early-stop"]))
    assert float(whole["step_s"]) > float(early["step_s"])
    (plain,) = csv_rows(run_ok(capsys, base))
    (plain_whole,) = csv_rows(run_ok(capsys, base + ["--no-recompute-early-stop"]))
    assert plain["step_s"] == plain_whole["step_s"]


def test_plan_and_a_measured_step_take_the_stacks_recompute_too(capsys):
    """A review found plan's searched layouts took early stop from the search group's first layout (recompute none)
    and a measured step fitted on a layout without the command's options: plan's full and selective rows must move
    with --no-recompute-early-stop, and a measured step under it is the table's one row, not a second."""
    base = ["plan", "-m", "gpt2-1.5b", "--hardware", "a100-sxm-80gb", "--gpus", "8", "--framework", "megatron-lm",
            "--format", "csv"]
    rows = [{(r["recompute"], r["tp"], r["pp"], r["zero"], r["micro_batch"]): r["step_s"]
             for r in csv_rows(run_ok(capsys, base + flag))} for flag in ([], ["--recompute-early-stop"])]
    shared = [k for k in rows[0] if k in rows[1] and k[0] in ("full", "selective")]
    assert shared and all(float(rows[0][k]) > float(rows[1][k]) for k in shared)
    table = ["table", "-m", "gpt2-1.5b", "--hardware", "a100-sxm-80gb", "--gpus", "8", "--attention", "fa2",
             "--recompute", "full", "--no-recompute-early-stop", "--measured-step-time", "4.0", "--format", "csv"]
    (row,) = csv_rows(run_ok(capsys, table))
    assert row["basis"] == "measured" and float(row["step_s"]) == 4.0


def test_a_malformed_quantize_table_is_one_line(capsys, tmp_path):
    """torchtitan TOMLs: a [quantize] that is not a table, or converters that are not a list of names, are one line
    naming the field; float8 and mx together are priced as float8, said in a warning."""
    toml = tmp_path / "job.toml"
    head = '[model]\nname = "llama3"\nflavor = "8B"\n'
    for body, field in (('converters = ["float8"]\n[quantize]\nlinear = 3\n', "quantize.linear"),
                        ('converters = ["quantize.linear.mx"]\n[quantize.linear]\nmx = 3\n', "quantize.linear.mx"),
                        ('converters = "float8"\n', "model.converters")):
        toml.write_text(head + body, encoding="utf-8")
        _, line = fails(capsys, ["import", str(toml), "-o", str(tmp_path / "run.yaml")])
        assert f"{field}: must be" in line
    toml.write_text(head + 'converters = ["quantize.linear.mx", "float8"]\n', encoding="utf-8")
    code, _, err = run(capsys, ["import", str(toml), "-o", str(tmp_path / "run.yaml")])
    assert code == 0 and "both float8 and mx; priced as float8" in err


def test_a_measured_step_takes_the_options_only_where_they_apply(capsys, tmp_path):
    """A second review: the measured layout took the options by Options.for_layout and was refused where an option
    cannot apply to what ran (activation offload with the measured pp 2; a shard group that does not divide the
    measured ranks); it now takes them as a search does (Options.searched), leaving those out. A torchtitan TOML's
    enable_fsdp_float8_all_gather is imported only when true and sharded (torchtitan applies it with FSDP only)."""
    base = ["table", "-m", "llama-3-8b", "--hardware", "h100-sxm", "--attention", "fa3", "--format", "csv"]
    rows = csv_rows(run_ok(capsys, base + ["--gpus", "8", "--offload-activations", "4", "--measured-step-time",
                                           "60", "--measured-pp", "2"]))
    assert any(r["basis"] == "measured" for r in rows)
    rows = csv_rows(run_ok(capsys, base + ["--gpus", "12", "--zero", "3", "--shard-group", "6",
                                           "--measured-step-time", "40", "--measured-gpus", "8"]))
    assert any(r["basis"] == "measured" for r in rows)
    toml, runfile = tmp_path / "job.toml", tmp_path / "run.yaml"
    toml.write_text('[model]\nname = "llama3"\nflavor = "8B"\nconverters = ["float8"]\n[parallelism]\n'
                    'data_parallel_shard_degree = 1\n[float8]\nenable_fsdp_float8_all_gather = true\n',
                    encoding="utf-8")
    run(capsys, ["import", str(toml), "-o", str(runfile)])
    assert "fp8_all_gather" not in runfile.read_text(encoding="utf-8")


def test_a_torchtitan_job_states_whether_its_checkpoint_stops_early(capsys, tmp_path):
    """torchtitan's activation_checkpoint.early_stop (default False since 2025-08-29, job_config.py): a TOML imports
    it as recompute_early_stop, false by default (a block re-runs whole, as the profile says), true where the job
    sets it or the TOML predates the option; anything else is one line naming the field."""
    toml, runfile = tmp_path / "job.toml", tmp_path / "run.yaml"
    head = '[model]\nname = "llama3"\nflavor = "8B"\n[activation_checkpoint]\nmode = "full"\n'
    for extra, want in (("", "recompute_early_stop: false"), ("early_stop = true\n", "recompute_early_stop: true")):
        toml.write_text(head + extra, encoding="utf-8")
        assert run(capsys, ["import", str(toml), "-o", str(runfile)])[0] == 0
        assert want in runfile.read_text(encoding="utf-8")
    toml.write_text(head + 'early_stop = "yes"\n', encoding="utf-8")
    _, line = fails(capsys, ["import", str(toml), "-o", str(runfile)])
    assert "activation_checkpoint.early_stop: must be true or false" in line
    # a TOML with training.compile is from before torchtitan 08b8b24 (2025-08-20), whose wrapper kept torch's early
    # stop (the option came with 25413d2, 2025-08-29); it states the option only where the job gives it
    for extra, want in (("", "recompute_early_stop: true"), ("early_stop = false\n", "recompute_early_stop: false")):
        toml.write_text(head + extra + "[training]\ncompile = false\n", encoding="utf-8")
        assert run(capsys, ["import", str(toml), "-o", str(runfile)])[0] == 0
        assert want in runfile.read_text(encoding="utf-8")


def test_megatron_bridge_is_nemo_s_successor_with_its_own_fp8(capsys):
    """Megatron-Bridge's performance scripts (frameworks/megatron-bridge.yaml, @067f987) run NeMo's settings but fp8 by
    current scaling (fp8_cs, Megatron's tensorwise; NeMo 2's scripts took delayed scaling), fp8 weights gathered in
    fp8 in both, both priced as tuned fp8 stacks; `mbridge` is its alias, and `megatron-bridge` no longer names the
    nemo profile."""
    bridge, nemo = load_framework("megatron-bridge"), load_framework("nemo")
    assert load_framework("mbridge").name == "megatron-bridge" and "megatron-bridge" not in nemo.aliases
    assert (bridge.applies["fp8_recipe"].value, nemo.applies["fp8_recipe"].value) == ("current", "delayed")
    same = ("zero", "grads", "weights", "overlap_grad_reduce", "overlap_param_gather", "cross_entropy", "fp8_params",
            "recompute_early_stop", "attention")
    assert all(bridge.applies[k].value == nemo.applies[k].value for k in same)
    # both tuned stacks (ddplan.fp8.FP8_TUNED_STACKS): Bridge prices as NeMo told to scale currently, and apart from
    # NeMo's delayed scaling by the recipes' casts only
    rows = csv_rows(run_ok(capsys, ["table", *LLAMA, "--framework", "megatron-bridge", "--fp8"]))
    current = csv_rows(run_ok(capsys, ["table", *LLAMA, "--framework", "nemo", "--fp8", "--fp8-recipe", "current"]))
    delayed = csv_rows(run_ok(capsys, ["table", *LLAMA, "--framework", "nemo", "--fp8"]))
    assert [r["step_s"] for r in rows] == [r["step_s"] for r in current] != [r["step_s"] for r in delayed]


def test_what_a_stack_cannot_run_is_refused_or_not_searched(capsys):
    """nanochat has no tensor, pipeline, context or expert parallelism (nanochat/common.py@92d63d4: DDP only);
    torchtitan refuses tied embeddings under a pipeline (models/common/decoder.py@b5bcd76 L168-171). `table` and
    `memory` refuse such a layout in one line naming the flag (exit 2); `plan` does not search it and says why, per
    family; `memory`'s fixes propose none of it. A stack that lacks nothing searches as before."""
    nano, titan = load_framework("nanochat"), load_framework("torchtitan")
    assert nano.lacked(tp=2) == ["tp"] and nano.lacked(pp=4, cp=2) == ["pp", "cp"] and nano.lacked() == []
    olmo = load_framework("olmo-core")
    assert olmo.lacked(tp=2, ep=4) == ["tp_with_ep"] and olmo.lacked(ep=4) == []
    assert titan.lacked(pp=2, tied=True) == ["tied_embeddings_with_pp"] and titan.lacked(pp=2) == []
    d24 = ["-m", "d24", "--hardware", "h100-sxm", "--gpus", "8", "--framework", "nanochat"]
    for argv, flag in ((["table", *d24, "--pp", "2"], "--pp"), (["memory", *d24, "--tp", "2"], "--tp"),
                       (["table", "-m", "gpt2", "--hardware", "h100-sxm", "--gpus", "8", "--pp", "2",
                         "--framework", "torchtitan"], "--pp")):
        code, err = fails(capsys, argv)
        assert code == 2 and len(err.strip().splitlines()) == 1 and f"{flag}:" in err, err
    assert "has no pipeline parallelism (nanochat/common.py@92d63d4" in fails(capsys, ["table", *d24, "--pp", "2"])[1]
    # a measured run's layout and a plan's asked degrees are checked too; OLMo-core refuses tied embeddings under a
    # pipeline (train_module/transformer/config.py@fa6c501 L98-103) and TP with EP (common.py@fa6c501 L74-76)
    q30 = ["-m", "qwen3-30b-a3b", "--hardware", "h100-sxm", "--gpus", "16", "--framework", "olmo-core"]
    for argv, flag in ((["table", *d24, "--measured-step-time", "4", "--measured-pp", "2"], "--pp"),
                       (["plan", *d24, "--cp", "2"], "--cp"),
                       (["table", "-m", "gpt2-1.5b", "--hardware", "h100-sxm", "--gpus", "8", "--pp", "2",
                         "--framework", "olmo-core"], "--pp"),
                       (["table", *q30, "--tp", "2", "--ep", "4"], "--ep")):
        code, err = fails(capsys, argv)
        assert code == 2 and f"{flag}:" in err and len(err.strip().splitlines()) == 1, err
    q30_rows = csv_rows(run_ok(capsys, ["plan", *q30, "--format", "csv"]))
    assert q30_rows and not any(r["tp"] != "1" and r["ep"] != "1" for r in q30_rows)
    assert any(r["ep"] != "1" for r in q30_rows) and any(r["tp"] != "1" for r in q30_rows)
    rows = csv_rows(run_ok(capsys, ["plan", *d24, "--format", "csv"]))
    assert rows and all(r["tp"] == r["pp"] == r["cp"] == "1" for r in rows)
    code, out, err = run(capsys, ["plan", *d24])
    text = " ".join((out + err).split())
    assert "+TP: not searched, as nanochat has no tensor parallelism." in text
    assert "plan leaves out what nanochat (@92d63d4) cannot run: tensor parallelism" in text
    # d64 at device batch 2 on 8 H100 fits only with pp 4 or ZeRO-3, neither of which nanochat runs (it shards the
    # optimizer state alone, nanochat/optim.py@92d63d4): under nanochat no fix, and memory says so
    d64 = ["memory", "-m", "d64", "--hardware", "h100-sxm", "--gpus", "8", "--device-batch-size", "2"]
    said = {fw: run(capsys, [*d64, *fw])[1] for fw in ((), ("--framework", "nanochat"))}
    fixes = {fw: [x for x in out.splitlines() if x.startswith("Fastest")] for fw, out in said.items()}
    assert any("pp 4" in x for x in fixes[()])
    assert fixes["--framework", "nanochat"] == []
    assert "Nothing fits on these 8 GPUs (micro-batch and attention tried together)" in said["--framework", "nanochat"]
    from ddplan.verdicts import FIXES_TRIED, fixes_tried
    assert fixes_tried(frozenset(), None) == FIXES_TRIED
    assert fixes_tried(frozenset({"pp", "zero1", "zero2"}), ("none", "per-op", "full")) == (
        "micro-batch, recompute, ZeRO stage, attention and TP inside a node")
    assert any(r["pp"] != "1" for r in csv_rows(run_ok(capsys, ["plan", "-m", "llama-3-8b", "--hardware",
                                                              "h100-sxm", "--gpus", "16", "--format", "csv"])))
