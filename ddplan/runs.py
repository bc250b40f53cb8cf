"""Published, measured training runs: the schema of a runs file, loading it, and the model spec a run ran.

A runs file (YAML, `kind: runs`) lists training runs someone measured and published, one entry each:
where it comes from (the source, for leave-one-source-out checks), the model (a built-in whose block it
shares, with the shapes that differ), the hardware (a ddplan hardware name), the layout as it ran, the
precision, what was measured (step time or tokens per second), and the source's own MFU convention
(FLOPs per token and peak) so that ddplan's prediction can be stated in it. Anything the source does
not state and the entry had to assume is listed under `assumed`, so a reader can see what rests on it.

The shipped dataset is validation/published_runs.yaml (ddplan/_specs/validation in the wheel);
`ddplan validate --dataset FILE` reads a user's own. ddplan.replay prices a run through
ddplan.table.build_table, the same path as `ddplan table`: a validation row and a table row of the same
layout are one number.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, create_model, model_validator

from ddplan.errors import DdplanError, SpecError
from ddplan.flops import nanochat_flops_per_token
from ddplan.registry import builtin_dir, load_hardware, load_model
from ddplan.runconfig import annotation
from ddplan.runfields import OPTION_FIELDS, SCHEDULES, recompute_policy
from ddplan.specfile import MAX_DATASET_BYTES, read_yaml, validate
from ddplan.specs import (Architecture, CrossEntropy, Fp8Recipe, Fp8WeightCasts, Fusions, Grads, ModelSpec, Moments, Strict,
                          present_param_groups, run_variant)

Precision = Literal["bf16", "fp16", "fp8"]
# a recompute policy in its one spelling: none, selective, per-op, full or selective:MODULE+MODULE (Megatron's)
Recompute = Annotated[str, AfterValidator(recompute_policy)]


class RunSource(Strict):
    """Where a run's figures come from. `name` groups runs of one origin (leave-one-source-out)."""

    name: str = Field(min_length=2, max_length=80)  # e.g. "llm-foundry", "korthikanti2022"
    ref: str = Field(min_length=3)  # repository (owner/name) or paper (arXiv id)
    where: str = Field(min_length=3)  # path and table, or section
    commit: str | None = None
    checked: str | None = None  # what the figures were checked against, when not read from `ref` itself


class RunModel(Strict):
    """The model: a built-in ddplan model whose block it shares, with the architecture fields that differ."""

    base: str = Field(min_length=1)
    name: str = Field(min_length=1)  # how the source calls it ("MPT-7B")
    architecture: dict[str, Any] = {}  # overrides of the base's architecture (validated as one)
    seq_len: int = Field(gt=0, le=10**8)
    params_reported: int | None = Field(default=None, gt=0, le=10**14)  # the source's count, checked
    # the dtype gradients are kept and reduced in, where the run states it: "param" (Megatron's
    # --grad-reduce-in-bf16 with bf16 params), "fp32" (main_grad in fp32), "compute" (reduced in the compute dtype,
    # kept in the parameter's: FSDP reduce_dtype bf16 over fp32 weights); None: the base spec's (ddplan.specs.Grads)
    grads: Grads | None = None
    # how the weights were kept, where the run states it: "master" (16-bit weights, an fp32 copy in the optimizer:
    # Megatron-LM's --bf16), "fp32" (fp32 weights cast each forward); None: the base spec's (ddplan.specs.run_variant)
    # "remainder": bf16 weights, the fp32 masters' low 16 bits (Megatron-Core's --use-precision-aware-optimizer)
    weights: Literal["fp32", "master", "remainder"] | None = None
    # AdamW's two moments' dtype, where the run states it (--exp-avg-dtype, --exp-avg-sq-dtype); None: the base spec's
    moments: Moments | None = None
    # mixture of experts, how its tokens were routed: "balanced" (forced, Megatron-Core
    # --moe-router-force-load-balancing: ddplan's moe.load_imbalance 1) or "dropless" (real routing: the base
    # spec's imbalance, ddplan.specs.DROPLESS_IMBALANCE unless it sets one); None: the base spec's
    routing: Literal["balanced", "dropless"] | None = None


