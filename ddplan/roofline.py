"""Roofline time of each op: the longer of its compute time and its memory time, plus launch overhead.

    t(op) = max(FLOPs / (peak x efficiency(kind, shape)), bytes / (HBM bandwidth x HBM efficiency))
            + kernel overhead

Ref: Williams, Waterman & Patterson, "Roofline", CACM 2009. Efficiencies come from the hardware spec
(assumed or measured, each with a low-high range) or from a calibration file; `Rates` resolves them
for one scenario so the same code gives the central prediction and both ends of its band.

Attention convention (shared with the hardware specs' efficiencies, see hardware/*.yaml headers):
the efficiency is a fraction of dense bf16 peak on the *causal* FLOPs of the window the kernel
processes (4 b h d pairs forward, 8 b h d pairs backward, pairs = causal pairs within that window);
work a kernel wastes on masked-out entries (unfused math computes all s^2; a sliding window given as
an explicit mask processes the full window) and flash's backward recompute are inside the efficiency.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ddplan.anatomy import RECOMPUTE_POLICIES, UNFUSED_KINDS, Anatomy, Op, attention_pairs, recomputed_under
from ddplan.fp8 import FP8_RECIPES, FP8_WGRAD_HIGH_PRECISION, fp8_cast_bytes, fp8_cast_launches, fp8_eligible
from ddplan.specs import Efficiency, HardwareSpec
from ddplan.units import US

# "value" (central), "low" (every efficiency at its low end: slow), "high" (fast), or a float t in [0, 1]:
# every efficiency at low + t (high - low), for finer bands when a measurement rules out an end
Scenario = str | float
SCENARIOS = ("value", "low", "high")
FIT_SCENARIOS = ("value", 0.0, 0.25, 0.5, 0.75, 1.0)


def comm_end(scenario: Scenario) -> str:
    """The communication efficiency end matching a scenario (comm.tier_for takes value/low/high)."""
    if isinstance(scenario, str):
        return scenario
    return "low" if scenario < 0.5 else "high" if scenario > 0.5 else "value"

# torch.compile fuses chains of pointwise ops into single kernels that read their inputs and write
# their outputs once: assumed to halve pointwise/reduction traffic and kernel launches (Inductor
# fuses e.g. RMSNorm + residual + cast; a measured profile replaces this once calibrated).
COMPILED_POINTWISE_FRACTION = 0.5


# Fitted to H100 forward TFLOP/s at sequence 512-16,384 (B x S = 16k, H x D = 2048, head dim 128;
# pytorch/benchmark commit ff65cb67, PR #2391, test plan): 233.8 for FA3, 243.7 for the Triton tutorial's
# FA2; at 240 both are within 1.1% at every length (tests/test_roofline.py refits them)
FLASH_SEQ_HALF = 240.0


@dataclass(frozen=True)
class Rates:
    """Resolved hardware rates and efficiencies for one scenario (SI units)."""

    peak_flops_per_s: float  # dense bf16 (or the compute dtype's) peak
    vector_flops_per_s: float  # fp32 non-tensor peak, for pointwise math
    hbm_bytes_per_s: float
    gemm_best: float
    gemm_half_dim: float
    hbm: float
    attn_fwd: float
    attn_bwd: float
    kernel_overhead_s: float
    gemm_overhead_s: float | None = None  # fixed cost of one GEMM call (None: kernel_overhead_s)
    fp8_flops_per_s: float | None = None  # set when eligible GEMMs run in fp8
    gemm_best_fp8: float = 0.0
    fp8_recipe: str = "tensorwise"  # how the casts run (FP8_RECIPES)
    fp8_lm_head: bool = False  # the recipe converts the LM head too (nanochat); else it stays in the compute dtype
    # > 0: the weights arrive in fp8 from a ZeRO-3 all-gather over this many ranks (torchao's
    # enable_fsdp_float8_all_gather), cast on the shard before each gather; fp8_gathers: gathers per micro-batch
    fp8_weight_shards: int = 0
    fp8_gathers: int = 2
    # micro-batches one fp8 weight cast serves (the step's, where the stack caches it: Recipe.fp8_weight_casts)
    fp8_weight_reuse: int = 1
    fp8_weights_fp8: bool = False  # the weights are kept in fp8 (Layout.fp8_params): not cast, only transposed
    # measured points from a calibration file replace the curves: (m, n, k, fraction of peak) and
    # (batch x heads, seq, processed window, head_dim, fwd fraction, bwd fraction)
    gemm_points: tuple[tuple[int, int, int, float], ...] = ()
    attention_points: tuple[tuple[int, int, int, int, float, float], ...] = ()
    gemm_scale: float = 1.0  # the fitted knob's factor when the GEMM efficiency comes from points
    attention_scale: float = 1.0
    # fused attention (flash, PyTorch's fused SDPA): its speed follows attention_seq_factor in the keys a
    # call visits, from the spec's measured_seq_len (attn_reference_seq; 0: the spec states none) or from
    # a calibration's measured point; unfused math kernels do not
    attn_seq_curve: bool = False
    attn_reference_seq: int = 0
    attn_seq_half: float = FLASH_SEQ_HALF  # the kernel's saturation length (AttentionImpl.seq_half)
    pointwise_bytes_per_s: float | None = None  # measured rate of elementwise ops (replaces HBM x eff)
    pointwise_compiled: bool = False  # that rate measured torch.compile'd: the anatomy's bytes over fused kernels' time
    pointwise_fwd_bytes_per_s: float | None = None  # the same measurement's forward and backward apart
    pointwise_bwd_bytes_per_s: float | None = None  # (None: pointwise_bytes_per_s for both)
    optimizer_bytes_per_s: float | None = None  # measured AdamW rate (replaces HBM x eff for the optimizer)
    muon_points: tuple[tuple[int, int, int, float], ...] = ()  # measured Muon steps: (rows, cols, count, seconds)
    # fraction of its rate compute keeps while a collective overlaps it (Efficiencies.overlapped_compute; 1: free)
    overlapped_compute: float = 1.0

    def scaled(self, knob: str, factor: float) -> Rates:
        """These rates with one knob's efficiency multiplied by factor (the calibration fit)."""
        gemm = dict(gemm_best=self.gemm_best * factor, gemm_best_fp8=self.gemm_best_fp8 * factor,
                    gemm_scale=self.gemm_scale * factor)
        attn = dict(attn_fwd=self.attn_fwd * factor, attn_bwd=self.attn_bwd * factor,
                    attention_scale=self.attention_scale * factor)
        if knob == "gemm":
            return replace(self, **gemm)
        if knob == "attention":
            return replace(self, **attn)
        if knob == "compute":
            return replace(self, **gemm, **attn)
        raise ValueError(f"unknown knob {knob!r}; allowed: gemm, attention, compute")


