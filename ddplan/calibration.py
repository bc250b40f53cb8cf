"""The calibration file: measurements that replace a hardware spec's assumptions.

One format for both a measurement a user states (`--measured-step-time`, or a file written by hand)
and `ddplan calibrate`'s output. YAML, `kind: calibration`, `version: 1`:

    kind: calibration
    version: 1
    hardware: mi300x                  # the hardware spec these measurements refine
    provenance: {device_name: ..., device_count: 1, torch: ..., hip: ..., date: 2026-06-01, ...}
    hbm_tbyte_per_s: 4.1              # measured copy bandwidth (read + write), optional
    gemm: [{m: 65536, n: 1536, k: 1536, dtype: bf16, tflops: 480.0}, ...]
    attention: [{implementation: sdpa-fused, batch: 32, heads: 12, seq_len: 2048, window: 2048,
                 head_dim: 128, fwd_tflops: 250.0, bwd_tflops: 70.0}, ...]
    collectives: [{collective: all_reduce, group_size: 8, size_bytes: 1e9, time_s: 0.0056}, ...]
    step_times: [{model: nanochat-d24, gpus: 1, step_time_s: 7.7, device_batch_size: 32,
                  total_batch_tokens: 524288, attention: sdpa-fused, window_pattern: L,
                  source: "stated by the user (seed note)"}]
    step_program: {compiled_model: true, compiled_optimizer: true, first_step_s: 41.0,
                   asked: "compiled model, compiled optimizer",    # how calibrate's held-out step ran
                   page_faults_per_step: 0}                           # CPU only
    memory: {framework_gib: 0.61, allocator_fraction: 0.07,           # replace ddplan.memory.MemoryAssumptions
             measured: {allocated_gb: 41.2, reserved_gb: 44.0, ...}}  # at the held-out step (GPU only)
    held_out_error_pct: -4.1          # the held-out step, predicted from the benchmarks vs measured
    machine_speed: {probe: "fp32 512x512x512 GEMM, median of 5", benchmarks_s: 0.0021, step_s: 0.0023,
                    benchmark_probes: 31, step_probes: 7}    # the same kernel timed through the run
    held_out_error_same_speed_pct: 5.0   # that error with the prediction at the step's speed
    failures: ["collectives: torch.distributed not initialised", ...]

Attention TFLOP/s follow the hardware specs' convention (causal FLOPs of the processed window;
see ddplan.roofline). How the planner uses each figure: `calibrated_rates` below, ddplan.roofline and ddplan.comm.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import replace
from typing import TYPE_CHECKING, Callable, Literal

from pydantic import Field

from ddplan.errors import SpecError
from ddplan.memory import MemoryAssumptions
from ddplan.runfields import SCHEDULES
from ddplan.specs import Strict
from ddplan.units import GiB

if TYPE_CHECKING:
    from ddplan.comm import CommPoints
    from ddplan.roofline import Rates

Knob = Literal["gemm", "attention", "compute"]
KNOBS: tuple[str, ...] = ("gemm", "attention", "compute")


class Provenance(Strict):
    device_name: str
    device_count: int = Field(ge=1, le=10**6)
    backend: Literal["cuda", "rocm", "cpu"]
    torch: str
    cuda: str | None = None
    hip: str | None = None
    driver: str | None = None
    tunableop: str | None = None  # PYTORCH_TUNABLEOP_ENABLED on ROCm
    date: _dt.datetime | _dt.date
    host: str | None = None
    host_memory: str | None = None  # CPU calibrations: how malloc handled freed memory (ddplan.calibrate.allocator)


class GemmPoint(Strict):
    m: int = Field(gt=0, le=10**9)
    n: int = Field(gt=0, le=10**9)
    k: int = Field(gt=0, le=10**9)
    dtype: Literal["bf16", "fp16", "fp8", "fp32", "tf32"] = "bf16"
    tflops: float = Field(gt=0, le=1e5)
    # percent: the timings' interquartile range / median, or the passes' range / mean where larger
    spread_pct: float | None = Field(default=None, ge=0, le=1e9)
    label: str | None = None  # which Linear of the model (e.g. "c_fc fwd")


class AttentionPoint(Strict):
    implementation: str
    batch: int = Field(gt=0, le=10**6)
    heads: int = Field(gt=0, le=10**5)
    seq_len: int = Field(gt=0, le=10**8)
    window: int = Field(gt=0, le=10**8)
    head_dim: int = Field(gt=0, le=10**4)
    fwd_tflops: float = Field(gt=0, le=1e5)
    bwd_tflops: float = Field(gt=0, le=1e5)


class CollectivePoint(Strict):
    collective: Literal["all_reduce", "reduce_scatter", "all_gather"]
    group_size: int = Field(ge=2, le=10**6)
    size_bytes: float = Field(gt=0, le=1e15)
    time_s: float = Field(gt=0, le=1e6)
    tier: Literal["intra_node", "inter_node"] = "intra_node"


class StepMeasurement(Strict):
    """One measured training step and the layout it ran with."""

    model: str
    gpus: int = Field(ge=1, le=10**6)  # total GPUs of the run: dp x tp x pp
    step_time_s: float = Field(gt=0, le=1e6)
    device_batch_size: int = Field(gt=0, le=65536)  # sequences per GPU per micro-batch
    total_batch_tokens: int = Field(gt=0, le=10**12)
    tp: int = Field(default=1, ge=1, le=1024)
    pp: int = Field(default=1, ge=1, le=1024)
    pp_virtual_stages: int = Field(default=1, ge=1, le=64)  # interleaved chunks per pipeline stage
    # the pipeline schedule (ddplan.runfields.SCHEDULES); None: 1F1B, interleaved with more than one chunk
    pp_schedule: Literal[SCHEDULES] | None = None
    zero: Literal[0, 1, 2, 3] | None = None  # None: the model's native data-parallel setup
    attention: str
    window_pattern: str | None = Field(default=None, pattern=r"^[SL]+$")
    seq_len: int | None = Field(default=None, gt=0, le=10**8)
    compiled: bool = True
    recompute: Literal["none", "selective", "full"] = "none"
    peak_memory_gb: float | None = Field(default=None, gt=0, le=1e6)
    # what the peak counts (ddplan.memory.NOT_COUNTED): calibrate writes torch.cuda.max_memory_allocated; a
    # device tool's reading (nvidia-smi, rocm-smi) is "device"
    peak_memory_kind: Literal["allocated", "reserved", "device"] = "allocated"
    source: str = Field(min_length=3)


class MuonPoint(Strict):
    """One Muon step over `count` same-shape matrices, timed as the held-out step runs it."""

    rows: int = Field(gt=0, le=10**7)
    cols: int = Field(gt=0, le=10**7)
    count: int = Field(gt=0, le=10**6)
    seconds: float = Field(gt=0, le=1e5)
    # timed torch.compile'd (as nanochat's optimizer runs) or eager (--quick, or a failed compile); a plan
    # uses the points either way, as it uses the AdamW rate: the held-out step says which mode it checked
    compiled: bool = False


class StepProgram(Strict):
    """How `ddplan calibrate`'s held-out step ran: the model torch.compile'd or eager, the optimizer's update
    kernels compiled or eager (the AdamW benchmark times the same kernel), and what was asked for."""

    compiled_model: bool
    compiled_optimizer: bool
    first_step_s: float | None = Field(default=None, gt=0, le=1e6)  # first warm-up step, compilation included; not timed
    asked: str = Field(min_length=3)  # e.g. "compiled model, compiled optimizer" (the model's program; eager if --quick)
    # on CPU: the median timed step's minor page faults (how malloc ran: provenance.host_memory)
    page_faults_per_step: float | None = Field(default=None, ge=0)


class MachineSpeed(Strict):
    """A fixed probe kernel (ddplan.calibrate.bench.bench_probe_s) timed between the benchmarks and between
    the held-out step's timed steps: how fast the machine ran while each was measured. On a shared machine
    the two differ (this project's 2-core VM: the probe moved -7% to +15% between them in round 9, docs/reference.md), and the held-out step's error then
    holds the difference as well as the model's."""

    probe: str = Field(min_length=3)  # e.g. "fp32 512x512x512 GEMM, median of 5"
    benchmarks_s: float = Field(gt=0, le=1e4)  # the probe's median over the benchmarks (GEMM passes, stage starts)
    step_s: float = Field(gt=0, le=1e4)  # its median between the held-out step's timed steps
    benchmark_probes: int = Field(gt=0)
    step_probes: int = Field(gt=0)

    @property
    def step_vs_benchmarks(self) -> float:
        """How much slower (> 1) or faster the machine ran during the step than during the benchmarks."""
        return self.step_s / self.benchmarks_s


class MemoryMeasured(Strict):
    """What `ddplan calibrate` read off torch's allocator at its held-out step (GB = 1e9 bytes)."""

    allocated_gb: float = Field(gt=0, le=1e6)  # torch.cuda.max_memory_allocated over the step
    reserved_gb: float = Field(gt=0, le=1e6)  # torch.cuda.max_memory_reserved over the step
    # ddplan's predicted activations for that step, saved + backward's transient: the reserve's denominator
    predicted_activations_gb: float = Field(gt=0, le=1e6)
    # (total - free) by torch.cuda.mem_get_info less torch.cuda.memory_reserved, after the step: device-wide, so a
    # second process on the same GPU is counted too
    outside_allocator_gb: float = Field(ge=0, le=1e6)
    batch: int = Field(gt=0, le=65536)  # the step's micro-batch
    seq_len: int = Field(gt=0, le=10**8)


class MemorySection(Strict):
    """The memory terms outside ddplan's tensor counts (ddplan.memory.MemoryAssumptions), measured by `ddplan
    calibrate` on this GPU or stated by hand; a term left out keeps its assumed default."""

    framework_gib: float | None = Field(default=None, ge=0, le=1e4)  # context, kernels, library handles per process
    allocator_fraction: float | None = Field(default=None, ge=0, le=1e3)  # reserved - allocated, of the activations
    comm_gib: float | None = Field(default=None, ge=0, le=1e4)  # NCCL/RCCL's own buffers with more than one GPU
    bucket_mb: float | None = Field(default=None, gt=0, le=1e6)  # a ZeRO-1 reduce bucket
    measured: MemoryMeasured | None = None  # how calibrate got the first two (absent when stated by hand)


class CalibrationSpec(Strict):
    kind: Literal["calibration"]
    version: Literal[1] = 1
    hardware: str
    # the hardware spec itself when it is not a built-in (on CPU: the one built from these measurements),
    # so that `ddplan table --calibration FILE` needs no other flag
    hardware_spec: dict | None = None
    seq_len: int | None = Field(default=None, gt=0, le=10**8)  # the shapes measured: planning defaults to them
    dtype: Literal["bf16", "fp16", "fp32", "fp8"] | None = None
    provenance: Provenance | None = None
    hbm_tbyte_per_s: float | None = Field(default=None, gt=0, le=1e3)
    kernel_overhead_us: float | None = Field(default=None, gt=0, le=1e6)  # time of an empty-ish kernel launch
    pointwise_tbyte_per_s: float | None = Field(default=None, gt=0, le=1e3)  # elementwise chain at the model's logits
    # the same chain's forward and backward apart (each direction's anatomy bytes over its time); absent: the
    # rate above for both
    pointwise_fwd_tbyte_per_s: float | None = Field(default=None, gt=0, le=1e3)
    pointwise_bwd_tbyte_per_s: float | None = Field(default=None, gt=0, le=1e3)
    pointwise_compiled: bool = False  # that chain timed torch.compile'd (as a compiled step runs it), not eager
    optimizer_tbyte_per_s: float | None = Field(default=None, gt=0, le=1e3)  # AdamW step, bytes as ddplan.anatomy.adamw_bytes
    peak_gemm_tflops: float | None = Field(default=None, gt=0, le=1e5)  # best of a short bf16 GEMM sweep
    gemm: list[GemmPoint] = []
    attention: list[AttentionPoint] = []
    collectives: list[CollectivePoint] = []
    muon: list[MuonPoint] = []  # Muon steps per shape group (replace the GEMM-by-GEMM estimate of the same shape)
    step_times: list[StepMeasurement] = []
    step_program: StepProgram | None = None  # how the held-out step (the step_times entry calibrate wrote) ran
    # the held-out step's error after calibration (predicted from the micro-benchmarks / measured - 1, %):
    # the model error that remains on this machine, which widens every calibrated band (ddplan.price)
    held_out_error_pct: float | None = Field(default=None, ge=-100, le=1e4)
    machine_speed: MachineSpeed | None = None
    # the same error with the prediction moved to the machine's speed during the step (x step_vs_benchmarks):
    # a diagnostic of how much of the error is the machine's drift as the probe sees it (on this project's VM
    # it was no smaller than the error as measured: docs/reference.md, Calibrate); bands use the one above
    held_out_error_same_speed_pct: float | None = Field(default=None, ge=-100, le=1e4)
    memory: MemorySection | None = None  # replaces ddplan.memory.MemoryAssumptions' defaults (memory_assumptions)
    failures: list[str] = []


# A measured rate is at most the device's datasheet peak (timing noise and significant figures: PEAK_SLACK) and
# at least MIN_PEAK_FRACTION of it: ten billion times slower than the peak is not a kernel that ran, it is a
# broken timer, a unit slip or a hand edit, and priced it gives 10^14-hour runs (1e-12 TFLOP/s on an MI300X,
# the fuzz's case, is 8e-16 of its peak). The floor sits far below any real point: a GPU's smallest calibrate
# shapes (the 64 x 1 x 24 gates, ~3 kFLOP in a ~10 us launch) run near 2e-7 of an H100's peak, and a CPU timed
# against a GPU's spec (`calibrate --device cpu --hardware mi300x`, as the tests do) near 3e-9.
PEAK_SLACK = 1.02
MIN_PEAK_FRACTION = 1e-10


def check_against_hardware(cal: CalibrationSpec, hw, source: str) -> None:
    """Refuse a calibration whose figures the hardware it is used with cannot produce: a GEMM, attention or
    peak-sweep rate above the device's dense peak for its dtype (x PEAK_SLACK) or below MIN_PEAK_FRACTION of
    it, HBM copy bandwidth above the datasheet's (x PEAK_SLACK), a measured peak memory above the device's.
    One SpecError naming the file and the entry (e.g. `gemm[3].tflops`). The held-out step's own bound (no
    step faster than its FLOPs at peak) is ddplan.fitting.check_physical, where the step is priced."""
    def peak_tflops(dtype: str) -> float | None:
        try:
            return hw.peak.flops_per_s(dtype) / 1e12
        except (KeyError, ValueError):  # a dtype the device has no peak for: nothing to check against
            return None

    def rate(field: str, value: float | None, dtype: str) -> None:
        peak = peak_tflops(dtype)
        if value is None or peak is None:
            return
        if value > PEAK_SLACK * peak:
            raise SpecError(f"{value:g} TFLOP/s is above {hw.name}'s dense {dtype} peak of {peak:g} TFLOP/s: no kernel "
                            f"runs faster than its device's peak (check the unit, TFLOP/s, and the hardware)",
                            file=source, field=field)
        if value < MIN_PEAK_FRACTION * peak:
            raise SpecError(f"{value:g} TFLOP/s is below {MIN_PEAK_FRACTION:g} of {hw.name}'s {peak:g} TFLOP/s peak: "
                            f"not a kernel that ran (a broken timer or a unit slip); measure it again or remove it",
                            file=source, field=field)

    for i, p in enumerate(cal.gemm):
        rate(f"gemm[{i}].tflops", p.tflops, p.dtype)
    dtype = cal.dtype or "bf16"
    rate("peak_gemm_tflops", cal.peak_gemm_tflops, dtype)
    for i, a in enumerate(cal.attention):
        rate(f"attention[{i}].fwd_tflops", a.fwd_tflops, dtype)
        rate(f"attention[{i}].bwd_tflops", a.bwd_tflops, dtype)
    datasheet = hw.memory.hbm_tbyte_per_s.value
    if cal.hbm_tbyte_per_s is not None and cal.hbm_tbyte_per_s > PEAK_SLACK * datasheet:
        raise SpecError(f"{cal.hbm_tbyte_per_s:g} TB/s is above {hw.name}'s {datasheet:g} TB/s datasheet bandwidth",
                        file=source, field="hbm_tbyte_per_s")
    usable_gb = hw.memory.usable_bytes / 1e9
    outside = cal.memory.framework_gib if cal.memory is not None else None
    if outside is not None and outside * GiB / 1e9 >= usable_gb:
        raise SpecError(f"{outside:g} GiB outside the allocator leaves nothing of {hw.name}'s "
                        f"{usable_gb:.4g} GB usable", file=source, field="memory.framework_gib")
    for i, m in enumerate(cal.step_times):
        if m.peak_memory_gb is not None and m.peak_memory_gb > usable_gb:
            raise SpecError(f"{m.peak_memory_gb:g} GB is more than {hw.name} holds ({usable_gb:.4g} GB usable)",
                            file=source, field=f"step_times[{i}].peak_memory_gb")


def allocator_fraction(allocated_bytes: float, reserved_bytes: float, activation_bytes: float) -> float:
    """The caching allocator's reserve beyond what is allocated, as a fraction of the activations (the form of
    ddplan.memory.MemoryAssumptions.allocator_fraction, which memory_per_gpu multiplies by the predicted saved +
    transient bytes): (max_memory_reserved - max_memory_allocated) / predicted activations, so the step that
    measured it is predicted its reserved peak exactly. e.g. allocated 30 GB, reserved 33 GB, activations 20 GB:
    0.15. The reserve grows with what is allocated and freed each step (activations), not with the model states
    allocated once (PyTorch docs, torch_cuda_memory.rst: blocks are cached per size and segment)."""
    if activation_bytes <= 0 or allocated_bytes <= 0:
        raise ValueError(f"need positive allocated and activation bytes, got {allocated_bytes}, {activation_bytes}")
    if reserved_bytes < allocated_bytes:
        raise ValueError(f"reserved ({reserved_bytes:g}) below allocated ({allocated_bytes:g}): not torch's figures")
    return (reserved_bytes - allocated_bytes) / activation_bytes


def memory_section(allocated_bytes: float, reserved_bytes: float, activation_bytes: float,
                   outside_allocator_bytes: float, batch: int, seq_len: int) -> dict:
    """The calibration's `memory:` section from the held-out step's allocator figures (bytes): framework_gib is
    what lives outside the allocator (the process's context, kernels and library handles: ddplan.memory's
    `framework` term for one GPU), allocator_fraction by allocator_fraction()."""
    return {"framework_gib": outside_allocator_bytes / GiB,
            "allocator_fraction": allocator_fraction(allocated_bytes, reserved_bytes, activation_bytes),
            "measured": {"allocated_gb": allocated_bytes / 1e9, "reserved_gb": reserved_bytes / 1e9,
                         "predicted_activations_gb": activation_bytes / 1e9,
                         "outside_allocator_gb": outside_allocator_bytes / 1e9, "batch": batch, "seq_len": seq_len}}


def memory_assumptions(calibration: CalibrationSpec | None) -> MemoryAssumptions:
    """The memory terms outside the tensor counts: the calibration's `memory:` section where it states them, the
    assumed defaults (ddplan.memory.MemoryAssumptions) for the rest."""
    if calibration is None or calibration.memory is None:
        return MemoryAssumptions()
    given = calibration.memory.model_dump(exclude={"measured"}, exclude_none=True)
    return MemoryAssumptions(**given)


def steps_for_model(calibration: CalibrationSpec, names: set[str]) -> list[StepMeasurement]:
    """The measured steps of a model, by any of its names (spec name or alias), in file order."""
    return [m for m in calibration.step_times if m.model in names]


def measurement_for(calibration: CalibrationSpec | None, spec) -> StepMeasurement | None:
    """The first measured step of this model (by name or alias) in a calibration file, if any."""
    if calibration is None:
        return None
    found = steps_for_model(calibration, {spec.name, *spec.aliases})
    return found[0] if found else None


def fit_factor(predict_s: Callable[[float], float], measured_s: float, lo: float = 1e-3, hi: float = 1e3,
               rel_tol: float = 1e-6) -> float:
    """The efficiency multiplier f with predict_s(f) = measured_s, by bisection in log space.

    predict_s must decrease as f grows (a faster kernel, a shorter step). Raises ValueError when the
    measurement lies outside [predict_s(hi), predict_s(lo)]: no multiplier in range explains it.
    """
    if measured_s <= 0:
        raise ValueError(f"measured time must be positive, got {measured_s}")
    slow, fast = predict_s(lo), predict_s(hi)
    if not fast <= measured_s <= slow:
        raise ValueError(f"measured {measured_s:.4g} s is outside what any multiplier in [{lo}, {hi}] gives "
                         f"({fast:.4g}..{slow:.4g} s): another term must be wrong")
    a, b = lo, hi
    for _ in range(200):
        mid = (a * b) ** 0.5
        if predict_s(mid) > measured_s:
            a = mid
        else:
            b = mid
        if b / a - 1 < rel_tol:
            break
    return (a * b) ** 0.5


def calibrated_rates(r: Rates, attention: str, calibration: CalibrationSpec | None) -> Rates:
    """Rates with every measured figure in a calibration file replacing its assumption.

    GEMMs: each op takes the efficiency of the nearest measured shape (log distance over m, n, k);
    attention: the nearest measured (batch x heads, seq, window, head_dim) of the same implementation;
    HBM: the measured copy bandwidth; kernel overhead: the measured launch time. A measured figure has
    no range: in every scenario it is the same.
    """
    if calibration is None:
        return r
    if calibration.hbm_tbyte_per_s:
        r = replace(r, hbm=calibration.hbm_tbyte_per_s * 1e12 / r.hbm_bytes_per_s)
    if calibration.kernel_overhead_us:  # an empty kernel's launch: not a GEMM call (the fitted call cost stays)
        r = replace(r, kernel_overhead_s=calibration.kernel_overhead_us * 1e-6)
    if calibration.pointwise_tbyte_per_s:
        both = calibration.pointwise_tbyte_per_s * 1e12
        r = replace(r, pointwise_bytes_per_s=both, pointwise_compiled=calibration.pointwise_compiled,
                    pointwise_fwd_bytes_per_s=(calibration.pointwise_fwd_tbyte_per_s or 0.0) * 1e12 or both,
                    pointwise_bwd_bytes_per_s=(calibration.pointwise_bwd_tbyte_per_s or 0.0) * 1e12 or both)
    if calibration.optimizer_tbyte_per_s:
        r = replace(r, optimizer_bytes_per_s=calibration.optimizer_tbyte_per_s * 1e12)
    if calibration.muon:
        r = replace(r, muon_points=tuple((p.rows, p.cols, p.count, p.seconds) for p in calibration.muon))
    gemm = [p for p in calibration.gemm if p.dtype in ("bf16", "fp16", "fp32")]
    if gemm:
        r = replace(r, gemm_points=tuple((p.m, p.n, p.k, p.tflops * 1e12 / r.peak_flops_per_s) for p in gemm))
    if calibration.peak_gemm_tflops:
        r = replace(r, gemm_best=calibration.peak_gemm_tflops * 1e12 / r.peak_flops_per_s)
    attn = [p for p in calibration.attention if p.implementation == attention]
    if attn:
        r = replace(r, attention_points=tuple(
            (p.batch * p.heads, p.seq_len, p.window, p.head_dim, p.fwd_tflops * 1e12 / r.peak_flops_per_s,
             p.bwd_tflops * 1e12 / r.peak_flops_per_s) for p in attn))
    return r


def comm_points(calibration: CalibrationSpec | None) -> CommPoints | None:
    """Measured collective times by (collective, group size, tier), for ddplan.comm.GroupTimer."""
    if calibration is None or not calibration.collectives:
        return None
    out: dict[tuple[str, int, str], list[tuple[float, float]]] = {}
    for p in calibration.collectives:
        out.setdefault((p.collective, p.group_size, p.tier), []).append((p.size_bytes, p.time_s))
    return {k: sorted(v) for k, v in out.items()}
