"""Every error path of the CLI: one line on stderr, `error: <file>: <field>: <what>`, exit 1 (ddplan
errors) or 2 (usage), no traceback unless DDPLAN_DEBUG=1.

Run in-process through `ddplan.cli.main(argv)` (it returns the exit code), and once through a real
subprocess to check what the shell sees.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ddplan import cli, registry, specfile
from ddplan.errors import DdplanError, LayoutError, SpecError, UsageError

MODELS = registry.builtin_dir("models")


def _hardware_files() -> list[Path]:
    try:
        return sorted(registry.builtin_dir("hardware").glob("*.yaml"))
    except SpecError:
        return []


def run(capsys, *argv: str) -> tuple[int, str, str]:
    """Run the CLI in-process; return (exit code, stdout, stderr)."""
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str) -> str:
    """The stderr of a failed command: exactly one line, starting `error: `, no traceback."""
    assert "Traceback" not in err
    assert err.endswith("\n") and err.count("\n") == 1, f"not one line: {err!r}"
    assert err.startswith("error: "), err
    assert err.strip() != "error:", "empty error message"
    return err.rstrip("\n")


def fails(capsys, *argv: str, code: int = 1) -> str:
    """Run, expect the exit code and nothing on stdout; return the one error line."""
    got, out, err = run(capsys, *argv)
    assert got == code, (got, err)
    assert out == ""
    return one_error_line(err)


def gpt2_yaml() -> str:
    return (MODELS / "gpt2-124m.yaml").read_text(encoding="utf-8")


# --------------------------------------------------------------------------------------------
# errors.py itself


def test_one_line_collapses_newlines_and_names_file_and_field():
    e = SpecError("bad value\n  more detail", file="x.yaml", field="memory.usable_gib")
    assert e.one_line() == "error: x.yaml: memory.usable_gib: bad value more detail"
    assert SpecError("plain").one_line() == "error: plain"


def test_exit_codes_by_class():
    assert issubclass(SpecError, DdplanError) and issubclass(LayoutError, DdplanError)
    assert SpecError("x").exit_code == 1
    assert LayoutError("x").exit_code == 1
    assert UsageError("x").exit_code == 2


# --------------------------------------------------------------------------------------------
# unknown names


@pytest.mark.parametrize("name, expected", [("d24x", "d24"), ("gtp2", "gpt2")])
def test_unknown_model_name_suggests_closest(capsys, name, expected):
    line = fails(capsys, "specs", "show", name)
    assert repr(name) in line
    hint = line.split("did you mean", 1)[1].split("?", 1)[0]
    assert expected in hint.replace(",", " ").split()
    assert "ddplan specs list" in line


def test_registry_unknown_model_names_flag_and_builtins():
    with pytest.raises(SpecError) as e:
        registry.load_model("gtp2")
    line = e.value.one_line()
    assert "--model" in line and "gpt2" in line and "gpt2-124m" in line


def test_unknown_name_without_any_close_match(capsys):
    line = fails(capsys, "specs", "show", "zzzzzzzz")
    assert "'zzzzzzzz'" in line and "did you mean" not in line


def test_hardware_alias_resolves(capsys):
    names = {p.stem for p in _hardware_files()}
    if "mi300x" not in names:
        pytest.skip(f"no built-in hardware/mi300x.yaml yet (hardware: {sorted(names) or 'none'})")
    code_alias, out_alias, err_alias = run(capsys, "specs", "show", "mi300")
    code_name, out_name, _ = run(capsys, "specs", "show", "mi300x")
    assert (code_alias, code_name) == (0, 0), err_alias
    assert out_alias == out_name
    assert "name: mi300x" in out_alias


def test_unknown_hardware_name_suggests_closest(capsys):
    if "mi300x" not in {p.stem for p in _hardware_files()}:
        pytest.skip("no built-in hardware/mi300x.yaml yet")
    line = fails(capsys, "specs", "show", "mi30x")
    assert "'mi30x'" in line
    assert "mi300x" in line.split("did you mean", 1)[1]


def test_registry_unknown_hardware_names_flag(capsys):
    if not _hardware_files():
        pytest.skip("no built-in hardware specs yet")
    with pytest.raises(SpecError) as e:
        registry.load_hardware("no-such-gpu")
    line = e.value.one_line()
    assert "--hardware" in line and "'no-such-gpu'" in line and "built-ins:" in line


# --------------------------------------------------------------------------------------------
# user YAML files


def test_yaml_syntax_error_names_file_and_line(capsys, tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("kind: model\nname: x\ndescription: a: b\n", encoding="utf-8")  # line 3: `a: b`
    line = fails(capsys, "specs", "show", str(path))
    assert line.startswith(f"error: {path}: line 3, column ")
    assert "YAML syntax error" in line


def test_yaml_tab_indentation_names_line(capsys, tmp_path):
    path = tmp_path / "tabs.yaml"
    path.write_text("kind: model\nname: x\n\tfoo: 1\n", encoding="utf-8")
    line = fails(capsys, "specs", "show", str(path))
    assert f"{path}: line 3," in line


def test_misspelled_key_names_file_field_allowed_keys_and_suggestion(capsys, tmp_path):
    path = tmp_path / "typo.yaml"
    text = gpt2_yaml()
    assert "\n  num_layers: 12\n" in text
    path.write_text(text.replace("\n  num_layers: 12\n", "\n  num_layer: 12\n"), encoding="utf-8")
    line = fails(capsys, "specs", "show", str(path))
    assert line.startswith(f"error: {path}: architecture.num_layer: unknown key")
    assert "did you mean 'num_layers'?" in line
    allowed = line.split("allowed keys:", 1)[1]
    assert {"num_layers", "d_model", "vocab_size", "mlp"} <= {k.strip() for k in allowed.split(",")}


def test_unknown_top_level_key(capsys, tmp_path):
    path = tmp_path / "extra.yaml"
    path.write_text(gpt2_yaml() + "colour: blue\n", encoding="utf-8")
    line = fails(capsys, "specs", "show", str(path))
    assert f"{path}: colour: unknown key" in line
    assert "architecture" in line.split("allowed keys:", 1)[1]


def test_missing_field_names_the_field(capsys, tmp_path):
    path = tmp_path / "missing.yaml"
    lines = gpt2_yaml().splitlines(keepends=True)
    kept = [ln for ln in lines if not ln.startswith("  vocab_size:")]
    assert len(kept) == len(lines) - 1
    path.write_text("".join(kept), encoding="utf-8")
    line = fails(capsys, "specs", "show", str(path))
    assert line == f"error: {path}: architecture.vocab_size: missing required field"


def test_wrong_enum_value_lists_allowed_values(capsys, tmp_path):
    path = tmp_path / "enum.yaml"
    path.write_text(gpt2_yaml().replace("\n  mlp: gelu\n", "\n  mlp: relu3\n"), encoding="utf-8")
    line = fails(capsys, "specs", "show", str(path))
    assert line.startswith(f"error: {path}: architecture.mlp: ")
    for allowed in ("'relu2'", "'gelu'", "'swiglu'"):
        assert allowed in line
    assert "relu3" in line


def test_model_level_check_is_one_line(capsys, tmp_path):
    """A cross-field check (seq_len over the context) has no single field; the message names both."""
    path = tmp_path / "long.yaml"
    path.write_text(gpt2_yaml().replace("\n  seq_len: 1024\n", "\n  seq_len: 4096\n"), encoding="utf-8")
    line = fails(capsys, "specs", "show", str(path))
    assert line.startswith(f"error: {path}: ")
    assert "recipe.seq_len 4096" in line and "max_seq_len 1024" in line


def test_nested_validator_names_its_path(capsys, tmp_path):
    path = tmp_path / "budget.yaml"
    path.write_text(gpt2_yaml().replace("\n    steps: 600000\n", "\n    steps: 600000\n    tokens: 1000\n"),
                    encoding="utf-8")
    line = fails(capsys, "specs", "show", str(path))
    assert line.startswith(f"error: {path}: recipe.budget: give exactly one of")


def test_negative_bandwidth_in_hardware_yaml(capsys, tmp_path):
    files = _hardware_files()
    if not files:
        pytest.skip("no built-in hardware specs yet")
    src = next((p for p in files if p.stem == "mi300x"), files[0])
    data = yaml.safe_load(src.read_text(encoding="utf-8"))
    data["memory"]["hbm_tbyte_per_s"]["value"] = -5
    path = tmp_path / "neg.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    line = fails(capsys, "specs", "show", str(path))
    assert line.startswith(f"error: {path}: memory.hbm_tbyte_per_s.value: ")
    assert "greater than 0" in line and "-5" in line


def test_misspelled_key_inside_lists_and_dicts_of_a_hardware_yaml(capsys, tmp_path):
    """Allowed keys are found through list items (prices[0]) and dict values (busbw per group size)."""
    files = _hardware_files()
    if not files:
        pytest.skip("no built-in hardware specs yet")
    data = yaml.safe_load(files[0].read_text(encoding="utf-8"))
    price = data["prices"][0]
    price["usd_per_gpu_hr"] = price.pop("usd_per_gpu_hour")
    path = tmp_path / "price.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    line = fails(capsys, "specs", "show", str(path))
    assert line.startswith(f"error: {path}: prices.0.usd_per_gpu_hr: unknown key; did you mean 'usd_per_gpu_hour'?")
    assert "billing" in line.split("allowed keys:", 1)[1]

    data = yaml.safe_load(files[0].read_text(encoding="utf-8"))
    points = data["intra_node"]["busbw_gbyte_per_s"]["all_reduce"]
    group = next(iter(points))
    points[group]["valu"] = points[group].pop("value")
    path = tmp_path / "busbw.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    line = fails(capsys, "specs", "show", str(path))
    assert line == (f"error: {path}: intra_node.busbw_gbyte_per_s.all_reduce.{group}.valu: unknown key; "
                    f"did you mean 'value'? allowed keys: value, source")


def test_file_that_does_not_exist(capsys, tmp_path):
    path = tmp_path / "nope.yaml"
    line = fails(capsys, "specs", "show", str(path))
    assert line == f"error: {path}: no such file"


def test_registry_missing_file_names_flag(tmp_path):
    with pytest.raises(SpecError) as e:
        registry.load_model(str(tmp_path / "nope.yaml"))
    assert "--model" in e.value.one_line() and "nope.yaml" in e.value.one_line()


@pytest.mark.parametrize("text", ["", "- 1\n- 2\n", "kind: optimizer\nname: x\n"])
def test_yaml_without_a_known_kind(capsys, tmp_path, text):
    path = tmp_path / "what.yaml"
    path.write_text(text, encoding="utf-8")
    line = fails(capsys, "specs", "show", str(path))
    assert line.startswith(f"error: {path}: kind: need `kind: hardware`, `kind: model` or `kind: framework`")


# --------------------------------------------------------------------------------------------
# usage errors (exit 2)


def test_unknown_flag(capsys):
    line = fails(capsys, "specs", "show", "d24", "--frmat", "json", code=2)
    assert "--frmat" in line
    assert "--format" in line  # click's suggestion


def test_bad_format_value(capsys):
    line = fails(capsys, "specs", "show", "d24", "--format", "xml", code=2)
    assert "--format" in line and "'xml'" in line
    assert "text" in line and "json" in line


def test_missing_argument(capsys):
    line = fails(capsys, "specs", "show", code=2)
    assert "Missing argument" in line


def test_unknown_command(capsys):
    line = fails(capsys, "frobnicate", code=2)
    assert "frobnicate" in line


@pytest.mark.parametrize("argv", [[], ["specs"]], ids=["ddplan", "ddplan-specs"])
def test_bare_command_shows_help_without_an_empty_error(capsys, argv):
    code, out, err = run(capsys, *argv)
    assert "Usage" in out
    assert err.strip() != "error:"


# --------------------------------------------------------------------------------------------
# internal errors, DDPLAN_DEBUG


def _raise_in_describe(monkeypatch, exc: Exception) -> None:
    import ddplan.describe

    def boom(name):
        raise exc

    monkeypatch.setattr(ddplan.describe, "describe", boom)


def test_internal_error_is_one_line(capsys, monkeypatch):
    _raise_in_describe(monkeypatch, RuntimeError("something broke"))
    line = fails(capsys, "specs", "show", "d24")
    assert line == "error: internal error: RuntimeError: something broke (set DDPLAN_DEBUG=1 for the traceback)"


def test_internal_error_with_newlines_is_one_line(capsys, monkeypatch):
    _raise_in_describe(monkeypatch, RuntimeError("something\nbroke"))
    fails(capsys, "specs", "show", "d24")


def test_debug_lets_the_exception_propagate(monkeypatch, tmp_path):
    monkeypatch.setenv("DDPLAN_DEBUG", "1")
    with pytest.raises(SpecError):
        cli.main(["specs", "show", "d24x"])
    path = tmp_path / "enum.yaml"
    path.write_text(gpt2_yaml().replace("\n  mlp: gelu\n", "\n  mlp: relu3\n"), encoding="utf-8")
    with pytest.raises(SpecError, match="relu2"):
        cli.main(["specs", "show", str(path)])


def test_debug_other_than_1_does_not_propagate(capsys, monkeypatch):
    monkeypatch.setenv("DDPLAN_DEBUG", "0")
    fails(capsys, "specs", "show", "d24x")


# --------------------------------------------------------------------------------------------
# the real process


def _subprocess(*argv: str, env_debug: bool = False) -> subprocess.CompletedProcess:
    import os

    env = {k: v for k, v in os.environ.items() if k != "DDPLAN_DEBUG"}
    if env_debug:
        env["DDPLAN_DEBUG"] = "1"
    return subprocess.run([sys.executable, "-m", "ddplan.cli", *argv], capture_output=True, text=True,
                          env=env, timeout=60)


def test_subprocess_exit_codes_and_one_line():
    spec = _subprocess("specs", "show", "gtp2")
    assert spec.returncode == 1 and spec.stdout == ""
    assert "gpt2" in one_error_line(spec.stderr)

    usage = _subprocess("specs", "show", "d24", "--frmat", "json")
    assert usage.returncode == 2 and usage.stdout == ""
    assert "--frmat" in one_error_line(usage.stderr)

    ok = _subprocess("specs", "show", "d24", "--format", "json")
    assert ok.returncode == 0 and ok.stderr == ""


def test_subprocess_debug_prints_the_traceback():
    debug = _subprocess("specs", "show", "gtp2", env_debug=True)
    assert debug.returncode == 1
    assert "Traceback" in debug.stderr and "SpecError" in debug.stderr


@pytest.mark.parametrize("flag, path, expected", [
    ("--hardware", "models/gpt2-124m.yaml", "this is a model file (kind: model), where a hardware spec"),
    ("--model", "hardware/h100-sxm.yaml", "this is a hardware file (kind: hardware), where a model spec"),
])
def test_a_spec_of_the_wrong_kind_says_so_first(capsys, flag, path, expected):
    """A model YAML given as --hardware is named for what it is, not reported as its first unknown key."""
    root = Path(__file__).resolve().parents[1]
    argv = ["table", "--gpus", "8", *(["--model", "d24"] if flag == "--hardware" else []), flag, str(root / path)]
    code, _, err = run(capsys, *argv)
    line = one_error_line(err)
    assert code == 1 and f"{path}: kind: {expected}" in line, line


def test_a_mistyped_kind_is_not_called_another_kind(tmp_path, capsys):
    spec = yaml.safe_load((Path(__file__).resolve().parents[1] / "hardware" / "h100-sxm.yaml").read_text())
    spec["kind"] = "hardwre"
    path = tmp_path / "hw.yaml"
    path.write_text(yaml.safe_dump(spec))
    code, _, err = run(capsys, "table", "--model", "d24", "--hardware", str(path))
    line = one_error_line(err)
    assert code == 1 and "kind:" in line and "'hardware'" in line and "this is a hardwre file" not in line, line


def test_an_unknown_key_without_a_close_match_still_reads(tmp_path, capsys):
    spec = yaml.safe_load((Path(__file__).resolve().parents[1] / "hardware" / "h100-sxm.yaml").read_text())
    spec["zzzzzzzz"] = 1
    path = tmp_path / "hw.yaml"
    path.write_text(yaml.safe_dump(spec))
    code, _, err = run(capsys, "table", "--model", "d24", "--hardware", str(path))
    assert code == 1 and "zzzzzzzz: unknown key; allowed keys: kind, name" in one_error_line(err)


def test_specs_import_of_a_missing_config_names_the_argument(tmp_path, capsys):
    code, _, err = run(capsys, "specs", "import", str(tmp_path / "missing.json"), "-o", str(tmp_path / "m.yaml"))
    line = one_error_line(err)
    assert code == 2 and line.startswith("error: CONFIG: no such file") and "--model" not in line
    assert not (tmp_path / "m.yaml").exists()


def test_a_validation_error_from_values_built_here_reads_without_pydantic_wording(capsys, monkeypatch):
    """A pydantic error from a value ddplan builds (not a file) is one line, without 'Value error, '."""
    from pydantic import BaseModel, field_validator

    class Sized(BaseModel):
        n: int

        @field_validator("n")
        @classmethod
        def positive(cls, v):
            raise ValueError("must be positive")

    def fail(*_a, **_k):
        Sized(n=-1)

    from ddplan import inputs

    monkeypatch.setattr(inputs, "load_model", fail)  # where the command calls it
    code, _, err = run(capsys, "table", "--model", "d24")
    line = one_error_line(err)
    assert code == 2 and line == "error: n: must be positive", line


# --------------------------------------------------------------------------------------------
# the YAML loaders: PyYAML's C parser where it has one, the pure-Python one elsewhere, the same checks


SHIPPED_YAML = sorted(p for kind in ("hardware", "models", "validation", "frameworks")
                      for p in (Path(__file__).parent.parent / kind).glob("*.yaml"))


@pytest.mark.skipif(not yaml.__with_libyaml__, reason="PyYAML built without libyaml")
def test_specs_load_with_the_c_parser():
    assert issubclass(specfile._UniqueKeyLoader, yaml.CSafeLoader)


@pytest.mark.parametrize("path", SHIPPED_YAML, ids=lambda p: p.name)
def test_both_loaders_read_every_shipped_file_alike(path):
    text = path.read_text(encoding="utf-8")
    assert yaml.load(text, Loader=specfile._UniqueKeyLoader) == yaml.load(text, Loader=specfile._PyUniqueKeyLoader)


@pytest.mark.parametrize("loader", [specfile._UniqueKeyLoader, specfile._PyUniqueKeyLoader])
@pytest.mark.parametrize("text, line", [("a: 1\nb: 2\na: 3\n", "lines 1 and 3"),
                                        ("top:\n  x: 1\n  x: 2\n", "lines 2 and 3")])
def test_both_loaders_refuse_a_duplicate_key(loader, text, line):
    with pytest.raises(yaml.YAMLError, match=f"duplicate key .* on {line}"):
        yaml.load(text, Loader=loader)  # noqa: S506 -- safe loaders
