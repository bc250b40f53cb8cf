"""Fit one efficiency knob to a measured training step, so every other layout is derived from it.

A measurement pins exactly what was measured: its GPUs, layout (tp, pp, ZeRO), device batch, total
batch, attention, window, recompute and compile mode. If that configuration cannot be priced as given
(the batch does not split over its ranks), it is an error naming the flags, never a silent rounding.

The fit is done separately in each scenario of the other efficiencies (their low end, their high end
and points between), so a derived row's band carries what the measurement did not pin down. Scenarios
that would need the fitted kernel faster than the device's best measured GEMM are ruled out; when
even the central fit needs that, the measurement is implausible as stated, and the band falls back to
the model's own.

"fit" in ddplan means this (a measurement's fit); memory is said to fit or not in ddplan.memory.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from ddplan.calibration import StepMeasurement, fit_factor
from ddplan.errors import ImpossibleMeasurement, LayoutError, UsageError
from ddplan.flops import exact_flops_per_token, mfu
from ddplan.layout import Layout, Options, check_layout, data_parallel, layout_for
from ddplan.roofline import FIT_SCENARIOS, Rates, Scenario
from ddplan.specs import ModelSpec, run_variant

MEASURED_FLAGS = ("--measured-gpus/--measured-tp/--measured-pp/--vp/--zero/--device-batch-size/--total-batch-size/"
                  "--recompute")


@dataclass(frozen=True)
class Fit:
    """A knob's efficiency factor per scenario, fitted to one measured step."""

    knob: str  # gemm | attention | compute
    factors: dict  # scenario -> factor; "value" first
    measurement: StepMeasurement
    layout: Layout  # the measured layout, exactly
    window: str
    seq_len: int
    implied: float  # the fitted knob's efficiency at the central fit, fraction of peak
    ceiling: float  # the best measured GEMM efficiency (top of its range)
    dropped: tuple[Scenario, ...] = ()  # scenarios ruled out (they would need more than the ceiling)

    @property
    def implausible(self) -> bool:
        """The central fit needs the knob faster than the best measured GEMM: check the measurement."""
        return self.implied > self.ceiling

    def apply(self, r: Rates, attention: str, scenario: Scenario) -> Rates:
        """Rates with this fit's factor: GEMMs everywhere; attention only in the measured implementation."""
        f = self.factors.get(scenario, self.factors["value"])
        return scale(r, self.knob, f, attention == self.measurement.attention)

    def is_measured(self, layout: Layout, window: str, batch_tokens: int, seq_len: int) -> bool:
        return (layout == self.layout and window == self.window and seq_len == self.seq_len
                and batch_tokens == self.measurement.total_batch_tokens)


def scale(r: Rates, knob: str, factor: float, measured_attention: bool) -> Rates:
    """Rates with the knob scaled: gemm always; attention and compute fully only where the measured
    implementation runs (elsewhere compute scales the GEMMs alone)."""
    if knob == "gemm" or measured_attention:
        return r.scaled(knob, factor)
    if knob == "compute":
        return r.scaled("gemm", factor)
    return r


