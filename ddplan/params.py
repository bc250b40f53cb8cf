"""Parameter counts by group, from an architecture alone (no torch).

Groups follow `ddplan.specs.PARAM_GROUPS`; their sum is the model's total. Checked against published
totals: GPT-2 small 124,439,808 (tied embeddings, HF `gpt2`), Llama-3-8B 8,030,261,248 (HF config).
"""

from __future__ import annotations

from ddplan.specs import Architecture


def block_matrix_params_per_layer(arch: Architecture) -> int:
    """Weights of one block's Linear layers: Q, K, V, O and the MLP (biases excluded).

    Q and O are d_model x (num_heads*head_dim); K and V are d_model x (num_kv_heads*head_dim);
    the MLP has 2 matrices of d_model x hidden (3 for SwiGLU: gate, up, down).
    """
    c, q_out, kv_out = arch.d_model, arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    attention = c * q_out * 2 + c * kv_out * 2
    mlp = (3 if arch.mlp == "swiglu" else 2) * c * arch.mlp_hidden_dim
    return attention + mlp


def bias_params_per_layer(arch: Architecture) -> int:
    """Biases of one block's Linear layers when the architecture has them (GPT-2: every Linear; Qwen2: Q, K, V)."""
    qkv = arch.num_heads * arch.head_dim + 2 * arch.num_kv_heads * arch.head_dim
    if not arch.linear_bias:
        return qkv if arch.qkv_bias else 0
    mlp_in = (2 if arch.mlp == "swiglu" else 1) * arch.mlp_hidden_dim
    return qkv + arch.d_model + mlp_in + arch.d_model


def norm_params(arch: Architecture) -> int:
    """Learnable norm weights: 2 per block + the final norm; LayerNorm with bias has 2 vectors each."""
    if not arch.norm_learnable:
        return 0
    per_norm = arch.d_model * (2 if arch.norm == "layernorm" and arch.linear_bias else 1)
    return (2 * arch.num_layers + 1) * per_norm


def param_counts(arch: Architecture) -> dict[str, int]:
    """Parameters per group (all groups present, zero where absent)."""
    ve_layers = len(arch.value_embedding_layers())
    kv_width = arch.num_kv_heads * arch.head_dim
    counts = {
        "wte": arch.vocab_size * arch.d_model,
        "wpe": arch.max_seq_len * arch.d_model if arch.position == "learned" else 0,
        "value_embeddings": ve_layers * arch.vocab_size * kv_width,
        "lm_head": 0 if arch.tied_embeddings else arch.vocab_size * arch.d_model,
        "block_matrices": arch.num_layers * block_matrix_params_per_layer(arch),
        "ve_gates": ve_layers * (arch.value_embeddings.gate_in_features * arch.num_kv_heads
                                 if arch.value_embeddings else 0),
        "smear_gate": arch.smear_gate_in_features or 0,
        "norms": norm_params(arch),
        "biases": arch.num_layers * bias_params_per_layer(arch),
        "scalars": arch.num_layers * arch.scalars_per_layer + arch.scalars_global,
    }
    return counts


def total_params(arch: Architecture) -> int:
    return sum(param_counts(arch).values())


def scaling_params(arch: Architecture) -> int:
    """nanochat's scaling parameters: transformer matrices (everything in `transformer.h`) + lm_head.

    Ref: nanochat scripts/base_train.py `get_scaling_params` (transformer_matrices + lm_head, dev/LOG.md
    Jan 27 2026). `transformer.h` holds the block Linears, their biases and the value-embedding gates.
    For a tied model the shared table counts once, as wte, so lm_head adds nothing here.
    """
    c = param_counts(arch)
    return c["block_matrices"] + c["biases"] + c["ve_gates"] + c["lm_head"]


def non_embedding_params(arch: Architecture) -> int:
    """Total minus the token, position and value embedding tables (Kaplan et al. 2020's N)."""
    c = param_counts(arch)
    return sum(c.values()) - c["wte"] - c["wpe"] - c["value_embeddings"]
