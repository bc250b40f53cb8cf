"""Startup stays light: `import ddplan.cli`, `ddplan --help` and the `specs` commands import neither
torch, pandas nor matplotlib (STYLE.md, CLI: checked with `python -X importtime`)."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("torch", "pandas", "matplotlib")


def imported_modules(*args: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    """Run `python -X importtime ARGS`; return the process and every module it imported.

    importtime writes one stderr line per import: `import time: <self us> | <cumulative us> | <module>`,
    the module name indented by its nesting depth.
    """
    proc = subprocess.run([sys.executable, "-X", "importtime", *args], capture_output=True, text=True,
                          timeout=120)
    modules = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines()
               if line.startswith("import time:") and line.count("|") == 2}
    modules.discard("imported package")  # the header line
    assert modules, f"no importtime output: {proc.stderr[:500]!r}"
    return proc, modules


def heavy_in(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.split(".", 1)[0] in HEAVY)


def test_import_cli_is_light():
    proc, modules = imported_modules("-c", "import ddplan.cli")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "ddplan.cli" in modules
    assert heavy_in(modules) == []


@pytest.mark.parametrize("argv", [["--help"], ["specs", "--help"], ["specs", "list"],
                                  ["specs", "show", "d24", "--format", "json"], ["specs", "show", "d12"],
                                  ["table", "--model", "d24", "--gpus", "1,8"],
                                  ["plan", "--model", "gpt2-124m", "--hardware", "h100-sxm", "--gpus", "8"]])
def test_cli_commands_are_light(argv):
    proc, modules = imported_modules("-m", "ddplan.cli", *argv)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert heavy_in(modules) == []


def test_help_exits_0_and_lists_commands():
    proc = subprocess.run([sys.executable, "-m", "ddplan.cli", "--help"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0
    assert "specs" in proc.stdout and "Usage" in proc.stdout
    assert proc.stderr == ""


def test_main_help_returns_0(capsys):
    from ddplan import cli

    assert cli.main(["--help"]) == 0
    out, err = capsys.readouterr()
    assert "specs" in out and err == ""


def test_the_check_sees_a_heavy_import():
    """Positive control: the parser does find pandas when it is imported (guards against a silent pass)."""
    pytest.importorskip("pandas")
    _, modules = imported_modules("-c", "import ddplan.cli, pandas")
    assert "pandas" in heavy_in(modules)
