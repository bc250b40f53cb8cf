"""The torch reference model (ddplan.calibrate.reference) against ddplan's parameter counts and itself.

Everything runs on CPU with tiny shapes (nanochat depth 2-3, vocab 512, seq 256) or on the meta device
for the full-size models; the whole module takes a few seconds.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from ddplan.calibrate.reference import build_model, count_params, measure, window_masks  # noqa: E402
from ddplan.nanochat import nanochat_spec  # noqa: E402
from ddplan.params import param_counts  # noqa: E402
from ddplan.registry import load_model  # noqa: E402
from ddplan.specs import ModelSpec  # noqa: E402

SEQ = 256
BATCH = 2


def shrink(spec: ModelSpec, seq_len: int = SEQ, **arch) -> ModelSpec:
    """A validated copy of a spec with architecture fields replaced and the recipe's sequence set to seq_len."""
    data = spec.model_dump()
    data["architecture"].update(arch)
    data["recipe"].update(seq_len=seq_len, total_batch_tokens=8 * seq_len)
    return ModelSpec.model_validate(data)


def nanochat_tiny(depth: int = 2) -> ModelSpec:
    return shrink(nanochat_spec(depth), vocab_size=512)


def gpt2_tiny() -> ModelSpec:
    return shrink(load_model("gpt2-124m"), num_layers=2, d_model=64, num_heads=4, num_kv_heads=4, head_dim=16,
                  vocab_size=512, max_seq_len=SEQ, mlp_hidden_dim=256)


def llama_tiny() -> ModelSpec:
    return shrink(load_model("llama-3-8b"), num_layers=2, d_model=64, num_heads=4, num_kv_heads=2, head_dim=16,
                  vocab_size=512, max_seq_len=SEQ, mlp_hidden_dim=160)


def moe_tiny() -> ModelSpec:
    """Qwen2-MoE's block shape on Mixtral's spec: a dense first layer, then 4 experts (top 2) and a gated shared one."""
    return shrink(load_model("mixtral-8x7b"), num_layers=2, d_model=64, num_heads=4, num_kv_heads=2, head_dim=16,
                  vocab_size=512, max_seq_len=SEQ, mlp_hidden_dim=160,
                  moe={"num_experts": 4, "top_k": 2, "expert_hidden_dim": 48, "shared_experts": 1,
                       "shared_hidden_dim": 80, "shared_expert_gate": True, "dense_layers": 1})


TINY = {"nanochat-d2": nanochat_tiny, "gpt2": gpt2_tiny, "llama-gqa": llama_tiny, "moe": moe_tiny}
ATTENTION = ("sdpa-math", "sdpa-fused")
RECOMPUTE = ("none", "selective", "full")


def matmul_params(spec: ModelSpec) -> int:
    """Weights every token multiplies (the 6N rule's N): block matrices, lm_head (wte if tied), gates, the router
    and top_k / num_experts of the routed experts (each token runs top_k of them, whatever the routing)."""
    arch = spec.architecture
    c = param_counts(arch)
    head = c["wte"] if arch.tied_embeddings else c["lm_head"]
    experts = c["experts"] * arch.moe.top_k // arch.moe.num_experts if arch.moe else 0
    return c["block_matrices"] + head + c["ve_gates"] + c["smear_gate"] + c["router"] + experts


