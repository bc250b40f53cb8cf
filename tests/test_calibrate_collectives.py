"""Collective benchmarks (ddplan.calibrate.collectives): point building without torch.distributed, and the
torchrun path under gloo with two CPU processes."""

from __future__ import annotations

import json
import math
import sys

import pytest

from ddplan import comm
from ddplan.calibrate.collectives import (
    GLOO_RS_NOTE,
    cap_sizes,
    default_group_sizes,
    default_sizes,
    make_point,
    to_collective_points,
    torchrun_command,
)
from ddplan.calibration import CollectivePoint

MiB = 2**20

# one worker: the module's torchrun launch (gloo_run) runs once, not once per pytest-xdist worker
pytestmark = pytest.mark.xdist_group("collectives")


# --------------------------------------------------------------------------------------------
# Without launching


@pytest.mark.parametrize(("collective", "n", "factor"), [
    ("all_reduce", 2, 1.0), ("all_reduce", 8, 1.75), ("reduce_scatter", 8, 0.875), ("all_gather", 4, 0.75),
])
def test_make_point_uses_nccl_tests_factors(collective, n, factor):
    p = make_point(collective, n, 1e9, 0.004, local_world_size=8, backend="nccl")
    assert p["algbw_gbyte_per_s"] == pytest.approx(250.0)  # 1e9 B / 4 ms
    assert p["busbw_gbyte_per_s"] == pytest.approx(250.0 * factor)
    assert p["busbw_gbyte_per_s"] * 1e9 == pytest.approx(comm.busbw_from_time(collective, 1e9, n, 0.004))
    assert p["tier"] == "intra_node" and p["backend"] == "nccl"
    assert p["emulated"] is False and p["note"] is None


def test_make_point_tier_and_validation():
    assert make_point("all_reduce", 16, 1e6, 1e-3, local_world_size=8, backend="nccl")["tier"] == "inter_node"
    assert make_point("all_reduce", 8, 1e6, 1e-3, local_world_size=8, backend="nccl")["tier"] == "intra_node"
    with pytest.raises(ValueError):
        make_point("all_reduce", 1, 1e6, 1e-3, local_world_size=8, backend="nccl")
    with pytest.raises(ValueError):
        make_point("all_reduce", 2, 1e6, 0.0, local_world_size=8, backend="nccl")
    with pytest.raises(ValueError):
        make_point("broadcast", 2, 1e6, 1e-3, local_world_size=8, backend="nccl")


def test_to_collective_points_drops_emulated_unless_asked():
    real = make_point("all_gather", 2, 1e6, 1e-3, local_world_size=2, backend="gloo")
    fake = make_point("reduce_scatter", 2, 1e6, 1e-3, local_world_size=2, backend="gloo", note=GLOO_RS_NOTE,
                      emulated=True)
    kept = to_collective_points([real, fake])
    assert kept == [CollectivePoint(collective="all_gather", group_size=2, size_bytes=1e6, time_s=1e-3)]
    assert len(to_collective_points([real, fake], include_emulated=True)) == 2


def test_sizes_and_group_sizes():
    assert default_sizes(False) == [MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB, 1024 * MiB]
    assert default_sizes(True) == [MiB, 4 * MiB, 16 * MiB]
    assert cap_sizes(default_sizes(False), 16 * MiB) == [MiB, 4 * MiB, 16 * MiB]
    assert cap_sizes([64 * MiB], 16 * MiB) == [16 * MiB]
    assert default_group_sizes(1) == []
    assert default_group_sizes(2) == [2]
    assert default_group_sizes(8) == [2, 4, 8]
    assert default_group_sizes(12) == [2, 4, 8, 12]


