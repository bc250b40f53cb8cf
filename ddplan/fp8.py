"""fp8 as it runs: which GEMMs an fp8 recipe converts, what its casts move per operand, and which weights an fp8
all-gather sends at 1 byte. ddplan.roofline prices the GEMMs and casts; ddplan.step and ddplan.memory the gathers.
"""

from __future__ import annotations

import typing
from dataclasses import replace

from ddplan.anatomy import Anatomy, Op, build_anatomy, modules_of
from ddplan.params import param_counts
from ddplan.specs import Fp8Recipe

# GEMMs an fp8 recipe leaves in the compute dtype whatever their shape: the output layer (torchtitan's float8 and
# MXFP8 converters filter "output", torchtitan/components/quantization/float8.md and mx.py; Megatron-Core builds
# it as its own tensor_parallel.ColumnParallelLinear, not a Transformer Engine module, gpt_model.py, so it runs
# outside fp8_autocast; MPT's tied head is F.linear on the embedding, not a te.Linear) and the mixture-of-experts
# router (torchtitan filters "router.gate", float8.md) with its shared-expert gate
FP8_KEPT_NAMES = ("lm_head",)
FP8_KEPT_SUFFIXES = (".moe.router", ".moe.shared_gate")


def fp8_eligible(op: Op, lm_head: bool = False) -> bool:
    """GEMMs that an fp8 recipe converts: every dim a multiple of 16 and the smaller weight dim >= 128, the
    LM head only where the recipe converts it (lm_head) and never the router.

    Ref: nanochat scripts/base_train.py @00255c1 `fp8_module_filter` (the shape rule; it keeps no module by
    name, so nanochat's lm_head, a Linear of d_model x vocab, runs in fp8: lm_head=True for its specs); the
    value-embedding and smear gates stay in bf16. torchtitan float8.md: filter_fqns=["output"] for dense
    models, ["output", "router.gate"] with experts (FP8_KEPT_NAMES).
    """
    m, n, k = op.shape
    if op.kind != "gemm" or (op.name in FP8_KEPT_NAMES and not lm_head) or op.name.endswith(FP8_KEPT_SUFFIXES):
        return False
    return n % 16 == 0 and k % 16 == 0 and min(n, k) >= 128


