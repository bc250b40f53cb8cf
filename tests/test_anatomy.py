"""ddplan.anatomy against the reference torch model, against hand computations, and its properties.

The reference comparisons run tiny models on CPU in fp32 (`dtype_policy="fp32"`, where weights are
saved by reference and no cast copies exist) and take a few seconds in all; measurements are cached
per (model, attention, recompute) for the module.
"""

from __future__ import annotations

import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddplan.anatomy import (
    RECOMPUTE_POLICIES,
    adamw_bytes,
    attention_pairs,
    build_anatomy,
    decomposed_rmsnorm_bytes,
    decomposed_rope_bytes,
    decomposed_swiglu_bytes,
    for_tp,
    megatron_unfused_saved_bytes,
    with_recompute,
    muon_flops,
    sdpa_math_saved_bytes,
)
from ddplan.registry import load_model
from ddplan.specs import Dropout, ModelSpec, MoE, run_variant

# --------------------------------------------------------------------------------------------
# Tiny models


def _tiny(name: str, seq_len: int, compute: str = "fp32", params: str | None = "fp32", **arch) -> ModelSpec:
    """A copy of a shipped spec with architecture fields replaced, the recipe's sequence set to seq_len and
    (by default) every dtype fp32; re-validated, since model_copy(update=...) does not validate."""
    spec = load_model(name)
    dtypes = spec.dtypes.model_copy(update={
        "compute": compute, **({"params": dict.fromkeys(spec.dtypes.params, params)} if params else {})})
    recipe = spec.recipe.model_copy(update={"seq_len": seq_len, "total_batch_tokens": 8 * seq_len})
    spec = spec.model_copy(update={"architecture": spec.architecture.model_copy(update=arch),
                                   "dtypes": dtypes, "recipe": recipe})
    return ModelSpec.model_validate(spec.model_dump())


def nanochat_tiny(depth: int, **kw) -> ModelSpec:
    """nanochat at `depth` (pattern SSSL: layer 0 gets a 128-token window at seq 256), vocab 512, seq 256."""
    return _tiny(f"d{depth}", 256, vocab_size=512, max_seq_len=256, **kw)


def gpt2_tiny(**kw) -> ModelSpec:
    return _tiny("gpt2-124m", 128, num_layers=2, d_model=128, num_heads=2, num_kv_heads=2, head_dim=64,
                 vocab_size=512, max_seq_len=128, mlp_hidden_dim=512, **kw)


def llama_gqa_tiny(**kw) -> ModelSpec:
    return _tiny("llama-3-8b", 128, num_layers=2, d_model=128, num_heads=4, num_kv_heads=2, head_dim=32,
                 vocab_size=512, max_seq_len=128, mlp_hidden_dim=384, **kw)


def mixtral_tiny(**kw) -> ModelSpec:
    """Mixtral's block, shrunk: 4 SwiGLU experts of 96, top 2, on every layer."""
    kw.setdefault("moe", MoE(num_experts=4, top_k=2, expert_hidden_dim=96))
    return _tiny("mixtral-8x7b", 128, num_layers=2, d_model=128, num_heads=4, num_kv_heads=2, head_dim=32,
                 vocab_size=512, max_seq_len=128, mlp_hidden_dim=384, **kw)


def qwen2_moe_tiny(**kw) -> ModelSpec:
    """Qwen2-MoE's block, shrunk: a dense first layer, then 4 experts of 96 (top 2) beside a gated shared expert."""
    kw.setdefault("moe", MoE(num_experts=4, top_k=2, expert_hidden_dim=96, shared_experts=1, shared_hidden_dim=160,
                             shared_expert_gate=True, dense_layers=1))
    return _tiny("mixtral-8x7b", 128, num_layers=2, d_model=128, num_heads=4, num_kv_heads=2, head_dim=32,
                 vocab_size=512, max_seq_len=128, mlp_hidden_dim=384, **kw)


def weighted_in_activation(spec: ModelSpec) -> ModelSpec:
    """The model with its routed copies weighted in the experts' activation (Recipe.moe_weighting "activation",
    Megatron-Core's weighted SwiGLU) instead of at the combine."""
    return run_variant(spec, moe_weighting="activation")


TINY = {
    "nanochat-d2": lambda: nanochat_tiny(2),
    "nanochat-d3": lambda: nanochat_tiny(3),
    "gpt2": gpt2_tiny,
    "llama-gqa": llama_gqa_tiny,
    "mixtral-moe": mixtral_tiny,
    "qwen2-moe": qwen2_moe_tiny,
    "mixtral-weighted": lambda: weighted_in_activation(mixtral_tiny()),
    "gelu-moe-weighted": lambda: weighted_in_activation(mixtral_tiny(mlp="gelu")),
    "llama-te": lambda: run_variant(llama_gqa_tiny(), fusions="transformer-engine"),
    "mixtral-te": lambda: run_variant(mixtral_tiny(), fusions="transformer-engine"),
}
BATCH = 2
# reference attention name -> (anatomy attention kind, window support)
ATTENTION = {"sdpa-math": ("sdpa_math", "mask"), "sdpa-fused": ("fused_sdpa", "mask")}
RECOMPUTE = ("none", "selective", "full", "per-op")

# Saved-for-backward bytes as measured with torch 2.13 on CPU (fp32), batch 2, attention by
# F.scaled_dot_product_attention under the math backend or the CPU flash kernel; the anatomy gives the
# same figure to the byte for every one of them (the test asserts 1% and prints both). per-op: torchtitan's
# SelectiveAC policy (reference.Transformer.per_op_contexts), its kept outputs read from torch's own
# selective-checkpoint storage:
#
#   model        attention   none        selective   full       per-op
#   nanochat-d2  sdpa-math   15,028,020  14,044,980  4,063,028   8,257,332
#   nanochat-d2  sdpa-fused  14,245,684  14,044,980  4,063,028   7,212,852
#   nanochat-d3  sdpa-math   38,784,820  35,704,628  5,898,036  17,956,660
#   nanochat-d3  sdpa-fused  36,175,668  35,704,628  5,898,036  14,823,220
#   gpt2         sdpa-math    5,520,388   4,996,100  1,055,748   4,201,476
#   gpt2         sdpa-fused   5,000,196   4,996,100  1,055,748   3,681,284
#   llama-gqa    sdpa-math    7,775,236   6,464,516  1,184,772   3,937,284
#   llama-gqa    sdpa-fused   6,472,708   6,464,516  1,184,772   2,896,900
#   mixtral-moe  sdpa-math    7,279,620   5,968,900  1,184,772   (not compared: see PER_OP_UNLIKE_TORCHTITAN)
#   mixtral-moe  sdpa-fused   5,977,092   5,968,900  1,184,772
#   qwen2-moe    sdpa-math    8,314,884   7,004,164  1,184,772
#   qwen2-moe    sdpa-fused   7,012,356   7,004,164  1,184,772
#
# and Megatron-Core's modules (MODULE_CASES), math attention: gpt2 selective:mlp 3,423,236; llama-gqa
# selective:core_attn+mlp 3,318,788; mixtral-moe selective:moe 4,629,508 and selective:core_attn+moe 3,318,788;
# qwen2-moe selective:mlp+moe 4,629,508 and selective:shared_experts 7,527,428; and with the routed copies weighted in
# the activation (Megatron-Core's weighted SwiGLU), mixtral-weighted none 6,362,116 (mixtral-moe's 7,279,620 less
# 917,504 B: each layer's 512 x 128 fp32 expert outputs and 512 x 96 silu(g), plus 512 fp32 row probabilities
# kept in place of 256 x 2 combine weights), selective:moe 4,629,508; with Transformer Engine's fused norms, RoPE and
# SwiGLU (Recipe.fusions), llama-te none 6,300,676 (llama-gqa's 7,775,236 less 1,474,560 B: each layer's two
# normalised 256 x 128 inputs, its 256 x 384 silu(g) and two 128 x 16 -sin tables, and the final norm's), mixtral-te
# none 6,198,276; and the layer policies (LAYER_CASES), math attention: nanochat-d3 full:1 27,688,756, full:2
# 17,059,636 and every:2 28,221,236, llama-gqa full:1 and every:2 4,480,004 (2 alike layers: one re-run either way),
# qwen2-moe full:1 5,019,652 (its dense layer re-run) and every:2 4,480,004 (its MoE layer), mixtral-moe full:1
# 4,232,196
SAVED_TOLERANCE = 0.01
FLOPS_TOLERANCE = 0.01
# The reference runs a mixture of experts' experts one after another, an aten.mm each, which the per-op policy
# counts and saves; torchtitan runs them as one torch._grouped_mm, outside its save list, as the anatomy does.
PER_OP_UNLIKE_TORCHTITAN = ("mixtral-moe", "qwen2-moe", "mixtral-weighted", "gelu-moe-weighted", "mixtral-te")

# Megatron-Core's per-module recompute where a torch checkpoint states it (reference.CHECKPOINTED_MODULES): the dense
# MLP (qwen2-moe's first layer is dense), the MoE layer whole, the shared experts, with and without the core
MODULE_CASES = {"gpt2": ("selective:mlp",), "llama-gqa": ("selective:core_attn+mlp",),
                "mixtral-moe": ("selective:moe", "selective:core_attn+moe"),
                "qwen2-moe": ("selective:mlp+moe", "selective:shared_experts"),
                "mixtral-weighted": ("selective:moe",), "llama-te": ("selective:mlp",)}
# Megatron-Core's block method (`full:N`: the first N layers re-run whole) and torchtitan's layer selective AC
# (`every:K`: every K-th layer re-run whole) on one stage: nanochat's layers differ
# (value embeddings, windows, the backout), qwen2-moe's first layer is dense, the second MoE
LAYER_CASES = {"nanochat-d3": ("full:1", "full:2", "every:2"), "llama-gqa": ("full:1", "every:2"),
               "qwen2-moe": ("full:1", "every:2"), "mixtral-moe": ("full:1",)}
CASES = [pytest.param(m, a, rc, id=f"{m}-{a}-{rc}") for m in TINY for a in ATTENTION for rc in RECOMPUTE
         if not (rc == "per-op" and m in PER_OP_UNLIKE_TORCHTITAN)] + [
    pytest.param(m, a, rc, id=f"{m}-{a}-{rc}") for cases in (MODULE_CASES, LAYER_CASES) for m, policies in cases.items()
    for a in ATTENTION for rc in policies]


@functools.cache
def _spec(model: str) -> ModelSpec:
    return TINY[model]()


