"""FLOPs per token under named conventions, and MFU / HFU.

MFU is only comparable under one convention: always say which. The seed's 27.5% uses nanochat's
count at window L; the same run reads ~25% under the SSSL count.
"""

from __future__ import annotations

from ddplan.anatomy import attention_pairs
from ddplan.params import param_counts
from ddplan.specs import Architecture

CONVENTIONS = ("nanochat", "palm", "exact", "korthikanti", "megatron_hfu")


def matmul_params(arch: Architecture) -> int:
    """Weights of every Linear a token passes through (block matrices, lm_head, the nanochat gates, the
    router and top_k of the routed experts): the N of 6N.

    Embedding lookups (wte, wpe, value embeddings) cost no matmul FLOPs. A tied lm_head is a matmul
    with the wte table, so it counts here. Mixture of experts: the active routed experts only (top_k /
    num_experts of them), the convention of Mixtral's and DeepSeek-V3's "activated parameters"; padding
    to capacity is hardware work, not model FLOPs. Ref: nanochat gpt.py `estimate_flops`
    (reference/nanochat.md); DeepSeek-V3, arXiv 2412.19437, sec. 3.1 and Table 1.
    """
    c = param_counts(arch)
    lm_head = c["lm_head"] if not arch.tied_embeddings else c["wte"]
    experts = c["experts"] * arch.moe.top_k / arch.moe.num_experts if arch.moe else 0
    return c["block_matrices"] + lm_head + c["ve_gates"] + c["smear_gate"] + c["router"] + round(experts)


def nanochat_flops_per_token(arch: Architecture, seq_len: int) -> float:
    """nanochat's training FLOPs per token: 6 N + sum over layers of 12 h q min(window, T).

    N = weights of every Linear (gates included); h heads, q head_dim, window per layer from the
    pattern (last layer full). Non-causal: every layer counts its whole window.
    Ref: nanochat gpt.py:319-349 `estimate_flops`; PaLM (arXiv 2204.02311) App. B for the 12 h q T term.
    """
    _check_seq(seq_len)
    attn = sum(12 * arch.num_heads * arch.head_dim * min(w, seq_len) for w in arch.windows(seq_len))
    return 6.0 * matmul_params(arch) + attn


def palm_flops_per_token(arch: Architecture, seq_len: int) -> float:
    """PaLM's training FLOPs per token: 6 N + 12 L H Q T (full context in every layer, non-causal).

    N = non-embedding matmul weights (here: every Linear, lm_head included, as nanochat counts it).
    Ref: Chowdhery et al., PaLM, arXiv 2204.02311, Appendix B.
    """
    _check_seq(seq_len)
    return 6.0 * matmul_params(arch) + 12.0 * arch.num_layers * arch.num_heads * arch.head_dim * seq_len


def exact_flops_per_token(arch: Architecture, seq_len: int) -> float:
    """Matmul FLOPs per token of an exact causal (and windowed) attention: no FLOPs on masked pairs.

    6 N + sum over layers of 12 h q pairs(window)/T, pairs = k(k+1)/2 + (T - k) k with k = min(w+1, T)
    keys per query (a left window of w tokens plus the query itself): the FLOPs a flash kernel with
    native windows needs. Ref: ddplan.anatomy.attention_pairs.
    """
    _check_seq(seq_len)

    attn = sum(12 * arch.num_heads * arch.head_dim * attention_pairs(seq_len, w, "flash_package", "native")
               for w in arch.windows(seq_len))
    return 6.0 * matmul_params(arch) + attn / seq_len


def korthikanti_flops_per_iteration(batch: int, seq_len: int, num_layers: int, hidden: int, vocab: int) -> float:
    """Model FLOPs of one iteration (no recompute): 72 B L s h^2 (1 + s/(6h) + V/(12 h L)).

    For a GPT layer with 4h MLP and MHA. Ref: Korthikanti et al., arXiv 2205.05198, Eq. 7 (sec. 6.3).
    """
    _check_positive(batch=batch, seq_len=seq_len, num_layers=num_layers, hidden=hidden, vocab=vocab)
    b, s, L, h, v = batch, seq_len, num_layers, hidden, vocab
    return 72.0 * b * L * s * h * h * (1 + s / (6 * h) + v / (12 * h * L))


