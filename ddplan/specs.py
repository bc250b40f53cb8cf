"""Spec schemas (pydantic v2): hardware, model and training recipe.

Conventions, enforced here so the rest of ddplan can rely on them:
- unknown keys are rejected (extra="forbid"); specs are immutable (frozen);
- every field name that holds a quantity carries its unit, bits and bytes spelled out
  (`nic_gbit_per_s`, `hbm_tbyte_per_s`, `usable_gib`); the SI value is a derived property;
- every number a plan rests on carries a `source`, and every efficiency says whether it is
  `assumed` or `measured` and may carry a low-high range, which the time model turns into a band.

Loading and name resolution live in `ddplan.registry`; this module has no I/O.
"""

from __future__ import annotations

import datetime as _dt
import functools
import math
import re
import typing
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from ddplan import units

Dtype = Literal["fp32", "bf16", "fp16", "fp8"]
# Upper bounds: far past any real device or model, so that a typo (10^30) is an error, not a
# 10^22-hour plan, and so that the work a command does stays bounded (README, "Input ranges").
PositiveInt = Annotated[int, Field(gt=0, le=10**7)]
Count = Annotated[int, Field(gt=0, le=1024)]  # layers, heads, GPUs or NICs per node, links
Tokens = Annotated[int, Field(gt=0, le=10**16)]
GroupSize = Annotated[int, Field(ge=2)]


class Strict(BaseModel):
    # every float finite: `.inf` and `.nan` in a spec are errors, not numbers (`gt=0` alone admits inf)
    # defer_build: a model's validator is built on its first use, not on import (a command that reads no
    # calibration or runs file does not pay ~0.1 s for their schemas)
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, defer_build=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, value, info: ValidationInfo):
        """A YAML or JSON `true` where a number is expected is an error, not 1: pydantic's lax mode reads
        True as 1 for int, float and Literal[0, 1, ...] fields (`tokens: true` priced "1 steps")."""
        if info.field_name in _numeric_fields(cls):
            items = value if isinstance(value, (list, tuple)) else (value,)
            if any(isinstance(v, bool) for v in items):
                raise ValueError(f"must be a number, got {str(value).lower()} (a true/false value)")
        elif info.field_name in _bool_fields(cls) and isinstance(value, (int, float)) and not isinstance(value, bool):
            raise ValueError(f"must be true or false, got the number {value!r}")  # and 1 is not true
        return value


@functools.lru_cache(maxsize=None)
def _numeric_fields(model: type[BaseModel]) -> frozenset[str]:
    """The fields of a model whose type holds numbers (int, float, a Literal of numbers, a list of them) and
    no bool: where a bool must be refused."""
    return frozenset(name for name, f in model.model_fields.items() if _takes_numbers_not_bools(f.annotation))


@functools.lru_cache(maxsize=None)
def _bool_fields(model: type[BaseModel]) -> frozenset[str]:
    """The fields of a model that hold true or false and no number: where a number must be refused."""
    return frozenset(name for name, f in model.model_fields.items() if _kinds(f.annotation) == {"bool"})


def _takes_numbers_not_bools(annotation) -> bool:
    found = _kinds(annotation)
    return "number" in found and "bool" not in found


def _kinds(annotation) -> set[str]:
    """What an annotation admits, coarsely: 'number', 'bool', 'other' (None aside)."""
    found: set[str] = set()

    def walk(a) -> None:
        if a is bool:
            found.add("bool")
        elif a in (int, float):
            found.add("number")
        elif typing.get_origin(a) is Literal:
            for v in typing.get_args(a):
                found.add("bool" if isinstance(v, bool) else "number" if isinstance(v, (int, float)) else "other")
        elif typing.get_origin(a) in (list, tuple, Annotated, typing.Union) or type(a).__name__ == "UnionType":
            for arg in typing.get_args(a):
                walk(arg)
        elif a is not type(None) and isinstance(a, type):
            found.add("other")
    walk(annotation)
    return found


class Sourced(Strict):
    """A positive number with the place it comes from (paper and table, datasheet URL, or measurement)."""

    value: float = Field(gt=0, le=1e7)  # in the unit its key names (TFLOP/s, GiB, TB/s, us, Gbit/s, ...)
    source: str = Field(min_length=3)


class Efficiency(Strict):
    """A fraction of a hardware peak that real kernels reach, with its basis and plausible range.

    `value` is the central estimate; `low`/`high` bound it (default: the value itself). The
    time model uses the range to put a band around every prediction.
    """

    value: float = Field(gt=0, le=1.5)  # NVLS all-reduce busbw exceeds the per-direction link spec
    low: float | None = Field(default=None, gt=0, le=1.5)
    high: float | None = Field(default=None, gt=0, le=1.5)
    basis: Literal["assumed", "measured", "fitted"]  # fitted: to measured runs (ddplan validate), named in source
    source: str = Field(min_length=3)

    @model_validator(mode="after")
    def _ordered(self) -> Efficiency:
        if not self.range[0] <= self.value <= self.range[1]:
            raise ValueError(f"need low <= value <= high, got {self.range[0]} <= {self.value} <= {self.range[1]}")
        return self

    @property
    def range(self) -> tuple[float, float]:
        return (self.low if self.low is not None else self.value, self.high if self.high is not None else self.value)


# --------------------------------------------------------------------------------------------
# Hardware


class PeakCompute(Strict):
    """Dense (no 2:4 sparsity) peak throughput per dtype, TFLOP/s. None: the dtype has no such unit."""

    bf16_tflops: Sourced
    fp8_tflops: Sourced | None = None
    tf32_tflops: Sourced | None = None
    fp32_vector_tflops: Sourced

    def flops_per_s(self, dtype: str) -> float:
        """Dense peak FLOP/s for a compute dtype (fp16 runs at the bf16 rate on every shipped part)."""
        key = {"bf16": "bf16_tflops", "fp16": "bf16_tflops", "fp8": "fp8_tflops", "tf32": "tf32_tflops",
               "fp32": "fp32_vector_tflops"}[dtype]
        peak = getattr(self, key)
        if peak is None:
            raise ValueError(f"this device has no {dtype} tensor units")
        return peak.value * units.TFLOPS


