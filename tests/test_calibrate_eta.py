"""The time left of a calibration, re-estimated from the run's own speed (ddplan.calibrate.eta): hand-computed
cases on a fake clock, no timing and no sleeping."""

from __future__ import annotations

import pytest

from ddplan.calibrate import eta as eta_
from ddplan.calibrate.eta import (BENCH_SHARE_AS_PROBE, PRIOR_WEIGHT_S, STEP_SHARE_AS_PROBE, Eta, probe_ratio,
                                speed_ratio, step_prior)
from ddplan.registry import load_model

W = PRIOR_WEIGHT_S["bench"]


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_speed_ratio_starts_at_the_prior_and_tends_to_the_measured_ratio():
    """No work done: the prior. 20 s spent on 10 s of estimated work, prior 1 weighing 5 s: (20 + 5) / (10 + 5)
    = 5/3. After 2,000 s on 1,000 s estimated the prior no longer counts: 2 within 0.5%. Weight 0: measured at once."""
    assert speed_ratio(0.0, 0.0, 1.0, 5.0) == 1.0 and speed_ratio(0.0, 0.0, 3.0, 0.0) == 3.0
    assert speed_ratio(20.0, 10.0, 1.0, 5.0) == pytest.approx(5 / 3, rel=1e-12)
    assert speed_ratio(2000.0, 1000.0, 1.0, 5.0) == pytest.approx(2.0, rel=0.005)
    assert speed_ratio(3.0, 1.0, 8.0, 0.0) == 3.0
    with pytest.raises(ValueError):
        speed_ratio(-1.0, 1.0, 1.0, 5.0)


def test_after_the_first_stage_took_twice_its_estimate_the_rest_takes_about_twice_its_estimate():
    """Stages estimated at 100, 200 and 300 s; the first took 200 s. The 500 s left are scaled by
    (200 + w) / (100 + w), w = PRIOR_WEIGHT_S: 976 s, within 5% of twice 500."""
    clock = Clock()
    eta = Eta((100.0, 200.0, 300.0), ("bench",) * 3, clock)
    clock.now = 3.0  # setting up before the first stage: no stage's time
    eta.begin(0)
    assert eta.left_s() == 600.0  # nothing measured yet: the pre-run estimate
    clock.now = 203.0
    eta.begin(1)
    assert eta.left_s() == pytest.approx(500.0 * (200.0 + W) / (100.0 + W), rel=1e-12)
    assert eta.left_s() == pytest.approx(2 * 500.0, rel=0.05)
    assert eta.elapsed_s() == 203.0


def test_a_faster_machine_shortens_the_rest_in_the_same_proportion():
    """The first stage, estimated at 100 s, took 50 s: the 500 s left become 500 x 55 / 105 = 238 s."""
    clock = Clock()
    eta = Eta((100.0, 200.0, 300.0), ("bench",) * 3, clock)
    eta.begin(0)
    clock.now = 50.0
    eta.begin(1)
    assert eta.left_s() == pytest.approx(500.0 * (50.0 + W) / (100.0 + W), rel=1e-12)


def test_parts_of_a_stage_set_the_speed_before_the_stage_ends():
    """Stages of 40 and 60 s; half the first (20 s estimated) done after 10 s: ratio (10 + 5) / (20 + 5) = 0.6,
    left 0.6 x (20 + 60) = 48 s; two seconds later, with no report since, 46 s (the work in flight)."""
    clock = Clock()
    eta = Eta((40.0, 60.0), ("bench", "bench"), clock)
    eta.begin(0)
    clock.now = 10.0
    eta.advance(0.5)
    assert eta.ratio("bench") == pytest.approx(0.6, rel=1e-12)
    assert eta.left_s() == pytest.approx(48.0, rel=1e-12)
    clock.now = 12.0
    assert eta.left_s() == pytest.approx(46.0, rel=1e-12)


def test_a_stage_over_its_estimate_leaves_the_later_stages_whole():
    """Stages of 10 and 30 s; the first runs on for 100 s without a report: the time left stops at the second
    stage's 30 s (ratio 1: nothing measured yet), it does not go negative."""
    clock = Clock()
    eta = Eta((10.0, 30.0), ("bench", "bench"), clock)
    eta.begin(0)
    clock.now = 100.0
    assert eta.left_s() == 30.0


def test_the_step_goes_as_the_probe_says_until_a_step_has_run_then_as_it_ran():
    """Benchmarks of 20 s, then a step stage of 4 steps of 2 s. The benchmarks ran at their estimate (20 s); the
    probe, after its cold first run, took 6 ms on average against 2 ms quiet (3x): the step is estimated at
    1 + 0.5 x (3 - 1) = 2 times its 8 s. One step (a quarter of the stage) done in 10 s: the three left take
    3 x 10 = 30 s, whatever the probe said (a step measures the rest)."""
    clock = Clock()
    eta = Eta((20.0, 8.0), ("bench", "step"), clock, probe_quiet_s=2e-3)
    eta.begin(0)
    assert eta.left_s() == 28.0  # no probe yet: the step goes as the benchmarks, at their estimate
    eta.probed(16e-3)  # cold: left out
    assert eta.left_s() == 28.0
    for seconds in (6e-3, 5e-3, 7e-3):
        eta.probed(seconds)
    clock.now = 20.0
    eta.begin(1)
    assert eta.ratio("step") == pytest.approx(1.0 + STEP_SHARE_AS_PROBE * (3.0 - 1.0), rel=1e-12) == 2.0
    assert eta.left_s() == pytest.approx(16.0, rel=1e-12)
    clock.now = 30.0
    eta.advance(0.25)
    assert eta.left_s() == pytest.approx(30.0, rel=1e-12)