@functools.cache
def _measured(model: str, attention: str, recompute: str) -> dict:
    torch = pytest.importorskip("torch")
    from ddplan.calibrate.reference import measure

    spec = _spec(model)
    # one thread: these tiny matmuls gain nothing from more, and on a busy CPU (tests run in parallel)
    # multi-threaded torch measured 5-15x slower here
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return measure(spec, batch=BATCH, seq_len=spec.recipe.seq_len, attention=attention, recompute=recompute,
                       dtype_policy="fp32")
    finally:
        torch.set_num_threads(threads)


def _anatomy(model: str, attention: str, recompute: str):
    spec = _spec(model)
    kind, windows = ATTENTION[attention]
    return build_anatomy(spec, batch=BATCH, seq_len=spec.recipe.seq_len, attention=kind, windows=windows,
                         recompute=recompute)


# --------------------------------------------------------------------------------------------
# Against the reference model


@pytest.mark.parametrize(("model", "attention", "recompute"),
                         [c for c in CASES if c.values[1] == "sdpa-math"])
def test_matmul_flops_match_flop_counter_with_math_attention(model, attention, recompute):
    """anatomy.matmul_flops() == FlopCounterMode's total within 1%, recompute included (agrees exactly today).

    Only with the math backend: FlopCounterMode's formula for the CPU flash kernel (the one sdpa-fused
    runs on CPU) counts the full s x s product whatever the causal mask, plus the kernel's recompute of
    the scores in backward, so it is not comparable with the anatomy's model FLOPs (it reads 4-11% above
    them on these models).
    """
    pytest.importorskip("torch")
    measured = _measured(model, attention, recompute)["flops_fwd_bwd"]
    predicted = _anatomy(model, attention, recompute).matmul_flops()
    print(f"{model} {attention} {recompute}: FLOPs measured {measured:,} anatomy {predicted:,.0f}")
    assert predicted == pytest.approx(measured, rel=FLOPS_TOLERANCE)


@pytest.mark.parametrize(("model", "recompute"), [("gpt2", "full"), ("gpt2", "selective"), ("llama-gqa", "full"),
                                                  ("nanochat-d3", "full")])
def test_regions_re_run_whole_match_flop_counter_without_early_stop(model, recompute):
    """rerun_whole (Megatron's reentrant CheckpointFunction re-runs a region whole) against the reference model
    checkpointed with early_stop=False: FlopCounterMode's matmul total within 1%, and it exceeds the early-stop
    total by exactly the forward FLOPs of the ops torch's early stop skips (Op.recompute_skip: a block's last GEMM
    under full recompute, the attention core's PV product under selective, math attention). With early stop the
    reference agrees with the plain anatomy (test_matmul_flops_match_flop_counter_with_math_attention)."""
    torch = pytest.importorskip("torch")
    from ddplan.anatomy import rerun_whole
    from ddplan.calibrate.reference import measure

    spec = _spec(model)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        whole = measure(spec, batch=BATCH, seq_len=spec.recipe.seq_len, attention="sdpa-math", recompute=recompute,
                        dtype_policy="fp32", early_stop=False)["flops_fwd_bwd"]
    finally:
        torch.set_num_threads(threads)
    early = _anatomy(model, "sdpa-math", recompute)
    predicted = with_recompute(rerun_whole(early), recompute).matmul_flops()
    assert predicted == pytest.approx(whole, rel=FLOPS_TOLERANCE)
    skipped = sum(op.flops_fwd for op in early.ops
                  if recompute in op.recompute_skip and op.kind in ("gemm", "attention"))
    assert skipped > 0 and predicted - early.matmul_flops() == pytest.approx(skipped, rel=1e-9)


@pytest.mark.parametrize(("model", "attention", "recompute"), CASES)
def test_saved_bytes_match_saved_tensors_hooks(model, attention, recompute):
    """anatomy.saved_bytes() == the reference's saved activation storages within 1% (exact figures in the
    table above). Weights that the reference saves by reference (fp32 policy: the parameters themselves)
    are reported apart and not counted as activations."""
    pytest.importorskip("torch")
    m = _measured(model, attention, recompute)
    predicted = _anatomy(model, attention, recompute).saved_bytes()
    print(f"{model} {attention} {recompute}: saved measured {m['saved_bytes']:,} anatomy {predicted:,.0f} "
          f"(diff {predicted - m['saved_bytes']:+,.0f} B); weights saved by reference {m['saved_param_bytes']:,}")
    assert predicted == pytest.approx(m["saved_bytes"], rel=SAVED_TOLERANCE)
    assert m["saved_param_bytes"] > 0


# --------------------------------------------------------------------------------------------
# Per dtype and SDPA backend: torch's real kernels (F.scaled_dot_product_attention under sdpa_kernel)


def gpt2_sdpa(compute: str, **arch) -> ModelSpec:
    """GPT-2 tiny at seq 256 in `compute` with the shipped fp32 masters; pass num_kv_heads=1 and
    window_pattern="SL" for grouped-query attention and a 128-token window given as an explicit mask.
    GPT-2's LayerNorm saves on CPU what the anatomy counts in every dtype; rms_norm does not (torch 2.13's CPU
    rms_norm upcasts 16-bit input and saves fp32 copies, a difference outside attention), so the 16-bit
    comparisons use this family."""
    return _tiny("gpt2-124m", 256, compute=compute, params=None, num_layers=2, d_model=128, num_heads=4,
                 num_kv_heads=arch.pop("num_kv_heads", 4), head_dim=32, vocab_size=512, max_seq_len=256,
                 mlp_hidden_dim=512, **arch)


SDPA_VARIANTS = {"mha": {}, "gqa-window": {"num_kv_heads": 1, "window_pattern": "SL"}}
SDPA_CASES = [pytest.param(v, dt, att, rc, id=f"{v}-{dt}-{att}-{rc}") for v in SDPA_VARIANTS
              for dt in ("fp32", "bf16", "fp16") for att in ATTENTION for rc in RECOMPUTE]
SDPA_TOLERANCE = 0.01


@functools.cache
def _measured_sdpa(variant: str, compute: str, attention: str, recompute: str, dropout: bool = False) -> tuple:
    torch = pytest.importorskip("torch")
    from ddplan.calibrate.reference import measure

    drop = {"dropout": Dropout(hidden=0.1, attention=0.1)} if dropout else {}
    spec = gpt2_sdpa(compute, **SDPA_VARIANTS[variant], **drop)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        m = measure(spec, batch=BATCH, seq_len=256, attention=attention, recompute=recompute, dtype_policy="spec")
    finally:
        torch.set_num_threads(threads)
    kind, windows = ATTENTION[attention]
    an = build_anatomy(spec, batch=BATCH, attention=kind, windows=windows, recompute=recompute)
    return spec, m, an


@pytest.mark.parametrize(("variant", "compute", "attention", "recompute"), SDPA_CASES)
def test_saved_bytes_match_torch_sdpa_per_dtype_and_backend(variant, compute, attention, recompute):
    """anatomy.saved_bytes() == what torch 2.13 saves on CPU within 1%, for the math backend (fp32 inside:
    sdpa_math_saved_bytes) and the CPU flash kernel, in fp32, bf16 and fp16, with and without GQA and an
    explicit window mask. The attention's share is large here (s = 256, d_model 128): under sdpa-math and no
    recompute the s x s probabilities alone are ~40% of the bf16 total, so a dtype error in them cannot hide."""
    pytest.importorskip("torch")
    spec, m, an = _measured_sdpa(variant, compute, attention, recompute)
    print(f"{variant} {compute} {attention} {recompute}: saved measured {m['saved_bytes']:,} "
          f"anatomy {an.saved_bytes():,.0f}")
    assert an.saved_bytes() == pytest.approx(m["saved_bytes"], rel=SDPA_TOLERANCE)


@pytest.mark.parametrize("compute", ["fp32", "bf16"])
@pytest.mark.parametrize("recompute", RECOMPUTE)
def test_saved_bytes_match_torch_math_sdpa_with_dropout(compute, recompute):
    """Hidden and attention dropout 0.1 under sdpa-math. The anatomy counts dropout masks as torch keeps them
    on CUDA (native_dropout's bool, 1 byte an element); on CPU at::dropout, which the math SDPA calls for the
    probabilities, keeps the fp32 noise instead (4 bytes), so without recompute torch saves 3 b h s^2 bytes
    a layer more here than on a GPU (aten/src/ATen/native/Dropout.cpp: is_fused_kernel_acceptable needs
    CUDA/XPU). The reference model's hidden dropout is native_dropout, as on a GPU."""
    pytest.importorskip("torch")
    spec, m, an = _measured_sdpa("mha", compute, "sdpa-math", recompute, dropout=True)
    a = spec.architecture
    cpu_noise = 3 * BATCH * a.num_heads * 256**2 * a.num_layers if recompute == "none" else 0
    print(f"dropout {compute} {recompute}: measured {m['saved_bytes']:,} - CPU noise {cpu_noise:,}, "
          f"anatomy {an.saved_bytes():,.0f}")
    assert an.saved_bytes() == pytest.approx(m["saved_bytes"] - cpu_noise, rel=SDPA_TOLERANCE)