class Memory(Strict):
    usable_gib: Sourced  # total as the driver reports it (nvidia-smi MiB, rocm-smi bytes)
    vendor_label_gb: float = Field(gt=0, le=1e6)  # the marketing figure ("192 GB"), for display only
    hbm_tbyte_per_s: Sourced  # peak HBM bandwidth, decimal TB/s

    @property
    def usable_bytes(self) -> float:
        return self.usable_gib.value * units.GiB

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_tbyte_per_s.value * units.TB


Collective = Literal["all_reduce", "reduce_scatter", "all_gather"]
Fp8Format = Literal["e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz"]
Fp8Recipe = Literal["tensorwise", "rowwise", "rowwise_with_gw_hp", "delayed", "current", "nanochat", "mxfp8",
                    "mxfp8_torchao"]
Fp8WeightCasts = Literal["micro-batch", "step"]
CrossEntropy = Literal["eager", "vocab-parallel", "fused", "te", "chunked"]
# where a mixture of experts multiplies each routed copy by its routing probability (Recipe.moe_weighting)
MoeWeighting = Literal["combine", "activation"]
# how a block's norms, rotary embedding and SwiGLU run (Recipe.fusions)
Fusions = Literal["eager", "transformer-engine", "decomposed", "fused-norm"]
# how gradients are kept and reduced (Dtypes.grads): in each parameter's dtype, in fp32 (Megatron's main_grad), or
# reduced in the compute dtype and kept in the parameter's (FSDP MixedPrecision reduce_dtype=bf16 over fp32 weights)
Grads = Literal["param", "fp32", "compute"]
Moments = Literal["param", "fp32", "bf16", "fp16", "fp8"]  # AdamW's moments' dtype (Optimizer.adamw_state_dtype)


class IntraNode(Strict):
    """The fabric between the GPUs of one node and what collectives achieve over it.

    `busbw_gbyte_per_s[collective][group_size]`: achievable bus bandwidth (nccl-tests convention,
    large messages) for a group of that many GPUs inside the node. Group sizes in between use the
    nearest listed size at or below (a smaller group on a mesh owns fewer links).
    """

    topology: Literal["full_mesh", "switch", "pcie"]
    links_per_gpu: Count
    link_gbyte_per_s_per_direction: Sourced
    busbw_gbyte_per_s: dict[Collective, dict[GroupSize, Sourced]]
    latency_us: Sourced  # per ring step (alpha)

    @model_validator(mode="after")
    def _all_collectives(self) -> IntraNode:
        missing = {"all_reduce", "reduce_scatter", "all_gather"} - set(self.busbw_gbyte_per_s)
        if missing:
            raise ValueError(f"busbw_gbyte_per_s needs every collective; missing: {', '.join(sorted(missing))}")
        if any(not points for points in self.busbw_gbyte_per_s.values()):
            raise ValueError("busbw_gbyte_per_s: each collective needs at least one group size")
        return self


class InterNode(Strict):
    nics_per_node: Count
    nic_gbit_per_s: Sourced  # per NIC, gigabits (not bytes) per second
    fabric: Literal["infiniband", "roce", "efa", "ethernet"]
    busbw_fraction_of_nics: Efficiency  # achievable ring busbw / total NIC bandwidth of a node
    latency_us: Sourced

    @property
    def node_bytes_per_s(self) -> float:
        return self.nics_per_node * self.nic_gbit_per_s.value * units.GBIT


class Host(Strict):
    """The host side of a GPU, for optimizer and activation offload: the GPU-host link and the CPU's memory.

    link_gbyte_per_s: achievable copy bandwidth between one GPU and host memory, per direction (the slower of
    measured host-to-device and device-to-host, nvbandwidth or TransferBench, pinned memory).
    memory_gbyte_per_s: the node's CPU memory (DRAM) bandwidth, shared by its GPUs' processes.
    """

    link_gbyte_per_s: Sourced
    memory_gbyte_per_s: Sourced

    @property
    def link_bytes_per_s(self) -> float:
        return self.link_gbyte_per_s.value * units.GB

    @property
    def memory_bytes_per_s(self) -> float:
        return self.memory_gbyte_per_s.value * units.GB


class Price(Strict):
    usd_per_gpu_hour: float = Field(gt=0, le=10_000)
    billing: Literal["per_gpu", "per_node"]  # per_node: you pay for whole nodes
    provider: str = Field(min_length=2)
    date: _dt.date
    source: str = Field(min_length=3)


class GemmEfficiency(Strict):
    """Fraction of dense peak a GEMM reaches, as a function of its shape (curve in ddplan.roofline).

    eff(m, n, k) = best x sustained x prod over d in (m, n, k) of d / (d + half_dim): the best measured
    rate (MAMF, best shape, a short benchmark) scaled down for small dimensions, which tile poorly, and by
    the fraction of it that GEMMs keep through real training steps (`sustained`: clocks under the power
    limit with real data, kernels sharing the GPU with communication and memory-bound work). A
    calibration's measured GEMMs replace the whole curve.
    """

    best: Efficiency
    half_dim: Sourced  # dimension at which that dimension alone halves the efficiency
    best_fp8: Efficiency | None = None  # fraction of the dense fp8 peak (None: assume the bf16 fraction)
    sustained: Efficiency | None = None  # fraction of `best` kept in training (None: 1, all of it)
    # fraction of `best_fp8` kept in fp8 training, fitted on fp8 runs (None: `sustained`, the 16-bit runs' fraction)
    sustained_fp8: Efficiency | None = None
    # seconds one GEMM call costs beyond its work at the curve's rate (launch, prologue, epilogue, tail),
    # fitted with half_dim to a published sweep (ddplan.sweeps); None: the kernel overhead of every kernel
    fixed_us: Sourced | None = None


class Efficiencies(Strict):
    gemm: GemmEfficiency
    hbm: Efficiency  # achievable fraction of peak HBM bandwidth (STREAM-like copy)
    kernel_overhead_us: Sourced  # launch + tail per kernel, added to each op
    # fraction of its rate compute keeps while a collective runs beside it (NCCL/RCCL kernels take SMs and HBM
    # bandwidth from the kernels they overlap): the overlapped part of each collective costs the step
    # (1 - overlapped_compute) x its time (ddplan.comm.overlap_cost_s). None: 1, overlap is free
    overlapped_compute: Efficiency | None = None


