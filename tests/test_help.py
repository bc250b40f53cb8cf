"""Every command's --help leads with 2-4 examples, and every example runs (exit 0): the examples stay
true. Help reads at 80 columns."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest

from ddplan import cli

DATA = Path(__file__).parent / "data"
LLAMA_CONFIG = {  # meta-llama/Meta-Llama-3-8B config.json (the fields ddplan reads)
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256,
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "hidden_act": "silu", "attention_bias": False,
}


def help_text(capsys, path: tuple[str, ...]) -> str:
    assert cli.main([*path, "--help"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    return out


def examples(text: str) -> list[str]:
    """The lines of the help's 'Examples:' block that run ddplan."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "Examples:")
    block = []
    for line in lines[start + 1:]:
        if not line.strip():
            break
        block.append(line.strip())
    return [line for line in block if line.startswith("ddplan ")]


PATHS = cli.command_paths()


@pytest.mark.parametrize("path", PATHS, ids=[" ".join(p) or "ddplan" for p in PATHS])
def test_help_leads_with_examples(capsys, monkeypatch, path):
    monkeypatch.setenv("COLUMNS", "80")
    text = help_text(capsys, path)
    found = examples(text)
    assert 2 <= len(found) <= 4, found
    first_options = min(text.index(f"\n{head}:\n") for head in ("Options", *cli.PANELS) if f"\n{head}:\n" in text)
    assert text.index("Examples:") < first_options
    too_long = [line for line in text.splitlines() if len(line) > 80]
    assert too_long == []


def all_examples() -> list[tuple[str, str]]:
    import contextlib
    import io

    out = []
    for path in PATHS:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            cli.main([*path, "--help"])
        out += [(" ".join(path) or "ddplan", line) for line in examples(buf.getvalue())]
    return out + [("README", line) for line in readme_commands()]


def readme_commands() -> list[str]:
    """The `ddplan ...` lines of the README's ```bash blocks, continuation lines joined: each runs here as
    the help examples do (issue 38: every command in the README runs in CI)."""
    text = (Path(__file__).parent.parent / "README.md").read_text(encoding="utf-8")
    out = []
    for block in text.split("```bash\n")[1:]:
        joined = block.split("```", 1)[0].replace("\\\n", " ")
        out += [" ".join(line.split()) for line in joined.splitlines() if line.startswith("ddplan ")]
    return out


def _params():
    """Each distinct example once, named by the first help that shows it (the top-level help repeats some
    commands' own examples: the same command line, run once)."""
    seen: set[str] = set()
    for where, line in all_examples():
        if line in seen:
            continue
        seen.add(line)
        marks = []
        if line.startswith("ddplan calibrate") and "--from-log" not in line:
            marks = [pytest.mark.slow, pytest.mark.xdist_group("cpu_calibration")]  # torch on the CPU: shared
        if line == "ddplan validate --leave-one-source-out":  # re-fits without each source (~25 s): shared
            marks = [pytest.mark.slow, pytest.mark.xdist_group("loso")]
        yield pytest.param(line, marks=marks, id=f"{where}: {line}")


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """The files the examples name: a training log, a Hugging Face config, and a calibration file."""
    shutil.copy(DATA / "nanochat_train.log", tmp_path / "train.log")
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_CONFIG), encoding="utf-8")
    # the stacks' own files the import examples name (tests/data/import: torchtitan and Megatron-LM at pinned commits)
    shutil.copy(DATA / "import" / "torchtitan-llama3-8b.toml", tmp_path / "llama3_8b.toml")
    shutil.copy(DATA / "import" / "megatron-gpt3-175b.sh", tmp_path / "train_gpt3_175b_distributed.sh")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("line", list(_params()))
def test_every_example_runs(capsys, workdir, line, request, monkeypatch):
    argv = shlex.split(line)[1:]
    if "--leave-one-source-out" in argv:
        # the re-fits are computed once for the session (conftest.shipped_loso, checked in test_validation);
        # the command gets exactly that result for exactly those arguments, and runs everything else itself
        from ddplan import validation

        runs, where, hardware, held = request.getfixturevalue("shipped_loso")

        def shared(r, w, hw, **kwargs):
            assert (r, w, tuple(hw)) == (runs, where, hardware)
            return held
        monkeypatch.setattr(validation, "leave_one_source_out", shared)
    if "--calibration" in argv:  # made by the calibrate examples; here from the training log, quickly
        assert cli.main(["calibrate", "-m", "d24", "--hardware", "mi300x", "--from-log", "train.log", "--out",
                         "cal.yaml"]) == 0
    if argv[:2] == ["calibrate", "-m"] and "--device" in argv:
        # the measuring runs once for the session (conftest.cpu_calibration, checked in test_calibrate_cli):
        # the example parses its own arguments, plans its shapes and reports; runner.run, given exactly the
        # request these arguments make, answers that calibration (copied to the example's -o)
        from ddplan.calibrate import runner

        path, _, (cal, hw, held_out) = request.getfixturevalue("cpu_calibration")
        expected = {"model": "nanochat-d2", "device": "cpu", "quick": True, "seq_len": 128, "out": "cal.yaml"}

        def shared(req, *args, **kwargs):
            got = {"model": req.model.name, "device": req.device, "quick": req.quick, "seq_len": req.seq_len,
                   "out": str(req.out)}
            assert got == expected, argv
            shutil.copy(path, req.out)
            return cal, hw, held_out
        monkeypatch.setattr(runner, "run", shared)
    if argv[:3] == ["table", "--config", "run.yaml"]:
        assert cli.main(["import", "llama3_8b.toml", "-o", "run.yaml"]) == 0
    if argv[:2] == ["table", "--model"] and argv[2] == "model.yaml":
        assert cli.main(["specs", "import", "config.json", "-o", "model.yaml"]) == 0
    capsys.readouterr()
    code = cli.main(argv)
    out, err = capsys.readouterr()
    assert code == 0, err[-2000:]
    assert out.strip() or "wrote " in err  # specs import and import write a file and say so on stderr


@pytest.mark.parametrize("command", ["table", "memory", "plan"])
def test_options_are_grouped_in_panels(capsys, command):
    """Issue 38: the planning commands' --help lists their options in panels (cli.PANELS), each option in a
    named one (only --help is left to 'Other options'), in PANELS' order."""
    import typer.main

    params = [p.name for p in typer.main.get_command(cli.app).commands[command].params]
    assert [p for p in params if p not in cli.PANEL_OF] == []
    text = help_text(capsys, (command,))
    heads = [t[:-1] for t in text.splitlines() if t.endswith(":") and not t.startswith(" ")]
    panels = [h for h in heads if h in (*cli.PANELS, "Other options")]
    assert panels == [p for p in (*cli.PANELS, "Other options") if p in panels] and len(panels) >= 4
    assert text.split("Other options:")[1].split() == ["--help", "Show", "this", "message", "and", "exit."]
