"""ddplan.plot: matplotlib stays out of `import ddplan.plot`; both plots write PNG and SVG from the rows the
real commands build (`ddplan table`, `ddplan memory`), atomically, reproducibly, and refuse other suffixes."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys

import pytest

from ddplan import cli, plot
from ddplan.sizing import Setup, zero_rows
from ddplan.layout import Layout
from ddplan.registry import load_hardware, load_model

pytest.importorskip("matplotlib")
# one worker: the module's priced rows (fixtures) are computed once, not once per pytest-xdist worker
pytestmark = pytest.mark.xdist_group("plot")

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def table_rows() -> tuple[list[dict], str]:
    """`ddplan table --model d24 --gpus 1,2,4,8 --format json`, through the CLI."""
    return _cli_json(["table", "--model", "d24", "--gpus", "1,2,4,8", "--format", "json"])


@pytest.fixture(scope="module")
def oom_measured_rows() -> tuple[list[dict], str]:
    """A table with rows that do not fit (sdpa-math at device batch 64) and one measured row."""
    return _cli_json(["table", "--model", "d24", "--gpus", "1,8", "--device-batch-size", "64",
                      "--measured-step-time", "15", "--measured-attention", "sdpa-fused", "--format", "json"])


@pytest.fixture(scope="module")
def memory_rows() -> tuple[list[dict], float]:
    """The rows of `ddplan memory --model d24 --gpus 8`, built as the command builds them."""
    spec, hw = load_model("d24"), load_hardware("mi300x")
    mb = spec.recipe.device_batch_size
    layout = Layout(dp=8, tp=1, pp=1, micro_batch=mb,
                    grad_accum=max(1, spec.recipe.total_batch_tokens // (8 * mb * spec.recipe.seq_len)),
                    attention=hw.default_attention, recompute="none", compiled=spec.recipe.compiled)
    return zero_rows(spec, hw, Setup(layout=layout), [0, 1, 2, 3]), hw.memory.usable_gib.value


def _cli_json(argv: list[str]) -> tuple[list[dict], str]:
    """Run a command through cli.main (a module fixture cannot use capsys) and parse its JSON."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(argv) == 0
    data = json.loads(out.getvalue())
    return data["rows"], data["title"]


def test_import_does_not_load_matplotlib():
    code = "import sys, ddplan.plot; print(sorted(m for m in sys.modules if m.split('.')[0] == 'matplotlib'))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_plotting_never_touches_pyplot(tmp_path, table_rows, memory_rows):
    """No global pyplot state: the figures live on their own Agg canvases."""
    code = ("import json, sys; from ddplan import plot; t, m, cap, d = json.loads(sys.stdin.read()); "
            "plot.plot_scenarios(t, d + '/t.png', title='t'); plot.plot_memory(m, d + '/m.svg', title='m', "
            "capacity_gib=cap); print('matplotlib.pyplot' in sys.modules)")
    payload = json.dumps([table_rows[0], memory_rows[0], memory_rows[1], str(tmp_path)])
    proc = subprocess.run([sys.executable, "-c", code], input=payload, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "False"


def _check_written(path, fmt: str) -> None:
    data = path.read_bytes()
    assert len(data) > 1000
    if fmt == "png":
        assert data.startswith(PNG_SIGNATURE)
    else:
        assert b"<svg" in data[:1000] and data.rstrip().endswith(b"</svg>")
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name], "a temporary file was left behind"


@pytest.mark.parametrize("fmt", ["png", "svg"])
def test_plot_scenarios_writes_the_file(tmp_path, table_rows, fmt):
    rows, title = table_rows
    path = tmp_path / f"table.{fmt}"
    plot.plot_scenarios(rows, path, title=title)
    _check_written(path, fmt)


@pytest.mark.parametrize("fmt", ["png", "svg"])
def test_plot_memory_writes_the_file(tmp_path, memory_rows, fmt):
    rows, capacity = memory_rows
    path = tmp_path / f"memory.{fmt}"
    plot.plot_memory(rows, str(path), title="nanochat-d24 on 8 x mi300x: memory per GPU", capacity_gib=capacity)
    _check_written(path, fmt)


