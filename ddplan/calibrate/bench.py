"""Micro-benchmarks for `ddplan calibrate`: GEMMs, attention, HBM copy and one real training step.

Timing: `time_s` warms up, then takes the median of torch.utils.benchmark.Timer.blocked_autorange,
which synchronises the accelerator around each block (CUDA and ROCm alike: torch.cuda is HIP on
ROCm) and keeps torch's CPU thread count as it is (Timer would otherwise pin it to 1). The training
step splits forward, backward and optimizer with CUDA events on GPUs (perf_counter on CPU, where ops
are synchronous). Inputs are random (torch.randn), never zeros, and GEMM inputs rotate over buffers
larger than the last-level cache so the cache does not flatter them.

Units: TFLOP/s are 1e12 FLOP/s, TB/s 1e12 bytes/s, GB 1e9 bytes (ddplan.units).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import gc
import os
import platform
import re
import socket
import statistics
import time
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.utils.benchmark import Timer

from ddplan.anatomy import attention_pairs, build_anatomy
from ddplan.calibrate.allocator import minor_faults
from ddplan.calibrate.optim import AdamW, Muon, build_optimizer
from ddplan.calibrate.reference import build_model, window_masks
from ddplan.specs import ModelSpec
from ddplan.units import GB, MiB, TB, TFLOPS

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "tf32": torch.float32}
# Rotated GEMM inputs total at least this on a GPU: 3 x the largest last-level cache among the targets
# (MI300X Infinity Cache 256 MiB; H100/H200 L2 50 MiB, B200 126 MB).
GPU_ROTATE_BYTES = 3 * 256 * MiB
CPU_ROTATE_SETS = 4  # on CPU a few input sets (tests use tiny shapes)
MAX_ROTATE_SETS = 4096
ATTENTION_IMPLS = ("sdpa-math", "sdpa-fused", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "fa2",
                   "flash-attn-ck", "fa3", "cudnn")
# the hardware specs' `cudnn` (cuDNN's fused attention, as Transformer Engine runs it) is timed through PyTorch's
# cuDNN SDPA backend, causal over the whole sequence only: a sliding window there would be an explicit mask,
# computed in full, while the spec prices cuDNN's native window
FLASH_PACKAGES = ("fa2", "flash-attn-ck", "fa3")  # native windows: FLOPs counted on the window only


def _device(device) -> torch.device:
    d = torch.device(device)
    if d.type == "cuda" and d.index is None:
        d = torch.device("cuda", torch.cuda.current_device())
    return d


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _torch_dtype(dtype: str) -> torch.dtype:
    if dtype not in TORCH_DTYPES:
        raise ValueError(f"dtype {dtype!r} is not benchmarked; allowed: {', '.join(TORCH_DTYPES)}")
    return TORCH_DTYPES[dtype]


# --------------------------------------------------------------------------------------------
# Provenance and timing


def device_provenance(device: str) -> dict:
    """The calibration file's provenance (ddplan.calibration.Provenance keys) for this device and stack."""
    d = torch.device(device)
    gpu = d.type == "cuda"
    hip = getattr(torch.version, "hip", None)
    return {
        "device_name": torch.cuda.get_device_name(_device(d)) if gpu else _cpu_name(),
        "device_count": torch.cuda.device_count() if gpu else 1,
        "backend": ("rocm" if hip else "cuda") if gpu else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda if gpu and not hip else None,
        "hip": hip if gpu else None,
        "driver": _driver_version(bool(hip)) if gpu else None,
        "tunableop": os.environ.get("PYTORCH_TUNABLEOP_ENABLED"),
        "date": dt.datetime.now(dt.timezone.utc),
        "host": socket.gethostname(),
    }


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "cpu"


def _driver_version(rocm: bool) -> str | None:
    """The kernel driver's version from files the driver exposes (no subprocess that could hang)."""
    if rocm:
        with contextlib.suppress(OSError):
            with open("/sys/module/amdgpu/version") as f:
                return f"amdgpu {f.read().strip()}"
        return None
    with contextlib.suppress(OSError):
        with open("/proc/driver/nvidia/version") as f:
            m = re.search(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)", f.read())
            if m:
                return m.group(1)
    return None


SPREAD_TARGET = 0.05  # assumed: timings repeat until their IQR is within 5% of the median (or the time cap)


def time_s(fn: Callable[[], object], device, *, min_run_time: float = 0.2, warmup: int = 2) -> float:
    """Median seconds of one fn() call (time_stats: warm-up, then Timer.adaptive_autorange)."""
    return time_stats(fn, device, min_run_time=min_run_time, warmup=warmup)[0]


