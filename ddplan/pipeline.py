"""Pipeline parallelism: the bubble under its two conventions, the zero-bubble schedules' bubble, and
point-to-point activation bytes.

p pipeline stages (devices), m micro-batches per step, v model chunks per device (interleaved
schedule; v = 1 is GPipe / 1F1B). Two conventions for the same bubble, named in every function:
- fraction of step: bubble / (ideal + bubble) = (p-1) / (v m + p - 1), always in [0, 1);
- over ideal (Megatron's): bubble / ideal = (p-1) / (v m), unbounded for small m.
The zero-bubble schedules (Qi et al., arXiv 2401.10241) split backward into B (the input gradients) and W (the
weights'), and their bubble is a time in those passes' terms (zero_bubble_time_s).
"""

from __future__ import annotations

import functools
import math


@functools.lru_cache(maxsize=1024)  # memory and step ask for the same few splits for every layout of a search
def stage_layers(num_layers: int, p: int) -> tuple[int, int, int]:
    """(first, middle, last) stage layer counts when `num_layers` are split over p pipeline stages.

    Even when p divides them. Otherwise the middle stages take ceil(L / p) each and the first and last
    stages, which also hold the embeddings and the head, share what remains (the first the smaller half):
    Llama 3 405B's 126 layers over 16 stages are 7, 8 x 14, 7 (Dubey et al., arXiv 2407.21783, sec. 3.3.2:
    "reduce one Transformer layer each from the first and the last stages"); BLOOM's 70 over 12 are
    5, 6 x 10, 5 (DeepSpeed's partition by transformer layers and embeddings, bigscience tr11-176B-ml).
    p = 2: (ceil, -, floor) of L / 2; an odd layer goes to the first stage (the head is usually heavier
    than the embeddings). Megatron-LM sets the same with --decoder-first-pipeline-num-layers
    and --decoder-last-pipeline-num-layers. ValueError when an end stage would hold no layer.
    e.g. (126, 16) -> (7, 8, 7); (70, 12) -> (5, 6, 5); (24, 4) -> (6, 6, 6); (9, 2) -> (5, 5, 4).
    """
    if num_layers < 1 or p < 1:
        raise ValueError(f"need num_layers and p >= 1, got {num_layers}, {p}")
    if num_layers % p == 0:
        n = num_layers // p
        return n, n, n
    if p == 2:
        return num_layers - num_layers // 2, num_layers - num_layers // 2, num_layers // 2
    middle = -(-num_layers // p)
    rest = num_layers - (p - 2) * middle
    first, last = rest - rest // 2, rest // 2  # the odd layer to the first: the head is the heavier end
    if last < 1:
        most = max(q for q in range(1, p) if q == 1 or num_layers - (q - 2) * -(-num_layers // q) >= 2)
        raise ValueError(f"{num_layers} layers over {p} pipeline stages leave an end stage with no layer; "
                         f"use pp <= {most}")
    return first, middle, last


def v_chunks(num_layers: int, p: int) -> list[int]:
    """Layers of each of ZB-V's 2p chunks, in model order: each stage d (chunks d and 2p - 1 - d) holds ceil(L / p)
    layers but the first, which holds what remains (it also runs the embeddings and the head, as stage_layers'
    short end stages do), possibly none, as the zero-bubble paper's fork pads its 30 layers over 32 chunks (Qi et
    al., arXiv 2401.10241, sec. 5.1); a stage's layers split over its two chunks, the first the larger half.
    ValueError naming the pp values near p that split, when the other stages alone need more layers than there are.
    e.g. (32, 4) -> [4] x 8; (126, 16) -> 3, 4 x 30, 3; (30, 16) -> 0, 1 x 30, 0; (80, 16): 5 a stage, in chunks of
    3 and 2."""
    if num_layers < 1 or p < 1:
        raise ValueError(f"need num_layers and p >= 1, got {num_layers}, {p}")
    per = -(-num_layers // p)
    first = num_layers - (p - 1) * per
    if first < 0:
        fits = [q for q in range(1, num_layers + 2) if num_layers >= (q - 1) * -(-num_layers // q)]
        below = max(q for q in fits if q < p)
        raise ValueError(f"{num_layers} layers over pp {p} under ZB-V leave the first stage fewer than none "
                         f"(ceil({num_layers} / {p}) = {per} on each other stage); the nearest pp below that splits: "
                         f"{below}")
    loads = [first] + [per] * (p - 1)
    out = [0] * (2 * p)
    for d, n in enumerate(loads):
        out[d], out[2 * p - 1 - d] = n - n // 2, n // 2
    return out


def v_stages(num_layers: int, p: int, dense_layers: int | None = None) -> list[tuple[int, int]]:
    """(layers, mixture-of-experts blocks) on each of p stages under ZB-V: stage d runs chunks d and 2p - 1 - d
    ("layers 1-2 and layers 15-16 to worker 1", Qi et al., arXiv 2401.10241, sec. 6; torch ScheduleZBVZeroBubble),
    so the first stage holds both end chunks, the embeddings and the head with them; the MoE blocks are the layers
    from dense_layers on (None: a dense model). e.g. (32, 4): 8 layers each; (30, 16): 0 on the first, 2 on each
    other; 48 layers, the first 12 dense, p 4: (12, 6), (12, 6), (12, 12), (12, 12)."""
    chunks = v_chunks(num_layers, p)
    starts = [sum(chunks[:c]) for c in range(len(chunks))]
    dense = num_layers if dense_layers is None else dense_layers
    out = []
    for d in range(p):
        spans = [(starts[c], starts[c] + chunks[c]) for c in (d, 2 * p - 1 - d)]
        out.append((sum(b - a for a, b in spans), sum(max(0, b - max(a, dense)) for a, b in spans)))
    return out


def moe_layers_by_stage(arch, p: int) -> list[int]:
    """Mixture-of-experts blocks on each of p pipeline stages (stage_layers' split; the dense_layers are the
    first ones, so they sit on the first stages). Dense models: zeros.
    e.g. 48 layers, the first 12 dense, p 4: [0, 12, 12, 12]."""
    first, middle, last = stage_layers(arch.num_layers, p) if p > 1 else (arch.num_layers,) * 3
    sizes = [first] if p == 1 else [first, *([middle] * (p - 2)), last]
    dense = arch.num_layers - arch.moe_layers  # the MoE blocks are layers dense.. (ModelArchitecture.is_moe_layer)
    out, start = [], 0
    for n in sizes:
        out.append(max(0, start + n - max(start, dense)))
        start += n
    return out


def _check_pmv(p: int, m: int, v: int) -> None:
    if type(p) is type(m) is type(v) is int and p >= 1 and m >= 1 and v >= 1:  # the common case, checked fast
        return
    bad = {k: x for k, x in (("p", p), ("m", m), ("v", v))
           if isinstance(x, bool) or not isinstance(x, int) or x < 1}
    if bad:
        raise ValueError("pipeline degrees must be integers >= 1: " + ", ".join(f"{k}={x!r}" for k, x in bad.items()))


def bubble_fraction_of_step(p: int, m: int, v: int = 1) -> float:
    """Share of a step's time that pipeline stages sit idle (fraction of the whole step, in [0, 1)).

    fraction = (p-1) / (v m + p - 1): bubble (p-1)/v micro-batch slots over a step of m + (p-1)/v
    slots. Convention: fraction of the step (bubble / (ideal + bubble)); `bubble_over_ideal` gives
    Megatron's bubble / ideal. p = 1: 0. e.g. p=4, m=8: 3/11 = 0.2727; v=2: 3/19 = 0.1579.
    Ref: GPipe, Huang et al., arXiv 1811.06965, sec. 2.3 ((K-1)/(M+K-1)); 1F1B (PipeDream-Flush,
    Narayanan et al., arXiv 2006.09503) has the same bubble; interleaved: Narayanan et al.,
    arXiv 2104.04473, sec. 2.2.2 (bubble / ideal = (1/v)(p-1)/m, rewritten as a fraction of step).
    """
    _check_pmv(p, m, v)
    return (p - 1) / (v * m + p - 1)


def bubble_over_ideal(p: int, m: int, v: int = 1) -> float:
    """Pipeline bubble time relative to the ideal (bubble-free) compute time (ratio, >= 0, may exceed 1).

    ratio = (p-1) / (v m). Convention: Megatron's "bubble time fraction", bubble / ideal -- not a share
    of the step (that is `bubble_fraction_of_step` = ratio / (1 + ratio)). p = 1: 0.
    e.g. p=4, m=8: 3/8 = 0.375; v=2: 3/16 = 0.1875.
    Ref: Narayanan et al., arXiv 2104.04473, sec. 2.2.1 ((p-1)/m) and sec. 2.2.2 ((1/v)(p-1)/m).
    """
    _check_pmv(p, m, v)
    return (p - 1) / (v * m)


def bubble_time_s(ideal_compute_s: float, p: int, m: int, v: int = 1) -> float:
    """Idle time the pipeline bubble adds to a step, seconds: ideal_compute_s x (p-1) / (v m).

    ideal_compute_s is the bubble-free time of one stage over all m micro-batches (m x (t_f + t_b)).
    Step time = ideal + bubble. e.g. ideal 8 s, p=4, m=8: 3 s (step 11 s, 3/11 of it idle).
    Ref: Narayanan et al., arXiv 2104.04473, sec. 2.2.1-2.2.2 (bubble = (p-1)/v x (t_f + t_b)).
    """
    if not (ideal_compute_s >= 0 and math.isfinite(ideal_compute_s)):
        raise ValueError(f"ideal_compute_s must be finite and >= 0, got {ideal_compute_s!r}")
    return ideal_compute_s * bubble_over_ideal(p, m, v)


# The schedules ddplan prices, as Layout.pp_schedule spells them (a run file's layout.schedule writes '-' for '_'):
# 1F1B (PipeDream-Flush) and Megatron's interleaved 1F1B, and the zero-bubble paper's handcrafted ZB-H1 and ZB-H2
# and its ZB-V (Qi et al., arXiv 2401.10241, sec. 2 and 6)
SCHEDULES = ("1f1b", "interleaved", "zb_h1", "zb_h2", "zb_v")
ZERO_BUBBLE = ("zb_h1", "zb_h2", "zb_v")


def _w_slots(schedule: str, p: int) -> int:
    """The micro-batches whose W passes a schedule can move into the bubble: ZB-H1 keeps 1F1B's p in flight, ZB-H2
    2p - 1 (Table 2's peak activations); ZB-V is priced as ZB-H2 (zero_bubble_time_s)."""
    return p if schedule == "zb_h1" else 2 * p - 1


def zero_bubble_time_s(schedule: str, p: int, m: int, pass_s: float, w_s: float) -> float:
    """Idle time a zero-bubble pipeline schedule adds to a step, seconds, from one stage's times for one micro-batch,
    pass_s = T_F + T_B + T_W (forward and the whole backward) and w_s = T_W (its weight-gradient GEMMs), and the m
    micro-batches of the step:

        bubble = (p-1)(T_F + T_B) - (min(m, k) - 1) T_W, at least 0; k = p (ZB-H1), 2p - 1 (ZB-H2, ZB-V)

    With enough micro-batches this is the paper's Table 2 ("Comparison between 1F1B and our handcrafted
    schedules"): ZB-H1 (p-1)(T_F + T_B - T_W) at 1F1B's peak activations (p M_B), ZB-H2 (p-1)(T_F + T_B - 2 T_W) at
    (2p - 1) M_B; 1F1B's is (p-1)(T_F + T_B + T_W), bubble_time_s. With m <= p it is Appendix H's "rough analysis
    ignoring communication": a ZB iteration takes (m + p - 1)(T_F + T_B) + T_W, a bubble of (p-1)(T_F + T_B) - (m-1)
    T_W, for ZB-1p and ZB-2p alike ("essentially the same" there). Between p and 2p - 1 (ZB-H2) each further
    micro-batch's W is taken to fill as much again: ddplan's interpolation of the two.
    ZB-V (sec. 6: two chunks a stage in a V, zero bubble at p M_B when T_F = T_B = T_W) has no closed form in the
    paper; its bubble rates computed from profiled times (Table 8) lie within 1.3 points of ZB-H2's at every
    setting (6.2B, p 16: 0.0697 vs 0.0823; 14.6B, p 24: 0.0638 vs 0.0628; 28.3B, p 32: 0.0593 vs 0.0629 at the
    smallest m), so ddplan prices it as ZB-H2 (an assumption, stated).
    The paper's automatic schedules are these within its Table 5: ZB-1p's bubble rates equal ZB-H1's at every
    setting, and ZB-2p's lie below ZB-H2's (0.1-4.3% against 2.6-10.8%): ZB-2p priced as ZB-H2 is an upper bound.
    Communication is not in these formulas; ddplan adds the stage-to-stage sends to the bubble as for 1F1B.
    e.g. p 8, m 24, T_F 18.522, T_B 18.086, T_W 9.337 ms (the paper's Table 9, 1.5B): ZB-H1 7 x 27.271 = 190.9 ms,
    ZB-H2 7 x 17.934 = 125.5 ms (1F1B 7 x 45.945 = 321.6 ms); at m 4, both 7 x 36.608 - 3 x 9.337 = 228.2 ms.
    Ref: Qi, Wan, Huang & Lin, "Zero Bubble Pipeline Parallelism", arXiv 2401.10241 (ICLR 2024), Tables 2, 5, 8, 9
    and Appendix H.
    """
    if schedule not in ZERO_BUBBLE:
        raise ValueError(f"not a zero-bubble schedule: {schedule!r} (one of {', '.join(ZERO_BUBBLE)})")
    _check_pmv(p, m, 1)
    if not (0 <= w_s <= pass_s < math.inf):
        raise ValueError(f"need 0 <= w_s <= pass_s, finite; got w_s={w_s!r}, pass_s={pass_s!r}")
    return max(0.0, (p - 1) * (pass_s - w_s) - (min(m, _w_slots(schedule, p)) - 1) * w_s)


def p2p_bytes_per_microbatch(batch: int, seq: int, hidden: int, elem_bytes: float) -> float:
    """Activation bytes one stage boundary carries per micro-batch in each direction: b x s x h x elem_bytes.

    Forward sends the b s h output activation to the next stage; backward returns its gradient of
    the same size. With tensor parallelism t, Megatron's scatter/gather splits it into t pieces of
    b s h / t per link. e.g. b=1, s=2048, h=4096, bf16: 16.78 MB each way.
    Ref: Narayanan et al., arXiv 2104.04473, sec. 3.2 and 4.1 (b s h per micro-batch; scatter/gather).
    """
    bad = [f"{k}={x!r}" for k, x in (("batch", batch), ("seq", seq), ("hidden", hidden), ("elem_bytes", elem_bytes))
           if not 0 < x < math.inf]  # nan and inf fail both ways
    if bad:
        raise ValueError("must be finite and > 0: " + ", ".join(bad))
    return float(batch) * seq * hidden * elem_bytes


def p2p_time_s(sent_bytes: float, busbw_bytes_per_s: float, latency_s: float, accum: int, v: int = 1) -> float:
    """Seconds per step of pipeline point-to-point sends on the critical path.

    Each micro-batch crosses v stage boundaries per device (interleaving multiplies them by v) in
    forward, and its gradient returns the same way in backward, not overlapped with compute:
    t = accum x 2 v x (sent / busbw + latency). e.g. 16.78 MB at 100 GB/s, 5 us, accum 8, v 1:
    8 x 2 x (1.678e-4 + 5e-6) = 2.765e-3 s.
    Ref: Narayanan et al., arXiv 2104.04473, sec. 2.2.2 (v times the communication) and sec. 4.1.
    """
    if not (sent_bytes >= 0 and busbw_bytes_per_s > 0 and latency_s >= 0):
        raise ValueError(f"need sent_bytes >= 0, busbw > 0, latency >= 0; got {sent_bytes}, {busbw_bytes_per_s}, "
                         f"{latency_s}")
    _check_pmv(1, accum, v)
    return accum * 2 * v * (sent_bytes / busbw_bytes_per_s + latency_s)