@pytest.mark.parametrize("recompute", ["full", "selective"])
def test_early_stop_re_runs_a_gemm_a_dropout_after_it_needs(recompute):
    """Under torch's early stop a block's last GEMM is not re-run, unless a dropout after it saves its mask: then
    recomputation must run the GEMM to reach the dropout. GPT-2 with hidden and attention dropout 0.1, sdpa-math,
    fp32: the anatomy's matmul FLOPs equal FlopCounterMode's (the reference model checkpoints with torch's
    non-reentrant default, early_stop=True), and no block op is left out of full recompute but the last add."""
    pytest.importorskip("torch")
    spec, m, an = _measured_sdpa("mha", "fp32", "sdpa-math", recompute, dropout=True)
    assert an.matmul_flops() == pytest.approx(m["flops_fwd_bwd"], rel=FLOPS_TOLERANCE)
    assert [op.name.split(".", 1)[1] for op in an.blocks[0] if "full" in op.recompute_skip] == ["resid_add2"]


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_an_embedding_norm_saves_and_weighs_what_torch_does(recompute):
    """BLOOM's word_embeddings_layernorm (Megatron-DeepSpeed --embed-layernorm; bigscience tr11-200B-ml.slurm
    @a16f0ea L124) on the tiny GPT-2 with dropout 0.1, bf16: the saved bytes match the reference model within the
    dropout test's tolerance (CPU's dropout noise on the probabilities taken out as there), and the norm adds its
    input (2 B x b s h) and fp32 mean and rstd (8 B x b s) to the embeddings' saves, and 2 h parameters."""
    torch = pytest.importorskip("torch")
    from ddplan.calibrate.reference import Transformer, count_params, measure
    from ddplan.params import param_counts

    spec = gpt2_sdpa("bf16", dropout=Dropout(hidden=0.1, attention=0.1), embedding_norm=True)
    plain = gpt2_sdpa("bf16", dropout=Dropout(hidden=0.1, attention=0.1))
    a, s = spec.architecture, 256
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        m = measure(spec, batch=BATCH, seq_len=s, attention="sdpa-math", recompute=recompute, dtype_policy="spec")
    finally:
        torch.set_num_threads(threads)
    kind, windows = ATTENTION["sdpa-math"]
    an = build_anatomy(spec, batch=BATCH, attention=kind, windows=windows, recompute=recompute)
    cpu_noise = 3 * BATCH * a.num_heads * s**2 * a.num_layers if recompute == "none" else 0
    assert an.saved_bytes() == pytest.approx(m["saved_bytes"] - cpu_noise, rel=SDPA_TOLERANCE)
    base = build_anatomy(plain, batch=BATCH, attention=kind, windows=windows, recompute=recompute)
    assert an.outside_split[0] - base.outside_split[0] == BATCH * s * (2 * a.d_model + 8)
    assert param_counts(a)["norms"] - param_counts(plain.architecture)["norms"] == 2 * a.d_model
    model = Transformer(spec, attention="sdpa-math", recompute="none", seq_len=s, compute_dtype=torch.bfloat16,
                        logits_fp32=True)
    assert count_params(model)["norms"] == param_counts(a)["norms"]


@pytest.mark.filterwarnings("ignore:.*(kernel not used|do not support):UserWarning")
def test_fused_backend_refuses_what_its_kernels_cannot_run():
    """The CPU flash kernel takes no dropout; sdpa-fused says so instead of falling back to math."""
    pytest.importorskip("torch")
    with pytest.raises(RuntimeError, match="no allowed SDPA kernel"):
        _measured_sdpa("mha", "fp32", "sdpa-fused", "none", dropout=True)


def test_sdpa_math_saved_bytes_by_hand():
    """b 1, h 2, s 4, d 8: scaled q, k and v 4 x 1 x 2 x 4 x 8 = 256 bytes each (fp32 whatever the input dtype),
    probabilities 4 x 2 x 16 = 128; dropout adds a bool mask (32) and the dropped probabilities (128)."""
    assert sdpa_math_saved_bytes(1, 2, 4, 8, False) == {"q_scaled": 256, "k_scaled": 256, "v_fp32": 256, "probs": 128}
    with_dropout = sdpa_math_saved_bytes(1, 2, 4, 8, True)
    assert (with_dropout["dropout_mask"], with_dropout["probs_dropped"]) == (32, 128)
    with pytest.raises(ValueError, match="positive"):
        sdpa_math_saved_bytes(0, 2, 4, 8, False)


