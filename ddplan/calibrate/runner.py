"""`ddplan calibrate`: run the micro-benchmarks, write the calibration file, check the model against a real step.

Order: provenance, GEMMs at the model's own shapes, a short peak-GEMM sweep, attention per
implementation, HBM copy, kernel launch overhead, collectives (under torchrun, several GPUs only),
then one real training step, which is held out: the efficiencies come from the micro-benchmarks
alone, and the closing table compares the model's prediction for that step with the measurement,
before and after calibration. The file is rewritten atomically after every benchmark, so an
interrupted or failing run keeps what it measured, with the failure recorded. On a CPU every stage runs
with malloc keeping freed memory, as a GPU's caching allocator does (ddplan.calibrate.allocator).
"""

from __future__ import annotations

import datetime as dt
import os
import re
import signal
import statistics
import tempfile
import threading
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import yaml
from pydantic import ValidationError

from ddplan.calibrate import eta
from ddplan.calibrate.allocator import reuse_freed_memory
from ddplan.calibration import CalibrationSpec, memory_section
from ddplan.errors import UsageError
from ddplan.files import atomic_write
from ddplan.specs import HardwareSpec, ModelSpec

# hardware spec names by substrings of torch.cuda.get_device_name(), the first that matches: the Grace superchips
# before the HGX parts whose names theirs contain ("NVIDIA GB200" holds "B200"; cudnn-frontend's benchmark csvs
# log "NVIDIA GB200", "NVIDIA GB300", "NVIDIA B200"; a B300 reads "NVIDIA B300 SXM6 AC")
DEVICE_NAMES = (("MI355", "mi355x"), ("MI325", "mi325x"), ("MI300", "mi300x"), ("H200", "h200"),
                ("H100 PCIe", "h100-pcie"), ("H100", "h100-sxm"), ("GB300", "gb300"), ("GB200", "gb200"),
                ("B300", "b300"), ("B200", "b200"), ("A100-SXM4-40GB", "a100-sxm-40gb"), ("A100", "a100-sxm-80gb"))


def guess_hardware(device_name: str) -> str | None:
    for key, name in DEVICE_NAMES:
        if key.lower() in device_name.lower():
            return name
    return None


def sig(x: float, digits: int = 5) -> float:
    """x to `digits` significant figures: a measurement is never rounded to zero (0.00004 TFLOP/s stays)."""
    return float(f"{x:.{digits}g}")


@dataclass
class Recorder:
    """The calibration file being built; every update is validated and written atomically."""

    path: Path
    data: dict = field(default_factory=dict)

    def set(self, key: str, value) -> None:
        """Record one figure; one that fails validation is a recorded failure, and the run carries on."""
        self.data[key] = value
        try:
            self.flush()
        except ValidationError as e:
            del self.data[key]
            self.fail(key, e)

    def append(self, key: str, values: list) -> None:
        """Record points; each that fails validation is left out and recorded as a failure."""
        for v in values:
            self.data.setdefault(key, []).append(v)
            try:
                CalibrationSpec.model_validate(self.data)
            except ValidationError as e:
                self.data[key].pop()
                self.data.setdefault("failures", []).append(_short(f"{key}: {v}: {_first(e)}"))
        self.flush()

    def fail(self, what: str, err: BaseException) -> None:
        detail = _first(err) if isinstance(err, ValidationError) else f"{type(err).__name__}: {err}"
        self.data.setdefault("failures", []).append(_short(f"{what}: {detail}"))
        self.flush()

    def flush(self) -> None:
        # validate first: never write a file ddplan could not read back; dump plain JSON types
        plain = CalibrationSpec.model_validate(self.data).model_dump(mode="json", exclude_none=True)
        atomic_write(self.path, "# written by `ddplan calibrate`; see ddplan/calibration.py for the format\n"
                     + yaml.safe_dump(plain, sort_keys=False, width=110))


def _short(text: str) -> str:
    return " ".join(text.split())[:500]


def _first(e: ValidationError) -> str:
    err = e.errors()[0]
    return f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']} (got {err.get('input')!r})"


def cpu_hardware(peak: float, hbm: float, overhead_us: float, src: str, provenance: dict) -> HardwareSpec:
    """A hardware spec for this CPU, built from its own measurements (there is no datasheet figure to use).

    Peak = the best fp32 GEMM measured anywhere in the calibration (the sweep or the model's own shapes),
    so GEMM efficiencies are fractions of what this machine can do and no step sustains more; HBM =
    measured copy bandwidth; attention and GEMM efficiencies come from measured points.
    """
    sourced = {"value": peak, "source": src}
    eff = {"value": 1.0, "basis": "measured", "source": src}
    busbw = {"value": 1.0, "source": "assumed: a single CPU process has no fabric"}
    return HardwareSpec.model_validate({
        "kind": "hardware", "name": "cpu-local", "display_name": f"this CPU ({provenance.get('device_name', 'cpu')})",
        "vendor": "cpu", "software_stack": "cpu",
        "peak": {"bf16_tflops": sourced, "fp8_tflops": None, "tf32_tflops": None, "fp32_vector_tflops": sourced},
        "memory": {"usable_gib": {"value": 16.0, "source": "assumed"}, "vendor_label_gb": 16.0,
                   "hbm_tbyte_per_s": {"value": hbm, "source": src}},
        "gpus_per_node": 2,
        "intra_node": {"topology": "pcie", "links_per_gpu": 1,
                       "link_gbyte_per_s_per_direction": busbw,
                       "busbw_gbyte_per_s": {c: {2: busbw} for c in ("all_reduce", "reduce_scatter", "all_gather")},
                       "latency_us": {"value": 10.0, "source": "assumed"}},
        "inter_node": {"nics_per_node": 1, "nic_gbit_per_s": {"value": 10.0, "source": "assumed"},
                       "fabric": "ethernet",
                       "busbw_fraction_of_nics": {"value": 0.5, "basis": "assumed", "source": "assumed"},
                       "latency_us": {"value": 50.0, "source": "assumed"}},
        "prices": [{"usd_per_gpu_hour": 0.1, "billing": "per_gpu", "provider": "local", "date": dt.date.today(),
                    "source": "assumed: a placeholder for a local CPU"}],
        "efficiency": {"gemm": {"best": eff, "half_dim": {"value": 1.0, "source": "unused: measured points"}},
                       "hbm": eff, "kernel_overhead_us": {"value": overhead_us, "source": src}},
        "attention": [{"name": n, "kind": k, "windows": "mask", "efficiency_fwd": eff, "efficiency_bwd": eff,
                       "description": f"PyTorch SDPA on CPU ({n})"}
                      for n, k in (("sdpa-math", "sdpa_math"), ("sdpa-fused", "fused_sdpa"))],
        "default_attention": "sdpa-fused",
    })