def test_without_a_quiet_probe_time_the_step_goes_as_the_benchmarks_went():
    """On a GPU (no quiet probe time to compare with) the probe is ignored: benchmarks estimated at 20 s took
    40 s, ratio (40 + 5) / (20 + 5) = 1.8, and the 8 s step is estimated at 14.4 s."""
    clock = Clock()
    eta = Eta((20.0, 8.0), ("bench", "step"), clock)
    eta.begin(0)
    eta.probed(6e-3)
    clock.now = 40.0
    eta.begin(1)
    assert eta.left_s() == pytest.approx(8.0 * 45.0 / 25.0, rel=1e-12)


def test_the_probe_ratio_is_the_mean_after_the_cold_first_over_the_quiet_time():
    """(16 ms cold,) 6, 2 and 16 ms against 2 ms quiet: mean 8 ms, 4x; the step's share that goes as the probe
    makes a 3x probe 2x, and a probe twice as fast as quiet makes the step 1 - 0.5 x 0.5 = 0.75x."""
    assert probe_ratio([16e-3, 6e-3, 2e-3, 16e-3], 2e-3) == pytest.approx(4.0, rel=1e-12)
    assert probe_ratio([16e-3], 2e-3) is None and probe_ratio([], 2e-3) is None
    assert step_prior(3.0) == pytest.approx(2.0, rel=1e-12) and step_prior(0.5) == pytest.approx(0.75, rel=1e-12)
    with pytest.raises(ValueError):
        probe_ratio([0.0, 1e-3], 2e-3)
    with pytest.raises(ValueError):
        Eta((), (), Clock())
    with pytest.raises(ValueError):
        Eta((1.0,), ("gpu",), Clock())


def test_done_fractions_weigh_parts_by_their_estimate():
    assert eta_.done_fractions([1.0, 1.0, 2.0]) == [0.25, 0.5, 1.0]
    assert eta_.done_fractions([0.0, 0.0]) == [0.5, 1.0]
    assert eta_.done_fractions([]) == []


def test_the_pre_run_figures_by_hand():
    """A GEMM shape: the fixed cost plus its one call's GFLOP (1000^3: 2 GFLOP) at the VM's rate; a step of d4 at
    4 x 256: nanochat's 72.9 GFLOP on the line, 0.2 + 0.030 x 72.9 = 2.39 s (2.10 s measured); d2's optimizer:
    AdamW alone is the fixed part, Muon's 1.26 GFLOP adds 0.07 s."""
    assert eta_.gemm_part_s(1000, 1000, 1000, True) == pytest.approx(
        eta_.GEMM_PART_FIXED_S[True] + 2.0 * eta_.GEMM_PART_S_PER_GFLOP, rel=1e-12)
    d4 = load_model("d4")
    assert eta_.step_s(d4.architecture, 4, 256) == pytest.approx(0.2 + 0.030 * 72.880668672, rel=1e-9)
    assert eta_.optimizer_stage_s(load_model("d2")) == pytest.approx(4.5 + 0.054 * 1.25829145, rel=1e-6)


def test_probes_before_the_run_set_the_first_estimate_of_both_kinds():
    """Benchmarks estimated at 20 s and a step at 8 s; before the run the probe took (16 ms cold,) 6, 5 and 7 ms
    against 2 ms quiet: 3x. The benchmarks' prior is 1 + 0.1 x (3 - 1) = 1.2 (24 s), the step's 1 + 0.5 x 2 = 2
    (16 s): 40 s before any work, where without the probes it is 28 s. The same probes given after the start
    give the same estimate."""
    assert BENCH_SHARE_AS_PROBE == 0.1 and STEP_SHARE_AS_PROBE == 0.5
    probes = (16e-3, 6e-3, 5e-3, 7e-3)
    first = Eta((20.0, 8.0), ("bench", "step"), Clock(), probe_quiet_s=2e-3, first_probes_s=probes)
    assert first.left_s() == pytest.approx(40.0, rel=1e-12)
    later = Eta((20.0, 8.0), ("bench", "step"), Clock(), probe_quiet_s=2e-3)
    assert later.left_s() == 28.0
    for seconds in probes:
        later.probed(seconds)
    assert later.left_s() == pytest.approx(first.left_s(), rel=1e-12)
    # on a GPU (no quiet probe time) the probes change nothing
    assert Eta((20.0, 8.0), ("bench", "step"), Clock(), first_probes_s=probes).left_s() == 28.0