def time_stats(fn: Callable[[], object], device, *, min_run_time: float = 0.2, warmup: int = 2
               ) -> tuple[float, float]:
    """(median seconds of one fn() call, spread): spread = interquartile range / median of the timed blocks
    (torch.utils.benchmark Measurement.iqr); a busy machine shows as a large spread."""
    d = _device(device)
    ctx = torch.cuda.device(d) if d.type == "cuda" else contextlib.nullcontext()
    with ctx:
        for _ in range(warmup):
            fn()
        _sync(d)
        timer = Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
        # repeat until the interquartile range is within SPREAD_TARGET of the median, or a cap of ten times
        # the minimum time is hit (a busy machine then shows as a large spread, recorded with the value)
        m = timer.adaptive_autorange(threshold=SPREAD_TARGET, min_run_time=min_run_time,
                                     max_run_time=10 * min_run_time)
        return m.median, (m.iqr / m.median if m.median > 0 else 0.0)


def _min_run_time(quick: bool) -> float:
    return 0.05 if quick else 0.2


# --------------------------------------------------------------------------------------------
# GEMMs


def gemm_shapes(spec: ModelSpec, micro_batches: list[int], seq_len: int | None = None
                ) -> list[tuple[int, int, int, str]]:
    """Every distinct GEMM (m, n, k, label) of a training step at each micro-batch size, and of its
    optimizer (Muon's Newton-Schulz: ddplan.step.muon_gemm_shapes per matrix shape).

    From the anatomy's GEMM ops, each y = x W^T with x (m x k), W (n x k): forward (m, n, k), backward
    dX = dY W (m, k, n) and dW = x^T dY (k, n, m). Layers are collapsed ("h3.mlp.c_fc" -> "h*.mlp.c_fc");
    a shape shared by several GEMMs keeps the first label and says how many others share it.
    """
    if not micro_batches or any(b <= 0 for b in micro_batches):
        raise ValueError(f"micro_batches must be positive, got {micro_batches}")
    labels: dict[tuple[int, int, int], list[str]] = {}
    for mb in micro_batches:
        for op in build_anatomy(spec, batch=mb, seq_len=seq_len).ops:
            if op.kind != "gemm":
                continue
            m, n, k = op.shape
            name = re.sub(r"^h\d+\.", "h*.", op.name)
            for shape, role in (((m, n, k), "fwd"), ((m, k, n), "dX"), ((k, n, m), "dW")):
                seen = labels.setdefault(shape, [])
                if f"{name} {role}" not in seen:
                    seen.append(f"{name} {role}")
    from ddplan.anatomy import muon_matrices
    from ddplan.step import muon_gemm_shapes

    for group, algo in spec.recipe.optimizer.algorithm.items():  # what the optimizer itself multiplies
        if algo != "muon":
            continue
        for rows, cols in sorted(set(muon_matrices(spec, group))):
            for shape, role in zip(muon_gemm_shapes(rows, cols), ("X X^T", "A A", "B X")):
                labels.setdefault(shape, []).append(f"muon {rows}x{cols} {role}")
    return [(*shape, names[0] if len(names) == 1 else f"{names[0]} (+{len(names) - 1} same shape)")
            for shape, names in labels.items()]


def bench_gemm(m: int, n: int, k: int, *, dtype: str = "bf16", device="cuda", quick: bool = False) -> float:
    """TFLOP/s of an (m x k) @ (k x n) GEMM: 2 m n k / median time (bench_gemm_stats without the spread)."""
    return bench_gemm_stats(m, n, k, dtype=dtype, device=device, quick=quick)[0]


GEMM_ROLES = ("fwd", "dX", "dW")


def gemm_role(label: str) -> str:
    """The operand layout a gemm_shapes label's GEMM runs in (its first GEMM's, where several share the
    shape): fwd, dX or dW from the Linear's role; Muon's Newton-Schulz (ddplan.calibrate.optim) runs
    X X^T with its second operand transposed (fwd's layout) and A A and B X with both as stored (dX's)."""
    words = label.replace("(", " ").split()
    if words and words[0] == "muon":
        return "fwd" if "X^T" in words else "dX"
    return next((w for w in words if w in GEMM_ROLES), "fwd")


