"""Published, measured training runs: the schema of a runs file and how one run becomes a priced table row.

A runs file (YAML, `kind: runs`) lists training runs someone measured and published, one entry each:
where it comes from (the source, for leave-one-source-out checks), the model (a built-in whose block it
shares, with the shapes that differ), the hardware (a ddplan hardware name), the layout as it ran, the
precision, what was measured (step time or tokens per second), and the source's own MFU convention
(FLOPs per token and peak) so that ddplan's prediction can be stated in it. Anything the source does
not state and the entry had to assume is listed under `assumed`, so a reader can see what rests on it.

The shipped dataset is validation/published_runs.yaml (ddplan/_specs/validation in the wheel);
`ddplan validate --dataset FILE` reads a user's own. Pricing goes through ddplan.table.build_table,
the same path as `ddplan table`: a validation row and a table row of the same layout are one number.
"""

from __future__ import annotations

import copy

import functools
from typing import Any, Literal

from pydantic import Field, model_validator

from ddplan.errors import DdplanError, SpecError
from ddplan.specs import Strict

Precision = Literal["bf16", "fp16", "fp8"]
Recompute = Literal["none", "selective", "full"]


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
    # --grad-reduce-in-bf16 with bf16 params), "fp32" (main_grad in fp32); None: the base spec's
    grads: Literal["param", "fp32"] | None = None
    # mixture of experts, how its tokens were routed: "balanced" (forced, Megatron-Core
    # --moe-router-force-load-balancing: ddplan's moe.load_imbalance 1) or "dropless" (real routing: the base
    # spec's imbalance, ddplan.specs.DROPLESS_IMBALANCE unless it sets one); None: the base spec's
    routing: Literal["balanced", "dropless"] | None = None


class RunLayout(Strict):
    """The layout as it ran. gpus = dp x tp x pp x cp; global batch = dp x micro-batch x accumulation."""

    gpus: int = Field(gt=0, le=10**6)
    tp: int = Field(default=1, gt=0, le=1024)
    pp: int = Field(default=1, gt=0, le=1024)
    vp: int = Field(default=1, gt=0, le=1024)  # interleaved chunks per pipeline stage
    cp: int = Field(default=1, gt=0, le=1024)  # context parallelism
    ep: int = Field(default=1, gt=0, le=4096)  # expert parallelism (mixture of experts): out of dp x cp
    etp: Literal[1] | None = None  # 1: experts whole (Megatron-Core --expert-tensor-parallel-size 1); None: tp
    zero: int = Field(default=0, ge=0, le=3)  # 3: FSDP FULL_SHARD; 2: SHARD_GRAD_OP
    # None: not stated; priced at the fastest power-of-two micro-batch that fits in memory (fastest_fitting),
    # as a published throughput benchmark is tuned
    micro_batch: int | None = Field(default=None, gt=0, le=65536)
    global_batch_sequences: int = Field(gt=0, le=10**9)
    recompute: Recompute = "none"
    attention: str | None = None  # an implementation of the hardware spec (default: the spec's default)
    window: str | None = Field(default=None, pattern=r"^[SL]+$")  # window pattern (nanochat); default the model's
    sequence_parallel: bool = False  # Megatron sequence parallelism with tp
    tp_comm_overlap: bool = False  # Megatron-Core --tp-comm-overlap
    overlap_param_gather: bool = False  # Megatron-Core --overlap-param-gather (distributed optimizer)
    shard_group: int = Field(default=0, ge=0, le=10**6)  # ZeRO-3 hybrid sharding (HSDP) group; 0: all of dp
    compiled: bool = False


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
    """The run's inter-node network where it differs from the hardware spec's."""

    nics_per_node: int = Field(gt=0, le=64)
    nic_gbit_per_s: float = Field(gt=0, le=10_000)
    why: str = Field(min_length=3)  # the source's words


