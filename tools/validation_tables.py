"""The tables of docs/validation.md, as markdown: step time by stack, precision, kind and hardware (in sample and
leaving each source out), and peak memory by evidence and source (each source judged by the band fitted
without it, then in sample).

    python tools/validation_tables.py > /tmp/tables.md    # then paste each table into docs/validation.md

The same figures as `ddplan validate --leave-one-source-out --format json` and `ddplan validate --memory`
(ddplan.validation.summaries over the in-sample and leave-one-source-out scores); a few seconds.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ddplan import validation as V  # noqa: E402
from ddplan.runs import load_runs, shipped_dataset  # noqa: E402

STEP_TABLES = (("By training stack", ("framework=",)), ("By precision", ("precision=",)),
               ("By kind and hardware", ("kind=", "hardware=")))


def step_tables() -> None:
    runs, where = load_runs(), shipped_dataset()
    scorer = V.Scorer()
    inside = {s.group: s for s in V.summaries(V.score_all(runs, where, scorer=scorer))}
    held = {s.group: s for s in V.summaries(V.leave_one_source_out(runs, where, V.fitted_hardware(),
                                                                   scorer=scorer))}
    for title, prefixes in STEP_TABLES:
        print(f"### {title}\n")
        print("| group | runs | median abs error, in sample | leaving the source out | max abs error, leaving it out "
              "| in band, leaving it out | median band half-width, leaving it out |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for group, h in held.items():
            if group == "all" or group.startswith(("sources=", *prefixes)):
                print(f"| {group} | {h.runs} | {100 * inside[group].median_abs_error:.1f}% | "
                      f"{100 * h.median_abs_error:.1f}% | {100 * h.max_abs_error:.1f}% | {100 * h.inside_share:.0f}% | "
                      f"{100 * h.median_half_width:.0f}% |")
        print()


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}%"


def memory_table() -> None:
    scored = V.score_memory()
    print("| group | configurations | median abs error | max abs error | verdict right | \"may not fit\" "
          "| false \"does not fit\" | false \"fits\" |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    rows = [("all, each source left out of the band", V.peaks_leaving_each_source_out(scored)),
            ("all, in sample (the shipped band)", scored)]
    for title, judged in rows:
        for s in V.peak_summaries(judged):
            if s["group"] == "all" or s["group"].startswith(("evidence=", "source=")):
                name = title if s["group"] == "all" else f"{s['group']}, {title.split(', ', 1)[1]}"
                print(f"| {name} | {s['peaks']} | {_pct(s['median_abs_error_pct'])} | {_pct(s['max_abs_error_pct'])} "
                      f"| {s['verdict_right_pct']:.0f}% | {s['may_not_fit_pct']:.0f}% | {s['false_does_not_fit']} "
                      f"| {s['false_fits']} |")


if __name__ == "__main__":
    step_tables()
    memory_table()
