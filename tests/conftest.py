"""Fixtures shared by the test modules: golden files in tests/golden/, and a frozen date."""

from __future__ import annotations

import datetime

import pytest
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
