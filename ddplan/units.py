"""Units. Everything inside ddplan is SI (bytes, seconds, FLOP, FLOP/s); specs convert once, on load.

GB is 1e9 bytes and GiB is 2**30 bytes; "MB" never means 2**20. Bandwidths are decimal
(GB/s = 1e9 B/s), as vendors and nccl-tests quote them.
"""

from __future__ import annotations

from typing import Literal

KB = 1e3
MB = 1e6
GB = 1e9
TB = 1e12
KiB = 2**10
MiB = 2**20
GiB = 2**30

TFLOPS = 1e12  # FLOP/s
GBIT = 1e9 / 8  # bytes in one gigabit
US = 1e-6  # seconds in one microsecond
MS = 1e-3
HOUR = 3600.0

Dtype = Literal["fp32", "tf32", "bf16", "fp16", "fp8"]

BYTES_PER_DTYPE: dict[str, int] = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a storage dtype (tf32 is stored as fp32)."""
    try:
        return BYTES_PER_DTYPE[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; allowed: {', '.join(BYTES_PER_DTYPE)}") from None


def hours_band(low_h: float, high_h: float) -> str:
    """A band of hours, 'low-high h', as a verdict writes hours: whole hours from 100 h, tenths from 1 h, three
    significant figures below ('0.35-0.495 h', '3.1-5.4 h', '23,772-35,161 h')."""
    def one(h: float) -> str:
        return f"{h:,.0f}" if h >= 100 else f"{h:,.1f}" if h >= 1 else f"{h:.3g}"

    return f"{one(low_h)}-{one(high_h)} h"
