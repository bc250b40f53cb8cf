"""Reference torch model built from a ModelSpec: one code path for nanochat, GPT-2 and Llama.

Every feature is switched on by an `Architecture` field (value embeddings, smear, backout, x0 mixing,
QK norm, rotary vs learned positions, norm kind, MLP kind, biases, tying, softcap), so the model is
what the spec says, and what ddplan's analytical anatomy must account for. It exists to check the
anatomy: FLOPs with `torch.utils.flop_counter.FlopCounterMode` and activation memory with
`torch.autograd.graph.saved_tensors_hooks` (`measure`), on CPU with tiny shapes or on the meta device.

nanochat follows github.com/karpathy/nanochat nanochat/gpt.py @92d63d4 as summarised in
shared/reference/nanochat.md (line numbers below are gpt.py lines from there):
  wte (l.173) -> rms_norm, no weight (l.42-43) -> smear (l.185-186, 479-480) -> x0 = x ->
  per layer i: x = resid_lambdas[i]*x + x0_lambdas[i]*x0 (l.500); x += attn(norm(x)); x += mlp(norm(x))
    attn: c_q, c_k, c_v (l.77-80); on value-embedding layers v += 3*sigmoid(ve_gate(x[..., :12])) * ve
    (l.81-82, 93-97); rotary, theta 100000 (l.270); QK rms_norm; q, k *= 1.2 (l.102-104); causal
    attention with the layer's window (l.110, 287-314); c_proj.  mlp: c_fc C->4C, relu^2, c_proj (l.134-141)
  -> backout: x -= backout_lambda * (x after layer L//2) (l.188, 497, 503-507) -> rms_norm -> lm_head
  (untied) -> logits.float() -> 15*tanh(logits/15) -> cross-entropy, fp32, mean (l.511-520).
nanochat's `Linear` keeps an fp32 master weight and casts it to the activation dtype in forward
(`F.linear(x, self.weight.to(x.dtype))`); wte and value embeddings are stored in the compute dtype.

Deliberate differences, none of which changes FLOPs or saved bytes: the vocab is not padded to a
multiple of 64 (a no-op for nanochat's 32768; ddplan.params counts the unpadded table); the rotary
cache covers seq_len, not 10 x seq_len; weights are initialised for a finite, attention-sensitive loss
(nanochat zero-inits c_proj and smear_lambda), not for training.
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.graph import saved_tensors_hooks
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from ddplan.runfields import recompute_layers, recompute_modules
from ddplan.specs import PARAM_GROUPS, Architecture, ModelSpec

ATTENTION = ("sdpa-math", "sdpa-fused")  # names shared with hardware/*.yaml `attention`
RECOMPUTE = ("none", "selective", "full", "per-op")
# Megatron's recompute modules a torch checkpoint states as Megatron runs them (layernorm and moe_act discard a
# module's output, CheckpointWithoutOutput, which torch.utils.checkpoint does not express)
CHECKPOINTED_MODULES = frozenset({"core_attn", "mlp", "moe", "shared_experts"})
# per-op: torchtitan's SelectiveAC policy (ddplan.anatomy.PER_OP_SOURCE) restated: a layer is checkpointed, the
# outputs of these ops are kept, except every second aten.mm of the layer's forward. torchtitan's list names the
# CUDA attention kernels; on a CPU the fused SDPA runs `_scaled_dot_product_flash_attention_for_cpu`, its stand-in.
_PER_OP_SAVED = frozenset(op for op in (
    torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops.aten.max.default, torch.ops.aten.topk.default))
DTYPE_POLICIES = ("spec", "fp32")
_TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

# Facts of a family that the Architecture schema does not (yet) carry.
# rope_theta: nanochat gpt.py l.270 (100000); Llama 3 config.json rope_theta 500000.
# norm_eps: nanochat's F.rms_norm(x, (C,)) uses eps=None (torch.finfo(dtype).eps); GPT-2 and Llama 1e-5.
# embed_norm: nanochat normalises the token embedding before the first block (gpt.py l.42-43).
_FAMILY = {
    "nanochat": {"rope_theta": 100_000.0, "norm_eps": None, "embed_norm": True},
    "gpt2": {"rope_theta": None, "norm_eps": 1e-5, "embed_norm": False},
    "llama": {"rope_theta": 500_000.0, "norm_eps": 1e-5, "embed_norm": False},
}
QK_GAIN = 1.2  # nanochat gpt.py l.102-104: q, k *= 1.2 after QK norm ("sharper attention")
VE_GATE_RANGE = 3.0  # nanochat gpt.py l.96: gate = 3 * sigmoid(ve_gate(x[..., :12])), in (0, 3)

# Parameter name -> ddplan.params group; the first matching rule wins (norm biases are norms).
_GROUP_RULES = (
    (r"wte\.weight", "wte"),
    (r"wpe\.weight", "wpe"),
    (r"value_embeds\.\d+\.weight", "value_embeddings"),
    (r"lm_head\.weight", "lm_head"),
    (r"(blocks\.\d+\.)?norm_\w+\.(weight|bias)", "norms"),
    (r"blocks\.\d+\.attn\.ve_gate\.weight", "ve_gates"),
    (r"smear_gate\.weight", "smear_gate"),
    (r"blocks\.\d+\.mlp\.experts\.\d+\.c_\w+\.weight", "experts"),
    (r"blocks\.\d+\.mlp\.(router|shared_gate)\.weight", "router"),
    (r"blocks\.\d+\.mlp\.shared\.c_\w+\.weight", "block_matrices"),
    (r"blocks\.\d+\.(attn|mlp)\.c_\w+\.weight", "block_matrices"),
    (r"blocks\.\d+\.(attn|mlp)\.c_\w+\.bias", "biases"),
    (r"resid_lambdas|x0_lambdas|smear_lambda|backout_lambda", "scalars"),
)


def param_group(name: str) -> str:
    """The ddplan.params group of a reference-model parameter, from its qualified name."""
    for pattern, group in _GROUP_RULES:
        if re.fullmatch(pattern, name):
            return group
    raise ValueError(f"parameter {name!r} matches no group rule")


def count_params(model: nn.Module) -> dict[str, int]:
    """Parameters per ddplan.params group (every group present, zero where absent); a tied table counts once."""
    counts = dict.fromkeys(PARAM_GROUPS, 0)
    for name, p in model.named_parameters():
        counts[param_group(name)] += p.numel()
    return counts


class Linear(nn.Linear):
    """nanochat's Linear (gpt.py): the stored (fp32 master) weight is cast to the input dtype in forward.

    Under bf16 compute the cast is a new tensor, saved by the matmul in its place; when the dtypes
    already agree `.to` returns the parameter itself, which the matmul then saves by reference.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, self.weight.to(x.dtype), bias)


