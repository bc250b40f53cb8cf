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
