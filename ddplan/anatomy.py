"""Anatomy: the operations one training micro-batch runs, with FLOPs, bytes moved and bytes saved.

One source of truth: FLOP counts, the roofline time model and activation memory all read this list,
so they cannot disagree. The list follows PyTorch eager semantics of the reference model in
ddplan/calibrate/reference.py (checked by tests with FlopCounterMode and saved_tensors_hooks);
`compiled=True` applies what torch.compile's min-cut partitioner does to saved tensors (pointwise
results are recomputed in backward instead of kept), documented at `SAVE_TAGS`.

Conventions:
- GEMM (m x k) @ (k x n): 2mkn FLOPs forward, 4mkn backward (dX and dW).
- Attention on `pairs` (query, key) pairs per head: 4 x pairs x head_dim forward (QK^T, PV),
  8 x pairs x head_dim backward (dV, dP, dQ, dK); flash kernels also recompute QK^T in backward
  (2 x pairs x head_dim, reported as `recompute_flops_bwd`, hardware FLOPs only).
- Attention kinds: `sdpa_math` is torch's math SDPA (aten `_scaled_dot_product_attention_math`, fp32
  internally for 16-bit inputs, `sdpa_math_saved_bytes`); `unfused_math` is Megatron-LM's unfused attention
  (scores, softmax and dropout in the compute dtype, what Korthikanti et al. 2022 Table 2 counts,
  `megatron_unfused_saved_bytes`); `fused_sdpa` torch's fused SDPA kernels; `flash_package` FA2/FA3.
- Which pairs an implementation computes (`attention_pairs`): unfused math (both kinds) computes all
  s^2 and masks after; PyTorch's fused SDPA skips the upper triangle only under is_causal (a sliding window
  needs an explicit mask, so it computes all s^2); flash packages skip everything outside the window.
- Bytes: every tensor read or written once per pass (no cache reuse), in its dtype.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field, replace
import typing
from typing import Literal

from ddplan.params import param_counts
from ddplan.pipeline import stage_layers
from ddplan.runfields import recompute_layers, recompute_modules
from ddplan.specs import ModelSpec
from ddplan.units import dtype_bytes

OpKind = Literal["gemm", "attention", "elementwise", "reduction", "embedding", "optimizer"]
AttentionKind = Literal["sdpa_math", "unfused_math", "fused_sdpa", "flash_package"]
UNFUSED_KINDS: tuple[str, ...] = ("sdpa_math", "unfused_math")  # materialise (and save) the s x s scores
WindowSupport = Literal["native", "mask"]
Recompute = Literal["none", "selective", "full", "per-op"]
# none; Megatron's selective (the attention core, Korthikanti et al. 2022); full (every block); per-op:
# torchtitan's per-op selective activation checkpointing (SelectiveAC, `PER_OP_SOURCE`): each block is
# checkpointed, and the outputs of its matmuls and attention kernels are kept, except every second matmul
RECOMPUTE_POLICIES: tuple[str, ...] = ("none", "selective", "full", "per-op")
# ... and Megatron-Core's per-module selective recompute, `selective:MODULE+MODULE` (ddplan.runfields.recompute_modules;
# --recompute-granularity selective --recompute-modules ...): a module's forward is re-run in backward and what it
# made is not kept (module_keeps). Ref: NVIDIA/Megatron-LM @d98e8a6 megatron/core/transformer/transformer_layer.py
# L473-540 (layernorm: input_layernorm and pre_mlp_layernorm under CheckpointWithoutOutput, their outputs discarded
# once used and recomputed before backward needs them, L684-718, L820-825, L1088-1091; mlp: a dense layer's MLP
# checkpointed whole, L992-1006), moe/moe_layer.py L246-254, L701-716 (moe: the whole MoE layer, dispatch included,
# under tensor_parallel.checkpoint; shared_experts: the shared experts, L517-527), moe/experts.py L269-273 (moe_act:
# the experts' activation, its output discarded and recomputed)
PER_OP_SOURCE = ("pytorch/torchtitan torchtitan/distributed/activation_checkpoint.py@b5bcd76 SelectiveAC "
                 "(2026-08-21; the same rule as torchtitan/models/llama3/infra/parallelize.py@c26ea60 _apply_op_sac, "
                 "2026-01)")

# Tags on saved tensors, deciding what each policy keeps:
#   "input"     a checkpoint region's input (a block's input, x0, the attention masks): kept by every
#               policy (full recompute keeps only these in the blocks);
#   "core"      made inside the attention core (probabilities, log-sum-exp): dropped by selective
#               recompute, which checkpoints the core q, k, v -> output (Korthikanti et al. 2022,
#               arXiv 2205.05198, sec. 4.1) and keeps its inputs q, k, v;
#   "ckpt_input" an input of a checkpointed region that nothing else saves: kept only under recompute;
#   "core_input" an input of the attention core that nothing else saves: kept only under selective;
#   "pointwise" the output of a cheap pointwise op that the compiler recomputes from other saved
#               tensors in backward (torch.compile min-cut partitioner, AOTAutograd): eager only;
#   "compiled"  saved only when compiled (what the partitioner keeps instead, e.g. bf16 logits);
#   "keep"      anything else (GEMM inputs, norm statistics);
#   "op_output" an output that per-op recompute keeps (a block's matmul or attention kernel whose output
#               torchtitan's SelectiveAC saves: Op.per_op_saved); no other policy keeps it as such (the
#               same tensor, saved by its consumer under another name and tag, counts there).
SaveTag = Literal["input", "core", "ckpt_input", "core_input", "pointwise", "compiled", "keep", "op_output"]


@dataclass(frozen=True)
class Saved:
    """A tensor kept from forward to backward. Ops that save the same tensor use the same name."""

    name: str
    bytes: float
    tag: SaveTag = "keep"
    tp_sharded: bool = True  # split across tensor-parallel ranks (False: norm inputs, residual stream)
    # the Megatron modules whose recompute drops it where its name does not say (tensor_modules): a fused norm's
    # (_fused_norm_modules), or those of the GEMM that keeps an fp8 copy of its input (ddplan.fp8.with_fp8_saves)
    module: frozenset[str] | None = None


@dataclass(frozen=True)
class Op:
    """One operation of a micro-batch (whole micro-batch, one GPU, no parallelism applied)."""

    name: str
    kind: OpKind
    layer: int | None  # block index; None for embeddings, head, loss, optimizer
    shape: tuple[int, ...]  # gemm (m, n, k); attention (batch, heads, seq, window, head_dim); else (elements,)
    flops_fwd: float
    flops_bwd: float
    bytes_fwd: float  # read + written, forward
    bytes_bwd: float  # read + written, backward
    saves: tuple[Saved, ...] = ()
    recompute_flops_bwd: float = 0.0  # kernel-internal recompute (flash backward), hardware FLOPs only
    attention_core: bool = False  # inside the attention core: recomputed under selective recompute
    # torch's non-reentrant checkpoint stops recomputing once every saved tensor backward needs is
    # back, so the last op of a region is not re-run: the PV product under selective recompute (its
    # inputs, the probabilities and v, are already regenerated), a block's last GEMM under full.
    recompute_skip: tuple[str, ...] = ()
    transient_bytes: float = 0.0  # gradient buffers alive during this op's backward, beyond saved tensors
    tp_done: bool = False  # already one tensor-parallel rank's share (whole experts on 1 / tp of the rows)
    weight_group: str | None = None  # a GEMM's weight: its parameter group and elements (all experts of a
    weight_elements: float = 0.0  # grouped GEMM), before any parallel split
    # the step waits for the busiest rank: its time of this op over the mean rank's, which the op's shape,
    # FLOPs, bytes and saves describe (a routed expert's under dropless expert parallelism: MoE.imbalance;
    # the memory peak stays the mean's, as the busiest rank differs from layer to layer)
    wait: float = 1.0
    # GEMM launches of one pass: a grouped GEMM's local experts, one cuBLAS GEMM each (Transformer Engine's
    # GroupedLinear; ddplan.roofline.grouped_call_waves prices their fixed costs)
    calls: int = 1
    # per-op recompute (torchtitan's SelectiveAC) keeps this op's output, so backward does not re-run it
    per_op_saved: bool = False
    # the Megatron modules (ddplan.runfields.RECOMPUTE_MODULES) this op runs in where its name does not say
    # (op_modules; empty: none a per-module policy re-runs): Transformer Engine fuses a block's norms into the
    # next Linear (_fused_norm_modules)
    module: frozenset[str] | None = None


@dataclass(frozen=True)
class Anatomy:
    """The ops of one micro-batch for one configuration, plus what it needs to interpret them.

    The ops are kept as the blocks' distinct kinds, not one copy per layer: `pre` (before the blocks), each
    distinct block's ops once (`blocks`, as built for the first layer that has it), which block each layer is
    (`layer_blocks`), and `post` (after the blocks); `ops` spells them out in order, each layer's copy with its
    own `h{i}.` names. Layers differ where the model makes them differ (window, MoE or dense MLP, value
    embeddings, block 0 reading x0 itself: _block_kind); a share (for_tp, for_cp) transforms each distinct
    block once, and the sums (op_repeats, saved_split, FLOPs) walk a block's ops once per kind, not per layer.
    """

    model: str
    batch: int
    seq_len: int
    attention: AttentionKind
    windows: WindowSupport
    recompute: Recompute
    compiled: bool
    pre: tuple[Op, ...]  # embeddings, before the blocks
    blocks: tuple[tuple[Op, ...], ...]  # each distinct block's ops, as built for the first layer that has it
    layer_blocks: tuple[int, ...]  # layer i runs blocks[layer_blocks[i]] (first appearances in index order)
    post: tuple[Op, ...]  # final norm, head and loss
    optimizer_ops: tuple[Op, ...] = field(default=())
    tp: int = 1  # the ops are one tensor-parallel rank's share
    sequence_parallel: bool = False  # with tp: norms, residual stream and saved inputs split over tp too
    cp: int = 1  # and one context-parallel rank's: seq_len is then its s / cp tokens of each sequence
    ep: int = 1  # expert parallelism: this rank holds num_experts / ep of each block's routed experts
    expert_rows: int = 1  # the experts' rows split this many ways over tp (whole experts, etp 1): already applied
    chunks: int = 1  # model chunks (pp x vp) a layer policy (full:N, every:K) counts its layers in (layer_again)
    elem_bytes: float = 2.0  # an activation element's bytes (the compute dtype's)

    @property
    def tokens(self) -> int:
        return self.batch * self.seq_len

    @functools.cached_property
    def ops(self) -> tuple[Op, ...]:
        """Every op in order: pre, each layer's block (its own copy, named h{i}.), post; built once, cached."""
        ops = list(self.pre)
        for i, b in enumerate(self.layer_blocks):
            ops.extend(_moved(self.blocks[b], i))
        ops.extend(self.post)
        return tuple(ops)

    def saved_tensors(self) -> dict[str, Saved]:
        """Unique tensors kept for backward under this recompute policy and compile mode (a tensor saved by
        several ops: the last one's Saved, at the place of the first)."""
        keep = self._save_kept
        kept: dict[str, Saved] = {}
        for op in self.ops:
            for s in op.saves:
                if keep(op, s):
                    kept[s.name] = s
        return kept

    @functools.cached_property
    def _variants(self) -> dict[tuple[str, int], Anatomy]:
        """with_recompute's anatomies of these ops, by (policy, chunks): kept with the anatomy, so the pricers that
        share it (ddplan.price._SHARES: a plan's hardware, validation's runs, repeated searches) build each policy's
        anatomy, and what that caches (saved_split, backward_transient_bytes, ...), once. A cached property: _with's
        copies, with other ops, start without it."""
        return {}

    @functools.cached_property
    def modules(self) -> frozenset[str] | None:
        """The Megatron modules this policy re-runs (`selective:a+b`), None under a named policy."""
        return recompute_modules(self.recompute)

    @functools.cached_property
    def full_share(self) -> float:
        """The share of the layers re-run whole in backward (layer_again): 1 under full recompute; under a layer
        policy (ddplan.runfields.recompute_layers) the layers it names: full:N the first N of each of the `chunks`
        model chunks (N x chunks / L where they split the layers evenly), every:K every K-th; 0 otherwise. e.g.
        Llama 3 70B (80 layers) at pp 4, vp 5 (20 chunks of 4 layers) under full:1: 20 of 80 layers, 0.25."""
        if self.recompute == "full":
            return 1.0
        if not self.by_layers:
            return 0.0
        layers = len(self.layer_blocks)
        return sum(map(self.layer_again, range(layers))) / max(1, layers)

    @functools.cached_property
    def layers_again(self) -> tuple[int, ...]:
        """Per distinct block (blocks), how many layers running it a layer policy re-runs whole (layer_again)."""
        counts = [0] * len(self.blocks)
        for layer, b in enumerate(self.layer_blocks):
            counts[b] += self.layer_again(layer)
        return tuple(counts)

    @property
    def by_layers(self) -> bool:
        """Whether the policy is `full:N` or `every:K` (some layers recomputed whole, the rest not)."""
        return recompute_layers(self.recompute) is not None

    @property
    def whole_layers(self) -> bool:
        """Whether the policy re-runs whole layers (full, full:N, every:K): what a re-run repeats of a layer's
        exchanges is then full_share of them."""
        return self.recompute == "full" or self.by_layers

    def layer_again(self, layer: int) -> bool:
        """Whether layer `layer` (0-based) is re-run whole: every layer under full recompute; under `full:N` the
        first N of its model chunk, under `every:K` the K-th, 2K-th, ... of it (each chunk contiguous layers,
        Megatron's get_num_layers_to_build, as _chunk_place splits them; the whole model at chunks 1; torchtitan's
        count runs on over a rank's chunks, here it restarts); none otherwise."""
        if self.recompute == "full":
            return True
        policy = recompute_layers(self.recompute)
        if policy is None:
            return False
        kind, n = policy
        within = self._chunk_place[layer]  # its place in its chunk
        return within < n if kind == "first" else (within + 1) % n == 0

    @functools.cached_property
    def _chunk_place(self) -> tuple[int, ...]:
        """Each layer's index within its model chunk: chunks of L / chunks layers where they divide evenly (an
        interleaved schedule needs it), else the pipeline's uneven stages (ddplan.pipeline.stage_layers: Llama 3
        405B's 126 layers over 16 stages are 7, 8 x 14, 7)."""
        layers, chunks = len(self.layer_blocks), self.chunks
        if layers % chunks == 0 or chunks > layers:
            size = max(1, layers // chunks)
            return tuple(i % size for i in range(layers))
        first, middle, last = stage_layers(layers, chunks)
        sizes = [first, *[middle] * (chunks - 2), last] if chunks > 1 else [layers]
        return tuple(i for size in sizes for i in range(size))

    @functools.cached_property
    def _save_kept(self):
        """(op, saved) -> whether this policy keeps that save: the tag table under a named policy, module_keeps
        under a per-module one."""
        if self.by_layers:  # a layer policy: a re-run layer keeps as full recompute does, the rest (and the ops
            # outside the blocks) as none does
            full, none, again = _keep_table("full", self.compiled), _keep_table("none", self.compiled), self.layer_again
            return lambda op, s: (full if op.layer is not None and again(op.layer) else none)[s.tag, op.layer is not None]
        if self.modules is None:
            keeps = _keep_table(self.recompute, self.compiled)
            return lambda op, s: keeps[s.tag, op.layer is not None]
        modules, compiled = self.modules, self.compiled
        return lambda op, s: module_keeps(op, s, modules, compiled)

    def saved_bytes(self) -> float:
        """Bytes saved for backward by one micro-batch (activation memory at the end of forward)."""
        return sum(self.saved_split)

    def _walk(self, value, where=None) -> list:
        """value(op) for every op in order (those where `where(op)`), each distinct block's ops computed once:
        a sum over it adds the same numbers in the same order as a sum over `ops`."""
        def values(ops):
            return [value(op) for op in ops if where is None or where(op)]
        per_block = [values(b) for b in self.blocks]
        out = values(self.pre)
        for b in self.layer_blocks:
            out.extend(per_block[b])
        out.extend(values(self.post))
        return out

    @functools.cached_property
    def _block_counts(self) -> tuple[tuple[int, int], ...]:
        """(block index, layers that run it), blocks in order of first appearance."""
        counts: dict[int, int] = {}
        for b in self.layer_blocks:
            counts[b] = counts.get(b, 0) + 1
        return tuple(counts.items())

    def reruns(self, policy: str) -> tuple[bool, ...]:
        """For each of op_repeats, whether `policy` re-runs it (recomputed_under), worked out once per anatomy and
        policy: every pricing of these ops at other rates (a fit's, a search's) asks the same."""
        known = self._reruns.get(policy)
        if known is None:
            known = self._reruns[policy] = tuple(recomputed_under(op, policy) for op, _ in self.op_repeats)
        return known

    @functools.cached_property
    def _reruns(self) -> dict[str, tuple[bool, ...]]:
        return {}

    @functools.cached_property
    def op_repeats(self) -> tuple[tuple[Op, int], ...]:
        """The ops with the blocks' repeats merged: (the first op of a kind, how many ops are like it), in
        order. Ops merge when they differ only in their block (layer index, the `h{i}.` name prefix) and
        what they save: their times, FLOPs and recompute are the same, so a sum over ops can walk these
        (ddplan.roofline.op_times; a 32-layer model's ~430 ops are ~30 of them). Cached per anatomy.
        Walks each distinct block once with its count of layers: the same groups, counts, order and first ops
        as walking `ops` (a kind first seen in the block that appears first, whose ops are its first layer's)."""
        groups: dict[tuple, list] = {}

        def add(op: Op, n: int) -> None:
            name = op.name if op.layer is None else op.name.removeprefix(f"h{op.layer}.")
            key = (name, op.layer is None, op.kind, op.shape, op.flops_fwd, op.flops_bwd, op.bytes_fwd,
                   op.bytes_bwd, op.recompute_flops_bwd, op.attention_core, op.recompute_skip, op.tp_done, op.wait,
                   op.calls, op.per_op_saved)
            if key in groups:
                groups[key][1] += n
            else:
                groups[key] = [op, n]

        for op in self.pre:
            add(op, 1)
        for b, n in self._block_counts:
            for op in self.blocks[b]:
                add(op, n)
        for op in self.post:
            add(op, 1)
        return tuple((op, n) for op, n in groups.values())

    @functools.cached_property
    def saved_split(self) -> tuple[float, float]:
        """(bytes saved by block ops, bytes saved by embedding/head ops), each storage once; cached.

        A tensor counts as its last kept Saved's bytes (saved_tensors) and belongs to the blocks when the last
        op that saves it (kept or not) is a block's. Summed per distinct block and multiplied by its layers
        when every kept size is a whole number of bytes and the total is below 2^53 (then every partial sum
        in any order is exact, so this is the walk's float to the bit); else the walk over every saved tensor."""
        if self.by_layers:  # full:N, every:K: the layers it re-runs keep as full recompute does, the rest as none
            full, none = _keep_table("full", self.compiled), _keep_table("none", self.compiled)
            again = self.layer_again
            exact = self._saved_split_exact(none, layer_keeps=lambda i: full if again(i) else none)
            return exact if exact is not None else self._saved_split_walk()
        if self.modules is not None:  # per-module recompute: each tensor as its savers keep it
            exact = self._saved_split_exact(_AS_FLAGGED, self._save_kept)
            return exact if exact is not None else self._saved_split_walk()
        keeps = _keep_table(self.recompute, self.compiled)
        exact = self._saved_split_exact(keeps)
        if exact is not None:
            return exact
        rows, in_blocks = self._save_rows
        kept: dict[str, float] = {}
        for name, nbytes, tag, in_block in rows:
            if keeps[tag, in_block]:
                kept[name] = nbytes
        layers = sum(b for n, b in kept.items() if in_blocks[n])
        return layers, sum(kept.values()) - layers

    def _saved_split_walk(self) -> tuple[float, float]:
        """saved_split by the walk over every op's saved tensors (each name its last kept size; in the blocks when its
        last saver is a block op): the definition that _saved_split_exact sums per distinct block."""
        keep = self._save_kept
        kept: dict[str, float] = {}
        last_block: dict[str, bool] = {}
        for op in self.ops:
            for s in op.saves:
                last_block[s.name] = op.layer is not None
                if keep(op, s):
                    kept[s.name] = s.bytes
        layers = sum(b for n, b in kept.items() if last_block[n])
        return layers, sum(kept.values()) - layers

    @functools.cached_property
    def _block_rows(self) -> tuple[tuple[tuple[str, float, str, bool], ...], ...]:
        """Per distinct block, its saved tensors in order as (name, bytes, tag, own): own when the name is the
        block's (`h{i}.` of its first layer, removed here), which no other layer saves; else the name as is
        (shared by layers: x0, the attention masks)."""
        return self._block_rows_by(lambda op, s: s.tag)

    def _block_rows_by(self, tag: Callable) -> tuple[tuple[tuple[str, float, object, bool], ...], ...]:
        """_block_rows with tag(op, saved) in place of each saved tensor's tag (a per-module policy's keep flag)."""
        out = []
        for ops in self.blocks:
            prefix = f"h{ops[0].layer}." if ops else ""
            out.append(tuple((s.name.removeprefix(prefix), s.bytes, tag(op, s), s.name.startswith(prefix))
                             for op in ops for s in op.saves))
        return tuple(out)

    @functools.cached_property
    def outside_split(self) -> tuple[float, float]:
        """(embedding side, head side) of saved_split's bytes outside the blocks: what the embedding ops save
        (a pipeline's first stage holds it) and the rest, the final norm's, head's and loss's (the last stage);
        kept under this policy, each name once (a name a block or the head saves too is not the embedding's)."""
        keeps = _keep_table(self._named_policy, self.compiled)
        later = self._saved_after_embeddings
        pre: dict[str, float] = {}
        for op in self.pre:
            for s in op.saves:
                if keeps[s.tag, False] and s.name not in later:
                    pre[s.name] = s.bytes
        embedding = sum(pre.values())
        return embedding, self.saved_split[1] - embedding

    @functools.cached_property
    def _saved_after_embeddings(self) -> frozenset[str]:
        """The names a block or the head saves (each distinct block's own names without their `h{i}.` prefix, as
        _block_rows has them): outside_split's embedding side leaves them out. Read off the ops alone (with_recompute
        keeps it: _OPS_ONLY_CACHES)."""
        return frozenset({s.name for op in self.post for s in op.saves} | {
            name for rows in self._block_rows for name, *_ in rows})

    @functools.cached_property
    def weight_cast_split(self) -> tuple[float, float, float]:
        """(bytes in the blocks, all layers; on the embeddings' side; on the head's side) of the 16-bit weight
        copies the matmuls save
        (`*.weight_cast`: fp32 weights cast by autocast) that this policy keeps; cached. Under FSDP mixed
        precision the matmuls get the gathered 16-bit weights instead (memory.activation_bytes leaves these out)."""
        keeps = _keep_table(self._named_policy, self.compiled)
        keep = self._save_kept

        def casts(op) -> float:
            return sum(s.bytes for s in op.saves if s.name.endswith(".weight_cast") and keep(op, s))

        if self.by_layers:  # full:N, every:K: per kind of block, its re-run layers as full keeps, the rest as none
            full, none = _keep_table("full", self.compiled), _keep_table("none", self.compiled)

            def kept_casts(ops, table) -> float:
                return sum(s.bytes for op in ops for s in op.saves if s.name.endswith(".weight_cast")
                           and table[s.tag, True])

            again = self.layers_again
            block = sum(again[b] * kept_casts(self.blocks[b], full) + (n - again[b]) * kept_casts(self.blocks[b], none)
                        for b, n in self._block_counts)
        else:
            block = sum(n * sum(casts(op) for op in self.blocks[b]) for b, n in self._block_counts)
        def outside(ops) -> float:
            return sum(s.bytes for op in ops for s in op.saves
                       if s.name.endswith(".weight_cast") and keeps[s.tag, False])

        return block, outside(self.pre), outside(self.post)

    @property
    def _named_policy(self) -> str:
        """The named policy whose tag table holds outside the recomputed modules: a per-module policy keeps
        everything there as no recompute does (the attention core aside: module_keeps), and so does a layer policy
        (full:N, every:K: a re-run layer's checkpoint keeps its inputs inside the block, _save_kept)."""
        return "none" if self.modules is not None or self.by_layers else self.recompute

    def _saved_split_exact(self, keeps: dict, tag: Callable | None = None,
                           layer_keeps: Callable[[int], dict] | None = None) -> tuple[float, float] | None:
        """saved_split in whole bytes (Python ints, exact), or None where a kept size is not a whole number of
        bytes or the total reaches 2^53 (saved_split then walks every tensor). keeps[tag, in block]: whether a
        tensor is kept; tag(op, saved): the tag it is looked up by (default the saved tensor's own; a per-module
        policy passes its keep flag, looked up in _AS_FLAGGED); layer_keeps(i): layer i's table where layers keep
        differently (a layer policy: full recompute's for the layers it re-runs, none's for the rest), keeps
        serving the ops outside the blocks."""
        if tag is None:
            block_rows = self._block_rows
            tag = _OWN_TAG
        else:
            block_rows = self._block_rows_by(tag)
        one_table = layer_keeps is None
        layer_keeps = layer_keeps or (lambda i: keeps)
        outside = [(s.name, s.bytes, tag(op, s), False) for op in self.pre for s in op.saves]
        after = [(s.name, s.bytes, tag(op, s), False) for op in self.post for s in op.saves]
        layers = len(self.layer_blocks)
        # a layer's own tensor that pre or post saves too (nanochat's backout keeps h{L/2+1}.x_in): that layer's
        # rows of it join the walk over shared names below
        also_outside: dict[int, set[str]] = {}
        for name, *_ in (*outside, *after):
            head, dot, rest = name.partition(".")
            if dot and head[:1] == "h" and head[1:].isdigit() and int(head[1:]) < layers:
                also_outside.setdefault(int(head[1:]), set()).add(rest)
        # own tensors of each distinct block under each table: the last kept size of each name (all in a block)
        owned: dict[tuple[int, int], tuple[int, int, dict]] = {}  # (block, id(table)) -> (sum, count, last)

        def own(b: int, table: dict) -> tuple[int, int, dict] | None:
            key = (b, id(table))
            if key not in owned:
                last: dict[str, int | None] = {}
                for name, nbytes, k, mine in block_rows[b]:
                    if mine:
                        if table[k, True]:
                            if not (nbytes >= 0 and float(nbytes).is_integer()):
                                return None
                            last[name] = int(nbytes)
                        else:
                            last.setdefault(name, None)
                sizes = [v for v in last.values() if v is not None]
                owned[key] = (sum(sizes), len(sizes), last)
            return owned[key]

        if one_table:  # every layer keeps by `keeps`: each distinct block's count of layers (_block_counts)
            tables = {id(keeps): keeps}
            counts = {(b, id(keeps)): n for b, n in self._block_counts}
        else:
            counts: dict[tuple[int, int], int] = {}
            tables = {}
            for i, b in enumerate(self.layer_blocks):
                table = layer_keeps(i)
                tables[id(table)] = table
                counts[b, id(table)] = counts.get((b, id(table)), 0) + 1
        block_total, block_names = 0, 0
        for (b, t), n in counts.items():
            mine = own(b, tables[t])
            if mine is None:
                return None
            block_total += n * mine[0]
            block_names += n * mine[1]
        # shared names (and the own ones above) in order: last kept size, and whether the last save is a block's
        kept: dict[str, float] = {}
        in_blocks: dict[str, bool] = {}
        shared_rows = [tuple(r for r in rows if not r[3]) for rows in block_rows]

        def walk(name: str, nbytes: float, key, in_block: bool, table: dict = keeps) -> None:
            in_blocks[name] = in_block
            if table[key, in_block]:
                kept[name] = nbytes

        for row in outside:
            walk(*row)
        for i, b in enumerate(self.layer_blocks):
            table = layer_keeps(i)
            if i in also_outside:
                for name, nbytes, key, mine in block_rows[b]:
                    if not mine:
                        walk(name, nbytes, key, True, table)
                    elif name in also_outside[i]:
                        walk(f"h{i}.{name}", nbytes, key, True, table)
                last = own(b, table)[2]
                for name in also_outside[i]:
                    if last.get(name) is not None:
                        block_total -= last[name]
                        block_names -= 1
            else:
                for name, nbytes, key, _ in shared_rows[b]:
                    walk(name, nbytes, key, True, table)
        for row in after:
            walk(*row)
        for nbytes in kept.values():
            if not (nbytes >= 0 and float(nbytes).is_integer()):
                return None
        in_layers = block_total + sum(int(b) for n, b in kept.items() if in_blocks[n])
        total = in_layers + sum(int(b) for n, b in kept.items() if not in_blocks[n])
        if total >= 2**53:
            return None
        # as the walk's sums: an int 0 when nothing is summed
        layer_value = float(in_layers) if block_names or any(in_blocks[n] for n in kept) else 0
        return layer_value, (float(total) if block_names or kept else 0) - layer_value

    @functools.cached_property
    def _save_rows(self) -> tuple[tuple[tuple[str, float, str, bool], ...], dict[str, bool]]:
        """Every saved tensor of the ops in order as (name, bytes, tag, saved by a block op), and whether the
        last op saving each name is a block's: what saved_split reads under any policy (with_recompute keeps it)."""
        rows = [(s.name, s.bytes, s.tag, False) for op in self.pre for s in op.saves]
        for i, b in enumerate(self.layer_blocks):
            rows.extend((f"h{i}.{name}" if own else name, nbytes, tag, True)
                        for name, nbytes, tag, own in self._block_rows[b])
        rows.extend((s.name, s.bytes, s.tag, False) for op in self.post for s in op.saves)
        return tuple(rows), {name: in_block for name, _, _, in_block in rows}

    def backward_transient_bytes(self) -> float:
        """Largest working set of backward on top of the kept tensors: the gradients of one op (transient_bytes)
        plus, under recompute, the tensors the policy brings back for the block being differentiated.

        A checkpointed region's tensors come back when backward first reaches the region (its last op that
        saves one) and each is freed once the first op that saved it is differentiated, so at op j's backward
        the live ones are those whose first saver is at or before j and whose region ends at or after j. The
        peak is the largest of (those bytes + op j's gradient working set) over the ops of every distinct block,
        and the loss/head gradients; backward starts at the last block with every block's kept tensors held.
        Equal to transient_bytes() without recompute. Cached per anatomy.
        Ref: Chen et al., "Training Deep Nets with Sublinear Memory Cost", arXiv 1604.06174, sec. 4 (the cost of
        recomputation is the checkpoints plus the largest segment's activations); Korthikanti et al., arXiv
        2205.05198, sec. 5 (full recompute keeps each layer's input and re-creates one layer at a time)."""
        return self._backward_transient

    @functools.cached_property
    def _backward_transient(self) -> float:
        if self.recompute == "none":
            return self._transient
        if self.by_layers:  # a recomputed layer's backward brings its tensors back, as under full recompute
            return with_recompute(self, "full" if self.full_share else "none").backward_transient_bytes()
        plain, keep = _keep_table("none", self.compiled), self._save_kept
        worst = max((op.transient_bytes for op in (*self.pre, *self.post)), default=0.0)
        for ops in self.blocks:
            first: dict[str, int] = {}  # a brought-back tensor's first saver, and its size
            size: dict[str, float] = {}
            kept: set[str] = set()
            end = -1  # the region's last op that saves a brought-back tensor
            for j, op in enumerate(ops):
                for t in op.saves:
                    if keep(op, t):
                        kept.add(t.name)
                    elif plain[t.tag, True]:
                        first.setdefault(t.name, j)
                        size[t.name] = max(size.get(t.name, 0.0), t.bytes)
                        end = j
            born = [0.0] * (len(ops) + 1)
            for name, j in first.items():
                if name not in kept:
                    born[j] += size[name]
            live = 0.0
            for j, op in enumerate(ops):
                live += born[j]
                worst = max(worst, (live if j <= end else 0.0) + op.transient_bytes)
        return worst

    def transient_bytes(self) -> float:
        """Largest working set of gradients during backward, on top of the saved tensors.

        Backward starts at the loss with every activation still saved, so the step's activation
        peak is saved_bytes() + this (the loss and softcap gradients for small models with large
        vocabularies, a block's widest gradients otherwise). Allocator slack is not included.
        """
        return self._transient

    @functools.cached_property
    def _transient(self) -> float:
        return max((op.transient_bytes for ops in (self.pre, *self.blocks, self.post) for op in ops), default=0.0)

    def flops_fwd(self) -> float:
        return sum(self._walk(lambda op: op.flops_fwd))

    def flops_bwd(self) -> float:
        """Model FLOPs of backward (no recompute)."""
        return sum(self._walk(lambda op: op.flops_bwd))

    def recompute_flops(self) -> float:
        """FLOPs re-run in backward: the recompute policy's forward re-runs plus kernel-internal recompute."""
        if self.by_layers:  # per kind of block, the forward of its ops full recompute re-runs, times its re-run layers
            return (sum(self._walk(lambda op: op.recompute_flops_bwd))
                    + sum(again * sum(op.flops_fwd for op in self.blocks[b] if recomputed_under(op, "full"))
                          for b, again in enumerate(self.layers_again)))
        total = sum(self._walk(lambda op: op.recompute_flops_bwd))
        return total + sum(self._walk(lambda op: op.flops_fwd, self.recomputes))

    def recomputes(self, op: Op) -> bool:
        """Whether the recompute policy re-runs this op's forward inside backward (under `full:N`, an op of a layer
        it re-runs: layer_again)."""
        if self.by_layers:
            return op.layer is not None and self.layer_again(op.layer) and recomputed_under(op, "full")
        return recomputed_under(op, self.recompute)

    def matmul_flops(self) -> float:
        """FLOPs of GEMMs and attention only, forward + backward + recompute, excluding flash's internal
        recompute: what torch.utils.flop_counter.FlopCounterMode counts with the math attention backend."""
        if self.by_layers:  # no recompute's matmuls, plus the re-run layers' forward ones (recompute_flops' way)
            matmul = ("gemm", "attention")
            return (sum(self._walk(lambda op: op.flops_fwd + op.flops_bwd, lambda op: op.kind in matmul))
                    + sum(again * sum(op.flops_fwd for op in self.blocks[b]
                                      if op.kind in matmul and recomputed_under(op, "full"))
                          for b, again in enumerate(self.layers_again)))
        total = 0.0
        for flops in self._walk(lambda op: op.flops_fwd + op.flops_bwd + (op.flops_fwd if self.recomputes(op) else 0.0),
                                lambda op: op.kind in ("gemm", "attention")):
            total += flops
        return total


def _moved(ops: tuple[Op, ...], layer: int) -> tuple[Op, ...]:
    """A block's ops as another layer's copy: its layer index and the `h{i}.` names of the ops and of what they
    save (names without that prefix, shared by layers, stay)."""
    if not ops or ops[0].layer == layer:
        return ops
    old, new = f"h{ops[0].layer}.", f"h{layer}."

    def name(n: str) -> str:
        return new + n[len(old):] if n.startswith(old) else n

    return tuple(_with(op, name=name(op.name), layer=layer,
                       saves=tuple(_with(s, name=name(s.name)) if s.name.startswith(old) else s for s in op.saves))
                 for op in ops)


# what an anatomy caches from its ops alone, the same under every recompute policy
_OPS_ONLY_CACHES = ("ops", "op_repeats", "_transient", "_save_rows", "_block_rows", "_block_counts",
                    "_saved_after_embeddings")


def with_recompute(anatomy: Anatomy, recompute: Recompute, chunks: int | None = None) -> Anatomy:
    """The same ops under another recompute policy (dataclasses.replace), keeping what the anatomy already cached
    from its ops alone (_OPS_ONLY_CACHES: none of them reads the policy), so a search's three policies of one
    share walk its ops once. chunks: the model chunks a `full:N` policy counts in (pp x vp; default: as is)."""
    chunks = anatomy.chunks if chunks is None else chunks
    if recompute == anatomy.recompute and chunks == anatomy.chunks:
        return anatomy
    new = anatomy._variants.get((recompute, chunks))
    if new is None:
        new = anatomy._variants[recompute, chunks] = replace(anatomy, recompute=recompute, chunks=chunks)
        for name in _OPS_ONLY_CACHES:
            if name in anatomy.__dict__:
                new.__dict__[name] = anatomy.__dict__[name]
    return new


def rerun_whole(anatomy: Anatomy) -> Anatomy:
    """The same ops with every checkpointed region re-run whole in backward: Op.recompute_skip cleared, so full
    recompute re-runs a block's last GEMM (and the adds after it) and selective the attention core's PV product.
    Reentrant checkpoints do not stop early: Megatron's CheckpointFunction re-runs `ctx.run_function(*inputs)` whole
    in backward (megatron/core/tensor_parallel/random.py, NVIDIA/Megatron-LM@0609f27fe8 L231-232), as DeepSpeed's and
    Transformer Engine's reentrant checkpoint do, and torchtitan wraps its blocks with early_stop=False
    (torchtitan/distributed/activation_checkpoint.py@b5bcd76 L176-180, L278-285). torch's non-reentrant checkpoint
    stops once every saved tensor is back (torch/utils/checkpoint.py, early_stop=True by default), the
    recompute_skip default. Cached on the anatomy; keeps its recompute policy."""
    whole = anatomy._variants.get(("whole", 0))  # a cached property: _with copies none to a derived anatomy
    if whole is None:
        def cleared(ops: tuple[Op, ...]) -> tuple[Op, ...]:
            return tuple(_with(op, recompute_skip=()) if op.recompute_skip else op for op in ops)

        whole = anatomy._variants["whole", 0] = _with(anatomy, pre=cleared(anatomy.pre),
                                                      blocks=tuple(cleared(b) for b in anatomy.blocks),
                                                      post=cleared(anatomy.post))
    return whole


def recomputed_under(op: Op, policy: str) -> bool:
    """Whether a recompute policy re-runs an op's forward in backward (torch's non-reentrant checkpoint
    stops early: the region's last op is not re-run, see Op.recompute_skip). Under `full:N`, whether a layer it
    re-runs re-runs the op, as full recompute (which layers: Anatomy.layer_again; the sums: Anatomy.full_share)."""
    if recompute_layers(policy) is not None:
        policy = "full"
    modules = recompute_modules(policy)
    if modules is not None:  # Megatron's per-module recompute re-runs each module's whole forward
        if op.attention_core:
            return "core_attn" in modules and "selective" not in op.recompute_skip
        return bool(modules_of(op) & modules)
    if policy == "per-op":  # torchtitan checkpoints with early_stop=False: the whole block re-runs
        return op.layer is not None and not op.per_op_saved
    if policy in op.recompute_skip:
        return False
    if policy == "full":
        return op.layer is not None
    return policy == "selective" and op.attention_core


def modules_of(op: Op) -> frozenset[str]:
    """The Megatron modules a block op runs in (Op.module where a kernel put it elsewhere, else op_modules by its
    name); none outside the blocks."""
    if op.layer is None:
        return frozenset()
    return op_modules(op.name.partition(".")[2]) if op.module is None else op.module


def op_modules(name: str) -> frozenset[str]:
    """The Megatron modules (ddplan.runfields.RECOMPUTE_MODULES) a block op belongs to, by its name within the block
    (`norm1`, `mlp.c_fc`, `experts.act`); the attention core goes by Op.attention_core instead."""
    if name in ("norm1", "norm2"):
        return frozenset({"layernorm"})
    if name.startswith("mlp."):
        return frozenset({"mlp"})
    if name == "experts.act":
        return frozenset({"moe", "moe_act"})
    if name.startswith(("shared.", "moe.shared_")):  # Megatron's SharedExpertMLP holds the shared gate too
        return frozenset({"moe", "shared_experts"})
    if name.startswith(("moe.", "experts.")):
        return frozenset({"moe"})
    return frozenset()


def tensor_modules(name: str) -> frozenset[str]:
    """The Megatron modules whose recompute drops a block's saved tensor (its name within the block): the ones that
    made it. A checkpointed module keeps its inputs (what another module made) and re-makes the rest; layernorm's
    and moe_act's outputs are discarded too (CheckpointWithoutOutput), so the normed inputs of the next GEMMs
    (xn1, xn2) and the experts' activation output go with them. A module's output that the block saves elsewhere
    (the attention core's, attn_out) stays."""
    if name in ("xn1", "xn2") or name.startswith(("norm1.", "norm2.")):
        return frozenset({"layernorm"})
    if name in ("experts.silu_g", "experts.act_out", "experts.unweighted"):  # made by the activation (.h, .g are its input)
        return frozenset({"moe", "moe_act"})
    if name == "shared.out":  # the shared experts' output before their gate, inside the module
        return frozenset({"moe", "shared_experts"})
    return op_modules(name.removesuffix(".out").removesuffix(".weight_cast").removesuffix(".mask"))


def module_keeps(op: Op, saved: Saved, modules: frozenset[str], compiled: bool) -> bool:
    """Whether per-module recompute of `modules` keeps what `op` saves: the attention core as selective recompute
    keeps it (core_attn in modules) or as no recompute does; a block's tensor made inside a re-run module is dropped;
    the rest is kept as without recompute."""
    in_block = op.layer is not None
    if in_block and op.attention_core:
        return _keep_table("selective" if "core_attn" in modules else "none", compiled)[saved.tag, True]
    mine = tensor_modules(saved.name.partition(".")[2]) if saved.module is None else saved.module
    if in_block and mine & modules:
        return False
    return _keep_table("none", compiled)[saved.tag, in_block]


def _kept(tag: str, in_block: bool, recompute: str, compiled: bool) -> bool:
    """Whether a tensor saved with this tag by an op (in a block or not) is kept for backward (SaveTag)."""
    if tag == "op_output" or recompute == "per-op" and in_block:
        # per-op: a block keeps its checkpoint's inputs and the outputs SelectiveAC saves, nothing else
        return recompute == "per-op" and in_block and tag in ("input", "ckpt_input", "op_output")
    if tag == "pointwise" and compiled or tag == "compiled" and not compiled:
        return False
    if tag == "ckpt_input":
        return recompute != "none"
    if tag == "core_input":
        return recompute == "selective"
    if not in_block or tag == "input" or recompute == "none":
        return True
    if recompute == "full":
        return False
    return tag != "core"  # selective


@functools.lru_cache(maxsize=None)
def _keep_table(recompute: str, compiled: bool) -> dict[tuple[str, bool], bool]:
    """_kept for every (tag, in a block) under one policy and compile mode: a lookup per saved tensor."""
    return {(tag, in_block): _kept(tag, in_block, recompute, compiled)
            for tag in typing.get_args(SaveTag) for in_block in (False, True)}


def attention_pairs(seq_len: int, window: int, kind: AttentionKind, windows: WindowSupport) -> int:
    """(query, key) pairs per head and sequence that an attention implementation computes.

    Causal with a window of w tokens to the left (flash-attention's window_size=(w, 0), which nanochat
    passes): query i attends keys max(0, i-w)..i, w+1 keys, so pairs = sum_i min(i+1, w+1); a full
    window (w >= s) gives s(s+1)/2. Unfused math computes all s^2 scores and masks after; fused
    SDPA skips the masked triangle only under is_causal (full window): a sliding window needs an
    explicit mask and computes s^2 (so does any implementation whose windows need a mask); flash
    packages skip every block outside the window (block granularity ignored). Ref: FlashAttention-2 (arXiv 2307.08691) Sec. 3.1 on causal block skipping.
    """
    if seq_len <= 0 or window <= 0:
        raise ValueError(f"seq_len and window must be positive, got {seq_len}, {window}")
    k = min(window + 1, seq_len)  # keys per query once the window is full
    exact = k * (k + 1) // 2 + (seq_len - k) * k
    if kind in UNFUSED_KINDS or windows == "mask" and window < seq_len:
        return seq_len * seq_len  # all scores computed, the masked ones thrown away
    return exact


# --------------------------------------------------------------------------------------------


def _fp32_cast_bytes(e: int) -> int:
    """Bytes per element of a cast between a compute dtype of e bytes and float32 (read one, write the other); none
    in float32 itself, where .float() and type_as return their input."""
    if e <= 0:
        raise ValueError(f"an element's bytes must be positive, got {e}")
    return e + 4 if e != 4 else 0


def decomposed_rmsnorm_bytes(e: int, learnable: bool = True) -> tuple[float, float]:
    """Bytes an RMSNorm moves per element, forward and backward, written as torch ops in float32 and run eagerly, each
    op its own kernel (per-row statistics left out), for a compute dtype of e bytes (c: a cast to or from float32,
    e + 4, none in float32).
    Forward: x.float() (c), pow(2) (8), mean over the row (4), x * rsqrt(...) (8), type_as(x) (c), then * weight
    (2e): 2c + 20 + 2e. Backward, as autograd runs those ops: the weight's product (grad x weight 2e, grad x normed
    3e and its sum over tokens e), the cast back to float32 (c), x * rstd's two gradients (grad x rstd 8; grad x x 12
    and its sum over the row 4), the mean's expanded gradient (4), pow's (x.pow(1) 8, times 2 8, times the gradient
    12), the two gradients of x added (12) and the cast back (c): 2c + 68 + 6e. Without a weight: 2e and 6e less.
    e.g. bf16: 36 and 92 bytes, against 4 and 6 for one fused kernel (a fused norm's one read and write).
    Ref: torchtitan/models/norms.py@989718967 L39-64 (RMSNorm._norm, forward), the same as Meta's Llama reference
    model; torch's autograd formulas (tools/autograd/derivatives.yaml: pow_backward, mul, mean, _to_copy), checked by
    logging every aten op's reads and writes in a torch dispatch mode (tests/test_anatomy.py)."""
    c = _fp32_cast_bytes(e)
    weight_fwd, weight_bwd = (2 * e, 6 * e) if learnable else (0, 0)
    return 2 * c + 20 + weight_fwd, 2 * c + 68 + weight_bwd


def decomposed_rope_bytes(e: int) -> tuple[float, float]:
    """Bytes a rotary embedding moves per element of q or k, forward and backward, in complex float32 as torch ops
    run eagerly: x.float() (c, as decomposed_rmsnorm_bytes), the complex product with the frequency table (8),
    type_as(x) (c); backward the same three in reverse (the product's gradient times the table's conjugate): 2c + 8
    each way, e.g. bf16: 20 (one fused kernel: 4). The table's own reads, once per token and pair for all heads, are
    left out (0.5 byte an element at 8 heads). The reshapes and view_as_complex / view_as_real are views.
    Ref: torchtitan/models/llama/model.py@989718967 L89-115 (apply_rotary_emb), as Meta's Llama reference model."""
    c = _fp32_cast_bytes(e)
    return 2 * c + 8, 2 * c + 8


def decomposed_swiglu_bytes(e: int) -> tuple[float, float]:
    """Bytes SwiGLU's elementwise part, silu(g) * u, moves per element of g when silu and the product run as two
    kernels: forward silu (2e) and the product (3e), 5e; backward the product's two gradients (3e each) and
    silu's (3e), 9e. e.g. bf16: 10 and 18 (one kernel: 6 and 10).
    Ref: torchtitan/models/llama/model.py@989718967 FeedForward.forward, w2(F.silu(w1(x)) * w3(x))."""
    return 5 * e, 9 * e


class _Builder:
    """Accumulates ops for one model and micro-batch; one method per kind of operation."""

    def __init__(self, spec: ModelSpec, batch: int, seq_len: int, ep: int = 1, expert_rows: int = 1,
                 compiled: bool = False):
        self.spec, self.a, self.ep, self.expert_rows = spec, spec.architecture, ep, expert_rows
        self.fused = spec.recipe.fusions == "transformer-engine"  # fused norms, RoPE and SwiGLU (Recipe.fusions)
        # each torch op its own kernel (Recipe.fusions "decomposed"; "fused-norm": all but the norm), eager only:
        # compiled, Inductor fuses the chain
        self.decomposed = spec.recipe.fusions in ("decomposed", "fused-norm") and not compiled
        self.decomposed_norm = spec.recipe.fusions == "decomposed" and not compiled
        # torch's fused RMSNorm (fusions "fused-norm") keeps its input and statistics only, as a TE norm does
        self.torch_fused_norm = spec.recipe.fusions == "fused-norm"
        self.b, self.s, self.t = batch, seq_len, batch * seq_len
        self.e = dtype_bytes(spec.dtypes.compute)  # activation element size
        self.ops: list[Op] = []
        self.matmuls: dict[int, int] = {}  # a block's matmuls so far (per_op_keeps)

    def per_op_keeps(self, layer: int | None, weight_group: str, name: str) -> bool:
        """Whether torchtitan's per-op SelectiveAC keeps the output of this block's next matmul: it counts a
        checkpointed block's aten.mm calls in forward order and saves the odd ones (1st, 3rd, ...), recomputing
        every second; grouped expert GEMMs (torch._grouped_mm, not in its save list) and the router's gate
        (force-recomputed by default, `force_recompute_mm_shapes_by_fqns`) are recomputed and not counted.
        Ref: PER_OP_SOURCE (SelectiveAC._wrap_block's policy: it counts aten.mm and aten.linear; its save list is
        _get_default_save_ops, torch._functorch.partitioners.get_default_op_list().compute_intensive_ops, which holds
        mm, bmm, addmm and the SDPA kernels, plus SDPA's cuDNN and math variants). A linear with a bias runs
        aten.addmm, which the policy saves without counting (as the reference model checks)."""
        if layer is None or weight_group in ("experts", "router"):
            return False
        if self.a.linear_bias or self.a.qkv_bias and name.endswith((".c_q", ".c_k", ".c_v")):
            return True  # aten.addmm: saved, not counted
        self.matmuls[layer] = self.matmuls.get(layer, 0) + 1
        return self.matmuls[layer] % 2 == 1

    def gemm(self, name: str, layer: int | None, k: int, n: int, x: str, weight_group: str,
             *, x_saved_tag: SaveTag = "keep", m: float | None = None, x_bytes: float | None = None,
             experts: int = 1) -> None:
        """y = x @ W^T: x (m x k) saved as `x`; the weight is cast from its master dtype to compute dtype.

        A cast weight (fp32 master -> bf16) is a new tensor that the matmul saves; a weight already in
        compute dtype is saved by reference (no new bytes). experts > 1: a grouped GEMM of that many
        k x n weights, the m rows split evenly (its shape names one expert's m / experts rows).
        """
        m = self.t if m is None else m
        e, w_master = self.e, dtype_bytes(self.spec.dtypes.params.get(weight_group, self.spec.dtypes.compute))
        # a column-parallel GEMM reads the replicated input; a row-parallel one its shard
        saves = [Saved(x, m * k * e if x_bytes is None else x_bytes, x_saved_tag,
                       tp_sharded=tp_split(name, "gemm") == "k")]
        cast = w_master != e
        w = k * n * experts  # weight elements
        if cast:
            saves.append(Saved(f"{name}.weight_cast", w * e, "pointwise"))
        kept = self.per_op_keeps(layer, weight_group, name)
        if kept:  # its output, m x n (a column-parallel GEMM's is split over tp, a row-parallel one's partial sum not)
            saves.append(Saved(f"{name}.out", m * n * e, "op_output", tp_sharded=tp_split(name, "gemm") == "n"))
        self.ops.append(Op(
            name=name, kind="gemm", layer=layer, shape=(max(1, round(m / experts)), n, k),
            flops_fwd=2.0 * m * n * k, flops_bwd=4.0 * m * n * k,
            # forward reads x, W (and the master for the cast), writes y; backward reads dY, x, W,
            # writes dX and dW (accumulated into the master-dtype grad)
            bytes_fwd=m * k * e + w * e + m * n * e + (w * (w_master + e) if cast else 0),
            bytes_bwd=m * n * e * 2 + m * k * e * 2 + w * e * 2 + (w * w_master * 2 if cast else 0),
            saves=tuple(saves), weight_group=weight_group, weight_elements=float(w), calls=experts,
            per_op_saved=kept,
        ))

    def pointwise(self, name: str, layer: int | None, numel: int, *, reads: int, writes: int = 1,
                  saves: tuple[Saved, ...] = (), flops_per_element: float = 1.0, bwd_reads: int | None = None,
                  bwd_writes: int | None = None, elem_bytes: int | None = None, kind: OpKind = "elementwise",
                  core: bool = False, transient: float = 0.0,
                  moved: tuple[float, float] | None = None) -> None:
        """An elementwise op on numel elements: reads and writes that many tensors of elem_bytes each way (or
        `moved`, the bytes per element forward and backward, where its kernels move other amounts)."""
        e = self.e if elem_bytes is None else elem_bytes
        bwd_reads = reads + 1 if bwd_reads is None else bwd_reads
        bwd_writes = reads if bwd_writes is None else bwd_writes
        fwd, bwd = moved if moved is not None else ((reads + writes) * e, (bwd_reads + bwd_writes) * e)
        self.ops.append(Op(
            name=name, kind=kind, layer=layer, shape=(numel,),
            flops_fwd=flops_per_element * numel, flops_bwd=2 * flops_per_element * numel,
            bytes_fwd=fwd * numel, bytes_bwd=bwd * numel,
            saves=saves, attention_core=core, transient_bytes=transient,
        ))

    def norm(self, name: str, layer: int | None, x: str, learnable: bool, tag: SaveTag = "keep",
             core: bool = False, rows_per_token: int = 1, width: int | None = None) -> None:
        """RMSNorm / LayerNorm over rows of `width` elements per token (default d_model; the per-head QK norms
        see all heads x head_dim, split into rows_per_token rows): saves its input and per-row statistics (fp32)."""
        a, t = self.a, self.t
        w = a.d_model if width is None else width
        stats = 2 if a.norm == "layernorm" else 1
        saves = (Saved(x, t * w * self.e, tag, tp_sharded=core),
                 Saved(f"{name}.stats", t * rows_per_token * stats * 4, "keep", tp_sharded=core))
        if learnable and a.norm == "rmsnorm" and not self.fused and not self.torch_fused_norm:
            # x * rstd * weight: the weight's gradient needs the normalised x, a tensor of its own (a fused norm,
            # Transformer Engine's or torch's aten._fused_rms_norm, re-makes it from x and rstd: its autograd entry
            # saves input, rstd and weight, tools/autograd/derivatives.yaml _fused_rms_norm)
            saves = (*saves, Saved(f"{name}.normed", t * w * self.e, "pointwise", tp_sharded=core))
        moved = None
        if self.decomposed_norm and a.norm == "rmsnorm":
            # in float32 op by op: pow and x * rstd keep x.float() where a fused norm keeps x (its extra bytes)
            moved = decomposed_rmsnorm_bytes(self.e, learnable)
            if self.e < 4:
                saves = (*saves, Saved(f"{name}.x_fp32", t * w * (4 - self.e), "pointwise", tp_sharded=core))
        self.pointwise(name, layer, t * w, reads=1, saves=saves, flops_per_element=4.0,
                       bwd_reads=2, bwd_writes=1, kind="reduction", core=core, moved=moved)


def build_anatomy(spec: ModelSpec, *, batch: int, seq_len: int | None = None,
                  attention: AttentionKind = "flash_package", windows: WindowSupport = "native",
                  recompute: Recompute = "none", compiled: bool = False,
                  window_pattern: str | None = None, tp: int = 1, ep: int = 1, expert_rows: int = 1) -> Anatomy:
    """The ops of one forward+backward of `batch` sequences of `seq_len` tokens (default: the recipe's).

    tp > 1: one tensor-parallel rank's share (Megatron: Q/K/V, MLP-in and lm_head split by columns,
    the output projections by rows, heads split, norms and the residual stream replicated, no sequence
    parallelism). Ref: Shoeybi et al., arXiv 1909.08053, sec. 3; Korthikanti et al., arXiv 2205.05198, sec. 4.
    ep > 1: one expert-parallel rank's share of a mixture-of-experts model (num_experts / ep experts, see _moe);
    expert_rows > 1: the experts are whole on each tensor-parallel rank (etp 1), which routes its own
    1 / expert_rows of the tokens: their ops are built as that rank's share, and for_tp leaves them so.
    """
    if tp < 1 or ep < 1 or expert_rows < 1:
        raise ValueError(f"tp, ep and expert_rows must be >= 1, got {tp}, {ep}, {expert_rows}")
    moe = spec.architecture.moe
    if ep > 1 and (moe is None or moe.num_experts % ep):
        raise ValueError(f"ep={ep} must divide the number of experts "
                         f"({moe.num_experts if moe else 'none: a dense model'})")
    if batch <= 0:
        raise ValueError(f"batch must be positive, got {batch}")
    s = spec.recipe.seq_len if seq_len is None else seq_len
    if s <= 0 or s > spec.architecture.max_seq_len:
        raise ValueError(f"seq_len must be in 1..{spec.architecture.max_seq_len}, got {s}")
    if recompute not in RECOMPUTE_POLICIES and recompute_modules(recompute) is None and recompute_layers(recompute) is None:
        raise ValueError(f"recompute must be one of {RECOMPUTE_POLICIES}, full:N or selective:MODULE+..., "
                         f"got {recompute!r}")
    if window_pattern is not None:
        spec = spec.model_copy(update={"architecture": spec.architecture.model_copy(
            update={"window_pattern": window_pattern})})
    bld = _Builder(spec, batch, s, ep, expert_rows, compiled)
    _embeddings(bld)
    pre, bld.ops = tuple(bld.ops), []
    blocks: list[tuple[Op, ...]] = []
    index: dict[tuple, int] = {}  # a block's kind -> its index in blocks
    layer_blocks = []
    value_layers = frozenset(spec.architecture.value_embedding_layers())
    for i, window in enumerate(spec.architecture.windows(s)):
        kind = _block_kind(spec.architecture, i, window, value_layers)
        if kind not in index:  # the first layer of its kind is built; the later ones are its copies (Anatomy.ops)
            _block(bld, i, window, attention, windows)
            index[kind] = len(blocks)
            blocks.append(tuple(bld.ops))
            bld.ops = []
        layer_blocks.append(index[kind])
    _head(bld)
    post = tuple(bld.ops)
    if tp > 1:
        pre, post = (tuple(_tp_share(op, tp) for op in ops) for ops in (pre, post))
        blocks = [tuple(_tp_share(op, tp) for op in ops) for ops in blocks]
    return Anatomy(model=spec.name, batch=batch, seq_len=s, attention=attention, windows=windows,
                   recompute=recompute, compiled=compiled, pre=pre, blocks=tuple(blocks),
                   layer_blocks=tuple(layer_blocks), post=post, optimizer_ops=tuple(optimizer_ops(spec)), tp=tp,
                   ep=ep, expert_rows=expert_rows, elem_bytes=bld.e)


def _block_kind(a, i: int, window: int, value_layers: frozenset[int]) -> tuple:
    """What makes block i's ops differ from another block's, besides its index and `h{i}.` names (what _block
    reads of i): its attention window, block 0 reading x0 as its input (nanochat's per-layer scalars), a value
    embedding, a mixture-of-experts MLP. Blocks of one kind are one block's copies (Anatomy.ops)."""
    return (window, i == 0 and bool(a.scalars_per_layer), i in value_layers, a.is_moe_layer(i))


# expert MLPs split over tp as the dense MLP is (Megatron-Core's expert tensor parallelism = tp)
_COL = (".c_q", ".c_k", ".c_v", ".ve_gate", ".mlp.c_fc", ".mlp.gate", ".mlp.up", ".experts.c_fc", ".experts.gate",
        ".experts.up", ".shared.c_fc", ".shared.gate", ".shared.up")
_ROW = (".attn.c_proj", ".mlp.c_proj", ".experts.c_proj", ".shared.c_proj")
_NUMEL = (".attn.rope", ".attn.q_norm", ".attn.k_norm", ".attn.ve_mix", ".ve", ".mlp.act", ".attn.repeat_kv",
          ".attn.probs_dropout", ".experts.act", ".shared.act")
_HEAD = ("logits_cast", "logits_softcap", "cross_entropy", "loss_head_grad")  # vocab-parallel: split over tp


def tp_split(name: str, kind: str) -> str | None:
    """How tensor parallelism splits an op: 'n' (column-parallel GEMM), 'k' (row-parallel), 'numel'
    (elementwise on a split tensor), or None (replicated: norms, residual stream, embeddings, gates)."""
    if kind == "attention":
        return "numel"
    if name == "lm_head" or name.endswith(_COL):
        return "n"
    if name.endswith(_ROW):
        return "k"
    if name in _HEAD or name.endswith(_NUMEL):
        return "numel"
    return None


def _OWN_TAG(op: Op, saved: Saved) -> str:
    """A saved tensor's own tag (what a named policy's keep table is looked up by)."""
    return saved.tag


# a per-module policy's keep table: each tensor's tag is already whether the policy keeps it
_AS_FLAGGED = {(True, True): True, (True, False): True, (False, True): False, (False, False): False}


def _with(obj, **changes):
    """A copy of a frozen dataclass with some fields changed (dataclasses.replace without re-validating:
    ~5x faster, which matters when a layout search derives thousands of ops). What the original cached
    from its own fields (functools.cached_property: Anatomy.saved_split, op_repeats, ...) is not copied."""
    new = object.__new__(type(obj))
    new.__dict__.update(obj.__dict__)
    for name in _cached_names(type(obj)):
        new.__dict__.pop(name, None)
    new.__dict__.update(changes)
    return new


@functools.lru_cache(maxsize=None)
def _cached_names(cls: type) -> tuple[str, ...]:
    """The functools.cached_property attributes of a class (and its bases)."""
    return tuple(name for klass in cls.__mro__ for name, v in vars(klass).items()
                 if isinstance(v, functools.cached_property))


EMBEDDING_DROPOUT = "emb.dropout"
# ops outside the layers that sequence parallelism splits over the sequence: the final norm, and the embeddings'
# dropout (Megatron scatters the embeddings to the sequence-parallel region first; Korthikanti et al. sec. 4.3)
SP_OUTSIDE_LAYERS = ("norm_f", EMBEDDING_DROPOUT)


def for_tp(base: Anatomy, tp: int, sequence_parallel: bool = False) -> Anatomy:
    """One tensor-parallel rank's share of a tp=1 anatomy (same as build_anatomy(..., tp=tp), cheaper).

    sequence_parallel: Megatron's sequence parallelism (Korthikanti et al., arXiv 2205.05198, sec. 4.2.2):
    the ops tp leaves replicated inside the layers (norms, residual adds, dropout), the final norm and the
    embeddings' dropout (SP_OUTSIDE_LAYERS) run on 1/tp of the sequence, and every tensor a layer saves is kept
    split over tp, so a layer's activation memory is exactly the tp = 1 figure over tp (their Table 2:
    sbh(34 + 5as/h) / t).
    """
    if base.tp != 1:
        raise ValueError(f"need a tp=1 anatomy, got tp={base.tp}")
    if tp == 1:
        return base
    def share(ops: tuple[Op, ...]) -> tuple[Op, ...]:
        return tuple(_sp_share(op, tp) if sequence_parallel and (op.layer is not None or op.name in SP_OUTSIDE_LAYERS)
                     else _tp_share(op, tp) for op in ops)

    # each distinct block once: a share reads an op's kind and the end of its name, the same in every layer
    return _with(base, pre=share(base.pre), blocks=tuple(share(b) for b in base.blocks), post=share(base.post), tp=tp,
                 sequence_parallel=sequence_parallel)


def for_cp(full: Anatomy, short: Anatomy, cp: int) -> Anatomy:
    """One context-parallel rank's share: its s / cp tokens of each sequence (Megatron-Core and torchtitan
    context parallelism, causal load balancing: each rank holds chunks i and 2cp - 1 - i of 2cp).

    full: the anatomy at the whole sequence s; short: the same configuration built at s / cp tokens (both
    the same tp share). Every op outside the attention core is the short anatomy's (GEMMs, norms, the
    head and loss on s / cp tokens; weight-sized traffic such as the embedding's dense gradient unscaled);
    the attention core is the full sequence's over cp, as its s / cp queries see keys across the whole
    sequence and the balanced chunks give every rank 1 / cp of the work (and of its saved tensors).
    The ring's KV exchange is priced in ddplan.step (comm.cp_ring_exposed_s), not here.
    Ref: Liu et al., "Ring Attention", arXiv 2310.01889; Megatron-Core context_parallel docs; torchtitan
    context parallel (torch.distributed.tensor.experimental.context_parallel).
    """
    if cp == 1:
        return full
    if short.seq_len * cp != full.seq_len or (short.tp, short.sequence_parallel) != (full.tp, full.sequence_parallel):
        raise ValueError(f"need the same tp share at s and s / cp; got s {full.seq_len}, {short.seq_len} with cp {cp}")
    def share(ops: tuple[Op, ...], full_ops: tuple[Op, ...]) -> tuple[Op, ...]:
        core = {op.name: op for op in full_ops if op.attention_core}
        return tuple(_cp_core(core[op.name], cp, short.seq_len) if op.attention_core else op for op in ops)

    # a layer's block is its pair (short block, full block): the windows at s / cp can merge kinds that differ at s
    blocks: list[tuple[Op, ...]] = []
    index: dict[tuple[int, int], int] = {}
    layer_blocks = []
    for i, pair in enumerate(zip(short.layer_blocks, full.layer_blocks)):
        if pair not in index:
            index[pair] = len(blocks)
            blocks.append(share(_moved(short.blocks[pair[0]], i), _moved(full.blocks[pair[1]], i)))
        layer_blocks.append(index[pair])
    edges = (*full.pre, *full.post)
    return _with(short, pre=share(short.pre, edges), blocks=tuple(blocks), layer_blocks=tuple(layer_blocks),
                 post=share(short.post, edges), cp=cp)


def _cp_core(op: Op, cp: int, seq: int) -> Op:
    """An attention-core op of the whole sequence, over cp: FLOPs, bytes and saved tensors / cp; its shape
    names the block length each ring step computes (s / cp)."""
    shape = op.shape if op.kind != "attention" else (op.shape[0], op.shape[1], seq, op.shape[3], op.shape[4])
    saves = tuple(_with(sv, bytes=sv.bytes / cp) for sv in op.saves)
    return _with(op, shape=shape, flops_fwd=op.flops_fwd / cp, flops_bwd=op.flops_bwd / cp,
                 bytes_fwd=op.bytes_fwd / cp, bytes_bwd=op.bytes_bwd / cp, saves=saves,
                 recompute_flops_bwd=op.recompute_flops_bwd / cp, transient_bytes=op.transient_bytes / cp)


def _tp_share(op: Op, tp: int, saves: tuple[Saved, ...] | None = None) -> Op:
    """One tensor-parallel rank's share of an op: FLOPs, bytes and sharded saved tensors / tp (saves: the
    share's saved tensors where the caller splits them otherwise, as _sp_share does)."""
    if op.tp_done:
        return op
    replace = _with
    how = tp_split(op.name, op.kind)
    if saves is None:
        saves = tuple(replace(sv, bytes=sv.bytes / tp) if sv.tp_sharded else sv for sv in op.saves)
    if how is None:
        return replace(op, saves=saves)
    shape = op.shape
    if op.kind == "gemm":
        m, n, k = shape
        shape = (m, max(1, n // tp), k) if how == "n" else (m, n, max(1, k // tp))
    elif op.kind == "attention":
        b, h, s, w, hd = shape
        shape = (b, max(1, h // tp), s, w, hd)
    else:
        shape = (max(1, shape[0] // tp), *shape[1:])
    return replace(op, shape=shape, flops_fwd=op.flops_fwd / tp, flops_bwd=op.flops_bwd / tp,
                   bytes_fwd=op.bytes_fwd / tp, bytes_bwd=op.bytes_bwd / tp, saves=saves,
                   recompute_flops_bwd=op.recompute_flops_bwd / tp, transient_bytes=op.transient_bytes / tp)


def _sp_share(op: Op, tp: int) -> Op:
    """One rank's share of a layer op under tensor + sequence parallelism: split ops as under tp, the ops tp
    replicates split over the sequence, and every saved tensor / tp (ddplan.anatomy.for_tp)."""
    if op.tp_done:
        return op
    # experts split over tp: Megatron-Core's dispatcher all-gathers the routed rows over tp before the expert
    # GEMMs, which keep the whole gathered input (the one saved tensor of a layer sequence parallelism leaves whole)
    saves = tuple(sv if sv.name.endswith(".moe.permuted") else _with(sv, bytes=sv.bytes / tp) for sv in op.saves)
    if tp_split(op.name, op.kind) is not None:
        return _tp_share(op, tp, saves)
    shape = (max(1, op.shape[0] // tp), *op.shape[1:])
    return _with(op, shape=shape, flops_fwd=op.flops_fwd / tp, flops_bwd=op.flops_bwd / tp,
                 bytes_fwd=op.bytes_fwd / tp, bytes_bwd=op.bytes_bwd / tp, saves=saves,
                 recompute_flops_bwd=op.recompute_flops_bwd / tp, transient_bytes=op.transient_bytes / tp)


def _embeddings(bld: _Builder) -> None:
    a, t, e = bld.a, bld.t, bld.e
    w_e = dtype_bytes(bld.spec.dtypes.params["wte"])
    # lookup: gather t rows; backward scatter-adds into a dense vocab x d_model gradient
    bld.ops.append(Op(name="wte", kind="embedding", layer=None, shape=(t, a.d_model), flops_fwd=0.0,
                      flops_bwd=float(t * a.d_model), bytes_fwd=t * a.d_model * (w_e + e) + t * 8,
                      bytes_bwd=t * a.d_model * e + a.vocab_size * a.d_model * w_e * 2,
                      saves=(Saved("idx", t * 8, "input", tp_sharded=False),)))
    if a.position == "learned":
        # the position lookup wpe(arange(s)) saves its int64 indices for the embedding backward
        bld.pointwise("wpe_add", None, t * a.d_model, reads=2, flops_per_element=1.0,
                      saves=(Saved("pos_idx", bld.s * 8, "input", tp_sharded=False),))
    if bld.spec.family == "nanochat" or a.embedding_norm:  # x = norm(wte(idx)); nanochat's has no weight
        bld.norm("embed_norm", None, "emb", learnable=a.norm_learnable)
    # the embeddings' dropout (Megatron's Embedding: hidden_dropout; GPT-2's embd_pdrop), its mask kept for
    # backward on the first pipeline stage whatever the recompute policy: Korthikanti et al., arXiv 2205.05198,
    # sec. 4.3 ("the dropout following the embeddings does require storage", sbhp / t with sequence parallelism)
    _dropout(bld, EMBEDDING_DROPOUT, None, t * a.d_model, a.dropout.hidden)
    if a.smear_gate_in_features:
        # smear: gate = lambda * sigmoid(smear_gate(x[:, 1:, :24])); x = cat(x[:, :1], x[:, 1:] + gate * x[:, :-1])
        n_in, tm = a.smear_gate_in_features, t - bld.b  # the gate sees every position but the first
        bld.gemm("smear_gate", None, n_in, 1, "smear.gate_in", "smear_gate", m=tm)
        bld.pointwise("smear_mix", None, t * a.d_model, reads=2, flops_per_element=3.0,
                      saves=(Saved("smear.sigmoid", tm * e, "pointwise", tp_sharded=False),
                             Saved("smear.gate", tm * e, "pointwise", tp_sharded=False),
                             Saved("x_embnorm", t * a.d_model * e, tp_sharded=False)))
    if bld.spec.family == "nanochat":
        pass  # x0 = x is saved by every block's residual mix


def _block(bld: _Builder, i: int, window: int, kind: AttentionKind, windows: WindowSupport) -> None:
    """One transformer block, op by op as the reference model runs it (ddplan/calibrate/reference.py)."""
    a, t, e = bld.a, bld.t, bld.e
    c, hd = a.d_model, a.head_dim
    q_w, kv_w = a.num_heads * hd, a.num_kv_heads * hd
    p = f"h{i}"
    x_in = "x0" if (i == 0 and a.scalars_per_layer) else f"{p}.x_in"  # block 0's input is x0 itself
    if a.scalars_per_layer:
        # x = resid_lambda * x + x0_lambda * x0: saves x (for the lambda grad) and x0 (shared by all layers)
        bld.pointwise(f"{p}.resid_mix", i, t * c, reads=2, flops_per_element=3.0,
                      saves=(Saved(x_in, t * c * e, "input", tp_sharded=False),
                             Saved("x0", t * c * e, "input", tp_sharded=False)))
        normed_in = f"{p}.x_mixed"
    else:
        normed_in = x_in
    bld.norm(f"{p}.norm1", i, normed_in, a.norm_learnable, tag="input" if normed_in == x_in else "keep")
    xn = f"{p}.xn1"
    bld.gemm(f"{p}.attn.c_q", i, c, q_w, xn, "block_matrices", x_saved_tag="pointwise")
    bld.gemm(f"{p}.attn.c_k", i, c, kv_w, xn, "block_matrices", x_saved_tag="pointwise")
    bld.gemm(f"{p}.attn.c_v", i, c, kv_w, xn, "block_matrices", x_saved_tag="pointwise")
    if i in a.value_embedding_layers():
        gate_in, heads = a.value_embeddings.gate_in_features, a.num_kv_heads
        bld.ops.append(Op(name=f"{p}.ve", kind="embedding", layer=i, shape=(t, kv_w), flops_fwd=0.0,
                          flops_bwd=float(t * kv_w), bytes_fwd=t * kv_w * 2 * e,
                          bytes_bwd=t * kv_w * e + a.vocab_size * kv_w * e * 2))
        # the gate reads xn[..., :12], a view of xn: no new storage
        bld.gemm(f"{p}.attn.ve_gate", i, gate_in, heads, xn, "ve_gates", x_saved_tag="pointwise", x_bytes=t * c * e)
        # v = v + 3 * sigmoid(gate) * ve: sigmoid saves its output, the product saves both factors
        bld.pointwise(f"{p}.attn.ve_mix", i, t * kv_w, reads=3, flops_per_element=3.0,
                      saves=(Saved(f"{p}.ve_out", t * kv_w * e), Saved(f"{p}.ve_sigmoid", t * heads * e, "pointwise"),
                             Saved(f"{p}.ve_gate", t * heads * e, "pointwise")))
    if a.position == "rope":
        # nanochat's rotary: y1 = x1 cos + x2 sin, y2 = x1 (-sin) + x2 cos; -sin is made per call and saved (a
        # fused RoPE, Transformer Engine's FusedRoPEFunc, keeps only the shared frequency table)
        half = bld.s * hd // 2 * e
        # (decomposed: the complex product keeps only the shared frequency table, a model buffer)
        sins = () if bld.fused or bld.decomposed else (Saved(f"{p}.rope_q_sin", half, "pointwise", tp_sharded=False),
                                                       Saved(f"{p}.rope_k_sin", half, "pointwise", tp_sharded=False))
        bld.pointwise(f"{p}.attn.rope", i, t * (q_w + kv_w), reads=1, flops_per_element=3.0, bwd_reads=1,
                      saves=sins, moved=decomposed_rope_bytes(e) if bld.decomposed else None)
    if a.qk_norm:
        # per-head norms: one statistic per (token, head)
        bld.norm(f"{p}.attn.q_norm", i, f"{p}.q_rope", learnable=a.norm_learnable, tag="pointwise", core=True,
                 rows_per_token=a.num_heads, width=q_w)
        bld.norm(f"{p}.attn.k_norm", i, f"{p}.k_rope", learnable=a.norm_learnable, tag="pointwise", core=True,
                 rows_per_token=a.num_kv_heads, width=kv_w)
    _attention(bld, i, window, kind, windows)
    bld.gemm(f"{p}.attn.c_proj", i, q_w, c, f"{p}.attn_out", "block_matrices")
    _dropout(bld, f"{p}.attn.dropout", i, t * c, a.dropout.hidden)
    bld.pointwise(f"{p}.resid_add1", i, t * c, reads=2, flops_per_element=1.0, bwd_reads=1, bwd_writes=1)
    bld.norm(f"{p}.norm2", i, f"{p}.x_mid", a.norm_learnable)
    if a.is_moe_layer(i):
        _moe(bld, i)
    else:
        _mlp(bld, i, f"{p}.mlp", a.mlp_hidden_dim, f"{p}.xn2", "block_matrices")
    if a.dropout.hidden <= 0:  # else the dropout after it saves its mask, so early stop re-runs the GEMM to reach it
        bld.ops[-1] = _replace(bld.ops[-1], recompute_skip=("full",))
    _dropout(bld, f"{p}.mlp.dropout", i, t * c, a.dropout.hidden)
    bld.pointwise(f"{p}.resid_add2", i, t * c, reads=2, flops_per_element=1.0, bwd_reads=1, bwd_writes=1)
    bld.ops[-1] = _replace(bld.ops[-1], recompute_skip=("full",))
    if bld.fused:
        bld.ops = _fused_norm_modules(bld.ops, p, "layernorm" if a.is_moe_layer(i) else "mlp")


def _fused_norm_modules(ops: list[Op], p: str, norm2: str) -> list[Op]:
    """A block's norms in the modules Megatron-Core's Transformer Engine layer spec puts them: the input norm fused
    into the attention's QKV Linear (TELayerNormColumnParallelLinear; input_layernorm is an IdentityOp, which the
    `layernorm` recompute skips), the pre-MLP norm into fc1 in a dense layer (re-run with the `mlp` module) or, in
    a mixture-of-experts layer, a TENorm of its own (the `layernorm` module; a MoE model's dense layers take the
    dense spec, get_gpt_decoder_block_spec). Ref: Megatron-LM
    megatron/core/models/gpt/gpt_layer_specs.py@d98e8a64 L319-336 (linear_qkv, pre_mlp_layernorm only with
    experts); transformer_layer.py L470-530 (a norm is recomputed only if it is not an IdentityOp)."""
    none, second = frozenset(), frozenset({norm2})
    owner = {f"{p}.norm1": none, f"{p}.xn1": none, f"{p}.norm1.stats": none,
             f"{p}.norm2": second, f"{p}.xn2": second, f"{p}.norm2.stats": second}
    return [replace(op, module=owner.get(op.name, op.module),
                    saves=tuple(replace(s, module=owner[s.name]) if s.name in owner else s for s in op.saves))
            for op in ops]


def _mlp(bld: _Builder, i: int, p: str, f: int, x: str, group: str, *, rows: float | None = None,
         experts: int = 1, x_tag: SaveTag = "pointwise", weighted: bool = False) -> None:
    """An MLP of width f on `rows` token rows (default: the micro-batch's tokens) read from tensor `x`:
    SwiGLU (gate, up, silu(g) * u, down) or one matrix, an activation and down. experts > 1: that many
    experts' MLPs as one grouped GEMM each (the rows split evenly over them; weights of every expert read).
    weighted: a mixture of experts' activation also multiplies each row by its routing probability
    (Recipe.moe_weighting "activation"): Megatron-Core's fused weighted SwiGLU saves its input and the
    probabilities only (fused_bias_swiglu.py@2659630721 WeightedSwiGLUFunction); another activation is followed by
    an eager product, which saves its output and the probabilities (experts.py bias_act_func, the unfused path)."""
    a, e = bld.a, bld.e
    c, t = a.d_model, bld.t if rows is None else rows
    # the routing probabilities, one fp32 number a row (the permuted probs the dispatcher hands the experts)
    probs = (Saved(f"{p}.probs", t * 4.0, tp_sharded=False),) if weighted else ()
    if a.mlp == "swiglu":
        bld.gemm(f"{p}.gate", i, c, f, x, group, x_saved_tag=x_tag, m=t, experts=experts)
        bld.gemm(f"{p}.up", i, c, f, x, group, x_saved_tag=x_tag, m=t, experts=experts)
        # silu(g) * u: silu saves g, the product saves silu(g) and u; a fused kernel (Megatron-Core's SwiGLU, its
        # weighted one with the probabilities) keeps g and u only
        silu = () if weighted or bld.fused else (Saved(f"{p}.silu_g", t * f * e, "pointwise"),)
        bld.pointwise(f"{p}.act", i, t * f, reads=2, flops_per_element=6.0 if weighted else 5.0,
                      saves=(Saved(f"{p}.g", t * f * e), Saved(f"{p}.u", t * f * e), *silu, *probs),
                      moved=decomposed_swiglu_bytes(e) if bld.decomposed and not weighted else None)
    else:
        bld.gemm(f"{p}.c_fc", i, c, f, x, group, x_saved_tag=x_tag, m=t, experts=experts)
        # relu^2: relu saves its output and square saves its input, the same tensor; gelu saves its input
        acts = (Saved(f"{p}.h", t * f * e, "pointwise"),)
        if weighted:  # act(h) x prob: the product saves act(h) and the probabilities
            acts = (*acts, Saved(f"{p}.unweighted", t * f * e), *probs)
        bld.pointwise(f"{p}.act", i, t * f, reads=1,
                      flops_per_element=(2.0 if a.mlp == "relu2" else 8.0) + weighted, saves=acts)
    bld.gemm(f"{p}.c_proj", i, f, c, f"{p}.act_out", group, m=t, experts=experts)


def _moe(bld: _Builder, i: int) -> None:
    """A mixture-of-experts MLP, as Megatron-Core's MoELayer with the all-to-all dispatcher runs it:
    router GEMM (d_model -> num_experts) and softmax/top-k in fp32; permute each token's top_k copies into
    expert order; the local experts' MLPs as grouped GEMMs on tokens x top_k rows (padded to capacity
    when a capacity factor is set); un-permute and sum the copies weighted by their routing
    probabilities; shared experts as a dense MLP beside them. One expert-parallel rank holds
    num_experts / ep experts and, routing balanced, computes as many rows as its own tokens send out,
    so EP changes the rows per expert (and the weights read), not the FLOPs. Dropless routing over ep > 1
    ranks is not balanced, and every rank waits for the busiest at the next all-to-all: the experts' ops
    (on the rows received; permute and combine run on each rank's own tokens) take MoE.imbalance times
    their mean time (Op.wait). The all-to-alls that move the rows between ranks, the busiest rank's rows,
    are priced in ddplan.step (comm.moe_all_to_all_s).
    Ref: Megatron-Core megatron/core/transformer/moe (router.py TopKRouter, token_dispatcher.py
    MoEAlltoAllTokenDispatcher, experts.py GroupedMLP); Fedus et al., arXiv 2101.03961, sec. 2.2."""
    a, t, e, moe = bld.a, bld.t, bld.e, bld.a.moe
    c, p, experts = a.d_model, f"h{i}", moe.num_experts
    rows = moe.routed_tokens(t)
    bld.gemm(f"{p}.moe.router", i, c, experts, f"{p}.xn2", "router", x_saved_tag="pointwise")
    # softmax over experts in fp32 (saves its output), top-k (saves the int64 indices)
    bld.pointwise(f"{p}.moe.route", i, t * experts, reads=1, flops_per_element=6.0, elem_bytes=4,
                  saves=(Saved(f"{p}.moe.probs", t * experts * 4.0, tp_sharded=False),
                         Saved(f"{p}.moe.indices", t * moe.top_k * 8.0, tp_sharded=False)))
    # permute: gather each token's top_k copies into expert order (a new tensor the experts' GEMMs save) by
    # one int64 index, which the un-permute reuses (the row map of Megatron's fused permute)
    bld.pointwise(f"{p}.moe.permute", i, rows * c, reads=1, flops_per_element=0.0, bwd_reads=1, bwd_writes=1,
                  saves=(Saved(f"{p}.moe.order", t * moe.top_k * 8.0, tp_sharded=False),))
    first = len(bld.ops)
    weighted = bld.spec.recipe.moe_weighting == "activation"
    _mlp(bld, i, f"{p}.experts", moe.expert_hidden_dim, f"{p}.moe.permuted", "experts", rows=rows / bld.expert_rows,
         experts=max(1, experts // bld.ep), x_tag="keep", weighted=weighted)
    wait = moe.imbalance(bld.ep)
    if bld.expert_rows > 1 or wait != 1:  # whole experts on a tp rank's own rows are already its share
        whole = bld.expert_rows > 1
        bld.ops[first:] = [_with(op, tp_done=op.tp_done or whole, wait=wait) for op in bld.ops[first:]]
    if weighted:
        # un-permute and sum the copies, already weighted in the activation: its backward gathers the gradient by
        # the index the permute saved, and saves nothing of its own
        bld.pointwise(f"{p}.moe.combine", i, rows * c, reads=1, flops_per_element=1.0)
    else:
        # un-permute and combine: y = sum over k of prob_k x expert_out_k; saves the expert outputs and the
        # routing weights, cast to the compute dtype
        bld.pointwise(f"{p}.moe.combine", i, rows * c, reads=2, flops_per_element=2.0,
                      saves=(Saved(f"{p}.moe.expert_out", rows * c * e),
                             Saved(f"{p}.moe.weights", t * moe.top_k * e, tp_sharded=False)))
    if moe.shared_width:
        _mlp(bld, i, f"{p}.shared", moe.shared_width, f"{p}.xn2", "block_matrices")
        if moe.shared_expert_gate:  # Qwen2-MoE: sigmoid(x @ w_gate) x shared expert output
            bld.gemm(f"{p}.moe.shared_gate", i, c, 1, f"{p}.xn2", "router", x_saved_tag="pointwise")
            bld.pointwise(f"{p}.moe.shared_mix", i, t * c, reads=2, flops_per_element=2.0,
                          saves=(Saved(f"{p}.shared.out", t * c * e), Saved(f"{p}.moe.shared_sigmoid", t * e)))


def _dropout(bld: _Builder, name: str, layer: int, numel: int, p: float, core: bool = False,
             tp_sharded: bool = False) -> None:
    """Dropout of `numel` elements at probability p (nothing when p = 0): y = x * mask / (1 - p), saving the
    one-byte mask (torch native_dropout keeps a bool mask; torch.compile's min-cut partitioner saves it too,
    as it never recomputes random ops); backward reads the gradient and the mask.
    Ref: Korthikanti et al., arXiv 2205.05198, Table 2 (a mask of sbh per hidden dropout, as^2 b on scores)."""
    if p <= 0:
        return
    e = bld.e
    bld.ops.append(Op(name=name, kind="elementwise", layer=layer, shape=(numel,), flops_fwd=2.0 * numel,
                      flops_bwd=numel * 1.0, bytes_fwd=numel * (2 * e + 1), bytes_bwd=numel * (2 * e + 1),
                      # the mask is kept under torch.compile too (its partitioner never recomputes random
                      # ops); selective recompute regenerates the attention core's, full recompute every one
                      saves=(Saved(f"{name}.mask", float(numel), "core" if core else "keep",
                                   tp_sharded=tp_sharded),),
                      attention_core=core))


def _replace(op: Op, **changes) -> Op:
    from dataclasses import replace

    return replace(op, **changes)


# torch's math SDPA computes in fp32 when given fp16 or bf16 (torch.backends.cuda.
# allow_fp16_bf16_reduction_math_sdp(False), the default): `sdpa_math_saved_bytes`.
SDPA_MATH_ACC_BYTES = 4


def sdpa_math_saved_bytes(batch: int, heads: int, seq_len: int, head_dim: int,
                          attention_dropout: bool) -> dict[str, float]:
    """Bytes torch's math SDPA keeps for backward in one layer, per tensor, whatever the input dtype.

    aten `_scaled_dot_product_attention_math` (pytorch aten/src/ATen/native/transformers/attention.cpp,
    torch 2.5-2.13): fp16/bf16 q, k, v are cast to fp32 (`query_.to(at::kFloat)`, unless
    allow_fp16_bf16_reduction_math_sdp is on); q and k are each scaled by sqrt(1/sqrt(d)), k and v repeated
    to every query head under enable_gqa; attn = _safe_softmax(q k^T + mask), dropout, out = attn @ v, cast
    back. Saved: the scaled q and k and the (repeated, contiguous) v by the matmuls, 4 b h s d each; the
    probabilities by _safe_softmax, 4 b h s^2; with attention dropout, its mask (at::dropout: native_dropout's
    bool on CUDA, 1 b h s^2 — on CPU the fp32 noise, 4 b h s^2) and the dropped probabilities for P @ V,
    4 b h s^2. The mask (is_causal's tril, or a boolean window mask) is added in place: not saved.
    Checked with saved_tensors_hooks on torch 2.13 CPU in fp32, bf16 and fp16 (tests/test_anatomy.py).
    """
    if min(batch, heads, seq_len, head_dim) <= 0:
        raise ValueError(f"need positive batch, heads, seq_len, head_dim; got {batch}, {heads}, {seq_len}, {head_dim}")
    acc, vec, sq = SDPA_MATH_ACC_BYTES, batch * heads * seq_len * head_dim, batch * heads * seq_len * seq_len
    saved = {"q_scaled": acc * vec, "k_scaled": acc * vec, "v_fp32": acc * vec, "probs": acc * sq}
    if attention_dropout:
        saved |= {"dropout_mask": sq, "probs_dropped": acc * sq}
    return {k: float(v) for k, v in saved.items()}


def megatron_unfused_saved_bytes(batch: int, heads: int, kv_heads: int, seq_len: int, head_dim: int,
                                 elem_bytes: int, attention_dropout: bool) -> dict[str, float]:
    """Bytes Megatron-LM's unfused attention keeps for backward in one layer, per tensor (no GQA repeat).

    Everything in the compute dtype (e bytes): q and k for q k^T, the softmax output (e b h s^2), with
    attention dropout its one-byte mask (b h s^2) and the dropped probabilities (e b h s^2), and v for P @ V.
    Ref: Korthikanti et al., arXiv 2205.05198, sec. 4.1 and Table 2: for e = 2 and h x d = hidden, Q, K 4sbh,
    V 2sbh, softmax 2as^2b, dropout mask as^2b, dropout output 2as^2b (the 5as^2b term).
    """
    if min(batch, heads, kv_heads, seq_len, head_dim, elem_bytes) <= 0:
        raise ValueError(f"need positive sizes; got batch {batch}, heads {heads}, kv_heads {kv_heads}, "
                         f"seq_len {seq_len}, head_dim {head_dim}, elem_bytes {elem_bytes}")
    tok, sq = batch * seq_len * head_dim * elem_bytes, batch * heads * seq_len * seq_len
    saved = {"q": tok * heads, "k": tok * kv_heads, "v": tok * kv_heads, "probs": elem_bytes * sq}
    if attention_dropout:
        saved |= {"dropout_mask": sq, "probs_dropped": elem_bytes * sq}
    return {k: float(v) for k, v in saved.items()}


def _attention(bld: _Builder, i: int, window: int, kind: AttentionKind, windows: WindowSupport) -> None:
    """The attention core, q, k, v -> output; q, k, v are saved (the checkpoint inputs under selective)."""
    if kind in UNFUSED_KINDS:
        _unfused_attention(bld, i, window, kind)
        return
    a, b, s, e = bld.a, bld.b, bld.s, bld.e
    h, hkv, hd = a.num_heads, a.num_kv_heads, a.head_dim
    pairs = attention_pairs(s, window, kind, windows)
    p = f"h{i}"
    qkv = (Saved(f"{p}.q", b * s * h * hd * e), Saved(f"{p}.k", b * s * hkv * hd * e),
           Saved(f"{p}.v", b * s * hkv * hd * e))
    out = Saved(f"{p}.attn_out", b * s * h * hd * e)
    io = b * s * (2 * h + 2 * hkv) * hd * e  # read q, k, v, write o
    half_fwd, half_bwd = 2.0 * b * h * pairs * hd, 4.0 * b * h * pairs * hd
    saves = (*qkv, Saved(f"{p}.lse", b * h * s * 4, "core"), out,
             # per-op recompute keeps the kernel's outputs (output and log-sum-exp; its RNG state is bytes)
             Saved(out.name, out.bytes, "op_output"), Saved(f"{p}.lse", b * h * s * 4, "op_output"))
    mask_bytes = 0
    if kind == "fused_sdpa" and window < s:
        # a sliding window needs an explicit boolean mask, which SDPA converts to an additive mask in the
        # query's dtype and saves; under recompute the boolean mask is the checkpoint's input instead
        mask_bytes = s * s * e
        saves = (*saves, Saved(f"{p}.mask_additive", mask_bytes, "core", tp_sharded=False),
                 Saved(f"mask.{window}", s * s, "ckpt_input", tp_sharded=False))
    bld.ops.append(Op(name=f"{p}.attn.core", kind="attention", layer=i, shape=(b, h, s, window, hd),
                      flops_fwd=2 * half_fwd, flops_bwd=2 * half_bwd, bytes_fwd=io + b * h * s * 4 + mask_bytes,
                      bytes_bwd=2 * io + b * h * s * 4 + mask_bytes, saves=saves,
                      recompute_flops_bwd=half_fwd, attention_core=True, per_op_saved=True))


def _unfused_attention(bld: _Builder, i: int, window: int, kind: AttentionKind) -> None:
    """Unfused attention as two ops, scores (q k^T, mask, softmax) and probabilities @ v, with the
    probabilities' dropout between them: `unfused_math` (Megatron, compute dtype,
    `megatron_unfused_saved_bytes`) or `sdpa_math` (torch's math SDPA, fp32, `sdpa_math_saved_bytes`).
    Both compute all s^2 scores whatever the mask."""
    a, b, s, e = bld.a, bld.b, bld.s, bld.e
    h, hkv, hd = a.num_heads, a.num_kv_heads, a.head_dim
    pairs = attention_pairs(s, window, kind, "mask")
    p = f"h{i}"
    half_fwd, half_bwd = 2.0 * b * h * pairs * hd, 4.0 * b * h * pairs * hd
    dropout = a.dropout.attention > 0
    out = Saved(f"{p}.attn_out", b * s * h * hd * e)
    qkv_in = b * s * (h + hkv) * hd * e  # q and k (or p and v) in the compute dtype
    if kind == "sdpa_math":
        n = sdpa_math_saved_bytes(b, h, s, hd, dropout)
        # the scaled fp32 copies are the kernel's own; selective recompute's checkpoint keeps q, k, v as they
        # came in instead (and a window's boolean mask, as every checkpoint does: ckpt_input)
        scores_saves = (Saved(f"{p}.q_scaled", n["q_scaled"], "core"), Saved(f"{p}.k_scaled", n["k_scaled"], "core"),
                        Saved(f"{p}.q", b * s * h * hd * e, "core_input"),
                        Saved(f"{p}.k", b * s * hkv * hd * e, "core_input"),
                        Saved(f"{p}.v", b * s * hkv * hd * e, "core_input"))
        if window < s:
            scores_saves += (Saved(f"mask.{window}", s * s, "ckpt_input", tp_sharded=False),)
        v_saved = Saved(f"{p}.v_fp32", n["v_fp32"], "core")
    else:
        n = megatron_unfused_saved_bytes(b, h, hkv, s, hd, e, dropout)
        qkv = (Saved(f"{p}.q", n["q"]), Saved(f"{p}.k", n["k"]), Saved(f"{p}.v", n["v"]))
        if hkv != h:  # grouped-query: k and v repeated to every query head, the copies saved;
            # under selective recompute the checkpoint keeps the un-repeated k and v instead
            qkv = (qkv[0], Saved(f"{p}.k_rep", b * s * h * hd * e, "core"), Saved(f"{p}.v_rep", b * s * h * hd * e, "core"))
            bld.ops.append(Op(name=f"{p}.attn.repeat_kv", kind="elementwise", layer=i, shape=(b * s * h * hd,),
                              flops_fwd=0.0, flops_bwd=float(b * s * h * hd), bytes_fwd=b * s * (hkv + h) * hd * e * 2,
                              bytes_bwd=b * s * (hkv + h) * hd * e * 2, attention_core=True,
                              saves=(Saved(f"{p}.k", n["k"], "core_input"), Saved(f"{p}.v", n["v"], "core_input"))))
        # masked_fill saves the boolean s x s mask (one per distinct window, made once per forward)
        scores_saves = (qkv[0], qkv[1], Saved(f"mask.{min(window, s)}", s * s, "input", tp_sharded=False))
        v_saved = qkv[2]
    # Traffic is counted in the compute dtype for both kinds: the math kernel's fp32 internals would double
    # its s x s traffic, but its assumed efficiencies come from a measured rate of PyTorch's standard
    # attention (hardware/*.yaml, [S7]) that this byte count already prices slower than measured; calibrate
    # measures it. Only what is saved differs (n).
    sq = b * h * s * s * e
    # scores = q k^T, mask, softmax (saves the b x h x s x s probabilities), then probabilities @ v
    bld.ops.append(Op(name=f"{p}.attn.scores", kind="attention", layer=i, shape=(b, h, s, window, hd),
                      flops_fwd=half_fwd, flops_bwd=half_bwd, bytes_fwd=qkv_in + 4 * sq,
                      bytes_bwd=2 * qkv_in + 6 * sq, attention_core=True, per_op_saved=True,
                      # per-op recompute keeps the q k^T product (aten.bmm, in SelectiveAC's save list at b5bcd76;
                      # the softmax is re-run from it), as large as the probabilities
                      saves=(*scores_saves, Saved(f"{p}.probs", n["probs"], "core"),
                             Saved(f"{p}.scores", n["probs"], "op_output"))))
    pv_probs = Saved(f"{p}.probs", n["probs"], "core")
    if dropout:  # dropout on the probabilities: its mask, and its output for P @ V
        _dropout(bld, f"{p}.attn.probs_dropout", i, b * h * s * s, a.dropout.attention, core=True, tp_sharded=True)
        pv_probs = Saved(f"{p}.probs_dropped", n["probs_dropped"], "core")
    bld.ops.append(Op(name=f"{p}.attn.pv", kind="attention", layer=i, shape=(b, h, s, window, hd),
                      flops_fwd=half_fwd, flops_bwd=half_bwd, bytes_fwd=qkv_in + sq,
                      bytes_bwd=2 * qkv_in + 3 * sq, attention_core=True, per_op_saved=True,
                      # per-op keeps the P @ V product, in fp32 under torch's math SDPA (cast back after)
                      saves=(v_saved, pv_probs, out, Saved(f"{p}.pv_out", n["v_fp32"], "op_output")
                             if kind == "sdpa_math" else Saved(out.name, out.bytes, "op_output")),
                      recompute_skip=("selective",)))


# torchtitan's ChunkedLossWrapper (Recipe.cross_entropy "chunked") splits the tokens into Config.num_chunks = 8, the
# default every Llama 3 preset keeps (torchtitan/components/loss.py@b5bcd76 L501-544, models/llama3/
# config_registry.py@b5bcd76 L42)
LOSS_CHUNKS = 8


def unsharded_grad_sum_bytes(compute: int, reduce: int, count: int) -> int:
    """Bytes per element torch FSDP2 moves adding up `count` gradients of one unsharded parameter with gradient sync
    off (torch 2.13 distributed/fsdp/_fully_shard/_fsdp_param.py: to_accumulated_grad_if_needed casts the first,
    written in the compute dtype, to the reduce dtype, c + r; accumulate_unsharded_grad_if_needed adds each later
    one, c + 2 r); with the reduce dtype the compute dtype autograd adds them, 3 c each after the first.
    e.g. bf16 gradients summed in fp32 over 8: (2 + 4) + 7 x (2 + 8) = 76 B; in bf16: 7 x 6 = 42 B."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    if reduce == compute:
        return (count - 1) * 3 * compute
    return (compute + reduce) + (count - 1) * (compute + 2 * reduce)


def _head(bld: _Builder) -> None:
    a, t, e = bld.a, bld.t, bld.e
    v = a.vocab_size
    if a.backout:
        # nanochat: x = x - backout_lambda * x_half, x_half the residual stream after block L//2
        # (the next block's input, saved already, or a tensor of its own when that block is the last)
        nxt = a.num_layers // 2 + 1
        half = f"h{nxt}.x_in" if nxt < a.num_layers else "x_last_out"
        bld.pointwise("backout", None, t * a.d_model, reads=2, flops_per_element=2.0,
                      saves=(Saved(half, t * a.d_model * e, "input", tp_sharded=False),
                             Saved("x_final", t * a.d_model * e, tp_sharded=False)))
    bld.norm("norm_f", None, "x_final", a.norm_learnable)
    group = "wte" if a.tied_embeddings else "lm_head"
    bld.gemm("lm_head", None, a.d_model, v, "xn_f", group, x_saved_tag="pointwise")
    le = dtype_bytes(bld.spec.dtypes.logits)
    tv = t * v
    kernel = bld.spec.recipe.cross_entropy
    # "chunked" (torchtitan's ChunkedLossWrapper): the head and an eager cross entropy run chunk by chunk of the
    # tokens, each chunk's backward at once, so one chunk's logits and loss tensors are alive at a time (mv: the
    # elements whose bytes are held), while the work is every token's and the head's gradient is added up chunk by
    # chunk (below); each chunk's input to the head is a view of the hidden states (a dim-0 split), no copy
    mv = tv / LOSS_CHUNKS if kernel == "chunked" else tv
    if kernel == "chunked":
        # the chunks' gradients are gathered into one fp32 buffer of the hidden states, kept through the loop
        # (GradAccumulator(hidden_states, num_chunks, dtype=torch.float32))
        bld.pointwise("loss_grad_accumulator", None, t * a.d_model, reads=0, writes=1, flops_per_element=0.0,
                      elem_bytes=4, saves=(Saved("loss_grad_accumulator", t * a.d_model * 4.0, tp_sharded=False),),
                      bwd_reads=1, bwd_writes=1)
        # and the head weight's gradient adds up over the chunks (FSDP2 gradient sync off on lm_head for all but the
        # last, loss.py@b5bcd76 L663-667) in the reduce dtype: held through the loop, and what the sum moves
        r = bld.spec.dtypes.reduce_bytes(group)
        moved = unsharded_grad_sum_bytes(e, r, LOSS_CHUNKS)
        bld.pointwise("loss_head_grad", None, a.d_model * v, reads=moved, writes=0, flops_per_element=0.0,
                      elem_bytes=1, saves=(Saved("loss_head_grad", a.d_model * v * float(r)),), bwd_reads=0,
                      bwd_writes=0)
    # The compiled graph keeps the logits as the GEMM wrote them and recomputes the fp32 softcap and
    # log-softmax in backward; eager keeps the fp32 intermediates below.
    compiled_logits = Saved("logits", mv * e, "compiled")
    if kernel in ("fused", "te") and not a.logit_softcap:
        _fused_cross_entropy(bld, tv * e, e, in_place=kernel == "te")  # reads the GEMM's logits as they are
        return
    if le != e:
        in_place = kernel == "vocab-parallel"  # the copy is the saved softmax (below)
        bld.pointwise("logits_cast", None, tv, reads=1, writes=1, flops_per_element=0.0, elem_bytes=(e + le) // 2,
                      saves=() if in_place else (compiled_logits,), transient=mv * e if in_place else mv * (le + e))
    if a.logit_softcap:
        # softcap * tanh(logits / softcap): tanh saves its output
        bld.pointwise("logits_softcap", None, tv, reads=1, writes=3, flops_per_element=4.0, elem_bytes=le,
                      saves=(Saved("logits_tanh", mv * le, "pointwise"), compiled_logits), transient=2 * mv * le)
    # cross-entropy: log_softmax saves its output; nll_loss reads one entry per row. Backward builds
    # the dense gradient of the log-probabilities, then of the logits: two vocab-wide fp32 buffers.
    # Megatron's vocab-parallel cross entropy (spec.recipe.cross_entropy "vocab-parallel") works in place on
    # the fp32 copy of the logits: max, exp and the division overwrite it, it is saved as the softmax, and backward
    # writes the gradient into it; what lies beside it is the logits in the GEMM's dtype, once in forward (before
    # the cast's input is freed) and once in backward (the gradient cast back for the GEMM): tv x e, nothing when
    # the logits are the GEMM's dtype already. Ref: megatron/core/tensor_parallel/cross_entropy.py@d98e8a6
    # (L25 .float(), L42 -=, L62 exp(out=), L77 div_, L88 grad_input = softmax, L111-114 in place), called
    # unfused by default (language_module.py L200; cross_entropy_loss_fusion False, model_parallel_config.py L320).
    # Its autograd Function saves the softmax whether or not the model around it is compiled ("keep"), and no
    # logits: a compiled graph cannot trade it for the GEMM's logits as it does eager torch's log-softmax.
    if kernel in ("fused", "te"):  # after an fp32 softcap, the kernel reads (and saves) its fp32 output
        _fused_cross_entropy(bld, tv * le, le, in_place=kernel == "te")
        return
    in_place = kernel == "vocab-parallel"
    beside = tv * e if le != e else 0.0
    probs = Saved("softmax", tv * le, "keep") if in_place else Saved("log_probs", mv * le, "pointwise")
    bld.pointwise("cross_entropy", None, tv, reads=1, writes=1, flops_per_element=5.0, elem_bytes=le,
                  saves=(probs, Saved("targets", t * 8, tp_sharded=False),
                         Saved("loss_total_weight", 4, tp_sharded=False),  # nll_loss's 0-d fp32
                         *(() if in_place else (compiled_logits,))),
                  bwd_reads=1, bwd_writes=1, kind="reduction", transient=beside if in_place else 2 * mv * le)


def _fused_cross_entropy(bld: _Builder, logits_bytes: float, elem: int, in_place: bool = False) -> None:
    """A fused cross-entropy kernel (spec.recipe.cross_entropy "fused" or "te"): it reads the logits in the dtype they
    come in, computes the softmax in fp32 inside the kernel, and saves the logits as they are and a few fp32 figures a
    token. No fp32 copy of the logits and no vocab-wide fp32 gradient exists.
    "fused", flash-attention's: saves each token's log-sum-exp; backward writes the logits' gradient into a new tensor
    of their dtype (not in place). Ref: flash-attention v1.0.9 flash_attn/losses/cross_entropy.py (L36
    xentropy_cuda_lib.forward -> losses, lse; L89 ctx.save_for_backward(logits, lse, labels); L100 backward,
    inplace_backward False by default), the loss llm-foundry's MPT uses by default
    (llmfoundry/models/mpt/modeling_mpt.py@b2a43a1 L724-730, loss_fn fused_crossentropy).
    "te" (in_place), Transformer Engine's parallel_cross_entropy: saves each token's running max, denominator and
    target logit (m_d_X_y, three fp32 figures; gathered over a tensor-parallel group, tp times that, still bytes a
    token against the logits' kilobytes: priced at one rank's) and backward writes the gradient into the saved
    logits in place (cross_entropy_backward_kernel's tl.store to X_ptr): no vocab-wide buffer beside them. Ref: NVIDIA/TransformerEngine transformer_engine/pytorch/cross_entropy.py@02965d2e
    (CrossEntropyFunction.forward: ctx.save_for_backward(_input.detach(), target.detach(), m_d_X_y.detach());
    backward returns the tensor triton/cross_entropy.py's cross_entropy_backward computes in place on _input), which
    Megatron-Core calls under --cross-entropy-fusion-impl te (language_module.py@d98e8a6 L174) and NeMo's
    performance scripts turn on (scripts/performance/helpers.py@8cfedd7 L377-378)."""
    t = bld.t
    tv = logits_bytes / elem
    per_token = Saved("loss_m_d_x", t * 12.0, tp_sharded=False) if in_place else Saved("loss_lse", t * 4.0,
                                                                                         tp_sharded=False)
    bld.pointwise("cross_entropy", None, int(tv), reads=1, writes=0, flops_per_element=5.0, elem_bytes=elem,
                  saves=(Saved("logits", logits_bytes, "keep"), per_token, Saved("targets", t * 8, tp_sharded=False)),
                  bwd_reads=1, bwd_writes=1, kind="reduction", transient=0.0 if in_place else logits_bytes)


# --------------------------------------------------------------------------------------------
# Optimizer


def muon_flops(rows: int, cols: int, ns_steps: int = 5) -> float:
    """FLOPs of Muon's Newton-Schulz orthogonalisation of one rows x cols matrix.

    Per iteration, with m = min(rows, cols), n = max: A = X X^T (2 m^2 n), B = bA + cA^2 (2 m^3),
    X' = aX + BX (2 m^2 n): 4 m^2 n + 2 m^3. Ref: Jordan et al., "Muon" (2024), and DESIGN.md sec. 4.
    """
    if rows <= 0 or cols <= 0 or ns_steps <= 0:
        raise ValueError(f"rows, cols and ns_steps must be positive, got {rows}, {cols}, {ns_steps}")
    m, n = min(rows, cols), max(rows, cols)
    return ns_steps * (4.0 * m * m * n + 2.0 * m**3)


def adamw_bytes(numel: int, param_bytes: int, grad_bytes: int, state_bytes: int) -> float:
    """HBM traffic of one AdamW update: read p, g, m, v; write p, m, v (memory-bound)."""
    return numel * (2 * param_bytes + grad_bytes + 4 * state_bytes)


def optimizer_ops(spec: ModelSpec) -> list[Op]:
    """One op per parameter group: AdamW elementwise, or Muon's momentum + Newton-Schulz per matrix."""
    a, opt, dt = spec.architecture, spec.recipe.optimizer, spec.dtypes
    counts = param_counts(a)
    ops: list[Op] = []
    for group, algo in opt.algorithm.items():
        n = counts[group]
        if n == 0:
            continue
        pb = dtype_bytes(dt.params[group])
        if algo == "adamw":
            ops.append(Op(name=f"adamw.{group}", kind="optimizer", layer=None, shape=(n,), flops_fwd=12.0 * n,
                          flops_bwd=0.0, bytes_fwd=adamw_bytes(n, pb, pb, opt.adamw_bytes(dt.params[group])[0]),
                          bytes_bwd=0.0))
        else:
            flops = sum(muon_flops(r, c, opt.muon_ns_steps) for r, c in muon_matrices(spec, group))
            # momentum (read g, m; write m), NS in bf16 on the update, write p: ~6 passes of fp32
            ops.append(Op(name=f"muon.{group}", kind="optimizer", layer=None, shape=(n,), flops_fwd=flops,
                          flops_bwd=0.0, bytes_fwd=n * (3 * pb + 3 * pb + 2 * 2 * opt.muon_ns_steps),
                          bytes_bwd=0.0))
    return ops


def muon_matrices(spec: ModelSpec, group: str) -> list[tuple[int, int]]:
    """(rows, cols) of every matrix that Muon updates in a group (nanochat: whole matrices)."""
    a = spec.architecture
    c, q_w, kv_w = a.d_model, a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
    if group == "block_matrices":
        per_layer = [(q_w, c), (kv_w, c), (kv_w, c), (c, q_w)]
        per_layer += [(a.mlp_hidden_dim, c)] * (2 if a.mlp == "swiglu" else 1) + [(c, a.mlp_hidden_dim)]
        return per_layer * a.num_layers
    if group == "ve_gates" and a.value_embeddings:
        return [(a.num_kv_heads, a.value_embeddings.gate_in_features)] * len(a.value_embedding_layers())
    if group == "lm_head":
        return [(a.vocab_size, c)]
    raise ValueError(f"Muon needs matrices; group {group!r} has none")
