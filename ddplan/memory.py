"""Memory per GPU for a parallel layout: model states by group and dtype, activations, buffers, overhead.

Model states follow ZeRO (Rajbhandari et al., arXiv 1910.02054, sec. 5): stage 1 shards optimizer
state over dp, stage 2 also gradients, stage 3 also parameters. ddplan generalises the paper's
(2 + 2 + K) Psi to per-group dtypes: each group keeps its master dtype for parameters and gradients
(nanochat: fp32 matrices, bf16 embeddings) and its optimizer's state. nanochat's own optimizer
shards state by whole matrices (ceil(K/N) per rank per shape group) and keeps full gradients:
ZeRO-1 in memory. Activations come from the anatomy (ddplan.anatomy), so memory and FLOPs agree.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from ddplan.anatomy import Anatomy, muon_matrices
from ddplan.params import param_counts
from ddplan.fp8 import fp8_weight_fractions
from ddplan.pipeline import moe_layers_by_stage, stage_layers, v_stages
from ddplan.specs import ModelSpec
from ddplan.layout import Layout
from ddplan.units import GiB, MiB, dtype_bytes

HEADROOM = 0.05  # a setup fits when it leaves 5% of usable memory free (assumed; --headroom replaces it)
# The memory model's error on measured peaks: (low, high) factors on a predicted peak, the band a fits verdict
# carries (fit_verdict): the 5th and 95th percentile of measured / predicted over validation/memory_peaks.yaml's
# 25 measured peaks (0.975 and 1.209, ddplan.validation.peak_band; 0.963 and 1.206 before the BLOOM prequel's peaks
# took Megatron-DeepSpeed's profile, 2026-12-06: its vocab-parallel loss lowered them by up to 3%), rounded outward. Nothing in the memory model is
# fitted to the peaks; this band is, and `ddplan validate --memory` scores its verdicts with each source's peaks
# judged by the band fitted without them. tests/test_memory_peaks.py fails when it drifts from the dataset.
PEAK_RATIO = (0.97, 1.21)
EMBEDDING_GROUPS = ("wte", "wpe", "smear_gate")  # live on the first pipeline stage
HEAD_GROUPS = ("lm_head",)  # lives on the last pipeline stage (under ZB-V the first: Stage.head says)
EXPERT_GROUP = "experts"  # routed experts: split over expert-parallel ranks


@dataclass(frozen=True)
class MemoryAssumptions:
    """Terms that are not in the model: each is a stated assumption, replaced by a calibration's `memory:` section
    (ddplan.calibration.memory_assumptions: measured by `ddplan calibrate` on a GPU, or written by hand).

    framework_gib: CUDA/HIP context, BLAS workspaces and loaded kernels, ~0.5-1.5 GiB per process
      (assumed; PyTorch docs "CUDA semantics: memory management" note the context is outside the
      caching allocator's statistics). allocator_fraction: caching-allocator rounding and
      fragmentation as a fraction of the activation peak (assumed 5%; expandable_segments, which
      nanochat sets, keeps it low). bucket_mb: a ZeRO-1 reduce bucket in MiB (25, as torch DDP's
      `bucket_cap_mb`); two in flight. DDP itself holds a full bucket copy of the gradients.
      comm_gib: NCCL/RCCL's own buffers when the job has more than one GPU (assumed: NCCL_BUFFSIZE 4 MiB x
      channels x peers); NCCL allocates them itself, outside torch's caching allocator, so they are part of the
      `framework` term (outside_allocator_bytes), which torch's allocated and reserved figures do not count
      (pytorch/pytorch#150880, docs/source/torch_cuda_memory.rst: the allocator sees only its own allocations).
    """

    framework_gib: float = 1.0
    allocator_fraction: float = 0.05
    bucket_mb: float = 25.0
    comm_gib: float = 0.25


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per GPU by term; `total` is the peak over the step."""

    terms: dict[str, float]
    by_group: dict[str, dict[str, float]] = field(default_factory=dict)  # params/grads/optimizer per group
    capacity: float = 0.0
    notes: tuple[str, ...] = ()
    headroom_fraction: float = HEADROOM  # of capacity kept free (fragmentation, spikes, other processes)
    # the sum of the terms, and the bytes a setup may use (capacity less the headroom fraction, limit_bytes): worked
    # out once, as a search reads them ~10 times a priced layout (fits, verdict, band, flags, row)
    total: float = field(init=False, repr=False, compare=False)
    limit: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "total", sum(self.terms.values()))
        object.__setattr__(self, "limit", limit_bytes(self.capacity, self.headroom_fraction))

    @property
    def fits(self) -> bool:
        """Fits with headroom_fraction of usable memory left free."""
        return self.total <= self.limit

    @property
    def verdict(self) -> str:
        """FITS, MAY_NOT_FIT or DOES_NOT_FIT: the total with the memory model's error band against the limit and the
        capacity (fit_verdict). `fits` is the central estimate's answer, which ranks and searches layouts."""
        return fit_verdict(self.total, self.limit, capacity=self.capacity)

    @property
    def band(self) -> tuple[float, float]:
        """(low, high) bytes: the total times PEAK_RATIO."""
        total = self.total
        return total * PEAK_RATIO[0], total * PEAK_RATIO[1]

    @property
    def headroom(self) -> float:
        return self.capacity - self.total


FITS, MAY_NOT_FIT, DOES_NOT_FIT = "fits", "may not fit", "does not fit"


def fit_verdict(total_bytes: float, limit: float, ratio: tuple[float, float] | None = None,
                capacity: float | None = None) -> str:
    """Whether a predicted peak fits, with the memory model's error (PEAK_RATIO) on it: FITS when even the band's
    high end (total x ratio[1]) is within the limit (usable memory less the headroom a plan keeps free),
    DOES_NOT_FIT when even its low end (total x ratio[0]) is over the capacity (all of usable memory; the limit
    where none is given), MAY_NOT_FIT between. The headroom is a margin a plan keeps, not memory a run lacks: a
    tuned recipe runs at 90-97% of the card, and the band (fitted to measured peaks of predictions that already
    count the framework and allocator slack) is the model's whole doubt, so "does not fit" is said against the
    card itself, once. e.g. 79.7 GiB predicted on an 80 GB H100 (usable 79.65, limit 75.67): low end 76.5 GiB, over
    the limit but not the card: may not fit (it was "does not fit", for a recipe that runs: Megatron-LM's
    examples/llama/train_llama3_8b_h100_fp8.sh)."""
    ratio = ratio or PEAK_RATIO
    if total_bytes * ratio[1] <= limit:
        return FITS
    if total_bytes * ratio[0] > (limit if capacity is None else capacity):
        return DOES_NOT_FIT
    return MAY_NOT_FIT