def bench_gemm_stats(m: int, n: int, k: int, *, dtype: str = "bf16", device="cuda", quick: bool = False,
                     role: str = "fwd") -> tuple[float, float]:
    """(TFLOP/s, spread) of an (m x k) @ (k x n) GEMM: 2 m n k / median time; spread as in time_stats.

    Operands are laid out as a Linear's training step has them (role; BLAS speed depends on which operand
    is transposed, and on CPU by up to 1.4x at the LM head's weight gradient): fwd, y = x W^T with the
    weight stored (n x k) and used transposed (F.linear); dX (m, n, k) = dY (m x k) @ W, W stored (k x n)
    as is; dW, gemm_shapes' (k_in, n_out, m_tokens), timed as autograd computes it, dY^T (n x k) @ x
    (k x m) with dY and x stored (tokens x features): the same FLOPs. Inputs are views into one random
    buffer, rotated so that the inputs touched between two uses of the same view exceed the last-level
    cache (GPU_ROTATE_BYTES; a few sets on CPU). tf32: fp32 storage, TF32 tensor cores.
    """
    if min(m, n, k) <= 0:
        raise ValueError(f"GEMM dimensions must be positive, got m={m}, n={n}, k={k}")
    if role not in GEMM_ROLES:
        raise ValueError(f"role must be one of {', '.join(GEMM_ROLES)}, got {role!r}")
    d, tdtype = _device(device), _torch_dtype(dtype)
    elem = torch.empty((), dtype=tdtype).element_size()
    align = 128  # start every view on a 256-byte boundary (bf16), as tensor cores prefer
    a_len, w_len = -(-m * k // align) * align, -(-n * k // align) * align
    set_len = a_len + w_len
    if d.type == "cuda":
        sets = 1 if set_len * elem >= GPU_ROTATE_BYTES else min(-(-GPU_ROTATE_BYTES // (set_len * elem)),
                                                               MAX_ROTATE_SETS)
    else:
        sets = CPU_ROTATE_SETS
    buf = torch.randn(sets * set_len, device=d, dtype=tdtype)

    def operands(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = buf[i * set_len: i * set_len + m * k], buf[i * set_len + a_len: i * set_len + a_len + n * k]
        if role == "fwd":
            return a.view(m, k), b.view(n, k).t()
        if role == "dX":
            return a.view(m, k), b.view(k, n)
        return b.view(k, n).t(), a.view(k, m)  # dW: dY^T (n x k) @ x (k x m), k = tokens

    pairs = [operands(i) for i in range(sets)]
    out = torch.empty(*((n, m) if role == "dW" else (m, n)), device=d, dtype=tdtype)
    state = {"i": 0}

    def fn():
        a, b = pairs[state["i"]]
        state["i"] = (state["i"] + 1) % sets
        torch.mm(a, b, out=out)

    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if dtype == "tf32" else "highest")
    try:
        t, spread = time_stats(fn, d, min_run_time=_min_run_time(quick))
    finally:
        torch.set_float32_matmul_precision(precision)
    return 2.0 * m * n * k / t / TFLOPS, spread


def bench_peak_gemm(*, dtype: str = "bf16", device="cuda", quick: bool = False
                    ) -> tuple[float, tuple[int, int, int]]:
    """(best TFLOP/s, its (m, n, k)) over a short sweep of square and rectangular shapes.

    GPU: 4096..16384 squares and wide/deep rectangles (quick: 3 shapes); CPU: sizes <= 1024.
    Ref for the approach: stas00 ml-engineering, "MAMF finder" (compute/accelerator).
    """
    if _device(device).type == "cuda":
        shapes = [(8192, 8192, 8192), (4096, 4096, 4096), (16384, 8192, 8192)] if quick else [
            (4096, 4096, 4096), (8192, 8192, 8192), (16384, 16384, 16384), (8192, 8192, 4096),
            (16384, 8192, 8192), (8192, 16384, 4096), (65536, 4096, 4096), (32768, 8192, 2048)]
    else:
        shapes = [(256, 256, 256), (512, 512, 512)] if quick else [
            (256, 256, 256), (512, 512, 512), (1024, 1024, 1024), (1024, 512, 1024), (1024, 1024, 512),
            (512, 1024, 1024), (768, 768, 768), (1024, 256, 1024)]
    results = [(bench_gemm(*s, dtype=dtype, device=device, quick=quick), s) for s in shapes]
    return max(results)


# --------------------------------------------------------------------------------------------
# Attention


def attention_flops(*, batch: int, heads: int, seq_len: int, window: int, head_dim: int, impl: str
                    ) -> tuple[float, float]:
    """(forward, backward) FLOPs in the attention efficiency convention of ddplan.roofline.

    4 b h d pairs forward, 8 b h d pairs backward, pairs = causal pairs of the processed window (w + 1
    keys per query): the window itself for flash packages (native windows), the full sequence for
    every SDPA path (unfused math computes all of it; a window there is an explicit mask).
    """
    processed = min(window, seq_len) if impl in FLASH_PACKAGES else seq_len
    pairs = attention_pairs(seq_len, processed, "flash_package", "native")
    return 4.0 * batch * heads * pairs * head_dim, 8.0 * batch * heads * pairs * head_dim


def _sdpa_backend(impl: str):
    from torch.nn.attention import SDPBackend

    name = {"sdpa-math": "MATH", "sdpa-flash": "FLASH_ATTENTION", "sdpa-efficient": "EFFICIENT_ATTENTION",
            "sdpa-cudnn": "CUDNN_ATTENTION"}[impl]
    return getattr(SDPBackend, name, None)


def _attention_fn(impl: str, seq_len: int, window: int, device: torch.device, rocm: bool):
    """(function of q, k, v, layout "bhsd" or "bshd", context) for an implementation, or None if unavailable."""
    if impl == "cudnn":
        if window < seq_len:
            return None
        impl = "sdpa-cudnn"
    if impl.startswith("sdpa-"):
        mask = window_masks([window], seq_len, device)[0]
        ctx = contextlib.nullcontext()
        if impl != "sdpa-fused":
            from torch.nn.attention import sdpa_kernel

            backend = _sdpa_backend(impl)
            if backend is None:
                return None
            ctx = sdpa_kernel(backend)
        return (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None),
                "bhsd", ctx)
    if device.type != "cuda" or (impl == "flash-attn-ck") != rocm:
        return None  # flash-attn-ck is the ROCm build of flash_attn, fa2 the CUDA one
    try:
        if impl == "fa3":
            from flash_attn_interface import flash_attn_func
        else:
            from flash_attn import flash_attn_func
    except ImportError:
        return None
    size = (window if window < seq_len else -1, 0)

    def flash(q, k, v):
        out = flash_attn_func(q, k, v, causal=True, window_size=size)
        return out[0] if isinstance(out, tuple) else out  # some FA3 versions return (out, lse)
    return flash, "bshd", contextlib.nullcontext()


def bench_attention(impl: str, *, batch: int, heads: int, seq_len: int, window: int, head_dim: int,
                    dtype: str = "bf16", device="cuda", quick: bool = False) -> tuple[float, float] | None:
    """(forward, backward) TFLOP/s of causal attention with a window of `window` tokens, or None.

    None when the implementation is not available here (package not installed, SDPA backend not
    built for or not usable on this device, dtype or window unsupported). FLOPs: `attention_flops`.
    sdpa-math is SDPA's math backend (as in the reference model); sdpa-fused is SDPA's own backend choice with
    is_causal for a full window and an explicit boolean mask for a sliding one (nanochat's fallback);
    sdpa-flash/-efficient/-cudnn force that backend; fa2/flash-attn-ck/fa3 pass window_size=(w, 0).
    Backward is timed as autograd.grad of the output, graph retained.
    """
    if impl not in ATTENTION_IMPLS:
        raise ValueError(f"attention implementation {impl!r}; allowed: {', '.join(ATTENTION_IMPLS)}")
    if min(batch, heads, seq_len, window, head_dim) <= 0:
        raise ValueError(f"need positive batch, heads, seq_len, window, head_dim; got {batch}, {heads}, "
                         f"{seq_len}, {window}, {head_dim}")
    d, tdtype = _device(device), _torch_dtype(dtype)
    found = _attention_fn(impl, seq_len, window, d, bool(getattr(torch.version, "hip", None)))
    if found is None:
        return None
    fn, layout, ctx = found
    shape = (batch, heads, seq_len, head_dim) if layout == "bhsd" else (batch, seq_len, heads, head_dim)
    q, k, v = (torch.randn(shape, device=d, dtype=tdtype, requires_grad=True) for _ in range(3))
    with ctx:
        try:
            with warnings.catch_warnings():  # SDPA warns about every backend it rules out
                warnings.simplefilter("ignore")
                out = fn(q, k, v)
        except (RuntimeError, NotImplementedError):
            return None  # "No available kernel", or the package refuses this dtype/shape/device
        grad = torch.randn_like(out)
        t_fwd = time_s(lambda: fn(q, k, v), d, min_run_time=_min_run_time(quick))
        t_bwd = time_s(lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True), d,
                       min_run_time=_min_run_time(quick))
    f_fwd, f_bwd = attention_flops(batch=batch, heads=heads, seq_len=seq_len, window=window, head_dim=head_dim,
                                   impl=impl)
    return f_fwd / t_fwd / TFLOPS, f_bwd / t_bwd / TFLOPS


