"""The only place numbers are formatted: rich tables, markdown, csv, json, YAML."""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass
from typing import Any

from ddplan.layout import NATIVE_ZERO
from ddplan.provenance import line
from ddplan.verdicts import config_label


def info(lines: list[str]) -> None:
    """Information for the user on stderr (stdout carries the results), one line each."""
    for text in lines:
        print(text, file=sys.stderr)


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


def spec_list(rows: list[dict[str, str]], screen: Screen | None = None) -> str:
    if screen is not None:
        return fit(rows, screen, drop=SPEC_DROP)
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


def table(rows: list[dict], fmt: str, title: str | None = None, digits: int = 2, width: int | None = None,
          column_digits: dict[str, int] | None = None) -> str:
    """Rows of dicts (same keys, units in the keys) as a rich table, markdown, csv or json.

    csv and json carry full precision; table and markdown round floats to `digits` decimals (a column
    named in column_digits to its own).
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
    places = {c: (column_digits or {}).get(c, digits) for c in columns}
    cells = [[_cell(r[c], places[c]) for c in columns] for r in rows]
    if fmt == "markdown":  # a | inside a cell (`median |error| %`) is escaped, or it would split the cell
        def md(text: str) -> str:
            return str(text).replace("|", "\\|")

        lines = ["| " + " | ".join(map(md, columns)) + " |", "|" + "|".join("---" for _ in columns) + "|"]
        lines += ["| " + " | ".join(map(md, row)) + " |" for row in cells]
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


def csv_with(prov: dict, rows: list[dict], notes: list[str] = ()) -> str:
    """CSV with a first comment line saying what produced it (ddplan.provenance), then one per note (e.g. plan's
    ranking and its budget); read it with `pandas.read_csv(..., comment="#")` or skip lines starting with '#'."""
    return "".join("# " + t + "\n" for t in [line(prov), *notes]) + table(rows, "csv")


def footer(prov: dict, fmt: str, screen: Screen | None = None) -> str:
    """The provenance line under a table or markdown output (nothing for csv/json, which carry it as data)."""
    return lines(["Produced by " + line(prov) + "."], fmt, screen)


def lines(text_lines: list[str], fmt: str, screen: Screen | None = None) -> str:
    """Verdict lines under a table: plain for table/markdown; empty for csv/json (data only). On a
    terminal each line wraps to its width, continuation lines indented by two spaces."""
    if fmt in ("csv", "json") or not text_lines:
        return ""
    if screen is not None:
        import textwrap

        return "\n".join(textwrap.fill(t, width=screen.width, subsequent_indent="  ", break_on_hyphens=False)
                         for t in text_lines) + "\n"
    prefix = "- " if fmt == "markdown" else ""
    return "\n".join(prefix + t for t in text_lines) + "\n"


# a row's memory verdict beside its GiB (ddplan.memory.fit_verdict: "may not fit" between the band's high end over
# the limit and its low end over all of usable memory)
OOM_MARK = {"fits": "", "may not fit": " OOM?", "does not fit": " OOM"}
OOM_NOTE = {"fits": "", "may not fit": " (OOM?)", "does not fit": " (OOM)"}

PLAN_COLUMNS = ("hardware", "gpus", "dp", "tp", "sp", "tp_overlap", "pp", "cp", "ep", "zero", "micro_batch", "accum", "attention",
                "recompute", "schedule", "family", "step_s", "wall_clock_h", "cost_usd", "mfu_pct", "memory_gib")
# the table and markdown formats show the top rows' bands too; csv lists every row with every band
PLAN_SHOWN = (*PLAN_COLUMNS[:PLAN_COLUMNS.index("wall_clock_h") + 1], "wall_low_h", "wall_high_h",
              *PLAN_COLUMNS[PLAN_COLUMNS.index("wall_clock_h") + 1:])
PLAN_CSV = (*PLAN_COLUMNS[:PLAN_COLUMNS.index("step_s") + 1], "step_low_s", "step_high_s", "wall_clock_h",
            "wall_low_h", "wall_high_h", "cost_usd", "cost_low_usd", "cost_high_usd",
            *PLAN_COLUMNS[PLAN_COLUMNS.index("cost_usd") + 1:])


def plan_data(rows: list[dict]) -> list[dict]:
    """Plan rows as data (every figure; the priced object left out)."""
    return [{k: v for k, v in r.items() if k != "_priced"} for r in rows]


def plan_columns(rows: list[dict], columns: tuple[str, ...] = PLAN_COLUMNS) -> list[dict]:
    """The plan table's columns, in order; with expert parallelism in any row, the all-to-all seconds of each
    step (ep_comm_s) after ep."""
    if any(r["ep"] > 1 for r in rows):
        at = columns.index("ep") + 1
        columns = (*columns[:at], "ep_comm_s", *columns[at:])
    return [{c: r[c] for c in columns} for r in rows]


def _sig(x: float) -> str:
    """4 significant figures without exponents: 0.1234, 12.34, 1,234, 123,457."""
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}"


def table_data(table) -> list[dict]:
    """Decision-table rows as data: the row's name first, then every figure (units in the keys)."""
    native = NATIVE_ZERO[table.request.model.recipe.distribution]
    return [{"config": config_label(p, native), **p.row()} for p in table.rows]


