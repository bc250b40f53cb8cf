"""Parameter counts by group, from an architecture alone (no torch).

Groups follow `ddplan.specs.PARAM_GROUPS`; their sum is the model's total. Checked against published
totals: GPT-2 small 124,439,808 (tied embeddings, HF `gpt2`), Llama-3-8B 8,030,261,248 (HF config),
Mixtral 8x7B 46.7B total / 12.9B active (Jiang et al., arXiv 2401.04088, sec. 2: "47B" and "13B").

Mixture of experts: the routed experts are their own group (`experts`), and so is the router; the
shared experts and the dense MLPs of dense layers are block matrices (every token uses them).
"""

from __future__ import annotations

from ddplan.specs import Architecture


def mlp_params(arch: Architecture, hidden: int) -> int:
    """Weights of one MLP of `hidden` width: 2 matrices of d_model x hidden (3 for SwiGLU: gate, up, down)."""
    return (3 if arch.mlp == "swiglu" else 2) * arch.d_model * hidden


def block_matrix_params_per_layer(arch: Architecture, layer: int = 0) -> int:
    """Weights of block `layer`'s Linear layers that every token uses: Q, K, V, O and the MLP (biases
    excluded); in a mixture-of-experts block the MLP is its shared experts (none: 0).

    Q and O are d_model x (num_heads*head_dim); K and V are d_model x (num_kv_heads*head_dim).
    """
    c, q_out, kv_out = arch.d_model, arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    attention = c * q_out * 2 + c * kv_out * 2
    hidden = arch.moe.shared_width if arch.is_moe_layer(layer) else arch.mlp_hidden_dim
    return attention + mlp_params(arch, hidden)


def expert_params_per_layer(arch: Architecture) -> int:
    """Weights of one mixture-of-experts block's routed experts: num_experts MLPs of expert_hidden_dim."""
    return 0 if arch.moe is None else arch.moe.num_experts * mlp_params(arch, arch.moe.expert_hidden_dim)


def router_params_per_layer(arch: Architecture) -> int:
    """The router of one mixture-of-experts block: d_model x num_experts (+ d_model for Qwen2-MoE's
    shared-expert gate)."""
    if arch.moe is None:
        return 0
    return arch.d_model * (arch.moe.num_experts + (1 if arch.moe.shared_expert_gate else 0))


def bias_params_per_layer(arch: Architecture) -> int:
    """Biases of one block's Linear layers when the architecture has them (GPT-2: every Linear; Qwen2: Q, K, V)."""
    qkv = arch.num_heads * arch.head_dim + 2 * arch.num_kv_heads * arch.head_dim
    if not arch.linear_bias:
        return qkv if arch.qkv_bias else 0
    mlp_in = (2 if arch.mlp == "swiglu" else 1) * arch.mlp_hidden_dim
    return qkv + arch.d_model + mlp_in + arch.d_model


def norm_params(arch: Architecture) -> int:
    """Learnable norm weights: 2 per block + the final norm (+ the embeddings' norm, BLOOM's); LayerNorm with
    bias has 2 vectors each; with QK norm, a head_dim weight each for q and k per block (Qwen3's per-head q_norm /
    k_norm). e.g. BLOOM-176B (70 layers, 14336 wide, LayerNorm with bias, embedding norm): 142 x 2 x 14336."""
    if not arch.norm_learnable:
        return 0
    per_norm = arch.d_model * (2 if arch.norm == "layernorm" and arch.linear_bias else 1)
    qk = 2 * arch.head_dim * arch.num_layers if arch.qk_norm else 0
    return (2 * arch.num_layers + 1 + arch.embedding_norm) * per_norm + qk


def param_counts(arch: Architecture) -> dict[str, int]:
    """Parameters per group (all groups present, zero where absent)."""
    ve_layers = len(arch.value_embedding_layers())
    kv_width = arch.num_kv_heads * arch.head_dim
    counts = {
        "wte": arch.vocab_size * arch.d_model,
        "wpe": arch.max_seq_len * arch.d_model if arch.position == "learned" else 0,
        "value_embeddings": ve_layers * arch.vocab_size * kv_width,
        "lm_head": 0 if arch.tied_embeddings else arch.vocab_size * arch.d_model,
        # the dense blocks (all of them, or a mixture of experts' first dense_layers), then the MoE blocks
        "block_matrices": ((arch.num_layers - arch.moe_layers) * block_matrix_params_per_layer(arch, 0)
                           + arch.moe_layers * block_matrix_params_per_layer(arch, arch.num_layers - 1)),
        "ve_gates": ve_layers * (arch.value_embeddings.gate_in_features * arch.num_kv_heads
                                 if arch.value_embeddings else 0),
        "smear_gate": arch.smear_gate_in_features or 0,
        "norms": norm_params(arch),
        "biases": arch.num_layers * bias_params_per_layer(arch),
        "scalars": arch.num_layers * arch.scalars_per_layer + arch.scalars_global,
        "experts": arch.moe_layers * expert_params_per_layer(arch),
        "router": arch.moe_layers * router_params_per_layer(arch),
    }
    return counts


def total_params(arch: Architecture) -> int:
    return sum(param_counts(arch).values())


def active_params(arch: Architecture) -> int:
    """Parameters one token uses: the total less the routed experts it is not sent to (top_k of num_experts
    per mixture-of-experts block). Dense models: the total. Mixtral 8x7B: 12.9B of 46.7B.
    Ref: Jiang et al., arXiv 2401.04088, sec. 2 ("active parameters"); DeepSeek-V3 (arXiv 2412.19437)
    counts MFU and FLOPs on activated parameters the same way."""
    c = param_counts(arch)
    if arch.moe is None:
        return sum(c.values())
    return sum(c.values()) - c["experts"] + c["experts"] * arch.moe.top_k // arch.moe.num_experts


def scaling_params(arch: Architecture) -> int:
    """nanochat's scaling parameters: transformer matrices (everything in `transformer.h`) + lm_head.

    Ref: nanochat scripts/base_train.py `get_scaling_params` (transformer_matrices + lm_head, dev/LOG.md
    Jan 27 2026). `transformer.h` holds the block Linears, their biases and the value-embedding gates.
    For a tied model the shared table counts once, as wte, so lm_head adds nothing here.
    """
    c = param_counts(arch)
    return c["block_matrices"] + c["biases"] + c["ve_gates"] + c["lm_head"] + c["experts"] + c["router"]


def non_embedding_params(arch: Architecture) -> int:
    """Total minus the token, position and value embedding tables (Kaplan et al. 2020's N)."""
    c = param_counts(arch)
    return sum(c.values()) - c["wte"] - c["wpe"] - c["value_embeddings"]