FP8_RECIPES = typing.get_args(Fp8Recipe)  # tensorwise, rowwise, ..., mxfp8_torchao (Recipe.fp8_recipe)
# bytes moved per element of each GEMM operand to quantise it, by recipe: forward (x, W), backward (dY, x, W).
# A cast reads the 16-bit tensor and writes 8 bits (2 + 1 B); current (dynamic) scaling first reads the tensor
# once more for its amax (+2 B); a second fp8 copy in the other memory order written by the same kernel is
# +1 B; an fp8 transpose copy reads and writes 8 bits (1 + 1 B).
#   tensorwise (torchao Float8Linear, dynamic tensorwise scaling, torch.compile fusing amax and cast: torchtitan
#     float8.md): forward amax + cast of x and of W (5, 5); backward it saved x and W in high precision and
#     casts again: dY once for dgrad and, fused, its other order for wgrad (2 + 2 + 1 + 1 = 6), W for dgrad and x
#     for wgrad each with a fresh amax (5, 5) (torchao/float8/float8_linear.py, backward of the hp-args matmul:
#     "we need pytorch#136267 ... to reuse max(abs(weight)) from the forward").
#   rowwise (torchao Float8LinearRecipeName.ROWWISE: every cast AXISWISE, scales per row of the contraction axis,
#     torchao/float8/config.py@36027d8 L334-351; torchtitan's 405B preset): forward amax + cast of x and W (5, 5);
#     backward, from the high-precision tensors it saved, dY along each of its two axes (5 + 5 = 10: an axis-wise
#     scale cannot serve the other order), W for dgrad and x for wgrad each along its own axis (5, 5)
#     (torchao/float8/float8_linear.py@36027d8, matmul_with_hp_or_float8_args.backward). Its GEMMs run CUTLASS's
#     row-wise kernel, at the fp8 GEMM rate ddplan has (no row-wise figure).
#   delayed (Transformer Engine DelayedScaling, as Composer's amp_fp8 runs it: composer/core/precision.py): the
#     scale comes from the amax history, the amax is taken inside the cast, and cast_transpose writes both
#     orders at once, saved for backward: forward x and W (4, 4), backward dY (4), nothing for x and W.
#   current (Transformer Engine Float8CurrentScaling, what Megatron-Core's --fp8-recipe tensorwise runs,
#     megatron/core/fp8_utils.py@d98e8a64 L777-779, and NeMo's "cs"): each tensor's amax pass, a scale kernel, then
#     the cast writing both orders, saved for backward as delayed's are (TransformerEngine
#     transformer_engine/pytorch/csrc/quantizer.cpp@0064fbd Float8CurrentScalingQuantizer::quantize_impl:
#     nvte_compute_amax, nvte_compute_scale_from_amax, nvte_quantize_v2): forward x and W (2 + 4, 2 + 4), backward
#     dY (6), nothing for x and W.
#   nanochat (nanochat/fp8.py, tensorwise dynamic, one opaque autograd function): forward amax + cast of x and
#     W (5, 5), saving the fp8 tensors; backward amax + cast of dY (5) and three fp8 copies in the other order
#     for _scaled_mm's layouts: dY^T (+2), W (2) and x (2).
#   mxfp8 (Transformer Engine's MXFP8BlockScaling, Megatron-Core --fp8-recipe mxfp8, on Blackwell): each block of 32
#     takes its own E8M0 scale from its own amax, inside the quantizing kernel, and the row-wise and column-wise
#     copies differ (a scale per 32 along each axis), so both come from the 16-bit tensor: read 2 B, write 1 + 1 B and
#     two scales of 1 B per 32 (4 + 1/16 a tensor), the column-wise ones saved for backward as delayed's are:
#     forward x and W, backward dY (TransformerEngine docs/features/low_precision_training/mxfp8/mxfp8.rst@495739c,
#     "Handling transposes").
#   rowwise_with_gw_hp (torchao Float8LinearRecipeName.ROWWISE_WITH_GW_HP, torchao/float8/config.py@36027d8
#     L353-378; torchtitan's other float8 recipe, float8.py@b5bcd76 L58): forward as rowwise (5, 5); grad_input from
#     dY cast along one axis (5) and the weight recast tensorwise from its saved 16-bit copy (5); grad_weight in the
#     16-bit dtype from the saved input and dY (ScalingType.DISABLED: no cast; FP8_WGRAD_HIGH_PRECISION).
#   mxfp8_torchao (torchao's MXFP8Linear, what torchtitan's MXFP8LinearConverter builds, components/quantization/
#     mx.py@b5bcd76 L21-44, L50-98, with torchao's defaults, wgrad_with_hp False: torchao/prototype/moe_training/
#     mxfp8_linear.py@36027d8 L61-66, L108-244): a block-of-32 cast takes its amax inside the kernel, reading the
#     16-bit tensor once and writing 1 B and a 1-byte scale per 32 (2 + 1 + 1/32 B); it saves the 16-bit input and
#     weight (save_for_backward(input_hp, weight_hp), L108), so backward casts again from them: forward x and W
#     along K (3 + 1/32 each); backward dY twice, once along each axis in two kernels (rowwise and colwise calls,
#     mx_formats/utils.py L189-194: 6 + 1/16), W and x along the other axis (3 + 1/32 each). The scales' swizzle
#     (to_blocked, 1/32 of a tensor) is not counted.
FP8_CAST_BYTES: dict[str, tuple[tuple[float, float], tuple[float, float, float]]] = {
    "tensorwise": ((5.0, 5.0), (6.0, 5.0, 5.0)),
    "rowwise": ((5.0, 5.0), (10.0, 5.0, 5.0)),
    "rowwise_with_gw_hp": ((5.0, 5.0), (5.0, 0.0, 5.0)),
    "mxfp8_torchao": ((3.0 + 1 / 32, 3.0 + 1 / 32), (6.0 + 1 / 16, 3.0 + 1 / 32, 3.0 + 1 / 32)),
    "delayed": ((4.0, 4.0), (4.0, 0.0, 0.0)),
    "current": ((6.0, 6.0), (6.0, 0.0, 0.0)),
    "nanochat": ((5.0, 5.0), (7.0, 2.0, 2.0)),
    "mxfp8": ((4.0 + 1 / 16, 4.0 + 1 / 16), (4.0 + 1 / 16, 0.0, 0.0)),
}
# kernel launches of those casts per operand, as FP8_CAST_BYTES (an amax pass, a scale and a cast are one launch
# each): forward (x, W), backward (dY, x, W)
FP8_CAST_LAUNCHES: dict[str, tuple[tuple[int, int], tuple[int, int, int]]] = {
    "tensorwise": ((2, 2), (2, 2, 2)), "rowwise": ((2, 2), (4, 2, 2)), "rowwise_with_gw_hp": ((2, 2), (2, 0, 2)),
    "delayed": ((1, 1), (1, 0, 0)), "current": ((3, 3), (3, 0, 0)),
    "nanochat": ((2, 2), (3, 1, 1)), "mxfp8": ((1, 1), (1, 0, 0)), "mxfp8_torchao": ((1, 1), (2, 1, 1))}