def test_rows_that_do_not_fit_and_measured_rows_are_drawn(tmp_path, oom_measured_rows):
    rows, title = oom_measured_rows
    assert any(not r["fits"] for r in rows) and any(r["basis"] == "measured" for r in rows)
    path = tmp_path / "flags" / "oom.png"
    path.parent.mkdir()
    plot.plot_scenarios(rows, path, title=title)
    _check_written(path, "png")
    plain = [r | {"fits": True, "basis": "model"} for r in rows]
    plot.plot_scenarios(plain, tmp_path / "plain.png", title=title)
    assert path.read_bytes() != (tmp_path / "plain.png").read_bytes(), "hollow markers and the star are drawn"


def test_memory_rows_that_do_not_fit(tmp_path):
    """llama-3-8b on 8 H100 at ZeRO-0..3 exceeds 80 GB: bars outlined, capacity line below the tops."""
    spec, hw = load_model("llama-3-8b"), load_hardware("h100")
    layout = Layout(dp=8, tp=1, pp=1, micro_batch=1, grad_accum=1, attention=hw.default_attention,
                    recompute="none", compiled=False)
    rows = zero_rows(spec, hw, Setup(layout=layout), [0, 3])
    assert not rows[0]["fits"]
    path = tmp_path / "m.png"
    plot.plot_memory(rows, path, title="llama-3-8b on 8 x h100", capacity_gib=hw.memory.usable_gib.value)
    _check_written(path, "png")


def test_plan_rows_one_line_per_family(tmp_path, table_rows):
    """Plan rows (several layouts per family and GPU count, no fits/basis keys): one point per family and count."""
    rows = []
    for i, r in enumerate(table_rows[0]):
        rows.append({k: r[k] for k in plot.SCENARIO_KEYS} | {
            "hardware": "mi300x", "attention": r["attention"], "recompute": "none", "dp": r["gpus"], "tp": 1,
            "pp": 1, "zero": 1, "family": ("pure DP", "+ZeRO/FSDP")[i % 2]})
    path = tmp_path / "plan.png"
    plot.plot_scenarios(rows, path, title="plan")
    _check_written(path, "png")
    plot.plot_scenarios(rows, tmp_path / "plan2.svg", title="plan", series=("attention", "recompute"),
                        best="cost_usd")
    assert (tmp_path / "plan2.svg").stat().st_size > 1000


def test_output_is_reproducible(tmp_path, table_rows, memory_rows):
    for fmt in ("png", "svg"):
        a, b = tmp_path / f"a.{fmt}", tmp_path / f"b.{fmt}"
        for p in (a, b):
            plot.plot_scenarios(table_rows[0], p, title="same")
        assert a.read_bytes() == b.read_bytes()
        for p in (a, b):
            plot.plot_memory(memory_rows[0], p, title="same", capacity_gib=memory_rows[1])
        assert a.read_bytes() == b.read_bytes()


def test_svg_has_no_date(tmp_path, memory_rows):
    path = tmp_path / "m.svg"
    plot.plot_memory(memory_rows[0], path, title="m", capacity_gib=memory_rows[1])
    assert "<dc:date>" not in path.read_text()


def test_overwrites_atomically(tmp_path, memory_rows):
    path = tmp_path / "m.png"
    path.write_bytes(b"old")
    plot.plot_memory(memory_rows[0], path, title="m", capacity_gib=memory_rows[1])
    _check_written(path, "png")


@pytest.mark.parametrize("name", ["plot.pdf", "plot.jpg", "plot", "plot.png.txt"])
def test_bad_suffix_raises_value_error(tmp_path, table_rows, memory_rows, name):
    with pytest.raises(ValueError, match="must end in .png or .svg"):
        plot.plot_scenarios(table_rows[0], tmp_path / name, title="t")
    with pytest.raises(ValueError, match="must end in .png or .svg"):
        plot.plot_memory(memory_rows[0], tmp_path / name, title="m", capacity_gib=memory_rows[1])
    assert list(tmp_path.iterdir()) == []


def test_upper_case_suffix_is_accepted(tmp_path, memory_rows):
    path = tmp_path / "M.PNG"
    plot.plot_memory(memory_rows[0], path, title="m", capacity_gib=memory_rows[1])
    _check_written(path, "png")