class PublishedRun(Strict):
    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$", max_length=120)
    source: RunSource
    model: RunModel
    hardware: str = Field(min_length=1)
    precision: Precision
    # with precision fp8: how its casts ran (ddplan.fp8.FP8_RECIPES); None: the model spec's
    fp8_recipe: Literal["tensorwise", "delayed", "nanochat"] | None = None
    network: Network | None = None
    layout: RunLayout
    measured: Measured
    mfu_convention: MfuConvention | None = None
    assumed: list[str] = []  # what the source does not state and this entry assumes
    notes: str = ""

    @model_validator(mode="after")
    def _convention(self) -> PublishedRun:
        if self.fp8_recipe is not None and self.precision != "fp8":
            raise ValueError(f"fp8_recipe is for fp8 runs; this one is {self.precision}")
        if self.measured.model_tflops_per_gpu is not None and self.mfu_convention is None:
            raise ValueError("measured.model_tflops_per_gpu needs mfu_convention (the FLOPs per token it counts)")
        return self

    @property
    def tokens_per_step(self) -> int:
        return self.layout.global_batch_sequences * self.model.seq_len

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
        seen: set[str] = set()
        for r in self.runs:
            if r.id in seen:
                raise ValueError(f"run id {r.id!r} appears twice")
            seen.add(r.id)
        return self


class RoutingPoint(Strict):
    """One forced-balance run of the dataset (its id) and the dropless throughput the source measured beside it."""

    balanced: str = Field(min_length=1)
    dropless_model_tflops_per_gpu: float = Field(gt=0, le=1e5)  # in the balanced run's mfu_convention


class RoutingSweep(Strict):
    """Forced-balance vs dropless pairs of one layout (validation/moe_routing.yaml): what the dropless load
    imbalance is fitted to. recompute_moe: the runs re-computed the whole MoE layers' forward."""

    kind: Literal["routing_sweep"]
    source: RunSource
    recompute_moe: bool = False
    points: list[RoutingPoint] = Field(min_length=1, max_length=1000)


DATASET = "published_runs.yaml"
ROUTING = "moe_routing.yaml"
# llm-foundry's H100 BF16 8-GPU rows at every sequence length (not in DATASET, never fitted to): the check of
# attention by sequence length (see its header)
SEQ_SWEEP = "llmfoundry_h100_8gpu.yaml"


def shipped_dataset() -> str:
    """Path of the dataset shipped with ddplan."""
    from ddplan.registry import builtin_dir

    return str(builtin_dir("validation") / DATASET)


def load_routing(path: str | None = None) -> RoutingSweep:
    """The routing sweep (default: the shipped one), validated; errors name the file and field."""
    from pathlib import Path

    from ddplan.registry import builtin_dir, read_yaml, validate

    p = Path(path or builtin_dir("validation") / ROUTING).expanduser()
    if not p.exists():
        raise SpecError("no such file", file=str(p))
    return validate(RoutingSweep, read_yaml(p), str(p))


def load_runs(path: str | None = None) -> RunSet:
    """A runs file (default: the shipped dataset), validated; errors name the file and field."""
    from pathlib import Path

    from ddplan.registry import read_yaml, validate

    p = Path(path or shipped_dataset()).expanduser()
    if not p.exists():
        raise SpecError("no such file for --dataset", file=str(p))
    return validate(RunSet, read_yaml(p), str(p))


def run_spec(run: PublishedRun, where: str, imbalance: float | None = None):
    """The ddplan model spec of a run: its base with the architecture overrides, the run's sequence
    length, batch and compute dtype (fp8 runs compute in bf16 with fp8 GEMMs), and its routing.

    imbalance: the dropless load imbalance a dropless run (routing "dropless" or unstated) is priced at, in
    place of the spec's (what ddplan.validation fits and leaves out); forced-balance runs keep 1."""
    from ddplan.registry import load_model, validate
    from ddplan.specs import ModelSpec

    try:
        base = load_model(run.model.base)
    except DdplanError as e:
        raise SpecError(e.message, file=where, field="model.base") from None
    data = base.model_dump(mode="json")
    data["name"] = _slug(run.model.name)
    data["aliases"] = []
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
    compute = "bf16" if run.precision == "fp8" else run.precision
    half = {"bf16", "fp16"}
    d = data["dtypes"]
    d["compute"] = compute
    d["params"] = {g: (compute if t in half else t) for g, t in d["params"].items()}
    if run.model.grads:
        d["grads"] = run.model.grads
    r = data["recipe"]
    # a group the base lacks (an untied lm_head on a tied base) takes the embedding's dtype and optimizer
    from ddplan.specs import Architecture, present_param_groups

    for g in present_param_groups(validate(Architecture, a, f"{where}: model.architecture")):
        d["params"].setdefault(g, d["params"]["wte"])
        r["optimizer"]["algorithm"].setdefault(g, r["optimizer"]["algorithm"]["wte"])
    r.update(seq_len=run.model.seq_len, device_batch_size=run.layout.micro_batch or 1,
             total_batch_tokens=run.tokens_per_step, world_size_rule="any", compiled=run.layout.compiled)
    spec = validate(ModelSpec, data, f"{where}: model")
    return spec