class Norm(nn.Module):
    """RMSNorm or LayerNorm over the last dim; weight only if learnable, bias only for LayerNorm with biases."""

    def __init__(self, arch: Architecture, eps: float | None, fused: bool = False):
        super().__init__()
        self.kind, self.eps, self.shape, self.fused = arch.norm, eps, (arch.d_model,), fused
        self.weight = nn.Parameter(torch.ones(arch.d_model)) if arch.norm_learnable else None
        has_bias = arch.norm_learnable and arch.norm == "layernorm" and arch.linear_bias
        self.bias = nn.Parameter(torch.zeros(arch.d_model)) if has_bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = None if self.weight is None else self.weight.to(x.dtype)
        if self.kind == "rmsnorm":
            if self.fused and w is not None:
                return FusedRMSNorm.apply(x, w, self.eps or torch.finfo(x.dtype).eps)
            return F.rms_norm(x, self.shape, w, self.eps)
        b = None if self.bias is None else self.bias.to(x.dtype)
        return F.layer_norm(x, self.shape, w, b, self.eps or 1e-5)


def wide(t):
    """t in fp32 at least (a fused kernel's accumulation precision; float64 stays float64, as gradcheck needs)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


class FusedRMSNorm(torch.autograd.Function):
    """RMSNorm with a weight as Transformer Engine's fused kernel runs it (Recipe.fusions "transformer-engine"): it
    keeps its input, the weight and one fp32 rstd a row, and re-makes the normalised input in backward, where
    eager torch keeps x * rstd as a tensor of its own. Ref: TransformerEngine transformer_engine/pytorch/ops/basic/
    rmsnorm.py (ctx.save_for_backward(x, rstd)); Megatron-Core's TENorm (extensions/transformer_engine.py)."""

    @staticmethod
    def forward(ctx, x, w, eps):
        rstd = torch.rsqrt(wide(x).pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, w, rstd)
        return (wide(x) * rstd).to(x.dtype) * w

    @staticmethod
    def backward(ctx, grad):
        x, w, rstd = ctx.saved_tensors
        xhat = wide(x) * rstd
        gw = wide(grad) * wide(w)
        dx = rstd * (gw - xhat * (gw * xhat).mean(-1, keepdim=True))
        dw = (wide(grad) * xhat).reshape(-1, x.shape[-1]).sum(0)
        return dx.to(x.dtype), dw.to(w.dtype), None


class FusedRotary(torch.autograd.Function):
    """apply_rotary as one fused op (Transformer Engine's FusedRoPEFunc, Megatron-Core's apply_rope_fusion): it keeps
    the shared cos/sin tables only (buffers, not activations), where eager torch makes and keeps -sin each call."""

    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return apply_rotary(x, cos, sin)

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        return apply_rotary(grad, cos, -sin), None, None


class FusedSwiGLU(torch.autograd.Function):
    """silu(g) x u as one fused op (Megatron-Core's bias_swiglu_impl, on by default): it keeps its input, g and u,
    and re-makes silu(g) in backward. Ref: Megatron-LM megatron/core/fusions/fused_bias_swiglu.py@d98e8a64
    SwiGLUFunction (ctx.save_for_backward(input_for_backward))."""

    @staticmethod
    def forward(ctx, g, u):
        ctx.save_for_backward(g, u)
        return F.silu(g) * u

    @staticmethod
    def backward(ctx, grad):
        g, u = ctx.saved_tensors
        return swiglu_grads(g, u, grad)


