"""Published GEMM sweeps, and the shape curve of ddplan's GEMM efficiency fitted to them.

A sweep (validation/gemm_sweeps.yaml) is a list of GEMM shapes timed one at a time on one GPU, as
TFLOP/s. ddplan prices a GEMM of shape (m x k) @ (k x n) as

    t = max(2 m n k / (peak x level x shape(m, n, k; half_dim)), bytes / (HBM x efficiency)) + overhead
    shape = prod_d d / (d + half_dim)                       (ddplan.roofline.gemm_efficiency)

fit_half_dim finds the half_dim, the fixed cost of a call (launch, prologue, epilogue, the tail wave:
what a 1024^3 GEMM of a few microseconds of work is mostly made of) and a level (the sweep's own
large-shape fraction of peak, which is then dropped: in training the spec's best x sustained set the
level) that minimise the squared log error of that time over the sweep's points. The spec keeps
half_dim and the fixed cost (efficiency.gemm.half_dim, efficiency.gemm.fixed_us).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from typing import Literal

from pydantic import Field

from ddplan.errors import SpecError
from ddplan.fitting import golden_min
from ddplan.registry import builtin_dir
from ddplan.roofline import Rates, gemm_forward_s, rates
from ddplan.specfile import read_yaml, validate
from ddplan.specs import HardwareSpec, Strict
from ddplan.units import BYTES_PER_DTYPE, US

SWEEPS = "gemm_sweeps.yaml"


class SweepSource(Strict):
    ref: str = Field(min_length=3)  # repository (owner/name) or paper
    where: str = Field(min_length=3)  # file and table
    commit: str | None = None


class GemmSweep(Strict):
    """One GPU's published sweep: [m, n, k, TFLOP/s] points in one dtype."""

    hardware: str = Field(min_length=1)
    dtype: Literal["bf16", "fp16", "fp8"]
    source: SweepSource
    points: list[tuple[int, int, int, float]] = Field(min_length=3)


class GemmSweepSet(Strict):
    kind: Literal["gemm_sweeps"]
    sweeps: list[GemmSweep] = Field(min_length=1)


def shipped_sweeps() -> str:
    return str(builtin_dir("validation") / SWEEPS)


def load_sweeps(path: str | None = None) -> GemmSweepSet:
    """A sweeps file (default: the shipped one), validated; errors name the file and field."""
    from pathlib import Path

    p = Path(path or shipped_sweeps())
    if not p.exists():
        raise SpecError("no such file", file=str(p))
    out = validate(GemmSweepSet, read_yaml(p), str(p))
    for s in out.sweeps:
        for m, n, k, tflops in s.points:
            if min(m, n, k) <= 0 or not 0 < tflops < 1e5:
                raise SpecError(f"point {[m, n, k, tflops]}: sizes and TFLOP/s must be positive", file=str(p),
                                field=f"sweeps.{s.hardware}.points")
    return out


def sweep_rates(sweep: GemmSweep, hw: HardwareSpec, level: float, half_dim: float, fixed_s: float) -> Rates:
    """The spec's rates in the sweep's dtype with the GEMM curve replaced: level x shape(half_dim), fixed_s a call."""
    r = rates(hw, hw.default_attention, dtype="bf16" if sweep.dtype == "fp16" else sweep.dtype)
    return replace(r, gemm_best=level, gemm_half_dim=half_dim, gemm_overhead_s=fixed_s)


def point_tflops(m: int, n: int, k: int, dtype: str, r: Rates) -> float:
    """TFLOP/s of one GEMM call as ddplan prices it (ddplan.roofline.gemm_forward_s): inputs in the
    sweep's dtype, a 16-bit output."""
    moved = BYTES_PER_DTYPE[dtype] * (m * k + k * n) + BYTES_PER_DTYPE["bf16"] * m * n
    return 2.0 * m * n * k / gemm_forward_s(m, n, k, 2.0 * m * n * k, moved, r) / 1e12


@dataclass(frozen=True)
class SweepFit:
    """The shape curve and call cost fitted to one sweep, with every point's predicted / measured - 1."""

    hardware: str
    dtype: str
    half_dim: float
    fixed_us: float  # one call's cost beyond its work, microseconds
    level: float  # fraction of the dtype's dense peak at large shapes, in the sweep (not used in training)
    residuals: tuple[tuple[int, int, int, float, float], ...]  # (m, n, k, measured TFLOP/s, error)

    @property
    def at_lower_edge(self) -> bool:
        """The fit's half_dim is the search's lower bound: the sweep does not bound it from below."""
        return self.half_dim <= HALF_DIM_RANGE[0] * 1.01

    def rms(self) -> float:
        """Root mean square of the log errors over the sweep's points."""
        return math.sqrt(statistics.fmean(math.log1p(e) ** 2 for *_, e in self.residuals))


HALF_DIM_RANGE = (8.0, 2048.0)  # searched, on a log scale
FIXED_US_RANGE = (0.0, 60.0)


def fit_half_dim(sweep: GemmSweep, hw: HardwareSpec, half_dim: float | None = None) -> SweepFit:
    """half_dim, the call's fixed cost and the sweep's level minimising the squared log error of ddplan's
    GEMM time (point_tflops) over the sweep's points: nested golden-section searches, half_dim on a log
    scale in HALF_DIM_RANGE, the fixed cost in FIXED_US_RANGE, the level in [0.05, 1]. With half_dim
    given, only the fixed cost and level are fitted (the residuals of a spec's own value)."""
    def cost(level: float, h: float, fixed_us: float) -> float:
        r = sweep_rates(sweep, hw, level, h, fixed_us * US)
        return sum(math.log(point_tflops(m, n, k, sweep.dtype, r) / t) ** 2 for m, n, k, t in sweep.points)

    def level_for(h: float, fixed_us: float) -> float:
        return golden_min(lambda lv: cost(lv, h, fixed_us), 0.05, 1.0, 1e-4)

    def fixed_for(h: float) -> float:
        return golden_min(lambda f: cost(level_for(h, f), h, f), *FIXED_US_RANGE, 0.02)

    def by_half_dim(log_h: float) -> float:
        h = math.exp(log_h)
        f = fixed_for(h)
        return cost(level_for(h, f), h, f)

    if half_dim is None:
        half_dim = math.exp(golden_min(by_half_dim, *map(math.log, HALF_DIM_RANGE), 1e-3))
    fixed_us = fixed_for(half_dim)
    level = level_for(half_dim, fixed_us)
    r = sweep_rates(sweep, hw, level, half_dim, fixed_us * US)
    res = tuple((m, n, k, t, point_tflops(m, n, k, sweep.dtype, r) / t - 1) for m, n, k, t in sweep.points)
    return SweepFit(hardware=hw.name, dtype=sweep.dtype, half_dim=half_dim, fixed_us=fixed_us, level=level,
                    residuals=res)