class AttentionImpl(Strict):
    """One attention implementation available on this hardware's software stack.

    kind: `sdpa_math` is torch's math SDPA: materialises the s x s scores and probabilities and saves
    them, in fp32 even for 16-bit inputs (ddplan.anatomy.sdpa_math_saved_bytes); `unfused_math` is
    Megatron-LM's unfused attention, the same in the compute dtype (Korthikanti et al. 2022 Table 2);
    `fused_sdpa` is PyTorch's fused kernel (flash / memory-efficient; AOTriton on ROCm), saving
    only O(s) statistics; `flash_package` is a flash-attention package (FA2/FA3, CK on ROCm).
    windows: `native` skips the masked-out blocks; `mask` needs an explicit mask, computes and keeps
    what a full window would (nanochat's SDPA fallback), and rules out PyTorch's flash kernel.
    """

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]*$")
    kind: Literal["sdpa_math", "unfused_math", "fused_sdpa", "flash_package"]
    windows: Literal["native", "mask"]
    efficiency_fwd: Efficiency  # fraction of bf16 peak on attention FLOPs, forward
    efficiency_bwd: Efficiency  # same, backward
    description: str = Field(min_length=3)
    # false: priced only when named (--attention, a validation run), never in the rows, searches and
    # consistency checks that try every implementation (Megatron-LM's own attention, not a PyTorch loop's)
    by_default: bool = True
    # the sequence length of the measurement its efficiencies come from: a fused kernel is priced along
    # ddplan.roofline.attention_seq_factor from there (every shipped figure: Azure's runs at seq 8192);
    # None: no sequence curve (calibrate's CPU spec, whose efficiencies are measured at the model's shapes)
    measured_seq_len: int | None = Field(default=None, gt=0, le=10**8)
    # keys per query at which the kernel reaches half its long-sequence rate (attention_seq_factor), fitted to
    # its own published sweep; None: ddplan.roofline.FLASH_SEQ_HALF (FA3 / FA2 on H100)
    seq_half: float | None = Field(default=None, gt=0, le=10**6)


class HardwareSpec(Strict):
    kind: Literal["hardware"]
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]*$")
    aliases: list[str] = []
    display_name: str
    vendor: Literal["nvidia", "amd", "cpu"]  # cpu: the spec calibrate measures on a CPU
    software_stack: Literal["cuda", "rocm", "cpu"]
    peak: PeakCompute
    memory: Memory
    gpus_per_node: Count
    intra_node: IntraNode
    inter_node: InterNode
    prices: list[Price] = Field(min_length=1)
    efficiency: Efficiencies
    attention: list[AttentionImpl] = Field(min_length=1)
    default_attention: str
    # fp8 element formats the tensor units take: OCP (e4m3fn, e5m2; H100+, MI355X) or AMD's
    # "fnuz" variants (MI300X, MI325X); empty when there is no fp8 (A100)
    fp8_formats: list[Fp8Format] = []
    # tensor cores that take MXFP8 (E4M3 with one E8M0 scale per 32 elements, Transformer Engine's MXFP8BlockScaling,
    # --fp8-recipe mxfp8): Blackwell and later, SM 10.0+ (TransformerEngine docs/features/low_precision_training/
    # mxfp8/mxfp8.rst@495739c, "Supported devices")
    mxfp8: bool = False
    tdp_watts: Sourced | None = None
    host: Host | None = None  # None: no host figures, optimizer offload is refused

    @model_validator(mode="after")
    def _consistent(self) -> HardwareSpec:
        names = [a.name for a in self.attention]
        if len(set(names)) != len(names):
            raise ValueError(f"attention: duplicate implementation names in {names}")
        if self.default_attention not in names:
            raise ValueError(f"default_attention {self.default_attention!r} is not one of {names}")
        for collective, points in self.intra_node.busbw_gbyte_per_s.items():
            too_big = [n for n in points if n > self.gpus_per_node]
            if too_big:
                raise ValueError(f"intra_node.busbw_gbyte_per_s.{collective}: group sizes {too_big} exceed "
                                 f"gpus_per_node={self.gpus_per_node}")
        return self

    def default_attention_impls(self) -> list[AttentionImpl]:
        """The implementations tried when none is named (AttentionImpl.by_default)."""
        return [a for a in self.attention if a.by_default]

    def attention_impl(self, name: str) -> AttentionImpl:
        for impl in self.attention:
            if impl.name == name:
                return impl
        raise KeyError(name)

    @property
    def price(self) -> Price:
        """The default price: the first listed."""
        return self.prices[0]


# --------------------------------------------------------------------------------------------
# Model

ParamGroup = Literal[
    "wte", "wpe", "value_embeddings", "lm_head", "block_matrices", "ve_gates", "smear_gate", "norms",
    "biases", "scalars", "experts", "router",
]
PARAM_GROUPS: tuple[str, ...] = ParamGroup.__args__  # type: ignore[attr-defined]


class ValueEmbeddings(Strict):
    """nanochat's ResFormer-style value embeddings: a vocab x (n_kv_head*head_dim) table on some layers.

    Layer i has one when i % 2 == (num_layers - 1) % 2 (alternating, last layer always included),
    mixed into v through a gate Linear(gate_in_features -> n_kv_head). Ref: nanochat gpt.py l.53-55, 81-97.
    """

    layers: Literal["alternate_including_last"] = "alternate_including_last"
    gate_in_features: PositiveInt = 12


class Dropout(Strict):
    """Dropout probabilities (off in models that ship without it). hidden: after the attention output
    projection and after the MLP (Megatron's hidden-dropout); attention: on the attention probabilities
    (attention-dropout). Each saves a one-byte mask per element for backward (torch native_dropout);
    fused attention kernels regenerate theirs from the RNG state instead.
    Ref: Korthikanti et al., arXiv 2205.05198, sec. 4.1 and Table 2 (the sbh and as^2 b masks)."""

    hidden: float = Field(default=0.0, ge=0, lt=1)
    attention: float = Field(default=0.0, ge=0, lt=1)


