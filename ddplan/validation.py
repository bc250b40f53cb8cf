"""Score ddplan against measured runs: prediction vs measurement per run, summaries, and leave-one-source-out.

Each run of a runs file (ddplan.runs) is priced through `ddplan table`'s path and compared with what was
measured. The error of a run is predicted / measured - 1 on the step time (negative: ddplan is
optimistic, the run was slower than predicted); tokens per second err the other way by the same factor.
A measurement is inside the band when low <= measured <= high. The band half-width is
(high - low) / 2 / predicted.

Summaries (overall and by group): runs, median and largest |error|, the share of measurements inside
their band, the median band half-width. Leave-one-source-out: ddplan's fitted parameters (the
hardware specs' `efficiency.gemm.sustained` where it says "fitted") re-fitted without one source's runs
and that source priced with them, for every source in turn, so the error is out of sample.
"""

from __future__ import annotations

import collections
import functools
import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar
from dataclasses import dataclass, replace

from ddplan.errors import DdplanError, SpecError
from ddplan.evidence import UNSEEN_RATIO, hardware_key, is_thin, thin_values
from ddplan.fitting import golden_min, rising_root
from ddplan.gcpause import no_cycle_collection
from ddplan.memory import (DOES_NOT_FIT, FITS, MAY_NOT_FIT, NOT_COUNTED, PEAK_RATIO, fit_verdict,  # noqa: F401
                           predicted_peak_bytes)
from ddplan.params import param_counts
from ddplan.price import VALIDATED_RATIO, VALIDATED_RATIO_FP8, VALIDATED_RATIO_MOE, base_band
from ddplan.registry import builtin_dir, builtin_names, load_hardware
from ddplan.fp8 import FP8_TUNED_STACKS
from ddplan.replay import ASSUMED_FIT, FP8_STACK_FIT, fp8_fit_key, price_run, run_framework
from ddplan.runs import (MEMORY_PEAKS, MeasuredPeak, PublishedRun, RoutingSweep, RunSet, load_peaks, load_routing,
                         load_runs, run_spec, shipped_dataset)

# Sources whose runs enter no fit: they check the fits out of sample only, and the fits keep their stated basis
# (issue 35). fms-fsdp's README table (8 runs on A100 and H100, added 2026-12-06): its configurations are rebuilt from
# defaults and the README (its "Selective AC" read from the README's HFU/MFU ratios, its NICs from a per-node total),
# too loose a basis to move the A100 and H100 fractions every plan rests on. MLPerf's MI355X runs
# (mlperf-training-amd, 4 runs, added 2026-12-06): on a GPU no fit reaches (its efficiencies assumed), of one
# campaign, too few (MIN_FIT_RUNS) to fit its fractions. Both do enter the bands (band_ratio, unseen_ratios) and the
# evidence counts: their ratios are out of sample by construction.
# The April 2021 Megatron-LM README table (10 runs on A100 80GB, configurations stated whole) was check-only until
# 2026-12-07: folded in, it would have put Korthikanti et al.'s 1T sp-selective row past issue 12's 10% in sample
# (+14.4%). Once Megatron's full recompute re-ran a block whole (Layout.recompute_early_stop), as its reentrant
# checkpoint does, its ten runs agreed with the A100 fit (median 2.0% in sample) and Korthikanti's eight stayed within
# -0.1..+8.4% with it folded in, so it joined the fit: the A100 0.909 -> 0.885 (22 runs). The two are one family
# (SOURCE_FAMILIES), left out together: leaving either out leaves the A100 unfitted (MIN_FIT_RUNS), and its runs
# take the thin GPUs' band (unfitted_without). Leaving each source out: 7.8% -> 8.7% median (the README's ten are now
# priced without their sibling too), 107 -> 113 of 117 inside, 84% -> 90% of a source's runs (docs/validation.md).
# Sea AI Lab's Zero Bubble paper (zero-bubble-pp, 56 runs on 8-32 A100 80GB, added 2026-12-07, tenth session): one
# campaign's pure-pipeline fp16 runs, more than the A100 fit's other runs together, so folded in they would set that
# fit alone (0.885 -> 0.873, moving Korthikanti et al.'s rows about a point slower); as a check they test it out of
# sample (1.9% median). Folded in, leaving the Selene pair out would keep the A100 fitted by them (the 2021 README
# 16.6% -> 1.6% median out of sample, Korthikanti et al. 25.7% -> 6.8%), the band narrower (median half-width 19.7%)
# but 94.4% of runs inside, under BAND_RUNS_AIM: a fit that lets a big table inform it without setting it is the next
# step (docs/validation.md).
# AWS's torchtitan runs (aws-torchtitan, 6 runs on 32 H100, added 2026-12-07, twelfth session): the dataset's first of
# torchtitan, the stack ddplan's users run most and whose own benchmarks are held back from it; one campaign's
# Llama 3 8B on one machine, eager to compile to float8, each read from a blog table or a log line whose stack is
# rebuilt from torchtitan's code of the day (each run's `assumed`): a check of the fits, not a basis for them.
CHECK_ONLY_SOURCES = frozenset({"aws-torchtitan", "fms-fsdp", "mlperf-training-amd", "zero-bubble-pp"})
# Sources that are one campaign's siblings, left out together: a source priced by fits made with its sibling is not
# out of sample. Korthikanti et al. (2022) and the April 2021 Megatron-LM README are NVIDIA's Megatron-LM team on
# the same A100 80GB machine (Selene) a year apart, the same code lineage and the same way of measuring (a review
# found the second lent the first its A100 fit once it joined the fits, 2026-12-07). Other NVIDIA sources differ in
# GPU (the Megatron-Core README, H100), stack (Megatron-Core's MoE and FSDP) or team (FP8-LM, Microsoft's fork).
SOURCE_FAMILIES = {"korthikanti2022": "megatron-lm-selene-a100", "megatron-readme-2021": "megatron-lm-selene-a100"}


def source_family(name: str) -> str:
    """A source's family (SOURCE_FAMILIES), itself where it has none: what leaving a source out leaves out."""
    return SOURCE_FAMILIES.get(name, name)


def unfitted_without(runs: Sequence[PublishedRun], src: str, where: str,
                     hardware: Sequence[str] | None = None) -> set[str]:
    """The fitted hardware (their fit groups' names) that leaving src's family out leaves with fewer than
    MIN_FIT_RUNS runs to fit on: priced at the unfitted rule there, so thin in the evidence that widens the band, as a
    shipped GPU without a fit is. hardware: the fitted hardware (default fitted_hardware(), read from the specs)."""
    rest = [r for r in runs if source_family(r.source.name) != source_family(src)]
    out: set[str] = set()
    for hw in fitted_hardware() if hardware is None else hardware:
        leader = next((k for k, g in FIT_GROUPS.items() if hw in g), hw)
        if len(fit_basis(rest, leader, where)) < MIN_FIT_RUNS:
            out.update(FIT_GROUPS.get(leader, (leader,)))
    return out


# Hardware specs that share one fitted sustained fraction: the same die at the same power limit (the A100
# SXM4 40 GB and 80 GB are one GA100 at 400 W; the H100 SXM and H200 one GH100 at 700 W: only memory differs). And,
# assumed (no Blackwell Ultra GEMM sweep is public), Blackwell Ultra with the Blackwell it succeeds in the same
# package: B300 with B200 and GB300 with GB200 have the same dense 16-bit and fp8 tensor rates (2,250 / 4,500 and
# 2,500 / 5,000 TFLOP/s: hardware/b300.yaml, gb300.yaml [VD]) and run the same software; their MLPerf runs check it.
FIT_GROUPS: dict[str, tuple[str, ...]] = {"a100-sxm-80gb": ("a100-sxm-80gb", "a100-sxm-40gb"),
                                          "h100-sxm": ("h100-sxm", "h200"), "b200": ("b200", "b300"),
                                          "gb200": ("gb200", "gb300")}
# The fewest runs a fitted number may rest on (issue 35): a fit with fewer, as leave-one-source-out can leave one,
# is not made and the spec's fallback stands (fp8: the 16-bit fraction).
MIN_FIT_RUNS = 5
SIZE_BUCKETS = ((3e9, "<3B"), (30e9, "3-30B"), (200e9, "30-200B"), (math.inf, ">=200B"))


