"""Warnings on stderr: a flag shared by many rows is printed once and counted, identical lines once
with ' (xN)', and the most important warning is named in the verdict (on a terminal)."""

from __future__ import annotations

import re

import pytest
import yaml

from ddplan import cli, verdicts
from ddplan.registry import load_hardware, load_model
from ddplan.table import TableRequest, build_table

from cli_helpers import run

# 0.9 s/step for d24 on 8 x H100 at the recipe's batch is faster than the GPU can go: an implausible fit (stated
# with --measured-step-time an error since issue 33; a calibration file's own step is priced and flagged), and
# most rows shrink the device batch the same way
MEASURED_STEP = {"model": "nanochat-d24", "gpus": 8, "step_time_s": 0.9, "device_batch_size": 32,
                 "total_batch_tokens": 1048576, "attention": load_hardware("h100-sxm").default_attention,
                 "window_pattern": "SSSL", "source": "a test: the seed's d24 at an impossible speed"}
MEASURED = ["table", "--model", "d24", "--hardware", "h100-sxm", "--gpus", "8,16", "--calibration", "CAL"]


@pytest.fixture(autouse=True)
def _calibration(tmp_path, monkeypatch):
    """MEASURED's calibration file, written in each test's folder (the tests run there)."""
    (tmp_path / "CAL").write_text(yaml.safe_dump({"kind": "calibration", "version": 1, "hardware": "h100-sxm",
                                                  "step_times": [MEASURED_STEP]}), encoding="utf-8")
    monkeypatch.chdir(tmp_path)


def test_identical_lines_are_printed_once_and_counted(capsys):
    cli._warn(["same thing", "other", "same  thing", "same thing"])
    assert capsys.readouterr().err == "warning: same thing (x3)\nwarning: other\n"


def test_a_flag_shared_by_rows_is_printed_once(capsys):
    code, _, err = run(capsys, [*MEASURED, "--format", "csv"])
    assert code == 0
    # progress lines come only when the table takes over 2 s (cli._progress), as on a loaded machine: not warnings
    lines = [line for line in err.splitlines() if not re.fullmatch(r"table: .* \(\d+/\d+, \d+ s\)", line)]
    assert all(line.startswith("warning: ") for line in lines)
    assert len(lines) == len(set(lines))
    shrink = [line for line in lines if "does not fit in 79.65 GiB; using 16 (accumulation 1 -> 2" in line]
    assert len(shrink) == 1 and "(x6: 16x h100-sxm, sdpa-fused, SSSL and 5 more)" in shrink[0]
    tight = [line for line in lines if "may not fit" in line]  # a family of its own, each shared by several rows
    assert tight and all(re.search(r"\(x[2-9]: ", line) for line in tight)
    assert len(lines) - len(tight) < 10  # 17 flagged rows before


def test_json_keeps_every_row_warning(capsys):
    import json

    code, out, _ = run(capsys, [*MEASURED, "--format", "json"])
    assert code == 0
    warnings = json.loads(out)["warnings"]
    assert sum("does not fit in 79.65 GiB" in w for w in warnings) == 15


def test_the_verdict_names_the_most_important_warning_on_a_terminal(capsys, monkeypatch):
    """Implausible (faster than the GPU can go) outranks the batch changes; pipes keep their fixed layout."""
    from ddplan import render

    code, piped, _ = run(capsys, MEASURED)
    assert code == 0 and "Warning:" not in piped
    monkeypatch.setattr(render, "screen", lambda fmt, wide=False: render.Screen(width=200, wide=wide))
    code, out, _ = run(capsys, MEASURED)
    assert code == 0
    assert out.startswith("Answer: ")  # answer first, then the verdict, then the table
    verdict = out[:out.index("decision table")]
    assert "Warning: 8x h100-sxm, fa3, SSSL: implausible: sustains" in verdict


def test_no_flag_no_warning_line():
    assert verdicts.top_warning(build_table(TableRequest(model=load_model("gpt2"), hardware=load_hardware("h100-sxm"),
                                                         gpus=(8,), attentions=("sdpa-fused",)))) is None


def test_many_warnings_of_one_kind_are_cut_to_three_and_a_count(capsys):
    """d24's 512-sequence batch rounds up differently at each of 2^10 ... 2^19 GPUs (ten counts, six rows
    each: 3 attentions x 2 windows): three shown in full, the other seven as one line counting 7 x 6 rows."""
    code, _, err = run(capsys, ["table", "--model", "d24", "--gpus", "1024-524288", "--format", "csv"])
    assert code == 0
    lines = err.splitlines()
    rounded = [line for line in lines if line.startswith("warning: the total batch of 512 sequences")]
    assert [line.split("rounded up to ")[1].split(" ")[0] for line in rounded] == ["1,024", "2,048", "4,096"]
    rest = [line for line in lines if "more warnings of the kind above" in line]
    assert len(rest) == 1
    assert rest[0].startswith("warning: 7 more warnings of the kind above, on 42 rows (8192x mi300x, ")
    assert rest[0].endswith("the last: the total batch of 512 sequences does not split over the data-parallel ranks: "
                            "rounded up to 524,288 (a token budget then takes fewer steps); device batch 1, not 32; "
                            "far past the recipe's batch: beware the critical batch size (McCandlish et al. 2018)")
    assert lines.index(rest[0]) == lines.index(rounded[-1]) + 1  # where the fourth would have been