def megatron_flops_per_iteration(batch: int, seq_len: int, num_layers: int, hidden: int, vocab: int) -> float:
    """Hardware FLOPs of one iteration with full activation recompute: 96 B s l h^2 (1 + s/(6h) + V/(16 l h)).

    Ref: Narayanan et al., arXiv 2104.04473, Eq. 3. (Counts the recomputed forward: HFU, not MFU.)
    """
    _check_positive(batch=batch, seq_len=seq_len, num_layers=num_layers, hidden=hidden, vocab=vocab)
    b, s, L, h, v = batch, seq_len, num_layers, hidden, vocab
    return 96.0 * b * s * L * h * h * (1 + s / (6 * h) + v / (16 * L * h))


def flops_per_token(arch: Architecture, seq_len: int, convention: str) -> float:
    """Training FLOPs per token under a named convention (see CONVENTIONS)."""
    if convention == "nanochat":
        return nanochat_flops_per_token(arch, seq_len)
    if convention == "palm":
        return palm_flops_per_token(arch, seq_len)
    if convention == "exact":
        return exact_flops_per_token(arch, seq_len)
    if arch.moe is not None and convention in ("korthikanti", "megatron_hfu"):
        raise ValueError(f"the {convention} FLOPs formula is for dense GPT layers; a mixture-of-experts model "
                         f"needs nanochat, palm or exact")
    if convention == "korthikanti":
        return korthikanti_flops_per_iteration(1, seq_len, arch.num_layers, arch.d_model, arch.vocab_size) / seq_len
    if convention == "megatron_hfu":
        return megatron_flops_per_iteration(1, seq_len, arch.num_layers, arch.d_model, arch.vocab_size) / seq_len
    raise ValueError(f"unknown FLOPs convention {convention!r}; allowed: {', '.join(CONVENTIONS)}")


def mfu(flops_per_token: float, tokens_per_s: float, peak_flops_per_s: float, num_gpus: int) -> float:
    """Model FLOPs utilisation: FLOPs/token x tokens/s / (peak x GPUs), a fraction.

    Ref: PaLM (arXiv 2204.02311) App. B; nanochat base_train.py (peak = dense bf16 x world size).
    """
    _check_positive(flops_per_token=flops_per_token, tokens_per_s=tokens_per_s,
                    peak_flops_per_s=peak_flops_per_s, num_gpus=num_gpus)
    return flops_per_token * tokens_per_s / (peak_flops_per_s * num_gpus)


def hfu(model_flops: float, recompute_flops: float, step_time_s: float, peak_flops_per_s: float,
        num_gpus: int) -> float:
    """Hardware FLOPs utilisation: (model + recomputed FLOPs) / (time x peak x GPUs).

    Ref: Korthikanti et al., arXiv 2205.05198, sec. 6.3 (HFU counts recomputation, MFU does not).
    """
    _check_positive(model_flops=model_flops, step_time_s=step_time_s, peak_flops_per_s=peak_flops_per_s,
                    num_gpus=num_gpus)
    if recompute_flops < 0:
        raise ValueError(f"recompute_flops must be >= 0, got {recompute_flops}")
    return (model_flops + recompute_flops) / (step_time_s * peak_flops_per_s * num_gpus)


def _check_seq(seq_len: int) -> None:
    if seq_len <= 0:
        raise ValueError(f"seq_len must be positive, got {seq_len}")


def _check_positive(**values: float) -> None:
    bad = {k: v for k, v in values.items() if not v > 0}
    if bad:
        raise ValueError("must be positive: " + ", ".join(f"{k}={v}" for k, v in bad.items()))
