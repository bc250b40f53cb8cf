"""The run configuration (ddplan/runconfig.py): `table`, `memory` and `plan --config FILE` price what the flags
price, a flag given wins over the file's field, `--print-config` writes a command line as a file that prices the
same, and every field is one flag of a command (and every pricing flag a field)."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
import yaml

from cli_helpers import fails, run_ok

from ddplan import cli, runconfig

ROOT = Path(__file__).resolve().parent.parent
SEED = ROOT / "examples" / "seed-d24-mi300x.yaml"
# docs/reference.md, "Reproducing the MI300X note"
SEED_FLAGS = ["--model", "d24", "--gpus", "1,8", "--total-batch-size", "524288", "--device-batch-size", "32",
              "--steps", "29000", "--price", "2", "--measured-step-time", "7.7", "--measured-window", "L",
              "--window", "L,SSSL", "--eval-every", "0", "--startup-min", "0"]
# flags that say how to show the result, not what run is priced
NOT_RUN = {"config", "print_config", "format", "wide", "plot", "quiet", "explain"}


def test_the_seed_file_prices_the_readme_command(capsys):
    by_file = run_ok(capsys, ["table", "--config", str(SEED), "--format", "csv"])
    by_flags = run_ok(capsys, ["table", *SEED_FLAGS, "--format", "csv"])
    assert by_file == by_flags
    measured = [line for line in by_file.splitlines() if ",measured," in line]
    assert len(measured) == 1 and '"1x mi300x, sdpa-fused, L"' in measured[0] and ",7.7," in measured[0]


def test_a_flag_wins_over_the_file(capsys):
    import csv
    import io

    from cli_helpers import data_lines

    out = run_ok(capsys, ["table", "--config", str(SEED), "--gpus", "1,8,64", "--window", "L", "--format", "csv"])
    rows = list(csv.DictReader(io.StringIO(data_lines(out))))
    assert {r["gpus"] for r in rows} == {"1", "8", "64"} and {r["window"] for r in rows} == {"L"}


@pytest.mark.parametrize("argv", [
    ["table", *SEED_FLAGS],
    ["table", "-m", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8,16", "--tp", "1,2", "--zero", "1,3",
     "--recompute", "none,selective", "--seq-len", "4096", "--sequence-parallel", "--fp8", "--tokens", "1e9"],
    ["memory", "-m", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--zero", "0,1,2,3", "--window", "L",
     "--measured-peak", "60"],
    ["plan", "-m", "d26", "--hardware", "mi300x,h100-sxm", "--gpus", "8-16", "--budget", "500", "--objective", "cost",
     "--top", "3"],
    ["table", "-m", "d24", "--gpus", "1,8-16", "--zero", "1", "--device-batch-size", "16"],
], ids=["seed", "llama-table", "memory", "plan", "ranges"])
def test_print_config_writes_a_file_that_prices_the_same(capsys, tmp_path, argv):
    text = run_ok(capsys, [*argv, "--print-config"])
    config = runconfig.RunConfig.model_validate(yaml.safe_load(text))  # a valid run file
    assert config.kind == "run"
    path = tmp_path / "run.yaml"
    path.write_text(text, encoding="utf-8")
    by_file = run_ok(capsys, [argv[0], "--config", str(path), "--format", "csv"])
    by_flags = run_ok(capsys, [*argv, "--format", "csv"])
    assert by_file == by_flags
    # and the file of the file is the file
    assert run_ok(capsys, [argv[0], "--config", str(path), "--print-config"]) == text


def test_a_list_for_a_single_value_flag_is_said_unless_the_flag_is_given(capsys):
    _, err = fails(capsys, ["memory", "--config", str(SEED)])
    assert "gpus: `ddplan memory` prices one value; the file lists 2: [1, 8]" in err and "--gpus" in err
    _, err = fails(capsys, ["memory", "--config", str(SEED), "--gpus", "8"])
    assert "window" in err  # the next list: window [L, SSSL]
    run_ok(capsys, ["memory", "--config", str(SEED), "--gpus", "8", "--window", "L"])


@pytest.mark.parametrize("text, words", [
    ("kind: run\nmodel: d24\nlayout: {tpp: 2}\n", "layout.tpp: unknown key; did you mean 'tp'?"),
    ("kind: run\nbudget: {steps: 10, tokens: 1e9}\n", "at most one of steps, tokens, param_data_ratio"),
    ("kind: run\ngpus: true\n", "gpus: must be a number, got true (a true/false value)"),
    ("kind: run\ngpus: 0\n", "gpus: Input should be greater than or equal to 1 (got 0)"),
    ("kind: run\nrecompute: sometimes\n", "recompute: 'sometimes' is not a recompute policy; allowed: none, selective"),
    ("kind: run\nlayout: {zero: 5}\n", "layout.zero: Input should be 0, 1, 2 or 3 (got 5)"),
    ("kind: run\nmeasured: {fit: bogus}\n", "measured.fit: Input should be 'auto', 'gemm', 'attention' or"),
    ("kind: run\nheadroom: 1.5\n", "headroom"),
    ("kind: model\nname: x\n", "this is a model file (kind: model), where a run spec (kind: run) is expected"),
])
def test_a_bad_run_file_is_one_line(capsys, tmp_path, text, words):
    path = tmp_path / "run.yaml"
    path.write_text(text, encoding="utf-8")
    code, err = fails(capsys, ["table", "--config", str(path)])
    assert code == 1 and err.startswith(f"error: {path}: ") and words in err


def test_a_missing_run_file_is_one_line(capsys, tmp_path):
    _, err = fails(capsys, ["plan", "--config", str(tmp_path / "nope.yaml")])
    assert err.startswith("error: --config: no such file")


def test_every_field_is_a_flag_and_every_pricing_flag_a_field():
    """Adding a field adds its flag (FLAGS), and a new flag of table, memory or plan needs its field."""
    group = typer.main.get_command(cli.app)
    params = {name: {p.name for p in group.commands[name].params} for name in ("table", "memory", "plan")}
    every = set().union(*params.values())
    assert set(runconfig.FLAGS) == set(runconfig.field_paths())  # every leaf of the schema has its flag
    assert not [name for name in runconfig.FLAGS.values() if name not in every]  # and the flag exists
    for command, names in params.items():
        assert names - NOT_RUN - set(runconfig.FLAGS.values()) == set(), command
        assert runconfig.LIST_PARAMS[command] <= names


def test_a_relative_path_in_a_run_file_is_read_from_the_file_s_folder(capsys, tmp_path, monkeypatch):
    """model: my-model.yaml beside the run file prices from any working folder; a built-in name stays a name."""
    import shutil

    from ddplan.registry import builtin_dir

    (tmp_path / "runs").mkdir()
    shutil.copy(builtin_dir("models") / "gpt2-124m.yaml", tmp_path / "runs" / "my-model.yaml")
    run_file = tmp_path / "runs" / "run.yaml"
    run_file.write_text("kind: run\nmodel: my-model.yaml\nhardware: h100-sxm\ngpus: [8]\n", encoding="utf-8")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    by_file = run_ok(capsys, ["table", "--config", str(run_file), "--format", "csv"])
    by_flags = run_ok(capsys, ["table", "--model", str(tmp_path / "runs" / "my-model.yaml"), "--hardware", "h100-sxm",
                               "--gpus", "8", "--format", "csv"])
    assert by_file == by_flags and "gpt2-124m" in by_file


def test_the_title_says_the_batch_came_from_the_run_file(capsys):
    """Where the priced batch comes from: the file's field, or the flag when one is given with the file."""
    by_file = run_ok(capsys, ["table", "--config", str(SEED), "--format", "markdown"])
    assert "524,288 tokens, the run file's batch.total_tokens, the measured step's" in by_file
    by_flag = run_ok(capsys, ["table", "--config", str(SEED), "--total-batch-size", "524288", "--format", "markdown"])
    assert "524,288 tokens, --total-batch-size, the measured step's" in by_flag