def pick(eff: Efficiency, scenario: Scenario) -> float:
    """One end of an efficiency's range: value, low or high."""
    if scenario == "value":
        return eff.value
    lo, hi = eff.range
    if isinstance(scenario, (int, float)):
        if not 0 <= scenario <= 1:
            raise ValueError(f"a fractional scenario must be in [0, 1], got {scenario}")
        return lo + scenario * (hi - lo)
    return lo if scenario == "low" else hi


def best_gemm(best: Efficiency, sustained: Efficiency | None, scenario: Scenario) -> float:
    """The best GEMM efficiency a scenario takes: its end of the range (pick), or its value wherever the fraction
    training keeps of it (`sustained`) is fitted to measured runs. That fraction was fitted at the best rate's value,
    so it already holds what real shapes and real training lose against the best-shape MAMF (the range's low end,
    0.8 x, says "real training shapes"); taking both ends would count that loss twice. The fit's own uncertainty is
    the out-of-sample spread of measured / predicted (ddplan validate), which the band takes. An assumed fraction (a GPU
    without runs to fit: the fitted GPUs' geometric mean) keeps the range: how this GPU's real shapes fare against its
    own MAMF is unmeasured, and the fitted GPUs' spread is not its own. e.g. A100 (best 0.869, low 0.695, sustained
    fitted): the low scenario takes 0.869; B200 (sustained assumed): 0.8 x its value."""
    if sustained is not None and sustained.basis == "fitted":
        return best.value
    return pick(best, scenario)