# --------------------------------------------------------------------------------------------
# Memory bandwidth and launch overhead


def bench_hbm(device="cuda", *, nbytes: int | None = None, quick: bool = False) -> float:
    """TB/s of a device-to-device copy of nbytes, counting read plus write: 2 nbytes / median time.

    Default size: 1 GiB on a GPU (far beyond any cache), 64 MiB on CPU.
    """
    d = _device(device)
    nbytes = nbytes or (1024 * MiB if d.type == "cuda" else 64 * MiB)
    if nbytes < 4:
        raise ValueError(f"nbytes must be at least 4, got {nbytes}")
    src = torch.randn(nbytes // 4, device=d)
    dst = torch.empty_like(src)
    t = time_s(lambda: dst.copy_(src), d, min_run_time=_min_run_time(quick))
    return 2.0 * src.numel() * 4 / t / TB


def bench_loss_head_s(device="cuda", *, rows: int, vocab: int, softcap: float | None, dtype: str = "fp32",
                      quick: bool = False, compiled: bool = False) -> tuple[float, float]:
    """(forward seconds, forward + backward seconds) of the elementwise chain after the lm_head: the fp32
    logits, the softcap (if any) and the cross-entropy, with fresh outputs as in training (allocation, page
    faults and transcendentals included). The runner divides the anatomy's bytes for the same ops by these
    times, so elementwise ops get the rates measured at the model's own largest elementwise shape, forward
    and backward apart (they fuse differently: on a 2-core EPYC, compiled, the forward ran in 1/2.8 of its
    eager time and the backward in 1/2.1).

    compiled: the chain torch.compile'd (dynamic=False, as the held-out step compiles the model, head
    included), so a compiled step's elementwise ops get the rates Inductor's fused kernels reach instead of
    an assumed fusion factor (ddplan.roofline.COMPILED_POINTWISE_FRACTION). Compilation happens in the
    untimed warm-up; a failing compilation raises (the runner then times it eager and says so).
    """
    d = _device(device)
    x = torch.randn(rows, vocab, device=d, dtype=_torch_dtype(dtype), requires_grad=True)
    targets = torch.randint(0, vocab, (rows,), device=d)

    def loss_of(inp):
        logits = inp.float()
        if softcap:
            logits = softcap * torch.tanh(logits / softcap)
        return torch.nn.functional.cross_entropy(logits, targets)

    forward = torch.compile(loss_of, dynamic=False) if compiled else loss_of

    def chain() -> None:
        torch.autograd.grad(forward(x), x)

    both = time_s(chain, d, min_run_time=_min_run_time(quick))  # compiles in the untimed warm-up
    fwd = time_s(lambda: forward(x), d, min_run_time=_min_run_time(quick))  # as training runs it: saving for backward
    return fwd, both


ADAMW_COPIES = 3  # separately allocated parameters the AdamW benchmark splits its elements over (bench_adamw_s)


def bench_adamw_s(device="cuda", *, numel: int, dtype: str = "fp32", quick: bool = False,
                  compiled: bool = False, copies: int = ADAMW_COPIES) -> float:
    """Seconds of one AdamW step over numel elements, gradient present: the optimizer's own memory-bound rate.
    Eager: torch.optim.AdamW (fused on GPU, the default foreach/for-loop path on CPU); compiled: the
    torch.compile'd kernel the held-out step runs (ddplan.calibrate.optim.adamw_step).

    The elements are split over `copies` separately allocated parameters (the same memory as one): a real
    optimizer runs over many allocations, and one allocation alone is not typical (measured on a 2-core AMD
    EPYC VM: 0.026 or 0.040 TB/s for the same kernel depending on the allocation, each stable to 5%).
    """
    if numel <= 0 or copies <= 0 or copies > numel:
        raise ValueError(f"need numel > 0 and 0 < copies <= numel, got {numel}, {copies}")
    d = _device(device)
    sizes = [numel // copies] * (copies - 1) + [numel - (copies - 1) * (numel // copies)]
    params = []
    for size in sizes:
        p = torch.nn.Parameter(torch.randn(size, device=d, dtype=_torch_dtype(dtype)))
        p.grad = torch.randn_like(p)
        params.append(p)
    opt = (AdamW(params, lr=1e-4, compiled=True) if compiled
           else torch.optim.AdamW(params, lr=1e-4, fused=d.type == "cuda"))
    with _compile_limits():
        opt.step()  # create the state (and compile)
    return time_s(opt.step, d, min_run_time=_min_run_time(quick))


def bench_muon_s(device="cuda", *, rows: int, cols: int, count: int, dtype: str = "fp32", quick: bool = False,
                 compiled: bool = False, ns_steps: int = 5) -> float:
    """Seconds of one Muon step over `count` rows x cols matrices, gradients present: the reference optimizer's
    own step (ddplan.calibrate.optim.Muon: stack the gradients and parameters, momentum, Newton-Schulz on
    the stack, copy back), compiled as the held-out step runs it or eager. The planner's Muon term otherwise
    adds up its GEMMs at the rates of single 2-D GEMMs (ddplan.step.optimizer_time_s); the optimizer runs
    batched products over the stack and memory passes around them.
    """
    if min(rows, cols, count, ns_steps) <= 0:
        raise ValueError(f"need rows, cols, count, ns_steps > 0, got {rows}, {cols}, {count}, {ns_steps}")
    d = _device(device)
    params = []
    for _ in range(count):
        p = torch.nn.Parameter(torch.randn(rows, cols, device=d, dtype=_torch_dtype(dtype)) * 0.02)
        p.grad = torch.randn_like(p)
        params.append(p)
    opt = Muon(params, lr=0.02, ns_steps=ns_steps, compiled=compiled)
    with _compile_limits():
        opt.step()  # create the momentum buffer (and compile)
    return time_s(opt.step, d, min_run_time=_min_run_time(quick))


def bench_kernel_overhead_us(device="cuda", *, quick: bool = False) -> float:
    """Microseconds per launch of a tiny kernel (an in-place add on 1024 elements): the per-op floor."""
    d = _device(device)
    x = torch.randn(1024, device=d)
    return time_s(lambda: x.add_(1.0), d, min_run_time=_min_run_time(quick)) * 1e6


# The machine-speed probe: one fixed GEMM, timed between the benchmarks and between the held-out step's
# timed steps. On this project's 2-core VM the speed drifts over minutes: alternating a compiled d4 step
# (fp32, T 256, micro-batch 4) with a 1024^3 fp32 GEMM for 150 s (2026-12-02), the step's 15 s medians
# ranged 0.936-1.105 s (18%) and the probe's 14.2-16.0 ms (13%), correlated 0.61 step by step; the
# step / probe ratio ranged 8%. Within a calibration it explained less (round 9, README: the same-speed
# error was no smaller), so it is recorded as a diagnostic, not applied.
# A square GEMM: 1.6-1.7 ms measured on this VM's 2 cores (fp32, 512^3); on a GPU 4096^3 in bf16 is 137 GFLOP,
# ~0.2 ms at an H100's ~700 TFLOP/s (computed, not measured: no GPU has run it)
PROBE_SHAPE = {"cpu": 512, "cuda": 4096}
PROBE_REPEATS = 5


def probe_words(device: str, dtype: str) -> str:
    n = PROBE_SHAPE["cpu" if torch.device(device).type == "cpu" else "cuda"]
    return f"{dtype} {n}x{n}x{n} GEMM, median of {PROBE_REPEATS}"


def bench_probe_s(device="cuda", *, dtype: str = "bf16") -> float:
    """Seconds of the machine-speed probe (probe_words): a fixed square GEMM, the median of PROBE_REPEATS
    timed runs after one untimed. Cheap (about 10 ms in all on this VM's CPU), so it can run between any two
    benchmarks."""
    d = _device(device)
    n = PROBE_SHAPE["cpu" if d.type == "cpu" else "cuda"]
    a = torch.randn(n, n, device=d, dtype=_torch_dtype(dtype))
    b = torch.randn(n, n, device=d, dtype=_torch_dtype(dtype))
    out = torch.empty(n, n, device=d, dtype=a.dtype)
    times = []
    for i in range(PROBE_REPEATS + 1):
        _sync(d)
        t0 = time.perf_counter()
        torch.mm(a, b, out=out)
        _sync(d)
        if i:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


# --------------------------------------------------------------------------------------------
# One training step


class _Marks:
    """Timestamps between phases: CUDA events on GPUs (recorded on the stream), perf_counter on CPU."""

    def __init__(self, device: torch.device):
        self.gpu = device.type == "cuda"
        self.marks: list = []

    def mark(self) -> None:
        if self.gpu:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.marks.append(e)
        else:
            self.marks.append(time.perf_counter())

    def intervals_s(self) -> list[float]:
        if self.gpu:
            self.marks[-1].synchronize()
            return [a.elapsed_time(b) * 1e-3 for a, b in zip(self.marks, self.marks[1:])]
        return [b - a for a, b in zip(self.marks, self.marks[1:])]


def bench_train_step(spec: ModelSpec, *, batch: int, seq_len: int | None = None, attention: str = "sdpa-fused",
                     device="cuda", dtype_policy: str = "spec", steps: int = 5, warmup: int = 2,
                     recompute: str = "none", seed: int = 0, compile_model: bool = False,
                     compile_optimizer: bool = False, between: Callable[[], None] | None = None,
                     after_step: Callable[[int], None] | None = None) -> dict:
    """One real training step of the reference model: forward, backward, the spec's optimizer.

    compile_model: the model torch.compile'd with dynamic=False, as nanochat's base_train.py does;
    compile_optimizer: the optimizer's update kernels torch.compile'd (ddplan.calibrate.optim). Compilation
    happens in the first warm-up step (there is one whenever something compiles), never in a timed step; a
    part whose compilation fails runs eager, and the result says so.
    Returns step_time_s (median over `steps` steps after `warmup`), fwd_s, bwd_s, optimizer_s (medians
    of each phase; they need not add up to the step's median), peak_memory_bytes and peak_memory_gb
    (torch.cuda.max_memory_allocated over model, optimizer and activations; None on CPU), peak_reserved_bytes
    (max_memory_reserved) and outside_allocator_bytes (after the step; both None on CPU), the loss, the
    StepMeasurement fields (device_batch_size, total_batch_tokens = batch x seq_len: one micro-batch, no
    accumulation, compiled = the model ran compiled), compiled_optimizer, first_step_s (the first warm-up
    step, compilation included), page_faults (on CPU: the median of the timed steps' minor page faults,
    ddplan.calibrate.allocator; None on a GPU) and compile_notes (why a part ran eager). If it does not fit:
    {"skipped": "does not fit: <message>"}. between: called after each timed step, outside its time (the
    machine-speed probe); after_step(i): called after step i (0-based, warm-up steps included), after between
    (progress).
    """
    if batch <= 0 or steps <= 0 or warmup < 0:
        raise ValueError(f"need batch > 0, steps > 0, warmup >= 0; got {batch}, {steps}, {warmup}")
    d = _device(device)
    s = seq_len or spec.recipe.seq_len
    warmup = max(warmup, 1) if compile_model or compile_optimizer else warmup
    try:
        with torch.cuda.device(d) if d.type == "cuda" else contextlib.nullcontext(), _compile_limits():
            result = _train_step(spec, batch, s, attention, d, dtype_policy, steps, warmup, recompute, seed,
                                 compile_model, compile_optimizer, between, after_step)
    except (torch.cuda.OutOfMemoryError, MemoryError, RuntimeError) as e:
        if not _out_of_memory(e):
            raise
        message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    else:
        return result
    finally:
        if compile_model or compile_optimizer:
            torch._dynamo.reset()  # drop the compiled graphs (and the memory they hold)
    gc.collect()  # the exception and its frames are gone: free what the step held
    if d.type == "cuda":
        torch.cuda.empty_cache()
    return {"skipped": f"does not fit: {message}"}


def outside_allocator_bytes(d) -> float:
    """Device memory in use that torch's caching allocator does not hold, bytes: (total - free) by
    torch.cuda.mem_get_info (cudaMemGetInfo / hipMemGetInfo) less torch.cuda.memory_reserved. It is the CUDA/HIP
    context, loaded kernels and library handles of this process (ddplan.memory's `framework` term), and any
    other process's memory on the same GPU (the reading is device-wide). Ref: PyTorch docs, "CUDA semantics:
    memory management" (the context is outside the allocator's statistics)."""
    free, total = torch.cuda.mem_get_info(d)
    return max(0.0, float(total - free - torch.cuda.memory_reserved(d)))


def _out_of_memory(e: BaseException) -> bool:
    """CUDA/HIP out of memory, or the CPU allocator's failure (a plain RuntimeError)."""
    if isinstance(e, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    text = str(e)
    return "DefaultCPUAllocator" in text or "not enough memory" in text


def compile_failure(e: BaseException) -> str:
    """Why torch.compile failed, in one short line (its messages run to pages: the first lines say it)."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return " ".join([type(e).__name__ + ":", *lines[:3]])[:300]


def _compile_limits():
    # one compiled kernel per parameter shape (the optimizer's) recompiles once per shape: allow more than
    # Dynamo's default of 8 before it gives up and runs eager
    cfg = torch._dynamo.config
    name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    return cfg.patch(**{name: max(64, getattr(cfg, name))})


def _first_step(model, run_model, optimizer, spec, idx, targets, notes: list[str]):
    """The first warm-up step, where torch.compile compiles. A part whose compilation fails (no C++
    compiler, no Triton, an unsupported op) runs eager from then on, with the reason in notes; out of
    memory is raised as is. Returns the model callable and the optimizer that ran."""
    try:
        run_model(idx, targets).backward()
    except Exception as e:
        if run_model is model or _out_of_memory(e):
            raise
        notes.append(f"the model ran eager, torch.compile failed: {compile_failure(e)}")
        model.zero_grad(set_to_none=True)
        run_model = model
        run_model(idx, targets).backward()
    try:
        optimizer.step()
    except Exception as e:
        if not optimizer.compiled or _out_of_memory(e):
            raise
        notes.append(f"the optimizer ran eager, torch.compile of its kernels failed: {compile_failure(e)}")
        optimizer = build_optimizer(model, spec, compiled=False)
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return run_model, optimizer


def _train_step(spec, batch, seq_len, attention, d, dtype_policy, steps, warmup, recompute, seed,
                compile_model, compile_optimizer, between=None, after_step=None) -> dict:
    torch.manual_seed(seed)
    gpu = d.type == "cuda"
    if gpu:
        torch.cuda.reset_peak_memory_stats(d)
    model = build_model(spec, attention=attention, recompute=recompute, seq_len=seq_len, device=d,
                        dtype_policy=dtype_policy)
    notes: list[str] = []
    run_model = model
    if compile_model:
        try:  # lazy: this only wraps (it fails here where Dynamo is unsupported, e.g. a too new Python)
            run_model = torch.compile(model, dynamic=False)
        except Exception as e:
            notes.append(f"the model ran eager, torch.compile failed: {compile_failure(e)}")
    try:
        optimizer = build_optimizer(model, spec, compiled=compile_optimizer)
    except Exception as e:
        if not compile_optimizer:
            raise
        notes.append(f"the optimizer ran eager, torch.compile of its kernels failed: {compile_failure(e)}")
        optimizer = build_optimizer(model, spec)
    vocab = spec.architecture.vocab_size
    idx = torch.randint(0, vocab, (batch, seq_len), device=d)
    targets = torch.randint(0, vocab, (batch, seq_len), device=d)
    phases: list[list[float]] = []
    faults: list[int] = []
    loss = None
    first_s = None
    for i in range(warmup + steps):
        if i == 0 and warmup:
            t0 = time.perf_counter()
            run_model, optimizer = _first_step(model, run_model, optimizer, spec, idx, targets, notes)
            _sync(d)
            first_s = time.perf_counter() - t0
            if after_step is not None:
                after_step(i)
            continue
        marks = _Marks(d)
        faults0 = minor_faults()
        marks.mark()
        loss = run_model(idx, targets)
        marks.mark()
        loss.backward()
        marks.mark()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        marks.mark()
        if i >= warmup:
            phases.append(marks.intervals_s())
            if faults0 is not None and not gpu:  # a GPU step's host faults are not its time
                faults.append(minor_faults() - faults0)
            if between is not None:
                between()
        if after_step is not None:
            after_step(i)
    _sync(d)
    peak = torch.cuda.max_memory_allocated(d) if gpu else None
    reserved = torch.cuda.max_memory_reserved(d) if gpu else None
    outside = outside_allocator_bytes(d) if gpu else None  # model and optimizer still alive: after the step
    return {
        "step_time_s": statistics.median(sum(p) for p in phases),
        "fwd_s": statistics.median(p[0] for p in phases),
        "bwd_s": statistics.median(p[1] for p in phases),
        "optimizer_s": statistics.median(p[2] for p in phases),
        "steps": steps,
        "loss": float(loss.item()),
        "peak_memory_bytes": peak,
        "peak_memory_gb": None if peak is None else peak / GB,
        "peak_reserved_bytes": reserved,
        "outside_allocator_bytes": outside,
        "device_batch_size": batch,
        "seq_len": seq_len,
        "total_batch_tokens": batch * seq_len,
        "attention": attention,
        "recompute": recompute,
        "dtype_policy": dtype_policy,
        "compiled": run_model is not model,
        "compiled_optimizer": optimizer.compiled,
        "first_step_s": first_s,
        "page_faults": statistics.median(faults) if faults else None,
        "compile_notes": notes,
        "device": str(d),
    }