def swiglu_grads(g, u, grad):
    """(dL/dg, dL/du) of silu(g) x u given dL/d(out): silu'(g) = sigmoid(g) (1 + g (1 - sigmoid(g)))."""
    sig = torch.sigmoid(g)
    return grad * u * sig * (1 + g * (1 - sig)), grad * g * sig


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on (B, T, H, D), halves convention: nanochat gpt.py `apply_rotary_emb`.

    (HF Llama rotates the other way, y1 = x1 cos - x2 sin: the same ops, sin negated.)
    """
    d = x.shape[3] // 2
    x1, x2 = x[..., :d], x[..., d:]
    return torch.cat([x1 * cos + x2 * sin, x1 * (-sin) + x2 * cos], 3)


def window_masks(windows: list[int], seq_len: int, device) -> list[torch.Tensor | None]:
    """The attention mask argument of each layer, one tensor per distinct window (shared by layers).

    Query i sees key j when 0 <= i - j <= window: FA3's window_size=(window, 0), as nanochat's SDPA
    fallback builds it (nanochat/flash_attention.py `_sdpa_attention`), so an S window of w tokens
    sees w + 1 keys. The boolean mask of allowed positions, or None (is_causal=True) where the window
    covers seq_len.
    """
    i = torch.arange(seq_len, device=device)[:, None]
    j = torch.arange(seq_len, device=device)[None, :]
    cache = {w: None if w >= seq_len else (j <= i) & (i - j <= w) for w in set(windows)}
    return [cache[w] for w in windows]


def sdpa_backends(attention: str) -> list:
    """The torch SDPA backends an attention name allows: sdpa-math the math kernel
    (aten `_scaled_dot_product_attention_math`); sdpa-fused the fused kernels only (flash, memory-efficient,
    cuDNN; on CPU only flash, `_scaled_dot_product_flash_attention_for_cpu`), never the math fallback."""
    from torch.nn.attention import SDPBackend

    if attention == "sdpa-math":
        return [SDPBackend.MATH]
    return [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]


def sdpa(q, k, v, mask, *, attention: str, dropout_p: float = 0.0):
    """F.scaled_dot_product_attention on (B, H, T, D) under the backends `attention` names (`sdpa_backends`),
    causal: is_causal where mask is None, else the boolean mask of allowed positions; k and v may have fewer
    heads (enable_gqa). Raises RuntimeError naming the configuration when no allowed kernel runs it (on CPU
    the flash kernel takes no dropout), instead of falling back to another backend."""
    from torch.nn.attention import sdpa_kernel

    try:
        with sdpa_kernel(sdpa_backends(attention)):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                                  dropout_p=dropout_p, enable_gqa=k.shape[1] != q.shape[1])
    except RuntimeError as err:
        if "No available kernel" not in str(err) and "No viable backend" not in str(err):
            raise
        what = (f"{q.dtype} on {q.device}, dropout {dropout_p}, "
                f"{'is_causal' if mask is None else 'explicit mask'}, {q.shape[1]}/{k.shape[1]} heads")
        raise RuntimeError(f"attention={attention!r}: no allowed SDPA kernel runs {what} (torch's warnings say "
                           f"why); use sdpa-math, or a configuration the fused kernels take") from err


class Attention(nn.Module):
    def __init__(self, arch: Architecture, has_ve: bool, attention: str, selective: bool, fused: bool = False):
        super().__init__()
        self.fused = fused  # Recipe.fusions "transformer-engine": the rotary embedding as one fused op
        self.h, self.h_kv, self.d = arch.num_heads, arch.num_kv_heads, arch.head_dim
        self.qk_norm, self.attention, self.selective = arch.qk_norm, attention, selective
        self.early_stop = True  # Transformer sets it: False re-runs the checkpointed core whole (reentrant stacks)
        self.dropout_p = arch.dropout.attention
        c, bias = arch.d_model, arch.linear_bias
        self.c_q = Linear(c, self.h * self.d, bias=bias)
        self.c_k = Linear(c, self.h_kv * self.d, bias=bias)
        self.c_v = Linear(c, self.h_kv * self.d, bias=bias)
        self.c_proj = Linear(self.h * self.d, c, bias=bias)
        gate_in = arch.value_embeddings.gate_in_features if has_ve else 0
        self.ve_gate = Linear(gate_in, self.h_kv, bias=False) if has_ve else None

    def forward(self, x, ve, cos, sin, mask):
        """nanochat CausalSelfAttention (gpt.py: Linears l.77-82, value embedding l.93-97, QK norm l.102-104,
        attention l.110); GPT-2 and Llama are the same path with those features switched off."""
        b, t, _ = x.shape
        q = self.c_q(x).view(b, t, self.h, self.d)
        k = self.c_k(x).view(b, t, self.h_kv, self.d)
        v = self.c_v(x).view(b, t, self.h_kv, self.d)
        if self.ve_gate is not None:  # ResFormer value embedding, one gate per kv head
            gate = VE_GATE_RANGE * torch.sigmoid(self.ve_gate(x[..., : self.ve_gate.in_features]))
            v = v + gate.unsqueeze(-1) * ve.view(b, t, self.h_kv, self.d)
        if cos is not None:
            rotary = FusedRotary.apply if self.fused else apply_rotary
            q, k = rotary(q, cos, sin), rotary(k, cos, sin)
        if self.qk_norm:  # weightless rms_norm over head_dim, after rotary, then the 1.2 gain
            q, k = F.rms_norm(q, (self.d,)), F.rms_norm(k, (self.d,))
            q, k = q * QK_GAIN, k * QK_GAIN
        if self.selective:  # Korthikanti et al. 2022 (arXiv 2205.05198) Sec. 4.2: recompute the attention core
            y = checkpoint(self.core, q, k, v, mask, use_reentrant=False, early_stop=self.early_stop)
        else:
            y = self.core(q, k, v, mask)
        return self.c_proj(y)

    def core(self, q, k, v, mask):
        """(B, T, H, D) q, k, v -> (B, T, H*D): softmax(q k^T / sqrt(D), causal + window) v, by
        F.scaled_dot_product_attention under the backends the attention name allows (`sdpa`)."""
        b, t = q.shape[:2]
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        y = sdpa(q, k, v, mask, attention=self.attention, dropout_p=self.dropout_p if self.training else 0.0)
        return y.transpose(1, 2).reshape(b, t, self.h * self.d)


class MLP(nn.Module):
    """relu2: nanochat (gpt.py l.134-141); gelu (tanh): GPT-2; swiglu: Llama (c_gate, c_fc = up, c_proj = down)."""

    def __init__(self, arch: Architecture, hidden: int | None = None, fused: bool = False):
        super().__init__()
        self.kind, self.fused = arch.mlp, fused  # fused: SwiGLU as one op (Recipe.fusions "transformer-engine")
        c, hidden, bias = arch.d_model, hidden or arch.mlp_hidden_dim, arch.linear_bias
        self.c_fc = Linear(c, hidden, bias=bias)
        self.c_gate = Linear(c, hidden, bias=bias) if arch.mlp == "swiglu" else None
        self.c_proj = Linear(hidden, c, bias=bias)

    def forward(self, x, probs=None):
        """probs: each row's routing probability (fp32), multiplied in the activation (Recipe.moe_weighting
        "activation"): SwiGLU by WeightedSwiGLU, another activation by an eager product."""
        if self.kind == "swiglu":
            g, u = self.c_gate(x), self.c_fc(x)
            if probs is not None:
                h = WeightedSwiGLU.apply(g, u, probs)
            else:
                h = FusedSwiGLU.apply(g, u) if self.fused else F.silu(g) * u
            return self.c_proj(h)
        if self.kind == "relu2":
            h = F.relu(self.c_fc(x)).square()
        else:
            h = F.gelu(self.c_fc(x), approximate="tanh")
        if probs is not None:
            h = (h * probs.unsqueeze(-1)).to(x.dtype)
        return self.c_proj(h)


class WeightedSwiGLU(torch.autograd.Function):
    """silu(g) x u x p in one op, as Megatron-Core's fused weighted SwiGLU runs a mixture of experts' activation
    (Recipe.moe_weighting "activation"): it saves its inputs (g, u and the fp32 probabilities p) and nothing it
    makes. Ref: Megatron-LM megatron/core/fusions/fused_bias_swiglu.py@2659630721 WeightedSwiGLUFunction
    (ctx.save_for_backward(input, weights)), weighted_swiglu / weighted_swiglu_back."""

    @staticmethod
    def forward(ctx, g, u, p):
        ctx.save_for_backward(g, u, p)
        return (F.silu(wide(g)) * wide(u) * p.unsqueeze(-1)).to(g.dtype)

    @staticmethod
    def backward(ctx, grad):
        g, u, p = ctx.saved_tensors
        gf, uf, grad = wide(g), wide(u), wide(grad)
        dg, du = swiglu_grads(gf, uf, grad * p.unsqueeze(-1))
        dp = (grad * F.silu(gf) * uf).sum(-1)
        return dg.to(g.dtype), du.to(u.dtype), dp


class MoE(nn.Module):
    """A mixture-of-experts MLP on one rank, as ddplan.anatomy._moe prices it (Megatron-Core's MoELayer with
    the all-to-all dispatcher, without the all-to-all): router Linear, softmax over the experts in fp32,
    top-k; each token's top_k copies permuted into expert order (one int64 index, `order`, which the
    un-permute reuses); every expert's MLP on its rows; the outputs weighted by their routing
    probabilities (cast to the compute dtype), put back in token order and summed over the copies; shared experts (and Qwen2-MoE's sigmoid gate on
    them) beside. Dropless: every routed copy is computed (capacity factors are not run here). Its FLOPs and
    saved bytes are the anatomy's; its launches are not: the experts run one after another on one stream (E
    GEMM calls a pass), where ddplan prices Transformer Engine's ceil(E / 4) on four streams
    (ddplan.roofline.grouped_call_waves), so a step timed with many experts a GPU runs a little longer than
    the anatomy prices it.
    Ref: Megatron-Core moe/router.py (TopKRouter), token_dispatcher.py (permute / unpermute with probs),
    experts.py (SequentialMLP); HF transformers MixtralSparseMoeBlock, Qwen2MoeSparseMoeBlock."""

    def __init__(self, arch: Architecture, weighting: str = "combine", fused: bool = False):
        super().__init__()
        m = arch.moe
        self.weighting = weighting  # Recipe.moe_weighting: at the combine, or in the experts' activation
        if m.capacity_factor is not None:
            raise ValueError("the reference model runs dropless routing only (moe.capacity_factor must be unset)")
        self.k, c = m.top_k, arch.d_model
        self.router = Linear(c, m.num_experts, bias=False)
        self.experts = nn.ModuleList(MLP(arch, m.expert_hidden_dim, fused) for _ in range(m.num_experts))
        self.shared = MLP(arch, m.shared_width, fused) if m.shared_width else None
        self.shared_gate = Linear(c, 1, bias=False) if m.shared_expert_gate else None
        self.checkpoint_shared = False  # Block sets it for Megatron's shared_experts recompute

    def forward(self, x):
        shape, c = x.shape, x.shape[-1]
        xf = x.reshape(-1, c)
        n, k = xf.shape[0], self.k
        probs = torch.softmax(self.router(xf).float(), dim=-1)
        weights, chosen = torch.topk(probs, k, dim=-1)
        flat = chosen.reshape(-1)
        order = torch.argsort(flat, stable=True)  # the copies in expert order
        counts = torch.bincount(flat, minlength=len(self.experts)).tolist()
        permuted = xf.unsqueeze(1).expand(n, k, c).reshape(n * k, c)[order]
        if self.weighting == "activation":  # each row's probability goes in with it (the dispatcher's permuted probs)
            row_probs = weights.reshape(-1)[order].split(counts)
            outs = [expert(rows, p) for expert, rows, p in zip(self.experts, permuted.split(counts), row_probs)
                    if rows.shape[0]]
            y_sorted = torch.cat(outs) if outs else permuted
        else:
            outs = [expert(rows) for expert, rows in zip(self.experts, permuted.split(counts)) if rows.shape[0]]
            expert_out = torch.cat(outs) if outs else permuted
            y_sorted = expert_out * weights.to(x.dtype).reshape(-1)[order].unsqueeze(-1)
        # back to token order by index_put, which saves only `order` (index_copy would keep y_sorted too)
        y = torch.zeros_like(y_sorted).index_put((order,), y_sorted).view(n, k, c).sum(1)
        if self.shared is not None:
            shared = (checkpoint(self.shared_out, xf, use_reentrant=False, early_stop=False)
                      if self.checkpoint_shared else self.shared_out(xf))
            y = y + shared
        return y.view(shape)

    def shared_out(self, xf):
        """The shared experts' output, gated (Megatron's SharedExpertMLP, its gate included)."""
        shared = self.shared(xf)
        if self.shared_gate is not None:
            shared = torch.sigmoid(self.shared_gate(xf)) * shared
        return shared


class Block(nn.Module):
    def __init__(self, arch, family, layer, attention, modules: frozenset[str], moe_weighting: str = "combine",
                 fused: bool = False):
        super().__init__()
        self.norm_attn = Norm(arch, family["norm_eps"], fused)
        self.attn = Attention(arch, layer in arch.value_embedding_layers(), attention, "core_attn" in modules, fused)
        self.norm_mlp = Norm(arch, family["norm_eps"], fused)
        moe = arch.is_moe_layer(layer)
        self.mlp = MoE(arch, moe_weighting, fused) if moe else MLP(arch, fused=fused)
        # Megatron's modules a checkpoint can express (ddplan.runfields.RECOMPUTE_MODULES): the dense MLP or the
        # MoE layer whole, or the shared experts; re-run whole (early_stop=False), as Megatron's
        # tensor_parallel.checkpoint re-runs a module's forward
        self.checkpoint_mlp = "moe" in modules if moe else "mlp" in modules
        if moe and "shared_experts" in modules and "moe" not in modules:
            self.mlp.checkpoint_shared = True
        # Transformer Engine's layer spec fuses a dense model's pre-MLP norm into fc1: the mlp module re-runs it
        # (ddplan.anatomy._fused_norm_modules)
        self.norm_in_mlp = fused and not moe
        self.dropout_p = arch.dropout.hidden

    def forward(self, x, ve, cos, sin, mask):
        x = x + self.dropout(self.attn(self.norm_attn(x), ve, cos, sin, mask))
        if self.checkpoint_mlp and self.norm_in_mlp:
            y = checkpoint(self.normed_mlp, x, use_reentrant=False, early_stop=False)
        elif self.checkpoint_mlp:
            y = checkpoint(self.mlp, self.norm_mlp(x), use_reentrant=False, early_stop=False)
        else:
            y = self.mlp(self.norm_mlp(x))
        return x + self.dropout(y)

    def normed_mlp(self, x):
        """The pre-MLP norm and the MLP as one module (Transformer Engine's LayerNormLinear fc1)."""
        return self.mlp(self.norm_mlp(x))

    def dropout(self, x):
        """Megatron's hidden dropout (after each output projection). torch.native_dropout keeps a one-byte
        bool mask on every device, as F.dropout does on CUDA (on CPU F.dropout keeps the noise in x's dtype)."""
        if not (self.training and self.dropout_p > 0):
            return x
        return torch.native_dropout(x, self.dropout_p, True)[0]


def _layer_again(policy: str, layer: int) -> bool:
    """Whether a layer policy checkpoints layer `layer` (0-based) of one stage: `full:N` the first N (Megatron's
    block method), `every:K` the K-th, 2K-th, ... (torchtitan's layer selective AC)."""
    found = recompute_layers(policy)
    if found is None:
        return False
    kind, n = found
    return layer < n if kind == "first" else (layer + 1) % n == 0


class Transformer(nn.Module):
    """The model of a spec; `model(idx, targets)` returns the mean cross-entropy, `model(idx)` the logits."""

    def __init__(self, spec: ModelSpec, *, attention: str, recompute: str, seq_len: int, compute_dtype,
                 logits_fp32: bool, early_stop: bool = True):
        super().__init__()
        arch, family = spec.architecture, _FAMILY[spec.family]
        self.arch, self.attention, self.recompute, self.seq_len = arch, attention, recompute, seq_len
        self.early_stop = early_stop  # torch's non-reentrant default; False: regions re-run whole (Megatron's)
        self.compute_dtype, self.logits_fp32 = compute_dtype, logits_fp32
        self.per_op_storage: list[dict] = []  # per-op recompute: each layer's kept outputs (per_op_contexts)
        self.windows = arch.windows(seq_len)
        c = arch.d_model
        self.wte = nn.Embedding(arch.vocab_size, c)
        self.wpe = nn.Embedding(arch.max_seq_len, c) if arch.position == "learned" else None
        fused = spec.recipe.fusions == "transformer-engine"
        embed_norm = family["embed_norm"] or arch.embedding_norm  # nanochat's, or BLOOM's word_embeddings_layernorm
        self.norm_embed = Norm(arch, family["norm_eps"], fused) if embed_norm else None
        self.smear_gate = (Linear(arch.smear_gate_in_features, 1, bias=False)
                           if arch.smear_gate_in_features else None)
        self.smear_lambda = nn.Parameter(torch.zeros(1)) if arch.smear_gate_in_features else None
        self.value_embeds = nn.ModuleDict({str(i): nn.Embedding(arch.vocab_size, arch.num_kv_heads * arch.head_dim)
                                           for i in arch.value_embedding_layers()})
        mix = arch.scalars_per_layer == 2
        self.resid_lambdas = nn.Parameter(torch.ones(arch.num_layers)) if mix else None
        self.x0_lambdas = nn.Parameter(torch.zeros(arch.num_layers)) if mix else None
        modules = recompute_modules(recompute) or (frozenset({"core_attn"}) if recompute == "selective" else frozenset())
        self.blocks = nn.ModuleList([Block(arch, family, i, attention, modules, spec.recipe.moe_weighting, fused)
                                     for i in range(arch.num_layers)])
        self.backout_lambda = nn.Parameter(torch.zeros(1)) if arch.backout else None
        self.norm_f = Norm(arch, family["norm_eps"], fused)
        self.lm_head = None if arch.tied_embeddings else Linear(c, arch.vocab_size, bias=False)
        if arch.position == "rope":  # nanochat gpt.py `_precompute_rotary_embeddings`, cached in compute dtype
            inv_freq = family["rope_theta"] ** (-torch.arange(0, arch.head_dim, 2, dtype=torch.float32) / arch.head_dim)
            freqs = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
            self.register_buffer("cos", freqs.cos().to(compute_dtype)[None, :, None, :], persistent=False)
            self.register_buffer("sin", freqs.sin().to(compute_dtype)[None, :, None, :], persistent=False)
        else:
            self.cos = self.sin = None

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """nanochat GPT.forward (gpt.py l.479-520)."""
        b, t = idx.shape
        if t > self.seq_len:
            raise ValueError(f"sequence of {t} tokens exceeds the model's seq_len {self.seq_len}")
        x = self.wte(idx).to(self.compute_dtype)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(t, device=idx.device)).to(self.compute_dtype)
        if self.norm_embed is not None:
            x = self.norm_embed(x)
        if self.training and self.arch.dropout.hidden > 0:  # Megatron's embedding dropout (GPT-2's embd_pdrop)
            x = torch.native_dropout(x, self.arch.dropout.hidden, True)[0]
        if self.smear_gate is not None:  # previous token's embedding mixed into the current one (l.479-480)
            n = self.smear_gate.in_features
            gate = self.smear_lambda.to(x.dtype) * torch.sigmoid(self.smear_gate(x[:, 1:, :n]))
            x = torch.cat([x[:, :1], x[:, 1:] + gate * x[:, :-1]], dim=1)
        x0 = x
        cos = sin = None
        if self.cos is not None:
            cos, sin = self.cos[:, :t], self.sin[:, :t]
        masks = window_masks(self.windows, t, idx.device)
        backout_layer, x_backout = self.arch.num_layers // 2, None
        for i in range(self.arch.num_layers):
            if self.recompute == "full" or _layer_again(self.recompute, i):  # only the layer's inputs are saved
                x = checkpoint(self.layer, i, x, x0, idx, cos, sin, masks[i], use_reentrant=False,
                               early_stop=self.early_stop)
            elif self.recompute == "per-op":  # the layer's inputs and the outputs the policy keeps
                x = checkpoint(self.layer, i, x, x0, idx, cos, sin, masks[i], use_reentrant=False,
                               context_fn=self.per_op_contexts, early_stop=False)  # as torchtitan wraps it
            else:
                x = self.layer(i, x, x0, idx, cos, sin, masks[i])
            if i == backout_layer:
                x_backout = x
        if self.backout_lambda is not None:
            x = x - self.backout_lambda.to(x.dtype) * x_backout
        x = self.norm_f(x)
        logits = self.lm_head(x) if self.lm_head is not None else F.linear(x, self.wte.weight.to(x.dtype))
        if self.logits_fp32:
            logits = logits.float()
        if self.arch.logit_softcap is not None:
            cap = self.arch.logit_softcap
            logits = cap * torch.tanh(logits / cap)
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1), ignore_index=-1)

    def per_op_contexts(self):
        """torch's selective-checkpoint contexts under the per-op policy, one pair per checkpointed call (the
        matmul count starts again in each layer); the outputs kept go to `per_op_storage` (measure reads it)."""
        matmuls = {"forward": 0, "recompute": 0}

        def policy(ctx, func, *args, **kwargs):
            mode = "recompute" if ctx.is_recompute else "forward"
            if func == torch.ops.aten.mm.default:
                matmuls[mode] += 1
                if matmuls[mode] % 2 == 0:
                    return CheckpointPolicy.PREFER_RECOMPUTE
            return CheckpointPolicy.MUST_SAVE if func in _PER_OP_SAVED else CheckpointPolicy.PREFER_RECOMPUTE

        contexts = create_selective_checkpoint_contexts(policy)
        self.per_op_storage.append(contexts[0].storage)
        return contexts

    def layer(self, i, x, x0, idx, cos, sin, mask):
        """One layer: nanochat's x0 mixing (l.500) and value-embedding lookup, then the block."""
        if self.resid_lambdas is not None:
            x = self.resid_lambdas[i] * x + self.x0_lambdas[i] * x0
        ve = self.value_embeds[str(i)](idx).to(x.dtype) if str(i) in self.value_embeds else None
        return self.blocks[i](x, ve, cos, sin, mask)