def rates(hw: HardwareSpec, attention: str, scenario: Scenario = "value", dtype: str = "bf16",
          fp8: bool = False, fp8_recipe: str = "tensorwise", fp8_lm_head: bool = False,
          fp8_stack: float = 1.0) -> Rates:
    """Rates for the named attention implementation on this hardware, at one end of the ranges.

    fp8: eligible GEMMs (fp8_eligible) run at the dense fp8 peak x the fp8 GEMM efficiency (the bf16 fraction
    where no fp8 measurement exists) x the fraction fp8 training keeps (`sustained_fp8`, fitted on fp8 runs, times
    fp8_stack, what the run's stack keeps of it: ddplan.fp8.fp8_stack_factor; the 16-bit `sustained` where the spec
    has no fp8 fit, fp8_stack not applied), with the recipe's casts (fp8_cast_bytes); attention and everything else
    stay in the compute dtype.
    """
    if fp8_recipe not in FP8_RECIPES:
        raise ValueError(f"fp8 recipe must be one of {FP8_RECIPES}, got {fp8_recipe!r}")
    if scenario not in SCENARIOS and not isinstance(scenario, (int, float)):
        raise ValueError(f"scenario must be one of {SCENARIOS} or a fraction in [0, 1], got {scenario!r}")
    impl = hw.attention_impl(attention)
    e = hw.efficiency
    fp8_best = e.gemm.best_fp8 or e.gemm.best
    kept = pick(e.gemm.sustained, scenario) if e.gemm.sustained is not None else 1.0
    kept_fp8 = pick(e.gemm.sustained_fp8, scenario) * fp8_stack if e.gemm.sustained_fp8 is not None else kept
    return Rates(
        peak_flops_per_s=hw.peak.flops_per_s(dtype),
        vector_flops_per_s=hw.peak.fp32_vector_tflops.value * 1e12,
        hbm_bytes_per_s=hw.memory.hbm_bytes_per_s,
        gemm_best=best_gemm(e.gemm.best, e.gemm.sustained, scenario) * kept,
        gemm_half_dim=e.gemm.half_dim.value,
        hbm=pick(e.hbm, scenario),
        attn_fwd=pick(impl.efficiency_fwd, scenario),
        attn_bwd=pick(impl.efficiency_bwd, scenario),
        kernel_overhead_s=e.kernel_overhead_us.value * US,
        gemm_overhead_s=e.gemm.fixed_us.value * US if e.gemm.fixed_us else None,
        fp8_flops_per_s=hw.peak.flops_per_s("fp8") if fp8 else None,
        gemm_best_fp8=best_gemm(fp8_best, e.gemm.sustained_fp8 or e.gemm.sustained, scenario) * kept_fp8,
        fp8_recipe=fp8_recipe,
        fp8_lm_head=fp8_lm_head,
        attn_seq_curve=impl.kind in FUSED_KINDS,
        attn_reference_seq=(impl.measured_seq_len or 0) if impl.kind in FUSED_KINDS else 0,
        attn_seq_half=impl.seq_half or FLASH_SEQ_HALF,
        overlapped_compute=pick(e.overlapped_compute, scenario) if e.overlapped_compute is not None else 1.0,
    )


# Fused attention kernels (flash, PyTorch's fused SDPA) whose speed follows attention_seq_factor
FUSED_KINDS = ("fused_sdpa", "flash_package")


def attention_seq_factor(kv_len: int, reference_seq: int, seq_half: float = FLASH_SEQ_HALF) -> float:
    """A fused attention kernel's efficiency at kv_len keys per query relative to its efficiency at
    reference_seq: g(kv_len) / g(reference_seq), g(s) = s / (s + seq_half).

    Each query block pays a fixed cost (loading Q, the softmax rescale and the output epilogue) against
    work that grows with the keys it visits, so throughput saturates with the sequence: FA3 on H100
    runs 430 TFLOP/s at 512 and 621 at 16,384, a x s / (s + 240) within 1.1% (pytorch/benchmark ff65cb67).
    Assumed the same for backward and for every fused kernel and GPU; head dim is not a variable (no
    published sweep of it was at hand). Ref: Dao, arXiv 2307.08691, sec. 3 (per-block work).
    """
    if kv_len <= 0 or reference_seq <= 0 or seq_half <= 0:
        raise ValueError(f"need positive kv_len, reference_seq, seq_half; got {kv_len}, {reference_seq}, {seq_half}")
    return (kv_len / (kv_len + seq_half)) / (reference_seq / (reference_seq + seq_half))


