"""docs/architecture.md is the living map of the package: it names every module."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_architecture_map_names_every_module():
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    package = ROOT / "ddplan"
    modules = sorted(str(p.relative_to(package)) for p in package.rglob("*.py"))
    assert modules and [m for m in modules if f"`{m}`" not in text] == []
    # and names no module that is gone
    import re

    named = set(re.findall(r"`((?:calibrate/)?[a-z_]+\.py)`", text))
    assert named - set(modules) == set()