@dataclass(frozen=True)
class CalibrateRequest:
    model: ModelSpec
    hardware: HardwareSpec | None  # None: guessed from the device name, or built from measurements on CPU
    device: str  # "cpu" or "cuda" (ROCm GPUs are "cuda" to torch)
    out: Path
    quick: bool = False
    micro_batches: tuple[int, ...] = ()  # () = the recipe's device batch and its halves down to /4
    attention: tuple[str, ...] = ()  # () = every implementation the hardware spec lists
    nproc: int = 1  # GPUs on this node for the collectives (torchrun)
    seq_len: int | None = None
    step_batch: int | None = None  # micro-batch of the held-out training step (default: the recipe's)
    compile_step: bool | None = None  # None: the held-out step runs as the training program does, eager if quick
    # on CPU: "reuse" (malloc keeps freed memory, ddplan.calibrate.allocator) or "system"; None: reuse, but
    # system for --quick (reuse holds more memory: d4's eager step 2.3 GB against 1.4 GB)
    cpu_malloc: str | None = None


@dataclass(frozen=True)
class StepProgram:
    """How the held-out step runs: the model torch.compile'd or eager, the optimizer's kernels compiled or not."""

    model: bool
    optimizer: bool

    def words(self) -> str:
        return (f"{'compiled' if self.model else 'eager'} model, "
                f"{'compiled' if self.optimizer else 'eager'} optimizer")


def cpu_malloc(req: CalibrateRequest) -> str:
    """How host memory is handled on a CPU run: req.cpu_malloc, or reuse (system with --quick)."""
    if req.cpu_malloc not in (None, "reuse", "system"):
        raise ValueError(f"cpu_malloc must be reuse, system or None, got {req.cpu_malloc!r}")
    return req.cpu_malloc or ("system" if req.quick else "reuse")


def step_program(req: CalibrateRequest) -> StepProgram:
    """The program the held-out step runs, as the model's training program runs it: the model compiled where
    the recipe compiles it (nanochat: torch.compile(model, dynamic=False)), the optimizer's kernels compiled
    where the recipe's optimizer has Muon (nanochat's MuonAdamW compiles `adamw_step_fused` and
    `muon_step_fused`; torch's AdamW, as nanoGPT runs it, is not compiled). Eager under --quick (no
    compilation to wait for) or when compile_step is False."""
    compiled = (not req.quick) if req.compile_step is None else req.compile_step
    recipe = req.model.recipe
    return StepProgram(model=compiled and recipe.compiled,
                       optimizer=compiled and "muon" in recipe.optimizer.algorithm.values())


def compile_estimate_s(spec: ModelSpec, program: StepProgram) -> float:
    """Seconds torch.compile may take in the held-out step's first warm-up step, on a cold cache (a warm
    Inductor cache takes a fraction): measured on a 2-core CPU with torch 2.13, nanochat d2/d4/d6 at
    4 x 256 compiled in 45/39/48 s (model) and about 10 s (the optimizer's kernels)."""
    return (30.0 + 3.0 * spec.architecture.num_layers if program.model else 0.0) + (10.0 if program.optimizer else 0.0)


Progress = Callable[[str], None]


# CPU defaults: T = 256, micro-batch 4 (the shape issue 11 checks the closing loop at): seconds and about a
# GB for small models, where the recipe's 32 x 2048 took 22.9 GB
CPU_SEQ_LEN, CPU_STEP_BATCH = 256, 4
GPU_MEMORY_SHARE = 0.8  # assumed margin: the held-out step may plan for this share of the device's (or, on CPU, RAM's) free memory
BUSY_SPREAD_PCT = 20.0  # GEMM timings spreading more than this say the machine is busy (issue 11's threshold)
BUSY_TIME_SHARE = 0.25  # ... when the shapes spreading so hold more than this share of the GEMM time
# On CPU with freed memory kept (ddplan.calibrate.allocator), the process's peak resident memory over the memory
# model's peak of the held-out step: at most 1.47 in ten runs here (2026-12-02: d4 with an eager step 2.60 GB
# against 1.77; compiled d2-d6 full runs 1.02-1.30), rounded up. With malloc as it is the model is above the
# measurement (d4 quick 1.50 GB against 1.77, d6 full 2.0 against 2.21).
REUSE_PEAK_FACTOR = 1.5
# Each GEMM shape is timed in GEMM_PASSES passes over all shapes (a full run; one pass with --quick), each in
# its own allocation, and the point is the mean time over passes. Measured here (2-core AMD EPYC VM, 2026-12-01,
# malloc as it is): the same kernel timed in different allocations or minutes apart differed by up to 2x (the
# lm_head dW of d4: 0.064 and 0.133 TFLOP/s in two runs; AdamW 0.026 or 0.040 TB/s by allocation) while each
# timing's own spread was under 5%, most of it page faults on fresh allocations (ddplan.calibrate.allocator);
# a training step runs its kernels over many allocations and a span of time, so it sees the mean.
# The passes after the first run after the held-out step, so the GEMM rates and the step it is graded against
# span the same minutes of the machine's state (drift between them is model error on nobody's part).
GEMM_PASSES = 2
# the machine-speed probe (bench.bench_probe_s, ~15 ms on CPU) runs at each stage's start and before every
# PROBE_EVERY-th GEMM shape of each pass (the GEMMs are most of a CPU prediction), and after each of the
# held-out step's timed steps: under a second in a run of 1-4 minutes
PROBE_EVERY = 4


