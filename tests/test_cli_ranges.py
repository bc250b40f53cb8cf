"""`--gpus` ranges (A-B doubles from A up to B) and sets, `plan --hardware all`, and their bounds:
each error one line naming the flag, exit 2, no traceback."""

from __future__ import annotations

import pytest

from ddplan import inputs
from ddplan.errors import UsageError
from ddplan.plan import MAX_SEARCHES
from ddplan.registry import builtin_names

from cli_helpers import csv_rows, fails, run_ok


@pytest.mark.parametrize("text, expected", [
    ("1-512", [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]),
    ("8,16,32", [8, 16, 32]),
    ("1,8-64", [1, 8, 16, 32, 64]),
    ("3-48", [3, 6, 12, 24, 48]),  # doubling from A: powers of two only when A is one
    ("8-8", [8]),
    ("8-20", [8, 16]),  # B is an upper bound, not always reached
    ("8,4-16", [8, 4, 16]),  # each once, in the order given
])
def test_gpu_lists(text, expected):
    assert inputs.int_list(text, "--gpus", ranges=True) == expected


@pytest.mark.parametrize("text, words", [
    ("512-1", "runs backwards"),
    ("0-8", "[1, 1,000,000]"),
    ("1-2000000", "[1, 1,000,000]"),
    ("x-8", "doubling ranges"),
    ("8-", "doubling ranges"),
    ("1--8", "doubling ranges"),
])
def test_bad_gpu_ranges(text, words):
    with pytest.raises(UsageError) as e:
        inputs.int_list(text, "--gpus", ranges=True)
    assert e.value.field == "--gpus" and words in e.value.message


def test_ranges_only_where_asked():
    """--tp, --zero, ... stay plain integer lists."""
    with pytest.raises(UsageError):
        inputs.int_list("1-4", "--tp")


def test_table_takes_a_range(capsys):
    rows = csv_rows(run_ok(capsys, ["table", "--model", "d24", "--gpus", "1,8-32", "--attention", "flash-attn-ck",
                                    "--window", "SSSL", "--format", "csv"]))
    assert [r["gpus"] for r in rows] == ["1", "8", "16", "32"]


def test_plan_hardware_all_searches_every_builtin(capsys):
    rows = csv_rows(run_ok(capsys, ["plan", "--model", "gpt2", "--hardware", "all", "--gpus", "8", "--format",
                                    "csv"]))
    assert {r["hardware"] for r in rows} == set(builtin_names("hardware"))


@pytest.mark.parametrize("argv, flag", [
    (["plan", "--model", "d24", "--hardware", "all", "--gpus", "1-512"], "--hardware/--gpus"),
    (["plan", "--model", "d24", "--gpus", "64-8"], "--gpus"),
    (["table", "--model", "d24", "--gpus", "1-512", "--tp", "1,2", "--pp", "1,2", "--zero", "0,1,2,3",
      "--recompute", "none,full"],
     "--gpus/--tp/--pp/--zero/..."),
    (["table", "--model", "d24", "--hardware", "all"], "--hardware"),
    (["memory", "--model", "d24", "--hardware", "all"], "--hardware"),
])
def test_bounds_stay_one_line(capsys, argv, flag):
    code, line = fails(capsys, argv)
    assert code == 2 and line.startswith(f"error: {flag}: ")


def test_plan_bound_names_the_counts(capsys):
    _, line = fails(capsys, ["plan", "--model", "d24", "--hardware", "all", "--gpus", "1-512"])
    hardware = len(builtin_names("hardware"))
    assert f"{hardware * 10} (hardware, GPU count) pairs asked ({hardware} hardware x 10 GPU counts)" in line
    assert f"at most {MAX_SEARCHES}" in line
