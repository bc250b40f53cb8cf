"""Bands by evidence: how much of ddplan's dataset of published runs stands behind a prediction's stack, GPU and
precision, and the wider band a prediction takes where little does (issue 35).

The uncalibrated band (ddplan.price.VALIDATED_RATIO) is the spread of measured / predicted over every published run,
each source priced with fits made without it. It speaks for runs like the dataset's. A run on a training stack, a
GPU or a precision that the dataset has seen through fewer than MIN_RUNS runs, or through one source only, is not:
nothing checked ddplan there from two directions. Such a value is *thin*, and a prediction on it takes, on either
side, the wider of the base band and the spread ddplan showed on the dataset's own thin values: every dense run
(16-bit or fp8) whose framework (or GPU, or precision) is thin, priced leaving its source out, its sources as random
effects (ddplan.validation.unseen_ratios, source_band). That group is the nearest one to "a value ddplan has not seen", measured out of
sample. `ddplan validate --leave-one-source-out` widens each held-out run by tables made without its source
(ddplan.validation._evidence_left_out), as it makes the base band without that source, so its share in band does not
credit a source or a group with its own runs. The
figures below are the shipped dataset's (validation/published_runs.yaml); tests/test_validation.py
fails when they drift from it, and benchmarks/validation.py prints them.
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_RUNS = 5  # fewer runs than this on a value, or one source only, and the value is thin
DIMENSIONS = ("framework", "hardware", "precision")

# dimension -> value -> (runs, sources) in the shipped dataset (every run, mixtures of experts included: a run on a
# stack is evidence about that stack whatever its model)
EVIDENCE: dict[str, dict[str, tuple[int, int]]] = {
    "framework": {"composer": (18, 1), "fms-fsdp": (8, 1), "megatron-core": (16, 3), "megatron-deepspeed": (1, 1),
                  "megatron-lm": (157, 4), "nanochat": (1, 1), "nemo": (46, 2), "olmo-core": (10, 1),
                  "torchtitan": (6, 1)},
    "hardware": {"a100-sxm-40gb (16-bit)": (2, 1), "a100-sxm-80gb (16-bit)": (157, 6), "b200 (fp8)": (13, 1),
                 "b300 (fp8)": (2, 1), "gb200 (16-bit)": (2, 2), "gb200 (fp8)": (9, 1), "gb300 (fp8)": (3, 1),
                 "h100-sxm (16-bit)": (38, 7),
                 "h100-sxm (fp8)": (29, 5), "h200 (fp8)": (3, 1), "mi300x (16-bit)": (1, 1), "mi355x (fp8)": (4, 1)},
    "precision": {"bf16": (49, 10), "fp16": (151, 3), "fp8": (63, 6)},
}
# dimension -> (low, high, runs, sources): the band of measured / predicted (ddplan.validation.source_band: an 80%
# prediction interval for a run from a new source, sources as random effects), leaving each source out, over the dense
# runs whose value of that dimension is thin (ddplan.validation.unseen_ratios), rounded outward. As 5th-95th
# percentiles (before 2026-12-06's interval): framework 0.81-1.28, hardware 0.95-1.32. The hardware group's four
# sources give its interval a t on 3 degrees of freedom. Before MLPerf's MI355X runs (mlperf-training-amd, 2026-12-06:
# NeMo's second source, so NeMo left the thin stacks, and the MI355X joined the thin GPUs at 0.77-0.82 x): framework
# 0.81-1.31 (75 runs, 6 sources), hardware 0.77-1.53 (28, 3); before Megatron's and DeepSpeed's full recompute re-ran
# a block whole and the 2021 Megatron-LM README's runs joined the A100 fit (2026-12-07: the unfitted GPUs' assumed
# fraction moved with the A100's, 0.777 -> 0.783): framework 0.84-1.29, hardware 0.66-1.52; at the 0.85 level, before
# BAND_LEVEL moved to 0.80 the same day: 0.85-1.25 and 0.66-1.53; the framework band's low end 0.87 before the
# Megatron-LM README's two strong-scaling runs (2026-12-07, seventh session), the thin GPUs' 0.70-1.44 before the
# MI355X's forward attention was measured (the same day), and 0.71-1.43 (32 runs) before MLPerf's B300 and GB300
# runs joined the thin GPUs (2026-12-07, eighth session); the thin GPUs' 0.71-1.45 before reduce-scatter and all-gather
# across nodes paid the ring's latency (comm.ring_latency_s, ninth session); 0.71-1.44 before MLPerf's two 512-GPU
# GB200/GB300 8B runs were placed on the 64-GPU NVLink domains they ran on (runs.Network.gpus_per_node, tenth session);
# the thin stacks' 0.88-1.22 (38 runs, 5 sources) before AWS's six torchtitan runs joined them (twelfth session), and
# 0.89-1.20 before their eager rows were priced op by op (fusions "decomposed", the same session); the thin GPUs'
# 0.71-1.46 before MLPerf's runs reduced their gradients in their configs' buckets, a collective each (Layout.grad_bucket,
# thirteenth session: its Blackwell 8B runs, the thin GPUs' own, read up to 22 points closer)
UNSEEN_RATIO: dict[str, tuple[float, float, int, int]] = {
    "framework": (0.88, 1.19, 44, 6),
    "hardware": (0.71, 1.43, 37, 4),
}


@dataclass(frozen=True)
class Thin:
    """One thin value behind a prediction: its dimension, its value, the dataset's runs and sources on it, and the
    band of the runs on thin values of that dimension (UNSEEN_RATIO)."""

    dimension: str
    value: str
    runs: int
    sources: int
    band: tuple[float, float]
    group_runs: int
    group_sources: int


def hardware_key(hardware: str, precision: str) -> str:
    """The hardware dimension's value: a GPU and its precision family, "gb200 (fp8)" or "gb200 (16-bit)" (every other
    precision: bf16 and fp16, and fp32, which the same `sustained` fraction prices). Each has a fitted fraction of its
    own (sustained, sustained_fp8), so runs in one are no evidence for the other: GB200's fp8 runs did not check its
    16-bit fraction (an assumed one until a 16-bit run is fitted)."""
    return f"{hardware} ({'fp8' if precision == 'fp8' else '16-bit'})"


def is_thin(runs: int, sources: int) -> bool:
    """Fewer than MIN_RUNS runs, or one source: nothing checked ddplan on it from two directions."""
    return runs < MIN_RUNS or sources < 2


def thin_values(framework: str | None, hardware: str, precision: str,
                evidence: dict[str, dict[str, tuple[int, int]]] | None = None,
                unseen: dict[str, tuple[float, float, int, int]] | None = None) -> tuple[Thin, ...]:
    """The thin values among a prediction's framework (None: not stated, not weighed), hardware and precision, by
    the shipped EVIDENCE and UNSEEN_RATIO or the tables given (leave-one-source-out's, without the held-out source;
    a dimension missing from `unseen` has no thin run to measure a spread on, and widens nothing)."""
    evidence = EVIDENCE if evidence is None else evidence
    unseen = UNSEEN_RATIO if unseen is None else unseen
    out = []
    for dim, value in zip(DIMENSIONS, (framework, hardware_key(hardware, precision), precision)):
        if value is None or dim not in unseen:
            continue
        runs, sources = evidence.get(dim, {}).get(value, (0, 0))
        if is_thin(runs, sources):
            lo, hi, group_runs, group_sources = unseen[dim]
            out.append(Thin(dim, value, runs, sources, (lo, hi), group_runs, group_sources))
    return tuple(out)


def widened(base: tuple[float, float], thin: tuple[Thin, ...]) -> tuple[float, float]:
    """The base band widened, on each side, to the widest thin value's group band."""
    return (min([base[0], *(t.band[0] for t in thin)]), max([base[1], *(t.band[1] for t in thin)]))
