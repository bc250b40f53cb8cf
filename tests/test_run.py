"""ddplan.run: steps of a budget, evaluation count, cost.

nanochat base_train.py @00255c1: target_tokens = int(target_param_data_ratio x num_scaling_params),
num_iterations = target_tokens // total_batch_size; the loop runs step = 0..num_iterations and
evaluates when `last_step or step % eval_every == 0`.
"""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from ddplan import run
from ddplan.params import scaling_params, total_params
from ddplan.registry import load_model
from ddplan.specs import Budget, Price


@pytest.fixture(scope="module")
def d24():
    return load_model("d24")


# --------------------------------------------------------------------------------------------
# steps_for


def test_steps_given(d24):
    assert run.steps_for(d24, Budget(steps=1234), 1_048_576) == 1234


def test_steps_from_tokens_round_up(d24):
    # 1e9 / 1,048,576 = 953.67 -> 954 steps; an exact multiple does not round
    assert run.steps_for(d24, Budget(tokens=10**9), 1_048_576) == 954
    assert run.steps_for(d24, Budget(tokens=100 * 1_048_576), 1_048_576) == 100
    assert run.steps_for(d24, Budget(tokens=1), 1_048_576) == 1


def test_steps_nanochat_d24_param_data_ratio(d24):
    """nanochat-d24 scaling params (block matrices + ve gates + lm_head):
    679,477,248 + 1,728 + 50,331,648 = 729,810,624; target tokens int(12 x 729,810,624) = 8,757,727,488;
    num_iterations = 8,757,727,488 // 1,048,576 = 8,352 (remainder 20,736 tokens dropped), as in
    nanochat base_train.py `num_iterations = target_tokens // total_batch_size`."""
    assert scaling_params(d24.architecture) == 729_810_624
    assert d24.recipe.budget == Budget(param_data_ratio=12.0, ratio_params="scaling")
    assert d24.recipe.total_batch_tokens == 1_048_576
    assert 12 * 729_810_624 == 8_757_727_488 == 8352 * 1_048_576 + 20_736
    assert run.steps_for(d24, d24.recipe.budget, 1_048_576) == 8352


def test_steps_ratio_of_total_params_and_floor_of_one(d24):
    n = total_params(d24.architecture)
    assert run.steps_for(d24, Budget(param_data_ratio=20, ratio_params="total"), 1_048_576) == 20 * n // 1_048_576
    # a tiny ratio still trains one step
    assert run.steps_for(d24, Budget(param_data_ratio=1e-9), 1_048_576) == 1


def test_steps_gpt2_recipe():
    g = load_model("gpt2-124m")
    assert run.steps_for(g, g.recipe.budget, g.recipe.total_batch_tokens) == 600_000


def test_budget_needs_exactly_one():
    with pytest.raises(ValidationError):
        Budget(steps=10, tokens=10)
    with pytest.raises(ValidationError):
        Budget()


# --------------------------------------------------------------------------------------------
# evaluations


def test_evaluations_every_250_over_29000_steps():
    """Every 250 steps over 29,000 steps: 0, 250, ..., 29,000 -> 29,000 / 250 + 1 = 117 (the last is on the grid)."""
    assert run.evaluations(29000, 250) == 117


def test_evaluations_last_step_off_grid():
    """100 steps every 30: 0, 30, 60, 90 and the last step, 100 -> 5."""
    assert run.evaluations(100, 30) == 5


def test_evaluations_never():
    assert run.evaluations(100, 0) == 0
    assert run.evaluations(100, -1) == 0


@given(steps=st.integers(0, 5000), every=st.integers(1, 600))
def test_evaluations_match_nanochat_loop(steps, every):
    """base_train.py: for step in range(num_iterations + 1): evaluate if last_step or step % eval_every == 0."""
    loop = sum(1 for s in range(steps + 1) if s == steps or s % every == 0)
    assert run.evaluations(steps, every) == loop


# --------------------------------------------------------------------------------------------
# cost_usd and hours


def _price(billing):
    return Price(usd_per_gpu_hour=2.0, billing=billing, provider="test", date=dt.date(2026, 1, 1), source="test case")


def test_cost_per_gpu():
    assert run.cost_usd(_price("per_gpu"), 1, 8, 10.0) == pytest.approx(20.0)
    assert run.cost_usd(_price("per_gpu"), 12, 8, 1.0) == pytest.approx(24.0)


