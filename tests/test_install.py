"""A real install: build the wheel, install it into a fresh venv, run `ddplan` from elsewhere and check
that the built-in specs come from the wheel (ddplan/_specs/ in site-packages), not from a checkout.

The venv sees the packages of the interpreter running the tests (a `.pth` file naming its
site-packages), so that the dependencies (typer, pydantic, ...) and pip are already there with no
network, whether the tests run under a system Python or inside a venv (where --system-site-packages
alone would expose the base interpreter's packages, not the venv's).
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

# one worker: the module's wheel and venv are built once, not once per pytest-xdist worker
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("install")]

REPO = Path(__file__).resolve().parent.parent


def sh(*cmd: str | Path, cwd: Path, timeout: int = 60) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "DDPLAN_DEBUG", "VIRTUAL_ENV"}}
    return subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """(venv, wheel): the wheel built from this checkout, installed into a fresh venv."""
    tmp = tmp_path_factory.mktemp("install")
    wheels = tmp / "wheels"
    build = sh(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", wheels, REPO, cwd=tmp, timeout=120)
    if build.returncode != 0:
        if any(s in build.stderr for s in ("No matching distribution", "Could not find a version",
                                           "NewConnectionError", "Network is unreachable")):
            pytest.skip(f"cannot build the wheel offline (needs the hatchling build backend): "
                        f"{build.stderr.strip().splitlines()[-1]}")
        pytest.fail(f"pip wheel failed:\n{build.stderr[-3000:]}")
    (wheel,) = wheels.glob("ddplan-*.whl")

    venv = tmp / "venv"
    made = sh(sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv, cwd=tmp)
    if made.returncode != 0:
        pytest.skip(f"cannot create a venv here: {made.stderr.strip()[-500:]}")
    py = venv / "bin" / "python"
    site = sh(py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=tmp)
    assert site.returncode == 0, site.stderr
    ours = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (Path(site.stdout.strip()) / "_running_interpreter.pth").write_text("\n".join(ours) + "\n", encoding="utf-8")
    pip = sh(py, "-m", "pip", "--version", cwd=tmp)
    if pip.returncode != 0:
        pytest.skip("no pip visible from the venv (system site-packages without pip)")
    inst = sh(py, "-m", "pip", "install", "--no-deps", "--no-index", "-q", wheel, cwd=tmp, timeout=120)
    assert inst.returncode == 0, inst.stderr[-3000:]
    return venv, wheel


def test_wheel_ships_the_specs(installed):
    _, wheel = installed
    names = zipfile.ZipFile(wheel).namelist()
    for kind in ("models", "hardware", "frameworks", "validation"):
        shipped = {Path(n).name for n in names if n.startswith(f"ddplan/_specs/{kind}/") and n.endswith(".yaml")}
        in_repo = {p.name for p in (REPO / kind).glob("*.yaml")}
        assert shipped == in_repo, kind
    assert not any(n.startswith(("tests/", "models/", "hardware/", "frameworks/")) for n in names)


def test_installed_ddplan_runs_from_elsewhere(installed, tmp_path):
    venv, _ = installed
    ddplan = venv / "bin" / "ddplan"
    assert ddplan.is_file()

    show = sh(ddplan, "specs", "show", "d24", "--format", "json", cwd=tmp_path)
    assert show.returncode == 0, show.stderr
    assert '"name": "nanochat-d24"' in show.stdout

    listing = sh(ddplan, "specs", "list", cwd=tmp_path)
    assert listing.returncode == 0, listing.stderr
    assert "gpt2-124m" in listing.stdout and "nanochat-dN" in listing.stdout

    bad = sh(ddplan, "specs", "show", "gtp2", cwd=tmp_path)
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "gpt2" in bad.stderr


def test_installed_specs_come_from_site_packages(installed, tmp_path):
    venv, _ = installed
    probe = sh(venv / "bin" / "python", "-c",
               "import ddplan, sysconfig; from ddplan.registry import builtin_dir; "
               "print(sysconfig.get_paths()['purelib']); print(ddplan.__file__); "
               "print(builtin_dir('models')); print(builtin_dir('hardware'))", cwd=tmp_path)
    assert probe.returncode == 0, probe.stderr
    purelib, package, models, hardware = (Path(line).resolve() for line in probe.stdout.splitlines())
    assert purelib.is_relative_to(venv.resolve())
    assert package.is_relative_to(purelib), "imported ddplan from outside the venv (the checkout?)"
    assert models == purelib / "ddplan" / "_specs" / "models"
    assert hardware == purelib / "ddplan" / "_specs" / "hardware"
    assert not models.is_relative_to(REPO)