def test_bad_rows_raise_value_error(tmp_path, table_rows, memory_rows):
    with pytest.raises(ValueError, match="no rows"):
        plot.plot_scenarios([], tmp_path / "t.png", title="t")
    with pytest.raises(ValueError, match="no rows"):
        plot.plot_memory([], tmp_path / "m.png", title="m", capacity_gib=1.0)
    with pytest.raises(ValueError, match="not decision-table or plan rows"):
        plot.plot_scenarios(memory_rows[0], tmp_path / "t.png", title="t")
    with pytest.raises(ValueError, match="not memory rows"):
        plot.plot_memory(table_rows[0], tmp_path / "m.png", title="m", capacity_gib=1.0)
    with pytest.raises(ValueError, match="capacity_gib"):
        plot.plot_memory(memory_rows[0], tmp_path / "m.png", title="m", capacity_gib=0.0)
    with pytest.raises(ValueError, match="series keys nope"):
        plot.plot_scenarios(table_rows[0], tmp_path / "t.png", title="t", series="nope")
    with pytest.raises(ValueError, match="best"):
        plot.plot_scenarios(table_rows[0], tmp_path / "t.png", title="t", best="mfu_pct")
    assert list(tmp_path.iterdir()) == []


def test_render_error_leaves_no_temporary_file(tmp_path, table_rows, monkeypatch):
    """If rendering fails halfway, the target is untouched and the temporary file is removed."""
    from matplotlib.figure import Figure

    def boom(self, *args, **kwargs):
        raise RuntimeError("render failed")

    monkeypatch.setattr(Figure, "savefig", boom)
    path = tmp_path / "t.png"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="render failed"):
        plot.plot_scenarios(table_rows[0], path, title="t")
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["t.png"]


def test_identical_scenarios_share_one_line():
    """sdpa-math ignores the window pattern: its SSSL and L rows are equal and get one line, both named."""
    row = {k: 1.0 for k in plot.SCENARIO_KEYS[1:]}
    lines = {("sdpa-math", "SSSL"): {1: row}, ("sdpa-math", "L"): {1: dict(row)}, ("fa3", "L"): {1: row | {
        "wall_clock_h": 2.0}}}
    labels = plot._merge_identical(lines)
    assert labels == {("sdpa-math", "SSSL"): "sdpa-math, SSSL = L", ("fa3", "L"): "fa3, L"}
    assert list(lines) == [("sdpa-math", "SSSL"), ("fa3", "L")]


def test_scenarios_that_differ_in_flags_are_not_merged():
    row = {k: 1.0 for k in plot.SCENARIO_KEYS[1:]} | {"fits": True, "basis": "model"}
    lines = {("a", "SSSL"): {1: row}, ("a", "L"): {1: row | {"basis": "measured"}}}
    assert plot._merge_identical(lines) == {("a", "SSSL"): "a, SSSL", ("a", "L"): "a, L"}


# Issue 14 item 7: the best series per family drawn in full, others faded; legend swatches that are the bands as
# drawn; the limit a setup must stay under ((1 - headroom) x usable) drawn on the memory plot.

@pytest.fixture(scope="module")
def plan_rows() -> list[dict]:
    """What `ddplan plan --model d24 --gpus 8,16 --hardware h100,mi300x --plot` draws: the real search's rows,
    the fastest layout of each family per GPU count and hardware (ddplan.plan.best_per_family)."""
    from ddplan import render
    from ddplan.plan import PlanRequest, best_per_family, search

    req = PlanRequest(model=load_model("d24"), hardware=(load_hardware("h100"), load_hardware("mi300x")),
                      gpus=(8, 16))
    return best_per_family(render.plan_data(search(req).rows))


def _drawn_lines(ax) -> list:
    """The lines of an axis that have data and a line style (not the marker-only overlays)."""
    return [ln for ln in ax.get_lines() if len(ln.get_xdata()) and ln.get_linestyle() not in ("None", "none", "")]


def _same_rgba(a, b) -> bool:
    from matplotlib.colors import to_rgba

    return all(abs(x - y) < 1e-9 for x, y in zip(to_rgba(a), to_rgba(b)))


def test_plan_plot_draws_the_best_series_per_family_and_fades_the_rest(tmp_path, plan_rows):
    families = {r["family"] for r in plan_rows}
    series = {(r["family"], r["hardware"]) for r in plan_rows}
    assert len(families) >= 3 and len(series) == 2 * len(families), "two hardware: two series per family"
    fastest = {f: min((r for r in plan_rows if r["family"] == f), key=lambda r: r["wall_clock_h"])["hardware"]
               for f in families}
    fig = plot.plot_scenarios(plan_rows, tmp_path / "plan.png", title="plan")
    for ax in fig.axes[:2]:
        lines = _drawn_lines(ax)
        full = [ln for ln in lines if ln.get_alpha() in (None, 1.0)]
        faded = [ln for ln in lines if ln.get_alpha() == plot.FADED_ALPHA]
        assert len(full) == len(families)
        assert len(faded) == len(series) - len(families)
        assert all(ln.get_linewidth() < min(f.get_linewidth() for f in full) for ln in faded)
        assert len(ax.collections) == len(families), "a band for the full series only"
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert sorted(labels[:len(families)]) == sorted(f"{f}, {hw}" for f, hw in fastest.items())
    assert labels[len(families):] == [f"faded: the same family, other hardware ({len(families)})"]