def measured_layout(spec: ModelSpec, m: StepMeasurement, where: str = MEASURED_FLAGS,
                    options: Options = Options()) -> Layout:
    """The layout a measurement ran with, exactly, with the command's framework options where they apply (a
    measurement states its degrees, not its stack: the options its rows run with are what it ran with); a one-line
    error naming `where` (the flags, or the calibration file's entry) when it cannot exist or its batch does not
    split into whole micro-batches."""
    seq = m.seq_len or spec.recipe.seq_len
    try:
        dp = data_parallel(m.gpus, m.tp, m.pp)
        problem = ""
    except LayoutError as e:
        dp, problem = 1, e.message
    if not problem and m.total_batch_tokens % seq:
        problem = f"total batch {m.total_batch_tokens:,} tokens is not a multiple of the sequence length {seq}"
    elif not problem and (m.total_batch_tokens // seq) % (dp * m.device_batch_size):
        problem = (f"{m.total_batch_tokens // seq:,} sequences do not split into dp {dp} x device batch "
                   f"{m.device_batch_size} x whole micro-batches")
    if problem:
        raise UsageError(f"the measured configuration cannot be priced as given: {problem}; state what ran",
                         field=where)
    try:
        layout = layout_for(spec, gpus=m.gpus, tp=m.tp, pp=m.pp, vp=m.pp_virtual_stages, zero=m.zero,
                            micro_batch=m.device_batch_size,
                            grad_accum=m.total_batch_tokens // seq // (dp * m.device_batch_size),
                            attention=m.attention, recompute=m.recompute, compiled=m.compiled,
                            schedule=m.pp_schedule)
        # the options where they can apply to what ran (Options.searched: a shard group that does not divide its
        # ranks, or activation offload under its pipeline, is left out, not refused)
        layout = replace(layout, **options.searched(layout.tp, layout.grad_ranks, layout.zero, layout.cp, layout.pp))
        check_layout(layout, spec, world_size_rule=False)
    except LayoutError as e:
        raise UsageError(f"the measured layout cannot exist: {e.message}", field=where) from None
    return layout


def fitted(pricer, m: StepMeasurement, knob: str = "auto", where: str = MEASURED_FLAGS, options: Options = Options()):
    """(the pricer with m's fit applied, the Fit). A measurement at another sequence length is fitted
    on the model at that length; the fitted efficiencies then serve every row. options: the command's framework
    options, which the measured layout takes as its rows do."""
    measured_pricer = pricer
    if m.seq_len and m.seq_len != pricer.spec.recipe.seq_len:
        try:
            spec = run_variant(pricer.spec, seq_len=m.seq_len)
        except ValueError as e:
            raise UsageError(f"the measured sequence length: {e}", field=where) from None
        measured_pricer = type(pricer)(spec, pricer.hw, pricer.plan, pricer.calibration, pricer.fp8,
                                       fp8_recipe=pricer.fp8_recipe)
    fit = fit_measurement(measured_pricer, m, knob, where, options)
    return pricer.with_fit(fit), fit


def fit_measurement(pricer, m: StepMeasurement, knob: str = "auto", where: str = MEASURED_FLAGS,
                    options: Options = Options()) -> Fit:
    """Fit `knob` to m; with auto, the one whose assumed range moves the measured step most, else (when
    no factor of it can reach the measurement) the other, else both GEMMs and attention together.

    pricer: an unfitted ddplan.price.Pricer for the measured model (at the measured sequence length).
    """
    hw, spec = pricer.hw, pricer.spec
    if m.attention not in {a.name for a in hw.attention}:
        raise UsageError(f"measured attention {m.attention!r} is not available on {hw.name}; allowed: "
                         f"{', '.join(a.name for a in hw.attention)}",
                         field="--measured-attention" if where == MEASURED_FLAGS else where)
    layout = measured_layout(spec, m, where, options)
    window = m.window_pattern or spec.architecture.window_pattern
    check_physical(pricer, m, window, where)

    def predict(scenario: Scenario, k: str, f: float) -> float:
        r = scale(pricer.rates(m.attention, scenario, fitted=False), k, f, True)
        return pricer.step(layout, window, scenario, r=r).total_s

    candidates = [knob]
    if knob == "auto":  # the knob whose range moves the step most; then the other, then both together
        widths = {}
        base = pricer.rates(m.attention, "value", fitted=False)
        for k in ("gemm", "attention"):
            ends = []
            for end in ("low", "high"):
                e = pricer.rates(m.attention, end, fitted=False)
                r = replace(base, gemm_best=e.gemm_best) if k == "gemm" else replace(
                    base, attn_fwd=e.attn_fwd, attn_bwd=e.attn_bwd)
                ends.append(pricer.step(layout, window, "value", r=r).total_s)
            widths[k] = max(ends) - min(ends)
        candidates = [*sorted(widths, key=widths.get, reverse=True), "compute"]
    for i, knob in enumerate(candidates):
        try:
            factors = {scen: fit_factor(lambda f, s=scen: predict(s, knob, f), m.step_time_s)
                       for scen in FIT_SCENARIOS}
            break
        except ValueError as e:
            if i + 1 == len(candidates):
                raise UsageError(f"cannot fit {knob} efficiency to the measured {m.step_time_s} s: {e}",
                                 field="--measured-step-time" if where == MEASURED_FLAGS else where) from None
    ceiling = hw.efficiency.gemm.best.range[1]

    def implied(scen: Scenario) -> float:
        r = pricer.rates(m.attention, scen, fitted=False).scaled(knob, factors[scen])
        return (max(r.gemm_best, r.attn_fwd, r.attn_bwd) if knob == "compute" else
                r.gemm_best if knob == "gemm" else max(r.attn_fwd, r.attn_bwd))

    dropped = tuple(s for s in FIT_SCENARIOS if s != "value" and implied(s) > ceiling)
    kept = {s: f for s, f in factors.items() if s not in dropped}
    return Fit(knob=knob, factors=kept, measurement=m, layout=layout, window=window, seq_len=spec.recipe.seq_len,
               implied=implied("value"), ceiling=ceiling, dropped=dropped)


def check_physical(pricer, m: StepMeasurement, window: str, where: str = MEASURED_FLAGS) -> None:
    """Refuse a measured step that runs the model's matmul FLOPs faster than the GPUs' dense peak.

    The FLOPs are ddplan.flops.exact_flops_per_token: 6N plus causal (and windowed) attention, no FLOPs on
    masked pairs and no recompute, a lower bound on what any step executes (the MFU convention counts
    whole windows, more than a causal kernel runs, so it is not used here). Such a figure cannot have been
    measured as stated: a typo in the step time, the batch or the GPU count. The peak is the fastest the
    step could use (fp8's with --fp8). Between the best measured GEMM rate and the peak a measurement is
    only implausible (Fit.implausible: said, and priced with the model's band), up to ddplan.table's
    IMPLAUSIBLE_MARGIN above it for a step stated with --measured-step-time (refused past it). e.g. d24 at
    T = 2048, window SSSL, 1,048,576 tokens on 8 H100 (989.4 TFLOP/s bf16): at least 0.6148 s; 0.45 s/step is
    refused here; 0.9 s passes here but needs GEMMs at 1.45 of peak, 1.8x H100's best (0.80): refused by
    table; 1.8 s is priced.
    """
    hw, spec = pricer.hw, pricer.spec
    dtype = "fp8" if pricer.fp8 else spec.dtypes.compute
    peak = hw.peak.flops_per_s(dtype)
    per_token = exact_flops_per_token(spec.architecture.model_copy(update={"window_pattern": window}),
                                      spec.recipe.seq_len)
    used = mfu(per_token, m.total_batch_tokens / m.step_time_s, peak, m.gpus)  # of peak, a fraction
    if used > 1:
        flops, least_s = per_token * m.total_batch_tokens, used * m.step_time_s
        flags = where == MEASURED_FLAGS
        field = "--measured-step-time" if flags else where
        check = ("check the step time, --total-batch-size and --measured-gpus" if flags else
                 "check its step_time_s, total_batch_tokens and gpus")
        raise ImpossibleMeasurement(
            f"{m.step_time_s:g} s/step is faster than the hardware can run it: {flops / 1e12:,.4g} TFLOP of "
            f"matmuls ({m.total_batch_tokens:,} tokens, causal attention, no recompute) take at least "
            f"{least_s:.4g} s on {m.gpus} {hw.name} at their {peak / 1e12:,.5g} TFLOP/s dense {dtype} peak "
            f"({100 * used:.0f}% of peak); {check}", field=field)


def golden_min(cost: Callable[[float], float], lo: float, hi: float, tol: float) -> float:
    """The x in [lo, hi] minimising a unimodal cost, to within tol (golden-section search; Kiefer 1953)."""
    if not lo < hi or tol <= 0:
        raise ValueError(f"need lo < hi and tol > 0; got {lo}, {hi}, {tol}")
    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = cost(c), cost(d)
    while b - a > tol:
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = cost(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = cost(d)
    return (a + b) / 2


def rising_root(f: Callable[[float], float], lo: float, hi: float, tol: float, ftol: float,
                f_lo: float | None = None, f_hi: float | None = None) -> float:
    """The x in [lo, hi] where a rising f crosses 0, to within tol in x or ftol in f (the Illinois variant of
    false position; Dowell & Jarratt 1971, BIT 11:168). f_lo, f_hi: f at the ends where the caller has them.

    On a straight line the first guess is the root; on a piecewise-linear f (a step time against the
    imbalance: the busiest stage may change) it takes a few guesses where bisection takes log2((hi - lo) / tol).
    e.g. f(x) = 2x - 3 on [1, 4]: f(1) = -1, f(4) = 5, the guess (1 x 5 - 4 x -1) / 6 = 1.5 is the root."""
    if not lo < hi or tol <= 0 or ftol < 0:
        raise ValueError(f"need lo < hi, tol > 0 and ftol >= 0; got {lo}, {hi}, {tol}, {ftol}")
    f_lo = f(lo) if f_lo is None else f_lo
    f_hi = f(hi) if f_hi is None else f_hi
    if f_lo > 0 or f_hi < 0:
        raise ValueError(f"f does not cross 0 rising on [{lo}, {hi}]: f = {f_lo:g} and {f_hi:g}")
    if f_lo == 0 or f_hi == 0:
        return lo if f_lo == 0 else hi
    kept = 0  # the end kept twice in a row has its f halved (Illinois), so the bracket shrinks from both sides
    while hi - lo > tol:
        x = (lo * f_hi - hi * f_lo) / (f_hi - f_lo)
        fx = f(x)
        if abs(fx) <= ftol:
            return x
        if fx < 0:
            lo, f_lo = x, fx
            f_hi = f_hi / 2 if kept == 1 else f_hi
            kept = 1
        else:
            hi, f_hi = x, fx
            f_lo = f_lo / 2 if kept == -1 else f_lo
            kept = -1
    return (lo + hi) / 2