def _paused(fn):
    """Run fn with the cyclic garbage collector paused (ddplan.gcpause.no_cycle_collection: nearly half of
    scoring time otherwise goes to full collections that free nothing)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with no_cycle_collection():
            return fn(*args, **kwargs)
    return wrapper


@dataclass(frozen=True)
class Scored:
    """One run priced and compared. Times in seconds; MFU in percent in the run's own convention."""

    id: str
    source: str
    hardware: str
    model: str
    params: int  # ddplan's parameter count of the run's model
    params_reported: int | None
    gpus: int
    family: str  # parallelism family (family_of)
    size: str  # parameter-count bucket (SIZE_BUCKETS)
    assumed: int  # how many layout facts the entry had to assume
    measured_s: float
    predicted_s: float
    low_s: float
    high_s: float
    measured_mfu_pct: float | None  # in the source's convention (None: the run states none)
    predicted_mfu_pct: float | None
    ddplan_mfu_measured_pct: float  # the measured run's MFU in ddplan's convention (price.MFU_CONVENTION)
    flags: tuple[str, ...] = ()
    moe: bool = False  # a mixture-of-experts model (its own band: ddplan.price.VALIDATED_RATIO_MOE)
    attention_share: float = 0.0  # the attention kernels' share of the predicted step
    precision: str = "bf16"  # the run's GEMM precision (bf16, fp16, fp8)
    framework: str = "-"  # the run's training stack (PublishedRun.framework), "-" where not stated
    schedule: str = "-"  # the pipeline schedule priced (runfields.SCHEDULES), "-" without a pipeline
    # the band's ends from the efficiencies' ranges alone (PricedLayout.spread_s), before the validated band: what
    # leave-one-source-out joins with the band made without the run's source (_evidence_left_out)
    spread_low_s: float | None = None
    spread_high_s: float | None = None

    @property
    def error(self) -> float:
        """predicted / measured - 1 (negative: optimistic)."""
        return self.predicted_s / self.measured_s - 1

    @property
    def inside(self) -> bool:
        return self.low_s <= self.measured_s <= self.high_s

    @property
    def half_width(self) -> float:
        return (self.high_s - self.low_s) / 2 / self.predicted_s

    def row(self) -> dict:
        """Flat data for csv/json: units in the keys; the band also as % of the measured value."""
        return {"id": self.id, "source": self.source, "framework": self.framework, "hardware": self.hardware,
                "precision": self.precision,
                "model": self.model,
                "params": self.params, "params_reported": self.params_reported, "gpus": self.gpus,
                "family": self.family, "schedule": self.schedule, "size": self.size, "assumed": self.assumed, "measured_s": self.measured_s,
                "predicted_s": self.predicted_s, "low_s": self.low_s, "high_s": self.high_s,
                "error_pct": 100 * self.error, "inside_band": self.inside,
                "band_low_pct": 100 * (self.low_s / self.measured_s - 1),
                "band_high_pct": 100 * (self.high_s / self.measured_s - 1),
                "measured_mfu_pct": self.measured_mfu_pct, "predicted_mfu_pct": self.predicted_mfu_pct,
                "measured_mfu_ddplan_pct": self.ddplan_mfu_measured_pct, "flags": ";".join(self.flags)}


def family_of(tp: int, pp: int, zero: int, gpus: int) -> str:
    """A layout's parallelism family: single GPU, DDP/ZeRO-1/2 ("dp"), FSDP ("fsdp"), "tp", "pp", "tp+pp"."""
    if tp > 1 and pp > 1:
        return "tp+pp"
    if tp > 1:
        return "tp"
    if pp > 1:
        return "pp"
    if gpus == 1:
        return "single"
    return "fsdp" if zero == 3 else "dp"


def size_of(params: float) -> str:
    return next(name for limit, name in SIZE_BUCKETS if params < limit)


def score(run: PublishedRun, where: str, sustained: dict[str, float] | None = None,
          imbalance: float | None = None, shared: dict | None = None, evidence: bool = True) -> Scored:
    """Price one run and compare it with its measurement. sustained: hardware name -> GEMM sustained
    fraction replacing the spec's; imbalance: the dropless load imbalance replacing the spec's (what
    leave-one-source-out re-fits); shared: the run's rate-independent pricing cache at this imbalance
    (Scorer keeps one); evidence=False: the base band, not widened where the evidence is thin (ddplan.evidence)."""
    spec, hw, row = price_run(run, where, sustained=sustained, imbalance=imbalance, shared=shared, evidence=evidence)
    lay = run.layout
    params = sum(param_counts(spec.architecture).values())
    conv = run.mfu_convention

    def mfu(step_s: float) -> float | None:
        if conv is None:
            return None
        return 100 * conv.flops_per_token * run.tokens_per_step / step_s / (lay.gpus * conv.peak_tflops * 1e12)

    measured = run.measured_step_s
    predicted_mfu = mfu(row.step_s)
    measured_mfu = run.measured.mfu_pct if run.measured.mfu_pct is not None else mfu(measured)
    return Scored(
        id=run.id, source=run.source.name, hardware=hw.name, model=run.model.name, params=params,
        params_reported=run.model.params_reported, gpus=lay.gpus, family=family_of(lay.tp, lay.pp, row.layout.zero, lay.gpus),
        size=size_of(params), assumed=len(run.assumed), measured_s=measured, predicted_s=row.step_s,
        low_s=row.step_low_s, high_s=row.step_high_s, measured_mfu_pct=measured_mfu, predicted_mfu_pct=predicted_mfu,
        ddplan_mfu_measured_pct=row.mfu_pct * row.step_s / measured,
        flags=tuple(f.kind for f in row.flags) + (("params_differ",) if run.model.params_reported and abs(
            params / run.model.params_reported - 1) > 0.005 else ()), moe=spec.architecture.moe is not None,
        attention_share=row.step.by_kind_s.get("attention", 0.0) / row.step_s, precision=run.precision,
        framework=run.framework or "-",
        schedule=row.layout.schedule,
        spread_low_s=row.spread_s[0] if row.spread_s else None,
        spread_high_s=row.spread_s[1] if row.spread_s else None)


class Scorer:
    """score() with a memory: each (run, its hardware's GEMM sustained fractions, imbalance) is priced once,
    and each run's rate-independent parts (anatomies, memory, collective times: ddplan.price.PriceCache) are
    built once per imbalance and reused at every fraction. A fit prices the same runs at a dozen fractions
    and leave-one-source-out fits once per source, so most of its prices are repeats or share those parts.
    Results are exactly score()'s. One Scorer serves one dataset in one process (runs are told apart by
    their whole content, so edited copies of a run are priced anew; a run edited in place after it was
    scored keeps its first price: copy it, as model_copy does)."""

    def __init__(self) -> None:
        self._scored: dict[tuple, Scored] = {}
        self._values: dict[tuple, float] = {}  # a price's value alone (predicted_s)
        self._shared: dict[tuple, dict] = {}
        self._keys: dict[int, tuple[str, PublishedRun]] = {}  # id(run) -> (its JSON, the run, kept alive)
        self._moe: dict[str, bool] = {}  # run -> whether the imbalance moves its price
        self._parts: dict[str, str] = {}  # run -> the run without its recompute policy (_parts_key)
        self._thin: dict[str, tuple] = {}  # run -> its thin evidence by the shipped tables (ddplan.evidence)

    def _key(self, run: PublishedRun) -> str:
        known = self._keys.get(id(run))
        if known is None or known[1] is not run:
            known = self._keys[id(run)] = (run.model_dump_json(), run)
        return known[0]

    def _imbalanced(self, run: PublishedRun, run_key: str, where: str) -> bool:
        """Whether the run's price depends on the dropless imbalance: ddplan.runs.run_spec sets it only on a
        mixture-of-experts model routed dropless, not padded to a capacity, and it acts only under expert
        parallelism (ddplan.specs.MoE.imbalance)."""
        if run_key not in self._moe:
            moe = run_spec(run, where).architecture.moe
            self._moe[run_key] = (moe is not None and moe.capacity_factor is None and run.model.routing != "balanced"
                                  and run.layout.ep > 1)
        return self._moe[run_key]

    def _price_key(self, run: PublishedRun, where: str, sustained: dict[str, float] | None,
                   imbalance: float | None) -> tuple[tuple, dict[str, float] | None, dict]:
        """(the cache key of a price, the fractions it takes, its rate-independent cache): a run is priced the same
        at any fraction of another hardware's and at any imbalance that does not act on it."""
        try:
            name = _hw_name(run.hardware)
            given = sustained or {}
            fp8 = run.precision == "fp8"
            own = (given.get(name), given.get(fp8_fit_key(name)) if fp8 else None,
                   given.get(FP8_STACK_FIT) if fp8 and not tuned_fp8(run) else None,
                   given.get(name + ASSUMED_FIT), given.get(fp8_fit_key(name) + ASSUMED_FIT) if fp8 else None)
        except DdplanError:  # an unknown hardware: score() says so, naming the run
            own = (None,) * 5
        run_key = self._key(run)
        if imbalance is not None and not self._imbalanced(run, run_key, where):
            imbalance = None  # priced the same at any imbalance: one price, one cache
        shared = self._shared.setdefault((self._parts_key(run, run_key), imbalance), {})
        return (run_key, own, imbalance), (sustained if own != (None,) * 5 else None), shared

    def predicted_s(self, run: PublishedRun, where: str, sustained: dict[str, float] | None = None,
                    imbalance: float | None = None) -> float:
        """score(run, ...).predicted_s, priced at most once and without the band's other scenarios (what a fit's
        cost reads: the value is the same, its low and high ends are two more step models)."""
        key, given, shared = self._price_key(run, where, sustained, imbalance)
        if key in self._scored:
            return self._scored[key].predicted_s
        if key not in self._values:
            self._values[key] = price_run(run, where, given, key[2], shared=shared, evidence=False,
                                          bands=False)[2].step_s
        return self._values[key]

    def score(self, run: PublishedRun, where: str, sustained: dict[str, float] | None = None,
              imbalance: float | None = None, evidence: bool = True) -> Scored:
        """score(run, where, sustained, imbalance, evidence), priced at most once."""
        key, given, shared = self._price_key(run, where, sustained, imbalance)
        run_key = key[0]
        if key not in self._scored:  # priced with the base band; the evidence widens it after (exactly, _widened)
            self._scored[key] = score(run, where, given, key[2], shared=shared, evidence=False)
        base = self._scored[key]
        if not evidence:
            return base
        if run_key not in self._thin:
            self._thin[run_key] = thin_values(run_framework(run), base.hardware, base.precision)
        return _widened(base, self._thin[run_key])

    def _parts_key(self, run: PublishedRun, run_key: str) -> str:
        """The run apart from its recompute policy: the pricing cache's entries that depend on the policy
        carry it in their own keys (ddplan.price.Pricer), so variants of a run that differ only there
        (fit_dropless_imbalance's) share anatomies and memory."""
        if run_key not in self._parts:
            bare = run.model_copy(update={"layout": run.layout.model_copy(update={"recompute": "none"})})
            self._parts[run_key] = bare.model_dump_json()
        return self._parts[run_key]


