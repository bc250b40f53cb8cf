"""Collective benchmarks under torchrun: all-reduce, reduce-scatter and all-gather, nccl-tests style.

Runs inside an initialised process group, one process per GPU (NCCL on CUDA, RCCL on ROCm -- both are
torch's "nccl" backend) or per CPU rank (gloo). For every group size n (sub-groups of ranks 0..n-1, so
with torchrun's node-major rank order a group crosses nodes exactly when n exceeds the ranks per node)
and every buffer size S, it times `iters` launches after `warmup`, and reports the slowest rank's mean
time per launch.

Conventions (nccl-tests doc/PERFORMANCE.md; ddplan.comm): S is the whole buffer -- the all-reduce size,
the reduce-scatter input, the all-gather output; algbw = S / t; busbw = algbw x bus_factor, which is
2(n-1)/n for all-reduce and (n-1)/n for reduce-scatter and all-gather. GB/s are decimal (1e9 B/s).

Timing: a group barrier (a one-element all-reduce, then a device synchronise) before each timed loop;
on GPU, CUDA events recorded on the current stream around the loop (collectives called with
async_op=False make the current stream wait for the communication stream, so the end event fires only
when the last launch has finished); on CPU, time.perf_counter around gloo's blocking calls. The
per-rank mean is all-reduced with MAX over the group: the collective is as slow as its slowest rank.

gloo is not NCCL. torch's ProcessGroupGloo runs reduce_scatter_tensor as a clone plus an all-reduce of
the whole input, keeping this rank's chunk (ProcessGroupGloo::reduce_scatter_tensor_coalesced), so on
gloo a "reduce-scatter" time is an all-reduce's time and its busbw, computed with the reduce-scatter
factor, understates what a ring reduce-scatter would reach by about 2x. Such points carry
`emulated: True` and a `note`; `to_collective_points` drops them unless asked to keep them.

Entry points:
  * `measure_collectives(...)`: inside a process group (the runner's own workers, or user code).
  * `python -m ddplan.calibrate.collectives --out FILE [--sizes ...] [--quick]`: the torchrun worker;
    rank 0 writes FILE (JSON, atomically, after every point, so an interrupted run keeps what it had).
  * `torchrun_command(...)` / `launch(...)`: the torchrun line, and running it as a subprocess.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from ddplan import comm

COLLECTIVES: tuple[str, ...] = comm.COLLECTIVES  # ("all_reduce", "reduce_scatter", "all_gather")
RESULT_KIND = "ddplan-collectives"
RESULT_VERSION = 1

# Sizes: powers of 4 from 1 MiB to 1 GiB (6 sizes); quick: 1, 4, 16 MiB.
_MIN_SIZE = 2**20
_MAX_SIZE = 2**30
_QUICK_MAX_SIZE = 2**24

# Repetitions: (warmup, iters) per measurement.
DEFAULT_REPS = (5, 20)
QUICK_REPS = (2, 5)

DEFAULT_TIMEOUT_S = 1800.0

# torchrun flags that mean "several nodes / explicit rendezvous": --standalone is dropped then.
_RENDEZVOUS_FLAGS = ("--nnodes", "--rdzv", "--master", "--node_rank", "--node-rank")

GLOO_RS_NOTE = ("gloo: torch's ProcessGroupGloo runs reduce_scatter_tensor as a clone + all-reduce of the "
                "whole input, then keeps this rank's chunk; this time is an all-reduce's, not a ring "
                "reduce-scatter's (busbw understated ~2x). Not a real reduce-scatter measurement.")
EMULATED_RS_NOTE = ("emulated: reduce_scatter_tensor failed on backend {backend} ({error}); timed an "
                    "all-reduce of the input plus a copy of this rank's chunk instead. Not a real "
                    "reduce-scatter measurement.")


# --------------------------------------------------------------------------------------------
# Sizes and points (no torch needed)


def default_sizes(quick: bool = False) -> list[int]:
    """Buffer sizes S, bytes: 1 MiB to 1 GiB in powers of 4 (6 sizes); quick: 1, 4, 16 MiB."""
    top = _QUICK_MAX_SIZE if quick else _MAX_SIZE
    sizes, s = [], _MIN_SIZE
    while s <= top:
        sizes.append(s)
        s *= 4
    return sizes


def cap_sizes(sizes: Iterable[int], max_bytes: int) -> list[int]:
    """The sizes <= max_bytes, sorted and de-duplicated; [max_bytes] if none is that small.

    For CPU/gloo runs, where a 1 GB all-reduce takes seconds and tells the planner nothing.
    """
    if max_bytes <= 0:
        raise ValueError(f"max_bytes must be > 0, got {max_bytes}")
    kept = sorted({int(s) for s in sizes if 0 < int(s) <= max_bytes})
    return kept or [int(max_bytes)]


def default_group_sizes(world_size: int) -> list[int]:
    """Every power of two from 2 to the world size, plus the world size itself (e.g. 12 -> 2, 4, 8, 12)."""
    sizes, n = [], 2
    while n <= world_size:
        sizes.append(n)
        n *= 2
    if world_size >= 2 and world_size not in sizes:
        sizes.append(world_size)
    return sizes


def tier_for_group(group_size: int, local_world_size: int) -> str:
    """'intra_node' when a group of ranks 0..n-1 fits on one node (n <= ranks per node), else 'inter_node'."""
    return "intra_node" if group_size <= local_world_size else "inter_node"


def make_point(collective: str, group_size: int, size_bytes: float, time_s: float, *, local_world_size: int,
               backend: str, note: str | None = None, emulated: bool = False,
               dtype: str | None = None) -> dict[str, Any]:
    """One measurement as a dict: the CollectivePoint fields plus algbw/busbw (GB/s), backend and note.

    algbw = S / t and busbw = algbw x ddplan.comm.bus_factor(collective, n) (nccl-tests
    doc/PERFORMANCE.md); e.g. all_reduce of 1e9 B on 8 ranks in 5.6 ms: algbw 178.6, busbw 312.5 GB/s.
    """
    if group_size < 2:
        raise ValueError(f"a collective needs a group of at least 2 ranks, got {group_size}")
    busbw = comm.busbw_from_time(collective, size_bytes, group_size, time_s)  # validates collective, t > 0
    return {
        "collective": collective,
        "group_size": int(group_size),
        "size_bytes": int(size_bytes),
        "time_s": float(time_s),
        "algbw_gbyte_per_s": size_bytes / time_s / 1e9,
        "busbw_gbyte_per_s": busbw / 1e9,
        "tier": tier_for_group(group_size, local_world_size),
        "backend": backend,
        "dtype": dtype,
        "emulated": bool(emulated),
        "note": note,
    }


def to_collective_points(points: Iterable[dict[str, Any]], *, include_emulated: bool = False) -> list:
    """The calibration file's CollectivePoint records for these measurements.

    Emulated measurements (gloo's reduce-scatter, which is an all-reduce underneath) are left out unless
    include_emulated: a planner interpolating them would take an all-reduce time for a reduce-scatter.
    """
    from ddplan.calibration import CollectivePoint

    return [CollectivePoint(collective=p["collective"], group_size=p["group_size"], size_bytes=p["size_bytes"],
                            time_s=p["time_s"], tier=p["tier"])
            for p in points if include_emulated or not p.get("emulated")]


# --------------------------------------------------------------------------------------------
# Measurement (inside a process group)


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    try:
        return int(value) if value not in (None, "") else default
    except ValueError:
        return default


def _backend_name(dist) -> str:
    backend = dist.get_backend()
    return str(backend).lower()


def _dtype_name(dtype) -> str:
    import torch

    return {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}.get(dtype, str(dtype))


def _resolve_rs_ag(dist):
    """reduce_scatter / all_gather into single tensors: the *_single names (torch >= 2.13, where the
    *_tensor names are deprecated aliases) or the *_tensor names (torch 2.x)."""
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return rs, ag


def measure_collectives(sizes_bytes: Sequence[int], collectives: Sequence[str] = COLLECTIVES, *, warmup: int,
                        iters: int, group_sizes: Sequence[int] | None = None, dtype=None,
                        on_point: Callable[[dict[str, Any]], None] | None = None,
                        on_failure: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Time each collective at each buffer size S (bytes) and group size n; the points this rank took part in.

    Call on every rank of an initialised default process group, with the same arguments. Groups are
    ranks 0..n-1 (made with dist.new_group, by every rank, in the same order; n = world size uses the
    default group), so rank 0 is in every group and returns every point. group_sizes defaults to
    `default_group_sizes(world_size)`. S is rounded down to a multiple of n elements (the reduce-scatter
    input and all-gather output split into n equal chunks); the point reports the S actually moved.
    dtype defaults to bf16 on GPU and fp32 on CPU. Times: mean over `iters` launches after `warmup`,
    max over the group's ranks. A size whose buffers cannot be allocated on some rank is skipped on all
    ranks of that group (agreed with a MIN all-reduce before any collective runs) and reported through
    on_failure. on_point is called (on every member) with each point as it is measured.
    """
    import torch
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("measure_collectives needs an initialised torch.distributed process group "
                           "(run under torchrun: `python -m ddplan.calibrate.collectives`)")
    if warmup < 0 or iters < 1:
        raise ValueError(f"need warmup >= 0 and iters >= 1, got warmup={warmup}, iters={iters}")
    for c in collectives:
        if c not in COLLECTIVES:
            raise ValueError(f"unknown collective {c!r}; allowed: {', '.join(COLLECTIVES)}")

    rank, world = dist.get_rank(), dist.get_world_size()
    local_world = _env_int("LOCAL_WORLD_SIZE", world)
    backend = _backend_name(dist)
    on_gpu = backend != "gloo" and torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    if dtype is None:
        dtype = torch.bfloat16 if on_gpu else torch.float32
    elem = torch.tensor([], dtype=dtype).element_size()
    groups_n = list(group_sizes) if group_sizes is not None else default_group_sizes(world)
    for n in groups_n:
        if not 2 <= n <= world:
            raise ValueError(f"group size {n} is outside 2..{world} (the world size)")
    rs_fn, ag_fn = _resolve_rs_ag(dist)

    # Every rank creates every sub-group, in the same order (torch.distributed requires it).
    groups = {}
    for n in groups_n:
        if n not in groups:
            groups[n] = None if n == world else dist.new_group(ranks=list(range(n)))

    def sync(group) -> None:
        flag = torch.ones(1, device=device)
        dist.all_reduce(flag, group=group)
        if on_gpu:
            torch.cuda.synchronize(device)

    def agree(ok: bool, group) -> bool:
        flag = torch.tensor([1.0 if ok else 0.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
        return bool(flag.item() > 0)

    def timed(op: Callable[[], None], group) -> float:
        for _ in range(warmup):
            op()
        sync(group)
        if on_gpu:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                op()
            end.record()
            end.synchronize()
            mean_s = start.elapsed_time(end) / 1e3 / iters
        else:
            t0 = time.perf_counter()
            for _ in range(iters):
                op()
            mean_s = (time.perf_counter() - t0) / iters
        worst = torch.tensor([mean_s], dtype=torch.float64, device=device)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=group)
        return float(worst.item())

    state = {"rs_error": None}  # set once the real reduce-scatter call has failed: emulate from then on

    def buffers(collective: str, numel: int, n: int) -> tuple:
        """Random inputs (not zeros) and outputs: S = numel elements is the whole buffer."""
        if collective == "all_reduce":
            return (torch.randn(numel, dtype=dtype, device=device),)
        if collective == "reduce_scatter":
            return (torch.randn(numel, dtype=dtype, device=device),
                    torch.empty(numel // n, dtype=dtype, device=device))
        return (torch.randn(numel // n, dtype=dtype, device=device),
                torch.empty(numel, dtype=dtype, device=device))

    def measure_one(collective: str, n: int, group, size: int) -> dict[str, Any] | None:
        """One point, or None (reported through on_failure) when it cannot be measured. Its buffers are
        freed on return, before the next (larger) size is allocated."""
        numel = (int(size) // elem) // n * n
        if numel < n:
            if rank == 0 and on_failure:
                on_failure(f"collectives: {collective} n={n}: size {size} B is below one element per rank; skipped")
            return None
        s_bytes = numel * elem
        try:
            bufs, alloc_error = buffers(collective, numel, n), None
        except (RuntimeError, MemoryError) as e:  # torch.cuda.OutOfMemoryError is a RuntimeError
            bufs, alloc_error = (), f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        if not agree(alloc_error is None, group):
            if on_failure and (rank == 0 or alloc_error):
                on_failure(f"collectives: {collective} n={n} S={s_bytes} B: buffers could not be allocated on "
                           f"every rank ({alloc_error or 'another rank failed'}); skipped")
            return None

        note, emulated = None, False
        if collective == "all_reduce":
            (buf,) = bufs

            def op():
                dist.all_reduce(buf, group=group)
        elif collective == "all_gather":
            inp, out = bufs

            def op():
                ag_fn(out, inp, group=group)
        else:
            inp, out = bufs

            def real_rs():
                rs_fn(out, inp, group=group)

            def emulated_rs():
                dist.all_reduce(inp, group=group)
                out.copy_(inp.view(n, -1)[rank])

            if state["rs_error"] is None:
                # One untimed real call (an extra warm-up); if it fails on any rank, every rank emulates
                # reduce-scatter from here on.
                try:
                    real_rs()
                    ok = True
                except (RuntimeError, NotImplementedError, ValueError) as e:
                    ok, state["rs_error"] = False, f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
                if not agree(ok, group):
                    state["rs_error"] = state["rs_error"] or "failed on another rank"
            if state["rs_error"] is None:
                op = real_rs
                if backend == "gloo":
                    note, emulated = GLOO_RS_NOTE, True
            else:
                op = emulated_rs
                note, emulated = EMULATED_RS_NOTE.format(backend=backend, error=state["rs_error"]), True

        t = timed(op, group)
        return make_point(collective, n, s_bytes, t, local_world_size=local_world, backend=backend, note=note,
                          emulated=emulated, dtype=_dtype_name(dtype))

    points: list[dict[str, Any]] = []
    for n in groups_n:
        group = groups[n]
        if rank < n:  # ranks 0..n-1 are the group; the others wait at the world barrier below
            for collective in collectives:
                for size in sizes_bytes:
                    point = measure_one(collective, n, group, size)
                    if on_gpu:
                        torch.cuda.empty_cache()
                    if point is not None:
                        points.append(point)
                        if on_point:
                            on_point(point)
        # Keep all ranks in step between group sizes.
        sync(None)
    return points


# --------------------------------------------------------------------------------------------
# The torchrun worker


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write JSON to a temporary file in path's folder, then os.replace it over path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _parse_size(text: str) -> int:
    """'1048576', '1e6', '4MiB', '16MB', '1GiB' -> bytes."""
    t = text.strip()
    units = {"kib": 2**10, "mib": 2**20, "gib": 2**30, "kb": 10**3, "mb": 10**6, "gb": 10**9, "b": 1}
    low = t.lower()
    for suffix, mult in units.items():
        if low.endswith(suffix):
            return int(float(low[: -len(suffix)]) * mult)
    return int(float(t))


def _provenance(torch, backend: str, device_kind: str) -> dict[str, Any]:
    info: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda,
                            "hip": getattr(torch.version, "hip", None), "device_name": None, "nccl": None,
                            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    if device_kind == "cuda":
        info["device_name"] = torch.cuda.get_device_name()
        try:
            v = torch.cuda.nccl.version()
            info["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception:  # noqa: BLE001 -- provenance is best effort
            pass
    return info


def worker_main(argv: Sequence[str] | None = None) -> int:
    """Entry of `python -m ddplan.calibrate.collectives` under torchrun; rank 0 writes --out (JSON)."""
    p = argparse.ArgumentParser(prog="python -m ddplan.calibrate.collectives",
                                description="Collective benchmarks under torchrun (ddplan calibrate).")
    p.add_argument("--out", required=True, help="JSON file rank 0 writes (atomically, after every point)")
    p.add_argument("--sizes", nargs="+", type=_parse_size, default=None,
                   help="buffer sizes S in bytes (e.g. 1048576 4MiB 1e9); default: 1 MiB..1 GiB in powers of 4")
    p.add_argument("--quick", action="store_true", help="fewer sizes (up to 16 MiB) and repetitions")
    p.add_argument("--collectives", nargs="+", choices=COLLECTIVES, default=list(COLLECTIVES))
    p.add_argument("--group-sizes", nargs="+", type=int, default=None,
                   help="group sizes n (ranks 0..n-1); default: powers of two up to the world size, and it")
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--iters", type=int, default=None)
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                   help="cpu forces gloo even where CUDA/ROCm is available")
    p.add_argument("--max-bytes", type=_parse_size, default=None, help="drop sizes above this")
    args = p.parse_args(argv)

    import torch
    import torch.distributed as dist

    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if use_cuda and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA/ROCm device")
    backend = "nccl" if use_cuda else "gloo"  # "nccl" is RCCL on ROCm builds
    if use_cuda:
        torch.cuda.set_device(_env_int("LOCAL_RANK", 0))
    dist.init_process_group(backend=backend)
    out = Path(args.out)
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        sizes = args.sizes or default_sizes(args.quick)
        if args.max_bytes:
            sizes = cap_sizes(sizes, args.max_bytes)
        warmup_d, iters_d = QUICK_REPS if args.quick else DEFAULT_REPS
        warmup = args.warmup if args.warmup is not None else warmup_d
        iters = args.iters if args.iters is not None else iters_d
        group_sizes = args.group_sizes if args.group_sizes is not None else default_group_sizes(world)
        result: dict[str, Any] = {
            "kind": RESULT_KIND, "version": RESULT_VERSION, "complete": False,
            "backend": _backend_name(dist), "device": "cuda" if use_cuda else "cpu",
            "world_size": world, "local_world_size": _env_int("LOCAL_WORLD_SIZE", world),
            "sizes_bytes": list(sizes), "group_sizes": list(group_sizes), "warmup": warmup, "iters": iters,
            "provenance": _provenance(torch, backend, "cuda" if use_cuda else "cpu"),
            "points": [], "failures": [],
        }
        if world < 2:
            result["failures"].append(f"collectives: world size {world}: no group of 2 or more ranks to measure")

        def save() -> None:
            if rank == 0:
                _write_json_atomic(out, result)

        def on_point(pt: dict[str, Any]) -> None:
            if rank == 0:
                result["points"].append(pt)
                save()
                print(f"[ddplan collectives] {pt['collective']:<14} n={pt['group_size']:<4} "
                      f"S={pt['size_bytes']:>11} B  t={pt['time_s'] * 1e3:9.3f} ms  "
                      f"algbw={pt['algbw_gbyte_per_s']:8.3f}  busbw={pt['busbw_gbyte_per_s']:8.3f} GB/s"
                      + ("  (emulated)" if pt["emulated"] else ""), flush=True)

        def on_failure(msg: str) -> None:
            if rank == 0:
                result["failures"].append(msg)
                save()

        save()
        if world >= 2 and group_sizes:
            measure_collectives(sizes, args.collectives, warmup=warmup, iters=iters, group_sizes=group_sizes,
                                on_point=on_point, on_failure=on_failure)
        result["complete"] = True
        save()
    finally:
        dist.destroy_process_group()
    return 0


# --------------------------------------------------------------------------------------------
# Launching under torchrun


def _flag_names(extra: Sequence[str]) -> list[str]:
    return [str(a).split("=", 1)[0] for a in extra if str(a).startswith("--")]


def _is_multinode(extra: Sequence[str]) -> bool:
    """Whether torchrun's own flags name a rendezvous (several nodes) rather than --standalone."""
    return any(f.startswith(_RENDEZVOUS_FLAGS) for f in _flag_names(extra))


def torchrun_command(nproc_per_node: int | str, *, sizes_bytes: Sequence[int] | None = None, quick: bool = False,
                     out_path: str | os.PathLike, extra_torchrun_args: Sequence[str] = (),
                     collectives: Sequence[str] | None = None, group_sizes: Sequence[int] | None = None,
                     warmup: int | None = None, iters: int | None = None, device: str | None = None,
                     python: str | None = None) -> list[str]:
    """The torchrun line that runs the worker: `python -m torch.distributed.run --standalone
    --nproc_per_node N [extra] -m ddplan.calibrate.collectives --out FILE ...`.

    For several nodes pass torchrun's own flags in extra_torchrun_args (--nnodes, --node_rank,
    --rdzv_backend/--rdzv_endpoint/--rdzv_id or --master_addr/--master_port); --standalone is then left
    out. The same line runs on every node; only global rank 0 writes out_path, on its own node.
    """
    extra = [str(a) for a in extra_torchrun_args]
    cmd = [python or sys.executable, "-m", "torch.distributed.run"]
    if not _is_multinode(extra) and "--standalone" not in _flag_names(extra):
        cmd.append("--standalone")
    cmd += ["--nproc_per_node", str(nproc_per_node), *extra, "-m", "ddplan.calibrate.collectives",
            "--out", str(out_path)]
    if sizes_bytes:
        cmd += ["--sizes", *(str(int(s)) for s in sizes_bytes)]
    if quick:
        cmd.append("--quick")
    if collectives:
        cmd += ["--collectives", *collectives]
    if group_sizes:
        cmd += ["--group-sizes", *(str(int(n)) for n in group_sizes)]
    if warmup is not None:
        cmd += ["--warmup", str(int(warmup))]
    if iters is not None:
        cmd += ["--iters", str(int(iters))]
    if device:
        cmd += ["--device", device]
    return cmd


def read_results(path: str | os.PathLike) -> dict[str, Any]:
    """The worker's JSON file, checked for its kind."""
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict) or data.get("kind") != RESULT_KIND:
        raise ValueError(f"{path}: not a {RESULT_KIND} result file")
    return data


def _tail(text: str, limit: int = 4000) -> str:
    text = text.strip()
    return text if len(text) <= limit else "...\n" + text[-limit:]


def _kill_session(proc: subprocess.Popen) -> None:
    """Stop the torchrun we started and its workers (their own session, by its id)."""
    for sig, wait_s in ((signal.SIGTERM, 15), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def launch(nproc_per_node: int | str, *, sizes_bytes: Sequence[int] | None = None, quick: bool = False,
           out_path: str | os.PathLike, extra_torchrun_args: Sequence[str] = (),
           timeout_s: float = DEFAULT_TIMEOUT_S, env: dict[str, str] | None = None, **command_kwargs) -> list[dict]:
    """Run the worker under torchrun as a subprocess and return its points (rank 0's file, parsed).

    Raises RuntimeError, with the tail of torchrun's stderr, when torchrun fails or runs past timeout_s
    (the whole process session is then stopped; points measured so far stay in out_path, with
    `complete: false`). On a node without global rank 0 of a multi-node run the file is written
    elsewhere: [] is returned. Extra keyword arguments go to `torchrun_command`.
    """
    out = Path(out_path)
    cmd = torchrun_command(nproc_per_node, sizes_bytes=sizes_bytes, quick=quick, out_path=out,
                           extra_torchrun_args=extra_torchrun_args, **command_kwargs)
    run_env = dict(os.environ if env is None else env)
    # The workers must import this ddplan, whatever their working directory.
    pkg_root = str(Path(__file__).resolve().parents[2])
    run_env["PYTHONPATH"] = os.pathsep.join([pkg_root, *filter(None, [run_env.get("PYTHONPATH")])])
    run_env.setdefault("OMP_NUM_THREADS", "1")
    if out.exists():
        out.unlink()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=run_env,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_session(proc)
        stdout, stderr = proc.communicate()
        raise RuntimeError(f"collective benchmark timed out after {timeout_s:g} s: {' '.join(cmd)}\n"
                           f"{_partial_note(out)}stderr tail:\n{_tail(stderr or '')}") from None
    except BaseException:
        _kill_session(proc)
        raise
    if proc.returncode != 0:
        raise RuntimeError(f"collective benchmark failed (torchrun exit code {proc.returncode}): {' '.join(cmd)}\n"
                           f"{_partial_note(out)}stderr tail:\n{_tail(stderr or stdout or '')}")
    if not out.exists():
        if _is_multinode([str(a) for a in extra_torchrun_args]):
            return []
        raise RuntimeError(f"torchrun exited cleanly but wrote no {out}: {' '.join(cmd)}\n"
                           f"stderr tail:\n{_tail(stderr or '')}")
    return list(read_results(out)["points"])


def _partial_note(out: Path) -> str:
    try:
        n = len(read_results(out)["points"])
    except Exception:  # noqa: BLE001 -- no file, or a file we cannot read: nothing to add
        return ""
    return f"{n} point(s) measured before the failure are in {out} (complete: false).\n"


if __name__ == "__main__":
    sys.exit(worker_main())
