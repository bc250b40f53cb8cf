"""What each planning command prints, in the format asked: the answer first, then the table it rests on, the
notes below it and the provenance footer (text and markdown), or the data alone (csv, json).

ddplan.cli parses the flags, calls the model and hands its result here; the sentences come from the words modules
(ddplan.verdicts, ddplan.reasons) and every number is formatted by ddplan.render. Each function writes stdout and
returns the warnings for stderr (the CLI prints them: one place says how a warning looks).
"""

from __future__ import annotations

import json

from ddplan import reasons, render, verdicts
from ddplan import validation as V
from ddplan.memory import fit_verdict
from ddplan.plan import best_per_family
from ddplan.plot import plot_memory, plot_scenarios, plot_validation
from ddplan.provenance import line as prov_line


def table(result, prov: dict, fmt: str, wide: bool, quiet: bool, explain: bool, plot: str | None) -> list[str]:
    """`ddplan table`: the verdict, the decision table, its assumptions (--explain: all of them) and the footer."""
    spec, hw = result.request.model, result.request.hardware
    rows = render.table_data(result)
    if plot:
        plot_scenarios(rows, plot, title=f"{spec.name} on {hw.name}\n{prov_line(prov)}")
    shown_warnings = verdicts.table_notes(result) + verdicts.grouped_row_warnings(result)  # stderr: each once
    if fmt == "json":
        warnings = verdicts.table_notes(result) + verdicts.row_warnings(result)  # json: row by row
        render.echo(json.dumps({"title": verdicts.table_title(result), "rows": rows,
                                "verdict": verdicts.table_verdict(result), "warnings": warnings,
                                "assumptions": verdicts.table_assumptions(result), "provenance": prov}, indent=2))
        return []
    if fmt == "csv":
        render.echo(render.csv_with(prov, rows))
        return shown_warnings
    scr = render.screen(fmt, wide)
    title = verdicts.table_title(result)
    answer = verdicts.table_verdict(result)  # answer first: the verdict, then the table it rests on
    if quiet:
        render.echo(render.lines(answer[:1], fmt, scr))
        return shown_warnings
    top = verdicts.top_warning(result) if scr else None  # pipes and files keep their fixed layout
    if top:  # said once: in the verdict, not again on stderr
        said = verdicts.top_warning_text(result)
        shown_warnings = [w for w in shown_warnings if said not in w]
    render.echo(render.lines(answer + ([top] if top else []), fmt, scr))
    render.echo(render.fit(render.decision_cells(rows), scr, title, render.DECISION_DROP) if scr
                else render.table(render.decision_rows(rows), fmt, title=title))
    render.echo(render.lines([render.DECISION_COLUMNS_NOTE], fmt, scr))
    assumptions = verdicts.table_assumptions(result)
    render.echo(render.lines(verdicts.assumptions_shown(assumptions, explain), fmt, scr))
    render.echo(render.footer(prov, fmt, scr))
    return shown_warnings


def memory(ask, rows: list[dict], fixes: list, step_s: float | None, matches: list, outside: str, prov: dict,
           fmt: str, wide: bool, quiet: bool, plot: str | None, peak_tolerance: float) -> None:
    """`ddplan memory`: the verdict (fits or not, and the fix), the table of ZeRO stages, the notes and the footer."""
    spec, hw, setup = ask.spec, ask.hardware, ask.setup
    if plot:
        plot_memory(rows, plot, title=f"{spec.name} on {setup.layout.num_gpus} x {hw.name}\n{prov_line(prov)}",
                    capacity_gib=hw.memory.usable_gib.value, headroom=setup.headroom,
                    fix=(" + ".join(fixes[0].changes), fixes[0].total_gib,
                         fit_verdict(fixes[0].total_gib, rows[0]["limit_gib"], capacity=rows[0]["usable_gib"]))
                    if fixes else None)
    words = verdicts.memory_verdict(spec, hw, rows, fixes, step_s, setup.layout, setup.headroom,
                                    verdicts.fixes_tried(ask.lacks, ask.recomputes_offered))
    if ask.measured_peak:
        words.append(verdicts.peak_matches(ask.measured_peak, ask.peak_kind, matches, peak_tolerance))
    if ask.moved:
        words.append(verdicts.peak_not_compared(ask.peak_step, list(ask.moved)))
    title = verdicts.memory_title(spec, hw, setup)
    if fmt == "json":
        render.echo(json.dumps({"title": title, "rows": rows, "verdict": words, "measured_peak_matches": matches,
                                "assumptions": [outside], "provenance": prov}, indent=2))
        return
    if fmt == "csv":
        render.echo(render.csv_with(prov, rows))
        return
    scr = render.screen(fmt, wide)
    render.echo(render.lines(words, fmt, scr))  # answer first: fits or not, and the fix
    if quiet:
        return
    cells = render.memory_cells(rows, None if scr is None or scr.wide else scr.width) if scr else []
    render.echo(render.fit(cells, scr, title, render.MEMORY_DROP) if scr else render.table(rows, fmt, title=title))
    below = [f"other = {' + '.join(render.MEMORY_OTHER)} (--wide shows each)."] \
        if cells and "other" in cells[0] else []
    render.echo(render.lines(below + [outside], fmt, scr))
    render.echo(render.footer(prov, fmt, scr))