PLAN = ["plan", "-m", "d20", "--hardware", "h100-sxm", "--gpus", "8", "--startup-min", "0", "--eval-every", "0",
        "--interruptions-per-gpu-hour", "0", "--format", "csv"]


def test_plan_reads_the_training_budget_and_the_time_outside_steps(capsys, tmp_path):
    """1,000 more steps add 1,000 x step_s to each layout's wall-clock (nothing else outside the steps changes:
    no evaluation, no interruptions, one checkpoint at the end either way), and a run file's budget.steps and
    outside fields price as their flags do (plan read neither before: it priced the recipe's budget)."""
    from cli_helpers import csv_rows, f

    layout = ("tp", "pp", "cp", "ep", "zero", "micro_batch", "attention", "recompute", "schedule")
    one = {tuple(r[k] for k in layout): r for r in csv_rows(run_ok(capsys, [*PLAN, "--steps", "1000"]))}
    two = {tuple(r[k] for k in layout): r for r in csv_rows(run_ok(capsys, [*PLAN, "--steps", "2000"]))}
    assert one.keys() == two.keys() and one
    for key, row in one.items():
        extra_h = f(two[key], "wall_clock_h") - f(row, "wall_clock_h")
        assert extra_h == pytest.approx(1000 * f(row, "step_s") / 3600, rel=1e-6)
    path = tmp_path / "run.yaml"
    path.write_text("kind: run\nmodel: d20\nhardware: h100-sxm\ngpus: [8]\nbudget: {steps: 2000}\n"
                    "outside: {startup_min: 0, eval_every: 0, interruptions_per_gpu_hour: 0}\n", encoding="utf-8")
    assert run_ok(capsys, ["plan", "--config", str(path), "--format", "csv"]) == run_ok(
        capsys, [*PLAN, "--steps", "2000"])