def test_megatron_unfused_saved_bytes_is_korthikanti_attention():
    """Korthikanti et al. 2022 (arXiv 2205.05198) sec. 4.1, GPT-3 22B (s 2048, b 1, h 6144, a 64, 16-bit):
    Q, K 4sbh, V 2sbh, softmax 2as^2b, dropout mask as^2b, dropout output 2as^2b."""
    s, b, h, a = 2048, 1, 6144, 64
    n = megatron_unfused_saved_bytes(b, a, a, s, h // a, 2, True)
    assert n["q"] + n["k"] == 4 * s * b * h and n["v"] == 2 * s * b * h
    assert n["probs"] + n["dropout_mask"] + n["probs_dropped"] == 5 * a * s * s * b


# --------------------------------------------------------------------------------------------
# Hand computations


def test_attention_pairs_full_causal_is_the_triangle():
    """A window covering the sequence: query i sees i+1 keys, s(s+1)/2 in all."""
    assert attention_pairs(8, 8, "flash_package", "native") == 8 * 9 // 2 == 36
    assert attention_pairs(2048, 2048, "flash_package", "native") == 2048 * 2049 // 2
    assert attention_pairs(2048, 2048, "fused_sdpa", "mask") == 2048 * 2049 // 2  # is_causal skips the triangle
    assert attention_pairs(8, 100, "flash_package", "native") == 36


def test_attention_pairs_sliding_window_sees_w_plus_one_keys():
    """s = 8, w = 2: queries 0, 1 see 1 and 2 keys, the other 6 see 3: 1 + 2 + 3 x 6 = 21."""
    assert attention_pairs(8, 2, "flash_package", "native") == 1 + 2 + 3 * 6 == 21
    # nanochat d24's S window at T = 2048: 512 + 1 keys once full
    assert attention_pairs(2048, 512, "flash_package", "native") == 513 * 514 // 2 + (2048 - 513) * 513


def test_attention_pairs_math_always_computes_s_squared_and_fused_with_a_mask_too():
    for w in (1, 2, 7, 8, 100):
        assert attention_pairs(8, w, "unfused_math", "mask") == 64
    assert attention_pairs(8, 2, "fused_sdpa", "mask") == 64  # explicit mask: no block skipping
    assert attention_pairs(8, 7, "fused_sdpa", "mask") == 64  # window 7 < s = 8 still needs the mask
    with pytest.raises(ValueError, match="positive"):
        attention_pairs(0, 2, "flash_package", "native")


def test_gemm_op_flops_are_2mnk_forward_and_4mnk_backward():
    """d24's h0.mlp.c_fc at device batch 32 x 2048: m = 65,536 tokens, k = 1536, n = 6144.

    forward 2mnk = 2 x 65,536 x 6144 x 1536 = 1,236,950,581,248; backward 4mnk = 2,473,901,162,496.
    """
    a = build_anatomy(load_model("d24"), batch=32, seq_len=2048)
    op = next(o for o in a.ops if o.name == "h0.mlp.c_fc")
    m, n, k = 32 * 2048, 6144, 1536
    assert op.kind == "gemm" and op.shape == (m, n, k)
    assert op.flops_fwd == 2 * m * n * k == 1_236_950_581_248
    assert op.flops_bwd == 4 * m * n * k == 2_473_901_162_496


def test_muon_flops_by_hand():
    """Newton-Schulz on 1536 x 6144, 5 steps, m = 1536, n = 6144: 5 x (4 m^2 n + 2 m^3)
    = 5 x (57,982,058,496 + 7,247,757,312) = 326,149,079,040; the transpose costs the same."""
    m, n = 1536, 6144
    assert muon_flops(m, n) == 5 * (4 * m * m * n + 2 * m**3) == 326_149_079_040
    assert muon_flops(n, m) == muon_flops(m, n)
    assert muon_flops(m, m, ns_steps=1) == 6 * m**3
    with pytest.raises(ValueError, match="positive"):
        muon_flops(0, 5)


def test_adamw_bytes_by_hand():
    """Read p, g, m, v and write p, m, v: numel x (2 p + g + 4 s).
    d24's lm_head, fp32 everything: 50,331,648 x (8 + 4 + 16) = 1,409,286,144 bytes;
    wte, bf16 params, grads and state: 50,331,648 x (4 + 2 + 8) = 704,643,072 bytes."""
    assert adamw_bytes(50_331_648, 4, 4, 4) == 1_409_286_144
    assert adamw_bytes(50_331_648, 2, 2, 2) == 704_643_072
    assert adamw_bytes(10, 2, 4, 4) == 10 * (4 + 4 + 16)


# --------------------------------------------------------------------------------------------
# Properties

KINDS = [("sdpa_math", "mask"), ("unfused_math", "mask"), ("fused_sdpa", "mask"), ("flash_package", "native")]


@functools.cache
def _property_spec(name: str, pattern: str, shipped_dtypes: bool) -> ModelSpec:
    """A tiny model in fp32, or in its shipped dtypes computing in bf16 (nanochat: fp32 masters, bf16 tables)."""
    dtypes = {"compute": "bf16", "params": None} if shipped_dtypes else {}
    if name == "nanochat":
        return nanochat_tiny(2, window_pattern=pattern, **dtypes)
    return (gpt2_tiny if name == "gpt2" else llama_gqa_tiny)(**dtypes)


configs = st.fixed_dictionaries({
    "spec": st.builds(_property_spec, st.sampled_from(["nanochat", "gpt2", "llama"]),
                      st.sampled_from(["L", "SSSL", "SL"]), st.booleans()),
    "batch": st.integers(1, 4),
    # nanochat's S window is 128 tokens up to seq 512, so only 200 and 256 give it short windows
    "seq_len": st.sampled_from([16, 64, 100, 128, 200, 256]),
    "compiled": st.booleans(),
}).map(lambda c: {**c, "seq_len": min(c["seq_len"], c["spec"].architecture.max_seq_len)})


def _saved(cfg, kind, windows, recompute, **over):
    args = {**cfg, **over}
    return build_anatomy(args["spec"], batch=args["batch"], seq_len=args["seq_len"], attention=kind,
                         windows=windows, recompute=recompute, compiled=args["compiled"]).saved_bytes()


@settings(max_examples=60, deadline=None)
@given(configs)
def test_saved_bytes_non_increasing_none_selective_full(cfg):
    """none >= selective >= full, and per-op >= full (it keeps the checkpoints' inputs, as full does, and some
    outputs); in eager also none >= per-op. Compiled, none can keep less than per-op: the compiler's partitioner
    recomputes cheap ops from what it chooses to keep, while per-op keeps every odd matmul's output and the
    fp32 scores of the math attention whatever the compiler would have chosen."""
    for kind, windows in KINDS:
        none, sel, full, per_op = (_saved(cfg, kind, windows, rc) for rc in RECOMPUTE)
        assert none >= sel >= full > 0, (kind, none, sel, full)
        assert per_op >= full, (kind, per_op, full)
        if not cfg["compiled"]:
            assert none >= per_op, (kind, none, per_op)


@settings(max_examples=60, deadline=None)
@given(configs, st.sampled_from(RECOMPUTE))
def test_fused_attention_never_saves_more_than_math(cfg, recompute):
    math = min(_saved(cfg, "unfused_math", "mask", recompute), _saved(cfg, "sdpa_math", "mask", recompute))
    assert _saved(cfg, "fused_sdpa", "mask", recompute) <= math
    assert _saved(cfg, "flash_package", "native", recompute) <= math


@settings(max_examples=60, deadline=None)
@given(configs, st.sampled_from(KINDS), st.sampled_from(RECOMPUTE))
def test_saved_bytes_are_linear_in_batch_but_for_masks_and_rope(cfg, kind, recompute):
    """saved(b) = A b + C, C the batch-independent tensors: the boolean masks (one per distinct window),
    SDPA's additive masks, rotary's -sin tables, the learned-position indices, the loss's 0-d total weight
    and, under mixed precision, the compute-dtype copies of fp32 master weights."""
    b = cfg["batch"]
    spec = cfg["spec"]

    def anatomy(batch):
        return build_anatomy(spec, batch=batch, seq_len=cfg["seq_len"], attention=kind[0], windows=kind[1],
                             recompute=recompute, compiled=cfg["compiled"])

    one, two, three = (anatomy(k * b).saved_bytes() for k in (1, 2, 3))
    assert three - two == two - one  # affine in batch
    constant = 2 * one - two
    independent = sum(s.bytes for n, s in anatomy(b).saved_tensors().items()
                      if n.startswith("mask.") or "mask_additive" in n or "rope_" in n
                      or n.endswith(".weight_cast") or n in ("pos_idx", "loss_total_weight"))
    assert constant == independent
    assert 2 * one - independent <= two <= 2 * one


@settings(max_examples=60, deadline=None)
@given(configs, st.sampled_from(KINDS), st.sampled_from(RECOMPUTE))
def test_compiled_never_saves_more_than_eager(cfg, kind, recompute):
    assert _saved(cfg, *kind, recompute, compiled=True) <= _saved(cfg, *kind, recompute, compiled=False)


def test_for_tp_does_not_inherit_the_base_cached_activation_sums():
    """Regression: for_tp copied the tp=1 anatomy's cached saved_split/_transient when memory had already
    been asked of it, so a tp share reported the whole model's activations (found by the pricing-core
    refactor, 3x memory for tp 4)."""
    from ddplan.anatomy import for_tp

    spec = load_model("d24")
    base = build_anatomy(spec, batch=4, attention="unfused_math", windows="mask")
    _ = base.saved_split, base.transient_bytes(), base.op_repeats  # fill the caches
    share = for_tp(base, 4)
    direct = build_anatomy(spec, batch=4, attention="unfused_math", windows="mask", tp=4)
    assert share.saved_split == pytest.approx(direct.saved_split)
    assert share.transient_bytes() == pytest.approx(direct.transient_bytes())
    assert share.saved_split[0] < base.saved_split[0]
    # the merged repeats too (found when op_repeats came: a tp share priced at the whole model's FLOPs)
    assert sum(op.flops_fwd * n for op, n in share.op_repeats) == pytest.approx(
        sum(op.flops_fwd for op in direct.ops))


@pytest.mark.parametrize("model, kw", [("d24", {}), ("llama-3-8b", {"tp": 2}), ("qwen3-30b-a3b", {"ep": 4}),
                                       ("gpt3-22b", {"window_pattern": "L"})])
def test_op_repeats_merge_only_the_blocks_repeats(model, kw):
    """Anatomy.op_repeats: every op counted once; ops merged only with ops of other blocks that match in what
    pricing reads (kind, shape, FLOPs, bytes, recompute marks, wait, calls, the name after `h{i}.`)."""
    a = build_anatomy(load_model(model), batch=2, seq_len=1024, **kw)
    reps = a.op_repeats
    assert sum(n for _, n in reps) == len(a.ops)
    assert len(reps) < len(a.ops) / 4  # the blocks repeat
    for op, n in reps:
        like = [o for o in a.ops if o.kind == op.kind and o.shape == op.shape and o.flops_fwd == op.flops_fwd
                and o.bytes_bwd == op.bytes_bwd and o.attention_core == op.attention_core and o.wait == op.wait
                and o.per_op_saved == op.per_op_saved
                and (o.layer is None) == (op.layer is None)
                and (o.name if o.layer is None else o.name.split(".", 1)[1])
                == (op.name if op.layer is None else op.name.split(".", 1)[1])]
        assert len(like) == n, op.name


def test_sequence_parallel_splits_every_saved_layer_tensor_over_tp():
    """Korthikanti et al. 2022 (arXiv 2205.05198) Table 2: with tensor and sequence parallelism a layer's
    activations are the unsplit figure over t (sbh(34 + 5as/h) / t); without SP the norms' and residual
    stream's tensors stay whole on every rank. ddplan: saved layer bytes at tp 8 + SP = tp 1 / 8 exactly, and
    more than that without SP; the replicated ops' work is split too (elementwise FLOPs / 8)."""
    from ddplan.anatomy import build_anatomy, for_tp
    from ddplan.registry import load_model

    spec = load_model("gpt3-22b")
    base = build_anatomy(spec, batch=1, attention="unfused_math", windows="mask")
    sp = for_tp(base, 8, sequence_parallel=True)
    plain = for_tp(base, 8)
    assert sp.saved_split[0] == pytest.approx(base.saved_split[0] / 8, rel=1e-12)
    a, s_, h = spec.architecture, spec.recipe.seq_len, spec.architecture.d_model
    ratio = (10 + 24 / 8 + 5 * a.num_heads * s_ / (h * 8)) / ((34 + 5 * a.num_heads * s_ / h) / 8)  # Table 2
    assert plain.saved_split[0] / sp.saved_split[0] == pytest.approx(ratio, rel=0.001)
    elementwise = [op for op in base.ops if op.layer is not None and op.kind in ("elementwise", "reduction")]
    assert elementwise
    by_name = {op.name: op for op in sp.ops}
    for op in elementwise:
        assert by_name[op.name].flops_fwd == pytest.approx(op.flops_fwd / 8)


@pytest.mark.parametrize("tp, sp, recompute, per_layer", [
    (1, False, "none", lambda s, b, h, a, t: s * b * h * (34 + 5 * a * s / h)),
    (8, False, "none", lambda s, b, h, a, t: s * b * h * (10 + 24 / t + 5 * a * s / (h * t))),
    (8, True, "none", lambda s, b, h, a, t: s * b * h / t * (34 + 5 * a * s / h)),
    (8, False, "selective", lambda s, b, h, a, t: s * b * h * (10 + 24 / t)),
    (8, True, "selective", lambda s, b, h, a, t: s * b * h * 34 / t),
    (8, True, "full", lambda s, b, h, a, t: 2 * s * b * h / t),
    (8, False, "full", lambda s, b, h, a, t: 2 * s * b * h),
])
@pytest.mark.parametrize("model", ["gpt3-22b", "gpt3-175b", "gpt3-530b", "gpt3-1t"])
def test_korthikanti_table2_activations_per_layer(model, tp, sp, recompute, per_layer):
    """Korthikanti et al. 2022 (arXiv 2205.05198) Table 2, activation bytes per layer of its Table 3 models (GPT-3
    22B, 175B, 530B, 1T; s 2048, 16-bit; 22B: h 6144, a 64) with dropout 0.1 on the hidden states and the attention probabilities, unfused
    attention: ddplan's saved tensors of the layers / L. What Table 2 leaves out and ddplan keeps: each norm's
    fp32 statistics (4 bytes a row, 2 norms, LayerNorm mean and rstd) and the causal mask (s^2 bool, one for
    all layers, kept under selective/none), so the match is within 0.4%."""
    from dataclasses import replace as dc_replace

    from ddplan.anatomy import build_anatomy, for_tp
    from ddplan.registry import load_model

    spec = load_model(model)
    a = spec.architecture
    assert (a.dropout.hidden, a.dropout.attention) == (0.1, 0.1)
    s, b, h, heads = spec.recipe.seq_len, 1, a.d_model, a.num_heads
    an = dc_replace(for_tp(build_anatomy(spec, batch=b, attention="unfused_math", windows="mask"), tp, sp),
                    recompute=recompute)
    got = an.saved_split[0] / a.num_layers
    assert got == pytest.approx(per_layer(s, b, h, heads, tp), rel=0.004)


@pytest.mark.parametrize(("tp", "sp"), [(1, False), (8, False), (8, True)])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_the_embeddings_dropout_mask_is_kept_on_the_first_stage(tp, sp, recompute):
    """Korthikanti et al. 2022 (arXiv 2205.05198) sec. 4.3: the embeddings need no activation, "but the dropout
    following the embeddings does": sbh one-byte mask per micro-batch, sbh / t with sequence parallelism, under
    every recompute policy. GPT-3 22B (s 2048, h 6144, dropout 0.1), b 1: 12,582,912 bytes, / 8 = 1,572,864 with
    sp; ddplan also keeps the token and position indices for the lookups' backward (s x 8 bytes each)."""
    from ddplan.anatomy import build_anatomy, for_tp, with_recompute
    from ddplan.registry import load_model

    spec = load_model("gpt3-22b")
    an = with_recompute(for_tp(build_anatomy(spec, batch=1, attention="unfused_math", windows="mask"), tp, sp),
                        recompute)
    mask = 2048 * 6144 / (tp if sp else 1)
    assert an.outside_split[0] == mask + 2 * 2048 * 8
    assert an.saved_tensors()["emb.dropout.mask"].bytes == mask


def test_dropout_masks_are_kept_under_compile_and_dropped_by_full_recompute():
    """torch.compile's min-cut partitioner never recomputes random ops, so the hidden dropout masks stay
    (one byte an element, sbh each, two a layer); full recompute keeps only each layer's input."""
    from dataclasses import replace as dc_replace

    from ddplan.anatomy import build_anatomy
    from ddplan.registry import load_model

    spec = load_model("gpt3-22b")
    s, h = spec.recipe.seq_len, spec.architecture.d_model
    compiled = build_anatomy(spec, batch=1, attention="flash_package", compiled=True)
    masks = {n: t.bytes for n, t in compiled.saved_tensors().items() if n.startswith("h0.") and n.endswith(".mask")}
    assert masks == {"h0.attn.dropout.mask": s * h, "h0.mlp.dropout.mask": s * h}
    full = dc_replace(compiled, recompute="full")
    assert not any(n.endswith(".mask") and n.startswith("h0.") for n in full.saved_tensors())


@pytest.mark.parametrize("compute", ["bf16", "fp16"])
@pytest.mark.parametrize("model", ["mixtral-moe", "qwen2-moe"])
def test_moe_saved_bytes_in_16_bits(model, compute):
    """A mixture-of-experts block in 16-bit compute over fp32 master weights (the router's softmax in fp32, the
    routing weights cast to the compute dtype, each expert GEMM saving its cast weight): what the anatomy
    misses against torch 2.13 on CPU is what it misses on the dense twin (the same model with dense MLPs),
    to 1% of the total. That residual is outside the MoE layer: torch's CPU rms_norm keeps fp32 copies of
    16-bit inputs (about 10% here; see docs/reference.md's known limits)."""
    torch = pytest.importorskip("torch")
    from ddplan.calibrate.reference import measure

    def residual(spec) -> tuple[float, int]:
        torch.manual_seed(0)
        m = measure(spec, batch=BATCH, seq_len=spec.recipe.seq_len, attention="sdpa-math", recompute="none",
                    dtype_policy="spec")
        an = build_anatomy(spec, batch=BATCH, attention="sdpa_math", windows="mask")
        assert an.matmul_flops() == pytest.approx(m["flops_fwd_bwd"], rel=FLOPS_TOLERANCE)
        return m["saved_bytes"] - an.saved_bytes(), m["saved_bytes"]

    moe, total = residual(TINY[model](compute=compute))
    dense, _ = residual(TINY[model](compute=compute, moe=None))
    print(f"{model} {compute}: measured {total:,}; anatomy short by {moe:,.0f} B, on the dense twin by {dense:,.0f} B")
    assert moe == pytest.approx(dense, abs=SAVED_TOLERANCE * total)


def _saved_split_by_definition(an):
    """saved_split as first written: the kept tensors, each owned by the last op that saves its name."""
    saved = an.saved_tensors()
    owner = {s.name: op for op in an.ops for s in op.saves if s.name in saved}
    layers = sum(s.bytes for n, s in saved.items() if owner[n].layer is not None)
    return layers, sum(s.bytes for s in saved.values()) - layers


@pytest.mark.parametrize("model", ["d24", "llama-3-8b", "mixtral-8x7b"])
@pytest.mark.parametrize("compiled", [False, True])
def test_saved_split_and_with_recompute_match_the_definition_to_the_bit(model, compiled):
    """Anatomy.saved_split (one pass over _save_rows) equals the definition above exactly, for every policy, on a
    fresh anatomy and on with_recompute's (which keeps the share's op caches); so do the other cached figures."""
    from dataclasses import replace

    from ddplan.anatomy import with_recompute

    spec = load_model(model)
    for kind in ("flash_package", "sdpa_math"):
        share = for_tp(build_anatomy(spec, batch=1, seq_len=1024, attention=kind, compiled=compiled), 2)
        _ = share.saved_split, share.op_repeats, share.transient_bytes(), share.outside_split  # the share's caches
        for policy in RECOMPUTE_POLICIES:
            fresh, kept = replace(share, recompute=policy), with_recompute(share, policy)
            assert kept.saved_split == fresh.saved_split == _saved_split_by_definition(fresh)
            assert kept.saved_split == fresh._saved_split_walk()  # one keep table: counted per distinct block
            assert kept.outside_split == fresh.outside_split
            assert kept.op_repeats == fresh.op_repeats
            assert kept.transient_bytes() == fresh.transient_bytes()
            assert kept.recompute_flops() == fresh.recompute_flops()


@pytest.mark.parametrize("model", ["d24", "llama-3-8b", "mixtral-8x7b", "qwen3-30b-a3b"])
@pytest.mark.parametrize("policy", ["selective:layernorm", "selective:core_attn+mlp", "selective:layernorm+moe",
                                    "selective:moe_act", "selective:core_attn+layernorm+mlp+moe+shared_experts"])
def test_per_module_saved_split_sums_per_block_to_the_bit(model, policy):
    """Under Megatron's per-module recompute, saved_split sums each distinct block once (_saved_split_exact with
    each tensor's keep flag) and equals the walk over every op's tensors and the definition, exactly; at tp 3
    (sizes not whole bytes) it takes the walk."""
    from dataclasses import replace

    from ddplan.anatomy import _AS_FLAGGED

    base = build_anatomy(load_model(model), batch=2, seq_len=1024, compiled=True)
    for tp, exact in ((1, True), (2, True), (3, False)):
        an = replace(for_tp(base, tp), recompute=policy)
        assert (an._saved_split_exact(_AS_FLAGGED, an._save_kept) is not None) == exact
        assert an.saved_split == an._saved_split_walk() == _saved_split_by_definition(an)
    kept, none = replace(base, recompute=policy).saved_split[0], replace(base, recompute="none").saved_split[0]
    dense_alone = policy == "selective:moe_act" and load_model(model).architecture.moe is None  # no experts
    assert kept == none if dense_alone else kept < none


# --------------------------------------------------------------------------------------------
# Blocks built once per kind (Anatomy.blocks, layer_blocks) against the definition: every layer built


def _ops_layer_by_layer(spec, batch, seq_len=None, attention="flash_package", windows="native", window_pattern=None,
                        tp=1, ep=1, expert_rows=1):
    """The ops as build_anatomy first built them: every layer's block built on its own (_block per layer), then
    each op's tp share."""
    from ddplan.anatomy import _Builder, _block, _embeddings, _head, _tp_share

    if window_pattern is not None:
        spec = spec.model_copy(update={"architecture": spec.architecture.model_copy(
            update={"window_pattern": window_pattern})})
    s = seq_len or spec.recipe.seq_len
    bld = _Builder(spec, batch, s, ep, expert_rows)
    _embeddings(bld)
    for i, window in enumerate(spec.architecture.windows(s)):
        _block(bld, i, window, attention, windows)
    _head(bld)
    return tuple(bld.ops) if tp == 1 else tuple(_tp_share(op, tp) for op in bld.ops)


def _tp_ops(ops, tp, sp):
    """for_tp as first written: each op's share."""
    from ddplan.anatomy import SP_OUTSIDE_LAYERS, _sp_share, _tp_share

    return tuple(_sp_share(op, tp) if sp and (op.layer is not None or op.name in SP_OUTSIDE_LAYERS)
                 else _tp_share(op, tp)
                 for op in ops)


def _cp_ops(full_ops, short_ops, cp, short_seq):
    """for_cp as first written: the short sequence's ops, its attention core the full sequence's over cp."""
    from ddplan.anatomy import _cp_core

    core = {op.name: op for op in full_ops if op.attention_core}
    return tuple(_cp_core(core[op.name], cp, short_seq) if op.attention_core else op for op in short_ops)


def _op_repeats_by_definition(ops):
    """Anatomy.op_repeats as first written: one walk over every op."""
    groups: dict[tuple, list] = {}
    for op in ops:
        name = op.name if op.layer is None else op.name.removeprefix(f"h{op.layer}.")
        key = (name, op.layer is None, op.kind, op.shape, op.flops_fwd, op.flops_bwd, op.bytes_fwd, op.bytes_bwd,
               op.recompute_flops_bwd, op.attention_core, op.recompute_skip, op.tp_done, op.wait, op.calls,
               op.per_op_saved)
        if key in groups:
            groups[key][1] += 1
        else:
            groups[key] = [op, 1]
    return tuple((op, n) for op, n in groups.values())


def _assert_as_walked(an, ops):
    """An anatomy built block by block against its ops built layer by layer: the same ops, and every figure read
    off them the same float as the walk over every op gives (FLOPs, saved tensors, repeats, under every policy)."""
    from dataclasses import replace

    from ddplan.anatomy import recomputed_under

    assert an.ops == ops
    assert an.flops_fwd() == sum(op.flops_fwd for op in ops)
    assert an.flops_bwd() == sum(op.flops_bwd for op in ops)
    assert an.transient_bytes() == max(op.transient_bytes for op in ops)
    assert an.op_repeats == _op_repeats_by_definition(ops)
    for policy in RECOMPUTE_POLICIES:
        again = [op for op in ops if recomputed_under(op, policy)]
        matmul = 0.0
        for op in ops:
            if op.kind in ("gemm", "attention"):
                matmul += op.flops_fwd + op.flops_bwd + (op.flops_fwd if recomputed_under(op, policy) else 0.0)
        for compiled in (False, True):
            one = replace(an, recompute=policy, compiled=compiled)
            assert one.recompute_flops() == (sum(op.recompute_flops_bwd for op in ops)
                                             + sum(op.flops_fwd for op in again))
            assert one.matmul_flops() == matmul
            assert one.saved_split == _saved_split_by_definition(one)  # saved_tensors and the owners walk one.ops


def _variant(name, **arch):
    spec = load_model(name)
    return spec.model_copy(update={"architecture": spec.architecture.model_copy(update=arch)})


def _dense_first(name, dense_layers):
    spec = load_model(name)
    moe = spec.architecture.moe.model_copy(update={"dense_layers": dense_layers})
    return _variant(name, moe=moe, mlp_hidden_dim=2 * spec.architecture.d_model)


@pytest.mark.parametrize("spec, kw", [
    (load_model("d24"), {}),  # nanochat: S/L windows, value embeddings on alternate layers, x0, backout
    (load_model("d24"), {"window_pattern": "SSSL", "attention": "fused_sdpa", "windows": "mask", "tp": 2}),
    (load_model("d24"), {"attention": "sdpa_math", "windows": "mask", "seq_len": 512}),
    (load_model("llama-3-70b"), {"tp": 8}),
    (load_model("llama-3-70b"), {"attention": "unfused_math", "windows": "mask", "seq_len": 1024}),
    (load_model("gpt3-175b"), {"attention": "unfused_math", "windows": "mask", "tp": 8}),  # vocab 50257 / 8
    (load_model("mixtral-8x7b"), {"ep": 4, "seq_len": 2048}),
    (load_model("mixtral-8x7b"), {"ep": 2, "expert_rows": 2, "seq_len": 2048}),
    (_dense_first("qwen3-30b-a3b", 3), {"ep": 8, "seq_len": 1024}),  # dense layers first, then MoE
])
def test_blocks_built_once_per_kind_are_the_layers_built_one_by_one(spec, kw):
    """build_anatomy builds each kind of block once (_block_kind) and copies it to the other layers of its kind;
    the result is the layer-by-layer build's ops exactly, and its sums are the walk's to the bit."""
    batch = 2
    an = build_anatomy(spec, batch=batch, **kw)
    assert len(an.blocks) < len(an.layer_blocks) == spec.architecture.num_layers
    _assert_as_walked(an, _ops_layer_by_layer(spec, batch, **kw))


@pytest.mark.parametrize("model, tp, sp", [("llama-3-70b", 8, False), ("llama-3-70b", 8, True), ("d24", 4, True),
                                           ("gpt3-22b", 8, True), ("gpt3-175b", 8, False)])
def test_for_tp_shares_each_block_once_as_every_op_was(model, tp, sp):
    spec = load_model(model)
    kind = {"attention": "unfused_math", "windows": "mask"} if model.startswith("gpt3") else {}
    base = build_anatomy(spec, batch=1, seq_len=1024, **kind)
    _ = base.ops, base.saved_split, base.op_repeats  # the base's caches are not the share's
    _assert_as_walked(for_tp(base, tp, sp), _tp_ops(_ops_layer_by_layer(spec, 1, seq_len=1024, **kind), tp, sp))


@pytest.mark.parametrize("model, cp, tp, sp, pattern", [("llama-3-8b", 2, 1, False, None),
                                                         ("llama-3-8b", 4, 2, True, None),
                                                         ("d24", 2, 2, False, "SSSL"),  # S at s/2 is L: kinds merge
                                                         ("d24", 4, 1, False, "SL")])
def test_for_cp_shares_each_pair_of_blocks_once_as_every_op_was(model, cp, tp, sp, pattern):
    from ddplan.anatomy import for_cp

    spec, seq = load_model(model), 8192 if model == "llama-3-8b" else 2048
    full = for_tp(build_anatomy(spec, batch=1, seq_len=seq, window_pattern=pattern), tp, sp)
    short = for_tp(build_anatomy(spec, batch=1, seq_len=seq // cp, window_pattern=pattern), tp, sp)
    share = for_cp(full, short, cp)
    old = _cp_ops(_tp_ops(_ops_layer_by_layer(spec, 1, seq, window_pattern=pattern), tp, sp),
                  _tp_ops(_ops_layer_by_layer(spec, 1, seq // cp, window_pattern=pattern), tp, sp), cp, seq // cp)
    _assert_as_walked(share, old)


def test_every_shipped_model_builds_its_blocks_as_layer_by_layer():
    """_block_kind names everything a block's ops depend on besides its index, for every shipped model."""
    from pathlib import Path

    for path in sorted((Path(__file__).resolve().parent.parent / "models").glob("*.yaml")):
        spec = load_model(path.stem)
        an = build_anatomy(spec, batch=1, seq_len=min(1024, spec.recipe.seq_len))
        assert an.ops == _ops_layer_by_layer(spec, 1, seq_len=min(1024, spec.recipe.seq_len)), path.stem


@pytest.mark.parametrize("model, batch, tp, policies", [
    ("d24", 2, 3, RECOMPUTE_POLICIES),  # sizes over tp 3 are not whole bytes
    ("llama-3-8b", 2**18, 1, ("none", "selective")),  # 1.5 x 2^53 bytes saved (full recompute: 0.19 x)
])
def test_saved_split_walks_every_tensor_where_whole_bytes_would_not_be_exact(model, batch, tp, policies):
    """saved_split sums whole bytes per kind of block only where that is exact (every size whole, the total
    under 2^53); elsewhere it walks every saved tensor in order, as first written."""
    from dataclasses import replace

    from ddplan.anatomy import _keep_table

    base = build_anatomy(load_model(model), batch=batch)
    for policy in RECOMPUTE_POLICIES:
        an = replace(for_tp(base, tp), recompute=policy)
        assert (an._saved_split_exact(_keep_table(policy, False)) is None) == (policy in policies)
        assert an.saved_split == _saved_split_by_definition(an)


def test_per_op_recompute_keeps_what_torchtitan_selective_ac_keeps_by_hand():
    """torchtitan's per-op SelectiveAC (anatomy.PER_OP_SOURCE) on a Llama 3 8B block, by hand. Forward's matmuls
    in order: wq 1, wk 2, wv 3, wo 4, w1 (gate) 5, w3 (up) 6, w2 (down) 7; the odd ones' outputs are kept, with
    the attention kernel's output and log-sum-exp and the block's input (the checkpoint's). Per layer, bf16
    (e = 2), t = 2048 tokens, d = 4096, kv = 8 x 128 = 1024, f = 14336, 32 heads:
        t e (d [input] + d [wq] + kv [wv] + d [attention out] + f [w1] + d [w2]) + 32 t 4 [lse]
        = 2048 x 2 x (4 x 4096 + 1024 + 14336) + 32 x 2048 x 4 = 130,285,568 bytes.
    Backward re-runs wk, wo and w3 (and the norms, rope and elementwise ops): the recomputed matmul FLOPs per
    layer are 2 t d (kv + d + f) = 2 x 2048 x 4096 x 19456 = 326,417,514,496."""
    spec = load_model("llama-3-8b")
    a = spec.architecture
    assert (a.d_model, a.num_kv_heads * a.head_dim, a.mlp_hidden_dim, a.num_heads) == (4096, 1024, 14336, 32)
    per_op = build_anatomy(spec, batch=1, seq_len=2048, recompute="per-op")
    assert per_op.saved_split[0] / a.num_layers == 130_285_568
    again = sum(op.flops_fwd for op in per_op.ops if op.kind == "gemm" and per_op.recomputes(op))
    assert again / a.num_layers == 326_417_514_496
    kept = [op.name.split(".", 1)[1] for op in per_op.ops if op.layer == 0 and op.per_op_saved]
    assert kept == ["attn.c_q", "attn.c_v", "attn.core", "mlp.gate", "mlp.c_proj"]
    # outside the blocks nothing changes: the embeddings' and head's saves are those without recompute
    none = build_anatomy(spec, batch=1, seq_len=2048)
    assert per_op.saved_split[1] == none.saved_split[1]


def test_recompute_brings_back_one_block_as_korthikanti_counts_it():
    """backward_transient_bytes on GPT-3 22B (Korthikanti et al., arXiv 2205.05198, Table 3: 48 layers, h 6144,
    a 64), b 1, s 2048, fp16, Megatron's unfused attention with dropout. A layer saves 34 s b h + 5 a s^2 b
    bytes (their eq. 1) plus two LayerNorms' fp32 mean and 1/std (2 x 2 x 4 s b); selective recompute brings back the
    attention core's 5 a s^2 b (sec. 4.2: the softmax's output, the dropout mask, the dropped probabilities)
    and full recompute all but the layer's input (2 s b h). Both exceed the loss's gradient working set (fp32
    logits and their gradient over the 51,200-token vocabulary, 2 x 4 s b v), all that stays without recompute."""
    spec = load_model("gpt3-22b")
    none = build_anatomy(spec, batch=1, seq_len=2048, attention="unfused_math")
    s, b, h, a, v = 2048, 1, 6144, 64, 51200
    layer = 34 * s * b * h + 5 * a * s * s * b + 2 * 2 * 4 * s * b
    assert layer == 1_770_029_056
    loss = max(op.transient_bytes for op in none.post)
    assert none.backward_transient_bytes() == none.transient_bytes() == loss == 2 * 4 * s * b * v == 838_860_800
    assert with_recompute(none, "selective").backward_transient_bytes() == 5 * a * s * s * b == 1_342_177_280
    assert with_recompute(none, "full").backward_transient_bytes() == layer - 2 * s * b * h == 1_744_863_232
    # per-op keeps the input, the odd matmuls' outputs and the attention products: between the two here
    per_op = with_recompute(none, "per-op").backward_transient_bytes()
    assert 5 * a * s * s * b < per_op < layer - 2 * s * b * h


@pytest.mark.parametrize("recompute", RECOMPUTE_POLICIES)
def test_backward_transient_is_the_gradients_or_the_largest_live_recompute(recompute):
    """Brought-back tensors live from their region's recompute until their first saver's backward: never more
    than all of a block's not-kept tensors at once on top of the gradients, never less than the gradients."""
    spec = load_model("llama-3-8b")
    none = build_anatomy(spec, batch=1, seq_len=2048, attention="sdpa_math")
    an = with_recompute(none, recompute)
    layers = spec.architecture.num_layers
    brought = (none.saved_split[0] - an.saved_split[0]) / layers + sum(
        t.bytes for n, t in an.saved_tensors().items() if t.tag == "op_output" and n.startswith("h0."))
    assert an.transient_bytes() <= an.backward_transient_bytes() <= an.transient_bytes() + brought


def test_megatron_layernorm_and_moe_act_recompute_by_hand():
    """Megatron's layernorm and moe_act recompute discard a module's output once used (CheckpointWithoutOutput,
    transformer_layer.py@d98e8a6 L684-718, moe/experts.py L269-273), which torch.utils.checkpoint does not state,
    so by hand on the Mixtral tiny block (d 128, 4 SwiGLU experts of 96, top 2, 2 layers) at 2 x 128 tokens in
    fp32, t = 256 tokens, rows = t x 2 = 512:
    - layernorm drops, per layer and norm, its output xn (t d 4 = 131,072 B), the normed x its weight's gradient
      reads (131,072 B) and the rms statistic (t 4 = 1,024 B): 2 layers x 2 norms x 263,168 = 1,052,672 B; it re-runs
      4 FLOPs an element: 4 x t d x 2 x 2 = 524,288 FLOPs;
    - moe_act drops silu(g) and the product fed to the down projection (rows f 4 = 196,608 B each): 786,432 B;
      it re-runs 5 FLOPs an element of rows x f: 5 x 512 x 96 x 2 = 491,520 FLOPs; g and u (its inputs) stay."""
    base = _anatomy("mixtral-moe", "sdpa-fused", "none")
    for policy, dropped, again in (("selective:layernorm", 1_052_672, 524_288),
                                   ("selective:moe_act", 786_432, 491_520),
                                   ("selective:layernorm+moe_act", 1_052_672 + 786_432, 524_288 + 491_520)):
        an = _anatomy("mixtral-moe", "sdpa-fused", policy)
        assert base.saved_bytes() - an.saved_bytes() == dropped, policy
        assert an.recompute_flops() - base.recompute_flops() == again, policy
    kept = _anatomy("mixtral-moe", "sdpa-fused", "selective:moe_act").saved_tensors()
    assert {"h0.experts.g", "h0.experts.u", "h0.moe.permuted"} <= set(kept) and "h0.experts.act_out" not in kept
    # the MoE checkpoint keeps its input (the pre-MLP norm's output) unless the norm is re-run too
    assert "h0.xn2" in _anatomy("mixtral-moe", "sdpa-fused", "selective:moe").saved_tensors()
    assert "h0.xn2" not in _anatomy("mixtral-moe", "sdpa-fused", "selective:layernorm+moe").saved_tensors()


def test_layernorm_recompute_under_transformer_engine_re_runs_only_a_norm_of_its_own_by_hand():
    """Under Transformer Engine's layer spec a block's input norm is fused into the QKV Linear (input_layernorm is an
    IdentityOp, which Megatron's layernorm recompute skips) and, in a dense model, the pre-MLP norm into fc1 (found
    in review, 2026-12-05; gpt_layer_specs.py@d98e8a64 L319-336, transformer_layer.py L470-530). So on the Llama
    tiny block (dense) selective:layernorm saves what none does; on the Mixtral tiny block, whose pre-MLP norm is a
    TENorm of its own, it drops per layer that norm's output xn2 (t d 4 = 131,072 B at t = 256, d = 128) and its rms
    statistic (t 4 = 1,024 B): 2 x 132,096 = 264,192 B, re-running 4 t d = 131,072 FLOPs a layer; xn1 stays. In the
    dense model the mlp module takes the fused norm with it: xn2 and its statistic go (the reference model states
    that checkpoint: MODULE_CASES llama-te selective:mlp)."""
    dense = {rc: _anatomy("llama-te", "sdpa-fused", rc) for rc in ("none", "selective:layernorm", "selective:mlp")}
    assert dense["selective:layernorm"].saved_bytes() == dense["none"].saved_bytes()
    assert dense["selective:layernorm"].recompute_flops() == dense["none"].recompute_flops()
    assert not {"h0.xn2", "h0.norm2.stats"} & set(dense["selective:mlp"].saved_tensors())
    none, norm = (_anatomy("mixtral-te", "sdpa-fused", rc) for rc in ("none", "selective:layernorm"))
    assert none.saved_bytes() - norm.saved_bytes() == 2 * (131_072 + 1_024)
    assert norm.recompute_flops() - none.recompute_flops() == 2 * 4 * 256 * 128
    assert "h0.xn1" in norm.saved_tensors() and "h0.xn2" not in norm.saved_tensors()
    # a MoE model's dense layers take the dense spec (found in review): Qwen2-MoE tiny's layer 0 fuses its pre-MLP
    # norm into fc1 (mlp recompute takes it), its MoE layer 1 keeps a TENorm (layernorm recompute takes it)
    qwen = run_variant(qwen2_moe_tiny(), fusions="transformer-engine")
    dense_mlp = build_anatomy(qwen, batch=BATCH, attention="fused_sdpa", windows="mask", recompute="selective:mlp")
    moe_norm = build_anatomy(qwen, batch=BATCH, attention="fused_sdpa", windows="mask", recompute="selective:layernorm")
    assert "h0.xn2" not in dense_mlp.saved_tensors() and "h1.xn2" in dense_mlp.saved_tensors()
    assert "h0.xn2" in moe_norm.saved_tensors() and "h1.xn2" not in moe_norm.saved_tensors()


def test_a_recompute_policy_has_one_spelling():
    """selective:MODULE+... in Megatron's names, in RECOMPUTE_MODULES' order; selective:core_attn is selective."""
    from ddplan.runfields import recompute_policy

    assert recompute_policy("selective:moe+layernorm") == "selective:layernorm+moe"
    assert recompute_policy("selective:core_attn") == "selective" and recompute_policy("full") == "full"
    for bad in ("selective:", "selective:moe+moe", "selective:attn", "partial", "full:moe"):
        with pytest.raises(ValueError, match="allowed: none, selective, per-op, full"):
            recompute_policy(bad)


def test_fp8_gemms_keep_their_inputs_as_fp8_copies_by_hand():
    """Transformer Engine (delayed scaling) and nanochat's fp8 save each fp8 GEMM's input as the fp8 copy they cast,
    one byte an element (ddplan.fp8.with_fp8_saves; TE module/linear.py@d0067d0 L597-621); torchao's tensorwise
    Float8Linear keeps the 16-bit input. GPT-2 tiny (d 128, 2 heads of 64, MLP 512, 2 layers) at 2 x 128 tokens in
    fp32 (4 bytes an element), t = 256, every block GEMM eligible (dims multiples of 16, min >= 128), the LM head
    not: per layer the QKV input xn1 (t d: 131,072 B) becomes a 32,768 B copy; the output projection's input, which
    the attention core keeps too, gains a 32,768 B copy; the MLP input xn2 131,072 -> 32,768 B; the down
    projection's input, GELU's output (t 512: 524,288 B), 131,072 B: -557,056 B a layer, -1,114,112 B in all."""
    from ddplan.fp8 import with_fp8_saves

    an = build_anatomy(gpt2_tiny(), batch=BATCH, attention="fused_sdpa", windows="mask")
    fp8 = with_fp8_saves(an, "delayed", lm_head=False, elem_bytes=4)
    assert an.saved_bytes() - fp8.saved_bytes() == 1_114_112
    kept = fp8.saved_tensors()
    assert {"h0.attn_out", "h0.attn_out.fp8", "h0.xn1.fp8"} <= set(kept) and "h0.xn1" not in kept
    assert with_fp8_saves(an, "tensorwise", lm_head=False, elem_bytes=4) is an
    assert with_fp8_saves(an, "nanochat", lm_head=False, elem_bytes=4).saved_bytes() == fp8.saved_bytes()
    # current scaling and MXFP8 as Megatron-Core runs them: the output projection keeps the attention core's output
    # itself (attention.py@d98e8a64 L429-444, save_original_input), so its 32,768 B copy a layer is not made
    for recipe in ("current", "mxfp8"):
        cs = with_fp8_saves(an, recipe, lm_head=False, elem_bytes=4)
        assert cs.saved_bytes() == fp8.saved_bytes() - 2 * 32_768
        assert "h0.attn_out" in cs.saved_tensors() and "h0.attn_out.fp8" not in cs.saved_tensors()
    # a recompute policy drops the copy with the tensor it copies: full recompute keeps each block's input only
    full = with_fp8_saves(with_recompute(an, "full"), "delayed", lm_head=False, elem_bytes=4)
    assert full.saved_bytes() == with_recompute(an, "full").saved_bytes()
    # per-module recompute drops a copy with the GEMM that keeps it, not with the module that made its 16-bit
    # original (found in review): layernorm recompute drops xn1 and xn2 but not their copies; mlp drops xn2's
    for policy, gone, kept in (("selective:layernorm", {"h0.xn1", "h0.xn2"}, {"h0.xn1.fp8", "h0.xn2.fp8"}),
                               ("selective:mlp", {"h0.xn2.fp8", "h0.mlp.act_out.fp8"}, {"h0.xn1.fp8"})):
        names = set(with_fp8_saves(with_recompute(an, policy), "delayed", False, 4).saved_tensors())
        assert not gone & names and kept <= names, policy


# --------------------------------------------------------------------------------------------
# Megatron's block method: full:N re-runs the first N layers of each model chunk whole


def test_full_n_re_runs_the_first_n_layers_of_each_model_chunk_by_hand():
    """Llama 3 70B, 80 layers. At pp 4 x vp 5 (20 chunks of 4 contiguous layers) full:1 re-runs layers 0, 4, 8, ...:
    20 of 80, a share of 0.25; full:4 (a whole chunk) is full recompute. On one stage (chunks 1) full:3 re-runs
    layers 0-2 (3 / 80). The walks and sums agree: saved bytes and recomputed FLOPs a quarter of the way from none
    to full where every layer is alike."""
    from dataclasses import replace

    from ddplan.anatomy import with_recompute

    base = build_anatomy(load_model("llama-3-70b"), batch=1, seq_len=1024)
    chunked = with_recompute(base, "full:1", chunks=20)
    assert [layer for layer in range(80) if chunked.layer_again(layer)] == list(range(0, 80, 4))
    assert chunked.full_share == 0.25 and sum(chunked.layers_again) == 20
    one_stage = with_recompute(base, "full:3")
    assert [layer for layer in range(80) if one_stage.layer_again(layer)] == [0, 1, 2]
    assert one_stage.full_share == 3 / 80
    none, full = replace(base, recompute="none"), replace(base, recompute="full")
    for got, lo, hi in ((chunked.saved_split[0], none.saved_split[0], full.saved_split[0]),
                        (chunked.recompute_flops(), none.recompute_flops(), full.recompute_flops()),
                        (chunked.matmul_flops(), none.matmul_flops(), full.matmul_flops())):
        assert got == pytest.approx(lo + 0.25 * (hi - lo), rel=1e-12)
    # torchtitan's every:K counts within a stage: at pp 4 (chunks of 20) every:3 re-runs the 3rd, 6th, ... 18th
    # layer of each, 6 of 20
    third = with_recompute(base, "every:3", chunks=4)
    assert [layer for layer in range(20) if third.layer_again(layer)] == [2, 5, 8, 11, 14, 17]
    assert third.full_share == 24 / 80 and third.layers_again == (24,)
    whole = with_recompute(base, "full:4", chunks=20)  # N = the chunk's layers: every layer
    assert whole.full_share == 1.0
    assert whole.saved_split == pytest.approx(full.saved_split, rel=1e-12)
    assert whole.recompute_flops() == pytest.approx(full.recompute_flops(), rel=1e-12)
    # every:8 in chunks of 4 layers re-runs none: it holds and costs what no recompute does
    idle = with_recompute(base, "every:8", chunks=20)
    assert idle.full_share == 0 and idle.saved_split == pytest.approx(none.saved_split, rel=1e-12)
    assert idle.backward_transient_bytes() == none.backward_transient_bytes() < full.backward_transient_bytes()


@pytest.mark.parametrize("model", ["d24", "llama-3-8b", "mixtral-8x7b", "qwen3-30b-a3b"])
@pytest.mark.parametrize("policy, chunks", [("full:1", 1), ("full:3", 4), ("every:2", 1), ("every:3", 4)])
def test_layer_policies_sum_per_kind_of_block_as_the_walk_does(model, policy, chunks):
    """A layer policy's sums per kind of block (saved bytes to the bit by _saved_split_exact with each layer's keep
    table; recomputed and matmul FLOPs, weight casts) equal the walk over every layer's ops: at tp 1 and 2, and at
    tp 3 (sizes not whole bytes) the saved bytes take the walk."""
    from dataclasses import replace

    from ddplan.anatomy import with_recompute

    base = build_anatomy(load_model(model), batch=2, seq_len=1024, compiled=True)
    for tp in (1, 2, 3):
        an = with_recompute(for_tp(base, tp), policy, chunks)
        assert an.saved_split == an._saved_split_walk() == _saved_split_by_definition(an)
        walked = sum(op.flops_fwd for op in an.ops if an.recomputes(op)) + sum(op.recompute_flops_bwd for op in an.ops)
        assert an.recompute_flops() == pytest.approx(walked, rel=1e-12)
        matmul = sum(op.flops_fwd + op.flops_bwd + (op.flops_fwd if an.recomputes(op) else 0.0) for op in an.ops
                     if op.kind in ("gemm", "attention"))
        assert an.matmul_flops() == pytest.approx(matmul, rel=1e-12)
        keep = an._save_kept
        casts = sum(s.bytes for op in an.ops if op.layer is not None for s in op.saves
                    if s.name.endswith(".weight_cast") and keep(op, s))
        assert an.weight_cast_split[0] == pytest.approx(casts, rel=1e-12)
    assert replace(base, recompute=policy).saved_split[0] < base.saved_split[0]


def test_full_n_counts_the_layers_of_uneven_pipeline_stages():
    """Where pp does not divide the layers the chunks are the pipeline's stages (ddplan.pipeline.stage_layers): 30
    layers over 4 stages are 7, 8, 8, 7, so full:1 re-runs layers 0, 7, 15 and 23 (4 of 30), not every 7th."""
    from ddplan.anatomy import with_recompute

    spec = load_model("llama-3-8b")
    spec = spec.model_copy(update={"architecture": spec.architecture.model_copy(update={"num_layers": 30})})
    an = with_recompute(build_anatomy(spec, batch=1, seq_len=512), "full:1", chunks=4)
    assert [layer for layer in range(30) if an.layer_again(layer)] == [0, 7, 15, 23]
    assert an.full_share == 4 / 30


# ---- fusions "decomposed": each torch op its own kernel (torchtitan before nn.RMSNorm)

def test_decomposed_kernels_bytes_by_hand():
    """Bytes per element, forward and backward, of torchtitan's float32 RMSNorm, complex RoPE and two-kernel SwiGLU
    run eagerly (ddplan.anatomy.decomposed_*_bytes), by hand in bf16 (e = 2, a cast to or from float32 6 bytes):
    RMSNorm forward 6 + 8 + 4 + 8 + 6 + 4 = 36, backward 12 + 6 + 24 + 4 + 28 + 12 + 6 = 92 (without its weight 32
    and 80); RoPE 6 + 8 + 6 = 20 each way; SwiGLU 4 + 6 = 10 and 6 + 6 + 6 = 18. In float32 the casts are no-ops:
    RMSNorm 28 and 92, RoPE 8."""
    assert decomposed_rmsnorm_bytes(2) == (36, 92) and decomposed_rmsnorm_bytes(2, learnable=False) == (32, 80)
    assert decomposed_rmsnorm_bytes(4) == (28, 92)
    assert decomposed_rope_bytes(2) == (20, 20) and decomposed_rope_bytes(4) == (8, 8)
    assert decomposed_swiglu_bytes(2) == (10, 18)
    with pytest.raises(ValueError, match="must be positive, got 0"):
        decomposed_rmsnorm_bytes(0)


def _aten_bytes(fn, inputs, grad):
    """Bytes every aten op reads and writes in fn's forward and in its backward (torch dispatch mode; a view moves
    none; a broadcast input counts its storage, not its expanded size). An in-place op is skipped too, though it
    moves bytes: none of the code measured here has one."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    def nbytes(t):
        return min(t.numel() * t.element_size(), t.untyped_storage().nbytes())

    class Log(TorchDispatchMode):
        total = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            ins = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
            outs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
            if outs and all(o.untyped_storage().data_ptr() in {a.untyped_storage().data_ptr() for a in ins}
                            for o in outs):
                return out
            self.total += sum(map(nbytes, ins)) + sum(map(nbytes, outs))
            return out

    with Log() as fwd:
        y = fn(*inputs)
    with Log() as bwd:
        y.backward(grad)
    return fwd.total, bwd.total


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_decomposed_kernels_bytes_are_what_torchs_ops_move(dtype):
    """The decomposed kernels' bytes are what torch's own aten ops read and write, forward and backward, in the code
    torchtitan ran (norms.py and model.py @989718967): each formula within the per-row, per-token and per-weight
    terms it leaves out (under 1% here: 4,096 rows of 1,024; the RoPE table once per token for 8 heads, 0.5 and 1.5
    bytes an element in bf16)."""
    torch = pytest.importorskip("torch")
    dt = getattr(torch, dtype)
    e = torch.tensor([], dtype=dt).element_size()
    rows, d = 4096, 1024
    weight = torch.nn.Parameter(torch.ones(d, dtype=dt))  # FSDP2's param_dtype: the weight in the compute dtype

    def rmsnorm(x):  # torchtitan RMSNorm.forward, models/norms.py@989718967
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).type_as(x) * weight

    def weightless(x):  # the same norm without its weight (learnable=False)
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).type_as(x)

    x = torch.randn(rows, d, dtype=dt, requires_grad=True)
    for fn, learnable in ((rmsnorm, True), (weightless, False)):
        fwd, bwd = _aten_bytes(fn, (x,), torch.randn(rows, d, dtype=dt))
        want = decomposed_rmsnorm_bytes(e, learnable)
        assert (fwd / x.numel(), bwd / x.numel()) == pytest.approx(want, rel=0.01), learnable

    s, h, hd = 512, 8, 128
    freqs = torch.polar(torch.ones(s, hd // 2), torch.randn(s, hd // 2)).view(1, s, 1, hd // 2)

    def rope(q):  # apply_rotary_emb, models/llama/model.py@989718967
        q_ = torch.view_as_complex(q.float().reshape(*q.shape[:-1], -1, 2))
        return torch.view_as_real(q_ * freqs).flatten(3).type_as(q)

    q = torch.randn(1, s, h, hd, dtype=dt, requires_grad=True)
    fwd, bwd = _aten_bytes(rope, (q,), torch.randn(1, s, h, hd, dtype=dt))
    table = 4 / h  # the complex table, read once a token for all heads (and its conjugate made in backward)
    assert fwd / q.numel() == pytest.approx(decomposed_rope_bytes(e)[0] + table, rel=0.01)
    assert bwd / q.numel() == pytest.approx(decomposed_rope_bytes(e)[1] + 3 * table, rel=0.01)

    g = torch.randn(rows, d, dtype=dt, requires_grad=True)
    u = torch.randn(rows, d, dtype=dt, requires_grad=True)
    fwd, bwd = _aten_bytes(lambda g, u: torch.nn.functional.silu(g) * u, (g, u), torch.randn(rows, d, dtype=dt))
    assert (fwd / g.numel(), bwd / g.numel()) == pytest.approx(decomposed_swiglu_bytes(e), rel=0.01)


def test_decomposed_block_moves_those_bytes_eager_and_what_eager_does_compiled():
    """A Llama block with fusions "decomposed": uncompiled, each norm, the rotary embedding and SwiGLU move the
    decomposed kernels' bytes (t x d x 36 forward for a norm in bf16; 4 for eager's one kernel) and the norm keeps
    x.float() where eager keeps x (2 more bytes an element, saved as pointwise); compiled, Inductor fuses the chain
    and the anatomy is eager's, op for op."""
    def bf16() -> ModelSpec:
        return _tiny("llama-3-8b", 128, compute="bf16", params="bf16", num_layers=2, d_model=128, num_heads=4,
                     num_kv_heads=2, head_dim=32, vocab_size=512, max_seq_len=128, mlp_hidden_dim=384)

    spec = run_variant(bf16(), fusions="decomposed")
    eager = build_anatomy(bf16(), batch=BATCH)
    mine = build_anatomy(spec, batch=BATCH)
    t, d, f = BATCH * 128, 128, 384
    q_kv = 4 * 32 + 2 * 32
    ops = {op.name: op for op in mine.ops}
    base = {op.name: op for op in eager.ops}
    assert (ops["h0.norm1"].bytes_fwd, ops["h0.norm1"].bytes_bwd) == (36 * t * d, 92 * t * d)
    assert (base["h0.norm1"].bytes_fwd, base["h0.norm1"].bytes_bwd) == (4 * t * d, 6 * t * d)
    assert (ops["h0.attn.rope"].bytes_fwd, ops["h0.attn.rope"].bytes_bwd) == (20 * t * q_kv, 20 * t * q_kv)
    assert (ops["h0.mlp.act"].bytes_fwd, ops["h0.mlp.act"].bytes_bwd) == (10 * t * f, 18 * t * f)
    extra = [s for s in ops["h0.norm1"].saves if s.name.endswith("x_fp32")]
    assert [(s.bytes, s.tag) for s in extra] == [(2 * t * d, "pointwise")]
    compiled = build_anatomy(spec, batch=BATCH, compiled=True)
    assert compiled.ops == build_anatomy(bf16(), batch=BATCH, compiled=True).ops
    # fused-norm (torchtitan on torch's fused RMSNorm): the norm as eager's one kernel, the rest op by op
    fused_norm = {op.name: op for op in build_anatomy(run_variant(bf16(), fusions="fused-norm"), batch=BATCH).ops}
    assert (fused_norm["h0.norm1"].bytes_fwd, fused_norm["h0.norm1"].bytes_bwd) == (4 * t * d, 6 * t * d)
    # and keeps what torch's fused kernel saves, its input and statistics, not the normalised output eager keeps
    assert [s.name for s in fused_norm["h0.norm1"].saves] == [s.name for s in base["h0.norm1"].saves
                                                                if not s.name.endswith(".normed")]
    assert (fused_norm["h0.attn.rope"].bytes_fwd, fused_norm["h0.mlp.act"].bytes_bwd) == (20 * t * q_kv, 18 * t * f)


def test_decomposed_rmsnorm_keeps_what_the_anatomy_says():
    """torchtitan's float32 RMSNorm in bf16 keeps x.float() (pow and x * rstd share it), the normalised bf16 output
    (for the weight's gradient) and rstd: 4 + 2 bytes an element and a float a row (measured with
    saved_tensors_hooks), what the anatomy's decomposed norm keeps: its input x (2), x_fp32's extra (2), normed
    (2) and the statistics (4 a row)."""
    torch = pytest.importorskip("torch")
    spec = run_variant(_tiny("llama-3-8b", 128, compute="bf16", params="bf16", num_layers=2, d_model=128,
                             num_heads=4, num_kv_heads=2, head_dim=32, vocab_size=512, max_seq_len=128,
                             mlp_hidden_dim=384), fusions="decomposed")
    (norm,) = [op for op in build_anatomy(spec, batch=BATCH).ops if op.name == "h0.norm1"]
    t, width = BATCH * 128, 128
    per_element = (sum(s.bytes for s in norm.saves) - 4 * t) / (t * width)
    rows, d = 4096, 1024
    weight = torch.nn.Parameter(torch.ones(d, dtype=torch.bfloat16))
    x = torch.randn(rows, d, dtype=torch.bfloat16, requires_grad=True)
    kept: dict[int, int] = {}

    def pack(t):
        kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        xf = x.float()
        (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).type_as(x) * weight
    kept.pop(weight.untyped_storage().data_ptr())
    assert sum(kept.values()) == (4 + 2) * rows * d + 4 * rows
    assert per_element == (sum(kept.values()) - 4 * rows) / (rows * d) == 6
