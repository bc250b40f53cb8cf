"""The range every number given on the command line must fall in, with its unit.

Finite, and within physical sense: a value outside is a one-line usage error naming the flag and the
range (docs/reference.md, "Input ranges", lists this table). The ranges are generous on purpose (a thousand times
past the largest runs published) and exist so that nonsense (NaN, infinity, 10^30 GPUs) is refused
before any work, and so that the work a command does stays bounded.
"""

from __future__ import annotations

import math

from ddplan.errors import UsageError

# flag -> (lowest, highest, unit); lowest is inclusive unless LOW_EXCLUSIVE names the flag
RANGES: dict[str, tuple[float, float, str]] = {
    "--gpus": (1, 1_000_000, "GPUs in total"),
    "--measured-gpus": (1, 1_000_000, "GPUs in total"),
    "--tp": (1, 1024, "tensor-parallel degree"),
    "--measured-tp": (1, 1024, "tensor-parallel degree"),
    "--pp": (1, 1024, "pipeline stages"),
    "--measured-pp": (1, 1024, "pipeline stages"),
    "--vp": (1, 64, "chunks per pipeline stage"),
    "--shard-group": (2, 1_000_000, "data-parallel ranks a ZeRO-3 shard spans"),
    "--cp": (1, 1024, "context-parallel degree"),
    "--ep": (1, 4096, "expert-parallel degree"),
    "--moe-imbalance": (1, 64, "busiest expert-parallel rank's routed rows over the mean"),
    "--device-batch-size": (1, 65_536, "sequences per GPU per micro-batch"),
    "--micro-batches": (1, 65_536, "sequences"),
    "--total-batch-size": (1, 10**12, "tokens per step"),
    "--seq-len": (1, 10**8, "tokens"),
    "--steps": (1, 10**9, "optimizer steps"),
    "--tokens": (1, 10**16, "training tokens"),
    "--param-data-ratio": (1e-3, 1e6, "tokens per parameter"),
    "--price": (0, 10_000, "USD per GPU-hour"),
    "--budget": (0, 10**13, "USD"),
    "--deadline": (0, 10**7, "hours"),
    "--startup-min": (0, 100_000, "minutes"),
    "--eval-every": (0, 10**9, "steps (0: never)"),
    "--eval-tokens": (1, 10**15, "tokens"),
    "--checkpoint-every": (0, 10**9, "steps (0: at the end only)"),
    "--interruptions-per-gpu-hour": (0, 1, "job interruptions a GPU-hour (0: none)"),
    "--restart-min": (0, 100_000, "minutes"),
    "--measured-step-time": (0, 10**6, "seconds"),
    "--measured-peak": (0, 10**6, "GB"),
    "--headroom": (0, 1, "fraction of usable memory"),
    "--top": (1, 10**6, "layouts"),
    "--nproc": (1, 1024, "GPUs on this box"),
}
LOW_EXCLUSIVE = {"--price", "--budget", "--deadline", "--measured-step-time", "--measured-peak"}
HIGH_EXCLUSIVE = {"--headroom"}


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