def test_plan_searches_among_the_recompute_zero_and_attention_it_is_given(capsys):
    from cli_helpers import csv_rows

    rows = csv_rows(run_ok(capsys, [*PLAN, "--recompute", "selective,none", "--zero", "3",
                                    "--attention", "sdpa-fused"]))
    assert rows and {r["recompute"] for r in rows} <= {"none", "selective"}
    # one data-parallel rank has nothing to shard: it keeps the model's own setup (d20: ZeRO-1)
    assert {r["zero"] for r in rows if r["dp"] != "1"} == {"3"} and {r["attention"] for r in rows} == {"sdpa-fused"}
    _, err = fails(capsys, [*PLAN, "--attention", "nope"])
    assert "--attention: 'nope' is not available on h100-sxm; allowed: " in err
    _, err = fails(capsys, [*PLAN, "--zero", "4"])
    assert "--zero" in err


def test_a_field_the_command_cannot_read_is_named(capsys, tmp_path):
    """plan searches the layout: the run file's tp and micro-batch are not read, and it says so (once silent)."""
    path = tmp_path / "run.yaml"
    path.write_text("kind: run\nmodel: d20\nhardware: h100-sxm\ngpus: [8]\nlayout: {tp: 2}\nbatch: {device: 4}\n",
                    encoding="utf-8")
    code = cli.main(["plan", "--config", str(path), "--format", "csv"])
    err = capsys.readouterr().err
    assert code == 0
    assert (f"warning: {path}: `ddplan plan` has no flag for layout.tp, batch.device, so it does not read them"
            in err.splitlines())
    code = cli.main(["table", "--config", str(path), "--format", "csv"])
    assert code == 0 and "no flag for" not in capsys.readouterr().err


def test_each_run_option_is_declared_once():
    """Issue 34: a run field's flag, help, default and range live in ddplan.runfields only; cli.py names the
    parameters each planning command reads and declares none of their flags itself (calibrate, validate, specs
    and import have options of their own)."""
    import ast

    from ddplan import runfields

    tree = ast.parse((ROOT / "ddplan" / "cli.py").read_text(encoding="utf-8"))
    own = {"calibrate_cmd", "validate_cmd", "specs_show", "specs_import", "specs_list", "import_cmd", "_app"}
    mine = [arg.value for top in tree.body if getattr(top, "name", None) not in own for call in ast.walk(top)
            if isinstance(call, ast.Call) and getattr(call.func, "attr", "") == "Option" for arg in call.args
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("-")]
    assert "--plot" in mine and "--format" in mine  # the test sees the output options' declarations
    run_flags = {flag for f in runfields.FIELDS for decl in f.decls for flag in decl.split("/")}
    assert [d for d in mine if d in run_flags] == []
    assert len(mine) == len(set(mine))  # an output option once too
    assert len({f.param for f in runfields.FIELDS}) == len(runfields.FIELDS)
    assert len({f.flag for f in runfields.FIELDS}) == len(runfields.FIELDS)


@pytest.mark.parametrize("f", [f for f in __import__("ddplan.runfields").runfields.FIELDS if f.range is not None],
                         ids=lambda f: f.flag)
def test_the_file_and_the_flag_refuse_the_same_values(capsys, tmp_path, f):
    """One range per field: a value just past either end is refused by the run file's schema and by the flag
    (one line naming the field or the flag), and the end itself is taken where the range is closed."""
    from pydantic import ValidationError

    r = f.range
    for value, ok in ((r.low, not r.low_open), (r.high, not r.high_open),
                      (r.low - (1 if f.kind is int else 1e-9 * max(1, abs(r.low))), False),
                      (r.high + (1 if f.kind is int else 1e-9 * r.high), False)):
        value = int(value) if f.kind is int else float(value)
        node: dict = {"kind": "run"}
        leaf = node
        for part in f.path[:-1]:
            leaf = leaf.setdefault(part, {})
        leaf[f.path[-1]] = value
        if ok:
            runconfig.RunConfig.model_validate(node)
            continue
        with pytest.raises(ValidationError):
            runconfig.RunConfig.model_validate(node)
        # a command that takes one value (a list flag checks its items where ddplan.inputs.int_list parses them)
        command = next(c for c in ("table", "memory", "plan") if c in _commands_of(f) and c not in f.many)
        _, err = fails(capsys, [command, "--model", "d24", f.flag, str(value)])
        assert err.startswith(f"error: {f.flag}: must be a finite number in"), err


def _commands_of(f) -> set[str]:
    group = typer.main.get_command(cli.app)
    return {c for c in ("table", "memory", "plan") if f.param in {p.name for p in group.commands[c].params}}


def test_a_kernel_flag_offers_exactly_the_values_the_spec_takes():
    """runfields keeps its own tuples (it stays free of pydantic for a fast --help): each kernel field's choices are
    the Recipe Literal's (ddplan.specs.KERNELS), so a value one accepts the other cannot refuse."""
    from ddplan.runfields import BY_PARAM
    from ddplan.specs import KERNELS

    for name, values in KERNELS.items():
        assert BY_PARAM[name].kind == values, name