def _check_supported(spec: ModelSpec, dtype_policy: str) -> None:
    arch = spec.architecture
    if arch.scalars_per_layer not in (0, 2):
        raise ValueError(f"scalars_per_layer={arch.scalars_per_layer}: the reference knows 0 or 2 "
                         f"(nanochat's resid_lambdas, x0_lambdas)")
    known_globals = (arch.smear_gate_in_features is not None) + arch.backout
    if arch.scalars_global != known_globals:
        raise ValueError(f"scalars_global={arch.scalars_global}, but smear and backout account for {known_globals}")
    if dtype_policy == "spec":
        used = {spec.dtypes.compute, *spec.dtypes.params.values()}
        if not used <= set(_TORCH_DTYPES):
            raise ValueError(f"dtypes {sorted(used - set(_TORCH_DTYPES))} are not supported by the reference model "
                             f"(use dtype_policy='fp32')")


def build_model(spec: ModelSpec, *, attention: str, recompute: str, seq_len: int | None = None,
                device: str | torch.device = "cpu", dtype_policy: str = "spec", early_stop: bool = True) -> Transformer:
    """The reference model of a spec, parameters in their storage dtypes, on `device` ("meta" allocates nothing).

    attention: F.scaled_dot_product_attention (is_causal for full windows, an explicit boolean mask for
    sliding ones, the spec's attention dropout) under torch's math backend ("sdpa-math": fp32 inside for
    16-bit inputs, saves the T x T probabilities) or its fused backends only ("sdpa-fused"), see `sdpa`.
    recompute: "none", "selective" (checkpoint the attention core), "full" (checkpoint every layer), "full:N"
    (checkpoint the first N layers: Megatron's block method on one pipeline stage), "every:K" (every K-th layer:
    torchtitan's layer selective AC) or "per-op" (checkpoint every
    layer under torchtitan's per-op policy: Transformer.per_op_contexts).
    dtype_policy: "spec" stores each parameter group in spec.dtypes.params and computes in
    spec.dtypes.compute; "fp32" stores and computes everything in fp32. early_stop: False checkpoints the layers
    and the attention core with early_stop=False, so each region re-runs whole, as Megatron's reentrant
    CheckpointFunction does (ddplan.anatomy.rerun_whole).
    """
    for name, value, allowed in (("attention", attention, ATTENTION), ("recompute", recompute, RECOMPUTE),
                                 ("dtype_policy", dtype_policy, DTYPE_POLICIES)):
        if value not in allowed and not (name == "recompute" and (recompute_modules(value) is not None
                                                                  and recompute_modules(value) <= CHECKPOINTED_MODULES
                                                                  or recompute_layers(value) is not None)):
            raise ValueError(f"{name}={value!r}; allowed: {', '.join(allowed)}"
                             + (f", full:N, every:K, or selective: with {', '.join(sorted(CHECKPOINTED_MODULES))}"
                                if name == "recompute" else ""))
    seq_len = seq_len or spec.recipe.seq_len
    if seq_len > spec.architecture.max_seq_len:
        raise ValueError(f"seq_len {seq_len} exceeds architecture.max_seq_len {spec.architecture.max_seq_len}")
    _check_supported(spec, dtype_policy)
    fp32 = dtype_policy == "fp32"
    compute = torch.float32 if fp32 else _TORCH_DTYPES[spec.dtypes.compute]
    with torch.device(device):
        model = Transformer(spec, attention=attention, recompute=recompute, seq_len=seq_len,
                            compute_dtype=compute, logits_fp32=fp32 or spec.dtypes.logits == "fp32",
                            early_stop=early_stop)
        for module in model.modules():
            if hasattr(module, "selective"):
                module.early_stop = early_stop
        _init_weights(model)
    if not fp32:
        for name, p in model.named_parameters():
            p.data = p.data.to(_TORCH_DTYPES[spec.dtypes.params[param_group(name)]])
    return model