def first_probes_s(device: str) -> tuple[float, ...]:
    """eta.FIRST_PROBES runs of the machine-speed probe before the run, on CPU (where eta.PROBE_QUIET_S says
    what they take on a quiet machine), so the first estimate of the time left knows this machine's speed; ()
    on a GPU or where the probe fails (the estimate then starts from the quiet figures)."""
    from ddplan.calibrate import bench

    if device != "cpu":
        return ()
    try:
        return tuple(bench.bench_probe_s(device, dtype="fp32") for _ in range(eta.FIRST_PROBES))
    except Exception:  # the probe only refines the estimate: without it the run goes on
        return ()


def shape_count(label: str) -> int:
    """GEMMs a gemm_shapes label stands for: 1, plus N for "(+N same shape)"."""
    more = re.search(r"\(\+(\d+) same shape\)", label)
    return 1 + (int(more.group(1)) if more else 0)


def pass_mean(m: int, n: int, k: int, times_s: list[float], spread_pct: float) -> dict:
    """A GEMM point from its passes: TFLOP/s at the mean time (2 m n k / mean), and as spread the larger of
    the first pass's interquartile spread and the passes' range / mean, in percent."""
    if not times_s or min(times_s) <= 0:
        raise ValueError(f"need positive pass times, got {times_s}")
    mean = sum(times_s) / len(times_s)
    across = 100 * (max(times_s) - min(times_s)) / mean
    return {"tflops": sig(2.0 * m * n * k / mean / 1e12), "spread_pct": sig(max(spread_pct, across), 3)}


@dataclass(frozen=True)
class Shapes:
    """What a calibration measures: the sequence length, the held-out step's micro-batch, the GEMM
    micro-batches, the predicted peak memory of the held-out step, and why the shapes are what they are."""

    seq_len: int
    step_batch: int
    micro_batches: tuple[int, ...]
    peak_bytes: float
    notes: tuple[str, ...] = ()
    # the held-out step's predicted activations, saved + backward's transient (bytes): what the measured
    # allocator reserve is a fraction of (ddplan.calibration.allocator_fraction)
    activation_bytes: float = 0.0
    skip_step: bool = False  # not even micro-batch 1 fits: the held-out step is skipped, with the reason


