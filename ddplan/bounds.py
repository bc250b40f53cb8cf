"""The range every number given on the command line must fall in, with its unit.

Finite, and within physical sense: a value outside is a one-line usage error naming the flag and the
range (docs/reference.md, "Input ranges", lists this table). The ranges are generous on purpose (a thousand times
past the largest runs published) and exist so that nonsense (NaN, infinity, 10^30 GPUs) is refused
before any work, and so that the work a command does stays bounded.
"""

from __future__ import annotations

import math

from ddplan.errors import UsageError
from ddplan.runfields import FIELDS

# flag -> (lowest, highest, unit); lowest is inclusive unless LOW_EXCLUSIVE names the flag. The run's fields
# declare theirs (ddplan.runfields); calibrate's own flags are here.
RANGES: dict[str, tuple[float, float, str]] = {
    **{f.flag: (f.range.low, f.range.high, f.range.unit) for f in FIELDS if f.range is not None},
    "--micro-batches": (1, 65_536, "sequences"),
    "--nproc": (1, 1024, "GPUs on this box"),
}
LOW_EXCLUSIVE = {f.flag for f in FIELDS if f.range is not None and f.range.low_open}
HIGH_EXCLUSIVE = {f.flag for f in FIELDS if f.range is not None and f.range.high_open}


def describe(flag: str) -> str:
    """The allowed range of a flag, in words: '[1, 1,000,000] GPUs in total'."""
    lo, hi, unit = RANGES[flag]
    left = "(" if flag in LOW_EXCLUSIVE else "["
    right = ")" if flag in HIGH_EXCLUSIVE else "]"
    return f"{left}{_num(lo)}, {_num(hi)}{right} {unit}"


def _num(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"


def check(flag: str, value: float | int | None) -> None:
    """Raise UsageError naming the flag and its range unless value is None or a finite number in range."""
    if value is None:
        return
    lo, hi, _ = RANGES[flag]
    ok = isinstance(value, (int, float)) and math.isfinite(value)
    if ok:
        ok = (value > lo if flag in LOW_EXCLUSIVE else value >= lo) and \
             (value < hi if flag in HIGH_EXCLUSIVE else value <= hi)
    if not ok:
        raise UsageError(f"must be a finite number in {describe(flag)}, got {value}", field=flag)