def gemm_efficiency(m: int, n: int, k: int, best: float, half_dim: float) -> float:
    """Fraction of peak a GEMM of shape (m x k) @ (k x n) reaches: best x prod_d d / (d + half_dim).

    A saturating curve: large dimensions reach the device's best measured rate (MAMF, best shape);
    a dimension equal to half_dim halves it (tile quantisation and too few tiles to fill the device).
    Ref: the shape dependence measured by stas00 ml-engineering MAMF finder (compute/accelerator
    README) and Azure's GEMM sweeps (hardware.md 2.1); the curve itself is ddplan's assumption,
    replaced by measured points once `ddplan calibrate` has run.
    """
    if min(m, n, k) <= 0 or best <= 0 or half_dim <= 0:
        raise ValueError(f"need positive m, n, k, best, half_dim; got {m}, {n}, {k}, {best}, {half_dim}")
    shape = 1.0
    for d in (m, n, k):
        shape *= d / (d + half_dim)
    return best * shape


def nearest(points: tuple[tuple, ...], key: tuple[int, ...]) -> tuple:
    """The measured point whose leading coordinates are closest to key in log space (shapes scale)."""
    import math

    def dist(p: tuple) -> float:
        return sum((math.log(a) - math.log(b)) ** 2 for a, b in zip(p[:len(key)], key))

    return min(points, key=dist)


def gemm_fraction(m: int, n: int, k: int, r: Rates) -> float:
    """Fraction of peak for a GEMM shape: the nearest measured shape if calibrated, else the curve."""
    if r.gemm_points:
        return nearest(r.gemm_points, (m, n, k))[3] * r.gemm_scale
    return gemm_efficiency(m, n, k, r.gemm_best, r.gemm_half_dim)


def gemm_call_s(r: Rates, fp8: bool = False) -> float:
    """Seconds one GEMM call costs beyond its work. On the efficiency curve: the fixed cost fitted with it
    to a published sweep, else the kernel overhead of every kernel. At a calibration's measured GEMM rates
    (16-bit GEMMs when r.gemm_points), timed call by call, the kernel overhead, as before the sweeps; fp8
    GEMMs are always on the curve. Ref: ddplan.sweeps (validation/gemm_sweeps.yaml)."""
    if r.gemm_overhead_s is None or (r.gemm_points and not fp8):
        return r.kernel_overhead_s
    return r.gemm_overhead_s


# Transformer Engine runs a grouped GEMM (GroupedLinear, which Megatron-Core's --moe-grouped-gemm uses) as
# one cuBLAS GEMM per local expert, GEMM i on compute stream i mod 4: nvte_multi_stream_cublas_gemm
# (transformer_engine/common/gemm/cublaslt_gemm.cu) over get_num_compute_streams() = 4
# (transformer_engine/common/util/multi_stream.cpp @3e125d69, NVIDIA/TransformerEngine)
GROUPED_GEMM_STREAMS = 4