def test_plan_plot_by_cost_draws_each_familys_cheapest_series(tmp_path, plan_rows):
    families = {r["family"] for r in plan_rows}
    cheapest = {f: min((r for r in plan_rows if r["family"] == f), key=lambda r: r["cost_usd"])["hardware"]
                for f in families}
    fig = plot.plot_scenarios(plan_rows, tmp_path / "plan.svg", title="plan", best="cost_usd")
    labels = [t.get_text() for t in fig.legends[0].get_texts()][:len(families)]
    assert sorted(labels) == sorted(f"{f}, {hw}" for f, hw in cheapest.items())


def test_legend_swatches_are_the_bands_as_drawn(tmp_path, plan_rows, table_rows):
    """Each series' legend swatch has its band's fill colour and alpha (no grey swatch matching nothing), and the
    line drawn over the swatch is the series' line colour."""
    from matplotlib.patches import Rectangle

    for rows in (plan_rows, table_rows[0]):
        fig = plot.plot_scenarios(rows, tmp_path / "p.png", title="p")
        legend = fig.legends[0]
        swatches = [p.get_facecolor() for p in legend.findobj(Rectangle) if p.get_figure() is not None
                    and p is not legend.legendPatch and p.get_facecolor()[3] < 1]
        bands = [tuple(c.get_facecolor()[0]) for c in fig.axes[0].collections]  # time: shaded bands
        assert len(swatches) == len(bands) and all(_same_rgba(s, b) for s, b in zip(swatches, bands))
        assert all(b[3] == pytest.approx(plot.BAND_ALPHA) for b in bands)
        bars = [tuple(c.get_color()[0]) for c in fig.axes[1].collections]  # cost: bars in the series' colour
        assert len(bars) == len(swatches) and all(_same_rgba((*s[:3], 1.0), (*b[:3], 1.0))
                                                  for s, b in zip(swatches, bars))
        legend_lines = [ln.get_color() for ln in legend.findobj(lambda a: a.__class__.__name__ == "Line2D")
                        if ln.get_linestyle() not in ("None", "none", "") and ln.get_alpha() in (None, 1.0)]
        for s in swatches:
            assert any(_same_rgba(c, (*s[:3], 1.0)) for c in legend_lines), "the line over the swatch"
        assert not any(_same_rgba(p.get_facecolor(), "grey") for p in legend.findobj(Rectangle))


def test_table_plot_fades_nothing(tmp_path, table_rows):
    """Table rows have no family: every scenario is a full line with its band."""
    rows = table_rows[0]
    fig = plot.plot_scenarios(rows, tmp_path / "t.png", title="t")
    lines = _drawn_lines(fig.axes[0])
    assert not [ln for ln in lines if ln.get_alpha() == plot.FADED_ALPHA]
    assert len([ln for ln in lines if ln.get_alpha() in (None, 1.0)]) == len(fig.axes[0].collections) > 1


def _hlines_at(ax) -> list[float]:
    return [ln.get_ydata()[0] for ln in ax.get_lines() if len(set(ln.get_ydata())) == 1]


def test_memory_plot_draws_the_limit_at_95_percent_of_usable(tmp_path):
    """llama-3-8b on 8 x H100 (usable 79.7 GiB): the usable line and the limit at 0.95 x usable, labelled."""
    spec, hw = load_model("llama-3-8b"), load_hardware("h100")
    layout = Layout(dp=8, tp=1, pp=1, micro_batch=1, grad_accum=1, attention=hw.default_attention,
                    recompute="none", compiled=False)
    rows = zero_rows(spec, hw, Setup(layout=layout), [0, 3])
    usable = hw.memory.usable_gib.value
    fig = plot.plot_memory(rows, tmp_path / "m.png", title="m", capacity_gib=usable)
    (ax,) = fig.axes
    ys = _hlines_at(ax)
    assert any(y == pytest.approx(usable) for y in ys) and any(y == pytest.approx(0.95 * usable) for y in ys)
    texts = [t.get_text().replace("\n", " ") for t in ax.texts]
    assert f"95% of usable: {0.95 * usable:.1f} GiB" in texts
    assert f"95% of usable: {0.95 * usable:.1f} GiB" == "95% of usable: 75.7 GiB"

    fig = plot.plot_memory(rows, tmp_path / "m.png", title="m", capacity_gib=usable, headroom=0.025)
    assert any(y == pytest.approx(0.975 * usable) for y in _hlines_at(fig.axes[0]))
    texts = [t.get_text().replace("\n", " ") for t in fig.axes[0].texts]
    assert f"97.5% of usable: {0.975 * usable:.1f} GiB" in texts
    fig = plot.plot_memory(rows, tmp_path / "m.png", title="m", capacity_gib=usable, headroom=0.0)
    assert len(_hlines_at(fig.axes[0])) == 1, "no headroom: the limit is the usable line"
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match="headroom"):
            plot.plot_memory(rows, tmp_path / "m.png", title="m", capacity_gib=usable, headroom=bad)