def plan_shapes(req: CalibrateRequest, free_bytes: float | None) -> Shapes:
    """Size the work with ddplan's own memory model: small defaults on CPU; on a GPU the recipe's
    micro-batch, halved until the held-out step fits in GPU_MEMORY_SHARE of the free memory."""
    from ddplan.layout import NATIVE_ZERO, Layout
    from ddplan.memory import MemoryAssumptions
    from ddplan.sizing import Setup, breakdown
    from ddplan.specs import run_variant

    spec, cpu = req.model, req.device == "cpu"
    seq = req.seq_len or (min(CPU_SEQ_LEN, spec.recipe.seq_len) if cpu else spec.recipe.seq_len)
    try:
        run_spec = run_variant(spec_for_device(spec, req.device), seq_len=seq)
    except ValueError as e:
        raise UsageError(str(e), field="--seq-len") from None
    mb = req.step_batch or (CPU_STEP_BATCH if cpu else spec.recipe.device_batch_size)
    attention = "sdpa-fused"

    compiled = step_program(req).model

    def terms(batch: int) -> dict[str, float]:
        layout = Layout(dp=1, zero=NATIVE_ZERO[spec.recipe.distribution], micro_batch=batch, attention=attention,
                        compiled=compiled)
        hw = cpu_hardware(1.0, 1.0, 1.0, "sizing only", {}) if req.hardware is None else req.hardware
        return breakdown(run_spec, hw, Setup(layout=layout, assumptions=MemoryAssumptions(framework_gib=0.5))).terms

    def peak(batch: int) -> float:
        total = sum(terms(batch).values())
        return total * (REUSE_PEAK_FACTOR if cpu and cpu_malloc(req) == "reuse" else 1.0)

    notes, skip = [], False
    if free_bytes is None and cpu:  # the RAM this process may still take
        free_bytes = _available_ram_bytes()
    if free_bytes is not None:
        limit = GPU_MEMORY_SHARE * free_bytes
        while req.step_batch is None and mb > 1 and peak(mb) > limit:
            mb //= 2
        if peak(mb) > limit:
            skip = True
            notes.append(f"training step (held out): skipped, micro-batch {mb} x {seq} needs {peak(mb) / 2**30:.1f} "
                         f"GiB, over {GPU_MEMORY_SHARE:.0%} of the {free_bytes / 2**30:.1f} GiB free")
        elif mb != (req.step_batch or spec.recipe.device_batch_size):
            notes.append(f"held-out step at micro-batch {mb}: the recipe's does not fit in "
                         f"{GPU_MEMORY_SHARE:.0%} of the {free_bytes / 2**30:.1f} GiB free")
    batches = req.micro_batches or tuple(sorted({max(1, mb // 4), max(1, mb // 2), mb}))
    at = terms(mb)
    return Shapes(seq_len=seq, step_batch=mb, micro_batches=batches, peak_bytes=peak(mb), notes=tuple(notes),
                  skip_step=skip, activation_bytes=at["activations"] + at["activation_transient"])


MEMORY_ON_GPU_ONLY = ("memory: the CUDA/ROCm context and the allocator's reserve are measured on a GPU only; the "
                      "assumed defaults stay (ddplan.memory.MemoryAssumptions)")


def step_memory(res: dict, activation_bytes: float, batch: int, seq_len: int) -> dict | None:
    """The calibration's `memory:` section from a held-out step's result (bench.bench_train_step: its allocated
    and reserved peaks and what was outside the allocator, bytes) and the step's predicted activations
    (Shapes.activation_bytes), figures to 5 significant digits; None where torch's allocator has no statistics
    (CPU)."""
    if res.get("peak_reserved_bytes") is None or res.get("outside_allocator_bytes") is None:
        return None
    section = memory_section(res["peak_memory_bytes"], res["peak_reserved_bytes"], activation_bytes,
                             res["outside_allocator_bytes"], batch, seq_len)
    measured = {k: sig(v) if isinstance(v, float) else v for k, v in section.pop("measured").items()}
    return {**{k: sig(v) for k, v in section.items()}, "measured": measured}


def _available_ram_bytes() -> float | None:
    """MemAvailable from /proc/meminfo (Linux), else None (then nothing is checked)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return None


STAGES = ("GEMMs at the model's shapes", "peak GEMM sweep", "attention", "HBM bandwidth", "elementwise ops",
          "optimizer", "kernel overhead", "collectives", "training step (held out)",
          "GEMMs again (after the step)")
HELD_OUT_STAGE = STAGES.index("training step (held out)")


def stages_for(quick: bool) -> tuple[str, ...]:
    """The stages a run goes through: --quick times the GEMMs once, so it has no second pass."""
    return STAGES[:-1] if quick else STAGES


STEP_WARMUP = 2  # untimed steps of the held-out step before its timed ones (the first compiles, where it does)


def step_parts_s(spec: ModelSpec, shapes: Shapes, quick: bool, compile_s: float) -> tuple[float, ...]:
    """Estimated seconds of each step of the held-out stage (warm-up steps, then timed), on the quiet VM the
    estimates are from: eta.step_s each, the first also building the model (eta.STEP_BUILD_S) and compiling
    (compile_s). No parts when the step is skipped."""
    if shapes.skip_step:
        return ()
    one = eta.step_s(spec.architecture, shapes.step_batch, shapes.seq_len)
    return (eta.STEP_BUILD_S + compile_s + one, *(one for _ in range(STEP_WARMUP + step_count(quick) - 1)))


def step_count(quick: bool) -> int:
    """Timed steps of the held-out step: 2 with --quick, 7 otherwise."""
    return 2 if quick else 7


def stage_estimates_s(req: CalibrateRequest, shapes: Shapes, gemm_shapes: list[tuple[int, int, int, str]],
                      compile_s: float) -> tuple[float, ...]:
    """Estimated seconds of each stage of stages_for(req.quick), on the quiet VM the estimates are from
    (ddplan.calibrate.eta's figures): the GEMM shapes (eta.gemm_part_s each, once per pass), the attention
    points, the optimizer (eta.optimizer_stage_s), the held-out step (step_parts_s) and fixed costs for the
    rest. A prior: eta.Eta rescales it by the run's measured speed as it goes. A GPU runs the benchmarks'
    kernels far faster, so there the estimate is high until that rescaling."""
    points = len(set(req.model.architecture.windows(shapes.seq_len))) * len(attention_impls(req))
    times = {STAGES[0]: sum(eta.gemm_part_s(m, n, k, req.quick) for m, n, k, _ in gemm_shapes),
             "peak GEMM sweep": eta.PEAK_SWEEP_S, "attention": eta.ATTENTION_POINT_S * points,
             "HBM bandwidth": eta.HBM_S, "elementwise ops": eta.ELEMENTWISE_S,
             "optimizer": eta.optimizer_stage_s(req.model), "kernel overhead": eta.KERNEL_OVERHEAD_S,
             "collectives": eta.COLLECTIVES_S if req.nproc > 1 else 0.0,
             STAGES[HELD_OUT_STAGE]: sum(step_parts_s(req.model, shapes, req.quick, compile_s)),
             STAGES[-1]: (GEMM_PASSES - 1) * sum(eta.gemm_part_s(m, n, k, False) for m, n, k, _ in gemm_shapes)}
    return tuple(times[name] for name in stages_for(req.quick))


def stage_kinds(quick: bool) -> tuple[str, ...]:
    """Each stage's kind for ddplan.calibrate.eta: "step" for the held-out step (a fixed number of steps, its
    time follows the machine's speed), "bench" for the micro-benchmarks (timed for a bounded time each)."""
    return tuple("step" if name == STAGES[HELD_OUT_STAGE] else "bench" for name in stages_for(quick))


def resolve_device(device: str, nproc: int | None) -> tuple[str, int]:
    """(device, GPUs for the collectives) from --device and --nproc: auto takes a GPU where torch sees one;
    cuda without one, or another name, is a UsageError; --nproc defaults to every visible GPU (1 on CPU)."""
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise UsageError(f"must be auto, cuda or cpu, got {device!r}", field="--device")
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("torch sees no GPU (CUDA or ROCm); use --device cpu for a test run", field="--device")
    return device, nproc if nproc is not None else torch.cuda.device_count() if device == "cuda" else 1


@dataclass(frozen=True)
class Prepared:
    """What a run will do, known before it starts: its shapes, the GEMM shapes it times, how the held-out step
    runs (and its compile estimate), the stages with each one's estimate and kind, and the machine-speed probes
    run before it (on CPU), which make the first estimate (first_estimate_s) this machine's."""

    shapes: Shapes
    gemm_shape_count: int
    program: StepProgram
    compile_s: float
    stages: tuple[str, ...]
    estimates_s: tuple[float, ...]
    kinds: tuple[str, ...]
    probe_quiet_s: float | None
    first_probes_s: tuple[float, ...]

    def progress_args(self) -> dict:
        """The arguments of eta.StageLines (and eta.Eta, less the stages) for this run."""
        return dict(stages=self.stages, estimates_s=self.estimates_s, kinds=self.kinds,
                    probe_quiet_s=self.probe_quiet_s, first_probes_s=self.first_probes_s)

    @property
    def first_estimate_s(self) -> float:
        return eta.Eta(self.estimates_s, self.kinds, probe_quiet_s=self.probe_quiet_s,
                       first_probes_s=self.first_probes_s).left_s()


def prepare(req: CalibrateRequest, free_bytes: float | None) -> Prepared:
    """A run's plan before any benchmark (plan_shapes, the GEMM shapes, step_program, stage_estimates_s), with
    the machine-speed probes on CPU (first_probes_s). The probe's quiet time is the CPU's (a GPU's probe is
    another kernel): on a GPU the step's estimate goes as the benchmarks go."""
    from ddplan.calibrate.bench import gemm_shapes

    shapes = plan_shapes(req, free_bytes)
    shape_list = gemm_shapes(spec_for_device(req.model, req.device), list(shapes.micro_batches), shapes.seq_len)
    program = step_program(req)
    compile_s = compile_estimate_s(req.model, program)
    return Prepared(shapes=shapes, gemm_shape_count=len(shape_list), program=program, compile_s=compile_s,
                    stages=stages_for(req.quick), estimates_s=stage_estimates_s(req, shapes, shape_list, compile_s),
                    kinds=stage_kinds(req.quick),
                    probe_quiet_s=eta.PROBE_QUIET_S if req.device == "cpu" else None,
                    first_probes_s=first_probes_s(req.device))


def check_attention(names: list[str], hw: HardwareSpec | None) -> None:
    """--attention's names, before any benchmark: each one an implementation calibrate can time
    (bench.ATTENTION_IMPLS) and, with --hardware, one of that hardware's; a UsageError naming the others."""
    from ddplan.calibrate import bench

    hw_names = {a.name for a in hw.attention} if hw else None
    allowed = tuple(n for n in bench.ATTENTION_IMPLS if hw_names is None or n in hw_names)
    bad = [n for n in names if n not in allowed]
    if bad:
        raise UsageError(f"{', '.join(map(repr, bad))}: not an attention implementation calibrate can time"
                         f"{' on ' + hw.name if hw else ''}; allowed: {', '.join(allowed)}", field="--attention")


def attention_impls(req: CalibrateRequest) -> tuple[str, ...]:
    """The attention implementations a run times: --attention, else every one the hardware spec lists (both
    SDPA paths without a spec)."""
    hw = req.hardware
    return req.attention or (tuple(x.name for x in hw.default_attention_impls()) if hw else ("sdpa-math", "sdpa-fused"))


class Interrupted(Exception):
    """SIGTERM (or SIGINT) during a calibration: what was measured is kept, what was not is recorded."""


def run(req: CalibrateRequest, progress: Progress = lambda msg: None, shapes: Shapes | None = None,
        within: Callable[[float], None] = lambda fraction: None, probed: Callable[[float], None] = lambda s: None
        ) -> tuple[CalibrationSpec, HardwareSpec, dict]:
    """Run every benchmark; return the calibration, the hardware spec it refines, and the held-out step.

    progress(name) at the start of each stage; within(fraction) as the parts of a stage finish (each GEMM
    shape, attention point and training step), fraction = the stage's estimated seconds done
    (eta.done_fractions); probed(seconds) after each machine-speed probe: so a caller can tell how fast the run
    goes (ddplan.calibrate.eta).
    Each stage that fails is recorded and the rest carries on; SIGTERM and SIGINT stop the run after
    recording which stages were not measured (the file stays valid), then re-raise.
    """
    from ddplan.calibrate import bench

    spec, device = req.model, req.device
    shapes = shapes or plan_shapes(req, None)
    seq, mb0, batches = shapes.seq_len, shapes.step_batch, shapes.micro_batches
    dtype_policy = "fp32" if device == "cpu" else "spec"
    gemm_dtype = "fp32" if device == "cpu" else spec.dtypes.compute
    prov = bench.device_provenance(device)
    hw = req.hardware
    hw_name = hw.name if hw else (guess_hardware(prov.get("device_name", "")) or ("cpu-local" if device == "cpu"
                                                                                  else "unknown"))
    rec = Recorder(req.out, {"kind": "calibration", "version": 1, "hardware": hw_name, "seq_len": seq,
                             "dtype": "fp32" if device == "cpu" else spec.dtypes.compute, "provenance": prov})
    rec.flush()
    for note in shapes.notes:
        rec.data.setdefault("failures", []).append(note)

    program = step_program(req)

    def note(text: str) -> None:
        rec.data.setdefault("failures", []).append(text)
        rec.flush()

    probes: dict[str, list[float]] = {"benchmarks": [], "step": []}  # the machine-speed probe's times

    def probe(during: str) -> None:
        try:
            seconds = bench.bench_probe_s(device, dtype=gemm_dtype)
        except (KeyboardInterrupt, Interrupted):
            raise
        except Exception:  # the probe is a check on the others: without it they stand as measured
            return
        probes[during].append(seconds)
        probed(seconds)

    def stage(name: str, fn: Callable[[], None]) -> None:
        if name == STAGES[HELD_OUT_STAGE] and (program.model or program.optimizer) and not shapes.skip_step:
            progress(f"{name}: {program.words()}; torch.compile first, up to about "
                     f"{compile_estimate_s(spec, program):.0f} s (not timed)")
        else:
            progress(name)
        if name != STAGES[HELD_OUT_STAGE]:  # the step takes its own probes, between its timed steps
            probe("benchmarks")
        try:
            fn()
        except (KeyboardInterrupt, Interrupted):
            raise
        except Exception as e:  # a failing benchmark is recorded, the rest carries on
            if os.environ.get("DDPLAN_DEBUG") == "1":
                traceback.print_exc()
            rec.fail(name, e)

    gemm_state: dict = {}  # the first pass's points, times and spreads, for the passes after the step

    def gemms() -> None:
        points, times, first_spread = [], [], []
        shapes_ = bench.gemm_shapes(spec, list(batches), seq)
        gemm_state.update(points=points, times=times, first_spread=first_spread, shapes=shapes_)
        done = eta.done_fractions([eta.gemm_part_s(m, n, k, req.quick) for m, n, k, _ in shapes_])
        for i, (m, n, k, label) in enumerate(shapes_):
            if i % PROBE_EVERY == PROBE_EVERY - 1:  # the GEMMs are most of the prediction: sample their minutes
                probe("benchmarks")
            tflops, spread = bench.bench_gemm_stats(m, n, k, dtype=gemm_dtype, device=device, quick=req.quick,
                                                    role=bench.gemm_role(label))
            points.append({"m": m, "n": n, "k": k, "dtype": gemm_dtype, "tflops": sig(tflops),
                           "spread_pct": sig(100 * spread, 3), "label": label})
            times.append([2.0 * m * n * k / (tflops * 1e12)])
            first_spread.append(100 * spread)
            rec.append("gemm", points[-1:])  # in the file as soon as it is measured (an interruption keeps it)
            within(done[i])
        if req.quick:
            busy_check()

    def gemms_again() -> None:  # after the held-out step: the rates span the step's minutes (not with --quick)
        if not gemm_state:
            return
        points, times, first_spread = gemm_state["points"], gemm_state["times"], gemm_state["first_spread"]
        measured = gemm_state["shapes"][:len(points)]  # a first pass that failed part-way: what it measured
        done = eta.done_fractions([eta.gemm_part_s(m, n, k, False) for m, n, k, _ in measured] * (GEMM_PASSES - 1))
        for p in range(GEMM_PASSES - 1):  # again, later and in a new allocation
            for i, (m, n, k, label) in enumerate(measured):
                if i % PROBE_EVERY == PROBE_EVERY - 1:
                    probe("benchmarks")
                tflops, _spread = bench.bench_gemm_stats(m, n, k, dtype=gemm_dtype, device=device,
                                                         role=bench.gemm_role(label))
                times[i].append(2.0 * m * n * k / (tflops * 1e12))
                points[i].update(pass_mean(m, n, k, times[i], first_spread[i]))
                within(done[p * len(measured) + i])
            rec.flush()  # the points are the file's own entries (rec.append keeps the same dicts)
        busy_check()

    def busy_check() -> None:
        points, times = gemm_state["points"], gemm_state["times"]
        # each shape weighted by its time: a few-microsecond GEMM jitters by tens of percent on a quiet machine
        # (timer and scheduler granularity), so a count of noisy shapes says little about the figures that matter
        weight = [sum(t) / len(t) * shape_count(p["label"]) for p, t in zip(points, times)]
        noisy = [p for p in points if p["spread_pct"] > BUSY_SPREAD_PCT]
        noisy_share = sum(w for p, w in zip(points, weight) if p["spread_pct"] > BUSY_SPREAD_PCT) / (sum(weight) or 1)
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
        if device == "cpu" and load > 1.5 * (os.cpu_count() or 1):  # more runnable work than the cores (this
            rec.data.setdefault("failures", []).append(  # run included): timings are shared with others
                f"GEMMs: the machine looks busy: load average {load:.1f} on {os.cpu_count()} cores; calibrate "
                f"again when it is quiet")
            rec.flush()
        elif noisy_share > BUSY_TIME_SHARE:  # timings of one kernel disagree: something else is running
            rec.data.setdefault("failures", []).append(
                f"GEMMs: the machine looks busy: {len(noisy)} of {len(points)} shapes, {100 * noisy_share:.0f}% of "
                f"the measured GEMM time (each shape's time x the GEMMs that share it), have timings that spread "
                f"more than {BUSY_SPREAD_PCT:g}% (interquartile range / median, or the passes' range / mean); "
                f"calibrate again when it is quiet")
            rec.flush()

    def peak() -> None:
        tflops, shape = bench.bench_peak_gemm(dtype=gemm_dtype, device=device, quick=req.quick)
        rec.set("peak_gemm_tflops", sig(tflops))

    def attention() -> None:
        a = spec.architecture
        names = attention_impls(req)
        windows = sorted(set(a.windows(seq)))
        timed = [impl for impl in names if impl in bench.ATTENTION_IMPLS]  # not: a spec's kernel with no benchmark
        missing = [f"{impl} (no benchmark for it)" for impl in names if impl not in timed]
        done = iter(eta.done_fractions([1.0] * len(timed) * len(windows)))
        points = []
        for impl, w in ((impl, w) for impl in timed for w in windows):
            got = bench.bench_attention(impl, batch=mb0, heads=a.num_heads, seq_len=seq, window=w,
                                        head_dim=a.head_dim, dtype=gemm_dtype, device=device, quick=req.quick)
            within(next(done))
            if got is None:  # this backend cannot run this window here (e.g. flash with a mask)
                missing.append(f"{impl} (window {w})")
                continue
            points.append({"implementation": impl, "batch": mb0, "heads": a.num_heads, "seq_len": seq,
                           "window": w if _native(hw, impl) else seq, "head_dim": a.head_dim,
                           "fwd_tflops": sig(got[0]), "bwd_tflops": sig(got[1])})
        rec.append("attention", points)
        for impl in missing:
            rec.data.setdefault("failures", []).append(f"attention {impl}: not available on this device/stack")
        rec.flush()

    def hbm() -> None:
        rec.set("hbm_tbyte_per_s", sig(bench.bench_hbm(device, nbytes=(64 if device == "cpu" else 1024) * 2**20)))

    def pointwise() -> None:
        from ddplan.anatomy import build_anatomy

        run_spec = spec_for_device(spec, device)
        head = [op for op in build_anatomy(run_spec, batch=mb0, seq_len=seq).ops
                if op.name in ("logits_cast", "logits_softcap", "cross_entropy")]
        # as the held-out step runs the model (head included): compiled or eager
        (fwd_s, both_s), compiled = compiled_or_eager(
            lambda c: bench.bench_loss_head_s(device, rows=mb0 * seq, vocab=spec.architecture.vocab_size,
                                              softcap=spec.architecture.logit_softcap, dtype="fp32",
                                              quick=req.quick, compiled=c),
            program.model, "elementwise ops: timed eager, torch.compile of the loss head failed", note)
        fwd_bytes, bwd_bytes = sum(op.bytes_fwd for op in head), sum(op.bytes_bwd for op in head)
        rec.set("pointwise_tbyte_per_s", sig((fwd_bytes + bwd_bytes) / both_s / 1e12))
        if 0 < fwd_s < both_s:  # forward and backward apart (a noisy difference that is not positive: one rate)
            rec.set("pointwise_fwd_tbyte_per_s", sig(fwd_bytes / fwd_s / 1e12))
            rec.set("pointwise_bwd_tbyte_per_s", sig(bwd_bytes / (both_s - fwd_s) / 1e12))
        rec.set("pointwise_compiled", compiled)

    def optimizer() -> None:  # AdamW's kernel as the held-out step runs it: compiled or eager
        from ddplan.anatomy import adamw_bytes

        n = spec.architecture.vocab_size * spec.architecture.d_model  # an embedding-sized tensor
        t, _ = compiled_or_eager(lambda c: bench.bench_adamw_s(device, numel=n, dtype="fp32", quick=req.quick,
                                                               compiled=c),
                                 program.optimizer, "optimizer: timed eager, torch.compile of the AdamW kernel failed",
                                 note)
        rec.set("optimizer_tbyte_per_s", sig(adamw_bytes(n, 4, 4, 4) / t / 1e12))
        points = time_muon(spec, device, req.quick, program.optimizer, note)
        if points:
            rec.append("muon", points)

    def overhead() -> None:
        rec.set("kernel_overhead_us", sig(bench.bench_kernel_overhead_us(device)))

    def collectives() -> None:
        if req.nproc < 2:
            rec.data.setdefault("failures", []).append(
                "collectives: skipped, one device (use --nproc N on a box with N GPUs, or run "
                "`torchrun --nproc_per_node N -m ddplan.calibrate.collectives --out FILE`)")
            rec.flush()
            return
        from ddplan.calibrate import collectives as coll

        sizes = coll.default_sizes(req.quick)
        if device == "cpu":
            sizes = coll.cap_sizes(sizes, 16 * 2**20)
        with tempfile.TemporaryDirectory() as tmp:
            points = coll.launch(req.nproc, sizes_bytes=sizes, quick=req.quick, out_path=Path(tmp) / "c.json",
                                 device=device)
        kept = coll.to_collective_points(points)  # emulated points (gloo's reduce-scatter) are left out
        rec.append("collectives", [p.model_dump() for p in kept])
        if len(kept) < len(points):
            rec.data.setdefault("failures", []).append(
                f"collectives: {len(points) - len(kept)} emulated point(s) left out (gloo has no real reduce-scatter)")
            rec.flush()

    held_out: dict = {}

    def train_step() -> None:
        if shapes.skip_step:
            held_out["skipped"] = "does not fit"
            return
        attention_name = (hw.default_attention if hw else "sdpa-fused")
        done = eta.done_fractions(step_parts_s(spec, shapes, req.quick, compile_estimate_s(spec, program)))
        res = bench.bench_train_step(spec, batch=mb0, seq_len=seq, attention=_ref_attention(attention_name),
                                     device=device, dtype_policy=dtype_policy, steps=step_count(req.quick),
                                     warmup=STEP_WARMUP, compile_model=program.model,
                                     compile_optimizer=program.optimizer, between=lambda: probe("step"),
                                     after_step=lambda i: within(done[min(i, len(done) - 1)]))
        held_out.update(res, attention=attention_name, batch=mb0, seq_len=seq)
        if "skipped" in res:
            note(f"training step: {res['skipped']}")
            return
        ran = StepProgram(model=res["compiled"], optimizer=res["compiled_optimizer"])
        for text in res["compile_notes"]:  # a compilation that failed: the step ran eager, said
            note(f"training step: {text}")
        rec.set("step_program", {"compiled_model": ran.model, "compiled_optimizer": ran.optimizer,
                                 "first_step_s": sig(res["first_step_s"]) if res["first_step_s"] else None,
                                 "asked": program.words(),
                                 **({"page_faults_per_step": res.get("page_faults")} if device == "cpu" else {})})
        rec.append("step_times", [{
            "model": spec.name, "gpus": 1, "step_time_s": sig(res["step_time_s"]), "device_batch_size": mb0,
            "total_batch_tokens": mb0 * seq, "attention": attention_name,
            "window_pattern": spec.architecture.window_pattern, "seq_len": seq, "compiled": ran.model,
            "peak_memory_gb": sig(res["peak_memory_bytes"] / 1e9) if res.get("peak_memory_bytes") else None,
            "source": f"ddplan calibrate: reference model, one micro-batch, {ran.words()}, "
                      f"{prov.get('device_name')}"}])
        section = step_memory(res, shapes.activation_bytes, mb0, seq)
        if section is None:
            note(MEMORY_ON_GPU_ONLY)
        else:
            rec.set("memory", section)

    fns = (gemms, peak, attention, hbm, pointwise, optimizer, overhead, collectives, train_step, gemms_again)
    done: list[str] = []

    def on_signal(signum, frame):
        raise Interrupted(signal.Signals(signum).name)

    previous = {sig_: signal.getsignal(sig_) for sig_ in (signal.SIGTERM, signal.SIGINT)} \
        if threading.current_thread() is threading.main_thread() else {}
    for sig_ in previous:
        signal.signal(sig_, on_signal)
    try:
        with reuse_freed_memory(device == "cpu" and cpu_malloc(req) == "reuse",
                                "--cpu-malloc system" if req.cpu_malloc else "the --quick default") as how:
            if device == "cpu":  # recorded whether or not the held-out step runs
                rec.data["provenance"]["host_memory"] = how
                rec.flush()
            for name, fn in zip(stages_for(req.quick), fns):
                stage(name, fn)
                done.append(name)
    except (Interrupted, KeyboardInterrupt) as e:
        missing = [n for n in stages_for(req.quick) if n not in done]
        rec.data.setdefault("failures", []).append(
            f"interrupted ({e or 'SIGINT'}) during {missing[0]}: not measured: {', '.join(missing)}")
        rec.flush()
        if hw is None and device == "cpu":  # a partial CPU file stays usable: it carries its spec
            _hardware_for(CalibrationSpec.model_validate(rec.data), device, hw_name, prov, rec)
        raise
    finally:
        for sig_, handler in previous.items():
            signal.signal(sig_, handler)
    if probes["benchmarks"] and probes["step"]:
        rec.set("machine_speed", {"probe": bench.probe_words(device, gemm_dtype),
                                  "benchmarks_s": sig(statistics.median(probes["benchmarks"])),
                                  "step_s": sig(statistics.median(probes["step"])),
                                  "benchmark_probes": len(probes["benchmarks"]), "step_probes": len(probes["step"])})
    cal = CalibrationSpec.model_validate(rec.data)
    hw = hw or _hardware_for(cal, device, hw_name, prov, rec)
    for row in check_step(spec, hw, CalibrationSpec.model_validate(rec.data), held_out, device):
        if row["term"] == "step":
            rec.set("held_out_error_pct", sig(row["after_error_pct"], 3))
            if "same_speed_error_pct" in row:
                rec.set("held_out_error_same_speed_pct", sig(row["same_speed_error_pct"], 3))
    return CalibrationSpec.model_validate(rec.data), hw, held_out


def time_muon(spec: ModelSpec, device: str, quick: bool, compiled: bool, note: Callable[[str], None]) -> list[dict]:
    """One timed Muon step per shape stack of the model's Muon groups (none for an AdamW model), compiled as
    the held-out step's optimizer runs (eager, said, where that compilation fails)."""
    from collections import Counter

    from ddplan.anatomy import muon_matrices
    from ddplan.calibrate import bench
    from ddplan.params import param_counts

    opt, counts, points = spec.recipe.optimizer, param_counts(spec.architecture), []
    for g in (g for g, algo in opt.algorithm.items() if algo == "muon" and counts[g]):
        dtype = "fp32" if device == "cpu" else spec.dtypes.params[g]
        for (rows, cols), count in sorted(Counter(muon_matrices(spec, g)).items()):
            kw = dict(rows=rows, cols=cols, count=count, dtype=dtype, quick=quick, ns_steps=opt.muon_ns_steps)
            t, ran_compiled = compiled_or_eager(lambda c: bench.bench_muon_s(device, **kw, compiled=c), compiled,
                                                f"optimizer: Muon {rows}x{cols} timed eager, torch.compile failed",
                                                note)
            points.append({"rows": rows, "cols": cols, "count": count, "seconds": sig(t), "compiled": ran_compiled})
    return points


def compiled_or_eager(measure: Callable[[bool], object], compiled: bool, failed: str,
                      note: Callable[[str], None]) -> tuple[object, bool]:
    """(measure(compiled), whether it ran compiled): a benchmark timed as the held-out step runs its part;
    where torch.compile fails, timed eager and the reason noted ("<failed>: <why>")."""
    from ddplan.calibrate import bench

    try:
        return measure(compiled), compiled
    except Exception as e:
        if not compiled:
            raise
        note(f"{failed}: {bench.compile_failure(e)}")
        return measure(False), False


def _hardware_for(cal: CalibrationSpec, device: str, hw_name: str, prov: dict, rec: Recorder) -> HardwareSpec:
    """The hardware spec a calibration refines when none was given: on CPU, one built from the
    measurements (and carried in the file); on a GPU, the built-in its device name points to."""
    if device == "cpu":  # the file carries the CPU's spec, so `table --calibration FILE` needs nothing else
        best = max([cal.peak_gemm_tflops or 0.0, *(p.tflops for p in cal.gemm)]) or 0.1
        hw = cpu_hardware(best, cal.hbm_tbyte_per_s or 0.01, cal.kernel_overhead_us or 10.0,
                          f"measured {dt.date.today()} {prov.get('device_name')}", prov)
        rec.set("hardware_spec", hw.model_dump(mode="json", exclude_none=True))
        return hw
    from ddplan.registry import load_hardware

    return load_hardware(hw_name)


def _native(hw: HardwareSpec | None, impl: str) -> bool:
    if hw is None:
        return False
    try:
        return hw.attention_impl(impl).windows == "native"
    except KeyError:
        return False


def _ref_attention(name: str) -> str:
    """The reference model's attention for a hardware implementation name (flash packages -> fused SDPA)."""
    return "sdpa-math" if name == "sdpa-math" else "sdpa-fused"


# --------------------------------------------------------------------------------------------
# Closing the loop


def check_step(spec: ModelSpec, hw: HardwareSpec, cal: CalibrationSpec, held_out: dict,
               device: str) -> list[dict]:
    """The held-out step, measured vs predicted before and after calibration, per term.

    Priced in the compile mode the step ran in (held_out["compiled"]: what torch.compile saves and fuses,
    ddplan.anatomy and ddplan.roofline), so a compiled step is compared with a compiled prediction.
    Before: the hardware spec's assumptions. After: the calibration's micro-benchmarks (GEMMs at the
    model's shapes, attention, HBM, launch overhead) with the step time itself left out of the fit.
    Both are ddplan.price.Pricer's step, the one every planning command uses. Where the calibration timed
    the machine-speed probe (cal.machine_speed), "same speed" is the after prediction times how much slower
    the probe ran during the step than during the benchmarks: a diagnostic of the machine's drift as that
    one kernel sees it (on this project's VM it did not shrink the error: README, Calibrate)."""
    from ddplan.layout import NATIVE_ZERO, Layout
    from ddplan.price import Pricer, RunPlan
    from ddplan.specs import run_variant

    if not held_out or "skipped" in held_out:
        return []
    run_spec = run_variant(spec_for_device(spec, device), seq_len=held_out["seq_len"])
    impl = hw.attention_impl(held_out["attention"])
    layout = Layout(dp=1, zero=NATIVE_ZERO[spec.recipe.distribution], micro_batch=held_out["batch"],
                    grad_accum=1, attention=impl.name, compiled=bool(held_out.get("compiled")))
    plan = RunPlan(run_spec.recipe.budget, hw.price)
    after_cal = cal.model_copy(update={"step_times": []})  # held out
    window = run_spec.architecture.window_pattern
    before = Pricer(run_spec, hw, plan).step(layout, window)
    after = Pricer(run_spec, hw, plan, after_cal).step(layout, window)
    speed = cal.machine_speed.step_vs_benchmarks if cal.machine_speed is not None else None
    rows = []
    for term, key, pick in (("forward", "fwd_s", lambda st: st.fwd_s), ("backward", "bwd_s", lambda st: st.bwd_s),
                            ("optimizer", "optimizer_s", lambda st: st.optimizer_s),
                            ("step", "step_time_s", lambda st: st.total_s)):
        measured = held_out.get(key)
        if not measured:
            continue
        b, a = pick(before), pick(after)
        row = {"term": term, "measured_s": measured, "before_s": b,
               "before_error_pct": 100 * (b - measured) / measured, "after_s": a,
               "after_error_pct": 100 * (a - measured) / measured}
        if speed is not None:  # the benchmarks' prediction at the speed the machine ran the step at
            row.update(same_speed_s=a * speed, same_speed_error_pct=100 * (a * speed - measured) / measured)
        rows.append(row)
    return rows


def spec_for_device(spec: ModelSpec, device: str) -> ModelSpec:
    """The model as it runs in the benchmark: on CPU everything is fp32 (dtype_policy='fp32'), as
    `--dtype fp32` asks the planning commands for it (ddplan.specs.run_variant)."""
    from ddplan.specs import run_variant

    return spec if device != "cpu" else run_variant(spec, dtype="fp32")