def limit_bytes(capacity_bytes: float, headroom: float) -> float:
    """Bytes a setup may use per GPU: capacity less the headroom fraction, (1 - headroom) x capacity."""
    return (1 - headroom) * capacity_bytes


@dataclass(frozen=True)
class Stage:
    """One pipeline stage whose memory may be the largest (pipeline_stages): its index, its layers, its mixture-of-
    experts blocks, and whether it holds the embeddings (the first) and the head (the last; under ZB-V the first
    holds both: pipeline_stages)."""

    index: int
    layers: int
    moe_layers: int
    embedding: bool
    head: bool


# (id(arch), pp, ZB-V) -> (arch kept alive, stages)
_STAGES: dict[tuple[int, int, bool], tuple[object, tuple[Stage, ...]]] = {}


def pipeline_stages(layout: Layout, arch) -> tuple[Stage, ...]:
    """The stages whose peak memory can be the largest, each priced whole (its own model states with its own saved
    activations: memory_per_gpu takes the fullest). The first (the embeddings, the most micro-batches in flight).
    The second where it holds more layers or MoE blocks than the first (the middle stages hold as many layers as
    any, ddplan.pipeline.stage_layers: more than an end stage when pp does not divide them; fewer micro-batches in
    flight than the first, in_flight_micro_batches, and fewer on each later one). Each later middle stage with more
    MoE blocks than every middle stage before it (a model's dense blocks come first: only more experts can make a
    later stage fuller). The last (the head; with tied embeddings also its copy of the embedding table, which
    Megatron-Core keeps there: language_module.py@2a75ac1 setup_embeddings_and_output_layer, "maintain duplicated
    embedding weights in post processing stage"). Without a pipeline, one stage with everything. e.g. Llama 3.1
    405B's 126 layers over pp 16: stages 0, 1 and 15 with 7, 8 and 7 layers, so the 8-layer stage no longer pairs
    with the first stage's embedding table. Under ZB-V the first stage runs both end chunks (ddplan.pipeline.
    v_stages): it holds the embeddings and the head, and the other stages with the most layers and MoE blocks hold
    neither."""
    v = layout.pp_schedule == "zb_v"
    known = _STAGES.get((id(arch), layout.pp, v))
    if known is not None and known[0] is arch:  # a search asks for a layout group's stages many times
        return known[1]
    if len(_STAGES) >= 256:
        _STAGES.clear()
    if v:
        dense = arch.num_layers - arch.moe_layers if arch.moe is not None else None
        stages = _STAGES[(id(arch), layout.pp, v)] = (arch, _v_stages(arch.num_layers, layout.pp, dense))
        return stages[1]
    moe = None
    if arch.moe is not None:
        try:
            moe = moe_layers_by_stage(arch, layout.pp)
        except ValueError:  # a split check_layout refuses: every stage the even share's MoE blocks, at most
            moe = [min(_split(arch.num_layers, layout.pp)[1], arch.moe_layers)] * layout.pp
    stages = _STAGES[(id(arch), layout.pp, v)] = (arch, _stages(arch.num_layers, layout.pp, moe))
    return stages[1]