# recipes whose weight-gradient GEMM runs in the 16-bit dtype, from the saved input and dY (ddplan.roofline prices
# half the backward FLOPs at the 16-bit GEMM rate): torchao's rowwise_with_gw_hp
FP8_WGRAD_HIGH_PRECISION = ("rowwise_with_gw_hp",)
# recipes of OCP MX block scaling (a scale per 32 elements), which need the hardware spec's `mxfp8: true`
MX_RECIPES = ("mxfp8", "mxfp8_torchao")
# How often an fp8 GEMM's weight is cast (Recipe.fp8_weight_casts, ddplan.specs.FP8_WEIGHT_CASTS): every
# micro-batch (torchao's Float8Linear, nanochat's fp8.py, Transformer Engine called without is_first_microbatch, as
# Composer's amp_fp8 runs it), or once a step, the fp8 copy cached for the step's other micro-batches (Transformer
# Engine's Linear given is_first_microbatch, as Megatron-Core passes it: megatron/core/extensions/
# transformer_engine.py@d98e8a64 L1338-1345, set on each step's first micro-batch by pipeline_parallel/schedules.py
# L496-497). Only Transformer Engine's recipes cache it:
TE_RECIPES = ("delayed", "current", "mxfp8")  # Transformer Engine's: those whose modules can cache a weight's cast


def fp8_cast_launches(recipe: str, weight_reuse: int = 1, weights_fp8: bool = False) -> tuple[float, float]:
    """(forward, backward) kernel launches of one fp8 GEMM's casts a micro-batch: FP8_CAST_LAUNCHES, the weight's
    spread over the weight_reuse micro-batches one cast serves; weights_fp8 (kept in fp8): one transpose a step for
    the weight. e.g. current, reuse 8: 3 + 3/8, 3; with the weights in fp8: 3 + 1/8, 3."""
    if recipe not in FP8_CAST_LAUNCHES or weight_reuse < 1:
        raise ValueError(f"need a recipe of {FP8_RECIPES} and weight_reuse >= 1; got {recipe!r}, {weight_reuse}")
    (lx, lw), (ldy, lbx, lbw) = FP8_CAST_LAUNCHES[recipe]
    if weights_fp8:
        lw, lbw = 1, 0
    return lx + lw / weight_reuse, ldy + lbx + lbw / weight_reuse


def fp8_cast_bytes(m: int, n: int, k: int, recipe: str, weight_shards: int = 0,
                   gathers: int = 2, weight_reuse: int = 1, weights_fp8: bool = False) -> tuple[float, float]:
    """(forward, backward) bytes one fp8 GEMM y = x W^T (x: m x k, W: n x k, dY: m x n) moves to quantise
    its operands, per micro-batch: per-element costs of FP8_CAST_BYTES times the operand sizes.

        forward = a_x m k + a_W k n;  backward = b_dY m n + b_x m k + b_W k n

    weight_shards > 0: the weight arrives in fp8 from a ZeRO-3 all-gather over that many ranks (torchao
    enable_fsdp_float8_all_gather, tensorwise only): each gather casts only the local shard (2 + 1 B per
    element / shards; its amax is precomputed once per step for all weights, precompute_float8_dynamic_scale_
    for_fsdp, not counted), and backward's dgrad needs the gathered fp8 weight in the other order (1 + 1 B)
    instead of a recast; with gathers = 2 (resharded after forward) backward gathers, and casts, again.
    weight_reuse: the micro-batches one weight cast serves (Recipe.fp8_weight_casts "step": the step's micro-batches), over
    which the weight's bytes spread. weights_fp8: the weights are kept in fp8 (Megatron-Core --fp8-param-gather,
    Layout.fp8_params): no cast, only the transpose backward needs, made once a step (read and write 1 B: 2 B an
    element).
    e.g. tensorwise, m 4096, n k 1024: forward 5 x (4096 + 1024) x 1024 = 26,214,400 B; backward
    6 x 4096 x 1024 + 5 x 4096 x 1024 + 5 x 1024 x 1024 = 51,380,224 B. current, m 2048, k 12288, n 9216 (GPT-3
    175B's QKV at tp 4), reuse 16: forward 6 x 2048 x 12288 + 6 x 12288 x 9216 / 16 = 193,462,272 B (the weight's
    679,477,248 B cast every micro-batch would be 4.5 times the input's: n / m).
    Ref: torchao/float8/float8_linear.py; torchtitan docs/float8.md (enable_fsdp_float8_all_gather,
    precompute_float8_dynamic_scale_for_fsdp); Transformer Engine DelayedScaling; nanochat/fp8.py.
    """
    if recipe not in FP8_CAST_BYTES:
        raise ValueError(f"fp8 recipe must be one of {FP8_RECIPES}, got {recipe!r}")
    if min(m, n, k) <= 0 or weight_shards < 0 or gathers not in (1, 2) or weight_reuse < 1:
        raise ValueError(f"need positive m, n, k, weight_shards >= 0, gathers 1 or 2 and weight_reuse >= 1; got {m}, "
                         f"{n}, {k}, {weight_shards}, {gathers}, {weight_reuse}")
    if weight_shards and recipe != "tensorwise":
        raise ValueError(f"fp8 all-gather of weights is torchao's, for the tensorwise recipe; got {recipe!r}")
    (ax, aw), (bdy, bx, bw) = FP8_CAST_BYTES[recipe]
    if weight_shards:
        aw = 3.0 / weight_shards
        bw = 2.0 + (3.0 / weight_shards if gathers == 2 else 0.0)
    if weights_fp8:
        aw, bw = 2.0, 0.0
    return ax * m * k + aw * k * n / weight_reuse, bdy * m * n + bx * m * k + bw * k * n / weight_reuse