@torch.no_grad()
def _init_weights(model: Transformer) -> None:
    """Weights for a finite loss that depends on every parameter (not nanochat's training init)."""
    for name, p in model.named_parameters():
        group = param_group(name)
        if group in ("wte", "wpe", "value_embeddings"):
            nn.init.normal_(p, std=0.02)
        elif p.ndim == 2:
            nn.init.normal_(p, std=p.shape[1] ** -0.5)
        elif name.endswith("bias"):
            nn.init.zeros_(p)
    for name, value in (("x0_lambdas", 0.1), ("smear_lambda", 0.1), ("backout_lambda", 0.2)):
        if getattr(model, name) is not None:
            getattr(model, name).fill_(value)


# --------------------------------------------------------------------------------------------
# Measurement


def _cpu_flash_fwd_flop(query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query, key, value)


def _cpu_flash_bwd_flop(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out, query, key, value)


# FlopCounterMode has formulas for the CUDA SDPA kernels but not for the CPU flash kernel; these apply
# the same (non-causal, full T x T) count to it. Its backward includes recomputing the scores: 5 bmm-sized
# products against 4 for an unfused backward.
_CPU_FLASH_FLOPS = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_flash_fwd_flop,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_flash_bwd_flop,
}


def _storage_key(t: torch.Tensor) -> int:
    # The StorageImpl address: shared by all views, distinct for meta and zero-size storages
    # (where data_ptr() is 0). The hooks keep every saved tensor alive, so keys are never reused.
    return t.untyped_storage()._cdata