class _RunDegrees(Strict):
    """The layout as it ran. gpus = dp x tp x pp x cp; global batch = dp x micro-batch x accumulation."""

    gpus: int = Field(gt=0, le=10**6)
    tp: int = Field(default=1, gt=0, le=1024)
    pp: int = Field(default=1, gt=0, le=1024)
    vp: int = Field(default=1, gt=0, le=1024)  # interleaved chunks per pipeline stage
    # the pipeline schedule (ddplan.runfields.SCHEDULES); None: 1F1B, interleaved when vp > 1
    schedule: Literal[SCHEDULES] | None = None
    cp: int = Field(default=1, gt=0, le=1024)  # context parallelism
    ep: int = Field(default=1, gt=0, le=4096)  # expert parallelism (mixture of experts): out of dp x cp
    etp: Literal[1] | None = None  # 1: experts whole (Megatron-Core --expert-tensor-parallel-size 1); None: tp
    # 3: FSDP FULL_SHARD; 2: SHARD_GRAD_OP; None: the model's own data-parallel setup (nanochat's sharded
    # optimizer, a Llama recipe's FSDP), as `ddplan table` without --zero
    zero: int | None = Field(default=None, ge=0, le=3)
    # None: not stated; priced at the fastest power-of-two micro-batch that fits in memory (fastest_fitting),
    # as a published throughput benchmark is tuned
    micro_batch: int | None = Field(default=None, gt=0, le=65536)
    global_batch_sequences: int = Field(gt=0, le=10**9)
    recompute: Recompute = "none"
    attention: str | None = None  # an implementation of the hardware spec (default: the spec's default)
    window: str | None = Field(default=None, pattern=r"^[SL]+$")  # window pattern (nanochat); default the model's
    compiled: bool = False

    @model_validator(mode="before")
    @classmethod
    def _all_of_dp(cls, data: Any) -> Any:
        """`shard_group: 0`, the runs format's spelling of "all of dp" before the field came from the run file's
        (whose range starts at 2), is read as left out: plain ZeRO-3."""
        if isinstance(data, dict) and data.get("shard_group") == 0:
            return {k: v for k, v in data.items() if k != "shard_group"}
        return data


# The framework options (ddplan.runfields.OPTION_FIELDS: sequence parallelism, the overlaps, hybrid sharding, fp8
# gathers, offload, the context-parallel exchange) are the run file's fields, generated from their one definition:
# the same name, type, range and help; None (not stated) is the run's framework profile's value, else the field's
# default (ddplan.replay.run_option_values), as a run file's field left out is.
RunLayout = create_model(
    "RunLayout", __base__=_RunDegrees, __doc__=_RunDegrees.__doc__,
    **{f.param: (annotation(f), Field(default=None, description=f.help)) for f in OPTION_FIELDS})