def plan(result, prov: dict, fmt: str, wide: bool, quiet: bool, top: int, headroom: float, objective: str,
         deadline: float | None, budget: float | None, plot: str | None) -> tuple[list[str], str | None]:
    """`ddplan plan`: the choice, the ranked layouts, why, the Pareto front and the footer. Returns (the warnings
    for stderr, the missed limit in words when no layout meets --deadline/--budget: the command's error)."""
    spec = result.request.model
    why = reasons.plan_reasons(result)
    warnings = reasons.plan_warnings(result)
    data = render.plan_data(result.rows)
    shown = render.plan_columns(data[:top], render.PLAN_SHOWN)
    out: list[str] = []
    if fmt == "json":
        render.echo(json.dumps({"objective": objective, "deadline_h": deadline, "budget_usd": budget,
                                "limits_met": not result.missed, "ranked_by": result.ranked_by,
                                "ranking": reasons.ranking_words(result), "choice": data[0] if data else None,
                                "rows": data[:top], "pareto": render.plan_data(result.pareto),
                                "reasons": why, "warnings": warnings, "considered": result.considered,
                                "rejected": result.rejected, "provenance": prov}, indent=2, default=str))
    elif fmt == "csv":  # data: every kept layout, ranked (--top limits the human formats)
        render.echo(render.csv_with(prov, render.plan_columns(data, render.PLAN_CSV),
                                    notes=[f"ranked {reasons.ranking_words(result)}"]))
    else:
        scr = render.screen(fmt, wide)
        title = reasons.plan_title(spec, result, top, headroom, objective)
        render.echo(render.lines(why[:1], fmt, scr))  # answer first: the choice, then the table
        if shown and not quiet:  # -q: the answer only (the plot and the exit code still follow)
            render.echo(render.fit(render.plan_cells(data[:top]), scr, title, render.PLAN_DROP) if scr
                        else render.table(shown, fmt, title=title, digits=2))
        if not quiet:
            render.echo(render.lines(["Why:"] + why[1:], fmt, scr))
        if result.pareto and not quiet:
            render.echo(render.lines(["Pareto front (time vs cost):"] + reasons.pareto_lines(result), fmt, scr))
        if not quiet:
            render.echo(render.footer(prov, fmt, scr))
        out = warnings
    if fmt in ("csv", "json"):  # data on stdout; warnings still reach the user
        out = warnings + ([] if result.rows else why)
    if plot and result.pareto:
        plot_scenarios(best_per_family(data), plot, title=f"{spec.name}: best layout per family\n{prov_line(prov)}",
                       best="cost_usd" if objective == "cost" else "wall_clock_h",
                       choice=data[0] if data else None, budget_usd=budget, deadline_h=deadline)
    return out, reasons.missed_limit(result)


def validation(scored: list, held: list | None, where: str, prov: dict, fmt: str, wide: bool,
               plot: str | None) -> None:
    """`ddplan validate`: the bottom line, each run predicted vs measured, what the columns mean, the summaries by
    kind, hardware, size, precision, framework, family and source (and leaving each source out), the footer."""
    rows = [s.row() for s in scored]
    summary = [s.row() for s in V.summaries(scored)]
    out_of_sample = None
    if held is not None:
        out_of_sample = [s.row() for s in V.by_source(held, "leave-one-source-out ")]
        for row, h in zip(rows, held):
            row["loso_predicted_s"], row["loso_error_pct"] = h.predicted_s, 100 * h.error
            # its band made without its source, as validate's bottom line counts it
            row["loso_low_s"], row["loso_high_s"], row["loso_inside_band"] = h.low_s, h.high_s, h.inside
    if plot:
        plot_validation(rows, plot, title=f"ddplan against {len(rows)} measured runs\n{prov_line(prov)}")
    title = f"ddplan against {len(rows)} measured runs: step time, predicted vs measured ({where})"
    if fmt == "json":
        render.echo(json.dumps({"title": title, "runs": rows, "summary": summary,
                                "leave_one_source_out": out_of_sample, "provenance": prov}, indent=2))
        return
    if fmt == "csv":
        render.echo(render.csv_with(prov, rows))
        return
    scr = render.screen(fmt, wide)
    runs_shown, summary_shown = render.validation_rows(rows), render.summary_rows(summary + (out_of_sample or []))
    render.echo(render.lines(verdicts.validation_bottom_line(scored, held), fmt, scr))  # answer first
    render.echo(render.fit(runs_shown, scr, title, render.VALIDATION_DROP) if scr
                else render.table(runs_shown, fmt, title=title))
    render.echo(render.lines([verdicts.VALIDATION_COLUMNS_NOTE], fmt, scr))
    render.echo(render.fit(summary_shown, scr, "Summary", render.SUMMARY_DROP) if scr
                else render.table(summary_shown, fmt, title="Summary"))
    render.echo(render.footer(prov, fmt, scr))


def peaks(scored: list, summary: list[dict], title: str, loso: bool, prov: dict, fmt: str, wide: bool) -> None:
    """`ddplan validate --memory`: each measured peak predicted vs measured and its verdict, what the columns mean,
    the summaries and the footer."""
    rows = [s.row() for s in scored]
    if fmt == "json":
        render.echo(json.dumps({"title": title, "peaks": rows, "summary": summary, "provenance": prov}, indent=2))
        return
    if fmt == "csv":
        render.echo(render.csv_with(prov, rows))
        return
    scr = render.screen(fmt, wide)
    shown = render.peak_rows(rows)
    render.echo(render.fit(shown, scr, title, ()) if scr else render.table(shown, fmt, title=title))
    render.echo(render.lines([verdicts.peaks_columns_note(loso)], fmt, scr))
    summary_shown = render.peak_summary_rows(summary)
    render.echo(render.fit(summary_shown, scr, "Summary", ()) if scr
                else render.table(summary_shown, fmt, title="Summary"))
    render.echo(render.footer(prov, fmt, scr))