def measure(spec: ModelSpec, *, batch: int, seq_len: int, attention: str, recompute: str,
            dtype_policy: str = "fp32", device: str = "cpu", seed: int = 0, early_stop: bool = True) -> dict:
    """FLOPs of one forward+backward and the bytes saved for backward, for a micro-batch of batch x seq_len.

    flops_fwd_bwd: FlopCounterMode total (matmuls and attention only; recomputation included);
    flops_by_op: the same by aten op. Saved tensors are counted once per storage (a view keeps its whole
    storage alive): saved_bytes for activations (including weight copies made by a dtype cast),
    saved_param_bytes for parameters saved by reference, saved_buffer_bytes for buffers (rotary cache);
    saved_by_shape lists the activation storages as (shape, dtype, bytes) in the order forward saved
    them, and saved_detail adds the producing op and the kind. "meta" allocates nothing (any size
    runs in about a second) but has no fused attention kernel, so it measures sdpa-math only.
    """
    if device == "meta" and attention == "sdpa-fused":
        raise ValueError("attention='sdpa-fused' on the meta device runs torch's math decomposition, "
                         "not a fused kernel; measure it on cpu or cuda, or use sdpa-math")
    torch.manual_seed(seed)
    model = build_model(spec, attention=attention, recompute=recompute, seq_len=seq_len, device=device,
                        dtype_policy=dtype_policy, early_stop=early_stop)
    vocab = spec.architecture.vocab_size
    idx = torch.randint(0, vocab, (batch, seq_len), device=device)
    targets = torch.randint(0, vocab, (batch, seq_len), device=device)
    kinds = {_storage_key(p): "param" for p in model.parameters()}
    kinds.update({_storage_key(b): "buffer" for b in model.buffers()})
    saved: dict[int, dict] = {}
    keep: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = _storage_key(t)
        if key not in saved:
            keep.append(t)
            producer = type(t.grad_fn).__name__ if t.grad_fn is not None else "leaf"
            saved[key] = {"shape": tuple(t.shape), "dtype": str(t.dtype).removeprefix("torch."),
                          "bytes": t.untyped_storage().nbytes(), "kind": kinds.get(key, "activation"),
                          "producer": producer}
        return t

    with FlopCounterMode(display=False, custom_mapping=_CPU_FLASH_FLOPS) as counter:
        with saved_tensors_hooks(pack, lambda t: t):
            loss = model(idx, targets)
        for storage in model.per_op_storage:  # what selective checkpointing keeps, outside the hooks' view
            for outputs in storage.values():
                for out in outputs.values():
                    for wrapped in torch.utils._pytree.tree_leaves(out):
                        if isinstance(getattr(wrapped, "val", None), torch.Tensor):
                            pack(wrapped.val)
        loss.backward()
    detail = list(saved.values())

    def total(kind: str) -> int:
        return sum(d["bytes"] for d in detail if d["kind"] == kind)

    return {
        "batch": batch, "seq_len": seq_len, "attention": attention, "recompute": recompute,
        "dtype_policy": dtype_policy, "device": str(device),
        "loss": None if device == "meta" else loss.item(),
        "flops_fwd_bwd": counter.get_total_flops(),
        "flops_by_op": {str(op): n for op, n in counter.get_flop_counts().get("Global", {}).items()},
        "saved_bytes": total("activation"),
        "saved_param_bytes": total("param"),
        "saved_buffer_bytes": total("buffer"),
        "saved_by_shape": [(d["shape"], d["dtype"], d["bytes"]) for d in detail if d["kind"] == "activation"],
        "saved_detail": detail,
    }
