"""The only place numbers are formatted: rich tables, markdown, csv, json, YAML."""

from __future__ import annotations

import json
import sys
from typing import Any


def echo(text: str) -> None:
    """Write a result to stdout (results only; messages go to stderr)."""
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


def _fmt(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int) or float(value).is_integer() and abs(value) >= 1000:
        return f"{int(value):,}"
    return f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.1f}"


def rich_table(columns: list[str], rows: list[list[Any]], title: str | None = None, width: int | None = None) -> str:
    """A rich table rendered to text (no colour, so it can be piped and pinned in golden files)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    for col in columns:
        table.add_column(col)
    for row in rows:
        table.add_row(*(_fmt(v) for v in row))
    console = Console(width=width or 160, force_terminal=False, color_system=None)
    with console.capture() as cap:
        console.print(table)
    return cap.get()


def spec_list(rows: list[dict[str, str]]) -> str:
    return rich_table(["kind", "name", "aliases", "summary"], [list(r.values()) for r in rows])


def spec_text(spec: Any, derived: list[tuple]) -> str:
    import yaml

    body = yaml.safe_dump(spec.model_dump(mode="json", exclude_none=True), sort_keys=False, width=110)
    table = rich_table(["figure", "value", "unit", "from"], [list(d) for d in derived], title="derived")
    return body + "\n" + table


def spec_json(spec: Any, derived: list[tuple]) -> str:
    return json.dumps({"spec": spec.model_dump(mode="json", exclude_none=True),
                       "derived": [{"figure": f, "value": v, "unit": u, "from": s} for f, v, u, s in derived]},
                      indent=2)
