"""A parallel layout: how one training step is split over GPUs, and the rules it must satisfy."""

from __future__ import annotations

import dataclasses
import functools
import operator
from dataclasses import dataclass

from ddplan.anatomy import UNFUSED_KINDS
from ddplan.errors import LayoutError
from ddplan.pipeline import SCHEDULES, ZERO_BUBBLE, stage_layers, v_chunks
from ddplan.runfields import grad_bucket_rule, recompute_layers, recompute_policy
from ddplan.specs import ModelSpec

ZERO_STAGES = (0, 1, 2, 3)

# fp8 weights gathered in fp8 asked two ways at once (Layout, ddplan.table.check_fp8_options)
FP8_WEIGHTS_TWICE = ("--fp8-params (Megatron-Core's fp8 weights) and --fp8-all-gather (torchao's) are two stacks' ways "
                     "of the same thing: give one")

# The ZeRO stage whose memory a model's native data-parallel setup matches.
NATIVE_ZERO = {"ddp": 0, "sharded_optimizer": 1, "zero1": 1, "zero2": 2, "fsdp": 3}


def offload_applies(zero: int, grad_ranks: int) -> bool:
    """Whether optimizer offload can apply: ZeRO >= 1 partitions the optimizer state (Ren et al., ZeRO-Offload,
    sec. 4.3), or one data-parallel rank owns all of it (sec. 4.2), where the stages coincide."""
    return zero >= 1 or grad_ranks == 1


# the layout families plan compares and reasons about (ddplan.plan.family)
FAMILIES = ("pure DP", "+ZeRO/FSDP", "+TP", "+CP", "+PP")

CP_MIN_TOKENS = 4096  # assumed: a context-parallel rank keeps at least this many tokens of a sequence


