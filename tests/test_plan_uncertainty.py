"""`ddplan plan` and its uncertainty: the top rows' wall-clock bands in the table, the runner-up on other
hardware or another GPU count labelled "within uncertainty" when its band overlaps the choice's, and a
choice at the edge of the GPU counts searched said so."""

from __future__ import annotations

import copy

import pytest

from ddplan import reasons
from ddplan.plan import PlanRequest, search
from ddplan.price import best_per_pair
from ddplan.registry import load_hardware, load_model

from cli_helpers import run_ok

GPT2_H100_COST = ["plan", "--model", "gpt2", "--hardware", "h100-sxm", "--gpus", "8,16", "--objective", "cost",
                  "--top", "5", "--format", "markdown"]


@pytest.fixture(scope="module")
def gpt2_cost():
    return search(PlanRequest(model=load_model("gpt2"), hardware=(load_hardware("h100-sxm"),), gpus=(8, 16),
                              objective="cost", top=5))


def test_markdown_rows_carry_their_band(capsys):
    out = run_ok(capsys, GPT2_H100_COST)
    header = next(line for line in out.splitlines() if line.startswith("| hardware"))
    names = [c.strip() for c in header.strip("|").split("|")]
    rows = [line for line in out.splitlines() if line.startswith("| h100-sxm")]
    assert len(rows) == 5
    for line in rows:
        cells = dict(zip(names, (c.strip() for c in line.strip("|").split("|"))))
        assert float(cells["wall_low_h"]) <= float(cells["wall_clock_h"]) <= float(cells["wall_high_h"])


def test_runner_up_within_uncertainty_and_the_edge(capsys, gpt2_cost):
    """gpt2 by cost on 8 or 16 H100: the best 16-GPU layout's cost band overlaps the choice's (8 GPUs), so it
    is named 'within uncertainty' with the choice's band; the choice is at 8, the fewest GPUs searched."""
    choice, other = best_per_pair(gpt2_cost.rows)[:2]
    assert (choice["gpus"], other["gpus"]) == (8, 16)
    assert other["cost_low_usd"] <= choice["cost_high_usd"] and choice["cost_low_usd"] <= other["cost_high_usd"]
    out = run_ok(capsys, GPT2_H100_COST)
    assert "- Runner-up, within uncertainty: 16x h100-sxm, dp 16," in out
    assert f"its band overlaps the choice's (${choice['cost_low_usd']:,.0f} to ${choice['cost_high_usd']:,.0f})" in out
    assert "- The choice is at the edge of the search, the fewest GPUs searched (8): try fewer GPUs" in out


def test_runner_up_outside_the_band(gpt2_cost):
    result = copy.copy(gpt2_cost)
    result.rows = [dict(r) for r in gpt2_cost.rows]
    other = best_per_pair(result.rows)[1]
    other.update(cost_low_usd=10 * other["cost_usd"], cost_high_usd=20 * other["cost_usd"])
    assert reasons.runner_up(result)[0].startswith("Runner-up: 16x h100-sxm")
    assert "the choice wins beyond ddplan's uncertainty" in reasons.runner_up(result)[0]


def test_no_runner_up_and_no_edge_with_one_pair(capsys):
    out = run_ok(capsys, ["plan", "--model", "d24", "--gpus", "8", "--format", "markdown"])
    assert "Runner-up" not in out and "edge of the search" not in out


def test_the_most_gpus_searched_is_an_edge():
    result = search(PlanRequest(model=load_model("d24"), hardware=(load_hardware("mi300x"),), gpus=(1, 8)))
    assert result.rows[0]["gpus"] == 8
    assert reasons.edge(result) == ["The choice is at the edge of the search, the most GPUs searched (8): try more "
                                    "GPUs (e.g. --gpus 8-32)."]