DECISION_COLUMNS_NOTE = (
    "Columns: step_s = compute_s (attention included: attn_s) + exposed comm_s (data-, tensor-, context- and expert-parallel, "
    "with what the hidden part costs the compute beside it) + optim_s + bubble_s (pipeline, with its sends) + "
    "activation offload's copies where any; band = every efficiency at the slow and fast ends of its range (but a "
    "fitted GPU's best GEMM rate, at its value), "
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
            "comm_s": f"{r['dp_comm_exposed_s'] + r['tp_comm_s'] + r['cp_comm_s'] + r['ep_comm_s']:.3g}",
            "optim_s": f"{r['optimizer_s']:.3g}",
        }
        if piped:
            row["bubble_s"] = f"{r['bubble_s']:.3g}"
        if interrupted:
            row["restarts h (ckpt every h)"] = (f"{_sig(r['interruptions_lost_h'])} "
                                               f"({r['checkpoint_interval_h']:.3g})" if r["interruptions_lost_h"] > 0
                                               else "-")  # none priced on this row (e.g. one node)
        row.update({
            "MFU %": f"{r['mfu_pct']:.1f}",
            "wall-clock h (band)": f"{_sig(r['wall_clock_h'])} ({_sig(r['wall_low_h'])}-{_sig(r['wall_high_h'])})",
            "cost $ (band)": f"{r['cost_usd']:,.0f} ({r['cost_low_usd']:,.0f}-{r['cost_high_usd']:,.0f})",
            "mem GiB": f"{r['memory_gib']:.0f}" + OOM_NOTE[r["memory_verdict"]],
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


def peak_rows(rows: list[dict]) -> list[dict]:
    """`ddplan validate --memory`'s peaks as people read them (GB = 1e9 bytes)."""
    def gb(v):
        return "-" if v is None else f"{v:.1f}"

    return [{"peak": r["id"], "GPUs": f"{r['gpus']:,}", "framework": r["framework"], "counts": r["measured_what"],
             "measured GB": gb(r["measured_gb"]) if r["outcome"] == "ran" else "out of memory",
             "predicted GB": gb(r["predicted_gb"]),
             "error %": "-" if r["error_pct"] is None else f"{r['error_pct']:+.1f}",
             "verdict": r["verdict"] + ("" if r["verdict_right"] else " (WRONG)")}
            for r in rows]


def peak_summary_rows(rows: list[dict]) -> list[dict]:
    """`ddplan validate --memory`'s summaries as people read them."""
    def pct(v):
        return "-" if v is None else f"{v:.1f}"

    return [{"group": r["group"], "peaks": r["peaks"], "median |error| %": pct(r["median_abs_error_pct"]),
             "max |error| %": pct(r["max_abs_error_pct"]), "verdict right %": f"{r['verdict_right_pct']:.0f}",
             "may not fit %": f"{r['may_not_fit_pct']:.0f}",
             "false 'does not fit'": r["false_does_not_fit"], "false 'fits'": r["false_fits"]} for r in rows]


def summary_rows(rows: list[dict]) -> list[dict]:
    """`ddplan validate`'s summaries as people read them."""
    return [{"group": r["group"], "runs": r["runs"], "median |error| %": f"{r['median_abs_error_pct']:.1f}",
             "max |error| %": f"{r['max_abs_error_pct']:.1f}", "mean error %": f"{r['mean_error_pct']:+.1f}",
             "inside band %": f"{r['inside_band_pct']:.0f}",
             "median band half-width %": f"{r['median_band_half_width_pct']:.1f}"} for r in rows]


# --------------------------------------------------------------------------------------------
# The terminal. Everything above is the fixed layout that pipes, files and golden tests see, the same
# whatever the terminal; what follows applies only when stdout is a terminal and the format is `table`:
# human headers with units, numbers to a few significant figures, long durations in days too, and
# columns dropped (least important first) until the table fits the terminal's width.

MIN_WIDTH = 40  # narrower terminals are treated as this wide


@dataclass(frozen=True)
class Screen:
    """A terminal `width` columns wide; `wide`: show every column however wide the table gets."""
    width: int
    wide: bool = False


def screen(fmt: str, wide: bool = False) -> Screen | None:
    """The terminal stdout is, for the rich table format (COLUMNS, else the terminal's own width); None
    when stdout is a pipe or a file, or the format is markdown, csv or json."""
    if fmt != "table" or not sys.stdout.isatty():
        return None
    return Screen(width=max(MIN_WIDTH, shutil.get_terminal_size().columns), wide=wide)


def fit(rows: list[dict[str, Any]], screen: Screen, title: str | None = None, drop: tuple[str, ...] = ()) -> str:
    """Rows of text cells (human headers) as a table at most `screen.width` wide: the columns named in
    `drop` go, first to last, until the rest fits (none go with --wide); what still does not fit wraps
    inside its cells, and the title wraps to the table's width. Numeric columns align right."""
    if not rows:
        return ""
    rows = [{k: v if isinstance(v, str) else _fmt(v) for k, v in r.items()} for r in rows]
    columns = list(rows[0])
    if not screen.wide:
        for name in drop:
            if _natural_width(columns, rows) <= screen.width:
                break
            if name in columns and len(columns) > 1:
                columns.remove(name)
    width = max(screen.width, _natural_width(columns, rows)) if screen.wide else screen.width
    text = _capture(_terminal_table(columns, rows, title), width)
    hidden = [c for c in rows[0] if c not in columns]
    note = lines([hidden_note(hidden, screen.width)], "table", screen) if hidden else ""
    return "\n".join(line.rstrip() for line in text.splitlines()) + "\n" + note


def hidden_note(columns: list[str], width: int) -> str:
    """The line under a table that named what it left out to fit the terminal."""
    return f"Hidden to fit {width} columns: {', '.join(columns)} (--wide shows them; csv and json carry every one)."


def _terminal_table(columns: list[str], rows: list[dict[str, str]], title: str | None):
    from rich import box
    from rich.table import Table

    table = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)
    for col in columns:
        numeric = all(_numeric(r[col]) for r in rows)
        table.add_column(col, justify="right" if numeric else "left", overflow="fold")
    for r in rows:
        table.add_row(*(r[c] for c in columns))
    return table


def _numeric(cell: str) -> bool:
    """A cell that reads as a number (its first word: '1,234', '-0.5', '441.8 (18.4 d)', '12-15')."""
    first = cell.split(" ", 1)[0].replace(",", "")
    parts = first[1:].split("-", 1) if first[:1] == "-" else first.split("-", 1)
    try:
        [float(p) for p in parts]
    except ValueError:
        return False
    return True


def _natural_width(columns: list[str], rows: list[dict[str, str]]) -> int:
    """The width the table takes with no cell wrapped (the title aside: it wraps)."""
    from rich.console import Console

    return Console(width=10_000, color_system=None).measure(_terminal_table(columns, rows, None)).maximum


def _capture(renderable, width: int) -> str:
    from rich.console import Console

    console = Console(width=width, force_terminal=False, color_system=None)
    with console.capture() as cap:
        console.print(renderable)
    return cap.get()


def num(x: float, sig: int = 3) -> str:
    """A number for a person: `sig` significant figures (0.0912, 18.2, 442), thousands separated and no
    fraction from 1,000 up (24,734), no exponent above 1e-4."""
    if abs(x) >= 10 ** (sig - 1) or abs(x) >= 1000:
        return f"{x:,.0f}"
    if x != 0 and abs(x) < 1e-4:
        return f"{x:.1e}"
    text = f"{x:.{sig}g}"
    return text if "e" not in text else f"{x:.{sig}f}"


def hours(h: float, sig: int = 4) -> str:
    """Hours to `sig` significant figures, in days from 48 h up and in years (of 365 days) from one year up:
    '441.8 (18.4 d)', '30,000 (3.42 y)'."""
    text = num(h, sig)
    if h >= 24 * 365:
        return text + f" ({num(h / (24 * 365))} y)"
    return text + (f" ({num(h / 24)} d)" if h >= 48 else "")


def duration(h: float, sig: int = 3) -> str:
    """Hours in a sentence: '0.421 h', '441 h (18.4 d)', '30,000 h (3.42 y)' (hours() is the column's)."""
    text, _, rest = hours(h, sig).partition(" ")
    return f"{text} h" + (f" {rest}" if rest else "")


def signed(x: float, sig: int = 2) -> str:
    """A difference with its sign, to `sig` significant figures (never '-0'): '+54', '-0.3', '+0.082',
    '0' for none at all."""
    return "0" if x == 0 else ("+" if x > 0 else "-") + num(abs(x), sig)


def money(usd: float) -> str:
    """Dollars: whole dollars from $10 up, else 3 significant figures."""
    return f"{usd:,.0f}" if abs(usd) >= 10 else num(usd)


def band(low: float, high: float, sig: int = 3) -> str:
    return f"{num(low, sig)}-{num(high, sig)}"


DECISION_DROP = ("optim s", "restarts h", "compute s", "attn s", "comm s", "bubble s", "cost band $",
                 "wall band h", "mb x accum", "step band s", "MFU %", "basis")


def decision_cells(rows: list[dict]) -> list[dict[str, str]]:
    """`ddplan table` on a terminal: the columns of decision_rows, bands in columns of their own (the
    first to go when the terminal is narrow), wall-clock in days as well from 48 h."""
    piped = any(r["pp"] > 1 for r in rows)
    interrupted = any(r["interruptions_lost_h"] > 0 for r in rows)
    out = []
    for r in rows:
        row = {"config": r["config"], "mb x accum": f"{r['micro_batch']} x {r['accum']}",
               "step s": num(r["step_s"], 4), "step band s": band(r["step_low_s"], r["step_high_s"]),
               "compute s": num(r["compute_s"]), "attn s": num(r["attention_s"]),
               "comm s": num(r["dp_comm_exposed_s"] + r["tp_comm_s"] + r["cp_comm_s"] + r["ep_comm_s"]), "optim s": num(r["optimizer_s"])}
        if piped:
            row["bubble s"] = num(r["bubble_s"])
        if interrupted:
            row["restarts h"] = num(r["interruptions_lost_h"]) if r["interruptions_lost_h"] > 0 else "-"
        row.update({"MFU %": f"{r['mfu_pct']:.1f}", "wall h": hours(r["wall_clock_h"]),
                    "wall band h": band(r["wall_low_h"], r["wall_high_h"]), "cost $": money(r["cost_usd"]),
                    "cost band $": f"{money(r['cost_low_usd'])}-{money(r['cost_high_usd'])}",
                    "mem GiB": num(r["memory_gib"]) + OOM_MARK[r["memory_verdict"]],
                    "basis": r["basis"] + (" !" if r["flags"] else "")})
        out.append(row)
    return out


MEMORY_HEADERS = {"zero": "ZeRO", "setup": "setup", "params_gib": "params", "gradients_gib": "grads",
                  "optimizer_gib": "optimizer", "activations_gib": "activations", "transient_gib": "transient",
                  "buffers_gib": "buffers", "framework_gib": "framework", "allocator_gib": "allocator",
                  "total_gib": "total GiB", "usable_gib": "usable GiB", "headroom_gib": "free GiB", "verdict": "verdict"}
MEMORY_BAND_KEYS = ("fits", "low_gib", "high_gib", "limit_gib")  # on a terminal: the verdict and one band column
# the small terms that share one "other" column on a terminal narrower than every column, so that the terms
# shown always add up to the total (issue 38: 169 GiB of visible terms under a 210 GiB total)
MEMORY_OTHER = ("transient", "buffers", "framework", "allocator")
MEMORY_DROP = ("band GiB", "usable GiB", "setup", "free GiB")


def memory_cells(rows: list[dict], width: int | None = None) -> list[dict[str, str]]:
    """`ddplan memory` on a terminal: every term in GiB to 3 significant figures (the title says GiB). On a
    terminal `width` columns wide that cannot show every column, the small terms (MEMORY_OTHER) share one
    "other" column; no term is ever dropped (MEMORY_DROP holds none), so the terms shown add up to the total."""
    def cell(key: str, v: Any) -> str:
        if isinstance(v, bool):
            return "yes" if v else "no"
        return num(v) if isinstance(v, float) else str(v)

    out = []
    for r in rows:
        row = {MEMORY_HEADERS.get(k, k): cell(k, v) for k, v in r.items() if k not in MEMORY_BAND_KEYS}
        row["band GiB"] = f"{num(r['low_gib'])}-{num(r['high_gib'])}"  # the verdict's: ddplan.memory.PEAK_RATIO
        out.append(row)
    if width is not None and out and _natural_width(list(out[0]), out) > width:
        for row, r in zip(out, rows):
            other = sum(r[k] for k, header in MEMORY_HEADERS.items() if header in MEMORY_OTHER)
            for header in MEMORY_OTHER:
                del row[header]
            cells = list(row.items())
            at = [k for k, _ in cells].index("total GiB")
            row.clear()
            row.update(cells[:at] + [("other", num(other))] + cells[at:])
    return out


PLAN_DROP = ("schedule", "family", "recompute", "wall band h", "MFU %", "mem GiB", "mb x accum", "ZeRO", "attention")


def plan_cells(rows: list[dict]) -> list[dict[str, str]]:
    """`ddplan plan` on a terminal: GPUs with their hardware, tp with its sequence parallelism (+sp) and
    overlap (+ov), step times to 4 significant figures, wall-clock in days as well from 48 h."""
    def tp(r: dict) -> str:
        return str(r["tp"]) + ("+sp" if r["sp"] else "") + ("+ov" if r["tp_overlap"] else "")

    return [{"GPUs": f"{r['gpus']:,}x {r['hardware']}", "dp": str(r["dp"]), "tp": tp(r), "pp": str(r["pp"]),
             **({"cp": str(r["cp"])} if any(x["cp"] > 1 for x in rows) else {}),
             **({"ep": str(r["ep"]), "a2a s": num(r["ep_comm_s"])} if any(x["ep"] > 1 for x in rows) else {}),
             "ZeRO": str(r["zero"]), "mb x accum": f"{r['micro_batch']} x {r['accum']}", "attention": r["attention"],
             "recompute": r["recompute"], "schedule": r["schedule"], "family": r["family"],
             "step s": num(r["step_s"], 4), "wall h": hours(r["wall_clock_h"]),
             "wall band h": band(r["wall_low_h"], r["wall_high_h"]), "cost $": money(r["cost_usd"]),
             "MFU %": f"{r['mfu_pct']:.1f}", "mem GiB": num(r["memory_gib"])} for r in rows]


SPEC_DROP = ("aliases",)
VALIDATION_DROP = ("assumed", "family", "MFU % meas/pred", "in band", "GPUs")
SUMMARY_DROP = ("median band half-width %", "mean error %")  # the max error always shows (issue 38)
