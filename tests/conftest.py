"""Fixtures shared by the test modules: golden files in tests/golden/, a frozen date, and the expensive
computations several modules check (each computed once per test process)."""

from __future__ import annotations

import datetime
import os

import pytest

# Under pytest-xdist each worker is a process of its own on a shared machine: torch's OpenMP pool in each, as
# wide as the machine, oversubscribes the cores (two workers on 2 cores ran 4 spinning threads), so a worker
# keeps one thread (before torch is imported; subprocesses inherit it). The CPU benchmarks' tests check what
# is measured and recorded, not how fast.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
from syrupy.extensions.amber import AmberSnapshotExtension

FROZEN_TODAY = datetime.date(2026, 6, 1)


class Golden(AmberSnapshotExtension):
    """Goldens live in tests/golden/ (STYLE.md); `pytest --snapshot-update` rewrites them: review the diff."""

    snapshot_dirname = "golden"


@pytest.fixture
def snapshot(snapshot):
    return snapshot.use_extension(Golden)


class _FrozenDate(datetime.date):
    @classmethod
    def today(cls) -> datetime.date:
        return cls(FROZEN_TODAY.year, FROZEN_TODAY.month, FROZEN_TODAY.day)


@pytest.fixture
def frozen_today(monkeypatch):
    """`--price` dates its offer with datetime.date.today(), looked up at call time: swap the class."""
    monkeypatch.setattr(datetime, "date", _FrozenDate)


@pytest.fixture(scope="session")
def shipped_loso():
    """ddplan.validation.leave_one_source_out on the shipped dataset and fitted hardware, as `ddplan validate
    --leave-one-source-out` computes it: (runs, where, hardware, held-out scores). Tests that need it share
    it (pytest.mark.xdist_group("loso") keeps them on one worker)."""
    from ddplan import validation
    from ddplan.runs import load_runs, shipped_dataset

    runs, where, hardware = load_runs(), shipped_dataset(), tuple(validation.fitted_hardware())
    return runs, where, hardware, validation.leave_one_source_out(runs, where, hardware)