@_paused
def score_all(runs: RunSet, where: str, sustained: dict[str, float] | None = None,
              progress: Callable[[str, int, int], None] | None = None, scorer: Scorer | None = None) -> list[Scored]:
    scorer = scorer or Scorer()
    out = []
    for i, r in enumerate(runs.runs):
        if progress:
            progress(r.id, i, len(runs.runs))
        out.append(scorer.score(r, f"{where}: runs.{i} ({r.id})", sustained))
    return out


@dataclass(frozen=True)
class Summary:
    group: str
    runs: int
    median_abs_error: float
    max_abs_error: float
    mean_error: float  # signed: the bias (negative: optimistic on average)
    inside_share: float
    median_half_width: float

    def row(self) -> dict:
        return {"group": self.group, "runs": self.runs, "median_abs_error_pct": 100 * self.median_abs_error,
                "max_abs_error_pct": 100 * self.max_abs_error, "mean_error_pct": 100 * self.mean_error,
                "inside_band_pct": 100 * self.inside_share, "median_band_half_width_pct": 100 * self.median_half_width}


def summarise(scored: Sequence[Scored], group: str = "all") -> Summary:
    """Median and largest |error|, mean signed error, share inside the band, median band half-width."""
    if not scored:
        raise ValueError("nothing to summarise")
    errors = [s.error for s in scored]
    return Summary(group=group, runs=len(scored), median_abs_error=statistics.median(abs(e) for e in errors),
                   max_abs_error=max(abs(e) for e in errors), mean_error=statistics.fmean(errors),
                   inside_share=sum(s.inside for s in scored) / len(scored),
                   median_half_width=statistics.median(s.half_width for s in scored))


GROUPINGS: tuple[tuple[str, Callable[[Scored], str]], ...] = (
    # the fits' sources apart from the checks (CHECK_ONLY_SOURCES): a check table's many runs move the medians of
    # every group it falls in (the Zero Bubble paper's 56 A100 runs those of A100, fp16 and megatron-lm)
    ("sources", lambda s: "check-only" if s.source in CHECK_ONLY_SOURCES else "fitted"),
    ("kind", lambda s: "moe" if s.moe else "dense"), ("hardware", lambda s: s.hardware), ("size", lambda s: s.size),
    ("precision", lambda s: s.precision), ("framework", lambda s: s.framework), ("family", lambda s: s.family),
    # the pipelined runs by schedule (the zero-bubble paper's own schedules among them); the others have none
    ("schedule", lambda s: None if s.schedule == "-" else s.schedule),
    ("source", lambda s: s.source))


def summaries(scored: Sequence[Scored]) -> list[Summary]:
    """The overall summary, then one per kind of source (fitted, check-only), kind (dense, mixture of experts),
    hardware, model size, precision, training stack, parallelism family, pipeline schedule (pipelined runs only) and
    source."""
    out = [summarise(scored)]
    for name, key in GROUPINGS:
        groups: dict[str, list[Scored]] = {}
        for s in scored:
            k = key(s)
            if k is not None:
                groups.setdefault(k, []).append(s)
        out += [summarise(v, f"{name}={k}") for k, v in sorted(groups.items())]
    return out


T = TypeVar("T")


def per_source(scored: Sequence[Scored], value: Callable[[Scored], T]) -> dict[str, list[T]]:
    """Each source's runs' values, by source name, in the runs' order."""
    by: dict[str, list[T]] = collections.defaultdict(list)
    for s in scored:
        by[s.source].append(value(s))
    return by


def inside_by_source(scored: Sequence[Scored]) -> float:
    """The share of a source's runs inside their band, averaged over the sources (each source weighing one): how
    often the band holds for a run from a source picked at random, where the share of all runs lets the sources with
    many runs speak for the rest (BAND_COVERAGE's third figure)."""
    by = per_source(scored, lambda s: s.inside)
    if not by:
        raise ValueError("no runs")
    return statistics.fmean(sum(v) / len(v) for v in by.values())


def by_source(scored: Sequence[Scored], prefix: str = "") -> list[Summary]:
    """The overall summary, then one per source, each group name prefixed (e.g. "leave-one-source-out ")."""
    sources = sorted({s.source for s in scored})
    out = [summarise(scored)] + [summarise([s for s in scored if s.source == src], f"source={src}")
                                 for src in sources]
    return [Summary(**{**vars(x), "group": prefix + x.group}) for x in out]


def median_by_source(scored: Sequence[Scored]) -> float:
    """The median over the sources of each source's median |error| (each source weighing one, as inside_by_source):
    the error a run's median hides where one source holds many runs. e.g. sources A (errors 1%, 3%), B (10%) and
    C (2%, 4%, 30%): medians 2%, 10%, 4%, so 4%."""
    by = per_source(scored, lambda s: abs(s.error))
    if not by:
        raise ValueError("no scored run")
    return statistics.median(statistics.median(v) for v in by.values())


def runs_inside_share(scored: Sequence[Scored]) -> float:
    """The share of the runs inside their band among the sources the fits use (every source but CHECK_ONLY_SOURCES):
    what BAND_RUNS_AIM is held to. e.g. 9 of 10 fitted runs inside and 5 of 5 check-only runs: 0.9."""
    fitted = [s for s in scored if s.source not in CHECK_ONLY_SOURCES]
    if not fitted:
        raise ValueError("no run from a source the fits use")
    return sum(s.inside for s in fitted) / len(fitted)


