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


def pytest_collection_finish(session):
    """On a pytest-xdist worker with `--dist loadgroup`: every test marked xdist_group carries its group in its
    node id (how the scheduler groups), else the groups' session fixtures would run once per worker unseen."""
    if not os.environ.get("PYTEST_XDIST_WORKER") or not session.config.getvalue("loadgroup"):
        return
    lost = [item.nodeid for item in session.items if item.get_closest_marker("xdist_group") and "@" not in item.nodeid]
    if lost:
        raise pytest.UsageError(f"pytest-xdist's groups are ignored by this pytest ({pytest.__version__}): "
                                f"{lost[0]} has no @group in its id; install the pytest range pyproject.toml names")

FROZEN_TODAY = datetime.date(2026, 6, 1)


class Golden(AmberSnapshotExtension):
    """Goldens live in tests/golden/ (STYLE.md); `pytest --snapshot-update` rewrites them: review the diff."""

    snapshot_dirname = "golden"


@pytest.fixture
def snapshot(snapshot):
    return snapshot.use_extension(Golden)


@pytest.fixture
def frozen_today(monkeypatch):
    """`--price` dates its offer with ddplan.cli._today(): fix it. (Swapping datetime.date itself broke pydantic,
    which builds a model's schema on first use and then met the test's subclass of date.)"""
    import ddplan.cli

    monkeypatch.setattr(ddplan.cli, "_today", lambda: FROZEN_TODAY)


@pytest.fixture(scope="session")
def shipped_loso():
    """ddplan.validation.leave_one_source_out on the shipped dataset and fitted hardware, as `ddplan validate
    --leave-one-source-out` computes it: (runs, where, hardware, held-out scores). Tests that need it share
    it (pytest.mark.xdist_group("loso") keeps them on one worker)."""
    from ddplan import validation
    from ddplan.runs import load_runs, shipped_dataset

    runs, where, hardware = load_runs(), shipped_dataset(), tuple(validation.fitted_hardware())
    return runs, where, hardware, validation.leave_one_source_out(runs, where, hardware)


@pytest.fixture(scope="session")
def cpu_calibration(tmp_path_factory):
    """One quick CPU calibration of nanochat d2 (seq 128, micro-batch 2) against mi300x's spec, run through the
    CLI: (file, stdout, what ddplan.calibrate.runner.run returned). Its tests and the `calibrate` help example
    share it (pytest.mark.xdist_group("cpu_calibration") keeps them on one worker)."""
    import contextlib
    import io

    pytest.importorskip("torch")
    from ddplan import cli
    from ddplan.calibrate import runner

    out = tmp_path_factory.mktemp("cal") / "cal.yaml"
    returned = []
    real_run = runner.run

    def recording_run(*args, **kwargs):
        returned.append(real_run(*args, **kwargs))
        return returned[-1]

    buf_out, buf_err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(buf_out), contextlib.redirect_stderr(buf_err):
        mp.setattr(runner, "run", recording_run)
        code = cli.main(["calibrate", "--model", "d2", "--hardware", "mi300x", "--device", "cpu", "--quick",
                         "--seq-len", "128", "--device-batch-size", "2", "--micro-batches", "2",
                         "--attention", "sdpa-math,sdpa-fused", "--out", str(out)])
    assert code == 0, buf_err.getvalue()
    (result,) = returned
    return out, buf_out.getvalue(), result