def test_torchrun_command_standalone_and_multinode(tmp_path):
    out = tmp_path / "c.json"
    cmd = torchrun_command(2, sizes_bytes=[2**16, 2**20], quick=True, out_path=out)
    assert cmd[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert "--standalone" in cmd
    i = cmd.index("--nproc_per_node")
    assert cmd[i + 1] == "2"
    assert cmd[cmd.index("-m", 3) + 1] == "ddplan.calibrate.collectives"
    assert cmd[cmd.index("--out") + 1] == str(out)
    assert cmd[cmd.index("--sizes") + 1: cmd.index("--sizes") + 3] == ["65536", "1048576"]
    assert "--quick" in cmd
    multi = torchrun_command(8, out_path=out, extra_torchrun_args=[
        "--nnodes", "2", "--node_rank", "0", "--rdzv_backend", "c10d", "--rdzv_endpoint", "host0:29400"])
    assert "--standalone" not in multi
    # torchrun's flags come before the module, the worker's after it
    assert multi.index("--rdzv_endpoint") < multi.index("ddplan.calibrate.collectives") < multi.index("--out")


# --------------------------------------------------------------------------------------------
# Under torchrun with gloo (two CPU processes): ~10-13 s here, nearly all of it torchrun and three
# torch imports, hence slow.


@pytest.fixture(scope="module")
def gloo_run(tmp_path_factory):
    pytest.importorskip("torch.distributed")
    from ddplan.calibrate.collectives import launch

    out = tmp_path_factory.mktemp("collectives") / "collectives.json"
    points = launch(2, sizes_bytes=[2**16, 2**20], quick=True, out_path=out, timeout_s=180,
                    device="cpu")
    return points, out


@pytest.mark.slow
def test_launch_gloo_measures_every_collective(gloo_run):
    points, _ = gloo_run
    for collective in comm.COLLECTIVES:
        got = sorted(p["size_bytes"] for p in points if p["collective"] == collective and p["group_size"] == 2)
        assert got == [2**16, 2**20], collective
    for p in points:
        assert p["backend"] == "gloo" and p["tier"] == "intra_node"
        assert p["time_s"] > 0 and math.isfinite(p["time_s"])
        assert p["algbw_gbyte_per_s"] == pytest.approx(p["size_bytes"] / p["time_s"] / 1e9)
        factor = 2 * (2 - 1) / 2 if p["collective"] == "all_reduce" else (2 - 1) / 2
        assert p["busbw_gbyte_per_s"] == pytest.approx(p["algbw_gbyte_per_s"] * factor)
        # gloo's reduce-scatter is an all-reduce underneath: flagged, never passed off as a real one
        assert p["emulated"] is (p["collective"] == "reduce_scatter")
        assert (p["note"] is not None) is p["emulated"]
    assert all(isinstance(cp, CollectivePoint) for cp in to_collective_points(points))


@pytest.mark.slow
def test_launch_writes_valid_json(gloo_run):
    points, out = gloo_run
    data = json.loads(out.read_text())
    assert data["kind"] == "ddplan-collectives" and data["complete"] is True
    assert data["backend"] == "gloo" and data["world_size"] == 2
    assert data["points"] == points
    assert data["failures"] == []
    assert not list(out.parent.glob(".*.tmp"))  # the atomic write left no temporary file


def _fake_python(tmp_path, body: str):
    """An executable standing in for the interpreter, so launch's error paths run without torchrun."""
    exe = tmp_path / "fake-python"
    exe.write_text(f"#!/bin/sh\n{body}\n")
    exe.chmod(0o755)
    return str(exe)


def test_launch_failure_raises_with_stderr_tail(tmp_path):
    from ddplan.calibrate.collectives import launch

    fake = _fake_python(tmp_path, 'echo "ValueError: group size 4 is outside 2..2" >&2; exit 3')
    with pytest.raises(RuntimeError, match=r"(?s)exit code 3.*group size 4 is outside 2\.\.2"):
        launch(2, sizes_bytes=[2**16], out_path=tmp_path / "x.json", python=fake, timeout_s=30)


def test_launch_timeout_stops_the_run(tmp_path):
    from ddplan.calibrate.collectives import launch

    fake = _fake_python(tmp_path, 'echo "rendezvous pending" >&2; sleep 60')
    with pytest.raises(RuntimeError, match=r"(?s)timed out after 1 s.*rendezvous pending"):
        launch(2, sizes_bytes=[2**16], out_path=tmp_path / "x.json", python=fake, timeout_s=1)
