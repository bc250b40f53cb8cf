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
