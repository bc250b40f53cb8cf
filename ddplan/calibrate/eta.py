"""How long the rest of a calibration will take, re-estimated from its own speed as it runs.

The pre-run estimate of each stage (ddplan.calibrate.runner.stage_estimates_s, from the figures here) is a
quiet run on this project's 2-core VM. Another machine, or the same one with a process beside the run, takes
longer: on the VM `calibrate -m d4 --device cpu --quick`, estimated at ~51 s, took 99-197 s beside one
CPU-bound process (issue 32). So what is left is each stage's estimate scaled by how long the work of its
kind took so far against its estimate, the runner saying how far into a stage it is (each GEMM shape,
attention point and training step), so the scale is known seconds into a stage, not only at its end.

Two kinds of stage, because they slow differently (quiet against busy runs of d4 on the VM): the
micro-benchmarks ("bench": torch's adaptive timer repeats a kernel for a time between its minimum and
maximum, so a slower machine mostly means more spread, not more time: 27 s quiet, 26-37 s busy) and the
held-out training step ("step": a fixed number of steps, so its time follows the machine: 8.8 s quiet,
17-45 s busy). The step's speed, before a step has run, is what the machine-speed probe says (step_prior);
one step done measures the rest, which repeat it.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from ddplan.anatomy import muon_matrices
from ddplan.flops import nanochat_flops_per_token
from ddplan.params import param_counts
from ddplan.specs import Architecture, ModelSpec
from ddplan.step import muon_gemm_shapes

# The pre-run estimate: each stage's seconds on a quiet run of this project's 2-core AMD EPYC VM (torch 2.13 CPU,
# fp32, malloc as it is), measured 2026-12-03 with `calibrate --device cpu --quick -m d2/d4/d6` (runs of 48, 54
# and 73 s, each in its own scheduler group at autogroup nice -20 so that another session's tests on the VM did
# not compete; tests/test_calibrate_runner.py has them per stage).
# Per GEMM shape (quick, full): a fixed cost (buffers, two warm-up calls, the adaptive timer's minimum and its
# repeats of a noisy kernel; a least-squares fit over the 142 shapes of those runs, 0.34 s) plus its calls'
# FLOPs (0.092 s per GFLOP of one call, for the ~6 calls a large shape gets); the full run's 0.9 s: the 1 s a
# shape a pass of 74-133 s full runs (42-51 shapes, two passes, d2-d6) less the FLOP term.
GEMM_PART_FIXED_S = {True: 0.34, False: 0.9}
GEMM_PART_S_PER_GFLOP = 0.092
ATTENTION_POINT_S = 1.0  # each (implementation, window) pair, forward and backward (3.7-4.4 s for 4 points)
# the means of d2, d4 and d6 (ranges: peak 0.4-1.2, HBM 0.7-2.5, elementwise 4.9-5.4, kernel overhead 0.7-2.4)
PEAK_SWEEP_S, HBM_S, ELEMENTWISE_S, KERNEL_OVERHEAD_S = 0.8, 1.9, 5.1, 1.8
# the optimizer stage: AdamW and each Muon stack, OPTIMIZER_FIXED_S + MUON_S_PER_GFLOP x the GFLOP of one Muon
# step; the line through d2 4.6 s (1.3 GFLOP) and d6 10.0 s (101.9), d4 5.1 s (20.1) on it within 10%
OPTIMIZER_FIXED_S, MUON_S_PER_GFLOP = 4.5, 0.054
COLLECTIVES_S = 30.0  # assumed: torchrun's start-up and a few sizes per collective (only with --nproc 2 or more)
STEP_BUILD_S = 1.0  # building the reference model and its optimizer for the held-out step (0.4-1.7 s)
# one eager training step: STEP_FIXED_S + STEP_S_PER_GFLOP x its GFLOP (nanochat's count), the least-squares
# line through d2 1.31 s (28.8 GFLOP at 4 x 256), d4 2.10 s (72.9) and d6 4.83 s (147.4)
STEP_FIXED_S, STEP_S_PER_GFLOP = 0.2, 0.030
PROBE_QUIET_S = 2.0e-3  # the machine-speed probe (bench.bench_probe_s, fp32) on those quiet runs: 1.8-2.1 ms

# assumed: the prior weighs as much as this many seconds of estimated benchmark work, so the first few
# benchmarks (a tiny GEMM takes 0.05 or 0.5 s on the same machine) do not swing the estimate by themselves
PRIOR_WEIGHT_S = {"bench": 5.0, "step": 0.0}  # a training step is the unit of its stage's work: one measures it


def speed_ratio(spent_s: float, estimated_s: float, prior: float, prior_weight_s: float) -> float:
    """How much slower than estimated the work goes: measured over estimated time of the work done so far.

    ratio = (spent + w x prior) / (estimated + w), w = prior_weight_s: the prior before any work is done,
    spent / estimated once the work done is much more than w (at once where w = 0). Ratio 2 = the machine
    does the work in twice the estimated time (on CPU, mostly a process beside the run taking cores).
    """
    if spent_s < 0 or estimated_s < 0 or prior <= 0 or prior_weight_s < 0:
        raise ValueError(f"need spent_s >= 0, estimated_s >= 0, prior > 0, prior_weight_s >= 0; got {spent_s}, "
                         f"{estimated_s}, {prior}, {prior_weight_s}")
    if estimated_s + prior_weight_s == 0:
        return prior
    return (spent_s + prior_weight_s * prior) / (estimated_s + prior_weight_s)


# The share of a CPU training step's time that slows as the machine-speed probe (a 2 ms two-thread GEMM) does;
# the rest (larger GEMMs, single-threaded small ops, page faults) slows less. Measured on the VM, d4 --quick,
# 2026-12-03, against quiet runs: one process beside the run made the probe 4.6x slower (mean) and the step
# 1.9-2.1x (a share of 0.3); another session's load and that process, 11x and 6.8x (0.6). Between the two:
# the probe sets the step's estimate only until one step has run.
STEP_SHARE_AS_PROBE = 0.5
# The same share for the micro-benchmarks, which slow far less (torch's adaptive timer bounds each one's time):
# one CPU-bound process beside d4 --quick on the VM, probe 4.6x slower, benchmarks 0.96-1.37x their quiet 27 s
# (shares 0-0.1; the docstring's runs); again 2026-12-03, probe 3.25x, benchmarks 56 s against 43.7 s estimated,
# 1.28x (0.12). Assumed 0.1: the prior until the benchmarks' own speed takes over (PRIOR_WEIGHT_S).
BENCH_SHARE_AS_PROBE = 0.1
# probes run before the first progress line, so its estimate already knows the machine's speed: the first runs
# cold and is left out (probe_ratio); ~10 ms each on the VM's CPU
FIRST_PROBES = 4


def probe_ratio(probes_s: list[float], quiet_s: float) -> float | None:
    """How much slower the machine runs than the quiet one the estimates are from, by the machine-speed
    probe: the mean of its times so far, less the first, over its time there. The first runs cold (12-16 ms
    against 2 ms after it on the quiet VM). The mean, not the median: on a busy CPU the probe's times cluster
    at a few values (2, 6, 16 and 24 ms on the VM, as a thread waits for a core for none, one or more
    scheduler slices), so a median jumps between them, while a training step averages over all of them.
    None before a second probe."""
    if min(probes_s, default=1.0) <= 0 or quiet_s <= 0:
        raise ValueError(f"need probe times > 0 and quiet_s > 0, got {probes_s}, {quiet_s}")
    return statistics.fmean(probes_s[1:]) / quiet_s if len(probes_s) > 1 else None


def step_prior(probe_over_quiet: float, share: float = STEP_SHARE_AS_PROBE) -> float:
    """How much slower than estimated a kind of work will run, from the probe's ratio: 1 + s x (ratio - 1),
    s = the share of its time that slows as the probe does (STEP_SHARE_AS_PROBE for the held-out step,
    BENCH_SHARE_AS_PROBE for the micro-benchmarks)."""
    if probe_over_quiet <= 0:
        raise ValueError(f"need a probe ratio > 0, got {probe_over_quiet}")
    return 1.0 + share * (probe_over_quiet - 1.0)


def gemm_part_s(m: int, n: int, k: int, quick: bool) -> float:
    """Estimated seconds to time one GEMM shape on the quiet VM: GEMM_PART_FIXED_S (buffers, two warm-up
    calls, the timer's minimum run time) + GEMM_PART_S_PER_GFLOP x the GFLOP of one call (2 m n k), which
    stands for the ~6 calls a large shape gets (warm-up, block-size estimate, timed blocks)."""
    return GEMM_PART_FIXED_S[quick] + GEMM_PART_S_PER_GFLOP * 2.0 * m * n * k / 1e9


def step_s(arch: Architecture, batch: int, seq_len: int) -> float:
    """Estimated seconds of one eager training step of batch x seq_len on the quiet VM: STEP_FIXED_S +
    STEP_S_PER_GFLOP x its GFLOP, nanochat's count (ddplan.flops.nanochat_flops_per_token x tokens)."""
    return STEP_FIXED_S + STEP_S_PER_GFLOP * nanochat_flops_per_token(arch, seq_len) * batch * seq_len / 1e9


def optimizer_stage_s(spec: ModelSpec) -> float:
    """Estimated seconds of the optimizer stage on the quiet VM: OPTIMIZER_FIXED_S + MUON_S_PER_GFLOP x the
    GFLOP of one Muon step of the model (every Muon matrix, ns_steps x its three Newton-Schulz GEMMs,
    ddplan.step.muon_gemm_shapes); an AdamW-only model has the fixed part alone."""
    opt, counts = spec.recipe.optimizer, param_counts(spec.architecture)
    flops = sum(opt.muon_ns_steps * 2.0 * m * n * k
                for g, algo in opt.algorithm.items() if algo == "muon" and counts[g]
                for rows, cols in muon_matrices(spec, g) for m, n, k in muon_gemm_shapes(rows, cols))
    return OPTIMIZER_FIXED_S + MUON_S_PER_GFLOP * flops / 1e9


def done_fractions(parts_s: tuple[float, ...] | list[float]) -> list[float]:
    """The fraction of a stage done after each of its parts: the running sum of the parts' estimated seconds
    over their total (equal shares where every part is estimated at zero)."""
    total, running, out = sum(parts_s), 0.0, []
    for i, part in enumerate(parts_s):
        running += part
        out.append(running / total if total > 0 else (i + 1) / len(parts_s))
    return out


# --------------------------------------------------------------------------------------------
# Re-estimating as the run goes


@dataclass
class Eta:
    """A run's progress (which stage, how far into it, when that was last said) and the time left from it.

    estimates_s and kinds: one per stage ("bench" or "step", PRIOR_WEIGHT_S). begin(i) at the start of
    stage i, advance(fraction) as parts of it finish, probed(seconds) after each machine-speed probe, which
    sets the priors of both kinds (step_prior of probe_ratio, each with its share) where probe_quiet_s is known
    (None, as on a GPU: the step goes as the rest of the run); left_s() re-estimates from the times of the reports. clock: seconds
    (time.monotonic; a fake one in tests).
    """

    estimates_s: tuple[float, ...]
    kinds: tuple[str, ...]
    clock: Callable[[], float] = time.monotonic
    probe_quiet_s: float | None = None
    first_probes_s: tuple[float, ...] = ()  # probes run before the first stage (FIRST_PROBES), as if probed()
    start: float = field(init=False)
    stage: int = field(init=False, default=0)
    fraction: float = field(init=False, default=0.0)
    tick: float = field(init=False)
    spent_s: list[float] = field(init=False)  # per stage, up to the last report
    priors: dict[str, float] = field(init=False, default_factory=lambda: {"bench": 1.0})  # the estimate, until probed
    probes_s: list[float] = field(init=False, default_factory=list)
    stage_start: float = field(init=False)
    begun: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        if not self.estimates_s or min(self.estimates_s) < 0 or len(self.kinds) != len(self.estimates_s):
            raise ValueError(f"need one estimate >= 0 and one kind per stage, got {self.estimates_s}, {self.kinds}")
        if set(self.kinds) - set(PRIOR_WEIGHT_S):
            raise ValueError(f"kinds must be among {', '.join(PRIOR_WEIGHT_S)}, got {self.kinds}")
        self.start = self.tick = self.stage_start = self.clock()
        self.spent_s = [0.0] * len(self.estimates_s)
        for seconds in self.first_probes_s:
            self.probed(seconds)

    def begin(self, stage: int) -> None:
        now = self.clock()
        if self.begun:  # the stage before is done: all its time counts (none before the first stage)
            self.spent_s[self.stage] = now - self.stage_start
        self.begun = True
        self.stage, self.fraction, self.tick, self.stage_start = min(stage, len(self.estimates_s) - 1), 0.0, now, now

    def advance(self, fraction: float) -> None:
        self.tick = self.clock()
        self.fraction = min(max(fraction, 0.0), 1.0)
        self.spent_s[self.stage] = self.tick - self.stage_start

    def probed(self, seconds: float) -> None:
        if seconds <= 0:  # not a time: nothing to learn from it
            return
        self.probes_s.append(seconds)
        ratio = probe_ratio(self.probes_s, self.probe_quiet_s) if self.probe_quiet_s is not None else None
        if ratio is not None:
            self.priors["step"] = step_prior(ratio)
            self.priors["bench"] = step_prior(ratio, BENCH_SHARE_AS_PROBE)

    def elapsed_s(self) -> float:
        return self.clock() - self.start

    def done_s(self) -> list[float]:
        """Estimated seconds of the work done in each stage: the stages before the current one whole, and
        the reported fraction of the current one."""
        return [e if i < self.stage else self.fraction * e if i == self.stage else 0.0
                for i, e in enumerate(self.estimates_s)]

    def ratio(self, kind: str) -> float:
        """speed_ratio of the work of `kind` done so far; its prior: the one set (1 for the benchmarks until probed, the
        probe's for the step), else the ratio of all the work done so far (the step, with no probe to go by,
        goes as the benchmarks went)."""
        done, spent = self.done_s(), self.spent_s
        prior = self.priors.get(kind) or speed_ratio(sum(spent), sum(done), 1.0, PRIOR_WEIGHT_S["bench"])
        mine = [i for i, k in enumerate(self.kinds) if k == kind]
        return speed_ratio(sum(spent[i] for i in mine), sum(done[i] for i in mine), prior, PRIOR_WEIGHT_S[kind])

    def left_s(self) -> float:
        """Seconds left: each stage's estimated work not yet done times the ratio of its kind, less the time
        since the last report (work in flight); at least the stages after the current one (a stage running
        over its estimate delays the rest, it does not shorten it)."""
        done = self.done_s()
        ratios = {k: self.ratio(k) for k in set(self.kinds)}
        todo = [ratios[k] * (e - d) for k, e, d in zip(self.kinds, self.estimates_s, done)]
        return max(sum(todo) - (self.clock() - self.tick), sum(todo[self.stage + 1:]))


PROGRESS_EVERY_S = 5.0  # calibrate's progress: a line at least this often, in every stage (issue 33)


class StageLines:
    """Calibrate's progress: the stage, its number, the elapsed time and the time left, re-estimated from the
    run's own speed (ddplan.calibrate.eta.Eta), shown at each stage's start and at least every every_s
    within one (show(text, stage index); by default a line on stderr). probe_quiet_s: the machine-speed
    probe's time where the estimates were made, first_probes_s: its times before the run (Eta). clock: seconds
    (a fake one in tests)."""

    def __init__(self, stages: tuple[str, ...], estimates_s: tuple[float, ...], kinds: tuple[str, ...], *,
                 probe_quiet_s: float | None = None, first_probes_s: tuple[float, ...] = (),
                 every_s: float = PROGRESS_EVERY_S, show=None, clock=None):
        self.stages, self.every_s, self.clock = stages, every_s, clock or time.monotonic
        self.show = show or (lambda text, stage: print(f"calibrate: {text}", file=sys.stderr, flush=True))
        self.eta = Eta(estimates_s, kinds, self.clock, probe_quiet_s, first_probes_s)
        self.count, self.name, self.shown = 0, "", self.clock()
        self.lock = threading.Lock()  # the heartbeat thread reads what the run's thread writes

    def stage(self, msg: str) -> None:
        with self.lock:
            self.eta.begin(self.count)
            self.count, self.name = self.count + 1, msg
            self._show()

    def within(self, fraction: float) -> None:
        with self.lock:
            self.eta.advance(fraction)

    def probed(self, seconds: float) -> None:
        with self.lock:
            self.eta.probed(seconds)

    def beat(self) -> None:
        """A line if none was shown for every_s (called by beating()'s thread, or by a test)."""
        with self.lock:
            if self.count and self.clock() - self.shown >= self.every_s:
                self._show()

    def due_in_s(self) -> float:
        """Seconds until the next line is due (at least 0.05: the thread does not spin)."""
        with self.lock:
            return max(0.05, self.shown + self.every_s - self.clock())

    def _show(self) -> None:
        left = self.eta.left_s()
        eta = f", about {left:.0f} s left" if left >= 1 else ", finishing"
        self.shown = self.clock()
        self.show(f"{self.name} ({self.count}/{len(self.stages)}, {self.eta.elapsed_s():.0f} s{eta})", self.count - 1)

    @contextlib.contextmanager
    def beating(self):
        """beat() from a daemon thread whenever a line is due while the block runs (torch releases the GIL in
        its kernels, so the thread gets to run during a long benchmark)."""
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(self.due_in_s()):
                self.beat()

        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join()