def percentile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default 'linear' method), q in [0, 1]."""
    if not xs or not 0 <= q <= 1:
        raise ValueError(f"need values and q in [0, 1]; got {len(xs)} values, q={q}")
    xs = sorted(xs)
    pos = q * (len(xs) - 1)
    lo = int(pos)
    return xs[lo] + (xs[min(lo + 1, len(xs) - 1)] - xs[lo]) * (pos - lo)


# The band's level: a two-sided prediction interval at this probability for measured / predicted of a run from a
# source the fits never saw (source_band). The band a prediction carries (this interval joined with its efficiency
# range and widened where the evidence is thin) is calibrated where it matters, per source: leaving each source out,
# its band made without it too, the share of a source's runs inside averages 84.7% at 0.75, 89.4% at 0.80, 91.5% at
# 0.85 and 92.3% at 0.90 (per run 92.3%, 96.6%, 98.3%, 99.1%; median half-width 28.5%, 32.5%, 38.5%, 47.5%; 117 runs,
# 13 sources, 2026-12-07, with Megatron's full recompute re-running blocks whole, the 2021 Megatron-LM README in the
# A100 fit, sibling campaigns left out together and a GPU left unfitted taking the thin GPUs' band). The rule then:
# the lowest level on a 0.05 grid whose band holds at least BAND_AIM of a source's runs on average, 0.80 (0.75 fell
# short, 84.7%; with the MI355X's attention measured it reaches 85.7%, and BAND_RUNS_AIM below rules it out).
# BAND_AIM is issue 35's aim for the runs held back from ddplan (at least 85% inside their band): a
# choice of how sure the band is, made by this very check, not a fit of the model, so the check does not test it
# independently. Until 2026-12-07 the level was 0.85, chosen when the share per source was near 85% there (81.7%,
# 83.8%, 84.6% at 0.80, 0.85, 0.90 on 2026-12-06, the A100 then left unfitted without Korthikanti et al.'s runs;
# 81.5%, 85.2%, 88.5% that morning on 113 runs; the interval alone, at 0.85, held 75.5% per source). BAND_COVERAGE
# holds the check. Since 2026-12-07 (seventh session) the level must also keep BAND_RUNS_AIM of all the runs inside:
# with the MI355X's forward attention measured, 0.75 reached 85.7% per source (110 of 119 runs, 92.4%; median
# half-width 27.5%) and the rule alone would have narrowed the band. Why a margin: the runs held back from ddplan
# (issue 35) were off by 16.3% (median), twice the dataset's error leaving each source out (8.7%), and fell inside
# the band then shipped (the 5th-95th percentile one) 72% of the time, 4 points under what leaving each source out
# gave that band (76%); no held-back figure exists for the interval band. A stack ddplan has not seen scatters more
# than leaving a source out shows, so the band keeps at least 95% of the dataset's runs inside (96.6% at 0.80). A
# policy choice made after the fact (any floor from 0.925 to 0.966 keeps 0.80), like BAND_AIM stated here and
# checked by tests/test_validation.py; not a fit. With MLPerf's B300 and GB300 runs (2026-12-07, eighth session,
# 124 runs): 0.75 holds 85.6% per source but 114 runs (91.9%); 0.80 holds 91.4% and 121 (97.6%). With the ring's
# latency across nodes (comm.ring_latency_s, ninth session) 0.80 holds 89.4% and 120 (96.8%): MLPerf's MI355X 8B run
# fell just below its band (1.043 s against 1.052-1.970) as the thin GPUs' band, made from the others, moved. With
# MLPerf's 512-GPU GB200/GB300 8B runs on the 64-GPU NVLink domains they ran on (tenth session): 0.75 holds 88.3% per
# source but 115 runs (92.7%); 0.80 holds 91.4% and 121 (97.6%), median half-width 35.5% (was 33.1%).
# Since the Zero Bubble paper's 56 runs joined as a check (tenth session, 180 runs), the floor counts the runs of the
# sources the fits use (runs_inside_share), not the check-only ones: those are whole tables added to test the fits,
# and their row counts are their publications' (56 rows of one paper all inside would have lifted 0.75 to 171 of 180,
# 95.0%, on the floor exactly, while each still weighs one source in BAND_AIM's share). 0.75 then holds 89.1% per
# source but 104 of the fitted sources' 112 runs (92.9%); 0.80 holds 92.0% and 109 (97.3%; 177 of all 180), median
# half-width 26.8%. Said plainly: the rule as it stood (all runs) would have chosen 0.75 on that data, on the floor
# exactly; it was restated on seeing so, a policy choice in the conservative direction (the held-back runs and
# nanotron's figure, stacks ddplan has not seen, say the band is too narrow), and keeps the level it had.
# The paper's 77 rows of its own schedules (ZB-1p, ZB-2p, ZB-V, priced since the eleventh session: pipeline.
# zero_bubble_time_s) joined the same check-only source: 254 of 257 runs inside, the per-source share and the fitted
# sources' runs unchanged (the level's rule does not move), median half-width 20.9% (26.8%): the fall is those rows'
# narrow A100 band, not a better prediction anywhere else. With AWS's six torchtitan runs as a check (twelfth session,
# 263 runs): 0.75 holds 87.9% per source but 91.1% of the fitted sources' runs; 0.80 holds 90.5% and 95.5% (257 of
# all 263), median half-width 20.9% (20.4% before its eager rows were priced op by op, fusions "decomposed"): the
# level stays. With ZeRO-3's collectives a unit each and ZeRO 0-2's a stack's bucket each (each paying its latency:
# ddplan.comm.split_time_s, grad_buckets; MLPerf's runs with the buckets their configs set) and the band no longer
# taking the best GEMM's "real training shapes" low end beside a fitted fraction, which already holds that loss
# (ddplan.roofline.best_gemm; thirteenth session, 263 runs): 0.75 holds 83.5% per source, under BAND_AIM; 0.80 holds
# 88.4% and 95.5% of the fitted sources' runs (107 of 112; 256 of all 263), median half-width 17.5% (20.9%): the
# level stays. Removing the double count alone (twelfth session's trial, before the buckets) gave 94.6% at 0.80 and
# 0.85 alike. The five fitted runs outside now: Megatron-FSDP's Qwen3-30B-A3B (2.2 x the prediction), MLPerf's two
# NVIDIA GPT-3 175B runs of v4.1 (0.73 and 0.75 x) and OLMo-core's 32B pair (1.23 and 1.40 x).
BAND_AIM = 0.85
BAND_RUNS_AIM = 0.95
BAND_LEVEL = 0.80
# leaving each source out at BAND_LEVEL: (runs inside, runs, mean over sources of the share inside); tests fail
# when it drifts from the shipped dataset
BAND_COVERAGE = (256, 263, 0.883)


def t_coverage(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with df (a positive integer) degrees of freedom, in closed form: Abramowitz &
    Stegun, Handbook of Mathematical Functions (1964), 26.7.3 (df odd) and 26.7.4 (df even), with
    theta = atan(t / sqrt(df))."""
    if df < 1 or t < 0:
        raise ValueError(f"need df >= 1 and t >= 0, got df={df}, t={t}")
    theta = math.atan(t / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2:  # odd: 2/pi (theta + sin cos (1 + 2/3 cos^2 + 2*4/(3*5) cos^4 + ... up to cos^(df-3)))
        if df == 1:
            return 2 * theta / math.pi
        term = total = 1.0
        for k in range(1, (df - 1) // 2):
            term *= 2 * k / (2 * k + 1) * c2
            total += term
        return 2 / math.pi * (theta + math.sin(theta) * math.cos(theta) * total)
    term = total = 1.0  # even: sin (1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ... up to cos^(df-2))
    for k in range(1, df // 2):
        term *= (2 * k - 1) / (2 * k) * c2
        total += term
    return math.sin(theta) * total


def t_quantile(level: float, df: int) -> float:
    """The t with P(|T| <= t) = level (Student's t, df degrees of freedom): t_coverage inverted by bisection
    (it rises with t). E.g. level 0.80 (each tail 0.10): 3.078 at 1 df, 1.638 at 3, 1.372 at 10 (NIST/SEMATECH
    e-Handbook of Statistical Methods, 1.3.6.7.2, upper critical values of the t distribution)."""
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    lo, hi = 0.0, 1.0
    while t_coverage(hi, df) < level:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_coverage(mid, df) < level else (lo, mid)
    return (lo + hi) / 2


def source_band(scored: Sequence[Scored], level: float = BAND_LEVEL) -> tuple[float, float] | None:
    """Where measured / predicted falls, at probability `level`, for a run from a source not among `scored`: a
    one-way random-effects model of log(measured / predicted), each source a campaign with its own offset about the
    mean (variance tau^2 between sources) and its runs scattered about that offset (sigma^2, pooled within sources).
    mu = the mean of the k source means; sigma^2 = the within-source sum of squares over (runs - k), pooled (as if
    every source scattered alike); tau^2 by the method of moments, the sample variance of the source means (V) less
    the part their own scatter explains (mean of sigma^2 / n_i), clipped at 0; the interval is
    mu +- t(level, k - 1) sqrt(tau^2 + sigma^2 + V / k), V / k estimating the variance of mu itself.
    The prediction interval of random-effects meta-analysis (Higgins, Thompson & Spiegelhalter 2009, J. R. Statist.
    Soc. A 172(1) 137-159, sec. 3.4, which takes k - 2 degrees of freedom for a new study's mean; here k - 1, the
    between-source variance's own), for one run of the new source, hence sigma^2 too. A source's runs share one
    campaign, one stack and one way of measuring, so ten close rows of one table are one piece of evidence about a
    new source's offset, not ten; and the t on k - 1 degrees of freedom widens the band where few sources stand
    behind it, which a percentile over the dataset's runs does not. None with fewer than two sources: one source
    says nothing of how far the next one falls (its own runs' scatter would give a band far too narrow)."""
    by = per_source(scored, lambda s: math.log(s.measured_s / s.predicted_s))
    k = len(by)
    if k < 2:
        return None
    means = {src: statistics.fmean(v) for src, v in by.items()}
    n = sum(map(len, by.values()))
    mu = statistics.fmean(means.values())
    within = sum((x - means[src]) ** 2 for src, v in by.items() for x in v)
    sigma2 = within / (n - k) if n > k else 0.0
    spread_of_means = statistics.variance(means.values())  # estimates tau^2 + sigma^2 mean(1 / n_i)
    tau2 = max(0.0, spread_of_means - statistics.fmean(sigma2 / len(v) for v in by.values()))
    # a new run's offset from mu: its source's (tau^2), its own scatter (sigma^2), and mu's own error, the variance
    # of a mean of k source means (spread_of_means / k)
    half = t_quantile(level, k - 1) * math.sqrt(tau2 + sigma2 + spread_of_means / k)
    return math.exp(mu - half), math.exp(mu + half)


def band_ratio(scored: Sequence[Scored], fp8: bool = False) -> tuple[float, float] | None:
    """The band (low, high factors on a prediction) for a dense 16-bit run (fp8=True: a dense fp8 run) from a source
    ddplan has not seen: source_band over the dense runs of that precision, scored leaving each source out; what
    ddplan.price.VALIDATED_RATIO (VALIDATED_RATIO_FP8) is built from; None with fewer than two sources of such runs.
    fp8 has its own band as it has its own fit (sustained_fp8): its sources' spread is not the 16-bit runs'."""
    return source_band([s for s in scored if not s.moe and (s.precision == "fp8") == fp8])


def evidence_counts(runs: Sequence[PublishedRun]) -> dict[str, dict[str, tuple[int, int]]]:
    """ddplan.evidence.EVIDENCE of a dataset: per dimension and value, its runs and sources."""
    keys = {"framework": lambda r: r.framework or "-",
            "hardware": lambda r: hardware_key(_hw_name(r.hardware), r.precision), "precision": lambda r: r.precision}
    out: dict[str, dict[str, tuple[int, int]]] = {}
    for dim, key in keys.items():
        groups: dict[str, list[PublishedRun]] = {}
        for r in runs:
            groups.setdefault(key(r), []).append(r)
        out[dim] = {v: (len(g), len({r.source.name for r in g})) for v, g in sorted(groups.items())}
    return out


def unseen_ratios(held: Sequence[Scored], counts: dict[str, dict[str, tuple[int, int]]]
                  ) -> dict[str, tuple[float, float, int, int]]:
    """ddplan.evidence.UNSEEN_RATIO: per dimension, the band (source_band) of measured / predicted over the dense
    runs, 16-bit and fp8 (leave-one-source-out scores), whose value of that dimension is thin
    (ddplan.evidence.is_thin), with their count of runs and sources; a dimension without two sources of such runs is
    left out (it widens nothing)."""
    keys = {"framework": lambda s: s.framework, "hardware": lambda s: hardware_key(s.hardware, s.precision),
            "precision": lambda s: s.precision}
    out = {}
    for dim, key in keys.items():
        group = [s for s in held if not s.moe and is_thin(*counts[dim].get(key(s), (0, 0)))]
        band = source_band(group)
        if band is None:  # no two sources of thin values to measure a spread on: the dimension widens nothing
            continue
        out[dim] = (*band, len(group), len({s.source for s in group}))
    return out


def moe_band_ratio(scored: Sequence[Scored]) -> tuple[float, float] | None:
    """The dense band stretched to every mixture-of-experts run's measured / predicted (too few of them for an
    interval of their own): what ddplan.price.VALIDATED_RATIO_MOE is built from; None without MoE runs or without a
    dense band (band_ratio)."""
    ratios = [s.measured_s / s.predicted_s for s in scored if s.moe]
    dense = band_ratio(scored)
    if not ratios or dense is None:
        return None
    return min(dense[0], *ratios), max(dense[1], *ratios)


# ---- fitted parameters and leave-one-source-out

def tuned_fp8(run: PublishedRun) -> bool:
    """Whether the run's stack is one a hardware's sustained_fp8 is fitted on (ddplan.fp8.FP8_TUNED_STACKS)."""
    return run_framework(run) in FP8_TUNED_STACKS


def fit_basis(runs: Sequence[PublishedRun], hardware: str, where: str, fp8: bool = False,
              stacks: str = "tuned") -> list[PublishedRun]:
    """The runs a hardware's sustained fraction is fitted to (fit_sustained): its fit group's dense runs in 16 bits
    (fp8=False) or in fp8 (fp8=True, for sustained_fp8), those of CHECK_ONLY_SOURCES left out. fp8 runs by stack:
    "tuned" those of ddplan.fp8.FP8_TUNED_STACKS (what sustained_fp8 is fitted on), "other" the rest (what
    fit_fp8_stack fits FP8_STACK_KEPT on), "all" both (leave-one-source-out's fit where no tuned run is left)."""
    if stacks not in ("tuned", "other", "all"):
        raise ValueError(f"stacks must be tuned, other or all, got {stacks!r}")
    names = FIT_GROUPS.get(hardware, (hardware,))
    return [r for r in runs if _hw_name(r.hardware) in names and (r.precision == "fp8") == fp8
            and r.source.name not in CHECK_ONLY_SOURCES and not _is_moe(r, where)
            and (not fp8 or stacks == "all" or tuned_fp8(r) == (stacks == "tuned"))]


_MOE: dict[tuple[int, str], tuple[PublishedRun, bool]] = {}  # (id(run), where) -> (the run, kept alive; moe?)


def _is_moe(run: PublishedRun, where: str) -> bool:
    """Whether a run's model is a mixture of experts (its run_spec's), once per run object: fit_basis asks it of
    every run in every fold of leave_one_source_out. Runs are pydantic models used unchanged once loaded (a copy
    for an edit is a new object, so a new entry)."""
    known = _MOE.get((id(run), where))
    if known is None or known[0] is not run:
        known = _MOE[(id(run), where)] = (run, run_spec(run, where).architecture.moe is not None)
    return known[1]


@_paused
def fit_sustained(runs: Sequence[PublishedRun], hardware: str, where: str, lo: float = 0.3,
                  hi: float = 1.0, tol: float = 0.005, scorer: Scorer | None = None, fp8: bool = False,
                  fixed: dict[str, float] | None = None, stacks: str = "tuned") -> float:
    """The GEMM sustained fraction on one hardware that minimises the mean |log(predicted / measured)| of
    its dense runs (golden-section search on [lo, hi]). The step time falls monotonically as the fraction
    rises, so the objective has one minimum. Mixture-of-experts runs are left out: they test the MoE model
    (routing, all-to-alls) and must not move the GEMM fit that every dense plan rests on. So are the runs of
    CHECK_ONLY_SOURCES: a check of the fit it did not shape.

    fp8=False: the 16-bit fraction (`sustained`), fitted on 16-bit runs only. fp8=True: the fraction of the best
    fp8 GEMM rate that fp8 training keeps (`sustained_fp8`, issue 35: fp8 priced from fp8 evidence), fitted on fp8
    runs only, with the 16-bit fraction (which an fp8 run's 16-bit GEMMs, the LM head's, run at) held at
    `fixed`'s value for this hardware or the spec's. fixed: other fractions held (price_run's keys). stacks: which
    fp8 runs (fit_basis); "all" prices every stack at the fraction fitted (what a stack keeps of it set to 1)."""
    names = FIT_GROUPS.get(hardware, (hardware,))
    mine = fit_basis(runs, hardware, where, fp8, stacks)
    if fp8 and stacks == "all":
        fixed = {**(fixed or {}), FP8_STACK_FIT: 1.0}
    if not mine:
        raise ValueError(f"no {'fp8 ' if fp8 else ''}run on {hardware} to fit")

    scorer = scorer or Scorer()
    keys = [fp8_fit_key(n) for n in names] if fp8 else list(names)

    def cost(f: float) -> float:
        given = {**(fixed or {}), **dict.fromkeys(keys, f)}
        return statistics.fmean(abs(math.log(1 + (scorer.predicted_s(r, where, given) / r.measured_step_s - 1))) for r in mine)

    return round(golden_min(cost, lo, hi, tol), 3)



@_paused
def fit_fp8_stack(runs: Sequence[PublishedRun], where: str, scorer: Scorer | None = None,
                  fixed: dict[str, float] | None = None, lo: float = 0.3, hi: float = 1.5,
                  tol: float = 0.005) -> float:
    """ddplan.fp8.FP8_STACK_KEPT: the share of a hardware's sustained_fp8 (fitted on the tuned stacks) that the other
    stacks' fp8 runs keep, one factor for every hardware with an fp8 fit, minimising the mean |log(predicted /
    measured)| of those runs (fit_basis(stacks="other"), each weighing one, as fit_sustained's) at the fractions of
    `fixed` (the specs' where it gives none). The step time falls as the factor rises: one minimum."""
    scorer = scorer or Scorer()
    mine = [r for hw in fitted_hardware(fp8=True) for r in fit_basis(runs, hw, where, fp8=True, stacks="other")]
    mine = list({r.id: r for r in mine}.values())  # a fit group's hardware list each of its runs once
    if not mine:
        raise ValueError("no fp8 run of a stack other than the tuned ones to fit")

    def cost(f: float) -> float:
        given = {**(fixed or {}), FP8_STACK_FIT: f}
        return statistics.fmean(abs(math.log(scorer.predicted_s(r, where, given) / r.measured_step_s)) for r in mine)

    return round(golden_min(cost, lo, hi, tol), 3)

@dataclass(frozen=True)
class ImbalanceFit:
    """One forced-balance / dropless pair: the measured slowdown, the share of the step that scales with the
    imbalance and the imbalance that explains the slowdown (fit_dropless_imbalance)."""

    id: str
    seq_len: int
    slowdown: float  # dropless step / forced-balance step, measured
    moe_share: float  # the experts' ops and exchanges in the predicted forced-balance step (recomputed ones too)
    imbalance: float


# the imbalance's search interval and tolerance (fit_dropless_imbalance); the step's slope at 1 over SLOPE_STEP is
# the experts' share of it (ImbalanceFit.moe_share)
IMBALANCE_RANGE = (1.0, 4.0)
IMBALANCE_TOL = 1e-3
IMBALANCE_FTOL = 1e-7  # of the step: a root this close in time is exact (the step is piecewise linear in I)
SLOPE_STEP = 0.05


@_paused
def fit_dropless_imbalance(sweep: RoutingSweep, runs: RunSet, where: str, sustained: dict[str, float] | None = None,
                           sweep_file: str = "moe_routing.yaml", scorer: Scorer | None = None) -> list[ImbalanceFit]:
    """The dropless load imbalance of each pair of a routing sweep (ddplan.runs.RoutingSweep).

    Each pair's forced-balance run is priced dropless at imbalance I, t(I), with its own recompute (the sweep's
    runs re-compute the whole MoE layers, selective:layernorm+moe, so their step grows with I by the experts'
    forward twice and backward once). Only the experts' ops and exchanges depend on I. The imbalance solves
    t(I) - t(1) = (S - 1) t(1), S the measured slowdown (forced / dropless throughput), by false position on
    IMBALANCE_RANGE (ddplan.fitting.rising_root); exact where the step is piecewise linear in I (the busiest pipeline stage may change as the
    experts grow). e.g. t(1) 12 s, S 1.245, and t rising 5 s per unit of I: I = 1 + 0.245 x 12 / 5 = 1.59.
    sustained: GEMM fractions replacing the specs' (leave-one-source-out's re-fits); sweep_file names the sweep in
    errors.
    """
    scorer = scorer or Scorer()
    by_id = {r.id: r for r in runs.runs}
    out = []
    for k, point in enumerate(sweep.points):
        field = f"points.{k}.balanced"
        if point.balanced not in by_id:
            raise SpecError(f"no run {point.balanced!r} in the dataset ({where})", file=sweep_file, field=field)
        run = by_id[point.balanced]
        conv = run.mfu_convention
        if run.model.routing != "balanced" or conv is None:
            raise SpecError(f"{run.id} must be a forced-balance run (model.routing: balanced) with an mfu_convention",
                            file=sweep_file, field=field)
        dropless_s = conv.flops_per_token * run.tokens_per_step / (point.dropless_model_tflops_per_gpu * 1e12
                                                                     * run.layout.gpus)
        slowdown = dropless_s / run.measured_step_s
        here = f"{where}: {run.id}"

        dropless = run.model_copy(update={"model": run.model.model_copy(update={"routing": "dropless"})})

        def step(imbalance: float) -> float:
            return scorer.predicted_s(dropless, here, sustained, imbalance)

        t1 = step(1.0)
        slope = (step(1 + SLOPE_STEP) - t1) / SLOPE_STEP  # the step's growth per unit of I, near 1
        target = (slowdown - 1) * t1
        lo, hi = IMBALANCE_RANGE
        at_hi = step(hi) - t1 - target
        if at_hi < 0:
            raise SpecError(f"{run.id}: the measured slowdown {slowdown:.3f} needs an imbalance above {hi:g}",
                            file=sweep_file, field=field)
        imbalance = rising_root(lambda i: step(i) - t1 - target, lo, hi, IMBALANCE_TOL, IMBALANCE_FTOL * t1,
                                f_lo=-target, f_hi=at_hi)
        out.append(ImbalanceFit(id=run.id, seq_len=run.model.seq_len, slowdown=slowdown, moe_share=slope / t1,
                                imbalance=imbalance))
    return out


def dropless_imbalance(fits: Sequence[ImbalanceFit]) -> float:
    """The one imbalance of a sweep: the median of its pairs', to 0.01 (what DROPLESS_IMBALANCE holds)."""
    return round(statistics.median(f.imbalance for f in fits), 2)


def _hw_name(name: str) -> str:
    return load_hardware(name).name


def fitted_hardware(fp8: bool = False) -> list[str]:
    """Built-in hardware whose sustained GEMM fraction (fp8: the fraction fp8 training keeps, sustained_fp8) is
    fitted to the shipped dataset (basis: fitted)."""
    out = []
    for name in builtin_names("hardware"):
        gemm = load_hardware(name).efficiency.gemm
        s = gemm.sustained_fp8 if fp8 else gemm.sustained
        if s is not None and s.basis == "fitted":
            out.append(name)
    return out


@_paused
def leave_one_source_out(runs: RunSet, where: str, hardware: Iterable[str],
                         progress: Callable[[str, int, int], None] | None = None,
                         scorer: Scorer | None = None, fp8_hardware: Iterable[str] | None = None) -> list[Scored]:
    """Every run priced with the fitted parameters re-fitted on the other sources' runs only: a source is left out with
    its family (SOURCE_FAMILIES), sibling campaigns whose fits would not be out of sample for it.

    Each fitted hardware's sustained fraction is re-fitted without the held-out source; a hardware the other
    sources leave fewer than MIN_FIT_RUNS runs on (as fit_basis counts them) is not fitted, as the shipped specs fit
    none on fewer: it takes the geometric mean of the fractions fitted without the source, the rule a GPU without a
    fit follows (its spec's value where none is left, which may have seen the source). Then each hardware of
    fp8_hardware
    (default: fitted_hardware(fp8=True)) has the fraction fp8 training keeps re-fitted on the other sources' fp8
    runs, at its re-fitted 16-bit fraction; with fewer than MIN_FIT_RUNS of them left it takes the 16-bit fraction,
    as a spec without an fp8 fit does (the shipped fp8 fit saw the held-out runs). The fp8 fractions are fitted on
    the tuned stacks' runs (ddplan.fp8.FP8_TUNED_STACKS), or on every stack's where fewer than MIN_FIT_RUNS tuned ones
    are left; what the other stacks keep of them (FP8_STACK_KEPT) is re-fitted on theirs (1 where fewer are left, or
    where a fraction took every stack's runs). The dropless load imbalance
    is re-fitted from the shipped routing sweep (validation/moe_routing.yaml) at those fractions, and set to
    1 (balanced, the model without the term) when the sweep's own source is the one held out; otherwise a
    dataset that lacks the sweep's runs keeps the shipped value."""
    scorer = scorer or Scorer()
    hardware = tuple(hardware)
    sweep = load_routing()
    ids = {r.id for r in runs.runs}
    sweep_here = all(p.balanced in ids for p in sweep.points)
    sources = sorted({r.source.name for r in runs.runs})
    fp8_leaders = [next((k for k, g in FIT_GROUPS.items() if hw in g), hw)
                   for hw in (fitted_hardware(fp8=True) if fp8_hardware is None else fp8_hardware)]
    out: list[Scored] = []
    # a source without a run on a hardware leaves that hardware's fit as the others make it, and an unchanged fit
    # leaves the imbalance fit unchanged: each distinct fit is made once (the same numbers, fewer prices)
    fits: dict[tuple, float] = {}
    imbalances: dict[tuple, float] = {}
    unfitted: dict[str, set[str]] = {}  # source -> the fitted hardware leaving it out leaves unfitted
    sweep_ids = {p.balanced for p in sweep.points}  # the dropless twins run on the same hardware
    sweep_hardware = {_hw_name(r.hardware) for r in runs.runs if r.id in sweep_ids}
    for i, src in enumerate(sources):
        if progress:
            progress(f"without {src}", i, len(sources))
        rest = [r for r in runs.runs if source_family(r.source.name) != source_family(src)]
        held = [r for r in runs.runs if r.source.name == src]
        refit: dict[str, float] = {}
        leaders = dict.fromkeys(next((k for k, g in FIT_GROUPS.items() if hw in g), hw) for hw in hardware)
        unfitted[src] = unfitted_without(runs.runs, src, where, hardware)
        thin = [hw for hw in leaders if hw in unfitted[src]]  # fewer than MIN_FIT_RUNS runs left to fit on
        for hw in (hw for hw in leaders if hw not in unfitted[src]):
            names = FIT_GROUPS.get(hw, (hw,))
            mine = frozenset(r.id for r in fit_basis(rest, hw, where))
            basis = (hw, mine)
            if basis not in fits:
                fits[basis] = fit_sustained(rest, hw, where, scorer=scorer)
            refit.update(dict.fromkeys(names, fits[basis]))
        # such a GPU takes what a GPU without a fit takes (the specs' "assumed" rule, e.g. hardware/b200.yaml): the
        # geometric mean of the fitted ones, here the fits made without the held-out source; its spec's value where
        # none is left (a small dataset of a user's own: that value may have been fitted on the held-out source). The
        # GPUs never fitted (B200, MI300X, ...) keep their shipped assumed values, made from the shipped fits: no
        # source of the shipped dataset has runs both on them and in a 16-bit fit
        made = [refit[hw] for hw in leaders if hw not in thin]
        for hw in thin:
            assumed = round(math.exp(statistics.fmean(map(math.log, made))), 3) if made else _spec_sustained(hw)
            refit.update(dict.fromkeys(FIT_GROUPS.get(hw, (hw,)), assumed))
            refit.update(dict.fromkeys((n + ASSUMED_FIT for n in FIT_GROUPS.get(hw, (hw,))), 1.0))
        pooled = False  # some hardware's fp8 fraction fitted on every stack's runs (no tuned run left on it)
        for hw in dict.fromkeys(fp8_leaders):
            names = FIT_GROUPS.get(hw, (hw,))
            held16 = {n: refit[n] for n in names if n in refit}
            for stacks in ("tuned", "all"):
                mine = frozenset(r.id for r in fit_basis(rest, hw, where, fp8=True, stacks=stacks))
                if len(mine) >= MIN_FIT_RUNS:
                    basis = (fp8_fit_key(hw), stacks, mine, tuple(sorted(held16.items())))
                    if basis not in fits:
                        fits[basis] = fit_sustained(rest, hw, where, scorer=scorer, fp8=True, fixed=held16,
                                                    stacks=stacks)
                    kept, pooled = fits[basis], pooled or stacks == "all"
                    break
            else:  # no fp8 fit: the 16-bit fraction, a fallback as a spec without an fp8 fit takes it
                kept = held16.get(hw, _spec_sustained(hw))
                refit.update(dict.fromkeys((fp8_fit_key(n) + ASSUMED_FIT for n in names), 1.0))
            refit.update(dict.fromkeys(map(fp8_fit_key, names), kept))
        # what the other stacks keep of it: re-fitted on their runs left, at the fractions above; 1 (no difference
        # known) where fewer than MIN_FIT_RUNS are left or a fraction was fitted on every stack's runs already
        others = frozenset(r.id for hw in fp8_leaders for r in fit_basis(rest, hw, where, fp8=True, stacks="other"))
        if pooled or len(others) < MIN_FIT_RUNS:
            refit[FP8_STACK_FIT] = 1.0
        else:
            basis = (FP8_STACK_FIT, others, tuple(sorted(refit.items())))
            if basis not in fits:
                fits[basis] = fit_fp8_stack(rest, where, scorer=scorer, fixed=refit)
            refit[FP8_STACK_FIT] = fits[basis]
        imbalance = None  # the shipped value, where the sweep's runs are not in this dataset
        if source_family(sweep.source.name) == source_family(src):
            imbalance = 1.0  # nothing else to fit it to
        elif sweep_here:
            key = tuple(sorted((hw, f) for hw, f in refit.items() if hw in sweep_hardware))
            if key not in imbalances:
                imbalances[key] = dropless_imbalance(fit_dropless_imbalance(sweep, runs, where, refit, scorer=scorer))
            imbalance = imbalances[key]
        out += [scorer.score(r, where, refit, imbalance, evidence=False) for r in held]
    out = _evidence_left_out(runs, out, unfitted)
    order = {r.id: i for i, r in enumerate(runs.runs)}
    return sorted(out, key=lambda s: order[s.id])


def _spec_sustained(hardware: str) -> float:
    """A hardware spec's 16-bit GEMM sustained fraction (1 where it states none: all of the best rate kept)."""
    s = load_hardware(hardware).efficiency.gemm.sustained
    return s.value if s is not None else 1.0


def _evidence_left_out(runs: RunSet, held: list[Scored], unfitted: dict[str, set[str]]) -> list[Scored]:
    """Each held-out run's band made without its source (and its family), as a user's run from a source ddplan has
    not seen gets it; a GPU that leaving the family out leaves unfitted (`unfitted`, by source: unfitted_without) is
    thin for its runs:
    the base band (band_ratio, moe_band_ratio: picked by ddplan.price.base_band) from the other sources'
    leave-one-source-out ratios, rounded outward as the shipped one is, joined with the run's own efficiency range
    (Scored.spread_low_s, spread_high_s); then widened where the evidence is thin (ddplan.evidence) by tables made
    without its source: the runs and sources per value from the other sources' runs, and each dimension's thin-value
    spread from the other sources' leave-one-source-out ratios. Without this the shipped band, made from every
    source's ratios, would credit each source with its own (on 105 runs, 2026-12-06: the 5th-95th percentile band
    then shipped held 91% of the runs that way and 76% this way; on 113 runs this way it holds 79%, the interval at
    BAND_LEVEL 92%; on 117 runs 91%: BAND_COVERAGE)."""
    by_id = {r.id: r for r in runs.runs}
    out = []
    for src in sorted({s.source for s in held}):
        rest = [r for r in runs.runs if source_family(r.source.name) != source_family(src)]
        others = [s for s in held if source_family(s.source) != source_family(src)]
        counts = evidence_counts(rest)
        # a dimension whose thin values the others hold from fewer than two sources keeps the shipped spread
        unseen = {**UNSEEN_RATIO, **unseen_ratios(others, counts)}
        # a GPU the left-out family leaves unfitted is priced at the unfitted rule: thin for the held-out runs, as a
        # GPU without a fit is (the spread above stays the other sources' own thin values')
        counts = {**counts, "hardware": {**counts["hardware"], **{hardware_key(hw, "bf16"): (0, 0)
                                                                   for hw in unfitted.get(src, ())}}}
        bands = bands_without(others)
        for s in (x for x in held if x.source == src):
            s = joined(s, bands)
            out.append(_widened(s, thin_values(run_framework(by_id[s.id]), s.hardware, s.precision, counts, unseen)))
    return out


def bands_without(others: Sequence[Scored]) -> dict[str, tuple[float, float]]:
    """The base bands a held-out source's runs take, made from the other sources' scores: "16-bit" and "fp8" (dense,
    band_ratio) and "moe" (moe_band_ratio), rounded outward; each the shipped one where the others hold fewer than two
    sources of its kind (_band_or)."""
    return {"16-bit": _band_or(lambda: band_ratio(others), VALIDATED_RATIO),
            "fp8": _band_or(lambda: band_ratio(others, fp8=True), VALIDATED_RATIO_FP8),
            "moe": _band_or(lambda: moe_band_ratio(others), VALIDATED_RATIO_MOE)}


def joined(s: Scored, bands: dict[str, tuple[float, float]]) -> Scored:
    """A run's band: its efficiency spread (Scored.spread_low_s, spread_high_s) joined with its kind's base band of
    `bands` (bands_without), picked as a prediction's is (ddplan.price.base_band)."""
    lo, hi = base_band(s.moe, s.precision == "fp8", bands["16-bit"], bands["fp8"], bands["moe"])
    if s.spread_low_s is None or s.spread_high_s is None:
        raise ValueError(f"{s.id}: scored without its efficiency spread (Scored.spread_low_s), so its band cannot be "
                         f"made without its source")
    return replace(s, low_s=min(s.spread_low_s, s.predicted_s * lo), high_s=max(s.spread_high_s, s.predicted_s * hi))


def _band_or(make: Callable[[], tuple[float, float] | None], shipped: tuple[float, float]) -> tuple[float, float]:
    """A band made from the other sources' runs, rounded outward; the shipped one where they hold too few sources of
    its kind to make one (a small dataset of the user's own: the band every prediction of that kind carries)."""
    band = make()
    return outward(band) if band is not None else shipped


def outward(band: tuple[float, float], step: float = 0.01) -> tuple[float, float]:
    """A band's ends rounded outward to `step` (the shipped bands' rounding): the low end down, the high end up."""
    return (math.floor(band[0] / step + 1e-9) * step, math.ceil(band[1] / step - 1e-9) * step)


def _widened(s: Scored, thin: tuple) -> Scored:
    """A run scored with the base uncalibrated band, its band widened where the evidence is thin: the prediction
    times each thin value's group band, on either side. The priced band is min/max of the efficiency ends and the
    prediction times the band's factors, so widening after pricing gives what pricing with the wider band does."""
    if not thin:
        return s
    return replace(s, low_s=min([s.low_s, *(s.predicted_s * t.band[0] for t in thin)]),
                   high_s=max([s.high_s, *(s.predicted_s * t.band[1] for t in thin)]))


# --------------------------------------------------------------------------------------------
# Measured peak memory (validation/memory_peaks.yaml): predicted vs measured, and whether the verdict was right

@dataclass(frozen=True)
class PeakScored:
    """One measured peak priced: GB = 1e9 bytes, as the tools report."""

    id: str
    source: str
    hardware: str
    gpus: int
    framework: str
    outcome: str  # ran | out_of_memory
    what: str  # what the measurement counts (NOT_COUNTED's keys); "-" for an out-of-memory report
    measured_gb: float | None
    predicted_gb: float  # in the measurement's terms
    total_gb: float  # the whole predicted peak, the one the verdict compares with the limit
    limit_gb: float  # usable memory less the headroom
    fits: bool  # the central estimate's answer (what ranks layouts)
    verdict: str  # ddplan's verdict with the band on it: fits, may not fit, does not fit (ddplan.memory.fit_verdict)
    band: tuple[float, float] = PEAK_RATIO  # the band the verdict took: measured / predicted, (low, high)
    capacity_gb: float | None = None  # usable memory, which "does not fit" is said against (None: the limit)

    @property
    def error(self) -> float | None:
        """predicted / measured - 1 (None without a measured figure)."""
        return None if self.measured_gb is None else self.predicted_gb / self.measured_gb - 1

    @property
    def ratio(self) -> float | None:
        """measured / predicted (None without a measured figure): what the verdict's band is made of."""
        return None if self.measured_gb is None else self.measured_gb / self.predicted_gb

    @property
    def verdict_right(self) -> bool:
        """Not wrong: ddplan did not say "does not fit" for a configuration that ran, nor "fits" for one that ran out
        of memory ("may not fit" is right either way, and counted apart: peak_summary)."""
        return not (self.outcome == "ran" and self.verdict == DOES_NOT_FIT
                    or self.outcome == "out_of_memory" and self.verdict == FITS)

    def with_band(self, band: tuple[float, float]) -> PeakScored:
        """This peak's verdict under another band (leaving its source out of the band's fit)."""
        return replace(self, verdict=fit_verdict(self.total_gb, self.limit_gb, band, self.capacity_gb), band=band)

    def row(self) -> dict:
        e = self.error
        return {"id": self.id, "source": self.source, "hardware": self.hardware, "gpus": self.gpus,
                "framework": self.framework, "outcome": self.outcome, "measured_what": self.what,
                "measured_gb": self.measured_gb, "predicted_gb": self.predicted_gb,
                "error_pct": None if e is None else 100 * e, "predicted_total_gb": self.total_gb,
                "limit_gb": self.limit_gb, "capacity_gb": self.capacity_gb, "fits": self.fits, "verdict": self.verdict,
                "band_low": self.band[0], "band_high": self.band[1], "verdict_right": self.verdict_right}


def score_peak(peak: MeasuredPeak, where: str) -> PeakScored:
    """Price one measured peak through `ddplan table`'s path (ddplan.replay.price_run) and compare."""
    _, hw, row = price_run(peak, where)
    terms = row.memory.terms
    what = peak.measured.what if peak.measured is not None else "-"
    predicted = predicted_peak_bytes(terms, peak.measured.what if peak.measured is not None else "device")
    return PeakScored(id=peak.id, source=peak.source.name, hardware=hw.name, gpus=peak.layout.gpus,
                      framework=peak.framework or "-", outcome=peak.outcome, what=what,
                      measured_gb=peak.measured.peak_gb if peak.measured is not None else None,
                      predicted_gb=predicted / 1e9, total_gb=row.memory.total / 1e9, limit_gb=row.memory.limit / 1e9,
                      fits=row.memory.fits, verdict=row.memory.verdict, capacity_gb=row.memory.capacity / 1e9)


RAN = "ran (step time)"  # PeakScored.what of a published step-time run: it ran, its peak unmeasured


def score_ran(run: PublishedRun, where: str) -> PeakScored:
    """A published step-time run as a configuration known to have run (no peak measured): its memory verdict,
    which must not be "does not fit". Priced as `ddplan table` prices it, at the micro-batch it states, else at
    micro-batch 1, the least it can have run at (so "does not fit" there is wrong whatever it ran at)."""
    if run.layout.micro_batch is None:
        run = run.model_copy(update={"layout": run.layout.model_copy(update={"micro_batch": 1})})
    _, hw, row = price_run(run, where)
    total = row.memory.total
    return PeakScored(id=run.id, source=run.source.name, hardware=hw.name, gpus=run.layout.gpus,
                      framework=run.framework or "-", outcome="ran", what=RAN, measured_gb=None,
                      predicted_gb=total / 1e9, total_gb=total / 1e9, limit_gb=row.memory.limit / 1e9,
                      fits=row.memory.fits, verdict=row.memory.verdict, capacity_gb=row.memory.capacity / 1e9)


def score_published_ran(skip: set[str] = frozenset(), path: str | None = None) -> list[PeakScored]:
    """Every run of the step-time dataset (the shipped one, or `path`) as a configuration that ran (score_ran),
    except those whose id is in `skip` (a peak dataset's own entry for the same run)."""
    where = path or shipped_dataset()
    return [score_ran(r, f"{where}: runs.{i} ({r.id})") for i, r in enumerate(load_runs(path).runs)
            if r.id not in skip]


def score_memory(dataset: str | None = None) -> list[PeakScored]:
    """Every peak of a peak dataset (the shipped validation/memory_peaks.yaml, or `dataset`) priced and compared
    (score_peak); with the shipped one, the shipped step-time runs after them, as configurations that ran
    (score_published_ran, without those a peak already states)."""
    where = dataset or str(builtin_dir("validation") / MEMORY_PEAKS)
    peaks = load_peaks(dataset).peaks
    scored = [score_peak(p, f"{where}: peaks.{i} ({p.id})") for i, p in enumerate(peaks)]
    if dataset is None:
        scored += score_published_ran({p.id for p in peaks})
    return scored


def peak_band(scored: Sequence[PeakScored]) -> tuple[float, float]:
    """(5th, 95th) percentile of measured / predicted over the measured peaks: what ddplan.memory.PEAK_RATIO, the
    band a memory verdict carries, is built from (as the step time's band is: band_ratio). Nothing in the memory
    model is fitted to the peaks; the band is."""
    ratios = [s.ratio for s in scored if s.ratio is not None]
    return percentile(ratios, 0.05), percentile(ratios, 0.95)


def peaks_leaving_each_source_out(scored: Sequence[PeakScored]) -> list[PeakScored]:
    """Each peak's verdict under the band fitted without its source's peaks: how the verdict does on a
    configuration from a source it has not seen (the band of all the others; the shipped band where the others
    measured no peak)."""
    out = []
    for s in scored:
        others = [o for o in scored if o.source != s.source and o.ratio is not None]
        out.append(s.with_band(peak_band(others) if others else PEAK_RATIO))
    return out


def peak_summary(scored: Sequence[PeakScored], group: str = "all") -> dict:
    """Median and largest |error| of the measured peaks, the share of right verdicts and of "may not fit", and
    the two wrong ones counted apart: "does not fit" for a configuration that ran, "fits" for one that ran out
    of memory."""
    errors = [abs(s.error) for s in scored if s.error is not None]
    return {"group": group, "peaks": len(scored), "measured": len(errors),
            "median_abs_error_pct": 100 * statistics.median(errors) if errors else None,
            "max_abs_error_pct": 100 * max(errors) if errors else None,
            "verdict_right_pct": 100 * sum(s.verdict_right for s in scored) / len(scored),
            "may_not_fit_pct": 100 * sum(s.verdict == MAY_NOT_FIT for s in scored) / len(scored),
            "false_does_not_fit": sum(s.outcome == "ran" and s.verdict == DOES_NOT_FIT for s in scored),
            "false_fits": sum(s.outcome == "out_of_memory" and s.verdict == FITS for s in scored)}


def _evidence(s: PeakScored) -> str:
    """What a scored configuration's source saw: a measured peak, an out-of-memory failure, or a run (no peak)."""
    if s.measured_gb is not None:
        return "measured peak"
    return "out of memory" if s.outcome == "out_of_memory" else "ran, no peak"


def peak_summaries(scored: Sequence[PeakScored]) -> list[dict]:
    """The overall summary, then one per kind of evidence, source, framework and hardware."""
    out = [peak_summary(scored)]
    for name, key in (("evidence", _evidence), ("source", lambda s: s.source), ("framework", lambda s: s.framework),
                      ("hardware", lambda s: s.hardware)):
        groups: dict[str, list[PeakScored]] = {}
        for s in scored:
            groups.setdefault(key(s), []).append(s)
        out += [peak_summary(v, f"{name}={k}") for k, v in sorted(groups.items())]
    return out
