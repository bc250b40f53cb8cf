"""docs/cli.md is generated from the CLI (tools/cli_reference.py): it fails here when a command's help changed
and the reference was not regenerated."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).parent.parent


def test_cli_reference_is_current():
    spec = importlib.util.spec_from_file_location("cli_reference", ROOT / "tools" / "cli_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    expected = module.reference()
    assert (ROOT / "docs" / "cli.md").read_text(encoding="utf-8") == expected, (
        "docs/cli.md is stale: run `python tools/cli_reference.py`")
    assert all(f"## ddplan {' '.join(p)}".rstrip() in expected for p in module.cli.command_paths())
