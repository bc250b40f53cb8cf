"""Collective communication: nccl-tests bus bandwidth, ring alpha-beta times, DDP overlap, Megatron TP.

Convention (nccl-tests doc/PERFORMANCE.md): S is the whole buffer -- the all-reduce size, the
reduce-scatter input, the all-gather output. algbw = S / t; busbw = algbw x factor, with factor
2(n-1)/n for all-reduce and (n-1)/n for reduce-scatter and all-gather. Times come either from the
uncalibrated ring model t = alpha x steps + S x factor / busbw (`collective_time_s`) or from a
measured t(S) curve (`interpolate_time_s`) -- never both, or latency is counted twice.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from ddplan import units
from ddplan.specs import HardwareSpec

Collective = Literal["all_reduce", "reduce_scatter", "all_gather"]
COLLECTIVES: tuple[str, ...] = ("all_reduce", "reduce_scatter", "all_gather")
EfficiencyPoint = Literal["value", "low", "high"]

# PyTorch DDP's bucket_cap_mb=25 is 25 x 2**20 bytes (reducer: bucket_cap_mb * 1024 * 1024).
DDP_DEFAULT_BUCKET_BYTES = 25 * units.MiB


def _check_collective(collective: str) -> None:
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; allowed: {', '.join(COLLECTIVES)}")


def _check_n(n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"group size n must be an integer >= 1, got n={n!r}")


def _check_nonneg(**values: float) -> None:
    for v in values.values():  # ~7,000 checks a search: the message is made only once one fails
        if not 0 <= v < math.inf:  # nan and inf fail both ways
            bad = [f"{k}={v!r}" for k, v in values.items() if not 0 <= v < math.inf]
            raise ValueError("must be finite and >= 0: " + ", ".join(bad))


def _check_pos(**values: float) -> None:
    for v in values.values():
        if not 0 < v < math.inf:
            bad = [f"{k}={v!r}" for k, v in values.items() if not 0 < v < math.inf]
            raise ValueError("must be finite and > 0: " + ", ".join(bad))


# --------------------------------------------------------------------------------------------
# nccl-tests conventions


def bus_factor(collective: Collective, n: int) -> float:
    """busbw / algbw for a collective over n ranks (dimensionless): the bytes each rank moves per byte of S.

    all_reduce: 2(n-1)/n; reduce_scatter, all_gather: (n-1)/n; n = 1 moves nothing: 0.
    e.g. all_reduce on 8 ranks: 2 x 7 / 8 = 1.75; all_gather on 8: 7/8 = 0.875.
    Ref: NVIDIA nccl-tests doc/PERFORMANCE.md, "Bus bandwidth" (AllReduce, ReduceScatter, AllGather).
    """
    _check_collective(collective)
    _check_n(n)
    steps = ring_latency_steps(collective, n)
    return steps / n


def bytes_per_rank(collective: Collective, size_bytes: float, n: int) -> float:
    """Bytes each rank sends (and receives) in a bandwidth-optimal ring collective of buffer S, bytes.

    bytes = S x bus_factor: 2(n-1)/n S for all-reduce (so S <= bytes < 2S for n >= 2), (n-1)/n S
    for reduce-scatter / all-gather. e.g. all-reduce of 1 GB on 8 ranks: 1.75 GB per rank.
    Ref: Patarasuk & Yuan, J. Parallel Distrib. Comput. 69(2), 2009 (lower bound 2(n-1)/n S, met by
    the ring); nccl-tests doc/PERFORMANCE.md.
    """
    _check_nonneg(size_bytes=size_bytes)
    return size_bytes * bus_factor(collective, n)


def busbw_from_algbw(collective: Collective, algbw_bytes_per_s: float, n: int) -> float:
    """Bus bandwidth, bytes/s, from algorithm bandwidth: busbw = algbw x bus_factor(collective, n).

    e.g. all_reduce on 8 ranks at algbw 100 GB/s: busbw = 175 GB/s.
    Ref: nccl-tests doc/PERFORMANCE.md.
    """
    _check_nonneg(algbw_bytes_per_s=algbw_bytes_per_s)
    return algbw_bytes_per_s * bus_factor(collective, n)


def algbw_from_busbw(collective: Collective, busbw_bytes_per_s: float, n: int) -> float:
    """Algorithm bandwidth S/t, bytes/s, from bus bandwidth: algbw = busbw / bus_factor(collective, n).

    e.g. all_reduce on 8 ranks at busbw 312.9 GB/s: algbw = 312.9 / 1.75 = 178.8 GB/s.
    Undefined for n = 1 (busbw is 0 whatever the algbw): ValueError.
    Ref: nccl-tests doc/PERFORMANCE.md.
    """
    _check_nonneg(busbw_bytes_per_s=busbw_bytes_per_s)
    factor = bus_factor(collective, n)
    if factor == 0:
        raise ValueError(f"algbw is undefined for n={n}: a single rank's busbw is 0 for any algbw")
    return busbw_bytes_per_s / factor


def busbw_from_time(collective: Collective, size_bytes: float, n: int, time_s: float) -> float:
    """Bus bandwidth, bytes/s, of a measured collective: busbw = (S / t) x bus_factor(collective, n).

    S is the whole buffer (all-reduce size, reduce-scatter input, all-gather output).
    e.g. all_reduce of 4 GiB on 8 ranks in 24 ms: 4 x 2**30 / 0.024 x 1.75 = 313.2 GB/s.
    Ref: nccl-tests doc/PERFORMANCE.md.
    """
    _check_nonneg(size_bytes=size_bytes)
    _check_pos(time_s=time_s)
    return size_bytes / time_s * bus_factor(collective, n)


def ring_latency_steps(collective: Collective, n: int) -> int:
    """Sequential message steps of a ring collective over n ranks (count; each costs one alpha).

    all_reduce: 2(n-1) (reduce-scatter then all-gather); reduce_scatter, all_gather: n-1.
    e.g. all_reduce on 8 ranks: 14 steps.
    Ref: Patarasuk & Yuan 2009 (ring all-reduce, 2(n-1) steps); Thakur, Rabenseifner & Gropp,
    IJHPCA 19(1), 2005 (ring allgather (n-1) alpha + (n-1)/n S beta).
    """
    _check_collective(collective)
    _check_n(n)
    return 2 * (n - 1) if collective == "all_reduce" else n - 1


# --------------------------------------------------------------------------------------------
# Which link a group runs over


@dataclass(frozen=True)
class Tier:
    """The fabric a collective group runs over: achievable large-message busbw and per-step latency."""

    name: Literal["intra_node", "inter_node"]
    busbw_bytes_per_s: float
    latency_s: float
    # across nodes: the group's members on each node and the latency of a hop inside a node (a ring pass over k nodes
    # pays latency_s on k - 1 of its steps and intra_latency_s on the rest: ring_latency_s); 0: every step at latency_s
    per_node: int = 0
    intra_latency_s: float = 0.0

    def __post_init__(self) -> None:
        if self.name not in ("intra_node", "inter_node"):
            raise ValueError(f"Tier.name must be 'intra_node' or 'inter_node', got {self.name!r}")
        _check_pos(busbw_bytes_per_s=self.busbw_bytes_per_s)
        _check_nonneg(latency_s=self.latency_s, intra_latency_s=self.intra_latency_s, per_node=self.per_node)

    def time_s(self, collective: Collective, size_bytes: float, n: int) -> float:
        """Uncalibrated seconds of one collective over this tier (`collective_time_s`)."""
        return collective_time_s(collective, size_bytes, n, self)


def _intra_busbw_bytes_per_s(hw: HardwareSpec, collective: str, n: int) -> float:
    points = hw.intra_node.busbw_gbyte_per_s[collective]
    sizes = sorted(points)
    at_or_below = [s for s in sizes if s <= n]
    if at_or_below:
        return points[at_or_below[-1]].value * units.GB
    size = sizes[0]
    busbw = points[size].value * units.GB
    if n >= 2 and hw.intra_node.topology == "full_mesh":
        # A k-GPU group on a full mesh owns k-1 links per GPU, so busbw scales with (n-1)/(size-1)
        # (MI300X: 312.9 GB/s at 8 x 1/7 = 44.7, measured 47.7 at 2). A switch gives any group all links.
        busbw *= (n - 1) / (size - 1)
    return busbw


def tier_for(hw: HardwareSpec, collective: Collective, n: int, *, efficiency: EfficiencyPoint = "value",
             per_node: int | None = None) -> Tier:
    """The tier (busbw bytes/s, latency s) a group of n GPUs, per_node of them on each node, runs `collective` over.

    Inside one node (n <= per_node, per_node defaulting to min(n, gpus_per_node)): busbw =
    hw.intra_node.busbw_gbyte_per_s[collective] at the largest listed group size <= n (a conservative
    step: a mesh group between sizes owns the links of the smaller); below every listed size, the
    smallest listed size's value, x (n-1)/(size-1) on a `full_mesh` (a k-GPU mesh group owns k-1 links
    per GPU; on a switch any group reaches all links); latency = intra_node.latency_us. n = 1 moves no
    data; its tier is the smallest size's.
    Across nodes (n > per_node): busbw = min(intra busbw of the per_node members, the node's NIC bytes/s
    x per_node / gpus_per_node x busbw_fraction_of_nics.<efficiency>), latency = inter_node.latency_us.
    Each GPU reaches the fabric through its own NIC (rail-optimised nodes) and NCCL/RCCL spread a ring's
    channels over the NICs of its members, so a ring crossing nodes is bounded by the NICs of its members
    on a node (the fewest on any node it touches, ddplan.layout.group_on_nodes): all of them for a
    group with every GPU of the node (H200: 8 x 400 Gb/s = 400 GB/s x 0.91 = 364 GB/s; 32 ranks over EFA
    measured 364.7 GB/s), one for a data-parallel group of a tp-8 layout (the node's other seven NICs
    carry the other tp ranks' groups at the same time).
    `efficiency` picks value/low/high of busbw_fraction_of_nics (the band); intra-node busbw values
    are single sourced numbers and do not vary with it.
    Ref: DESIGN.md sec. 4 (Collectives); stas00/ml-engineering network/README.md (MI300X 2 vs 8 GPUs,
    32x H200 EFA); nccl-tests doc/PERFORMANCE.md; NCCL docs, NCCL_CROSS_NIC (rings use the NIC of each GPU's rail).
    """
    _check_collective(collective)
    _check_n(n)
    if efficiency not in ("value", "low", "high"):
        raise ValueError(f"efficiency must be 'value', 'low' or 'high', got {efficiency!r}")
    if per_node is None:
        per_node = min(n, hw.gpus_per_node) if n <= hw.gpus_per_node else hw.gpus_per_node
    if not 1 <= per_node <= hw.gpus_per_node:
        raise ValueError(f"per_node must be in 1..{hw.gpus_per_node}, got {per_node}")
    if n <= per_node:
        busbw = _intra_busbw_bytes_per_s(hw, collective, n)
        return Tier("intra_node", busbw, hw.intra_node.latency_us.value * units.US)
    frac = hw.inter_node.busbw_fraction_of_nics
    fraction = {"value": frac.value, "low": frac.range[0], "high": frac.range[1]}[efficiency]
    nic_bound = hw.inter_node.node_bytes_per_s * per_node / hw.gpus_per_node * fraction
    intra = _intra_busbw_bytes_per_s(hw, collective, per_node) if per_node > 1 else math.inf
    return Tier("inter_node", min(intra, nic_bound), hw.inter_node.latency_us.value * units.US, per_node,
                hw.intra_node.latency_us.value * units.US)


# --------------------------------------------------------------------------------------------
# Times


def collective_time_s(collective: Collective, size_bytes: float, n: int, tier: Tier) -> float:
    """Uncalibrated time of one collective, seconds: t = latency + S x bus_factor / busbw.

    latency: ring_latency_s (inside a node alpha x ring_latency_steps, 2(n-1) all-reduce, n-1 RS/AG; across nodes
    NCCL's count of network and NVLink hops, or its tree or PAT); 0 for n = 1 or S = 0. e.g. all_reduce of 1 GB on
    8 GPUs at busbw 312.9 GB/s, alpha 8 us:
    14 x 8e-6 + 1e9 x 1.75 / 312.9e9 = 1.12e-4 + 5.5928e-3 = 5.7048e-3 s.
    Replaced by `interpolate_time_s` once a measured t(S) exists (never add the two).
    Ref: Patarasuk & Yuan 2009; Thakur, Rabenseifner & Gropp 2005; nccl-tests doc/PERFORMANCE.md.
    """
    _check_nonneg(size_bytes=size_bytes)
    if n == 1 or size_bytes == 0:
        return 0.0
    return ring_latency_s(collective, n, tier) + size_bytes * bus_factor(collective, n) / tier.busbw_bytes_per_s


def ring_latency_s(collective: Collective, n: int, tier: Tier) -> float:
    """Seconds of latency one collective over n ranks pays on `tier` (collective_time_s's alpha term), as NCCL's own
    cost model counts it (src/graph/tuning.cc@5067397c L388-432).

    Inside a node: ring_latency_steps x tier.latency_s. Across nodes, on k nodes of tier.per_node ranks each (per_node
    0: every step at alpha_inter):
    - ring: of its steps (n - 1 a pass, all-reduce two passes) k - 1 a pass cross the network (L411-412: nInterSteps
      = nNodes - 1, 2 (nNodes - 1) for all-reduce), the rest stay inside a node: reduce-scatter and all-gather run
      so (NCCL has no tree for them, NVIDIA/nccl#1473), and an H100 cluster's reduce-scatter busbw falls as nodes are
      added, 360, 345, 320, 300, 280, 260 GB/s at 4 to 128 nodes (NVIDIA/nccl#1229);
    - all-reduce takes its tree where shorter: 2 ((per_node - 1) alpha_intra + log2 k alpha_inter) (L416);
    - with one rank a node, reduce-scatter and all-gather take PAT where shorter, which NCCL runs only so (L220: "PAT
      only supports 1 GPU per node"): log2 k x alpha_inter / 3.5 + 2.8 us x n (L429-432; NCCL has no PAT with an
      average, meta-pytorch/torchcomms#511, which Megatron-Bridge's recipes reduce with: not told apart here).
    e.g. reduce-scatter over 256 ranks, 8 a node, alpha 10 us across and 4 us inside: 31 x 10 + 224 x 4 = 1,206 us;
    all-reduce over the same: min(2 x 1,206, 2 (7 x 4 + 5 x 10) = 156) us.
    """
    steps = ring_latency_steps(collective, n)
    if tier.name != "inter_node" or not tier.per_node:
        return tier.latency_s * steps
    nodes = math.ceil(n / tier.per_node)
    passes = 2 if collective == "all_reduce" else 1
    crossing = min(passes * (nodes - 1), steps)
    ring = crossing * tier.latency_s + (steps - crossing) * tier.intra_latency_s
    levels = max(1, nodes).bit_length() - 1  # NCCL's log2i: floor(log2 nodes)
    if collective == "all_reduce":
        return min(ring, 2 * ((tier.per_node - 1) * tier.intra_latency_s + levels * tier.latency_s))
    if tier.per_node == 1:
        return min(ring, levels * tier.latency_s / 3.5 + 2.8e-6 * n)
    return ring


def split_time_s(time_s: Callable[[str, float, int], float], collective: Collective, size_bytes: float, n: int,
                 calls: int) -> float:
    """Seconds of size_bytes sent as `calls` equal collectives, one after another on one stream (a framework's
    buckets or units): calls x time_s(collective, size_bytes / calls, n). Each call pays its own latency
    (ring_latency_s; NCCL's cost model prices a call, src/graph/tuning.cc@5067397c L388-432), the bytes cost the same
    in total: with the tier model, calls x alpha-term + size_bytes x bus_factor / busbw.
    e.g. 1 GB in 32 calls over 256 ranks with 1,206 us of latency a call at 300 GB/s busbw: 32 x 1,206 us +
    1e9 x 255/256 / 300e9 s = 38.6 + 3.3 = 41.9 ms, against 4.5 ms as one call."""
    if isinstance(calls, bool) or not isinstance(calls, int) or calls < 1:
        raise ValueError(f"calls must be an integer >= 1, got {calls!r}")
    if size_bytes <= 0:
        return 0.0
    return calls * time_s(collective, size_bytes / calls, n)


def interpolate_time_s(points: Sequence[tuple[float, float]], size_bytes: float) -> float:
    """Calibrated collective time, seconds, at buffer S bytes, from measured (S_i bytes, t_i s) points.

    Between points: log-log linear, log t = log t_i + (log S - log S_i) x (log t_j - log t_i) /
    (log S_j - log S_i). Above the largest: t = t_n + (S - S_n) x (t_n - t_{n-1}) / (S_n - S_{n-1}),
    the last two points' marginal bandwidth (the alpha-beta slope; with one point, or a flat last
    segment, the largest point's algbw S_n / t_n). Below the smallest: t_1, the latency floor.
    S = 0: 0 (nothing is sent). e.g. [(1e6, 1e-4), (1e8, 1e-3)] at 1e7: sqrt(1e-4 x 1e-3) = 3.162e-4 s;
    at 2e8: 1e-3 + 1e8 x 9e-4 / 9.9e7 = 1.909e-3 s.
    Ref: DESIGN.md sec. 4 (calibrated t(S) replaces alpha-beta); nccl-tests size sweeps (-b/-e/-f).
    """
    if not points:
        raise ValueError("interpolate_time_s needs at least one measured (size_bytes, time_s) point, got none")
    _check_nonneg(size_bytes=size_bytes)
    pts = sorted((float(s), float(t)) for s, t in points)
    for s, t in pts:
        _check_pos(point_size_bytes=s, point_time_s=t)
    sizes = [s for s, _ in pts]
    dup = sorted({s for s in sizes if sizes.count(s) > 1})
    if dup:
        raise ValueError(f"measured points repeat sizes {dup}; give one time per size")
    if size_bytes == 0:
        return 0.0
    if size_bytes <= sizes[0]:
        return pts[0][1]
    if size_bytes >= sizes[-1]:
        s_n, t_n = pts[-1]
        if len(pts) >= 2 and pts[-1][1] > pts[-2][1]:
            s_p, t_p = pts[-2]
            return t_n + (size_bytes - s_n) * (t_n - t_p) / (s_n - s_p)
        return t_n * size_bytes / s_n
    j = bisect.bisect_left(sizes, size_bytes)
    (s_i, t_i), (s_j, t_j) = pts[j - 1], pts[j]
    if size_bytes == s_j:
        return t_j
    w = (math.log(size_bytes) - math.log(s_i)) / (math.log(s_j) - math.log(s_i))
    return math.exp(math.log(t_i) + w * (math.log(t_j) - math.log(t_i)))


class Timer(Protocol):
    """Anything that times a collective: a `Tier` (the alpha-beta model) or a `GroupTimer`."""

    def time_s(self, collective: Collective, size_bytes: float, n: int) -> float: ...

    def all_to_all_s(self, size_bytes: float, n: int) -> float: ...


CommPoints = dict[tuple[str, int, str], list[tuple[float, float]]]  # (collective, group size, tier) -> [(bytes, s)]


@dataclass(frozen=True)
class GroupTimer:
    """Times collectives of one kind of group: the measured t(S) curve where calibrated, else the tier model.

    per_node: members of the group on each node it spans (ddplan.layout.placement; its share of the
    node's NICs); a group of n > per_node crosses nodes. efficiency: which end of the inter-node
    efficiency range (the band). A measured curve is used only for the same group size on the same
    tier (one node, or across nodes). Never both measured and modelled for one time: the measured
    curve already holds the latency.
    Ref: DESIGN.md sec. 4 (Collectives).
    """

    hw: HardwareSpec
    per_node: int
    efficiency: EfficiencyPoint = "value"
    points: CommPoints | None = None

    def time_s(self, collective: Collective, size_bytes: float, n: int) -> float:
        if n <= 1 or size_bytes <= 0:
            return 0.0
        per_node = min(self.per_node, n)
        tier = tier_for(self.hw, collective, n, efficiency=self.efficiency, per_node=per_node)
        key = (collective, n, tier.name)
        # measured across nodes means with every GPU of a node in the group: not a group with fewer per node
        if self.points and key in self.points and (tier.name == "intra_node" or per_node == self.hw.gpus_per_node):
            return interpolate_time_s(self.points[key], size_bytes)
        return collective_time_s(collective, size_bytes, n, tier)

    def all_to_all_s(self, size_bytes: float, n: int) -> float:
        """One all-to-all of size_bytes per rank over n ranks of this group kind (all_to_all_s)."""
        if n <= 1 or size_bytes <= 0:
            return 0.0
        per_node = min(self.per_node, n)
        if n <= per_node:  # inside a node: as the all-gather of the same buffer (measured curve if calibrated)
            return self.time_s("all_gather", size_bytes, n)
        return all_to_all_s(self.hw, size_bytes, n, per_node, self.efficiency)


def all_to_all_s(hw: HardwareSpec, size_bytes: float, n: int, per_node: int,
                 efficiency: EfficiencyPoint = "value") -> float:
    """Seconds of one all-to-all over n ranks, per_node of them on each node, each rank holding size_bytes.

    Each rank keeps 1 / n of its buffer and sends 1 / n to each other rank, all at once. Inside one node
    (n <= per_node) that is an all-gather's traffic, (n - 1) / n of the buffer out of every rank, and is
    timed as the all-gather whose output is the buffer (nccl-tests defines both bus bandwidths as algbw x
    (n - 1) / n). Across nodes a ring all-gather would move each remote block into a node once, but an
    all-to-all's blocks are all distinct: every rank sends (n - per_node) / n of its buffer through its own
    NIC (rail-optimised nodes, one NIC a GPU) while the (per_node - 1) / n for its node-mates crosses the
    node's links: time = max(off-node bytes / (NIC x busbw_fraction_of_nics), on-node bytes / intra busbw
    of per_node) + the inter-node latency (the sends are posted together: one step).
    e.g. 64 MiB a rank, ep 8 as 4 + 4 on two H100 nodes (400 Gb/s NICs, fraction 0.85, 10 us): off-node
    4/8 x 67.1 MB / 42.5 GB/s = 0.790 ms + 0.010 = 0.800 ms; a ring all-gather's 0.405 ms is 2x too fast.
    Ref: nccl-tests doc/PERFORMANCE.md (AllToAll); NCCL docs (alltoall as grouped send/recv); Megatron-Core
    MoE docs ("keep EP x TP within the NVLink domain").
    """
    _check_nonneg(size_bytes=size_bytes)
    _check_n(n)
    if n <= per_node:
        return collective_time_s("all_gather", size_bytes, n, tier_for(hw, "all_gather", n, efficiency=efficiency))
    frac = hw.inter_node.busbw_fraction_of_nics
    fraction = {"value": frac.value, "low": frac.range[0], "high": frac.range[1]}[efficiency]
    nic = hw.inter_node.node_bytes_per_s / hw.gpus_per_node * fraction  # one NIC's share a GPU
    off = size_bytes * (n - per_node) / n / nic
    on = size_bytes * (per_node - 1) / n / _intra_busbw_bytes_per_s(hw, "all_gather", per_node) if per_node > 1 else 0.0
    return max(off, on) + hw.inter_node.latency_us.value * units.US


# --------------------------------------------------------------------------------------------
# Overlap: DDP gradient buckets


def ddp_exposed_s(grad_bytes: float, bucket_bytes: float, n: int, tier: Timer, overlap_window_s: float) -> float:
    """Gradient all-reduce time DDP leaves exposed after backward, seconds.

    DDP all-reduces a bucket (bucket_cap_mb, default 25 MiB) as soon as backward fills it, so the
    reduction overlaps backward, except the last bucket, which is launched when backward ends:
    exposed = max(t_AR(grad_bytes) - overlap_window, t_AR(min(bucket_bytes, grad_bytes))), t_AR from
    `collective_time_s`; 0 for n = 1. The last bucket is taken as full (an upper bound: it holds the
    remainder). Under no_sync this happens once per optimizer step, after the last micro-batch.
    e.g. 1 GB of grads, 25 MB buckets, 8 GPUs at 312.9 GB/s and 8 us, window 3 ms:
    max(5.7048e-3 - 3e-3, 1.12e-4 + 25e6 x 1.75 / 312.9e9) = max(2.7048e-3, 2.518e-4) = 2.7048e-3 s.
    Ref: Li et al., "PyTorch Distributed", VLDB 2020, sec. 3.2 (bucketing, overlap); PyTorch DDP
    design notes and DistributedDataParallel docs (bucket_cap_mb=25).
    """
    _check_nonneg(grad_bytes=grad_bytes, overlap_window_s=overlap_window_s)
    _check_pos(bucket_bytes=bucket_bytes)
    _check_n(n)
    if n == 1 or grad_bytes == 0:
        return 0.0
    total = tier.time_s("all_reduce", grad_bytes, n)
    last = tier.time_s("all_reduce", min(bucket_bytes, grad_bytes), n)
    return bucketed_exposed_s(total, last, overlap_window_s)


def bucketed_exposed_s(total_s: float, last_bucket_s: float, overlap_window_s: float) -> float:
    """Seconds of a bucketed gradient reduce left after backward: what outlasts the window it runs beside, and at least
    the last bucket's, launched when backward ends: max(total - window, last bucket) (ddp_exposed_s).
    e.g. 30 ms of buckets beside a 25 ms backward, 2 ms the last: 5 ms; beside 100 ms: 2 ms."""
    _check_nonneg(total_s=total_s, last_bucket_s=last_bucket_s, overlap_window_s=overlap_window_s)
    return max(total_s - overlap_window_s, last_bucket_s)


MEGATRON_BUCKET_FLOOR = 40_000_000  # parameters: Megatron-Core's smallest default bucket
MEGATRON_BUCKET_PER_RANK = 1_000_000  # parameters a data-parallel rank: its default grows with dp x cp


def grad_buckets(rule: str, params: float, ranks: int, chunks: int = 1) -> tuple[int, float]:
    """(collectives, parameters in the last one) of a ZeRO 0-2 rank's gradient reduce as Megatron-Core's DDP buckets
    it (a layout's grad_bucket rule). The first model chunk's parameters (params / chunks) go in buckets of B, each
    later chunk in one bucket of its own, bucketing being off after the first chunk (Megatron-LM
    megatron/training/training.py@d98e8a6 L2504-2515; NeMo nemo/lightning/megatron_parallel.py@8cfedd7 L633-639):
    calls = ceil(params / chunks / B) + chunks - 1; the last bucket, the first chunk's last to fill, whose reduce
    starts when backward ends: min(B, params / chunks).
    B: "megatron", max(40,000,000, 1,000,000 x ranks) parameters (resolve_ddp_bucket_size, training.py@d98e8a6
    L2179-2194; ranks = dp x cp); digits, that many (--ddp-bucket-size; NeMo's MegatronCommOverlapCallback,
    megatron_comm_overlap.py@8cfedd7 L185-186, sets 134,217,728); "chunk": the whole chunk (bucketing off for every
    chunk, as under overlap_param_gather_with_optimizer_step, training.py@d98e8a6 L2508-2510).
    e.g. 8.03e9 parameters over 256 ranks, "megatron": B = 2.56e8, 32 calls, the last 2.56e8; "chunk", 8 chunks of a
    1e9 stage: 8 calls, the last 1.25e8; 4e9 parameters, "768000000": 6 calls, the last 7.68e8."""
    _check_n(ranks)
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise ValueError(f"chunks must be an integer >= 1, got {chunks!r}")
    _check_pos(params=params)
    first = params / chunks
    if rule == "megatron":
        size = float(max(MEGATRON_BUCKET_FLOOR, MEGATRON_BUCKET_PER_RANK * ranks))
    elif rule == "chunk":
        size = first
    elif rule.isdigit() and int(rule) >= 1:
        size = float(rule)
    else:
        raise ValueError(f"a gradient-bucket rule is megatron, chunk or a number of parameters; got {rule!r}")
    return max(1, math.ceil(first / size - 1e-9)) + chunks - 1, min(size, first)


# --------------------------------------------------------------------------------------------
# Overlap: sharded data parallelism (ZeRO-1/2, FSDP), from the times of its collectives


def param_gather_exposed_s(ag_s: float, first_bucket_s: float, forward_s: float | None) -> float:
    """Seconds of the post-step parameter all-gather (ZeRO-1/2) left on the critical path.

    Blocking (DeepSpeed, torch ZeroRedundancyOptimizer; forward_s None): all of it. Megatron-Core's
    --overlap-param-gather launches the gather bucket by bucket and waits for each in the next step's
    first forward: exposed = max(ag - forward, first bucket).
    e.g. ag 20 ms, first bucket 1 ms: blocking 20 ms; under a 15 ms forward 5 ms; under 50 ms 1 ms.
    Ref: Megatron-Core distributed optimizer docs (docs/source/api-guide/dist_optimizer.md) and
    megatron/core/distributed/param_and_grad_buffer.py (start_param_sync / forward pre-hook).
    """
    _check_nonneg(ag_s=ag_s, first_bucket_s=first_bucket_s)
    if forward_s is None:
        return ag_s
    _check_nonneg(forward_s=forward_s)
    return min(ag_s, max(ag_s - forward_s, first_bucket_s))


def zero1_comm_s(rs_s: float, ag_s: float, last_bucket_s: float, backward_s: float,
                 forward_s: float | None = None, first_gather_s: float | None = None) -> tuple[float, float]:
    """(total, exposed) seconds of ZeRO-1 communication per optimizer step.

    Gradients are reduce-scattered in buckets during the last micro-batch's backward (the earlier
    ones accumulate locally under no_sync); the updated parameter shards are all-gathered after the
    optimizer step, exposed unless overlapped with the next forward (param_gather_exposed_s; forward_s
    given): exposed = max(rs - backward, last bucket) + param_gather_exposed_s(ag, first gather, forward), the first
    gather the last bucket's reduce time unless first_gather_s (its own gather's) is given.
    e.g. rs 30 ms, ag 20 ms, bucket 1 ms, backward 100 ms: total 50 ms, exposed 1 + 20 = 21 ms; with the
    gather overlapped under a 50 ms forward: 1 + 1 = 2 ms.
    Ref: Rajbhandari et al., arXiv 1910.02054, sec. 5.1; DeepSpeed stage 1 (reduce in backward).
    """
    _check_nonneg(rs_s=rs_s, ag_s=ag_s, last_bucket_s=last_bucket_s, backward_s=backward_s)
    first = last_bucket_s if first_gather_s is None else first_gather_s
    gather = param_gather_exposed_s(ag_s, min(first, ag_s), forward_s)
    return rs_s + ag_s, max(rs_s - backward_s, last_bucket_s) + gather


def zero2_comm_s(rs_s: float, ag_s: float, last_bucket_s: float, backward_s: float,
                 accum: int, forward_s: float | None = None, first_gather_s: float | None = None) -> tuple[float, float]:
    """(total, exposed) seconds of ZeRO-2 communication per optimizer step.

    Gradient shards are kept, not whole gradients, so every micro-batch's backward reduce-scatters
    (overlapped except the last bucket); the parameter all-gather after the step is exposed unless
    overlapped with the next forward (param_gather_exposed_s):
    total = accum x rs + ag; exposed = accum x max(rs - backward, last bucket) + param_gather_exposed_s (its first
    gather as zero1_comm_s's).
    e.g. rs 30 ms, ag 20 ms, bucket 1 ms, backward 100 ms, accum 4: total 140 ms, exposed 24 ms.
    Ref: Rajbhandari et al., arXiv 1910.02054, sec. 5.2.
    """
    _check_nonneg(rs_s=rs_s, ag_s=ag_s, last_bucket_s=last_bucket_s, backward_s=backward_s)
    if accum < 1:
        raise ValueError(f"accum must be >= 1, got {accum}")
    first = last_bucket_s if first_gather_s is None else first_gather_s
    gather = param_gather_exposed_s(ag_s, min(first, ag_s), forward_s)
    return accum * rs_s + ag_s, accum * max(rs_s - backward_s, last_bucket_s) + gather


def fsdp_comm_s(rs_s: float, ag_s: float, micro_batch_s: float, accum: int, num_units: int, *, gathers: int = 2,
                replica_all_reduce_s: float = 0.0, separate_links: bool = True,
                replica_once: bool = False) -> tuple[float, float]:
    """(total, exposed) seconds of FSDP / ZeRO-3 communication per optimizer step.

    Each micro-batch all-gathers the parameters in forward and, when they were freed after forward
    (reshard_after_forward, the default: gathers = 2), again in backward, and reduce-scatters the
    gradients, each prefetched one unit (layer) ahead under compute; what exceeds the micro-batch's
    compute is exposed, and so is the first unit's gather of each pass. Hybrid sharding adds an
    all-reduce of the gradient shards across replicas; on another link (separate_links: the NICs, while
    the shard group uses NVLink) it overlaps the shard group's collectives and a micro-batch's
    communication takes the longer of the two, else (both on the NICs) their sum:
    busy = max(gathers x ag + rs, ar) (or the sum); total = accum x (gathers x ag + rs + ar);
    exposed = accum x (max(0, busy - micro_batch) + gathers x ag / units).
    replica_once: the replicas' all-reduce runs once a step, beside the last micro-batch only (FSDP2
    set_requires_all_reduce(False) on the others, as OLMo-core does): total = accum x (gathers x ag + rs) + ar;
    exposed = (accum - 1) x max(0, gathers x ag + rs - micro_batch) + max(0, busy - micro_batch)
    + accum x gathers x ag / units.
    e.g. rs 30, ag 20, micro-batch 50 ms, accum 2, 10 units: total 140 ms, exposed 2 x (20 + 4) = 48 ms;
    gathers 1: total 100, exposed 2 x (0 + 2) = 4 ms; with ar 80 (gathers 2): total 300,
    exposed 2 x (30 + 4) = 68 ms; and once a step: total 140 + 80 = 220, exposed 20 + 30 + 8 = 58 ms.
    Ref: Zhao et al., "PyTorch FSDP", VLDB 2023, sec. 3.3-3.4 (prefetch, overlap, hybrid sharding);
    torch FSDP2 fully_shard (reshard_after_forward; HSDP all-reduce, set_requires_all_reduce); ZeRO sec. 5.3;
    OLMo-core src/olmo_core/train/train_module/transformer.py@eaecf879 L838-850, transformer/train_module.py@fa6c501
    L565-578 (HSDP: all-reduce on the last micro-batch only).
    """
    _check_nonneg(rs_s=rs_s, ag_s=ag_s, micro_batch_s=micro_batch_s, replica_all_reduce_s=replica_all_reduce_s)
    if accum < 1 or num_units < 1 or gathers not in (1, 2):
        raise ValueError(f"accum and num_units must be >= 1 and gathers 1 or 2, got {accum}, {num_units}, {gathers}")
    shard_group = gathers * ag_s + rs_s
    busy = max(shard_group, replica_all_reduce_s) if separate_links else shard_group + replica_all_reduce_s
    if replica_once:  # the shard group's collectives every micro-batch, the replicas' beside the last only
        return (accum * shard_group + replica_all_reduce_s,
                (accum - 1) * max(0.0, shard_group - micro_batch_s) + max(0.0, busy - micro_batch_s)
                + accum * gathers * ag_s / num_units)
    return (accum * (shard_group + replica_all_reduce_s),
            accum * (max(0.0, busy - micro_batch_s) + gathers * ag_s / num_units))


def fsdp_pipelined_comm_s(rs_s: float, ag_s: float, fwd_s: float, bwd_s: float, accum: int, num_units: int, *,
                          reshard: bool, replica_all_reduce_s: float = 0.0) -> tuple[float, float]:
    """(total, exposed) seconds of ZeRO-3 / FSDP communication per optimizer step under a pipeline schedule, as
    torch.distributed.pipelining runs a stage wrapped in FSDP2 (torchtitan's FSDP with pp > 1).

    Every micro-batch's backward runs with set_requires_gradient_sync(False) and set_reshard_after_backward(False)
    (torch 2.13 distributed/pipelining/stage.py, backward_maybe_with_nosync): the gradients accumulate unsharded and
    the stage's one reduce-scatter (and the hybrid replicas' one all-reduce) runs after its last backward
    (perform_reduce_grad, the schedule's REDUCE_GRAD action), with none of the stage's compute left to hide it
    (Megatron-Core's schedules likewise reduce once, after the last micro-batch: schedules.py@d98e8a64 L1127-1140,
    disable_grad_sync; ddplan applies this to every ZeRO-3 layout with pp > 1). The
    parameters: without resharding after forward (torchtitan's default with a pipeline, fsdp.py@b5bcd76 L112-136)
    they are gathered once, unit by unit under the first micro-batch's forward, and kept for the step; with it, each
    micro-batch's backward gathers them again (the forward after a backward finds them still gathered; the warm-up
    forwards' own gathers, at most pp, are left out):

        gathers = accum if reshard else 1;  total = gathers x ag + rs + ar
        exposed = rs + ar + (accum x (max(0, ag - bwd) + ag / units) if reshard else max(0, ag - fwd) + ag / units)

    e.g. rs 30, ag 20, forward 50, backward 100 ms, accum 8, 10 units: kept, total 20 + 30 = 50 ms, exposed
    30 + 0 + 2 = 32 ms; resharded, total 160 + 30 = 190 ms, exposed 30 + 8 x 2 = 46 ms (the per-micro-batch rule,
    fsdp_comm_s, would send 8 x (2 x 20 + 30) = 560 ms).
    """
    _check_nonneg(rs_s=rs_s, ag_s=ag_s, fwd_s=fwd_s, bwd_s=bwd_s, replica_all_reduce_s=replica_all_reduce_s)
    if accum < 1 or num_units < 1:
        raise ValueError(f"accum and num_units must be >= 1, got {accum}, {num_units}")
    first = ag_s / num_units  # each pass's first unit waits for its gather
    if reshard:
        total, gathers_exposed = accum * ag_s, accum * (max(0.0, ag_s - bwd_s) + first)
    else:
        total, gathers_exposed = ag_s, max(0.0, ag_s - fwd_s) + first
    return total + rs_s + replica_all_reduce_s, rs_s + replica_all_reduce_s + gathers_exposed


# --------------------------------------------------------------------------------------------
# Context parallelism


def cp_kv_block_bytes(batch: int, seq_per_rank: int, kv_heads: int, head_dim: int, elem_bytes: float) -> float:
    """Bytes of one rank's K and V block, the unit context parallelism exchanges: 2 b (s / cp) h_kv d e.
    e.g. b 1, s / cp 8192, 8 KV heads of 128, bf16: 2 x 8192 x 8 x 128 x 2 = 33,554,432 B."""
    _check_pos(batch=batch, seq_per_rank=seq_per_rank, kv_heads=kv_heads, head_dim=head_dim, elem_bytes=elem_bytes)
    return 2.0 * batch * seq_per_rank * kv_heads * head_dim * elem_bytes


def cp_ring_exposed_s(send_s: float, cp: int, attn_fwd_s: float, attn_bwd_s: float) -> tuple[float, float]:
    """(forward, backward) seconds of a layer's ring-attention exchange left on the critical path.

    Ring (Megatron-Core cp_comm_type "p2p", ring attention): cp - 1 steps, each sending the KV block on
    while the attention of the block in hand runs (1 / cp of the layer's attention, the chunks balanced);
    backward sends the KV block and its gradient (twice the bytes), and after the last step the gradient
    accumulated for each block takes one more hop home with no attention left to hide it. send_s: one
    block's send: forward = (cp - 1) x max(0, send - attn_fwd / cp);
    backward = (cp - 1) x max(0, 2 send - attn_bwd / cp) + send.
    e.g. send 2 ms, cp 4, attention 4 ms forward and 10 ms backward: forward 3 x (2 - 1) = 3 ms, backward
    3 x max(0, 4 - 2.5) + 2 = 6.5 ms.
    Ref: Liu et al., arXiv 2310.01889 (ring attention, overlap); Megatron-Core
    transformer_engine context parallelism (AttnFuncWithCPAndKVP2P).
    """
    _check_nonneg(send_s=send_s, attn_fwd_s=attn_fwd_s, attn_bwd_s=attn_bwd_s)
    _check_n(cp)
    steps = cp - 1
    return steps * max(0.0, send_s - attn_fwd_s / cp), steps * max(0.0, 2 * send_s - attn_bwd_s / cp) + send_s


def cp_ring_sent_s(send_s: float, cp: int) -> tuple[float, float]:
    """(forward, backward) seconds of a layer's ring-attention sends, hidden or not (cp_ring_exposed_s's
    exchange): forward (cp - 1) x send; backward (cp - 1) x 2 send (the KV block and its gradient) + send (the
    gradient's hop home). e.g. send 2 ms, cp 4: 6 ms and 14 ms. What cp_ring_exposed_s leaves out of these ran
    under attention (and costs it overlap_cost_s). Ref: as cp_ring_exposed_s."""
    _check_nonneg(send_s=send_s)
    _check_n(cp)
    return (cp - 1) * send_s, (cp - 1) * 2 * send_s + send_s


def cp_all_gather_s(kv_block_bytes: float, cp: int, timer: Timer) -> tuple[float, float]:
    """(forward, backward) seconds of a layer's all-gather context parallelism, not overlapped.

    Every rank gathers the whole sequence's K and V before its attention (torchtitan's default
    rotate method "allgather"; Megatron-Core cp_comm_type "all_gather"), and in backward gathers them
    again and reduce-scatters their gradients: forward = AG(cp x block); backward = AG + RS(cp x block).
    Ref: torch.distributed.tensor.experimental context_parallel (set_rotate_method); Megatron-Core
    AttnFuncWithCPAndKVAllGather.
    """
    _check_nonneg(kv_block_bytes=kv_block_bytes)
    whole = cp * kv_block_bytes
    ag = timer.time_s("all_gather", whole, cp)
    return ag, ag + timer.time_s("reduce_scatter", whole, cp)


# --------------------------------------------------------------------------------------------
# Expert parallelism (mixture of experts)


def moe_rows_bytes(tokens: float, top_k: int, d_model: int, elem_bytes: float,
                   rows_factor: float | None = None) -> float:
    """Bytes of one rank's routed rows, the buffer each MoE all-to-all carries: tokens x top_k x rows_factor
    x d_model x elem_bytes. rows_factor (ddplan.specs.MoE.rows_factor): the capacity factor when experts are
    padded to capacity; under dropless expert parallelism the busiest rank's rows over the mean, since the
    exchange ends when the rank receiving most has its rows (and sends them back).
    e.g. 4,096 tokens, top-2, 4,096 wide, bf16: 4096 x 2 x 4096 x 2 = 67,108,864 B; x 1.5 = 100,663,296 B."""
    _check_pos(tokens=tokens, top_k=top_k, d_model=d_model, elem_bytes=elem_bytes)
    return tokens * top_k * (rows_factor or 1.0) * d_model * elem_bytes


def moe_layer_comm_s(rows_bytes: float, ep: int, tp: int, ep_timer: Timer, tp_timer: Timer) -> tuple[float, float]:
    """(forward, backward) seconds of one MoE layer's token exchange, on the critical path.

    Megatron-Core's all-to-all dispatcher (MoEAlltoAllTokenDispatcher): the rows go to their experts'
    ranks in one all-to-all over the ep group (dispatch) and come back in another (combine); with expert
    tensor parallelism (= tp here, sequence parallel) the received rows are all-gathered over tp before
    the experts and reduce-scattered after. Backward runs the transposes: the same bytes again.
    Each all-to-all is timed by all_to_all_s on the links of the ep group's placement (inside a node as
    the all-gather of the same buffer; across nodes through each rank's own NIC). rows_bytes is what the
    busiest rank receives (moe_rows_bytes: dropless routing's imbalance included); any
    overlap with compute (DeepSeek-V3's DualPipe, Megatron-Core's 1F1B all-to-all overlap), are not
    modelled. e.g. 64 MiB of rows, ep 8 in one node at 300 GB/s: each all-to-all 7/8 x 67.1 MB / 300 GB/s
    = 0.196 ms (+ latency), forward and backward 2 of them each.
    Ref: Megatron-Core megatron/core/transformer/moe/token_dispatcher.py; nccl-tests doc/PERFORMANCE.md
    (AllToAll bus bandwidth); Lepikhin et al., GShard, arXiv 2006.16668, sec. 3.2 (dispatch/combine).
    """
    _check_nonneg(rows_bytes=rows_bytes)
    _check_n(ep)
    _check_n(tp)
    a2a = ep_timer.all_to_all_s(rows_bytes, ep) if ep > 1 else 0.0
    etp = (tp_timer.time_s("all_gather", rows_bytes * tp, tp) + tp_timer.time_s("reduce_scatter", rows_bytes * tp, tp)
           if tp > 1 else 0.0)
    one = 2 * a2a + etp
    return one, one


# --------------------------------------------------------------------------------------------
# Tensor parallelism (Megatron)

TP_ALLREDUCES_PER_LAYER_FWD = 2  # after attention and after the MLP (operator g)
TP_ALLREDUCES_PER_LAYER_BWD = 2  # their conjugates before attention and the MLP (operator f)


def _check_tp_shape(batch: int, seq: int, hidden: int, elem_bytes: float) -> None:
    _check_pos(batch=batch, seq=seq, hidden=hidden, elem_bytes=elem_bytes)


def tp_allreduce_size_bytes(batch: int, seq: int, hidden: int, elem_bytes: float) -> float:
    """Buffer of one Megatron tensor-parallel all-reduce, bytes: S = b x s x h x elem_bytes.

    The full (unsharded) activation of one micro-batch of b sequences of s tokens, hidden h.
    e.g. b=1, s=2048, h=4096, bf16: 16.78 MB. Ref: Shoeybi et al., arXiv 1909.08053, sec. 3 (Fig. 3).
    """
    _check_tp_shape(batch, seq, hidden, elem_bytes)
    return float(batch) * seq * hidden * elem_bytes


def tp_allreduce_bytes_per_layer(batch: int, seq: int, hidden: int, elem_bytes: float) -> float:
    """All-reduce buffer bytes per transformer layer, forward + backward: 4 x b s h x elem_bytes.

    Megatron TP runs 2 all-reduces of b s h in forward (g after attention and MLP) and 2 in backward
    (f), all on the critical path. Counts S (buffer) per the nccl-tests convention, not bytes on the
    wire (x 2(t-1)/t, see `bytes_per_rank`). With sequence parallelism each all-reduce becomes a
    reduce-scatter + all-gather of the same S, same bytes. Full recompute repeats the forward pair.
    e.g. b=1, s=2048, h=4096, bf16: 4 x 16.78 MB = 67.1 MB.
    Ref: Shoeybi et al., arXiv 1909.08053, sec. 3; Korthikanti et al., arXiv 2205.05198, sec. 4.2.2.
    """
    per = tp_allreduce_size_bytes(batch, seq, hidden, elem_bytes)
    return (TP_ALLREDUCES_PER_LAYER_FWD + TP_ALLREDUCES_PER_LAYER_BWD) * per


def tp_comm_time_per_layer_s(batch: int, seq: int, hidden: int, elem_bytes: float, tp: int,
                             tier: Timer, sequence_parallel: bool = False) -> tuple[float, float]:
    """(forward, backward) tensor-parallel all-reduce time per layer, seconds, uncalibrated.

    fwd = bwd = 2 x collective_time_s("all_reduce", b s h elem_bytes, tp, tier); (0, 0) for tp = 1.
    e.g. b=1, s=2048, h=4096, bf16, tp=8 at 312.9 GB/s, 8 us: 2 x (1.12e-4 + 16.78e6 x 1.75 / 312.9e9)
    = 2 x 2.0583e-4 = 4.1166e-4 s each way.
    Ref: Shoeybi et al., arXiv 1909.08053, sec. 3; Korthikanti et al., arXiv 2205.05198, sec. 4.2.2.
    Sequence parallelism replaces each all-reduce by a reduce-scatter and an all-gather of the same b s h
    buffer (the same bytes on a ring; each at its own measured bus bandwidth).
    """
    size = tp_allreduce_size_bytes(batch, seq, hidden, elem_bytes)
    if sequence_parallel:
        one = tier.time_s("reduce_scatter", size, tp) + tier.time_s("all_gather", size, tp)
    else:
        one = tier.time_s("all_reduce", size, tp)
    return TP_ALLREDUCES_PER_LAYER_FWD * one, TP_ALLREDUCES_PER_LAYER_BWD * one


def overlap_cost_s(overlapped_s: float, kept: float, outlasting_s: float = 0.0) -> float:
    """Seconds a step loses to communication that runs beside compute: max(0, (1 - kept) x overlapped -
    kept x outlasting).

    A collective's kernels (NCCL, RCCL) run on SMs and use HBM bandwidth and L2 beside the compute kernels they
    overlap, which run at `kept` of their rate meanwhile. A collective of H seconds beside C seconds of compute
    (overlapped = min(H, C) of it beside the compute, outlasting = max(0, H - C) after it) then ends the pair at
    max(H, C + (1 - kept) x H) rather than max(H, C): where the compute is the longer, it falls (1 - kept) x H
    behind; where the collective is, the slowed compute may still finish inside it, and the pair grows only by
    max(0, C - kept x H). Both are the formula above. Lee et al. measured the compute of GPT and Llama training on
    A100, H100, MI250 and MI210 running 18.9% slower on average (40.0% at most) while communication overlapped it:
    kept = 1 / 1.189 = 0.841 (1 / 1.40 = 0.714 at the worst). e.g. 100 ms of gradient reduce-scatter hidden under
    a longer backward at kept 0.841: 15.9 ms; 379 ms of collectives beside 240 ms of compute (overlapped 240,
    outlasting 139): max(0, 38.2 - 116.9) = 0, the compute done inside the collectives' time. Ref: Lee et al.,
    "Characterizing Compute-Communication Overlap in GPU-Accelerated Distributed Deep Learning: Performance and
    Power Implications", arXiv 2507.03114 (2025), abstract.
    """
    _check_nonneg(overlapped_s=overlapped_s, outlasting_s=outlasting_s)
    if not 0 < kept <= 1:
        raise ValueError(f"kept must be in (0, 1], got {kept}")
    return max(0.0, (1 - kept) * overlapped_s - kept * outlasting_s)


def tp_overlap_exposed_s(comm_s: float, gemm_s: float) -> float:
    """Tensor-parallel communication left exposed when it is overlapped with the layers' GEMMs, seconds.

    Megatron-Core's --tp-comm-overlap (Transformer Engine userbuffers, sequence parallel) splits each
    all-gather before a column-parallel GEMM and each reduce-scatter after a row-parallel GEMM into chunks
    pipelined with the GEMM's own chunks, so communication hides under the GEMMs that consume or produce
    it; only what exceeds them stays on the critical path: max(0, comm - GEMM).
    Ref: Wang et al., "Overlap Communication with Dependent Computation via Decomposition in Large Deep
    Learning Models", ASPLOS 2023 (the decomposition TE implements). e.g. 0.4 s of all-reduces under 1.9 s
    of GEMMs: 0; 2 s under 1.5 s: 0.5 s. What the hidden part costs the GEMMs (shared SMs and HBM) is
    overlap_cost_s's, added by the caller (ddplan.step).
    """
    _check_nonneg(comm_s=comm_s, gemm_s=gemm_s)
    return max(0.0, comm_s - gemm_s)