# fp8 by training stack (issue 35). A hardware spec's `sustained_fp8` (the fraction of the best fp8 GEMM rate that
# fp8 training keeps) is fitted on the fp8 runs of FP8_TUNED_STACKS: NVIDIA's NeMo recipes as MLPerf Training ran
# them (Transformer Engine with fp8 weights, CUDA graphs, fused kernels; every fp8 run the dataset has on B200 and
# GB200 and 15 on GH100). Every other stack, or one not stated, keeps FP8_STACK_KEPT of it: fitted
# (ddplan.validation.fit_fp8_stack) on the fp8 runs of the other stacks, all on H100, at GH100's sustained_fp8:
# llm-foundry's Composer with Transformer Engine (7, MPT-1B/3B), OLMo-core's torchao float8 (5, 1B-32B) and FP8-LM's
# Megatron-LM with Transformer Engine (3, GPT-7B-175B, 2023). Fitted alone with the tuned runs, each gives a factor
# near the others' (0.754, 0.839 and 0.693: 0.649, 0.722 and 0.597 of the best rate, against MLPerf's 0.861; FP8-LM's
# lowest, its bf16 twins 8% slower than predicted too; 2026-12-07, thirteenth session, with the MLPerf runs' gradient
# buckets priced: 0.764, 0.788, 0.693 against 0.849 before), so one factor serves them, and leaving each source out
# the others' factor prices it within its bf16 twins' error. Assumed the same on other GPUs (no fp8 run of another stack
# on them). `--framework nemo` prices the tuned recipes. `megatron-bridge` joins them as assumed, without a run of its
# own in the dataset: its flat performance recipes are NVIDIA's successors of those NeMo scripts on the same
# Megatron-Core and Transformer Engine, fp8 weights gathered in fp8 (frameworks/megatron-bridge.yaml); the runs held
# back from ddplan will check it.
FP8_TUNED_STACKS = frozenset({"nemo", "megatron-bridge"})
FP8_STACK_KEPT = 0.748


def fp8_stack_factor(framework: str | None, kept: float | None = None) -> float:
    """What a stack keeps of a hardware's sustained_fp8: 1 for FP8_TUNED_STACKS (the fraction was fitted on them),
    else `kept` (a re-fit's) or FP8_STACK_KEPT. framework: a frameworks/ profile's name, or None (not stated).
    e.g. "nemo" -> 1.0; "composer" or None -> 0.748: on H100, 0.861 x 0.748 = 0.644 of the best fp8 rate."""
    if framework in FP8_TUNED_STACKS:
        return 1.0
    return FP8_STACK_KEPT if kept is None else kept


_FRACTIONS: dict[str, dict[str, float]] = {}