def grouped_call_waves(calls: int, streams: int = GROUPED_GEMM_STREAMS) -> int:
    """How many GEMM calls' fixed costs one pass of a grouped GEMM waits for: its `calls` GEMMs (one a local
    expert) go round-robin over `streams` concurrent streams, so the busiest stream runs ceil(calls / streams)
    of them one after another; their work shares the GPU and is priced once, at the whole op's FLOPs. One
    call for an ordinary GEMM. e.g. 32 local experts on 4 streams: 8. GPU-side only: the host still issues
    every launch one after another (host cost is not priced), and an fp8 grouped GEMM's casts keep one launch
    each (FP8_CAST_LAUNCHES), not one a GEMM. Ref: GROUPED_GEMM_STREAMS."""
    if calls < 1 or streams < 1:
        raise ValueError(f"need calls, streams >= 1; got {calls}, {streams}")
    return -(-calls // streams)


def gemm_forward_s(m: int, n: int, k: int, flops: float, bytes_moved: float, r: Rates) -> float:
    """Seconds of one GEMM call (m x k) @ (k x n) doing `flops` (2 m n k for one GEMM): the roofline at the
    shape's efficiency plus the call's fixed cost. A forward GEMM is priced so; a sweep of single GEMMs
    measures exactly this (ddplan.sweeps).
    Ref: Williams et al., CACM 2009 (roofline); the call cost as fitted in ddplan.sweeps."""
    rate = r.peak_flops_per_s * gemm_fraction(m, n, k, r)
    return roofline_s(flops, bytes_moved, rate, r.hbm_bytes_per_s * r.hbm) + gemm_call_s(r)


def roofline_s(flops: float, bytes_moved: float, flops_per_s: float, bytes_per_s: float) -> float:
    """max(FLOPs / FLOP rate, bytes / byte rate), seconds. Ref: Williams et al., CACM 2009."""
    if flops < 0 or bytes_moved < 0 or flops_per_s <= 0 or bytes_per_s <= 0:
        raise ValueError(f"need flops, bytes >= 0 and rates > 0; got {flops}, {bytes_moved}, {flops_per_s}, "
                         f"{bytes_per_s}")
    return max(flops / flops_per_s, bytes_moved / bytes_per_s)


def processed_window(op: Op, anatomy: Anatomy) -> int:
    """Keys per query the kernel computes: the whole sequence for unfused math and for a window given as an
    explicit mask (computed in full), else the window."""
    _, _, s, window, _ = op.shape
    return s if (anatomy.attention in UNFUSED_KINDS or anatomy.windows == "mask") else window


def keys_per_call(op: Op, anatomy: Anatomy) -> int:
    """Keys one kernel call visits per query, for the sequence curve: the processed window, at most the
    op's own sequence (under context parallelism a ring step attends to one s / cp chunk of keys)."""
    return min(processed_window(op, anatomy), op.shape[2])


def attention_efficiency_flops(op: Op, anatomy: Anatomy) -> tuple[float, float]:
    """(forward, backward) attention FLOPs in the efficiency convention: causal pairs of the processed window."""
    b, h, s, window, hd = op.shape
    processed = processed_window(op, anatomy)
    pairs = attention_pairs(s, processed, "flash_package", "native")
    # the unfused core is two ops (scores, probabilities @ v): each carries its share of the FLOPs
    executed = 4.0 * b * h * attention_pairs(s, window, anatomy.attention, anatomy.windows) * hd
    share = op.flops_fwd / executed if executed else 1.0
    return share * 4.0 * b * h * pairs * hd, share * 8.0 * b * h * pairs * hd


def op_time_s(op: Op, anatomy: Anatomy, r: Rates) -> tuple[float, float]:
    """(forward, backward) seconds of one op on the GPU the step waits for: its time at the op's shape
    (_op_time_s) x op.wait (the busiest rank's over the mean's; a routed expert's under dropless expert
    parallelism, ddplan.specs.MoE.imbalance). Simplified: the calls' fixed costs are scaled too, though the
    busiest rank runs no more GEMMs (grouped_call_waves: e.g. 8 calls, 37 us on GB200, against the 30B expert
    GEMM's 630 us at imbalance 1.52: the op comes out about 3% long), and the busier rank's larger m is taken
    at the mean m's efficiency."""
    f, b = _op_time_s(op, anatomy, r)
    return (f * op.wait, b * op.wait) if op.wait != 1 else (f, b)


def _op_time_s(op: Op, anatomy: Anatomy, r: Rates) -> tuple[float, float]:
    """(forward, backward) seconds of one op on one GPU."""
    bw = r.hbm_bytes_per_s * r.hbm
    if op.kind == "gemm":
        m, n, k = op.shape
        if r.fp8_flops_per_s and fp8_eligible(op, r.fp8_lm_head):
            # the GEMMs at the fp8 rate, after the recipe's casts (memory-bound kernels of their own) and launches
            rate = r.fp8_flops_per_s * gemm_efficiency(m, n, k, r.gemm_best_fp8, r.gemm_half_dim)
            cast_fwd, cast_bwd = fp8_cast_bytes(m, n, k, r.fp8_recipe, r.fp8_weight_shards, r.fp8_gathers,
                                                r.fp8_weight_reuse, r.fp8_weights_fp8)
            launch_fwd, launch_bwd = fp8_cast_launches(r.fp8_recipe, r.fp8_weight_reuse, r.fp8_weights_fp8)
            call = gemm_call_s(r, fp8=True) * grouped_call_waves(op.calls)
            bwd = roofline_s(op.flops_bwd, op.bytes_bwd, rate, bw)
            if r.fp8_recipe in FP8_WGRAD_HIGH_PRECISION:  # dW (k x m @ m x n) at the 16-bit rate
                half = op.flops_bwd / 2
                bwd = max(half / rate + half / (r.peak_flops_per_s * gemm_fraction(k, n, m, r)), op.bytes_bwd / bw)
            return (roofline_s(op.flops_fwd, op.bytes_fwd, rate, bw) + cast_fwd / bw
                    + call + launch_fwd * r.kernel_overhead_s,
                    bwd + cast_bwd / bw + 2 * call + launch_bwd * r.kernel_overhead_s)
        # backward is two GEMMs, dX (m x n @ n x k) and dW (k x m @ m x n): two launches, own shapes
        dx_rate = r.peak_flops_per_s * gemm_fraction(m, k, n, r)
        dw_rate = r.peak_flops_per_s * gemm_fraction(k, n, m, r)
        half = op.flops_bwd / 2
        bwd_compute = half / dx_rate + half / dw_rate
        # a grouped GEMM pays the fixed costs of the GEMMs on its busiest stream (grouped_call_waves)
        extra = (grouped_call_waves(op.calls) - 1) * gemm_call_s(r)
        return (gemm_forward_s(m, n, k, op.flops_fwd, op.bytes_fwd, r) + extra,
                max(bwd_compute, op.bytes_bwd / bw) + 2 * (gemm_call_s(r) + extra))
    if op.kind == "attention":
        f, b = attention_efficiency_flops(op, anatomy)
        eff_f, eff_b = r.attn_fwd, r.attn_bwd
        bb, h, s, window, hd = op.shape
        keys = keys_per_call(op, anatomy)
        if r.attention_points:  # measured at the model's shapes; other lengths along the curve from there
            point = nearest(r.attention_points, (bb * h, s, processed_window(op, anatomy), hd))
            g = attention_seq_factor(keys, min(point[2], point[1]), r.attn_seq_half) if r.attn_seq_curve else 1.0
            eff_f, eff_b = point[4] * r.attention_scale * g, point[5] * r.attention_scale * g
        elif r.attn_reference_seq:
            g = attention_seq_factor(keys, r.attn_reference_seq, r.attn_seq_half)
            eff_f, eff_b = eff_f * g, eff_b * g
        return (roofline_s(f, op.bytes_fwd, r.peak_flops_per_s * eff_f, bw) + r.kernel_overhead_s,
                roofline_s(b, op.bytes_bwd, r.peak_flops_per_s * eff_b, bw) + r.kernel_overhead_s)
    fused = COMPILED_POINTWISE_FRACTION if anatomy.compiled else 1.0
    overhead = r.kernel_overhead_s * fused
    if r.pointwise_bytes_per_s:  # measured: the rate already holds the ops' arithmetic
        fwd_rate = pointwise_rate(r.pointwise_fwd_bytes_per_s or r.pointwise_bytes_per_s, r.pointwise_compiled,
                                  anatomy.compiled)
        bwd_rate = pointwise_rate(r.pointwise_bwd_bytes_per_s or r.pointwise_bytes_per_s, r.pointwise_compiled,
                                  anatomy.compiled)
        return op.bytes_fwd / fwd_rate + overhead, op.bytes_bwd / bwd_rate + overhead
    return (roofline_s(op.flops_fwd, op.bytes_fwd * fused, r.vector_flops_per_s, bw) + overhead,
            roofline_s(op.flops_bwd, op.bytes_bwd * fused, r.vector_flops_per_s, bw) + overhead)


def wgrad_share(op: Op, r: Rates) -> float:
    """The share of an op's backward seconds that computes its weight's gradient (the zero-bubble schedules' W pass):
    a GEMM's dW against its dX, each at its own shape's rate (_op_time_s: two GEMMs of the same FLOPs), half of it
    in fp8 where both run at the fp8 rate, and dW at the 16-bit rate under the recipes that keep it there; 0 for
    every other op (attention, norms, activations, the loss: the paper's B, "backward for input"). A GEMM's fixed
    costs and any memory-bound floor split as its compute does.
    e.g. dX and dW at the same rate: 0.5.
    Ref: Qi et al., arXiv 2401.10241, sec. 2 (Figure 1, Table 1: B and W each hold one of a matmul's two backward
    matmuls of its forward's FLOPs)."""
    if op.kind != "gemm":
        return 0.0
    m, n, k = op.shape
    if r.fp8_flops_per_s and fp8_eligible(op, r.fp8_lm_head):
        if r.fp8_recipe not in FP8_WGRAD_HIGH_PRECISION:
            return 0.5
        dx = 1.0 / (r.fp8_flops_per_s * gemm_efficiency(m, n, k, r.gemm_best_fp8, r.gemm_half_dim))
        dw = 1.0 / (r.peak_flops_per_s * gemm_fraction(k, n, m, r))
    elif not r.gemm_points:  # on the curve dX and dW have the same three dimensions: the same rate
        return 0.5
    else:
        dx = 1.0 / (r.peak_flops_per_s * gemm_fraction(m, k, n, r))
        dw = 1.0 / (r.peak_flops_per_s * gemm_fraction(k, n, m, r))
    return dw / (dx + dw)


def pointwise_rate(measured_bytes_per_s: float, measured_compiled: bool, compiled: bool) -> float:
    """Bytes per second (the anatomy's unfused bytes) at which elementwise ops run, from a measured rate.

    A rate measured in the mode the step runs in is used as it is: a compiled measurement already holds
    what Inductor's fusion saves. Across modes the assumed fusion factor converts it: an eager rate runs
    1 / COMPILED_POINTWISE_FRACTION faster compiled, a compiled rate that much slower eager.
    """
    if measured_bytes_per_s <= 0:
        raise ValueError(f"need a positive rate, got {measured_bytes_per_s}")
    if measured_compiled == compiled:
        return measured_bytes_per_s
    return measured_bytes_per_s / COMPILED_POINTWISE_FRACTION if compiled else \
        measured_bytes_per_s * COMPILED_POINTWISE_FRACTION


@dataclass(frozen=True)
class MicroBatchTime:
    """Seconds of one micro-batch's forward and backward, and how they split by op kind."""

    fwd_s: float
    bwd_s: float
    by_kind_s: dict[str, float]
    recompute_s: float  # part of bwd_s spent re-running forward ops (recompute policy)
    wgrad_s: float = 0.0  # part of bwd_s computing the weights' gradients (the zero-bubble schedules' W: wgrad_share)

    @property
    def total_s(self) -> float:
        return self.fwd_s + self.bwd_s


HEAD_OPS = ("backout", "norm_f", "lm_head", "logits_cast", "logits_softcap", "cross_entropy")


@dataclass(frozen=True)
class OpTimes:
    """Every op's time summed by part of the model (layers, embeddings, head), once per anatomy and
    rates: pipeline stages and recompute policies then combine sums instead of re-walking the ops."""

    fwd: dict[str, float]
    bwd: dict[str, float]
    again: dict[tuple[str, str], float]  # (part, policy) -> forward time re-run in backward
    by_kind: dict[tuple[str, str], float]  # (part, kind) -> forward + backward
    fwd_by_kind: dict[tuple[str, str], float]  # (part, kind) -> forward
    again_by_kind: dict[tuple[str, str, str], float]  # (part, policy, kind)
    wgrad: dict[str, float]  # part -> the backward's weight-gradient seconds (wgrad_share)
    # micro_batch_time's results on these sums, by (policy, layer fraction, embeddings, head): pipeline layouts
    # of a search ask for the same few stages thousands of times
    memo: dict = field(default_factory=dict, init=False, compare=False, repr=False)  # a replace() starts empty


def _part(op: Op) -> str:
    if op.layer is not None:
        return "layers"
    return "head" if op.name in HEAD_OPS else "embeddings"


def op_times(anatomy: Anatomy, r: Rates) -> OpTimes:
    """Per-part sums of op times (the recompute policy of the anatomy is not applied here)."""
    fwd: dict[str, float] = {}
    bwd: dict[str, float] = {}
    again: dict[tuple[str, str], float] = {}
    by_kind: dict[tuple[str, str], float] = {}
    fwd_by_kind: dict[tuple[str, str], float] = {}
    again_by_kind: dict[tuple[str, str, str], float] = {}
    wgrad: dict[str, float] = {}
    # every named policy (a search's shares one OpTimes), and the anatomy's own per-module one (full:N: after)
    own = anatomy.recompute not in RECOMPUTE_POLICIES and not anatomy.by_layers
    policies = RECOMPUTE_POLICIES[1:] + ((anatomy.recompute,) if own else ())
    reruns = [(policy, anatomy.reruns(policy)) for policy in policies]
    for i, (op, n) in enumerate(anatomy.op_repeats):  # the blocks' repeats priced once (Anatomy.op_repeats)
        part = _part(op)
        f, b = op_time_s(op, anatomy, r)
        f, b = n * f, n * b
        fwd[part] = fwd.get(part, 0.0) + f
        bwd[part] = bwd.get(part, 0.0) + b
        if op.kind == "gemm":
            wgrad[part] = wgrad.get(part, 0.0) + b * wgrad_share(op, r)
        by_kind[(part, op.kind)] = by_kind.get((part, op.kind), 0.0) + f + b
        fwd_by_kind[(part, op.kind)] = fwd_by_kind.get((part, op.kind), 0.0) + f
        for policy, rerun in reruns:
            if rerun[i]:
                again[(part, policy)] = again.get((part, policy), 0.0) + f
                key = (part, policy, op.kind)
                again_by_kind[key] = again_by_kind.get(key, 0.0) + f
    if anatomy.by_layers:  # full:N re-runs some layers whole (Anatomy.layers_again per kind of block), no other op
        policy = anatomy.recompute
        for ops, layers in zip(anatomy.blocks, anatomy.layers_again):
            for op in ops:
                if layers and recomputed_under(op, "full"):
                    part, f = _part(op), layers * op_time_s(op, anatomy, r)[0]
                    again[(part, policy)] = again.get((part, policy), 0.0) + f
                    key = (part, policy, op.kind)
                    again_by_kind[key] = again_by_kind.get(key, 0.0) + f
    return OpTimes(fwd=fwd, bwd=bwd, again=again, by_kind=by_kind, fwd_by_kind=fwd_by_kind,
                   again_by_kind=again_by_kind, wgrad=wgrad)


def micro_batch_time(anatomy: Anatomy, r: Rates, layer_fraction: float = 1.0,
                     include_embeddings: bool = True, include_head: bool = True,
                     parts: OpTimes | None = None) -> MicroBatchTime:
    """Forward + backward of one micro-batch; a pipeline stage takes a fraction of the layers.

    Recompute re-runs forward ops inside backward: the whole block under full recompute, the
    attention core under selective (Korthikanti et al., arXiv 2205.05198, sec. 5). `parts` (from
    op_times, for these rates and ops) skips walking the ops again.
    """
    parts = op_times(anatomy, r) if parts is None else parts
    key = (anatomy.recompute, layer_fraction, include_embeddings, include_head)
    if key not in parts.memo:
        parts.memo[key] = _micro_batch_time(parts, *key)
    return parts.memo[key]


def _micro_batch_time(parts: OpTimes, policy: str, layer_fraction: float, include_embeddings: bool,
                      include_head: bool) -> MicroBatchTime:
    """micro_batch_time's sums: each part's times times its share, added in the order layers, embeddings, head."""
    layers, emb, head = layer_fraction, 1.0 if include_embeddings else 0.0, 1.0 if include_head else 0.0
    shares = {"layers": layers, "embeddings": emb, "head": head}
    fwd, bwd, again = parts.fwd, parts.bwd, parts.again
    fwd_s = layers * fwd.get("layers", 0.0) + emb * fwd.get("embeddings", 0.0) + head * fwd.get("head", 0.0)
    rec = (layers * again.get(("layers", policy), 0.0) + emb * again.get(("embeddings", policy), 0.0)
           + head * again.get(("head", policy), 0.0))
    bwd_s = layers * bwd.get("layers", 0.0) + emb * bwd.get("embeddings", 0.0) + head * bwd.get("head", 0.0) + rec
    by_kind: dict[str, float] = {}
    for (p, kind), v in parts.by_kind.items():
        by_kind[kind] = by_kind.get(kind, 0.0) + shares[p] * v
    # the policy's re-runs by (part, kind), in again_by_kind's order: kept in memo (each policy is asked for at
    # every pipeline stage and degree)
    rerun = parts.memo.get(("again by kind", policy))
    if rerun is None:
        rerun = parts.memo[("again by kind", policy)] = [(p, kind, v) for (p, pol, kind), v in
                                                         parts.again_by_kind.items() if pol == policy]
    for p, kind, v in rerun:
        by_kind[kind] = by_kind.get(kind, 0.0) + shares[p] * v
    wgrad = parts.wgrad
    wgrad_s = layers * wgrad.get("layers", 0.0) + emb * wgrad.get("embeddings", 0.0) + head * wgrad.get("head", 0.0)
    return MicroBatchTime(fwd_s=fwd_s, bwd_s=bwd_s, by_kind_s=by_kind, recompute_s=rec, wgrad_s=wgrad_s)