def test_cost_per_node_pays_for_whole_nodes():
    """One GPU on an offer billed per 8-GPU node pays for 8 GPUs: 8 x $2 x 10 h = $160."""
    assert run.cost_usd(_price("per_node"), 1, 8, 10.0) == pytest.approx(160.0)
    assert run.cost_usd(_price("per_node"), 8, 8, 10.0) == pytest.approx(160.0)
    assert run.cost_usd(_price("per_node"), 9, 8, 1.0) == pytest.approx(32.0)  # two nodes


def test_hours():
    assert run.hours(7200.0) == 2.0


def test_young_interval_by_hand():
    """Young (CACM 17(9), 1974): tau = sqrt(2 delta M); delta 180 s, M 178,560 s: sqrt(64,281,600) = 8,017.6 s."""
    from ddplan.run import young_interval_s

    assert young_interval_s(180, 178_560) == pytest.approx(8017.58, abs=0.01)


def test_goodput_by_hand():
    """100 h of steps on 1,024 GPUs at Llama 3's rate (419 / (54 x 24 x 16,384) = 1.9733e-5 a GPU-hour):
    M = 1 / (1.9733e-5 x 1,024) = 49.489 h; delta 180 s = 0.05 h: tau = sqrt(2 x 0.05 x 49.489) = 2.2246 h;
    checkpoints 100 / 2.2246 x 0.05 = 2.2476 h; interruptions (100 + 2.2476) / 49.489 = 2.0661, each 10 min +
    tau / 2 = 1.2790 h: 2.6425 h; lost 4.8901 h."""
    from ddplan.run import LLAMA3_INTERRUPTIONS_PER_GPU_HOUR, goodput

    assert LLAMA3_INTERRUPTIONS_PER_GPU_HOUR == pytest.approx(1.9733e-5, rel=1e-4)
    g = goodput(100 * 3600, 1024, LLAMA3_INTERRUPTIONS_PER_GPU_HOUR, 180, 600)
    assert g.mtbf_s / 3600 == pytest.approx(49.489, rel=1e-4)
    assert g.interval_s / 3600 == pytest.approx(2.2246, rel=1e-4)
    assert g.interruptions == pytest.approx(2.0661, rel=1e-4)
    assert g.lost_s / 3600 == pytest.approx(4.8901, rel=1e-4)
    # a cadence the user fixed (its checkpoints counted elsewhere): only interruptions x (restart + tau / 2)
    fixed = goodput(100 * 3600, 1024, LLAMA3_INTERRUPTIONS_PER_GPU_HOUR, 180, 600, interval_s=3600)
    assert fixed.lost_s / 3600 == pytest.approx(100 / 49.489 * (1 / 6 + 0.5), rel=1e-4)
    assert goodput(100 * 3600, 1024, 0.0, 180, 600).lost_s == 0.0


def test_a_month_on_1024_gpus_shows_the_interruptions_and_the_interval(capsys):
    """The table's goodput term: on 128 nodes it is in the wall-clock, with its checkpoint interval; on one node
    it is 0 unless a rate is given."""
    from cli_helpers import csv_rows, run_ok

    argv = ["table", "--model", "gpt3-175b", "--hardware", "h100-sxm", "--gpus", "1024", "--tp", "8", "--pp", "8",
            "--sequence-parallel", "--attention", "fa3", "--steps", "10000", "--format", "csv"]
    (r,) = csv_rows(run_ok(capsys, argv))
    train, lost, tau = float(r["train_h"]), float(r["interruptions_lost_h"]), float(r["checkpoint_interval_h"])
    assert 0 < lost < 0.1 * train and tau > 0
    assert float(r["wall_clock_h"]) == pytest.approx(train + float(r["outside_steps_h"]) + lost, rel=1e-9)
    (none,) = csv_rows(run_ok(capsys, argv + ["--interruptions-per-gpu-hour", "0"]))
    assert float(none["interruptions_lost_h"]) == 0.0
    (one,) = csv_rows(run_ok(capsys, ["table", "--model", "d24", "--gpus", "8", "--attention", "sdpa-fused",
                                      "--window", "L", "--format", "csv"]))
    assert float(one["interruptions_lost_h"]) == 0.0