# recipes whose fp8 GEMMs keep for backward the fp8 copy of their input they cast (1 byte an element), not the
# 16-bit tensor: Transformer Engine's Linear and LayerNormLinear (transformer_engine/pytorch/module/linear.py@d0067d0
# L597-621: the quantized inputmat, its column-wise data only, is what backward gets; layernorm_linear.py L468-487:
# ln_out likewise), which Composer's amp_fp8 and Megatron-Core run (delayed or current scaling); nanochat's fp8.py (its
# autograd function saves the fp8 x). torchao's Float8Linear saves the high-precision input and casts it again in
# backward (torchao/float8/float8_linear.py), so "tensorwise", "rowwise" and "rowwise_with_gw_hp" keep the 16-bit
# tensor, as torchao's MXFP8Linear does ("mxfp8_torchao": save_for_backward(input_hp, weight_hp)).
FP8_SAVES_QUANTIZED = ("delayed", "current", "nanochat", "mxfp8")
# recipes under which Megatron-Core has the attention's output projection keep its original 16-bit input, the
# attention core's output, which the core saves anyway (set_save_original_input on linear_proj, for fp8 recipes other
# than delayed with Transformer Engine >= 2.6: megatron/core/transformer/attention.py@d98e8a64 L429-444, "to avoid
# the extra memory usage of the quantized tensor"); the only recipes of FP8_SAVES_QUANTIZED that Megatron-Core runs
# besides delayed. Backward then quantizes that input again for the weight gradient: one activation-sized cast a
# layer, not priced.
FP8_SAVES_ORIGINAL_PROJ = ("current", "mxfp8")


def with_fp8_saves(anatomy: Anatomy, recipe: str, lm_head: bool, elem_bytes: int) -> Anatomy:
    """The anatomy with each fp8 GEMM's saved input (fp8_eligible; its first Saved, as ddplan.anatomy builds a GEMM)
    kept as an fp8 copy of one byte an element, named `<input>.fp8`, where the recipe saves it so
    (FP8_SAVES_QUANTIZED): the 16-bit tensor is then kept only if another op saves it too (the attention core its
    output, which the output projection also saves as fp8 under delayed scaling: both are kept, as Transformer
    Engine's DotProductAttention and Linear do; under current scaling and MXFP8 Megatron-Core's output projection keeps
    the original instead, FP8_SAVES_ORIGINAL_PROJ, so no copy is made). elem_bytes: the compute dtype's (the 16-bit
    tensor's) size.
    The copies' scales (a few floats a tensor, or one byte per 32 under MXFP8) are not counted."""
    if recipe not in FP8_SAVES_QUANTIZED:
        return anatomy

    original_proj = recipe in FP8_SAVES_ORIGINAL_PROJ

    def op_saves(op: Op) -> Op:
        if op.kind != "gemm" or not op.saves or not fp8_eligible(op, lm_head):
            return op
        if original_proj and op.name.endswith(".attn.c_proj"):  # keeps the attention core's output, saved anyway
            return op
        x = op.saves[0]
        # the copy lives in the GEMM's saved state: a per-module recompute drops it with the GEMM's module, not
        # with the module that made the 16-bit tensor (Megatron's layernorm / moe_act checkpoints free only their
        # own outputs)
        copy = replace(x, name=f"{x.name}.fp8", bytes=x.bytes / elem_bytes, module=modules_of(op))
        return replace(op, saves=(copy, *op.saves[1:]))

    def ops(group: tuple[Op, ...]) -> tuple[Op, ...]:
        return tuple(op_saves(op) for op in group)

    return replace(anatomy, pre=ops(anatomy.pre), blocks=tuple(ops(b) for b in anatomy.blocks),
                   post=ops(anatomy.post))


def fp8_weight_fractions(spec) -> dict[str, float]:
    """Parameter group -> the share of its elements that are weights of fp8 GEMMs (fp8_eligible, with the
    recipe's LM-head rule): the weights an fp8 all-gather sends at 1 byte. Counted on the model's own GEMMs
    (ddplan.anatomy, one sequence, no parallelism), so the shapes are the ones that are priced.
    e.g. a dense GPT with untied embeddings: block_matrices 1.0, lm_head 0.0, wte 0.0."""
    key = spec.model_dump_json()
    if key not in _FRACTIONS:
        an = build_anatomy(spec, batch=1)
        eligible: dict[str, float] = {}
        for op in an.ops:
            if op.weight_group is not None and fp8_eligible(op, spec.recipe.fp8_lm_head):
                eligible[op.weight_group] = eligible.get(op.weight_group, 0.0) + op.weight_elements
        counts = param_counts(spec.architecture)
        if len(_FRACTIONS) > 64:
            _FRACTIONS.clear()
        _FRACTIONS[key] = {g: min(1.0, eligible.get(g, 0.0) / n) if n else 0.0 for g, n in counts.items()}
    return _FRACTIONS[key]