def _slug(name: str) -> str:
    import re

    s = re.sub(r"[^a-z0-9_.-]+", "-", name.lower()).strip("-")
    return s or "model"


def table_command(run: PublishedRun) -> list[str] | None:
    """The `ddplan table` arguments that price this run as one row, or None when its model needs a YAML
    (architecture overrides) or its network differs from the hardware spec's (no flag for either)."""
    if run.model.architecture or run.network is not None:
        return None
    lay = run.layout
    argv = ["table", "--model", run.model.base, "--hardware", run.hardware, "--gpus", str(lay.gpus),
            "--tp", str(lay.tp), "--pp", str(lay.pp), "--vp", str(lay.vp), "--cp", str(lay.cp), "--ep", str(lay.ep),
            "--zero", str(lay.zero), *(["--etp", "1"] if lay.etp else []),
            "--device-batch-size", ",".join(map(str, micro_batches(run))), "--total-batch-size",
            str(run.tokens_per_step),
            "--recompute", lay.recompute, "--seq-len", str(run.model.seq_len),
            "--dtype", "bf16" if run.precision == "fp8" else run.precision,
            "--compile" if lay.compiled else "--no-compile"]
    if run.model.grads:
        argv += ["--grads", run.model.grads]
    if run.model.routing == "balanced":
        argv += ["--moe-imbalance", "1"]
    if lay.attention:
        argv += ["--attention", lay.attention]
    if lay.window:
        argv += ["--window", lay.window]
    if lay.tp_comm_overlap:
        argv.append("--tp-comm-overlap")
    if lay.sequence_parallel:
        argv.append("--sequence-parallel")
    if lay.overlap_param_gather:
        argv.append("--overlap-param-gather")
    if lay.shard_group:
        argv += ["--shard-group", str(lay.shard_group)]
    if run.precision == "fp8":
        argv.append("--fp8")
    if run.fp8_recipe:
        argv += ["--fp8-recipe", run.fp8_recipe]
    return argv


def with_sustained(hw, fraction: float, source: str):
    """The hardware spec with its GEMM sustained fraction replaced (a point value: no range)."""
    from ddplan.specs import Efficiency

    g = hw.efficiency.gemm
    kept = Efficiency(value=fraction, basis="assumed", source=source)
    return hw.model_copy(update={"efficiency": hw.efficiency.model_copy(
        update={"gemm": g.model_copy(update={"sustained": kept})})})