def test_memory_bars_without_fits_are_judged_against_the_limit(tmp_path, memory_rows):
    """A row without `fits` does not fit when its total is over (1 - headroom) x usable, though under usable."""
    rows, usable = memory_rows
    row = {k: v for k, v in rows[0].items() if k != "fits"}
    between = 0.97 * usable / row["total_gib"]
    row = {k: (v * between if k.endswith("_gib") and k != "usable_gib" else v) for k, v in row.items()}
    fig = plot.plot_memory([row], tmp_path / "m.png", title="m", capacity_gib=usable)
    assert any("does not fit" in t.get_text() for t in fig.axes[0].texts)
    fig = plot.plot_memory([row], tmp_path / "m.png", title="m", capacity_gib=usable, headroom=0.0)
    assert not any("does not fit" in t.get_text() for t in fig.axes[0].texts)


def test_validation_legend_swatches_are_the_bars(tmp_path):
    """The shipped runs, scored as `ddplan validate` scores them: each source's swatch is its bar's colour and
    alpha."""
    from matplotlib.colors import to_rgba
    from matplotlib.lines import Line2D

    from ddplan import validation
    from ddplan.runs import load_runs, shipped_dataset

    rows = [s.row() for s in validation.score_all(load_runs(None), shipped_dataset())]
    fig = plot.plot_validation(rows, tmp_path / "v.png", title="v")
    (ax,) = fig.axes
    bars = [tuple(c.get_color()[0]) for c in ax.collections if c.__class__.__name__ == "LineCollection"]
    swatches = [to_rgba(ln.get_color(), ln.get_alpha()) for ln in ax.get_legend().findobj(Line2D)
                if ln.get_alpha() == plot.VALIDATION_BAR_ALPHA]
    assert len(bars) == len({r["source"] for r in rows}) == len(swatches)
    assert all(_same_rgba(s, b) for s, b in zip(swatches, bars))


def test_cli_passes_headroom_and_plan_fades(capsys, tmp_path):
    """Through the CLI: memory's --headroom reaches the plot; plan over two hardware fades the slower series.
    (The SVG keeps each text as a comment.)"""
    from cli_helpers import run_ok

    path = tmp_path / "m.svg"
    run_ok(capsys, ["memory", "-m", "llama-3-8b", "--hardware", "h100", "--gpus", "8", "--headroom", "0.1",
                    "--format", "csv", "--plot", str(path)])
    svg = path.read_text()
    assert "90% of usable:" in svg and "95% of usable" not in svg
    path = tmp_path / "p.svg"
    run_ok(capsys, ["plan", "--model", "d24", "--gpus", "8", "--hardware", "h100,mi300x", "--format", "csv",
                    "--plot", str(path)])
    assert "faded: the same family, other hardware" in path.read_text()


def test_plot_file_gets_the_umask_permissions(tmp_path, memory_rows):
    import os

    from ddplan.files import _umask

    path = tmp_path / "m.png"
    plot.plot_memory(memory_rows[0], path, title="m", capacity_gib=memory_rows[1])
    assert path.stat().st_mode & 0o777 == 0o666 & ~_umask()
    assert os.access(path, os.R_OK)


def test_title_keeps_its_line_breaks(tmp_path, memory_rows):
    fig = plot.plot_memory(memory_rows[0], tmp_path / "m.png", title="first line\nsecond",
                           capacity_gib=memory_rows[1])
    assert fig.get_suptitle() == "first line\nsecond"


