"""Host memory reuse for CPU calibrations: glibc malloc told to keep freed memory, as a GPU's caching allocator does.

PyTorch's CPU allocator has no cache: each tensor is a posix_memalign and each free gives the block back
to glibc malloc. glibc serves a block above its mmap threshold with a fresh mmap (the threshold adapts
upward to the largest freed block but never past 32 MiB on 64-bit: DEFAULT_MMAP_THRESHOLD_MAX =
4 x 1024 x 1024 x sizeof(long)) and unmaps it on free, and it trims the heap's top above M_TRIM_THRESHOLD.
So every training step re-faults every page of its large tensors: the logits (micro-batch x sequence x
vocabulary x 4 bytes, 134 MB at 4 x 256 x 32,768), the embeddings' gradients, the optimizer's
temporaries. Measured on this project's 2-core VM (the README's Calibrate section): 1.2 us a 4 KiB page, a
fresh 64 MiB tensor filled in 21.5 ms against 2.0 ms for the same tensor reused, and 0.57 million
faults a step at d6 eager (215 thousand compiled), 15-25% of the step. A GPU's caching allocator keeps
its blocks (torch.cuda's CUDACachingAllocator, HIP's the same), so no GPU step pays this and ddplan's
pricing has no term for it.

`reuse_freed_memory` sets M_MMAP_MAX = 0 (no block of the main arena, where the training thread allocates,
is served by mmap, so none is unmapped on free; glibc's other arenas still mmap blocks above 64 MiB) and
M_TRIM_THRESHOLD = 1 GiB (the heap's top is not given back) for the calibration, so its benchmarks and
its held-out step run on reused memory, as a GPU's would. The price is memory: blocks freed keep their
pages, and posix_memalign's alignment slop keeps a freed block from fitting the next request of its own
size until neighbours coalesce, so the heap grows for a few steps before it settles (d4's eager step: 2.3
GB peak against 1.4 GB, then no faults at all, and the step twice as fast: 0.91 s against 1.82 s).
`ddplan calibrate --cpu-malloc system` (the default with --quick, to stay small) leaves malloc as it is;
then the benchmarks and the held-out step pay the faults, and the prediction has no term for them.
Ref: mallopt(3) (man7.org, glibc 2.x): M_MMAP_MAX "setting this parameter to 0 disables the use of
mmap(2)", M_MMAP_THRESHOLD's dynamic upper limit, M_TRIM_THRESHOLD; PyTorch's CPU performance tuning
guide recommends a caching allocator (jemalloc, TCMalloc) for the same reason.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterator

# mallopt(3) parameter numbers (glibc malloc.h)
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
KEEP_TRIM_BYTES = 1 << 30  # 1 GiB: above any heap top a CPU calibration frees
# glibc's defaults, restored afterwards (malloc.h: DEFAULT_TRIM_THRESHOLD 128 KiB, DEFAULT_MMAP_MAX 65536)
DEFAULT_TRIM_BYTES, DEFAULT_MMAP_MAX = 128 * 1024, 65536
REUSE = "glibc malloc keeps freed memory (M_MMAP_MAX=0, M_TRIM_THRESHOLD=1 GiB), as a GPU's caching allocator does"


def _glibc():
    """The process's C library if it is glibc and glibc's malloc is the one in use, else None: not glibc
    (musl, macOS, Windows: no CS_GNU_LIBC_VERSION), or another malloc preloaded (jemalloc, TCMalloc:
    the process's malloc symbol is not libc's own, and mallopt would set nothing that matters)."""
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return None
        process, libc = ctypes.CDLL(None), ctypes.CDLL("libc.so.6")
        libc.mallopt  # noqa: B018 (an AttributeError if absent)
        in_use = ctypes.cast(process.malloc, ctypes.c_void_p).value
        if in_use != ctypes.cast(libc.malloc, ctypes.c_void_p).value:
            return None
    except (AttributeError, OSError, ValueError):
        return None
    return libc


@contextlib.contextmanager
def reuse_freed_memory(enabled: bool = True, why_not: str = "not asked") -> Iterator[str]:
    """Within the block, glibc malloc keeps the memory it is given back (see the module docstring).
    Yields how host memory behaves, in words, for the calibration file: REUSE, or why not (not glibc,
    mallopt refused, or why_not when not enabled). glibc's defaults are restored on exit (its adaptive mmap threshold
    stays fixed at its last value: mallopt turns the adaptation off; settings made by MALLOC_*_ or
    GLIBC_TUNABLES before the run are not restored)."""
    if not enabled:
        yield f"system malloc as it is ({why_not}): large tensors re-fault their pages every step"
        return
    libc = _glibc()
    if libc is None:
        yield "system malloc as it is (not glibc's malloc: nothing set)"
        return
    if not (libc.mallopt(M_MMAP_MAX, 0) and libc.mallopt(M_TRIM_THRESHOLD, KEEP_TRIM_BYTES)):
        libc.mallopt(M_MMAP_MAX, DEFAULT_MMAP_MAX)
        yield "system malloc as it is (glibc mallopt refused the settings)"
        return
    try:
        yield REUSE
    finally:
        libc.mallopt(M_MMAP_MAX, DEFAULT_MMAP_MAX)
        libc.mallopt(M_TRIM_THRESHOLD, DEFAULT_TRIM_BYTES)


def minor_faults() -> int | None:
    """Minor page faults of this process so far (getrusage ru_minflt: pages first touched after a fresh map);
    None where there is no getrusage (Windows)."""
    try:
        import resource
    except ImportError:
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
