"""ddplan against published measured runs: the validation run behind the README's "How far to trust it".

    python benchmarks/validation.py            # in-sample, leave-one-source-out, the fits and the band

Prints (1) `ddplan validate`'s summary on the shipped dataset (validation/published_runs.yaml), (2) the
same with the fitted parameters (each fitted hardware's `efficiency.gemm.sustained`) re-fitted without
each source in turn, (3) the fits on the whole dataset (the GEMM sustained fractions and the dropless load
imbalance of validation/moe_routing.yaml), to compare with the specs, and (4) the
band of measured / predicted (ddplan.validation.band_ratio: a BAND_LEVEL prediction interval for a new source's run),
in sample and leaving each source out (the latter is ddplan.price.VALIDATED_RATIO, the uncalibrated band), then (5) llm-foundry's sequence-length sweep
(validation/llmfoundry_h100_8gpu.yaml), which no fit sees. Takes about two minutes on two cores.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ddplan import validation as V  # noqa: E402
from ddplan.price import VALIDATED_RATIO, VALIDATED_RATIO_MOE  # noqa: E402
from ddplan.registry import load_hardware  # noqa: E402
from ddplan.runs import ROUTING, SEQ_SWEEP, load_routing, load_runs, shipped_dataset  # noqa: E402
from ddplan.specs import DROPLESS_IMBALANCE  # noqa: E402


def show(title: str, scored: list) -> None:
    print(f"\n{title}")
    print(f"{'group':26s} {'runs':>4s} {'median|e|%':>10s} {'max|e|%':>8s} {'mean e%':>8s} {'in band%':>8s} "
          f"{'half-w%':>8s}")
    for s in V.summaries(scored):
        r = s.row()
        print(f"{r['group']:26s} {r['runs']:4d} {r['median_abs_error_pct']:10.1f} {r['max_abs_error_pct']:8.1f} "
              f"{r['mean_error_pct']:+8.1f} {r['inside_band_pct']:8.0f} {r['median_band_half_width_pct']:8.1f}")


def main() -> None:
    where = shipped_dataset()
    runs = load_runs()
    t0 = time.perf_counter()
    scored = V.score_all(runs, where)
    print(f"{len(scored)} runs from {len({s.source for s in scored})} sources, priced in {time.perf_counter() - t0:.1f} s")
    for s in scored:
        print(f"  {s.id:52s} {s.hardware:14s} {s.gpus:6,d} GPUs  measured {s.measured_s:8.4g} s  predicted "
              f"{s.predicted_s:8.4g} s  {100 * s.error:+6.1f}%  {'in band' if s.inside else 'OUT of band'}")
    show("In sample (the shipped fits):", scored)
    fitted = V.fitted_hardware()
    t0 = time.perf_counter()
    held = V.leave_one_source_out(runs, where, fitted)
    show(f"Leave one source out (re-fitting {', '.join(fitted)}; {time.perf_counter() - t0:.0f} s):", held)
    print("\nFits on the whole dataset (compare with the hardware specs' efficiency.gemm.sustained):")
    for hw in [h for h in fitted if h in V.FIT_GROUPS]:
        print(f"  {hw}: fitted {V.fit_sustained(runs.runs, hw, where)}, spec "
              f"{load_hardware(hw).efficiency.gemm.sustained.value}")
    fits = V.fit_dropless_imbalance(load_routing(), runs, where)
    print(f"  dropless load imbalance ({ROUTING}): fitted {V.dropless_imbalance(fits)}, "
          f"ddplan.specs.DROPLESS_IMBALANCE {DROPLESS_IMBALANCE}")
    for f in fits:
        print(f"    {f.seq_len:7,d} tokens: dropless {100 * (f.slowdown - 1):4.1f}% slower measured, experts and "
              f"all-to-alls {100 * f.moe_share:3.0f}% of the step -> imbalance {f.imbalance:.3f}")
    level = f"{100 * V.BAND_LEVEL:g}% interval"
    median = statistics.median(s.measured_s / s.predicted_s for s in scored)
    for title, group, tail in (("in sample", scored, f" (median {median:.3f})"),
                               ("leaving each source out (dense runs)", held,
                                f"; ddplan.price.VALIDATED_RATIO = {VALIDATED_RATIO}")):
        band = V.band_ratio(group)
        print(f"\nmeasured / predicted {title}: {level} " + (f"{band[0]:.3f}-{band[1]:.3f}" if band else
                                                              "none (fewer than two sources)") + tail)
    moe = V.moe_band_ratio(held)
    if moe:
        print(f"mixture of experts (the dense band stretched to each MoE run): {moe[0]:.3f}-{moe[1]:.3f}; "
              f"ddplan.price.VALIDATED_RATIO_MOE = {VALIDATED_RATIO_MOE}")
    sweep_file = str(Path(where).with_name(SEQ_SWEEP))
    sweep = V.score_all(load_runs(sweep_file), sweep_file)
    print(f"\nllm-foundry's sequence-length sweep ({SEQ_SWEEP}, not fitted to), error by sequence length:")
    for s in sorted(sweep, key=lambda s: (s.params, s.id)):
        print(f"  {s.id:52s} attention {100 * s.attention_share:4.0f}% of the step  {100 * s.error:+6.1f}%")
    show("Sequence-length sweep (out of sample: no fit saw it):", sweep)


if __name__ == "__main__":
    main()