class Measured(Strict):
    """What the source measured: step time or tokens per second (all GPUs), and its MFU if it states one."""

    step_time_s: float | None = Field(default=None, gt=0, le=1e7)
    tokens_per_s: float | None = Field(default=None, gt=0, le=1e12)
    model_tflops_per_gpu: float | None = Field(default=None, gt=0, le=1e5)  # in the row's mfu_convention
    mfu_pct: float | None = Field(default=None, gt=0, le=100)

    @model_validator(mode="after")
    def _one(self) -> Measured:
        given = [k for k in ("step_time_s", "tokens_per_s", "model_tflops_per_gpu") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of step_time_s, tokens_per_s, model_tflops_per_gpu (what the source "
                             f"measured); got {', '.join(given) or 'none'}")
        return self


class MfuConvention(Strict):
    """The source's MFU: FLOPs per token (its formula, evaluated for this run) over its peak per GPU."""

    flops_per_token: float = Field(gt=0, le=1e16)
    peak_tflops: float = Field(gt=0, le=1e6)
    definition: str = Field(min_length=3)


class Network(Strict):
    """The run's nodes and inter-node network where they differ from the hardware spec's: NICs (both or neither),
    and the GPUs of a node as the job was placed (at most the spec's: e.g. 64 on GB200 NVL72 racks allocated in
    16-tray Slurm segments, MLPerf's SEGMENT=16; the spec's NICs a GPU kept unless stated), each unset one the
    spec's (ddplan.replay.run_hardware)."""

    nics_per_node: int | None = Field(default=None, gt=0, le=64)
    nic_gbit_per_s: float | None = Field(default=None, gt=0, le=10_000)
    gpus_per_node: int | None = Field(default=None, gt=0, le=1024)
    why: str = Field(min_length=3)  # the source's words

    @model_validator(mode="after")
    def _stated(self) -> Network:
        if (self.nics_per_node is None) != (self.nic_gbit_per_s is None):
            raise ValueError("state nics_per_node and nic_gbit_per_s together (or neither)")
        if self.nics_per_node is None and self.gpus_per_node is None:
            raise ValueError("states nothing: give nics_per_node and nic_gbit_per_s, or gpus_per_node")
        return self


class RunFacts(Strict):
    """What a published run and a measured peak share: where it comes from, the model, hardware, precision,
    stack and layout it ran, priced the same way (ddplan.replay.price_run), and what the entry had to assume."""

    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$", max_length=120)
    source: RunSource
    model: RunModel
    hardware: str = Field(min_length=1)
    precision: Precision
    # with precision fp8: how its casts ran (ddplan.fp8.FP8_RECIPES); None: the model spec's
    fp8_recipe: Fp8Recipe | None = None
    # the training stack (a frameworks/ profile's name where there is one: composer, megatron-core, nanochat;
    # else its own, e.g. megatron-deepspeed): validate's summaries group by it; the layout states the run whole
    framework: str | None = Field(default=None, min_length=2, max_length=40)
    # the loss kernel the run's config chose where it differs from its framework profile's (ddplan.specs
    # .CROSS_ENTROPY; e.g. an MLPerf NeMo config that keeps Megatron's native fused loss); None: the profile's, else
    # the model spec's
    cross_entropy: CrossEntropy | None = None
    # with precision fp8, how often the run's stack cast an fp8 GEMM's weight where it differs from its framework
    # profile's or it has none (ddplan.specs.FP8_WEIGHT_CASTS; e.g. Megatron-LM's legacy model passing Transformer
    # Engine is_first_microbatch: once a step); None: the profile's, else the model spec's
    fp8_weight_casts: Fp8WeightCasts | None = None
    # how the block's norms, rotary embedding and SwiGLU ran where it differs from its framework profile's
    # (ddplan.specs.FUSIONS; e.g. torchtitan before nn.RMSNorm: decomposed); None: the profile's, else the model spec's
    fusions: Fusions | None = None
    network: Network | None = None
    layout: RunLayout
    assumed: list[str] = []  # what the source does not state and this entry assumes
    notes: str = ""

    @model_validator(mode="after")
    def _fp8(self) -> RunFacts:
        if self.fp8_recipe is not None and self.precision != "fp8":
            raise ValueError(f"fp8_recipe is for fp8 runs; this one is {self.precision}")
        if self.fp8_weight_casts is not None and self.precision != "fp8":
            raise ValueError(f"fp8_weight_casts is for fp8 runs; this one is {self.precision}")
        return self

    @property
    def tokens_per_step(self) -> int:
        return self.layout.global_batch_sequences * self.model.seq_len

    @property
    def compute_dtype(self) -> str:
        """The dtype the run computes in outside its fp8 GEMMs: bf16 for an fp8 run, else its precision."""
        return "bf16" if self.precision == "fp8" else self.precision


class PublishedRun(RunFacts):
    measured: Measured
    mfu_convention: MfuConvention | None = None

    @model_validator(mode="after")
    def _convention(self) -> PublishedRun:
        if self.measured.model_tflops_per_gpu is not None and self.mfu_convention is None:
            raise ValueError("measured.model_tflops_per_gpu needs mfu_convention (the FLOPs per token it counts)")
        return self

    @property
    def measured_step_s(self) -> float:
        """The measured step time: as stated, or global batch tokens / tokens per second."""
        m = self.measured
        if m.step_time_s is not None:
            return m.step_time_s
        if m.tokens_per_s is not None:
            return self.tokens_per_step / m.tokens_per_s
        tokens_per_s = m.model_tflops_per_gpu * 1e12 * self.layout.gpus / self.mfu_convention.flops_per_token
        return self.tokens_per_step / tokens_per_s


class RunSet(Strict):
    kind: Literal["runs"]
    description: str = Field(min_length=3)
    runs: list[PublishedRun] = Field(min_length=1, max_length=10_000)

    @model_validator(mode="after")
    def _unique(self) -> RunSet:
        _refuse_repeated_ids(self.runs, "run")
        return self


def _refuse_repeated_ids(entries: list[RunFacts], what: str) -> None:
    """A dataset names each entry once: the first id that appears twice is an error."""
    seen: set[str] = set()
    for e in entries:
        if e.id in seen:
            raise ValueError(f"{what} id {e.id!r} appears twice")
        seen.add(e.id)


class PeakMeasured(Strict):
    """A measured peak of GPU memory per GPU in training, and what the number counts: `allocated` (torch's
    max_memory_allocated: tensors), `reserved` (max_memory_reserved: the caching allocator's segments too), or
    `device` (nvidia-smi / rocm-smi: the process's whole use, the CUDA context and workspaces included)."""

    peak_gb: float = Field(gt=0, le=1e5)  # GB = 1e9 bytes, as the tools report (GiB sources say so in `tool`)
    what: Literal["allocated", "reserved", "device"]
    tool: str = Field(min_length=3)  # how the source measured it, e.g. "torch.cuda.max_memory_allocated / 1e9"


class MeasuredPeak(RunFacts):
    """One training configuration whose peak memory a source measured (or that it saw run out of memory):
    a published run's facts (RunFacts), priced the same way, with the peak in place of a step time."""

    outcome: Literal["ran", "out_of_memory"] = "ran"
    measured: PeakMeasured | None = None  # None only for a configuration seen to run out of memory

    @model_validator(mode="after")
    def _measured(self) -> MeasuredPeak:
        if self.outcome == "ran" and self.measured is None:
            raise ValueError("a configuration that ran needs `measured` (its peak)")
        if self.layout.micro_batch is None:
            raise ValueError("layout.micro_batch: a peak depends on it; state it (the source's, or `assumed`)")
        return self


class PeakSet(Strict):
    kind: Literal["memory_peaks"]
    description: str = Field(min_length=3)
    peaks: list[MeasuredPeak] = Field(min_length=1, max_length=10_000)

    @model_validator(mode="after")
    def _unique(self) -> PeakSet:
        _refuse_repeated_ids(self.peaks, "peak")
        return self


class RoutingPoint(Strict):
    """One forced-balance run of the dataset (its id) and the dropless throughput the source measured beside it."""

    balanced: str = Field(min_length=1)
    dropless_model_tflops_per_gpu: float = Field(gt=0, le=1e5)  # in the balanced run's mfu_convention


class RoutingSweep(Strict):
    """Forced-balance vs dropless pairs of one layout (validation/moe_routing.yaml): what the dropless load
    imbalance is fitted to. Each pair's recompute is its forced-balance run's (published_runs.yaml)."""

    kind: Literal["routing_sweep"]
    source: RunSource
    points: list[RoutingPoint] = Field(min_length=1, max_length=1000)


DATASET = "published_runs.yaml"
ROUTING = "moe_routing.yaml"
# llm-foundry's H100 BF16 8-GPU rows at every sequence length (not in DATASET, never fitted to): the check of
# attention by sequence length (see its header)
SEQ_SWEEP = "llmfoundry_h100_8gpu.yaml"


def shipped_dataset() -> str:
    """Path of the dataset shipped with ddplan."""
    return str(builtin_dir("validation") / DATASET)


def load_routing(path: str | None = None) -> RoutingSweep:
    """The routing sweep (default: the shipped one), validated; errors name the file and field."""
    p = Path(path or builtin_dir("validation") / ROUTING).expanduser()
    if not p.exists():
        raise SpecError("no such file", file=str(p))
    return validate(RoutingSweep, read_yaml(p), str(p))


MEMORY_PEAKS = "memory_peaks.yaml"
# the Zero Bubble paper's memory figures under five pipeline schedules (not in MEMORY_PEAKS, never in PEAK_RATIO): the
# check of the micro-batches each schedule holds in flight (see its header)
ZB_PEAKS = "memory_peaks_zero_bubble.yaml"
# AWS's torchtitan test case's two reserved peaks (not in MEMORY_PEAKS, never in PEAK_RATIO): ddplan's largest memory
# miss, 48% under, mostly the caching allocator's (see its header)
TORCHTITAN_PEAKS = "memory_peaks_torchtitan.yaml"


def load_peaks(path: str | None = None) -> PeakSet:
    """A measured-peaks file (default: the shipped one), validated; errors name the file and field."""
    p = Path(path or builtin_dir("validation") / MEMORY_PEAKS).expanduser()
    if not p.exists():
        raise SpecError("no such file for --dataset", file=str(p))
    return validate(PeakSet, read_yaml(p), str(p))


def load_runs(path: str | None = None) -> RunSet:
    """A runs file (default: the shipped dataset), validated; errors name the file and field."""
    p = Path(path or shipped_dataset()).expanduser()
    if not p.exists():
        raise SpecError("no such file for --dataset", file=str(p))
    return validate(RunSet, read_yaml(p, max_bytes=MAX_DATASET_BYTES), str(p))


def run_spec(run: RunFacts, where: str, imbalance: float | None = None, weights: str | None = None):
    """The ddplan model spec of a run: its base with the architecture overrides, the run's sequence
    length, batch and compute dtype (fp8 runs compute in bf16 with fp8 GEMMs), and its routing.

    imbalance: the dropless load imbalance a dropless run (routing "dropless" or unstated) is priced at, in
    place of the spec's (what ddplan.validation fits and leaves out); forced-balance runs keep 1. weights: how
    the weights were kept (ddplan.specs.run_variant) where the run does not say (ddplan.replay.run_weights)."""
    try:
        base = load_model(run.model.base)
    except DdplanError as e:
        raise SpecError(e.message, file=where, field="model.base") from None
    data = base.model_dump(mode="json")
    data["name"] = _slug(run.model.name)
    data["aliases"] = []
    # what it is, for a reader of the spec file `validate --export-run` writes: not the base's own words
    data["description"] = (f"{run.model.name} as published run {run.id} ran it: {base.name}'s block with the run's "
                           f"architecture, sequence length, batch and dtypes")
    data["source"] = f"{run.source.ref}, {run.source.where}"
    data["architecture"].update(copy.deepcopy(run.model.architecture))  # the run's own dicts stay untouched
    a = data["architecture"]
    moe = a.get("moe")
    if run.model.routing is not None and moe is None:
        raise SpecError("routing is for mixture-of-experts models; this one is dense", file=where,
                        field="model.routing")
    if moe is not None and moe.get("capacity_factor") is None:  # padded to capacity: no imbalance to set
        if run.model.routing == "balanced":
            moe["load_imbalance"] = 1.0
        elif imbalance is not None:
            moe["load_imbalance"] = imbalance
    if run.model.seq_len > a["max_seq_len"]:
        raise SpecError(f"{run.model.seq_len} is above the model's max_seq_len {a['max_seq_len']}: set "
                        f"model.architecture.max_seq_len if the run's model takes it", file=where, field="model.seq_len")
    compute = run.compute_dtype
    half = {"bf16", "fp16"}
    d = data["dtypes"]
    d["compute"] = compute
    d["params"] = {g: (compute if t in half else t) for g, t in d["params"].items()}
    if run.model.grads:
        d["grads"] = run.model.grads
    r = data["recipe"]
    # a group the base lacks (an untied lm_head on a tied base) takes the embedding's dtype and optimizer
    for g in present_param_groups(validate(Architecture, a, f"{where}: model.architecture")):
        d["params"].setdefault(g, d["params"]["wte"])
        r["optimizer"]["algorithm"].setdefault(g, r["optimizer"]["algorithm"]["wte"])
    r.update(seq_len=run.model.seq_len, device_batch_size=run.layout.micro_batch or 1,
             total_batch_tokens=run.tokens_per_step, world_size_rule="any", compiled=run.layout.compiled)
    spec = validate(ModelSpec, data, f"{where}: model")
    weights = run.model.weights or weights  # as the run states, else as the caller knows its stack keeps them
    return run_variant(spec, weights=weights, moments=run.model.moments) if weights or run.model.moments else spec


def _slug(name: str) -> str:
    s = re.sub(r"[^a-z0-9_.-]+", "-", name.lower()).strip("-")
    return s or "model"


# Hardware specs that are one GPU (the same die, clocks and power limit; only memory differs): a run on one
# counts as measured on the other for the highest MFU measured
SAME_GPU: tuple[tuple[str, ...], ...] = (("a100-sxm-80gb", "a100-sxm-40gb"),)


def same_gpu(name: str) -> tuple[str, ...]:
    return next((g for g in SAME_GPU if name in g), (name,))


# The shipped dataset's highest measured MFU per GPU (SAME_GPU's first name) and precision class (fp8 or not), as
# highest_measured_in computes it: (MFU %, run id). Kept as figures so that pricing a table does not read and
# validate the whole dataset for one number per GPU (0.13 s of `ddplan table`'s ~0.7 s); tests/test_validation.py
# fails when they drift from validation/published_runs.yaml.
HIGHEST_MEASURED_MFU: dict[tuple[str, bool], tuple[float, str]] = {
    ("a100-sxm-80gb", False): (67.21, "fmsfsdp-llama2-7b-a100-128g-s4096-bf16"),
    ("b200", True): (86.53, "mlperf4.1-nvidia-b200_n8_preview_nemo-gpt3"),
    ("b300", True): (76.95, "mlperf5.1-dell-1xxe9780x8b300-sxm-270gb-llama31_8b"),
    ("gb200", False): (33.90, "modelzoo-qwen3-235b-a22b-gb200-256g-tp1pp8ep8"),
    ("gb200", True): (78.26, "mlperf5.0-nvidia-tyche_ngpu256_ngc25.04_nemo-llama31_405b"),
    ("gb300", True): (64.11, "mlperf5.1-nvidia-theia_ngpu72_ngc25.09_nemo-llama31_8b"),
    ("h100-sxm", False): (71.74, "modelzoo-qwen3-235b-a22b-h100-256g-s131072-cp8-balanced"),
    ("h100-sxm", True): (97.01, "mlperf4.1-nvidia-eos_n32_ngc24.09_nemo-gpt3"),
    ("h200", True): (97.44, "mlperf5.0-nebius-nebius_soperator_8xh200_n64_ngc25.01_nemo-llama31_405b"),
    ("mi300x", False): (27.52, "seed-nanochat-d24-mi300x-1g"),
    ("mi355x", True): (72.79, "mlperf5.1-amd-mi355x_epyc_9575f_pytorch-llama31_8b"),
}


def highest_measured_mfu(hardware: str, fp8: bool = False) -> tuple[float, str] | None:
    """(MFU %, run id) of the shipped dataset's best run on this GPU (HIGHEST_MEASURED_MFU), among runs of the
    same precision class (fp8 or not); None when the dataset has no such run."""
    return HIGHEST_MEASURED_MFU.get((same_gpu(hardware)[0], fp8))


def highest_measured_in(runs: RunSet, where: str) -> dict[tuple[str, bool], tuple[float, str]]:
    """Each GPU's (SAME_GPU's first name) and precision class's best run in a dataset: (MFU %, run id) in
    ddplan's MFU convention (ddplan.price.MFU_CONVENTION: FLOPs per token at the run's window, dense peak of the
    compute dtype) -- what HIGHEST_MEASURED_MFU holds for the shipped dataset."""
    best: dict[tuple[str, bool], tuple[float, str]] = {}
    for i, r in enumerate(runs.runs):
        hw = load_hardware(r.hardware)
        spec = run_spec(r, f"{where}: runs.{i}")
        arch = spec.architecture
        if r.layout.window:
            arch = arch.model_copy(update={"window_pattern": r.layout.window})
        flops = nanochat_flops_per_token(arch, r.model.seq_len) * r.tokens_per_step / r.measured_step_s
        mfu = 100 * flops / (r.layout.gpus * hw.peak.flops_per_s(spec.dtypes.compute))
        key = (same_gpu(hw.name)[0], r.precision == "fp8")
        if key not in best or mfu > best[key][0]:
            best[key] = (mfu, r.id)
    return best
