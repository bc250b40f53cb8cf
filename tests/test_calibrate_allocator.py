"""Host memory reuse for CPU calibrations (ddplan.calibrate.allocator): with glibc told to keep freed memory,
a large tensor allocated again reuses its pages instead of faulting them in afresh."""

import statistics
import sys
from pathlib import Path

import pytest

from ddplan.calibrate import allocator


def _thp_always() -> bool:
    """Transparent huge pages on every anonymous map: a 64 MiB map then faults in 2 MiB pages, not 4 KiB."""
    try:
        return "[always]" in Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return False


glibc = pytest.mark.skipif(not sys.platform.startswith("linux") or allocator._glibc() is None or _thp_always(),
                           reason="glibc malloc with 4 KiB pages only")
MIB64 = 64 * 2**20
PAGES = MIB64 // 4096


def faults_of_fresh_64mib_tensors(times: int, trim: bool = False) -> list[int]:
    """Minor faults of each of `times` 64 MiB float tensors allocated, written and freed in turn (the
    pattern of a step's logits). trim: glibc's malloc_trim(0) before each, which hands every free page back
    (glibc >= 2.8 releases free pages inside the heap too, madvise MADV_DONTNEED)."""
    torch = pytest.importorskip("torch")
    out = []
    for _ in range(times):
        if trim:
            allocator._glibc().malloc_trim(0)
        before = allocator.minor_faults()
        torch.empty(MIB64 // 4).fill_(1.0)
        out.append(allocator.minor_faults() - before)
    return out


@glibc
def test_a_large_tensor_faults_every_page_without_and_none_with_reuse():
    # 64 MiB is above glibc's largest adaptive mmap threshold (32 MiB on 64-bit): mmapped, unmapped on free,
    # so every allocation faults in all its pages. The first may instead take a free heap block that earlier
    # work in this process left (a test before it on the same worker: seen as [0, 16385, 16385, ...]); from the
    # second on, each is a fresh mapping
    # (medians, not the extremes: the fault counter is the whole process's, and whatever else the worker's threads
    # touch meanwhile lands in it). A test before this one on the same worker may have left a free region inside
    # the heap, pinned below the top by a live block, that fits 64 MiB: malloc then serves each tensor from it,
    # pages already touched, and faults none (seen in CI, 2026-12-07: all zeros). The control trims before each
    # tensor, so each one's pages are fresh whatever the worker did before.
    assert statistics.median(faults_of_fresh_64mib_tensors(5, trim=True)[1:]) >= 0.9 * PAGES
    with allocator.reuse_freed_memory() as how:
        assert how == allocator.REUSE
        # from the heap: the first few grow it (posix_memalign's alignment slop does not fit the block just
        # freed), then freed blocks coalesce and every later one reuses pages already touched
        assert statistics.median(faults_of_fresh_64mib_tensors(40)[-10:]) <= 0.01 * PAGES


def test_not_asked_sets_nothing_and_says_so():
    with allocator.reuse_freed_memory(False, "--cpu-malloc system") as how:
        assert how.startswith("system malloc as it is (--cpu-malloc system)")


def test_cpu_malloc_flag_is_checked(capsys):
    from ddplan import cli

    code = cli.main(["calibrate", "-m", "d2", "--device", "cpu", "--cpu-malloc", "jemalloc"])
    err = capsys.readouterr().err
    assert code == 2  # a usage error
    assert "--cpu-malloc" in err and "reuse or system" in err and "Traceback" not in err