def loss_and_grads(spec, attention, recompute, dtype_policy="fp32"):
    torch.manual_seed(0)
    model = build_model(spec, attention=attention, recompute=recompute, seq_len=SEQ, dtype_policy=dtype_policy)
    idx = torch.randint(0, spec.architecture.vocab_size, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    loss = model(idx, torch.roll(idx, -1, dims=1))
    loss.backward()
    return model, loss.item()


# --------------------------------------------------------------------------------------------
# Parameters


@pytest.mark.parametrize("make", [lambda: nanochat_tiny(2), lambda: nanochat_tiny(3), gpt2_tiny, llama_tiny],
                         ids=["nanochat-d2", "nanochat-d3", "gpt2", "llama-gqa"])
def test_param_counts_match_ddplan_on_tiny_models(make):
    spec = make()
    model = build_model(spec, attention="sdpa-math", recompute="none", seq_len=SEQ)
    assert count_params(model) == param_counts(spec.architecture)


@pytest.mark.parametrize(("name", "total"), [("nanochat-d24", None), ("gpt2-124m", 124_439_808),
                                             ("llama-3-8b", 8_030_261_248)])
def test_param_counts_match_ddplan_on_meta_full_size(name, total):
    """Published totals: GPT-2 small 124,439,808 (HF gpt2, tied), Llama-3-8B 8,030,261,248 (HF config)."""
    spec = load_model(name)
    model = build_model(spec, attention="sdpa-fused", recompute="none", device="meta")
    counts = count_params(model)
    assert counts == param_counts(spec.architecture)
    if total is not None:
        assert sum(counts.values()) == total


def test_storage_dtypes_and_grad_dtypes_follow_the_spec():
    """nanochat: fp32 Linear masters (fp32 grads through the cast), bf16 wte and value embeddings."""
    model, loss = loss_and_grads(nanochat_tiny(), "sdpa-fused", "none", dtype_policy="spec")
    assert math.isfinite(loss)
    assert model.wte.weight.dtype == model.wte.weight.grad.dtype == torch.bfloat16
    assert model.value_embeds["1"].weight.grad.dtype == torch.bfloat16
    assert model.blocks[0].attn.c_q.weight.grad.dtype == torch.float32
    assert model.lm_head.weight.dtype == model.resid_lambdas.dtype == torch.float32


def test_unknown_options_are_rejected():
    with pytest.raises(ValueError, match="attention"):
        build_model(nanochat_tiny(), attention="flash", recompute="none")
    with pytest.raises(ValueError, match="recompute"):
        build_model(nanochat_tiny(), attention="sdpa-math", recompute="some")


# --------------------------------------------------------------------------------------------
# Forward and backward


@pytest.mark.parametrize("recompute", RECOMPUTE)
@pytest.mark.parametrize("attention", ATTENTION)
@pytest.mark.parametrize("family", TINY)
def test_forward_backward_runs_with_finite_loss_and_grads(family, attention, recompute):
    model, loss = loss_and_grads(TINY[family](), attention, recompute)
    assert math.isfinite(loss)
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


@pytest.mark.parametrize("family", TINY)
def test_math_and_fused_attention_agree_and_recompute_changes_nothing(family):
    spec = TINY[family]()
    reference = loss_and_grads(spec, "sdpa-math", "none")[1]
    for attention in ATTENTION:
        for recompute in RECOMPUTE:
            assert abs(loss_and_grads(spec, attention, recompute)[1] - reference) < 1e-4, (attention, recompute)


def test_sliding_window_mask_follows_fa3_semantics():
    """Query i sees key j iff 0 <= i - j <= window (nanochat flash_attention.py `_sdpa_attention`)."""
    allowed, causal = window_masks([2, 5], 5, "cpu")
    assert allowed[4].nonzero().flatten().tolist() == [2, 3, 4]
    assert causal is None  # a window covering the sequence is is_causal=True


def test_short_windows_change_the_loss():
    """nanochat d2 at seq 256: SSSL gives layer 0 a 128-token window; L gives full context."""
    sssl = loss_and_grads(nanochat_tiny(), "sdpa-fused", "none")[1]
    full = loss_and_grads(shrink(nanochat_tiny(), window_pattern="L"), "sdpa-fused", "none")[1]
    assert abs(sssl - full) > 1e-6


# --------------------------------------------------------------------------------------------
# FLOPs and saved bytes


@pytest.mark.parametrize("family", TINY)
def test_flops_6n_rule_is_a_lower_bound_and_matmuls_are_exactly_6n(family):
    """Every weight costs 6 FLOPs per token (2 forward, 4 backward); sdpa-math adds 12 B H T^2 D per layer.

    nanochat's smear gate sees T-1 positions per sequence, hence its own term.
    """
    spec = TINY[family]()
    arch = spec.architecture
    r = measure(spec, batch=BATCH, seq_len=SEQ, attention="sdpa-math", recompute="none")
    tokens = BATCH * SEQ
    print(f"{family}: sdpa-math FLOPs fwd+bwd = {r['flops_fwd_bwd']:,}  by op {r['flops_by_op']}")
    assert r["flops_fwd_bwd"] >= 6 * matmul_params(spec) * tokens
    smear = arch.smear_gate_in_features or 0
    linear = sum(n for op, n in r["flops_by_op"].items() if op in ("aten.mm", "aten.addmm"))
    assert linear == 6 * (matmul_params(spec) - smear) * tokens + 6 * smear * BATCH * (SEQ - 1)
    attention = 12 * BATCH * arch.num_heads * SEQ**2 * arch.head_dim * arch.num_layers
    assert r["flops_by_op"]["aten.bmm"] == attention


def test_saved_bytes_fall_with_recompute_and_with_the_fused_kernel():
    spec = nanochat_tiny()
    saved = {(a, rc): measure(spec, batch=BATCH, seq_len=SEQ, attention=a, recompute=rc)["saved_bytes"]
             for a in ATTENTION for rc in RECOMPUTE}
    for a in ATTENTION:
        assert saved[a, "none"] > saved[a, "selective"] > saved[a, "full"], a
    assert saved["sdpa-fused", "none"] < saved["sdpa-math", "none"]
    for rc in ("selective", "full"):  # both keep only the checkpoints' inputs
        assert saved["sdpa-fused", rc] == saved["sdpa-math", rc], rc


def test_saved_probabilities_and_weight_references():
    """sdpa-math saves a B x H x T x T softmax per layer (fp32, also under bf16 compute); fp32 weights are saved
    by reference, bf16 casts are not."""
    spec = nanochat_tiny()
    fp32 = measure(spec, batch=BATCH, seq_len=SEQ, attention="sdpa-math", recompute="none")
    probs = [s for s in fp32["saved_by_shape"] if s[0] == (BATCH, spec.architecture.num_heads, SEQ, SEQ)]
    assert len(probs) == spec.architecture.num_layers
    assert fp32["saved_param_bytes"] > 0 and sum(s[2] for s in fp32["saved_by_shape"]) == fp32["saved_bytes"]
    bf16 = measure(spec, batch=BATCH, seq_len=SEQ, attention="sdpa-math", recompute="none", dtype_policy="spec")
    # torch's math SDPA computes in fp32 for bf16 inputs: the probabilities it saves are fp32
    assert [s[1] for s in bf16["saved_by_shape"] if s[0] == probs[0][0]] == ["float32"] * spec.architecture.num_layers
    c = spec.architecture.d_model
    assert any(s[:2] == ((c, c), "bfloat16") for s in bf16["saved_by_shape"])  # the cast copy of c_q
    assert bf16["saved_param_bytes"] < 64  # only fp32 scalars (resid/x0 lambdas) remain by reference


def test_meta_device_measures_full_size_without_allocating():
    spec = load_model("nanochat-d24")
    r = measure(spec, batch=1, seq_len=2048, attention="sdpa-math", recompute="full", dtype_policy="spec",
                device="meta")
    assert r["loss"] is None and r["flops_fwd_bwd"] > 6 * matmul_params(spec) * 2048
    with pytest.raises(ValueError, match="meta"):
        measure(spec, batch=1, seq_len=2048, attention="sdpa-fused", recompute="none", device="meta")


def test_the_fused_functions_backward_is_their_forward_s_gradient():
    """The reference model's stand-ins for fused kernels (Transformer Engine's RMSNorm and RoPE, Megatron-Core's
    SwiGLU and weighted SwiGLU) write their own backward: torch.autograd.gradcheck compares each with finite
    differences in float64."""
    torch = pytest.importorskip("torch")
    from torch.autograd import gradcheck

    from ddplan.calibrate.reference import FusedRMSNorm, FusedRotary, FusedSwiGLU, WeightedSwiGLU

    gen = torch.Generator().manual_seed(0)

    def rand(*shape, grad=True):
        return torch.randn(*shape, generator=gen, dtype=torch.float64, requires_grad=grad)

    assert gradcheck(lambda x, w: FusedRMSNorm.apply(x, w, 1e-6), (rand(3, 8), rand(8)))
    cos, sin = rand(5, 1, 2, grad=False), rand(5, 1, 2, grad=False)
    assert gradcheck(lambda x: FusedRotary.apply(x, cos, sin), (rand(2, 5, 3, 4),))
    assert gradcheck(FusedSwiGLU.apply, (rand(4, 6), rand(4, 6)))
    assert gradcheck(WeightedSwiGLU.apply, (rand(4, 6), rand(4, 6), rand(4)))