def _v_stages(num_layers: int, pp: int, dense_layers: int | None = None) -> tuple[Stage, ...]:
    """pipeline_stages under ZB-V: the first stage (both end chunks, the embeddings and the head) and each other
    stage with a (layers, MoE blocks) no other has more of (ddplan.pipeline.v_stages; dense_layers: a mixture of
    experts' dense blocks, None for a dense model)."""
    try:
        per = v_stages(num_layers, pp, dense_layers)
    except ValueError:  # a split check_layout refuses: the even share on every stage
        share = -(-num_layers // pp)
        per = [(share, 0 if dense_layers is None else min(share, num_layers - dense_layers))] * pp
    out = [Stage(0, per[0][0], per[0][1], True, True)]
    for j, (layers, moe) in enumerate(per[1:], start=1):
        if not any(o.layers >= layers and o.moe_layers >= moe for o in out[1:]):
            out = [o for o in out if o.index == 0 or not (layers >= o.layers and moe >= o.moe_layers)]
            out.append(Stage(j, layers, moe, False, False))
    return tuple(out)


def _split(num_layers: int, pp: int) -> tuple[int, int, int]:
    """ddplan.pipeline.stage_layers, or for a split check_layout refuses the even share, rounded up, on every stage."""
    try:
        return stage_layers(num_layers, pp)
    except ValueError:
        return (-(-num_layers // pp),) * 3


def _stages(num_layers: int, pp: int, moe: list[int] | None = None) -> tuple[Stage, ...]:
    """pipeline_stages for num_layers over pp stages, with each stage's MoE blocks (None: a dense model)."""
    moe = moe or [0] * pp
    if pp == 1:
        return (Stage(0, num_layers, moe[0], True, True),)
    first, middle, last = _split(num_layers, pp)
    out = [Stage(0, first, moe[0], True, False)]
    most = moe[0] if middle == first else -1  # a middle stage with no more layers needs more MoE blocks than this
    for j in range(1, pp - 1):
        if moe[j] > most:
            out.append(Stage(j, middle, moe[j], False, False))
            most = moe[j]
    out.append(Stage(pp - 1, last, moe[-1], False, True))
    return tuple(out)


def _busiest_stage_share(layout: Layout, num_layers: int) -> float:
    """Fraction of the layers on the pipeline stage with the most (ddplan.pipeline.stage_layers); 1/pp when
    pp divides them; ceil(L / pp) / L for a split that leaves an end stage empty (refused by check_layout)."""
    return max(_split(num_layers, layout.pp)) / num_layers


def _stage_share(group: str, layout: Layout, num_layers: int, arch=None, stage: Stage | None = None) -> float:
    """Fraction of a group's parameters on a pipeline stage (`stage`; None: the most loaded), per tensor-parallel
    rank.

    Block groups split over tp x the stages' layers (1 / (tp x pp) when pp divides the layers); embeddings
    live on the first stage and lm_head on the last, each split over tp (vocab-parallel): a given stage holds them
    or not (the last also the tied embedding table's copy, pipeline_stages). Without a stage both count (the step
    time's busiest stage, ddplan.step). The routed experts and the router (arch given, a mixture of experts) live in the
    MoE blocks only: the share of the stage with the most of them (the dense_layers sit on the first stages,
    ddplan.pipeline.moe_layers_by_stage), or of the given stage.
    """
    if stage is not None and layout.pp > 1:
        if group in EMBEDDING_GROUPS:
            tied_copy = stage.head and group == "wte" and arch is not None and arch.tied_embeddings
            return 1.0 / layout.tp if stage.embedding or tied_copy else 0.0
        if group in HEAD_GROUPS:
            return 1.0 / layout.tp if stage.head else 0.0
        if arch is not None and arch.moe is not None and group in (EXPERT_GROUP, "router"):
            return stage.moe_layers / arch.moe_layers / layout.tp
        return stage.layers / num_layers / layout.tp
    if group in EMBEDDING_GROUPS or group in HEAD_GROUPS:
        return 1.0 / layout.tp
    if arch is not None and arch.moe is not None and group in (EXPERT_GROUP, "router") and layout.pp > 1:
        try:
            return max(moe_layers_by_stage(arch, layout.pp)) / arch.moe_layers / layout.tp
        except ValueError:  # a split check_layout refuses: the even share, rounded up
            pass
    return _busiest_stage_share(layout, num_layers) / layout.tp


_COUNTS: dict[int, tuple[object, dict[str, int]]] = {}  # id(architecture) -> (the architecture, its counts)


def counts_of(arch) -> dict[str, int]:
    """ddplan.params.param_counts(arch), worked out once per architecture object (specs are frozen; the memory and
    step models ask for the same model's counts for every layout of a search). Read it; never write it."""
    known = _COUNTS.get(id(arch))
    if known is None or known[0] is not arch:  # the object is kept with its counts, so its id is not reused
        if len(_COUNTS) >= 64:
            _COUNTS.clear()
        known = _COUNTS[id(arch)] = (arch, param_counts(arch))
    return known[1]


# bytes an element of an fp8 GEMM weight kept in fp8 (Layout.fp8_params): its fp8 data and, for backward's GEMMs on
# Hopper, its transpose (Transformer Engine Float8Tensor columnwise data, made after each all-gather and kept:
# Megatron-Core's post_all_gather_processing); fp8_param_bytes gives it by GPU and recipe
FP8_PARAM_BYTES = 2.0


def fp8_param_bytes(recipe: str, any_layout_fp8_gemms: bool, zero: int = 1) -> float:
    """Bytes an fp8 GEMM weight kept in fp8 (Layout.fp8_params) takes an element. A per-tensor recipe (delayed,
    current) keeps the fp8 data and, where the GPU's fp8 GEMMs take only the TN layout (Hopper), its transpose for
    backward's GEMMs: 2; where they take any layout (Blackwell: Transformer Engine's is_non_tn_fp8_gemm_supported,
    compute capability 10.x, transformer_engine/pytorch/utils.py@d0067d0 L658-663), Float8Tensor keeps no transpose
    and serves the column-wise use from the same data (tensor/storage/float8_tensor_storage.py L292-299): 1. MXFP8
    keeps a row-wise and a column-wise copy, each scaled per 32 along its own axis, on any GPU: 2 (the scales, 1/16
    more, not counted). any_layout_fp8_gemms: the hardware spec's `mxfp8` (the GPUs ddplan has with MXFP8 are the
    compute-capability-10 Blackwells). Under Megatron-FSDP (zero 3) the fp8 weight buffers, sharded and gathered, are
    uint8 with a transpose buffer for MXFP8 only (megatron_fsdp/param_and_grad_buffer.py@d98e8a64 L2630-2642:
    "Currently, only mxfp8 needs it"): as on Blackwell, whatever the GPU."""
    no_transpose = any_layout_fp8_gemms or zero == 3
    return 1.0 if no_transpose and recipe in ("delayed", "current") else FP8_PARAM_BYTES


def kept_param_bytes(param_bytes: int, fp8_fraction: float, fp8_bytes: float) -> float:
    """Bytes a group's parameter element takes, its fp8_fraction of fp8 GEMM weights kept in fp8 at fp8_bytes
    (Layout.fp8_params; 0 without it) and the rest in its own dtype: e.g. bf16 block matrices all fp8 on Blackwell,
    2 - (2 - 1) x 1 = 1."""
    return param_bytes - (param_bytes - fp8_bytes) * fp8_fraction


def model_states(spec: ModelSpec, layout: Layout, stage: Stage | None = None,
                 fp8_bytes: float = FP8_PARAM_BYTES) -> dict[str, dict[str, float]]:
    """Parameters, gradients and optimizer state per group, bytes on one GPU of a pipeline stage (`stage`, one of
    pipeline_stages; None: the stage with the most of them).

    Ref: ZeRO (arXiv 1910.02054) sec. 5.1-5.3 for stages 0-3; nanochat optim.py @92d63d4 l.203-207,
    337-382 for its sharded Muon/AdamW state (whole matrices per rank) and full gradients. Routed experts:
    1 / ep of them per rank, their ZeRO shards over the expert-data-parallel ranks (expert_shard), as
    Megatron-Core's distributed optimizer shards expert parameters (megatron/core/parallel_state.py
    expert-data-parallel group). With layout.offload_optimizer the optimizer state, fp32 masters included,
    lives in host memory: 0 bytes on the GPU (Ren et al., ZeRO-Offload, arXiv 2101.06840, sec. 4.1). With
    layout.fp8_params the fp8 GEMMs' weights are Transformer Engine Float8Tensors (ddplan.fp8.fp8_weight_fractions;
    Megatron-Core --fp8-param-gather, their fp32 masters in the distributed optimizer): fp8_bytes an element
    (fp8_param_bytes: on Hopper the fp8 data and the transpose backward's GEMMs read, made after each gather and kept,
    Megatron-Core's post_all_gather_processing -- as many bytes as 16-bit weights; 1 on Blackwell's per-tensor
    recipes).
    """
    if stage is None and layout.pp > 1:  # the stage with the most state (a bound for state_floor_bytes)
        per = [model_states(spec, layout, s, fp8_bytes) for s in pipeline_stages(layout, spec.architecture)]
        return max(per, key=lambda st: sum(v for k in st for v in st[k].values()))
    counts = counts_of(spec.architecture)
    opt, dp, zero = spec.recipe.optimizer, layout.grad_ranks, layout.zero  # dp x cp ranks share the parameters
    native_sharding = spec.recipe.distribution == "sharded_optimizer" and zero == 1
    out: dict[str, dict[str, float]] = {"params": {}, "gradients": {}, "optimizer": {}}
    groups = [g for g, n in counts.items() if n and g in opt.algorithm]
    fp8 = fp8_weight_fractions(spec) if layout.fp8_params else {}
    for g in groups:
        share, shard = state_share(spec, layout, g, stage)
        if not share:
            continue
        pb = dtype_bytes(spec.dtypes.params[g])
        n = counts[g] * share
        algo = opt.algorithm[g]
        if algo == "adamw":
            moment, master = opt.adamw_bytes(spec.dtypes.params[g], layout.distributed_optimizer)
            state = (2 * moment + master) * n
        else:  # Muon: momentum in the param dtype + factored second moment (max(rows, cols) fp32 per matrix)
            mats = muon_matrices(spec, g)
            state = (pb * n + 4 * sum(max(r, c) for r, c in mats) * share)
        if native_sharding and algo == "muon":
            state *= _muon_chunk_fraction(spec, g, dp)
        elif native_sharding and algo == "adamw":
            state = state / dp if counts[g] >= 1024 else state  # small AdamW params are all-reduced, not sharded
        elif zero >= 1:
            state /= shard
        kept = kept_param_bytes(pb, fp8.get(g, 0.0), fp8_bytes)  # fp8 weights (and on Hopper their transposes)
        out["params"][g] = kept * n / (shard if zero >= 3 else 1)
        out["gradients"][g] = spec.dtypes.grad_bytes(g) * n / (shard if zero >= 2 else 1)
        out["optimizer"][g] = 0.0 if layout.offload_optimizer else state  # on the host (ZeRO-Offload sec. 4.1)
    return out


def state_share(spec: ModelSpec, layout: Layout, group: str, stage: Stage | None = None) -> tuple[float, int]:
    """(share, shard) of a group on one GPU: the fraction of its parameters on a stage's tp rank (the busiest
    stage's without one: _stage_share; routed experts: 1 / ep of them, split over the experts' tp degree) and the
    ranks its ZeRO states split over (the shard group; routed experts: expert_shard)."""
    share = _stage_share(group, layout, spec.architecture.num_layers, spec.architecture, stage)
    if group == EXPERT_GROUP:  # num_experts / ep experts a rank (whole, or split over tp), sharded over edp ranks
        return share * layout.expert_rows_split / layout.ep, expert_shard(layout)
    return share, layout.shard_degree


_HEAVIEST: dict[tuple, tuple[object, Stage | None]] = {}  # (id(spec), pp, tp, ep, expert rows) -> (spec, stage)


def heaviest_stage(spec: ModelSpec, layout: Layout) -> Stage | None:
    """The pipeline stage (of pipeline_stages) whose tensor-parallel rank holds the most parameters: the one whose
    gradients the data-parallel collectives carry longest and whose optimizer step takes longest (ddplan.step prices
    both on it, not on the most layers with both the embeddings and the head, which no stage holds but ZB-V's first,
    where they are; its compute is
    the slowest stage's, ddplan.step._busiest_stage). None without a pipeline. e.g. Llama 3.1 405B over pp 16: a
    middle stage, 8 layers of 3.19B (25.5B), over the last (7 layers and the 2.1B-parameter head, 24.4B); Llama 3 8B
    over pp 4: the first, 8 layers and the 0.53B embedding table (the last's head is as large: the first is kept)."""
    if layout.pp == 1:
        return None
    key = (id(spec), layout.pp, layout.pp_schedule == "zb_v", layout.tp, layout.ep, layout.expert_rows_split)
    known = _HEAVIEST.get(key)
    if known is not None and known[0] is spec:
        return known[1]
    if len(_HEAVIEST) >= 256:
        _HEAVIEST.clear()
    counts = counts_of(spec.architecture)
    groups = [g for g, n in counts.items() if n and g in spec.recipe.optimizer.algorithm]
    stage = max(pipeline_stages(layout, spec.architecture),
                key=lambda st: sum(counts[g] * state_share(spec, layout, g, st)[0] for g in groups))
    _HEAVIEST[key] = (spec, stage)
    return stage


def expert_shard(layout: Layout) -> int:
    """Ranks the routed experts' ZeRO shards split over: the expert-data-parallel ranks (Layout.expert_ranks),
    or, with hybrid sharding, the shard group's share of them (shard group x expert rows split / ep)."""
    if layout.shard_group:
        return max(1, layout.shard_group * layout.expert_rows_split // layout.ep)
    return layout.expert_ranks


def _muon_chunk_fraction(spec: ModelSpec, group: str, dp: int) -> float:
    """Share of a Muon group's state on the busiest rank: ceil(K/N)/K per stack of K same-shape matrices.

    Ref: nanochat optim.py @92d63d4 l.214-246 (grads stacked by shape, zero-padded to ceil(K/N) N).
    """
    mats = Counter(muon_matrices(spec, group))
    total = sum(r * c * k for (r, c), k in mats.items())
    busiest = sum(r * c * math.ceil(k / dp) for (r, c), k in mats.items())
    return busiest / total


def in_flight_micro_batches(layout: Layout, stage: int = 0, w_share: float = 1.0) -> float:
    """Micro-batches whose activations pipeline stage `stage` (0: the first) holds at once, in micro-batches of the
    whole stage.

    1F1B: min(p - stage, m). Interleaved with v chunks a stage: Megatron-Core's warm-up forwards,
    (p - stage - 1) x 2 + (v - 1) x p chunks, and the one steady-state forward before the first backward, at most
    the step's m x v chunks, over v: (p v + p - 1) / v on the first stage, Korthikanti et al.'s p (1 + (p-1)/(p v)),
    and 2/v fewer on each later one (not 1 + (p-1)/(p v) fewer: ddplan's count until 2026-12-07, eighth session).
    e.g. p 16, v 8, m 384: 143 / 8 = 17.875 on the first stage, 141 / 8 = 17.625 on the second (Megatron's 141 chunk
    forwards there; 16.76 before).
    Zero-bubble schedules (Qi et al., arXiv 2401.10241, sec. 2.3): stage i (from 1) holds (p - i + 1) M_B + (i - 1)
    M_W under ZB-H1 and (2p - 2i + 1) M_B + (2i - 2) M_W under ZB-H2, each count at most the step's m; M_W, what a
    delayed W pass keeps (its GEMMs' inputs and output gradients), is w_share of M_B (w_pass_share: Table 1's
    32 s b h of 34 s b h + 5 a s^2 b, 0.37-0.43 with the paper's unfused attention).
    ZB-V holds p M_B on every stage (sec. 6): min(p, m). e.g. ZB-H1, p 4, m 8, w_share 0.4: 4, 3.4, 2.8, 2.2.
    Ref: Megatron-Core schedules.py@2a75ac1 get_pp_rank_microbatches (microbatch_group_size_per_vp_stage = p, its
    default); Korthikanti et al., arXiv 2205.05198, sec. 4.2.3; Narayanan et al., arXiv 2104.04473, sec. 2.2.
    """
    p, m = layout.pp, layout.grad_accum
    if p == 1:
        return 1.0
    if layout.pp_schedule == "zb_v":
        return float(min(p, m))
    if layout.pp_schedule in ("zb_h1", "zb_h2"):
        b = min((p - stage) if layout.pp_schedule == "zb_h1" else (2 * p - 2 * stage - 1), m)
        w = min(stage if layout.pp_schedule == "zb_h1" else 2 * stage, m - b)
        return b + w * w_share
    if layout.pp_schedule == "interleaved":
        v = layout.pp_virtual_stages
        return min((p - stage - 1) * 2 + (v - 1) * p + 1, m * v) / v
    return float(min(p - stage, m))


def resident_layer_share(layout: Layout, num_layers: int) -> float:
    """The share of the layers' saved activations on the GPU at the end of forward under activation offload of the
    first N layers (layout.offload_activations): (L - N) / L. Transformer Engine's offload schedule finishes layer i's
    copy to the host before layer L - N + i runs forward and starts its reload after layer L - 1 - N + i's backward,
    so with every layer saving T bytes the peak of the saved activations is (L - N) x T; the layers' mean T is taken
    where they differ. 1 without offload. e.g. 126 layers, 95 offloaded: 31 / 126 = 0.246.
    Ref: NVIDIA/TransformerEngine transformer_engine/pytorch/cpu_offload.py@00382b96
    OffloadSynchronizer._default_offload_sync_init (its docstring: "peak memory usage of saving activations is
    (num_layers - num_offloaded_layers) * T"); Megatron-Core passes cpu_offloading_num_layers to it
    (transformer_block.py@d98e8a6 L304-316)."""
    n = layout.offload_activations
    if not n:
        return 1.0
    if not 0 < n < num_layers:
        raise ValueError(f"offloaded layers must be in 1..{num_layers - 1}, got {n}")
    return (num_layers - n) / num_layers


def offloaded_bytes(anatomy: Anatomy, layout: Layout, num_layers: int) -> float:
    """Bytes of saved activations one micro-batch copies to the host in forward (and back in backward) under
    activation offload: the layers' saved bytes as activation_bytes counts them, times N / L (the share
    resident_layer_share leaves off the GPU). 0 without offload."""
    if not layout.offload_activations:
        return 0.0
    return _held_split(anatomy, layout)[0] * (1 - resident_layer_share(layout, num_layers))


def _held_split(anatomy: Anatomy, layout: Layout) -> tuple[float, float, float]:
    """(layers, embedding, head) saved bytes a rank holds: the anatomy's, less the per-micro-batch weight casts under
    ZeRO-3 (activation_bytes says why)."""
    layers, (embedding, head) = anatomy.saved_split[0], anatomy.outside_split
    if layout.zero == 3:
        casts = anatomy.weight_cast_split
        return layers - casts[0], embedding - casts[1], head - casts[2]
    return layers, embedding, head


def activation_bytes(anatomy: Anatomy, layout: Layout, num_layers: int,
                     stage: Stage | None = None) -> tuple[float, float]:
    """(saved, transient) activation bytes on one GPU of a pipeline stage (one of pipeline_stages; None: the
    largest of them): the anatomy (already one tp rank's share) over pp; the transient is backward's largest
    working set: an op's gradients plus what recompute has brought back then.

    The first stage holds its layers and the embeddings' saved tensors for each of its in-flight micro-batches;
    the last stage its layers for each of its own and the head's (final norm, logits, loss) for one; a middle
    stage its layers only. Where pp does not divide the layers (ddplan.pipeline.stage_layers) the end stages have
    fewer of them, and the second stage, holding one micro-batch fewer than the first with the most layers, may
    hold more. Ref: Narayanan et al., arXiv 2104.04473, sec. 2.2 (1F1B: stage i holds
    p - i micro-batches); Korthikanti et al., arXiv 2205.05198, sec. 4.2.3 (the first stage's activations).

    ZeRO-3 runs its matmuls on the gathered 16-bit weights (FSDP's mixed precision: the shard is cast, then
    all-gathered; no autocast), which comm_buffer_bytes counts: the per-micro-batch weight casts the anatomy
    saves under autocast (Anatomy.weight_cast_split) are not held. Ref: torch.distributed.fsdp
    MixedPrecisionPolicy(param_dtype); torchtitan distributed/utils.py@238fa99 L243-264 (maybe_enable_amp: no
    autocast when FSDP is on); ZeRO (arXiv 1910.02054) sec. 5 (16-bit parameters gathered per layer).
    """
    stages = (stage,) if stage is not None else (  # the anatomy's layers are alike
        _v_stages(num_layers, layout.pp) if layout.pp_schedule == "zb_v" else _stages(num_layers, layout.pp))
    saved, transient = stage_activation_bytes(anatomy, layout, num_layers, stages)
    return max(saved), transient


def stage_activation_bytes(anatomy: Anatomy, layout: Layout, num_layers: int,
                           stages: tuple[Stage, ...]) -> tuple[tuple[float, ...], float]:
    """((saved bytes of each of `stages`), transient): activation_bytes for several stages at once (a search asks
    for every stage of pipeline_stages). Without a pipeline, the one stage's (activation offload included)."""
    if anatomy.tp != layout.tp:
        raise ValueError(f"the anatomy is for tp={anatomy.tp}, the layout has tp={layout.tp}")
    layer_bytes, embedding, head = _held_split(anatomy, layout)
    transient = anatomy.backward_transient_bytes()
    if layout.pp == 1:  # activation offload (pp 1 only): the first N layers' saves wait in host memory
        return (layer_bytes * resident_layer_share(layout, num_layers) + embedding + head,) * len(stages), transient
    # the head's saves (final norm, logits, loss) for one micro-batch: the last stage runs a micro-batch's backward
    # right after the forward that reaches the loss, in 1F1B and interleaved alike (its other in-flight micro-batches
    # wait in earlier chunks)
    w_share = w_pass_share(anatomy, layer_bytes) if layout.pp_schedule in ("zb_h1", "zb_h2") else 1.0
    saved = tuple((layer_bytes * s.layers / num_layers + (embedding if s.embedding else 0.0))
                  * in_flight_micro_batches(layout, stage=s.index, w_share=w_share) + (head if s.head else 0.0)
                  for s in stages)
    # the working set is the whole model's (the head's logits gradient included) on every stage: conservative
    # (per stage, the head's gradients on the last stage only, is not done: the blocks' ops carry no gradient
    # working set in the anatomy (transient 0), so a stage without the head would have none at all)
    return saved, transient


def w_pass_share(anatomy: Anatomy, layer_bytes: float) -> float:
    """M_W / M_B of the zero-bubble schedules: what a delayed W pass keeps of a micro-batch's layers, each layer GEMM's
    input (once where GEMMs share it, as saved: a sequence-parallel rank's shard, which Megatron gathers again for the
    weight gradient; an fp8 copy's byte) and its output gradient (every row, this rank's columns, in the compute
    dtype), over the layers' saved bytes (layer_bytes, M_B). Not capped: under full recompute a block saves its input
    alone while W keeps what backward brought back, which the paper does not analyse (priced as kept, many times
    M_B). e.g. a GPT block with the paper's unfused attention: Table 1's 32 s b h over 34 s b h + 5 a s^2 b is
    0.366 for its 1.5B model at s 1024 (h 2304, a 24) and 0.432 for its 6.2B-28.3B (head dim 128), as ddplan's own
    count of the block's saves gives too; Llama 3 8B with fused attention at s 8192: 0.585.
    Ref: Qi et al., arXiv 2401.10241, sec. 2.3, Table 1 (M_W = 32 s b h, W's inputs and output gradients)."""
    if layer_bytes <= 0:
        return 1.0
    kept, inputs = 0.0, set()
    for op, n in anatomy.op_repeats:
        if op.kind != "gemm" or op.layer is None or not op.saves:
            continue
        _, cols, depth = op.shape
        rows = op.flops_fwd / (2.0 * cols * depth)  # every row of a grouped GEMM, not one expert's
        x = op.saves[0]  # its input, kept once where GEMMs share it (separate Q, K and V read one norm output)
        kept += n * rows * cols * anatomy.elem_bytes + (n * x.bytes if (x.name, op.layer) not in inputs else 0.0)
        inputs.add((x.name, op.layer))
    return kept / layer_bytes


def fixed_terms(spec: ModelSpec, layout: Layout, states: dict[str, dict[str, float]],
                assumptions: MemoryAssumptions = MemoryAssumptions(), stage: Stage | None = None,
                fp8_bytes: float = FP8_PARAM_BYTES) -> dict[str, float]:
    """memory_per_gpu's terms that depend on neither the micro-batch nor the recompute policy, bytes per GPU:
    params, gradients, optimizer (each summed over the groups of `states`, the layout's model_states),
    comm_buffers (comm_buffer_bytes) and framework (outside_allocator_bytes), in memory_per_gpu's order. A search
    computes them once for the layouts that differ only in those (ddplan.price.Pricer)."""
    return {"params": sum(states["params"].values()), "gradients": sum(states["gradients"].values()),
            "optimizer": sum(states["optimizer"].values()),
            "comm_buffers": comm_buffer_bytes(spec, layout, states, assumptions, stage, fp8_bytes),
            "framework": outside_allocator_bytes(layout, assumptions)}


def memory_per_gpu(spec: ModelSpec, layout: Layout, anatomy: Anatomy | None, capacity_bytes: float,
                   assumptions: MemoryAssumptions = MemoryAssumptions(),
                   states: dict[str, dict[str, float]] | tuple[dict[str, dict[str, float]], ...] | None = None,
                   headroom: float = HEADROOM, fixed: dict[str, float] | tuple[dict[str, float], ...] | None = None,
                   activations: tuple | None = None, stage: Stage | None = None) -> MemoryBreakdown:
    """Peak bytes per GPU over a training step, by term: of one pipeline stage (`stage`), or, with a pipeline and
    no stage, of the fullest of pipeline_stages, each with its own model states, buffers and saved activations (a
    stage is not paired with layers, embeddings or a head it does not hold).

    Peak = params + gradients + optimizer state + max(activations saved + gradient transients,
    optimizer-step transients) + communication buffers + framework overhead + allocator slack.
    Gradients count in full from the first micro-batch on (accumulation keeps them live).
    states, fixed and activations: the layout's model_states, fixed_terms and activation_bytes(anatomy, ...),
    passed when a caller keeps them (a search); the anatomy is read only when activations are not given. With a
    pipeline and no stage, each a tuple over pipeline_stages (activations: (the stages' saved bytes, transient)).
    """
    if layout.pp > 1 and stage is None:
        if isinstance(states, dict) or isinstance(fixed, dict) or (activations is not None
                                                                  and not isinstance(activations[0], tuple)):
            raise ValueError("with a pipeline, pass states, fixed and activations per stage (tuples over "
                             "pipeline_stages), or a stage")
        stages = pipeline_stages(layout, spec.architecture)
        if states is not None and fixed is not None and activations is not None \
                and spec.recipe.distribution != "sharded_optimizer":  # a search's cached terms: each stage's total
            saved, transient = activations  # as _stage_terms sums it, less the building (its transient term as given)
            slack = assumptions.allocator_fraction
            totals = [sum(f.values()) + s + transient + slack * (s + transient) for f, s in zip(fixed, saved)]
            i = totals.index(max(totals))
            terms, notes, states = _stage_terms(spec, layout, anatomy, assumptions, states[i], fixed[i],
                                                (saved[i], transient), stages[i])
            return MemoryBreakdown(terms=terms, by_group=states, capacity=capacity_bytes, notes=notes,
                                   headroom_fraction=headroom)
        best = None  # (total, the stage's terms, notes, states): the first of the fullest
        for i, s in enumerate(stages):
            got = _stage_terms(spec, layout, anatomy, assumptions, states[i] if states is not None else None,
                               fixed[i] if fixed is not None else None,
                               (activations[0][i], activations[1]) if activations is not None else None, s)
            total = sum(got[0].values())
            if best is None or total > best[0]:
                best = (total, *got)
        terms, notes, states = best[1:]
    else:
        terms, notes, states = _stage_terms(spec, layout, anatomy, assumptions, states, fixed, activations, stage)
    # by_group is the states mapping itself (a search shares it across layouts): read it, never write it
    return MemoryBreakdown(terms=terms, by_group=states, capacity=capacity_bytes, notes=notes,
                           headroom_fraction=headroom)


def _stage_terms(spec: ModelSpec, layout: Layout, anatomy: Anatomy | None, assumptions: MemoryAssumptions,
                 states: dict[str, dict[str, float]] | None, fixed: dict[str, float] | None,
                 activations: tuple[float, float] | None,
                 stage: Stage | None) -> tuple[dict[str, float], tuple[str, ...], dict[str, dict[str, float]]]:
    """memory_per_gpu of one stage: (terms, notes, model states)."""
    states = model_states(spec, layout, stage) if states is None else states  # a search passes them cached
    fixed = fixed_terms(spec, layout, states, assumptions, stage) if fixed is None else fixed
    saved, transient = activations or activation_bytes(anatomy, layout, spec.architecture.num_layers, stage)
    terms = {
        "params": fixed["params"],
        "gradients": fixed["gradients"],
        "optimizer": fixed["optimizer"],
        "activations": saved,
        "activation_transient": transient,
    }
    notes = []
    if spec.recipe.distribution == "sharded_optimizer" and layout.grad_ranks > 1:
        # nanochat stacks each Muon group's gradients into one fp32 buffer for reduce_scatter (optim.py
        # l.214-246): about one more copy of the Muon gradients, alive during step() only.
        stacked = sum(v for g, v in states["gradients"].items() if spec.recipe.optimizer.algorithm[g] == "muon")
        if stacked > saved + transient:
            notes.append("peak is in the optimizer step (stacked Muon gradients), not in backward")
        terms["activation_transient"] = max(transient, stacked - saved)
    if layout.offload_optimizer:
        notes.append("optimizer states (and fp32 master weights) are in host memory (--offload-optimizer)")
    terms["comm_buffers"] = fixed["comm_buffers"]
    terms["framework"] = fixed["framework"]
    terms["allocator_slack"] = assumptions.allocator_fraction * (saved + transient)
    return terms, tuple(notes), states


def outside_allocator_bytes(layout: Layout, assumptions: MemoryAssumptions = MemoryAssumptions()) -> float:
    """Bytes per GPU outside torch's caching allocator: the CUDA/HIP context, workspaces and loaded kernels
    (framework_gib), and NCCL/RCCL's own buffers (comm_gib) when the job has more than one GPU. memory_per_gpu's
    `framework` term: a device tool (nvidia-smi) counts it, torch's allocated and reserved figures do not.
    e.g. 8 GPUs at the defaults: (1.0 + 0.25) GiB = 1,342,177,280 bytes; one GPU: 1 GiB."""
    return (assumptions.framework_gib + (assumptions.comm_gib if layout.num_gpus > 1 else 0.0)) * GiB


# What each kind of measured peak counts of memory_per_gpu's terms: torch's allocated peak
# (max_memory_allocated) counts tensors only; reserved (max_memory_reserved) adds the caching allocator's slack;
# a device tool (nvidia-smi, rocm-smi) adds what lives outside the allocator (`framework`: the CUDA/HIP context,
# kernels, NCCL's buffers). Ref: PyTorch docs, torch_cuda_memory.rst and "CUDA semantics: memory management".
NOT_COUNTED = {"allocated": ("framework", "allocator_slack"), "reserved": ("framework",), "device": ()}
PEAK_KINDS = tuple(NOT_COUNTED)


def predicted_peak_bytes(terms: dict[str, float], what: str) -> float:
    """The predicted peak in a measurement's terms: memory_per_gpu's terms less those `what` does not count
    (NOT_COUNTED). e.g. terms params 60, activations 16, allocator_slack 2, framework 4: allocated 76, reserved 78,
    device 82."""
    if what not in NOT_COUNTED:
        raise ValueError(f"what must be one of {', '.join(NOT_COUNTED)}, got {what!r}")
    return sum(v for k, v in terms.items() if k not in NOT_COUNTED[what])


def comm_buffer_bytes(spec: ModelSpec, layout: Layout, states: dict[str, dict[str, float]],
                      assumptions: MemoryAssumptions = MemoryAssumptions(), stage: Stage | None = None,
                      fp8_bytes: float = FP8_PARAM_BYTES) -> float:
    """Communication buffers per GPU that torch allocates, bytes: DDP's gradient bucket copy (ZeRO-0) or ZeRO-1's
    reduce buckets, and ZeRO-3's gathered parameters (two FSDP units, or every layer of the stage without
    resharding after forward or under a pipeline, which also holds the stage's unsharded gradients), the fp8 GEMMs'
    weights at 1 byte with torchao's fp8 all-gather and at fp8_bytes with Megatron-FSDP's fp8 weights (fp8_params,
    as model_states keeps them); NCCL's own buffers are outside_allocator_bytes'. Depends on the layout and its model
    states only (not on the micro-batch, the recompute policy or the anatomy): memory_per_gpu's comm_buffers term.
    """
    comm = 0.0
    if layout.grad_ranks > 1 and layout.zero == 0:
        # torch DDP's reducer keeps its buckets apart from .grad (gradient_as_bucket_view=False, the
        # default): one more copy of every gradient (DistributedDataParallel docs)
        comm += sum(states["gradients"].values())
    elif layout.grad_ranks > 1 and layout.zero == 1 and spec.recipe.distribution == "zero1":
        comm += 2 * assumptions.bucket_mb * MiB
    if layout.zero == 3 and (layout.grad_ranks > 1 or expert_shard(layout) > 1):
        # two FSDP units (the current layer and the prefetched next) gathered in compute dtype; without
        # resharding after forward every layer's gathered parameters stay until its backward
        # (torch FSDP2 fully_shard(reshard_after_forward=False))
        layers_here = stage.layers if stage is not None else max(
            1, round(_busiest_stage_share(layout, spec.architecture.num_layers) * spec.architecture.num_layers))
        cb = dtype_bytes(spec.dtypes.compute)
        # each group's elements on this rank's stage, unsharded: its shard over its own shard group (the routed
        # experts' is the expert-data-parallel one)
        fp8 = fp8_weight_fractions(spec) if layout.fp8_all_gather or layout.fp8_params else {}
        kept = {g: kept_param_bytes(dtype_bytes(spec.dtypes.params[g]), fp8.get(g, 0.0) if layout.fp8_params else 0.0,
                                    fp8_bytes) for g in states["params"]}  # bytes an element, as model_states keeps it
        elements = {g: b / kept[g] * (expert_shard(layout) if g == EXPERT_GROUP else layout.shard_degree)
                    for g, b in states["params"].items()}
        # the fp8 GEMMs' weights arrive at 1 byte an element with torchao's fp8 all-gather, at fp8_bytes with
        # Megatron-FSDP's fp8 weights
        got = fp8_bytes if layout.fp8_params else 1.0
        gathered = sum(e * (cb - (cb - got) * fp8.get(g, 0.0)) for g, e in elements.items())  # the stage's, gathered
        if layout.pp > 1:
            # under a pipeline (torch.distributed.pipelining's FSDP2, ddplan.comm.fsdp_pipelined_comm_s) no backward
            # reshards (set_reshard_after_backward(False)): the whole stage stays gathered, and its gradients add up
            # unsharded until the step's one reduce-scatter, in the reduce dtype (to_accumulated_grad_if_needed
            # casts the first when it differs from the compute dtype)
            comm += gathered + sum(e * spec.dtypes.reduce_bytes(g) for g, e in elements.items())
        else:
            per_layer = gathered / layers_here
            comm += (2 if layout.reshard_after_forward else layers_here) * per_layer
            if layout.fsdp2:
                comm += fsdp2_reduce_scatter_buffer_bytes(spec, elements, layers_here)
    return comm


def fsdp2_reduce_scatter_buffer_bytes(spec: ModelSpec, elements: dict[str, float], stage_layers: int) -> float:
    """The reduce-scatter input torch FSDP2 keeps from one unit's backward to the next's, bytes: the larger of a
    block unit's unsharded elements (the stage's, `elements` by group, less the head, over its layers) and the head's
    (the output layer, its own unit: torchtitan shards [norm, lm_head] together, distributed/fsdp.py@b5bcd76
    L261-262; reduced first in backward, its buffer stands through the last block's backward, when every activation
    does), in the reduce dtype. FSDP2 copies each unit's gradients into a new flat buffer of
    the reduce dtype (foreach_reduce: reduce_scatter_comm.allocate(..., dtype=reduce_dtype) on the compute stream,
    torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py in torch 2.13.0, L597-606, the 16-bit gradients freed
    after the copy-in) and keeps it in comm_ctx.reduce_scatter_states, at most max_input_buffers of them (default 1),
    the oldest released at the next unit's post_backward (_fsdp_param_group.py L229, L654-658, L717-718). The flat
    all-gather output, the other buffer beside the unsharded tensors, is not added: in backward it is freed at the
    copy-out, before the prefetched unit's parameters take its place (L487-489), and in forward it lives with its own
    unit's parameters while no unit is prefetched (L430-432, L483), two units' worth as comm_buffer_bytes counts. Under
    a pipeline (pp > 1) the one reduce-scatter runs after the last backward, when the activations are gone: not at the
    peak, not added. The embeddings (EMBEDDING_GROUPS) are their own unit (torchtitan shards tok_embeddings apart,
    distributed/fsdp.py@b5bcd76), reduced last, when the activations are gone: not spread over the blocks.
    e.g. llama-3-8b, fp32 reduce: the head's 128,256 x 4,096 elements x 4 B = 2.1 GB a GPU, over a block unit's
    218,112,000 (+ its norms' 8,192) x 4 B = 0.87 GB."""
    head = sum(e * spec.dtypes.reduce_bytes(g) for g, e in elements.items() if g in HEAD_GROUPS)
    blocks = sum(e * spec.dtypes.reduce_bytes(g) for g, e in elements.items()
                 if g not in HEAD_GROUPS and g not in EMBEDDING_GROUPS)
    return max(head, blocks / stage_layers)


def state_floor_bytes(spec: ModelSpec, layout: Layout, states: dict[str, dict[str, float]],
                      assumptions: MemoryAssumptions = MemoryAssumptions()) -> float:
    """A lower bound on memory_per_gpu(...).total, bytes, that needs no anatomy: params + gradients + optimizer
    + comm_buffers + framework, summed in memory_per_gpu's order with its activation terms left out.

    Exact as a bound, in floating point too: the total adds the same terms in the same order plus three more
    (activations, activation_transient, allocator_slack), each >= 0 (saved bytes and the largest gradient
    working set are >= 0, the transient term is max(transient, ...) >= transient, and the slack is
    allocator_fraction x (saved + transient) >= 0 when allocator_fraction >= 0). Rounding is monotone
    (a <= b gives fl(a + c) <= fl(b + c), and fl(a + c) >= a for c >= 0), so each partial sum of the total is
    >= the bound's. It depends on neither the micro-batch nor the recompute policy, so when it is over a
    limit no layout that differs only in those fits (ddplan.plan rejects such a group without building an
    anatomy). With a negative allocator_fraction no bound is claimed (-inf).
    """
    return floor_bytes(fixed_terms(spec, layout, states, assumptions), assumptions)


def floor_bytes(fixed: dict[str, float], assumptions: MemoryAssumptions = MemoryAssumptions()) -> float:
    """state_floor_bytes from the layout's fixed_terms: their sum in memory_per_gpu's order (-inf with a negative
    allocator_fraction, where no bound is claimed)."""
    if assumptions.allocator_fraction < 0:
        return float("-inf")
    return sum(fixed.values())