def context_parallel_degrees(seq_len: int) -> tuple[int, ...]:
    """The cp degrees plan searches at a sequence length: 1, and each of 2..16 (powers of two) that leaves a
    rank at least CP_MIN_TOKENS tokens and splits the sequence into 2 cp balanced chunks.
    e.g. 2048: (1,); 8192: (1, 2); 131072: (1, 2, 4, 8, 16)."""
    return (1, *(c for c in (2, 4, 8, 16) if seq_len // c >= CP_MIN_TOKENS and seq_len % (2 * c) == 0))


# the model chunks a stage runs under each schedule (pipeline.SCHEDULES): the rule on Layout.pp_virtual_stages, in words
CHUNKS_RULE = {"1f1b": (lambda v: v == 1, "one chunk"), "interleaved": (lambda v: v > 1, "more than one chunk"),
               "zb_h1": (lambda v: v == 1, "one chunk"), "zb_h2": (lambda v: v == 1, "one chunk"),
               "zb_v": (lambda v: v == 2, "two chunks (a V: Qi et al., arXiv 2401.10241, sec. 6)")}


def schedule_for(schedule: str | None, vp: int) -> tuple[str, int]:
    """(Layout.pp_schedule, chunks a stage) of a schedule as a run states it (None: 1F1B, interleaved when vp > 1;
    '-' or '_' alike) and its vp: ZB-V runs two chunks a stage and interleaving at least two, so vp 1 (unstated)
    means 2 there (torchtitan's default for a looped schedule).
    e.g. (None, 1) -> ('1f1b', 1); (None, 4) -> ('interleaved', 4); ('zb-v', 1) -> ('zb_v', 2);
    ('interleaved', 1) -> ('interleaved', 2)."""
    if schedule is None:
        return ("interleaved" if vp > 1 else "1f1b"), vp
    name = schedule.replace("-", "_")
    return name, (2 if name in ("zb_v", "interleaved") and vp == 1 else vp)


@dataclass(frozen=True)
class Layout:
    """Degrees of parallelism and per-GPU work for one training step.

    dp x tp x pp x cp = num_gpus. micro_batch: sequences per data-parallel rank per forward/backward
    (a context-parallel group of cp GPUs shares each sequence, 1/cp each); grad_accum: micro-batches per
    optimizer step (per pipeline: pipeline micro-batches). zero: which model states are sharded over the
    dp x cp ranks that hold the same parameters (0 none, 1 optimizer state, 2 + gradients, 3 + parameters).
    """

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1  # context parallelism: each sequence split over cp GPUs (ring attention)
    zero: int = 0
    micro_batch: int = 1
    grad_accum: int = 1
    attention: str = "sdpa-fused"  # an implementation name from the hardware spec
    recompute: str = "none"
    compiled: bool = False
    pp_schedule: str = "1f1b"  # ddplan.pipeline.SCHEDULES: 1f1b, interleaved (vp > 1), zb_h1, zb_h2, zb_v (vp 2)
    pp_virtual_stages: int = 1
    tp_overlap: bool = False  # tensor-parallel communication overlapped with GEMMs (Megatron --tp-comm-overlap)
    sequence_parallel: bool = False  # Megatron sequence parallelism over the tp group (needs tp > 1)
    shard_group: int = 0  # ZeRO-3 hybrid sharding: shard over this many dp ranks, replicate across the rest (0: all dp)
    # hybrid sharding: the replicas' gradient all-reduce once a step, after the last micro-batch (torch FSDP2
    # set_requires_all_reduce(False) on the others, as OLMo-core does), not after every micro-batch (FSDP2's default)
    replica_reduce_once: bool = False
    reshard_after_forward: bool = True  # ZeRO-3: free gathered parameters after forward, gather again in backward
    # ZeRO-3 as torch FSDP2 runs it (fully_shard: per-parameter shards): its all-gathers' outputs copied out into
    # the parameters and its gradients into the reduce-scatter buffer, on the compute stream (step.fsdp2_copy_bytes)
    fsdp2: bool = False
    # a checkpointed region's last op is not re-run in backward (torch's non-reentrant checkpoint, early_stop=True by
    # default); False: the region re-runs whole (reentrant checkpoints: Megatron's, DeepSpeed's, Transformer
    # Engine's; torchtitan's early_stop=False). ddplan.anatomy.rerun_whole
    recompute_early_stop: bool = True
    overlap_param_gather: bool = False  # ZeRO-1/2: the post-step parameter all-gather under the next forward (Megatron)
    # ZeRO 0-2: gradients reduced bucket by bucket beside backward (torch DDP, Megatron-Core --overlap-grad-reduce);
    # False: after the last backward, exposed (Megatron-LM's default); ZeRO-3 always reduces beside backward
    overlap_grad_reduce: bool = True
    # ZeRO 0-2 reducing beside backward: how the gradients are bucketed (ddplan.comm.grad_buckets: "megatron",
    # "chunk" or the parameters a bucket as digits); "group": one collective a parameter group, torch DDP's last bucket
    grad_bucket: str = "group"
    cp_comm: str = "ring"  # with cp: "ring" (p2p KV exchange overlapped with attention) or "all_gather"
    ep: int = 1  # expert parallelism: routed experts split over ep of the dp x cp ranks (Megatron-Core)
    etp: int = 0  # expert tensor parallelism: 0 = tp (the experts split over tp like the dense MLP), or 1
    fp8_all_gather: bool = False  # ZeRO-3: fp8 GEMMs' weights gathered in fp8 (torchao enable_fsdp_float8_all_gather)
    offload_optimizer: bool = False  # ZeRO >= 1: optimizer states on the host, Adam on the CPU (ZeRO-Offload)
    # ZeRO-1/2/3: the fp8 GEMMs' weights kept in fp8 and all-gathered in fp8 (Megatron-Core --fp8-param-gather, with
    # the distributed optimizer or Megatron-FSDP)
    fp8_params: bool = False
    # the first N layers' saved activations copied to host memory in forward and back for backward (Megatron-Core
    # --cpu-offloading-num-layers, NeMo activation_offload_layers; pp 1): ddplan.memory.activation_bytes, step.py
    offload_activations: int = 0

    def __post_init__(self) -> None:
        if (self.dp < 1 or self.tp < 1 or self.pp < 1 or self.cp < 1 or self.ep < 1 or self.micro_batch < 1
                or self.grad_accum < 1 or self.pp_virtual_stages < 1):  # a search makes ~35,000: the named test below
            bad = {k: getattr(self, k) for k in ("dp", "tp", "pp", "cp", "ep", "micro_batch", "grad_accum",
                                                 "pp_virtual_stages")
                   if getattr(self, k) < 1}
            raise LayoutError("must be >= 1: " + ", ".join(f"{k}={v}" for k, v in bad.items()))
        if self.zero not in ZERO_STAGES:
            raise LayoutError(f"zero stage must be one of {ZERO_STAGES}, got {self.zero}")
        if self.pp_schedule not in SCHEDULES:
            raise LayoutError(f"pipeline schedule must be one of {', '.join(SCHEDULES)}, got {self.pp_schedule!r}")
        runs, chunks = CHUNKS_RULE[self.pp_schedule]
        name = self.pp_schedule.replace("_", "-")  # as --schedule spells it
        if not runs(self.pp_virtual_stages):
            raise LayoutError(f"the {name} schedule runs {chunks} a pipeline stage; got {self.pp_virtual_stages}",
                              field="--vp")
        if self.pp_schedule in ZERO_BUBBLE and self.pp == 1:
            raise LayoutError(f"the {name} schedule needs pipeline parallelism (pp > 1), got pp 1", field="--schedule")
        if self.pp_virtual_stages > 1 and self.pp == 1:
            raise LayoutError(f"interleaving ({self.pp_virtual_stages} chunks per stage) needs pipeline parallelism "
                              f"(pp > 1), got pp 1")
        if (self.sequence_parallel or self.tp_overlap) and self.tp == 1:
            raise LayoutError("sequence parallelism and tensor-parallel overlap need tp > 1")
        if self.tp_overlap and not self.sequence_parallel:
            raise LayoutError("tensor-parallel communication overlap (Megatron-Core --tp-comm-overlap) needs sequence "
                              "parallelism: add --sequence-parallel")
        if self.shard_group < 0 or self.shard_group and (
                self.zero != 3 or self.grad_ranks % self.shard_group or self.shard_group in (1, self.grad_ranks)):
            raise LayoutError(f"hybrid sharding needs ZeRO-3 and a shard group that divides dp x cp={self.grad_ranks}, "
                              f"between 2 and half of it; got ZeRO-{self.zero}, shard group {self.shard_group}",
                              field="--shard-group")
        if self.replica_reduce_once and not self.shard_group:
            raise LayoutError("an all-reduce across replicas once a step needs hybrid sharding (a ZeRO-3 shard group "
                              "below dp): without replicas there is nothing to all-reduce", field="--replica-reduce-once")
        if self.overlap_param_gather and self.zero not in (1, 2):
            raise LayoutError(f"overlapping the parameter all-gather with forward (Megatron-Core --overlap-param-gather) "
                              f"needs ZeRO-1 or 2 (the distributed optimizer); got ZeRO-{self.zero}", field="--overlap-param-gather")
        if not self.overlap_grad_reduce and self.zero == 3:
            raise LayoutError("ZeRO-3 (FSDP) reduce-scatters each unit's gradients during backward: its gradient reduce is "
                              "always overlapped", field="--no-overlap-grad-reduce")
        if not self.reshard_after_forward and self.zero != 3:
            raise LayoutError(f"keeping gathered parameters from forward to backward is a ZeRO-3 option; got ZeRO-{self.zero}",
                              field="--no-reshard-after-forward")
        if self.fsdp2 and self.zero != 3:
            raise LayoutError(f"torch FSDP2's copies into and out of its collectives' buffers are a ZeRO-3 option; got "
                              f"ZeRO-{self.zero}", field="--fsdp2")
        if self.fp8_all_gather and self.zero != 3:
            raise LayoutError(f"an fp8 all-gather of the weights is a ZeRO-3 option (torchao's "
                              f"enable_fsdp_float8_all_gather); got ZeRO-{self.zero}", field="--fp8-all-gather")
        if self.fp8_params and self.zero == 0:
            raise LayoutError("fp8 weights gathered in fp8 (Megatron-Core --fp8-param-gather) need the distributed "
                              "optimizer (ZeRO-1 or 2) or Megatron-FSDP (ZeRO-3); got ZeRO-0", field="--fp8-params")
        if self.fp8_params and self.fp8_all_gather:
            raise LayoutError(FP8_WEIGHTS_TWICE, field="--fp8-params")
        if self.offload_optimizer and not self.offloads:
            raise LayoutError(f"ZeRO-Offload moves each rank's optimizer-state partition to the host: it needs ZeRO-1, 2 "
                              f"or 3 (or one data-parallel rank); got ZeRO-{self.zero} over {self.grad_ranks} ranks",
                              field="--offload-optimizer")
        if self.offload_activations < 0:
            raise LayoutError(f"layers whose activations are offloaded must be >= 0, got {self.offload_activations}",
                              field="--offload-activations")
        if self.offload_activations and self.pp > 1:
            raise LayoutError(f"activation offload to the host runs without pipeline parallelism (Megatron-Core refuses "
                              f"cpu_offloading with pp > 1: transformer_config.py@d98e8a6 L1891); got pp {self.pp}",
                              field="--offload-activations")
        if self.grad_bucket != "group" and (self.zero == 3 or not self.overlap_grad_reduce):
            raise LayoutError(f"gradient buckets (--grad-bucket {self.grad_bucket}) are how ZeRO 0-2 reduces beside "
                              f"backward (--overlap-grad-reduce); got ZeRO-{self.zero}"
                              + ("" if self.zero == 3 else " reducing after backward"), field="--grad-bucket")
        try:
            grad_bucket_rule(self.grad_bucket)
        except ValueError as e:
            raise LayoutError(str(e), field="--grad-bucket") from None
        if self.cp_comm not in ("ring", "all_gather"):
            raise LayoutError(f"context-parallel communication must be ring or all_gather, got {self.cp_comm!r}")
        try:
            if recompute_policy(self.recompute) != self.recompute:
                raise ValueError(f"{self.recompute!r}: spell it {recompute_policy(self.recompute)!r}")
        except ValueError as e:
            raise LayoutError(f"recompute: {e}") from None
        if self.etp not in (0, 1):
            raise LayoutError(f"expert tensor parallelism must be 1 or the tp degree, got {self.etp}", field="--etp")
        if self.expert_pool % self.ep:
            what = "dp x cp" if self.expert_tp == self.tp else "tp x dp x cp"
            raise LayoutError(f"expert parallelism ep={self.ep} must divide {what}={self.expert_pool} (Megatron-Core "
                              f"carves the expert-parallel groups out of them)", field="--ep")
        if self.shard_group and self.ep > 1 and self.shard_group % self.ep:
            raise LayoutError(f"a hybrid shard group ({self.shard_group}) must be a multiple of ep={self.ep}",
                              field="--shard-group")

    def __hash__(self) -> int:  # layouts key caches across a search: hash the fields once
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash(_ALL_FIELDS(self))
            object.__setattr__(self, "_hash", h)
        return h

    @property
    def schedule(self) -> str:
        """The pipeline schedule as a run file and --schedule spell it (zb-v for zb_v), "-" without a pipeline."""
        return self.pp_schedule.replace("_", "-") if self.pp > 1 else "-"

    @property
    def parallel_key(self) -> tuple:
        """Every field but micro_batch, grad_accum and recompute (PER_MICRO_BATCH), as one tuple made once per
        layout (at_batch passes it on): what the layouts of one search group share, a key for what is priced once
        per group. Derived from the dataclass's fields, so a new field joins it (and the hash) by itself."""
        key = self.__dict__.get("_parallel_key")
        if key is None:
            key = _PARALLEL_FIELDS(self)
            object.__setattr__(self, "_parallel_key", key)
        return key

    def at_batch(self, micro_batch: int, grad_accum: int, recompute: str) -> Layout:
        """This layout at another micro-batch, accumulation and recompute policy: replace() without re-running
        __post_init__'s checks, for the tens of thousands of layouts a search derives from one that passed them.
        Of those checks only two read these fields: micro_batch and grad_accum >= 1 (asserted here) and the
        recompute policy's spelling (the caller passes policies a checked layout already has)."""
        assert micro_batch >= 1 and grad_accum >= 1, (micro_batch, grad_accum)
        lay = object.__new__(Layout)
        fields = lay.__dict__
        fields.update(self.__dict__)
        fields.pop("_hash", None)  # the hash covers these three fields
        fields["micro_batch"], fields["grad_accum"], fields["recompute"] = micro_batch, grad_accum, recompute
        return lay

    def with_attention(self, attention: str) -> Layout:
        """This layout with another attention implementation: replace() without re-running __post_init__'s checks,
        none of which reads the attention (a search copies each group's checked first layout to the implementations
        it tries)."""
        lay = object.__new__(Layout)
        fields = lay.__dict__
        fields.update(self.__dict__)
        fields.pop("_hash", None)  # both cover the attention
        fields.pop("_parallel_key", None)
        fields["attention"] = attention
        return lay

    @property
    def offloads(self) -> bool:
        return offload_applies(self.zero, self.grad_ranks)

    @property
    def recompute_chunks(self) -> int:
        """The model chunks a layer policy (`full:N`, `every:K`: ddplan.runfields.recompute_layers) counts its layers
        in: pp x vp (Megatron-Core's block method counts the layers of each model chunk); 1 under any other policy
        (a cache key: layouts that differ only in pp share their anatomy there)."""
        return self.pp * self.pp_virtual_stages if recompute_layers(self.recompute) is not None else 1

    @property
    def rank_share(self) -> tuple[int, bool, int, int, int]:
        """What one rank's share of the ops depends on: tp, sequence parallelism, cp, ep, and the split of the
        experts' rows over tp when the experts are not tensor-parallel (tp, else 1) (cache keys)."""
        return self.tp, self.sequence_parallel, self.cp, self.ep, self.expert_rows_split

    @property
    def expert_tp(self) -> int:
        """The experts' tensor-parallel degree: tp (Megatron-Core's default), or 1 (--expert-tensor-parallel-size 1)."""
        return 1 if self.etp == 1 else self.tp

    @property
    def expert_rows_split(self) -> int:
        """How many ways the experts' rows split over the tp ranks: tp when the experts are whole (each tp rank
        routes its own 1 / tp of the sequence, sequence parallelism), else 1."""
        return self.tp // self.expert_tp

    @property
    def expert_pool(self) -> int:
        """The ranks of a pipeline stage that expert parallelism is carved from: dp x cp, and the tp ranks too
        when the experts are whole (Megatron-Core's expert grid: etp x ep x edp = tp x dp x cp)."""
        return self.grad_ranks * self.expert_rows_split

    @property
    def expert_ranks(self) -> int:
        """Ranks that hold the same routed experts and reduce their gradients together: the expert pool / ep
        (Megatron-Core's expert-data-parallel group)."""
        return self.expert_pool // self.ep

    @property
    def distributed_optimizer(self) -> bool:
        """Whether the optimizer state is sharded as Megatron-Core's distributed optimizer shards it (ZeRO-1/2), not
        kept whole on each rank (ZeRO-0) or in Megatron-FSDP's own buffers (ZeRO-3): where its precision-aware optimizer
        keeps fp32 masters as remainders (ddplan.specs.Optimizer.adamw_bytes)."""
        return self.zero in (1, 2)

    @property
    def grad_ranks(self) -> int:
        """Ranks that hold the same parameters and reduce their gradients together: dp x cp (Megatron's
        data-parallel-with-context-parallel group)."""
        return self.dp * self.cp

    @property
    def shard_degree(self) -> int:
        """Ranks the ZeRO-sharded model states are split over: the hybrid shard group, else all dp x cp."""
        return self.shard_group or self.grad_ranks

    @property
    def num_gpus(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    def sequences_per_step(self) -> int:
        return self.micro_batch * self.grad_accum * self.dp


@dataclass(frozen=True)
class Placement:
    """Where one layout's communication groups sit on nodes of `gpus_per_node` GPUs.

    Ranks are ordered tp (innermost), then cp, then dp, then pp (outermost), Megatron-Core's default order
    "tp-cp-ep-dp-pp" (megatron/core/parallel_state.py, RankGenerator) and torchtitan's device mesh
    ["pp", "dp", "cp", "tp"]: a tp group is consecutive ranks, a context-parallel group strides by tp, the
    group that reduces gradients (dp x cp ranks) strides by tp, pipeline neighbours stride by tp x cp x dp;
    nodes hold consecutive ranks. Expert layers have their own grid (Megatron-Core's parallel folding: etp,
    ep, edp, pp): an ep group strides by the experts' tp degree (tp, or 1 when they are whole), the
    expert-data-parallel group that reduces expert gradients by that x ep.
    *_per_node: members of one such group on each node it touches (its share of the node's NICs,
    one NIC per GPU on rail-optimised fabrics); *_crosses: whether the group spans nodes.
    e.g. 1,024 GPUs, 8 per node, tp 2, dp 512: a dp group has 4 members per node and crosses nodes,
    so it drives 4 of the node's 8 NICs while the other tp rank's dp group drives the other 4.
    """

    tp_per_node: int
    tp_crosses: bool
    dp_per_node: int
    dp_crosses: bool
    pp_crosses: bool
    shard_per_node: int  # FSDP's shard group (all of dp x cp, or the hybrid shard group)
    shard_crosses: bool
    cp_per_node: int = 1  # a context-parallel group: cp ranks, tp apart
    cp_crosses: bool = False
    ep_per_node: int = 1  # an expert-parallel group: ep ranks, the experts' tp degree apart (its all-to-alls)
    ep_crosses: bool = False
    edp_per_node: int = 1  # an expert-data-parallel group (Layout.expert_ranks), etp x ep apart (expert gradients)
    edp_crosses: bool = False



# the fields a search varies within a group of layouts (Layout.at_batch); every other field is the group's
PER_MICRO_BATCH = ("micro_batch", "grad_accum", "recompute")
_ALL_FIELDS = operator.attrgetter(*(f.name for f in dataclasses.fields(Layout)))
_PARALLEL_FIELDS = operator.attrgetter(*(f.name for f in dataclasses.fields(Layout) if f.name not in PER_MICRO_BATCH))


def placement(layout: "Layout", gpus_per_node: int) -> Placement:
    """The nodes each group of `layout` spans (Placement's rank order); gpus_per_node >= 1."""
    if gpus_per_node < 1:
        raise ValueError(f"gpus_per_node must be >= 1, got {gpus_per_node}")
    return _placement(layout.tp, layout.cp, layout.grad_ranks, layout.shard_degree, layout.ep, layout.expert_tp,
                      layout.expert_ranks, layout.pp, layout.num_gpus, gpus_per_node)


@functools.lru_cache(maxsize=4096)
def _placement(tp: int, cp: int, grad_ranks: int, shard: int, ep: int, expert_tp: int, expert_ranks: int, pp: int,
               total: int, g: int) -> Placement:
    """placement by what it reads of a layout (a search asks for the same few thousands of times)."""
    tp_per_node, tp_crosses = group_on_nodes(tp, 1, g, total)
    cp_per_node, cp_crosses = group_on_nodes(cp, tp, g, total)
    dp_per_node, dp_crosses = group_on_nodes(grad_ranks, tp, g, total)  # cp inside dp: dp x cp ranks
    shard_per_node, shard_crosses = group_on_nodes(shard, tp, g, total)
    # Megatron-Core's expert grid (parallel folding) orders etp, ep, edp, pp: ep strides by etp
    ep_per_node, ep_crosses = group_on_nodes(ep, expert_tp, g, total)
    edp_per_node, edp_crosses = group_on_nodes(expert_ranks, expert_tp * ep, g, total)
    return Placement(tp_per_node=tp_per_node, tp_crosses=tp_crosses, dp_per_node=dp_per_node,
                     dp_crosses=dp_crosses, pp_crosses=pp > 1 and total > g,
                     shard_per_node=shard_per_node, shard_crosses=shard_crosses, cp_per_node=cp_per_node,
                     cp_crosses=cp_crosses, ep_per_node=ep_per_node, ep_crosses=ep_crosses,
                     edp_per_node=edp_per_node, edp_crosses=edp_crosses)


@functools.lru_cache(maxsize=4096)
def group_on_nodes(n: int, stride: int, gpus_per_node: int, total: int) -> tuple[int, bool]:
    """(fewest members on a node, whether some group spans nodes) for groups of n ranks `stride` apart, the
    groups tiling `total` ranks in blocks of n x stride (nodes: consecutive gpus_per_node ranks).

    The fewest is over every node a group touches and over the groups (they run at once, and the slowest
    sets the step): dp 12 at tp 1 on 8-GPU nodes puts 8 ranks on one node and 4 on the next, so 4.
    A group's first and last nodes may hold a part; a node in between holds floor(g / stride) or more.
    e.g. (512, 2, 8, 1024) -> (4, True); (6, 1, 8, 96) -> (2, True): ranks 6-11 straddle two nodes;
    (4, 2, 8, 1024) -> (4, False): a group of 8 consecutive ranks on one node.
    """
    if n <= 1:
        return 1, False
    g, block = gpus_per_node, n * stride
    fewest, crosses = n, False
    for base in range(0, min(total, g * block), block):  # node offsets of the blocks repeat within g blocks
        for offset in range(min(stride, g)):
            start = base + offset
            first, last = start // g, (start + stride * (n - 1)) // g
            if first == last:
                continue
            crosses = True
            on_first = -(-((first + 1) * g - start) // stride)
            on_last = n - -(-(last * g - start) // stride)
            between = max(1, g // stride) if last - first > 1 else n
            fewest = min(fewest, on_first, on_last, between)
    return (fewest if crosses else n), crosses


@dataclass(frozen=True)
class Options:
    """How a layout's communication runs, beyond its degrees: framework options that table, memory and plan
    take as flags and apply to every layout they can apply to (`for_layout`)."""

    sequence_parallel: bool = False  # Megatron sequence parallelism (tp > 1)
    tp_overlap: bool = False  # Megatron-Core --tp-comm-overlap (with sequence parallelism)
    shard_group: int = 0  # ZeRO-3 hybrid sharding over this many dp ranks (torch HSDP); 0: all of dp
    replica_reduce_once: bool = False  # hybrid sharding: the replicas' all-reduce after the last micro-batch only
    reshard_after_forward: bool = True  # ZeRO-3 (torch FSDP2 fully_shard's default)
    # False: ZeRO-3 under a pipeline (pp > 1) keeps the gathered parameters whatever reshard_after_forward says
    # (torchtitan's "default" policy: reshard only without pipeline parallelism)
    reshard_under_pipeline: bool = True
    fsdp2: bool = False  # ZeRO-3 as torch FSDP2: its copies in and out of the collectives' buffers priced
    recompute_early_stop: bool = True  # False: checkpointed regions re-run whole (Layout.recompute_early_stop)
    overlap_param_gather: bool = False  # ZeRO-1/2: Megatron-Core --overlap-param-gather
    overlap_grad_reduce: bool = True  # ZeRO 0-2: False, the gradient reduce after backward (Megatron-LM's default)
    grad_bucket: str = "group"  # ZeRO 0-2 reducing beside backward: how the gradients are bucketed (Layout.grad_bucket)
    # the ZeRO stage at which the model reduces its own way, in no buckets (nanochat's sharded optimizer at ZeRO-1:
    # for_model sets it); -1: none
    own_reduce_zero: int = -1
    cp_comm: str = "ring"  # context parallelism's exchange: ring (p2p, overlapped) or all_gather
    expert_tp: int = 0  # 1: experts whole, ep over the tp ranks too (--expert-tensor-parallel-size 1); 0: tp
    fp8_all_gather: bool = False  # ZeRO-3 with fp8 GEMMs: their weights gathered in fp8 (torchao)
    offload_optimizer: bool = False  # ZeRO >= 1 (or one rank): optimizer states and CPU Adam on the host
    fp8_params: bool = False  # ZeRO-1/2/3 with fp8 GEMMs: their weights kept and gathered in fp8 (Megatron-Core)
    offload_activations: int = 0  # the first N layers' saved activations to the host (pp 1; Megatron-Core, NeMo)

    def for_layout(self, tp: int, ranks: int, zero: int, cp: int = 1, pp: int = 1) -> dict:
        """The Layout fields these options give a layout of these degrees (ranks: dp x cp, the ranks that
        shard model states): each only where it applies (sequence parallelism with tp > 1, hybrid sharding
        on ZeRO-3 with a shard group below the ranks, resharding after forward under a pipeline only where
        reshard_under_pipeline, ...)."""
        return {"sequence_parallel": self.sequence_parallel and tp > 1,
                "tp_overlap": self.tp_overlap and self.sequence_parallel and tp > 1,
                "shard_group": self.shard_group if zero == 3 and 1 < self.shard_group < ranks else 0,
                "replica_reduce_once": self.replica_reduce_once and zero == 3 and 1 < self.shard_group < ranks,
                "reshard_after_forward": (self.reshard_after_forward and (pp == 1 or self.reshard_under_pipeline))
                                         or zero != 3,
                "fsdp2": self.fsdp2 and zero == 3,
                "recompute_early_stop": self.recompute_early_stop,
                "overlap_param_gather": self.overlap_param_gather and zero in (1, 2),
                "overlap_grad_reduce": self.overlap_grad_reduce or zero == 3 or ranks == 1,  # nothing to reduce
                "grad_bucket": (self.grad_bucket if zero not in (3, self.own_reduce_zero) and ranks > 1
                                and self.overlap_grad_reduce else "group"),
                "cp_comm": self.cp_comm if cp > 1 else "ring",
                "etp": 1 if self.expert_tp == 1 and tp > 1 else 0,
                "fp8_all_gather": self.fp8_all_gather and zero == 3,
                "offload_optimizer": self.offload_optimizer and offload_applies(zero, ranks),
                "fp8_params": self.fp8_params and zero in (1, 2, 3) and not (self.fp8_all_gather and zero == 3),
                "offload_activations": self.offload_activations}

    def for_model(self, spec: ModelSpec) -> "Options":
        """These options for a model: a mixture-of-experts model runs tp > 1 with sequence parallelism, which
        Megatron-Core requires with expert layers (its MoE README, "Parallelism"), so it is on for it; a model whose
        native setup reduces its own way (nanochat's sharded optimizer, per shape group after backward) takes no
        gradient buckets at that stage (own_reduce_zero)."""
        from dataclasses import replace

        out = self
        if spec.architecture.moe is not None and not self.sequence_parallel:
            out = replace(out, sequence_parallel=True)
        if spec.recipe.distribution == "sharded_optimizer":
            out = replace(out, own_reduce_zero=NATIVE_ZERO["sharded_optimizer"])
        return out

    def searched(self, tp: int, ranks: int, zero: int, cp: int = 1, pp: int = 1) -> dict:
        """for_layout for a search (plan): a shard group that does not divide the ranks gives plain ZeRO-3; activation
        offload applies to the layouts without a pipeline (the others keep their activations)."""
        fields = self.for_layout(tp, ranks, zero, cp, pp)
        if fields["shard_group"] and ranks % fields["shard_group"]:
            fields["shard_group"], fields["replica_reduce_once"] = 0, False
        if pp > 1:
            fields["offload_activations"] = 0
        return fields

    def at_zero(self, layout: "Layout", zero: int) -> "Layout":
        """The layout at another ZeRO stage, with these options where they apply there (searched's rule)."""
        from dataclasses import replace

        return replace(layout, zero=zero, **self.searched(layout.tp, layout.grad_ranks, zero, layout.cp, layout.pp))


def expert_parallel_degrees(spec: ModelSpec, ranks: int, asked: tuple[int, ...] = ()) -> list[int]:
    """The ep degrees searched (plan) or tried (memory's what-fits) for `ranks` ranks to carve ep from (dp x
    cp, times tp with whole experts): those asked, else every number that divides both the experts and the
    ranks (60 experts over 24 ranks: 1, 2, 3, 4, 6, 12); a dense model: 1."""
    moe = spec.architecture.moe
    if moe is None:
        return [1]
    if asked:
        return [e for e in asked if ranks % e == 0 and moe.num_experts % e == 0]
    return [e for e in range(1, min(ranks, moe.num_experts) + 1) if ranks % e == 0 and moe.num_experts % e == 0]


def data_parallel(gpus: int, tp: int = 1, pp: int = 1, cp: int = 1) -> int:
    """dp of `gpus` GPUs in total: gpus / (tp x pp x cp); LayoutError when tp x pp x cp does not divide them."""
    if gpus % (tp * pp * cp):
        what = "tp x pp" if cp == 1 else "tp x pp x cp"
        raise LayoutError(f"{what} = {tp * pp * cp} does not divide {gpus} GPUs")
    return gpus // (tp * pp * cp)


def zero_stage(spec: ModelSpec, zero: int | None, ranks: int) -> int:
    """The ZeRO stage a layout of `ranks` data-parallel ranks (dp x cp) runs: the one asked, else the model's native
    one, and the native one on a single rank (nothing to shard)."""
    return NATIVE_ZERO[spec.recipe.distribution] if zero is None or ranks == 1 else zero


def layout_for(spec: ModelSpec, *, gpus: int, tp: int = 1, pp: int = 1, vp: int = 1, cp: int = 1, ep: int = 1,
               zero: int | None = None, micro_batch: int, grad_accum: int, attention: str, recompute: str = "none",
               compiled: bool | None = None, options: Options = Options(), schedule: str | None = None) -> Layout:
    """The layout of `gpus` GPUs in total: dp = gpus / (tp x pp x cp); the model's native ZeRO stage unless one is
    given (and always at dp 1, where there is nothing to shard); the pipeline schedule asked (schedule_for: by
    default 1F1B, interleaved when vp > 1; none without a pipeline); the options where they apply. The one place
    `table`, `memory` and a measurement turn GPU counts into a layout."""
    dp = data_parallel(gpus, tp, pp, cp)
    zero = zero_stage(spec, zero, dp * cp)
    pp_schedule, vp = schedule_for(schedule if pp > 1 else None, vp)
    return Layout(dp=dp, tp=tp, pp=pp, cp=cp, zero=zero, micro_batch=micro_batch,
                  grad_accum=grad_accum, attention=attention, recompute=recompute,
                  compiled=spec.recipe.compiled if compiled is None else compiled,
                  pp_schedule=pp_schedule, pp_virtual_stages=vp, ep=ep,
                  **options.for_layout(tp, dp * cp, zero, cp, pp))


def check_layout(layout: Layout, spec: ModelSpec, total_batch_tokens: int | None = None,
                 world_size_rule: bool = True) -> None:
    """Raise LayoutError naming every factor that does not divide (heads by tp, layers by pp, batch by dp).

    world_size_rule=False leaves the model's world-size rule (nanochat: a power of two) to the caller,
    which flags it on a priced row instead of refusing the layout.
    """
    a = spec.architecture
    problems = []
    if a.num_heads % layout.tp or a.num_kv_heads % layout.tp:
        problems.append(f"tp={layout.tp} must divide num_heads={a.num_heads} and num_kv_heads={a.num_kv_heads}")

    try:
        if layout.pp_schedule == "zb_v":  # 2 pp chunks in a V, the end ones possibly empty
            v_chunks(a.num_layers, layout.pp)
        else:
            first, middle, last = stage_layers(a.num_layers, layout.pp)
            v = layout.pp_virtual_stages
            # an end stage one layer short of the middle ones counts its embedding (first) or its head and loss
            # (last) as a layer, as Megatron-Core's --account-for-embedding-in-pipeline-split and
            # --account-for-loss-in-pipeline-split do: Qwen3-235B's 94 layers over pp 32 x vp 3 are 96 units of one
            uneven = [n for n in dict.fromkeys((first, middle, last))
                      if n % v and not (n + 1 == middle and middle % v == 0)]
            if uneven:
                problems.append(f"{layout.pp_virtual_stages} interleaved chunks must divide every stage's layers "
                                f"({first}, {middle}, {last} of num_layers={a.num_layers} over pp={layout.pp})")
    except ValueError as e:
        problems.append(f"pp={layout.pp}: {e}")
    if a.moe is not None and layout.tp > 1 and not layout.sequence_parallel:
        problems.append(f"tp={layout.tp}: Megatron-Core runs mixture-of-experts layers with tp > 1 only with "
                        f"sequence parallelism (--sequence-parallel)")
    if layout.ep > 1 and (a.moe is None or a.moe.num_experts % layout.ep):
        problems.append(f"ep={layout.ep} must divide the number of experts "
                        f"({a.moe.num_experts if a.moe else 'none: ' + spec.name + ' is dense'})")
    if layout.offload_activations >= a.num_layers:
        problems.append(f"offload_activations={layout.offload_activations}: at most num_layers - 1 = "
                        f"{a.num_layers - 1} layers offload their activations (Megatron-Core keeps the last one: "
                        f"transformer_config.py@d98e8a6 L1884-1888)")
    if layout.cp > 1 and spec.recipe.seq_len % (2 * layout.cp):
        # causal load balancing gives each rank two chunks of s / 2cp (Megatron-Core, torchtitan)
        problems.append(f"cp={layout.cp}: 2 x cp must divide the sequence length {spec.recipe.seq_len}")
    if world_size_rule and breaks_world_size_rule(layout, spec):
        problems.append(f"{spec.name} needs a power-of-two world size, got {layout.num_gpus}")
    if total_batch_tokens is not None:
        tokens = layout.sequences_per_step() * spec.recipe.seq_len
        if tokens != total_batch_tokens:
            problems.append(f"dp {layout.dp} x micro-batch {layout.micro_batch} x accumulation {layout.grad_accum} "
                            f"x seq {spec.recipe.seq_len} = {tokens:,} tokens != total batch {total_batch_tokens:,}")
    if problems:
        raise LayoutError("; ".join(problems))


def cp_attention_problem(layout: Layout, kind: str, windows: str, spec: ModelSpec,
                         window_pattern: str | None = None) -> str | None:
    """Why context parallelism cannot run with this attention implementation, or None.

    Context parallelism runs on fused attention kernels only (torch's context_parallel dispatches the
    flash, efficient and cuDNN SDPA kernels; Megatron-Core needs Transformer Engine's fused attention),
    and neither takes an explicit mask, so windows made by masking (window < sequence) are out too."""
    if layout.cp == 1:
        return None
    if kind in UNFUSED_KINDS:
        return "context parallelism needs a fused attention kernel, not unfused (math) attention"
    arch = spec.architecture if window_pattern is None else spec.architecture.model_copy(
        update={"window_pattern": window_pattern})
    if windows == "mask" and any(w < spec.recipe.seq_len for w in arch.windows(spec.recipe.seq_len)):
        return "context parallelism cannot run windows this kernel makes by masking"
    return None


def breaks_world_size_rule(layout: Layout, spec: ModelSpec) -> bool:
    """Whether the layout's world size breaks the model's rule (nanochat: a power of two)."""
    return spec.recipe.world_size_rule == "power_of_two" and bool(layout.num_gpus & (layout.num_gpus - 1))


@dataclass(frozen=True)
class BatchSplit:
    """How one optimizer step's sequences split over data-parallel ranks and micro-batches.

    sequences = dp x micro_batch x accum. change: "" (as asked), "micro_batch" (a smaller micro-batch
    keeps the total batch) or "rounded_up" (dp does not divide the batch: it grows to the next multiple).
    """

    micro_batch: int
    accum: int
    sequences: int
    change: str = ""


def split_batch(total_sequences: int, dp: int, micro_batch: int) -> BatchSplit:
    """The one gradient-accumulation rule: keep the total batch; shrink the micro-batch if it must.

    Each data-parallel rank gets total / dp sequences; the micro-batch is the largest divisor of that
    not above the one asked for, and accumulation makes up the rest, so the batch (and the loss curve)
    stays the recipe's. Only when dp does not divide the batch does it grow, to ceil(total / dp) x dp
    sequences: a different run, flagged. e.g. 512 sequences, dp 8, micro-batch 32: 64 per rank,
    32 x 2. 512 over dp 8 at micro-batch 48: 64 per rank, 32 x 2 ("micro_batch"). 1536 over dp 1024:
    2 per rank, 2,048 sequences ("rounded_up").
    """
    if min(total_sequences, dp, micro_batch) < 1:
        raise LayoutError(f"need positive sequences, dp and micro-batch; got {total_sequences}, {dp}, {micro_batch}")
    per_rank = -(-total_sequences // dp)
    mb = max(d for d in range(1, min(micro_batch, per_rank) + 1) if per_rank % d == 0)
    change = "rounded_up" if total_sequences % dp else ("micro_batch" if mb != micro_batch else "")
    return BatchSplit(micro_batch=mb, accum=per_rank // mb, sequences=per_rank * dp, change=change)
