"""Write docs/cli.md: every ddplan command's --help, generated from the CLI itself so that the reference cannot
drift from it (tests/test_docs.py fails when docs/cli.md is not what this prints).

    python tools/cli_reference.py            # rewrites docs/cli.md
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

from ddplan import cli

WIDTH = 100  # the help is wrapped to this many columns
OUT = Path(__file__).parent.parent / "docs" / "cli.md"


def help_of(path: tuple[str, ...]) -> str:
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(WIDTH)
    try:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            cli.main([*path, "--help"])
        return buf.getvalue().rstrip("\n")
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old


def reference() -> str:
    parts = ["# ddplan command reference",
             "",
             "Generated from the CLI by `python tools/cli_reference.py` (each command's `--help` at "
             f"{WIDTH} columns); tests/test_docs.py fails when this file is stale.",
             ""]
    for path in cli.command_paths():
        parts += [f"## ddplan {' '.join(path)}".rstrip(), "", "```text", help_of(path), "```", ""]
    return "\n".join(parts)


if __name__ == "__main__":
    from ddplan.files import atomic_write

    atomic_write(OUT, reference())
    print(f"wrote {OUT}")