# Dropless routing under expert parallelism: the busiest expert-parallel rank's routed rows over the mean,
# the factor by which its experts' work and its all-to-alls outlast balanced routing's (every rank waits for
# it at the next all-to-all). Fitted (ddplan.validation.fit_dropless_imbalance) to the ModelZoo's forced-
# balance vs dropless throughput of one Qwen3-235B-A22B layout (128 experts, top 8, ep 8, H100) at four
# sequence lengths (validation/moe_routing.yaml: 295/237 ... 389/357 TFLOP/s/GPU), where the MoE share of
# the step falls from 46% to 18%; the four fits agree within 0.05 (1.50-1.54), as a constant factor on the
# experts' part alone predicts. Assumed the same at other ep, expert counts and auxiliary-loss weights
# (no published sweep of those at hand); set moe.load_imbalance (or 1 for forced balance) to replace it.
DROPLESS_IMBALANCE = 1.52


class MoE(Strict):
    """Mixture-of-experts MLP: each token goes to `top_k` of `num_experts` routed experts (SwiGLU or the
    model's MLP kind, `expert_hidden_dim` wide), plus `shared_experts` that every token passes through
    (DeepSeek-MoE, Qwen2-MoE), chosen by a linear router (d_model -> num_experts, softmax then top-k).

    dense_layers: the first k blocks keep a dense MLP of mlp_hidden_dim (DeepSeek-V2/V3
    `first_k_dense_replace`). capacity_factor: None is dropless (every routed token computed); a factor
    pads every expert to capacity = tokens x top_k x factor / num_experts (Megatron-Core
    --moe-expert-capacity-factor with --moe-pad-expert-input-to-capacity; GShard, Switch).
    load_imbalance: dropless only, under expert parallelism (ep > 1): the busiest rank's routed rows over
    the mean, on which the step waits at every all-to-all (its experts' time and the exchange scale by it,
    memory does not: the busiest rank differs from layer to layer); None is DROPLESS_IMBALANCE (real data,
    auxiliary-loss balancing), 1 is forced balance (Megatron-Core --moe-router-force-load-balancing, a benchmark setting). With one
    expert-parallel rank every expert is local and the rows are the same whichever expert takes them.
    shared_expert_gate: Qwen2-MoE's sigmoid gate (d_model -> 1) on the shared expert's output.
    Ref: Shazeer et al. 2017 (arXiv 1701.06538); Fedus et al., Switch Transformer (arXiv 2101.03961)
    sec. 2.2 for capacity; Jiang et al., Mixtral (arXiv 2401.04088) sec. 2; Dai et al., DeepSeekMoE
    (arXiv 2401.06066) for shared experts.
    """

    num_experts: Annotated[int, Field(ge=2, le=4096)]
    top_k: Annotated[int, Field(ge=1, le=4096)]
    expert_hidden_dim: PositiveInt
    shared_experts: int = Field(default=0, ge=0, le=64)
    shared_hidden_dim: PositiveInt | None = None  # one shared expert's width (default expert_hidden_dim)
    shared_expert_gate: bool = False
    dense_layers: int = Field(default=0, ge=0, le=1024)
    capacity_factor: float | None = Field(default=None, gt=0, le=64)
    load_imbalance: float | None = Field(default=None, ge=1, le=64)

    @model_validator(mode="after")
    def _consistent(self) -> MoE:
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k ({self.top_k}) cannot exceed num_experts ({self.num_experts})")
        if self.capacity_factor is not None and self.load_imbalance is not None:
            raise ValueError("load_imbalance is for dropless routing; with a capacity_factor every expert is padded "
                             "to capacity (drop one of them)")
        return self

    @property
    def shared_width(self) -> int:
        """Hidden width of all shared experts together (0 without them)."""
        return self.shared_experts * (self.shared_hidden_dim or self.expert_hidden_dim)

    def imbalance(self, ep: int) -> float:
        """The busiest of ep expert-parallel ranks' routed rows over the mean: 1 with one rank or experts
        padded to capacity, else load_imbalance (default DROPLESS_IMBALANCE)."""
        if ep < 1:
            raise ValueError(f"ep must be >= 1, got {ep}")
        if ep == 1 or self.capacity_factor is not None:
            return 1.0
        return self.load_imbalance if self.load_imbalance is not None else DROPLESS_IMBALANCE

    def rows_factor(self, ep: int = 1) -> float:
        """Routed rows the busiest of ep ranks receives, per token and top-k choice sent out by each: the
        capacity factor (padding) when set, else the dropless imbalance. e.g. ep 8 dropless: 1.52."""
        return self.capacity_factor or self.imbalance(ep)

    def routed_tokens(self, tokens: float) -> float:
        """Token-expert pairs the routed experts compute for `tokens` tokens, on the mean rank: tokens x top_k,
        padded to capacity (x capacity_factor) when a capacity factor is set."""
        return tokens * self.top_k * (self.capacity_factor or 1.0)