def test_plan_plot_shows_the_decision(tmp_path, plan_rows):
    """Issue 38: a plan's plot marks its choice on both panels and draws the budget on the cost panel and the
    deadline on the time panel (dashed red, inside the value axis), each named in the legend."""
    choice = min(plan_rows, key=lambda r: r["wall_clock_h"])
    budget = 2 * max(r["cost_usd"] for r in plan_rows)  # above every row: the axis must reach it
    fig = plot.plot_scenarios(plan_rows, tmp_path / "plan.png", title="plan", choice=choice, budget_usd=budget,
                              deadline_h=choice["wall_clock_h"] * 1.5)
    ax_time, ax_cost = fig.axes[:2]
    for ax, v, limit in ((ax_time, "wall_clock_h", choice["wall_clock_h"] * 1.5), (ax_cost, "cost_usd", budget)):
        rings = [ln for ln in ax.lines if ln.get_marker() == "o" and ln.get_markerfacecolor() == "none"]
        assert [(list(ln.get_xdata()), list(ln.get_ydata())) for ln in rings] == [([choice["gpus"]], [choice[v]])]
        dashed = [ln for ln in ax.lines if ln.get_linestyle() == "--" and ln.get_color() == plot.LIMIT_COLOUR]
        assert len(dashed) == 1 and list(dashed[0].get_ydata()) == [limit, limit]
        assert ax.get_ylim()[1] >= limit
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert f"the choice: {choice['gpus']}x {choice['hardware']}" in labels
    assert f"budget ${budget:,.0f}" in labels and any(t.startswith("deadline ") for t in labels)


def test_quiet_plan_still_plots_and_fails_a_missed_budget(tmp_path, capsys):
    """-q prints the answer only; the plot is still written and a budget no layout meets still exits 1."""
    argv = ["plan", "--model", "d24", "--gpus", "8,16", "-q"]
    assert cli.main([*argv, "--plot", str(tmp_path / "p.png")]) == 0 and (tmp_path / "p.png").stat().st_size > 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith("Choice: ")
    assert cli.main([*argv, "--budget", "1"]) == 1


def test_the_memory_plot_shows_the_proposed_fix(tmp_path, memory_rows):
    """Issue 38: `ddplan memory --plot` draws the fix it proposes as one more bar after the stages, at its total,
    labelled with the changes; a fix of no memory is refused."""
    rows, capacity = memory_rows
    fig = plot.plot_memory(rows, tmp_path / "m.png", title="m", capacity_gib=capacity,
                           fix=("device batch 1 (accumulation 16 -> 64) + ZeRO-3", 59.0, "fits"))
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert len(labels) == len(rows) + 1 and labels[-1].startswith("fix: device batch 1")
    assert any(t.get_text() == "59.0 GiB\nfits" for t in ax.texts)
    fig = plot.plot_memory(rows, tmp_path / "o.png", title="m", capacity_gib=capacity, fix=("x", 75.1, "may not fit"))
    assert any(t.get_text() == "75.1 GiB\nmay not fit" for t in fig.axes[0].texts)  # as its verdict says
    with pytest.raises(ValueError):
        plot.plot_memory(rows, tmp_path / "n.png", title="m", capacity_gib=capacity, fix=("x", 0.0, "fits"))


def test_the_cost_panel_draws_bands_as_bars_side_by_side(tmp_path, table_rows):
    """Issue 38: shaded bands covered each other on the cost panel, whose lines lie close; there each band is a
    bar at its point (no shaded area), the series' bars a little apart, each spanning its row's low-high cost."""
    from matplotlib.collections import LineCollection, PolyCollection

    rows = table_rows[0]
    fig = plot.plot_scenarios(rows, tmp_path / "t.png", title="t")
    ax_time, ax_cost = fig.axes[:2]
    assert any(isinstance(c, PolyCollection) for c in ax_time.collections)
    assert not any(isinstance(c, PolyCollection) for c in ax_cost.collections)
    bars = [seg for c in ax_cost.collections if isinstance(c, LineCollection) for seg in c.get_segments()]
    spans = {(round(min(s[:, 1]), 6), round(max(s[:, 1]), 6)) for s in bars}
    assert spans <= {(round(r["cost_low_usd"], 6), round(r["cost_high_usd"], 6)) for r in rows}
    assert len(bars) == sum(len(ln.get_xdata()) for ln in _drawn_lines(ax_cost))  # one bar per point drawn
    assert len({round(s[0, 0], 9) for s in bars}) > len({r["gpus"] for r in rows})  # apart, not stacked