def price_run(run: PublishedRun, where: str, sustained: dict[str, float] | None = None,
              imbalance: float | None = None, shared: dict | None = None):
    """(spec, hardware, priced row) of one run, through ddplan.table.build_table as `ddplan table` prices it.

    sustained: hardware name -> GEMM sustained fraction replacing the spec's (validation's re-fits);
    imbalance: the dropless load imbalance replacing the spec's (run_spec); shared: build_table's
    rate-independent cache, kept by the caller across prices of this run at one imbalance."""
    from ddplan.layout import Options
    from ddplan.registry import load_hardware
    from ddplan.table import TableRequest, build_table

    try:
        hw = load_hardware(run.hardware)
    except DdplanError as e:
        raise SpecError(e.message, file=where, field="hardware") from None
    if sustained and hw.name in sustained:
        hw = with_sustained(hw, sustained[hw.name], "re-fitted by ddplan.validation")
    if run.network is not None:
        n = run.network
        nic = hw.inter_node.nic_gbit_per_s.model_copy(update={"value": n.nic_gbit_per_s, "source": n.why})
        hw = hw.model_copy(update={"inter_node": hw.inter_node.model_copy(
            update={"nics_per_node": n.nics_per_node, "nic_gbit_per_s": nic})})
    spec = run_spec(run, where, imbalance)
    lay = run.layout
    attention = lay.attention or hw.default_attention
    req = TableRequest(model=spec, hardware=hw, gpus=(lay.gpus,), tps=(lay.tp,), pps=(lay.pp,), vps=(lay.vp,),
                       cps=(lay.cp,), eps=(lay.ep,),
                       zeros=(lay.zero,), micro_batches=micro_batches(run), recomputes=(lay.recompute,),
                       attentions=(attention,), windows=(lay.window or spec.architecture.window_pattern,),
                       total_batch_tokens=run.tokens_per_step, compiled=lay.compiled, fp8=run.precision == "fp8",
                       fp8_recipe=run.fp8_recipe,
                       options=Options(sequence_parallel=lay.sequence_parallel, tp_overlap=lay.tp_comm_overlap,
                                       overlap_param_gather=lay.overlap_param_gather,
                                       shard_group=lay.shard_group, expert_tp=lay.etp or 0).for_model(spec))
    try:
        table = build_table(req, shared=shared)
    except DdplanError as e:
        raise SpecError(e.message, file=where, field="layout") from None
    row = fastest_fitting(table.rows)
    if lay.micro_batch and row.layout.micro_batch != lay.micro_batch or row.global_batch_tokens != run.tokens_per_step:
        raise SpecError(f"the layout does not split as it ran: {lay.global_batch_sequences} sequences over dp "
                        f"{row.layout.dp} at micro-batch {lay.micro_batch}", file=where, field="layout")
    return spec, hw, row


def micro_batches(run: PublishedRun) -> tuple[int, ...]:
    """The micro-batches a run is priced at: the one it states, else every power of two that divides the
    sequences of one data-parallel rank (fastest_fitting picks among them)."""
    lay = run.layout
    if lay.micro_batch:
        return (lay.micro_batch,)
    per_rank = lay.global_batch_sequences // (lay.gpus // (lay.tp * lay.pp * lay.cp))
    return tuple(m for m in (2 ** i for i in range(17)) if m <= per_rank and per_rank % m == 0) or (1,)


def fastest_fitting(rows: list):
    """The row a run with an unstated micro-batch is scored by: the fastest that fits in memory (a published
    throughput figure is the tuned one), else the smallest micro-batch; with one row, that row."""
    fits = [r for r in rows if r.memory.fits]
    return min(fits, key=lambda r: r.step_s) if fits else min(rows, key=lambda r: r.layout.micro_batch)


# Hardware specs that are one GPU (the same die, clocks and power limit; only memory differs): a run on one
# counts as measured on the other for the highest MFU measured
SAME_GPU: tuple[tuple[str, ...], ...] = (("a100-sxm-80gb", "a100-sxm-40gb"),)


def same_gpu(name: str) -> tuple[str, ...]:
    return next((g for g in SAME_GPU if name in g), (name,))


@functools.lru_cache(maxsize=64)
def highest_measured_mfu(hardware: str, fp8: bool = False) -> tuple[float, str] | None:
    """(MFU %, run id) of the shipped dataset's best run on this GPU, in ddplan's MFU convention
    (ddplan.price.MFU_CONVENTION: FLOPs per token at the run's window, dense peak of the compute dtype),
    among runs of the same precision class (fp8 or not); None when the dataset has no such run."""
    from ddplan.flops import nanochat_flops_per_token
    from ddplan.registry import load_hardware

    try:
        runs = load_runs()
    except DdplanError:
        return None
    names = same_gpu(hardware)
    best = None
    for i, r in enumerate(runs.runs):
        if (r.precision == "fp8") != fp8:
            continue
        try:
            hw = load_hardware(r.hardware)
        except DdplanError:
            continue
        if hw.name not in names:
            continue
        spec = run_spec(r, f"{shipped_dataset()}: runs.{i}")
        arch = spec.architecture
        if r.layout.window:
            arch = arch.model_copy(update={"window_pattern": r.layout.window})
        flops = nanochat_flops_per_token(arch, r.model.seq_len) * r.tokens_per_step / r.measured_step_s
        mfu = 100 * flops / (r.layout.gpus * hw.peak.flops_per_s(spec.dtypes.compute))
        if best is None or mfu > best[0]:
            best = (mfu, r.id)
    return best