class ShortWindow(Strict):
    """Length of an `S` window: ceil(seq_len / divisor / round_to) * round_to (nanochat gpt.py:287-314)."""

    divisor: PositiveInt = 4
    round_to: PositiveInt = 128

    def tokens(self, seq_len: int) -> int:
        return -(-seq_len // self.divisor // self.round_to) * self.round_to


class Architecture(Strict):
    num_layers: Count
    d_model: PositiveInt
    num_heads: Annotated[int, Field(gt=0, le=16384)]
    num_kv_heads: Annotated[int, Field(gt=0, le=16384)]
    head_dim: PositiveInt
    vocab_size: PositiveInt
    max_seq_len: Annotated[int, Field(gt=0, le=10**8)]  # longest context the model supports (learned positions: table size)
    mlp: Literal["relu2", "gelu", "swiglu"]
    mlp_hidden_dim: PositiveInt
    norm: Literal["rmsnorm", "layernorm"]
    norm_learnable: bool  # False: RMSNorm without weights (nanochat)
    linear_bias: bool
    qkv_bias: bool = False  # biases on Q, K and V only (Qwen2), when linear_bias is off
    tied_embeddings: bool
    position: Literal["rope", "learned"]
    qk_norm: bool = False
    # a norm of the token embeddings before the first block (BLOOM's word_embeddings_layernorm; Megatron-DeepSpeed
    # --embed-layernorm), of the model's norm kind; nanochat's own, unweighted, is its family's
    embedding_norm: bool = False
    value_embeddings: ValueEmbeddings | None = None
    smear_gate_in_features: PositiveInt | None = None  # nanochat's smear: Linear(24 -> 1)
    backout: bool = False  # nanochat: subtract lambda * x at layer L//2 before the final norm
    scalars_per_layer: int = Field(default=0, ge=0, le=10**6)  # nanochat: resid_lambdas, x0_lambdas
    scalars_global: int = Field(default=0, ge=0, le=10**6)  # nanochat: smear_lambda, backout_lambda
    window_pattern: str = Field(default="L", pattern=r"^[SL]+$")
    short_window: ShortWindow = ShortWindow()
    logit_softcap: float | None = Field(default=None, gt=0, le=1e6)
    dropout: Dropout = Dropout()
    moe: MoE | None = None  # mixture-of-experts MLP (None: dense)

    @model_validator(mode="after")
    def _consistent(self) -> Architecture:
        # num_heads x head_dim may differ from d_model (Gemma 7B: 16 x 256 = 4096 over a 3072-wide stream):
        # Q, K, V and O follow heads x head_dim (ddplan.params, ddplan.anatomy)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.moe and self.linear_bias:
            raise ValueError("a mixture of experts with biases on every Linear (linear_bias) is not modelled; "
                             "set linear_bias false (qkv_bias is allowed)")
        if self.moe and self.moe.dense_layers >= self.num_layers:
            raise ValueError(f"moe.dense_layers ({self.moe.dense_layers}) must leave at least one of the "
                             f"{self.num_layers} layers a mixture of experts")
        return self

    def is_moe_layer(self, layer: int) -> bool:
        """Whether block `layer` (0-based) has a mixture-of-experts MLP."""
        return self.moe is not None and layer >= self.moe.dense_layers

    @property
    def moe_layers(self) -> int:
        """How many blocks have a mixture-of-experts MLP."""
        return 0 if self.moe is None else self.num_layers - self.moe.dense_layers

    def windows(self, seq_len: int) -> list[int]:
        """Attention window (tokens) of each layer: the pattern tiled, last layer forced to full.

        Ref: nanochat gpt.py:287-314 (`_compute_window_sizes`).
        """
        pattern = self.window_pattern
        full, short = seq_len, min(seq_len, self.short_window.tokens(seq_len))
        out = [full if pattern[i % len(pattern)] == "L" else short for i in range(self.num_layers)]
        out[-1] = full
        return out

    def value_embedding_layers(self) -> list[int]:
        if self.value_embeddings is None:
            return []
        return [i for i in range(self.num_layers) if i % 2 == (self.num_layers - 1) % 2]


class Dtypes(Strict):
    """Storage dtype per parameter group (the master copy) and the compute dtype.

    nanochat: Linear weights are fp32 masters cast to bf16 in forward (so their grads are fp32);
    wte and value embeddings are stored in bf16; logits are cast to fp32 for softcap and loss.
    """

    compute: Dtype
    params: dict[ParamGroup, Dtype]
    logits: Dtype = "fp32"
    # gradient storage and reduction: the parameter's dtype (PyTorch default), fp32 accumulation buffers
    # (Megatron-LM's main_grad with fp16/bf16 params), or "compute": reduced in the compute dtype and kept in the
    # parameter's (FSDP's MixedPrecision(reduce_dtype=bfloat16) over fp32 weights: torch's reduce-scatter input is
    # the bf16 unsharded gradients, its output cast to the fp32 sharded parameter's dtype)
    grads: Grads = "param"

    def grad_bytes(self, group: str) -> int:
        """Bytes an element of a gradient as it is kept (and read by the optimizer)."""
        return 4 if self.grads == "fp32" else units.dtype_bytes(self.params[group])

    def reduce_bytes(self, group: str) -> int:
        """Bytes an element of a gradient as the data-parallel collectives carry it: the compute dtype's under
        "compute", else as it is kept (grad_bytes)."""
        return units.dtype_bytes(self.compute) if self.grads == "compute" else self.grad_bytes(group)


class Optimizer(Strict):
    """Which algorithm updates each parameter group, and in what dtype it keeps its state.

    AdamW keeps m and v; Muon keeps a momentum buffer and (NorMuon) a factored second moment.
    adamw_state_dtype: the dtype of AdamW's two moments; `param`: same dtype as the parameter (torch's default,
    zeros_like(param); nanochat: bf16 for embeddings); bf16/fp16/fp8: Megatron-Core's --use-precision-aware-optimizer
    with --exp-avg-dtype and --exp-avg-sq-dtype (megatron/training/arguments.py@d98e8a64 L3666-3685; bf16 moments as
    DeepSeek-V3 trained, arXiv 2412.19437 sec. 3.3.3).
    """

    name: str
    algorithm: dict[ParamGroup, Literal["adamw", "muon"]]
    adamw_state_dtype: Moments = "fp32"
    # an fp32 master copy of 16-bit params kept in the optimizer state (Megatron-LM, apex O2, DeepSpeed)
    master_weights: bool = False
    # of that master copy only the 16 bits a bf16 weight lacks (Transformer Engine FusedAdam store_param_remainders,
    # which Megatron-Core's precision-aware optimizer turns on for bf16 weights: optimizer_config.py@d98e8a64 L192),
    # where it can: bf16 weights under the distributed optimizer (adamw_bytes)
    master_remainder: bool = False
    muon_ns_steps: PositiveInt = 5
    source: str = Field(min_length=3)

    @model_validator(mode="after")
    def _remainder_of_a_master(self) -> Optimizer:
        if self.master_remainder and not self.master_weights:
            raise ValueError("master_remainder keeps part of an fp32 master copy: it needs master_weights: true")
        return self

    def adamw_bytes(self, param_dtype: str, distributed_optimizer: bool = True) -> tuple[int, int]:
        """(bytes of each of AdamW's two moments, bytes of the master copy) an element, for a parameter kept in
        param_dtype. The master: 0 without one, 4 (fp32), or 2 with master_remainder where Megatron-Core keeps the
        remainders: bf16 weights (Transformer Engine's store_param_remainders "works only when param type is BF16")
        under the distributed optimizer (ZeRO-1/2: the precision-aware optimizer needs it, optimizer/__init__.py
        @d98e8a64 L1057-1060, and Megatron-FSDP keeps its own masters), the low 16 bits of the fp32 master beside the
        bf16 weight, an int16 tensor (distrib_optimizer.py L1007-1010); elsewhere whole (4).
        e.g. Megatron-Core's defaults, (4, 4): 12 bytes of state a parameter; --use-precision-aware-optimizer
        --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16 on bf16 weights, (2, 2): 6 bytes."""
        dtype = param_dtype if self.adamw_state_dtype == "param" else self.adamw_state_dtype
        remainder = self.master_remainder and param_dtype == "bf16" and distributed_optimizer
        return units.dtype_bytes(dtype), (2 if remainder else 4) if self.master_weights else 0


class Budget(Strict):
    """Training length: exactly one of steps, tokens, or a tokens:params ratio."""

    steps: Annotated[int, Field(gt=0, le=10**9)] | None = None
    tokens: Tokens | None = None
    param_data_ratio: float | None = Field(default=None, gt=0, le=1e6)
    ratio_params: Literal["scaling", "total", "non_embedding"] = "scaling"

    @model_validator(mode="after")
    def _exactly_one(self) -> Budget:
        given = [k for k in ("steps", "tokens", "param_data_ratio") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of steps, tokens, param_data_ratio (got {given or 'none'})")
        return self


class Evaluation(Strict):
    """Periodic work outside training steps, at the recipe's cadence."""

    every_steps: int = Field(default=0, ge=0, le=10**9)  # 0: never
    tokens: int = Field(default=0, ge=0, le=10**15)  # tokens evaluated each time (forward only)
    source: str = Field(min_length=3)


Distribution = Literal["sharded_optimizer", "ddp", "zero1", "zero2", "fsdp"]


class Recipe(Strict):
    seq_len: Annotated[int, Field(gt=0, le=10**8)]
    device_batch_size: Annotated[int, Field(gt=0, le=65536)]  # sequences per GPU per micro-batch
    total_batch_tokens: Annotated[int, Field(gt=0, le=10**12)]  # tokens per optimizer step, all GPUs together
    budget: Budget
    optimizer: Optimizer
    distribution: Distribution  # the native data-parallel setup (sharded_optimizer: nanochat's)
    world_size_rule: Literal["any", "power_of_two"] = "any"
    compiled: bool = True  # torch.compile on the model (nanochat, nanoGPT default): changes what is saved
    # fp8 formats the model's fp8 training path needs (nanochat fp8.py: e4m3fn forward, e5m2 grads);
    # None: any fp8 the hardware has (torchao picks the platform's format)
    fp8_formats: list[Fp8Format] | None = None
    # how its fp8 path casts (ddplan.fp8.FP8_CAST_BYTES): torchao's tensorwise Float8Linear (the default) or rowwise
    # recipe, Transformer Engine's delayed, current or MXFP8 scaling, or nanochat's own fp8.py
    fp8_recipe: Fp8Recipe = "tensorwise"
    # how often an fp8 GEMM's weight is cast (sources: ddplan.fp8, TE_RECIPES): every micro-batch (the default: torchao,
    # nanochat, Composer's Transformer Engine), or once a step, cached for the other micro-batches (Megatron-Core's
    # Transformer Engine modules, given is_first_microbatch)
    fp8_weight_casts: Fp8WeightCasts = "micro-batch"
    # whether that path converts the LM head too (nanochat's fp8_module_filter keeps no module by name);
    # torchtitan, Megatron-Core and Transformer Engine recipes keep it in the compute dtype
    fp8_lm_head: bool = False
    # the loss kernel (ddplan.anatomy._head): eager torch's cross entropy on fp32 logits ("eager": log_softmax saves
    # its output, backward builds two vocab-wide fp32 gradients) or Megatron's vocab-parallel cross entropy
    # ("vocab-parallel": the fp32 copy of the logits becomes the saved softmax and backward writes the gradient
    # into it in place) or a fused kernel ("fused": flash-attention's CrossEntropyLoss, llm-foundry's default, which
    # keeps the 16-bit logits and each token's fp32 log-sum-exp and writes a 16-bit gradient) or Transformer Engine's
    # parallel cross entropy ("te": Megatron-Core's --cross-entropy-fusion-impl te, as NeMo's performance scripts set
    # it: keeps the 16-bit logits and three fp32 figures a token, writes the gradient into the logits in place) or
    # torchtitan's chunked loss ("chunked": the head and an eager cross entropy run on 1 / LOSS_CHUNKS of the tokens
    # at a time, each chunk's backward at once, its gradient gathered in an fp32 buffer of the hidden states;
    # ddplan.anatomy._head; ddplan.specs.CROSS_ENTROPY)
    cross_entropy: CrossEntropy = "eager"
    # where a mixture of experts weights each routed copy by its routing probability (ddplan.anatomy._moe):
    # "combine" multiplies the experts' outputs at the un-permute, which saves them for the probabilities' gradient
    # (HF transformers' MoE blocks; Megatron-Core before Megatron-LM !2668); "activation" multiplies inside the
    # experts' fused weighted SwiGLU, which saves only its input and the probabilities, and the un-permute saves
    # nothing but its index (Megatron-Core since !2668, commit 2659630721, 2025-04-09: experts.py bias_act_func
    # weighted_bias_swiglu_impl, fused_bias_swiglu.py WeightedSwiGLUFunction save_for_backward(input, weights),
    # token_dispatcher.py MoEAlltoAllTokenDispatcher.token_unpermutation: unpermute without probs)
    moe_weighting: MoeWeighting = "combine"
    # how a block's norms, rotary embedding and SwiGLU run (ddplan.anatomy): "eager" as torch's ops run them (the
    # reference model, nanochat, HF): a learnable RMSNorm keeps its normalised input beside its input, the rotary
    # embedding a -sin table a call, SwiGLU silu(g) beside g and u; "transformer-engine" as Megatron-Core's Transformer
    # Engine layer spec runs them (transformer_config.py@d98e8a64 L1314 transformer_impl "transformer_engine"):
    # TE's norms keep their input and statistics only, the fused RoPE nothing a token, the fused SwiGLU its input
    # only (fused_bias_swiglu.py SwiGLUFunction save_for_backward(input); --no-bias-swiglu-fusion and
    # --no-rope-fusion are off by default, arguments.py L2895-2905); "decomposed" as the Llama reference code writes
    # them in torch, each tensor op its own kernel when not compiled (torchtitan before nn.RMSNorm, 3b39d7a
    # 2025-03-19: RMSNorm in float32 over six kernels, the rotary embedding in complex float32, silu and the product
    # apart; ddplan.anatomy.decomposed_rmsnorm_bytes); "fused-norm" the same with torch's fused RMSNorm kernel
    # (nn.RMSNorm on a torch with aten._fused_rms_norm: torchtitan since 3b39d7a), the rotary embedding and SwiGLU
    # still op by op; compiled, Inductor fuses them and they cost what eager's do
    fusions: Fusions = "eager"
    evaluation: Evaluation | None = None
    source: str = Field(min_length=3)


class ModelSpec(Strict):
    kind: Literal["model"]
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]*$")
    aliases: list[str] = []
    family: Literal["nanochat", "gpt2", "llama"]
    description: str
    source: str = Field(min_length=3)
    architecture: Architecture
    dtypes: Dtypes
    recipe: Recipe

    @model_validator(mode="after")
    def _consistent(self) -> ModelSpec:
        arch, recipe = self.architecture, self.recipe
        if recipe.seq_len > arch.max_seq_len:
            raise ValueError(f"recipe.seq_len {recipe.seq_len} exceeds architecture.max_seq_len {arch.max_seq_len}")
        if recipe.total_batch_tokens % recipe.seq_len:
            raise ValueError(f"recipe.total_batch_tokens {recipe.total_batch_tokens} is not a multiple of "
                             f"recipe.seq_len {recipe.seq_len}")
        present = set(present_param_groups(arch))
        missing = present - set(self.dtypes.params)
        if missing:
            raise ValueError(f"dtypes.params: no dtype for parameter groups {sorted(missing)}")
        missing = present - set(recipe.optimizer.algorithm)
        if missing:
            raise ValueError(f"recipe.optimizer.algorithm: no algorithm for parameter groups {sorted(missing)}")
        return self


def present_param_groups(arch: Architecture) -> list[str]:
    """Parameter groups this architecture has (in PARAM_GROUPS order)."""
    has = {
        "wte": True,
        "wpe": arch.position == "learned",
        "value_embeddings": arch.value_embeddings is not None,
        "lm_head": not arch.tied_embeddings,
        "block_matrices": True,
        "ve_gates": arch.value_embeddings is not None,
        "smear_gate": arch.smear_gate_in_features is not None,
        "norms": arch.norm_learnable,
        "biases": arch.linear_bias or arch.qkv_bias,
        "scalars": arch.scalars_per_layer + arch.scalars_global > 0,
        "experts": arch.moe is not None,
        "router": arch.moe is not None,
    }
    return [g for g in PARAM_GROUPS if has[g]]


# --------------------------------------------------------------------------------------------
# nanochat's depth rule

_NANOCHAT_NAME = re.compile(r"^(?:nanochat-)?d(\d+)$")


def nanochat_depth(name: str) -> int | None:
    """The depth in a nanochat model name (`d24`, `nanochat-d24`), or None if it is not one."""
    m = _NANOCHAT_NAME.match(name)
    return int(m.group(1)) if m else None


def nanochat_dims(depth: int, aspect_ratio: int = 64, head_dim: int = 128) -> tuple[int, int]:
    """(d_model, num_heads) for a nanochat depth: d_model = ceil(depth*aspect/head_dim)*head_dim.

    Ref: nanochat scripts/base_train.py `build_model_meta` (aspect_ratio 64, head_dim 128).
    """
    if depth <= 0:
        raise ValueError(f"depth must be positive, got {depth}")
    d_model = math.ceil(depth * aspect_ratio / head_dim) * head_dim
    return d_model, d_model // head_dim


WEIGHTS = ("fp32", "master", "remainder")  # how the weights are kept (run_variant)
MOMENTS = typing.get_args(Moments)  # AdamW's moments' dtypes (run_variant)
GRADS = typing.get_args(Grads)  # how gradients are kept and reduced (Dtypes.grads)
CROSS_ENTROPY = typing.get_args(CrossEntropy)  # the loss kernels (Recipe.cross_entropy)
MOE_WEIGHTING = typing.get_args(MoeWeighting)  # where routed copies are weighted (Recipe.moe_weighting)
FUSIONS = typing.get_args(Fusions)  # how a block's norms, rotary embedding and SwiGLU run (Recipe.fusions)
# the Recipe's kernel fields (how the stack runs the loss, the MoE weighting, the block's pointwise ops), which a
# framework profile may set and run_variant replaces: field -> its values
FP8_WEIGHT_CASTS = typing.get_args(Fp8WeightCasts)  # how often an fp8 weight is cast (Recipe.fp8_weight_casts)
KERNELS: dict[str, tuple[str, ...]] = {"cross_entropy": CROSS_ENTROPY, "moe_weighting": MOE_WEIGHTING,
                                       "fusions": FUSIONS, "fp8_weight_casts": FP8_WEIGHT_CASTS}


def run_variant(spec: ModelSpec, *, seq_len: int | None = None, dtype: str | None = None,
                grads: str | None = None, load_imbalance: float | None = None,
                weights: str | None = None, cross_entropy: str | None = None,
                moe_weighting: str | None = None, fusions: str | None = None,
                fp8_weight_casts: str | None = None, moments: str | None = None) -> ModelSpec:
    """The model as one run trains it: another sequence length and/or compute dtype.

    seq_len: the recipe's sequence length (at most architecture.max_seq_len); the total batch in tokens
    stays the recipe's where it divides, else the nearest whole number of device batches (d24 at 1,000
    tokens: 1,056,000 = 33 x 32 sequences, not 1,049, a prime). dtype: bf16/fp16
    change the compute dtype only (master weights keep theirs); fp32 runs everything in fp32 (what
    `ddplan calibrate` measures on a CPU). grads: the gradients' dtype, "param" (each parameter's own:
    Megatron's --grad-reduce-in-bf16) or "fp32" (Megatron's default main_grads, nanochat's fp32 masters).
    load_imbalance: a dropless mixture-of-experts model's MoE.load_imbalance (1: forced balance).
    weights: how the weights are kept, applied after dtype. "fp32": every group in fp32, no master copy (torch
    autocast or FSDP mixed precision cast them to the compute dtype each forward); "master": every group in the
    16-bit compute dtype with an fp32 master copy in the optimizer, whose AdamW states are fp32 (Megatron-LM's
    --bf16/--fp16: Float16Module, megatron/core/transformer/module.py@d98e8a6 L479, and
    Float16OptimizerWithFloat16Params' "fp32 copy of float16 parameters", megatron/core/optimizer/optimizer.py
    L964-996; DeepSpeed's bf16/fp16 optimizers, ZeRO arXiv 1910.02054 sec. 3.1). With an fp32 compute dtype
    "master" is "fp32". "remainder": as "master", the master copy keeping only the 16 bits a bf16 weight lacks, 2
    bytes (Transformer Engine FusedAdam store_param_remainders, on by default under Megatron-Core's
    --use-precision-aware-optimizer: optimizer_config.py@d98e8a64 L192; kept where it can be, bf16 weights under the
    distributed optimizer, Optimizer.adamw_bytes; ddplan.inputs.variant refuses it given for fp16 or fp32 weights).
    moments: the dtype of AdamW's two moments (Optimizer.adamw_state_dtype, MOMENTS), applied after weights.
    cross_entropy: the loss kernel
    (Recipe.cross_entropy, CROSS_ENTROPY). moe_weighting: where a mixture of experts weights its routed copies
    (Recipe.moe_weighting, MOE_WEIGHTING; a dense model takes it and is unchanged, as a stack's profile applies it to
    any model). fusions: how the block's norms, rotary embedding and SwiGLU run (Recipe.fusions, FUSIONS).
    fp8_weight_casts: how often an fp8 weight is cast (Recipe.fp8_weight_casts, FP8_WEIGHT_CASTS; a run without fp8
    takes it and is unchanged).
    Raises ValueError naming the value when it cannot be.
    """
    if seq_len is not None and seq_len != spec.recipe.seq_len:
        if not 0 < seq_len <= spec.architecture.max_seq_len:
            raise ValueError(f"sequence length must be in 1..{spec.architecture.max_seq_len} "
                             f"({spec.name}'s max_seq_len), got {seq_len}")
        tokens = spec.recipe.total_batch_tokens
        if tokens % seq_len:  # the nearest whole number of device batches of the new length
            unit = seq_len * spec.recipe.device_batch_size
            tokens = max(1, round(tokens / unit)) * unit
        spec = spec.model_copy(update={"recipe": spec.recipe.model_copy(
            update={"seq_len": seq_len, "total_batch_tokens": tokens})})
    if dtype is not None and dtype != spec.dtypes.compute:
        if dtype not in ("bf16", "fp16", "fp32"):
            raise ValueError(f"compute dtype must be bf16, fp16 or fp32, got {dtype!r}")
        update: dict = {"compute": dtype}
        if dtype == "fp32":
            update.update(logits="fp32", params={g: "fp32" for g in spec.dtypes.params})
        spec = spec.model_copy(update={"dtypes": spec.dtypes.model_copy(update=update)})
    if grads is not None and grads != spec.dtypes.grads:
        if grads not in GRADS:
            raise ValueError(f"gradient dtype must be one of {', '.join(GRADS)}, got {grads!r}")
        spec = spec.model_copy(update={"dtypes": spec.dtypes.model_copy(update={"grads": grads})})
    if weights is not None:
        if weights not in WEIGHTS:
            raise ValueError(f"weights must be {' or '.join(WEIGHTS)}, got {weights!r}")
        master = weights in ("master", "remainder") and spec.dtypes.compute != "fp32"
        kept = spec.dtypes.compute if master else "fp32"
        opt = spec.recipe.optimizer
        opt = opt.model_copy(update={"master_weights": master, "master_remainder": weights == "remainder",
                                     "adamw_state_dtype": "fp32" if master else opt.adamw_state_dtype})
        spec = spec.model_copy(update={
            "dtypes": spec.dtypes.model_copy(update={"params": dict.fromkeys(spec.dtypes.params, kept)}),
            "recipe": spec.recipe.model_copy(update={"optimizer": opt})})
    if moments is not None and moments != spec.recipe.optimizer.adamw_state_dtype:
        if moments not in MOMENTS:
            raise ValueError(f"moments must be {' or '.join(MOMENTS)}, got {moments!r}")
        opt = spec.recipe.optimizer.model_copy(update={"adamw_state_dtype": moments})
        spec = spec.model_copy(update={"recipe": spec.recipe.model_copy(update={"optimizer": opt})})
    for name, value in (("cross_entropy", cross_entropy), ("moe_weighting", moe_weighting), ("fusions", fusions),
                        ("fp8_weight_casts", fp8_weight_casts)):
        if value is not None and value != getattr(spec.recipe, name):
            if value not in KERNELS[name]:
                raise ValueError(f"{name.replace('_', ' ')} must be {' or '.join(KERNELS[name])}, got {value!r}")
            spec = spec.model_copy(update={"recipe": spec.recipe.model_copy(update={name: value})})
    if load_imbalance is not None:
        moe = spec.architecture.moe
        if moe is None:
            raise ValueError(f"{spec.name} is a dense model; a load imbalance is for mixture-of-experts routing")
        if moe.capacity_factor is not None:
            raise ValueError(f"{spec.name} pads its experts to capacity factor {moe.capacity_factor:g}; a load "
                             f"imbalance is for dropless routing")
        if not 1 <= load_imbalance <= 64:
            raise ValueError(f"load imbalance must be in [1, 64] (busiest rank's rows over the mean), "
                             f"got {load_imbalance}")
        arch = spec.architecture.model_copy(update={"moe": moe.model_copy(update={"load_imbalance": load_imbalance})})
        spec = spec.model_copy(update={"architecture": arch})
    return spec
