"""The only place numbers are formatted: rich tables, markdown, csv, json, YAML."""

from __future__ import annotations

import json
import sys
from typing import Any


def echo(text: str) -> None:
    """Write a result to stdout (results only; messages go to stderr); nothing for an empty result."""
    if text:
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
    if width is None:  # wide enough that no header or cell is cut: output must not depend on the terminal
        cells = [columns, *([_fmt(v) for v in row] for row in rows)]
        width = max(80, sum(max(len(str(r[i])) for r in cells) + 3 for i in range(len(columns))) + 1)
    console = Console(width=width, force_terminal=False, color_system=None)
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


def table(rows: list[dict], fmt: str, title: str | None = None, digits: int = 2, width: int | None = None) -> str:
    """Rows of dicts (same keys, units in the keys) as a rich table, markdown, csv or json.

    csv and json carry full precision; table and markdown round floats to `digits` decimals.
    """
    if not rows:
        return ""
    columns = list(rows[0])
    if fmt == "json":
        return json.dumps(rows, indent=2)
    if fmt == "csv":
        import csv
        import io

        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return buf.getvalue()
    cells = [[_cell(r[c], digits) for c in columns] for r in rows]
    if fmt == "markdown":
        lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in cells]
        return ("**" + title + "**\n\n" if title else "") + "\n".join(lines) + "\n"
    return rich_table(columns, cells, title=title, width=width)


def _cell(value: Any, digits: int) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def csv_with(prov: dict, rows: list[dict]) -> str:
    """CSV with a first comment line saying what produced it (ddplan.provenance); read it with
    `pandas.read_csv(..., comment="#")` or skip lines starting with '#'."""
    from ddplan.provenance import line

    return "# " + line(prov) + "\n" + table(rows, "csv")


def footer(prov: dict, fmt: str) -> str:
    """The provenance line under a table or markdown output (nothing for csv/json, which carry it as data)."""
    from ddplan.provenance import line

    return lines(["Produced by " + line(prov) + "."], fmt)


def lines(text_lines: list[str], fmt: str) -> str:
    """Verdict lines under a table: plain for table/markdown; empty for csv/json (data only)."""
    if fmt in ("csv", "json") or not text_lines:
        return ""
    prefix = "- " if fmt == "markdown" else ""
    return "\n".join(prefix + t for t in text_lines) + "\n"


PLAN_COLUMNS = ("hardware", "gpus", "dp", "tp", "sp", "tp_overlap", "pp", "zero", "micro_batch", "accum", "attention",
                "recompute", "schedule", "family", "step_s", "wall_clock_h", "cost_usd", "mfu_pct", "memory_gib")


def plan_data(rows: list[dict]) -> list[dict]:
    """Plan rows as data (every figure; the priced object left out)."""
    return [{k: v for k, v in r.items() if k != "_priced"} for r in rows]


def plan_columns(rows: list[dict]) -> list[dict]:
    """The plan table's columns, in order."""
    return [{c: r[c] for c in PLAN_COLUMNS} for r in rows]


def _sig(x: float) -> str:
    """4 significant figures without exponents: 0.1234, 12.34, 1,234, 123,457."""
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}"


def table_data(table) -> list[dict]:
    """Decision-table rows as data: the row's name first, then every figure (units in the keys)."""
    from ddplan.layout import NATIVE_ZERO
    from ddplan.verdicts import config_label

    native = NATIVE_ZERO[table.request.model.recipe.distribution]
    return [{"config": config_label(p, native), **p.row()} for p in table.rows]


DECISION_COLUMNS_NOTE = (
    "Columns: step_s = compute_s (attention included: attn_s) + exposed comm_s (data- and tensor-parallel) + "
    "optim_s + bubble_s (pipeline, with its sends); band = every efficiency at the slow and fast ends of its range, "
    "and uncalibrated at least the out-of-sample spread of measured/predicted on ddplan's published runs "
    "(`ddplan validate --leave-one-source-out`); "
    "basis: measured | fitted (derived from a measurement) | model (assumptions only); '!' = flagged, see the "
    "warnings on stderr.")


def decision_rows(rows: list[dict]) -> list[dict]:
    """The decision table as people read it: bands inline, a few columns; csv/json keep every column.
    Floats to 3-4 significant figures; the bubble column only where a row has a pipeline."""
    piped = any(r["pp"] > 1 for r in rows)
    interrupted = any(r["interruptions_lost_h"] > 0 for r in rows)
    out = []
    for r in rows:
        row = {
            "config": r["config"],
            "micro-batch x accum": f"{r['micro_batch']} x {r['accum']}",
            "step_s (band)": f"{r['step_s']:.4g} ({r['step_low_s']:.4g}-{r['step_high_s']:.4g})",
            "compute_s": f"{r['compute_s']:.4g}",
            "attn_s": f"{r['attention_s']:.3g}",
            "comm_s": f"{r['dp_comm_exposed_s'] + r['tp_comm_s']:.3g}",
            "optim_s": f"{r['optimizer_s']:.3g}",
        }
        if piped:
            row["bubble_s"] = f"{r['bubble_s']:.3g}"
        if interrupted:
            row["restarts h (ckpt every h)"] = (f"{_sig(r['interruptions_lost_h'])} "
                                               f"({r['checkpoint_interval_h']:.3g})")
        row.update({
            "MFU %": f"{r['mfu_pct']:.1f}",
            "wall-clock h (band)": f"{_sig(r['wall_clock_h'])} ({_sig(r['wall_low_h'])}-{_sig(r['wall_high_h'])})",
            "cost $ (band)": f"{r['cost_usd']:,.0f} ({r['cost_low_usd']:,.0f}-{r['cost_high_usd']:,.0f})",
            "mem GiB": f"{r['memory_gib']:.0f}" + ("" if r["fits"] else " (OOM)"),
            "basis": r["basis"] + (" !" if r["flags"] else ""),
        })
        out.append(row)
    return out


def validation_rows(rows: list[dict]) -> list[dict]:
    """`ddplan validate`'s runs as people read them: band inline, 4 significant figures."""
    def mfu(v):
        return "-" if v is None else f"{v:.1f}"

    return [{"run": r["id"], "GPUs": f"{r['gpus']:,}", "family": r["family"], "assumed": r["assumed"],
             "measured s": f"{r['measured_s']:.4g}",
             "predicted s (band)": f"{r['predicted_s']:.4g} ({r['low_s']:.4g}-{r['high_s']:.4g})",
             "error %": f"{r['error_pct']:+.1f}", "in band": "yes" if r["inside_band"] else "NO",
             "MFU % meas/pred": f"{mfu(r['measured_mfu_pct'])} / {mfu(r['predicted_mfu_pct'])}"} for r in rows]


def summary_rows(rows: list[dict]) -> list[dict]:
    """`ddplan validate`'s summaries as people read them."""
    return [{"group": r["group"], "runs": r["runs"], "median |error| %": f"{r['median_abs_error_pct']:.1f}",
             "max |error| %": f"{r['max_abs_error_pct']:.1f}", "mean error %": f"{r['mean_error_pct']:+.1f}",
             "inside band %": f"{r['inside_band_pct']:.0f}",
             "median band half-width %": f"{r['median_band_half_width_pct']:.1f}"} for r in rows]
