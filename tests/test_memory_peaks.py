"""Measured peak memory (validation/memory_peaks.yaml, `ddplan validate --memory`): each peak priced as `ddplan
table` prices its layout, compared in what the measurement counts, and the fits verdict checked."""

from __future__ import annotations

import pytest
import yaml
from cli_helpers import csv_rows, fails, run_ok

from ddplan import validation as V
from ddplan.errors import DdplanError
from ddplan.runs import load_peaks, load_runs

GB_PER_GIB = 2**30 / 1e9


def test_a_measurement_is_compared_in_what_it_counts():
    """Hand sums: torch's allocated peak counts tensors (not the context, not the allocator's slack); reserved adds
    the slack; a device tool counts everything."""
    terms = {"params": 10.0, "gradients": 10.0, "optimizer": 20.0, "activations": 30.0, "activation_transient": 5.0,
             "comm_buffers": 1.0, "framework": 4.0, "allocator_slack": 2.0}
    assert V.predicted_peak_bytes(terms, "allocated") == 76.0
    assert V.predicted_peak_bytes(terms, "reserved") == 78.0
    assert V.predicted_peak_bytes(terms, "device") == 82.0
    # the names are the memory model's own terms (a renamed term would make NOT_COUNTED exclude nothing)
    from ddplan.replay import price_run

    *_, row = price_run(load_peaks().peaks[0], "seed")
    assert {n for names in V.NOT_COUNTED.values() for n in names} <= set(row.memory.terms)
    with pytest.raises(ValueError):
        V.predicted_peak_bytes(terms, "nvml")


def test_the_seed_s_peak_is_what_memory_predicts_for_its_layout(capsys):
    """The seed ran nanochat d24 on one MI300X at micro-batch 32, window L, fused SDPA, and used ~105 GB (a device
    reading). `ddplan memory` for that layout predicts its whole peak in GiB; the score is that x 2^30 / 1e9,
    -7.6% of 105 GB."""
    (seed,) = [p for p in load_peaks().peaks if p.id == "seed-nanochat-d24-mi300x-1g"]
    scored = V.score_peak(seed, "seed")
    (row,) = [r for r in csv_rows(run_ok(capsys, ["memory", "--model", "d24", "--attention", "sdpa-fused", "--window",
                                                  "L", "--zero", "1", "--format", "csv"]))]
    assert scored.predicted_gb == pytest.approx(float(row["total_gib"]) * GB_PER_GIB, rel=1e-9)
    assert scored.error == pytest.approx(scored.predicted_gb / 105 - 1, rel=1e-12)
    assert -0.08 < scored.error < -0.07 and scored.fits and scored.verdict_right


def _peaks_file(tmp_path, peaks: list[dict]):
    path = tmp_path / "peaks.yaml"
    path.write_text(yaml.safe_dump({"kind": "memory_peaks", "description": "a test", "peaks": peaks}), encoding="utf-8")
    return path


def _peak(**kw) -> dict:
    p = {"id": "p1", "source": {"name": "test", "ref": "a test", "where": "here"},
         "model": {"base": "llama-3-8b", "name": "Llama 3 8B", "seq_len": 8192}, "hardware": "h100-sxm",
         "precision": "bf16", "layout": {"gpus": 8, "micro_batch": 1, "global_batch_sequences": 8, "zero": 3,
                                         "attention": "fa2"},
         "measured": {"peak_gb": 60.0, "what": "allocated", "tool": "torch.cuda.max_memory_allocated"}}
    p.update(kw)
    return p


def test_an_out_of_memory_report_checks_the_verdict_and_the_summary_counts_both_wrong_ones(tmp_path):
    """Llama 3 8B on 8 H100 with plain DDP at 8,192 tokens needs full fp32 states a GPU (~16 B a parameter, 128 GB
    for 8B): ddplan says it does not fit, which an out-of-memory report confirms; the same layout reported as
    having run is a false "does not fit", counted apart."""
    ddp = {"gpus": 8, "micro_batch": 1, "global_batch_sequences": 8, "zero": 0, "attention": "fa2"}
    oom = _peak(id="oom", layout=ddp, outcome="out_of_memory", measured=None)
    ran = _peak(id="ran", layout=ddp)
    peaks = load_peaks(str(_peaks_file(tmp_path, [oom, ran]))).peaks
    scored = [V.score_peak(p, "t") for p in peaks]
    assert [s.fits for s in scored] == [False, False]
    assert [s.verdict_right for s in scored] == [True, False] and scored[0].error is None
    summary = V.peak_summary(scored)
    assert summary["false_does_not_fit"] == 1 and summary["false_fits"] == 0 and summary["verdict_right_pct"] == 50


@pytest.mark.parametrize("change, words", [
    ({"measured": None}, "a configuration that ran needs `measured`"),
    ({"layout": {"gpus": 8, "global_batch_sequences": 8}}, "layout.micro_batch: a peak depends on it"),
    ({"measured": {"peak_gb": 60.0, "what": "nvml", "tool": "x"}}, "measured.what"),
    ({"fp8_recipe": "delayed"}, "fp8_recipe is for fp8 runs; this one is bf16"),
])
def test_a_bad_peak_entry_is_one_line(tmp_path, change, words):
    with pytest.raises(DdplanError) as e:
        load_peaks(str(_peaks_file(tmp_path, [_peak(**change)])))
    assert words in e.value.message or words in (e.value.field or "")


def test_validate_memory_prints_every_peak_and_refuses_what_it_cannot_do(capsys, tmp_path):
    rows = csv_rows(run_ok(capsys, ["validate", "--memory", "--format", "csv"]))
    peaks = load_peaks().peaks
    # every peak, then every published step-time run that is not a peak's too (the seed is both): each ran
    ran = [r for r in rows if r["measured_what"] == V.RAN]
    assert [r["id"] for r in rows[:len(peaks)]] == [p.id for p in peaks] and len(rows) == len(peaks) + len(ran)
    assert {r["id"] for r in ran} == {r.id for r in load_runs().runs} - {p.id for p in peaks}
    assert all(r["outcome"] == "ran" and r["measured_gb"] == "" for r in ran)
    assert {"measured_gb", "predicted_gb", "verdict_right"} <= set(rows[0])
    rows = csv_rows(run_ok(capsys, ["validate", "--memory", "--dataset", str(_peaks_file(tmp_path, [_peak()])),
                                    "--format", "csv"]))
    assert [r["id"] for r in rows] == ["p1"]
    _, err = fails(capsys, ["validate", "--memory", "--plot", str(tmp_path / "p.png")])
    assert "--memory" in err


def test_the_verdict_band_is_the_peaks_spread_and_holds_leaving_each_source_out():
    """Issue 36: ddplan.memory.PEAK_RATIO is the 5th-95th percentile of measured / predicted over the shipped
    peaks, rounded outward by at most 0.01 (a model or dataset change that moves it must move the constant).
    With it, and with each source's peaks judged by the band fitted without them: no configuration that ran is
    called "does not fit", none that ran out of memory "fits", and at most one in five "may not fit"."""
    from ddplan.memory import PEAK_RATIO

    scored = [V.score_peak(p, p.id) for p in load_peaks().peaks]
    lo, hi = V.peak_band(scored)
    assert lo - 0.01 <= PEAK_RATIO[0] <= lo and hi <= PEAK_RATIO[1] <= hi + 0.01
    for judged in (scored, V.peaks_leaving_each_source_out(scored)):
        summary = V.peak_summary(judged)
        assert summary["false_does_not_fit"] == 0 and summary["false_fits"] == 0
        assert summary["may_not_fit_pct"] <= 20
    # the 262 published step-time runs that are not peaks ran too: none of them is "does not fit" (8 were, before
    # Megatron's per-module recompute and llm-foundry's fused loss were stated)
    ran = V.score_published_ran({p.id for p in load_peaks().peaks})
    assert len(ran) == 262
    for judged in (ran, V.peaks_leaving_each_source_out(scored + ran)):
        assert V.peak_summary(judged)["false_does_not_fit"] == 0
    held = V.peaks_leaving_each_source_out(scored)
    bloom = next(s for s in held if s.source == "bigscience-bloom-prequel")
    others = [s for s in scored if s.source != "bigscience-bloom-prequel"]
    assert bloom.band == V.peak_band(others) and bloom.band != V.peak_band(scored)


def test_a_verdict_is_wrong_only_when_it_is_sure_and_mistaken():
    """"may not fit" is never wrong (the limit lies inside the band); "does not fit" for a run that ran and
    "fits" for one that ran out of memory are. A hand case: 86.4 GB predicted against an 81.6 GB limit is "may
    not fit" under x0.74-x1.11 (63.9-95.9 GB) and "does not fit" under x0.95-x1.05 (82.1-90.7 GB)."""
    s = V.PeakScored(id="x", source="s", hardware="h", gpus=8, framework="f", outcome="ran", what="device",
                     measured_gb=76.0, predicted_gb=86.4, total_gb=86.4, limit_gb=81.6, fits=False,
                     verdict="may not fit")
    assert s.with_band((0.74, 1.11)).verdict == "may not fit" and s.with_band((0.74, 1.11)).verdict_right
    assert s.with_band((0.95, 1.05)).verdict == "does not fit" and not s.with_band((0.95, 1.05)).verdict_right
    oom = V.PeakScored(id="y", source="s", hardware="h", gpus=8, framework="f", outcome="out_of_memory", what="-",
                       measured_gb=None, predicted_gb=60.0, total_gb=60.0, limit_gb=81.6, fits=True, verdict="fits")
    assert not oom.verdict_right and oom.with_band((0.74, 1.4)).verdict == "may not fit"


def test_the_markdown_summary_keeps_one_cell_per_column(capsys):
    """`median |error| %` in a markdown header: the | is escaped, so every line has the header's cells (a review
    found the table split into 11 cells over 7 columns)."""
    import re

    out = run_ok(capsys, ["validate", "--memory", "--format", "markdown"])
    summary = out[out.index("**Summary**"):]
    table = [line for line in summary.splitlines() if line.startswith("|")]
    cells = {len(re.split(r"(?<!\\)\|", line)) for line in table}
    assert table and len(cells) == 1


def test_the_shipped_peaks_are_three_sources_and_every_out_of_memory_one_is_called_so():
    """The dataset (issue 36): at least 15 peaks from at least 3 sources; no configuration its source saw run out
    of memory is called "fits" (that would send a user into an OOM): each is "does not fit" or, where the limit
    lies inside its band, "may not fit" (BLOOM's dp 32, tp 2, pp 6 at micro-batch 1: 80.6 GB predicted under
    the 81.6 GB limit, x0.87-x1.29 on it); an `allocated` peak is
    compared with the tensors' bytes alone. Two Megatron functional-test peaks checked by hand against
    Megatron-LM's golden values @d98e8a6 (mem-max-allocated-bytes 53.2193 and 4.3795 GiB)."""
    from ddplan.replay import price_run

    peaks = load_peaks().peaks
    assert len(peaks) >= 15 and len({p.source.name for p in peaks}) >= 3
    scored = [V.score_peak(p, p.id) for p in peaks]
    assert all(s.verdict != "fits" for s, p in zip(scored, peaks) if p.outcome == "out_of_memory")
    assert sum(p.outcome == "out_of_memory" for p in peaks) >= 3
    by_id = {p.id: p for p in peaks}
    assert by_id["megatron-test-7b-tp4-pp1-h100"].measured.peak_gb == round(53.219303131103516 * 2**30 / 1e9, 3)
    assert by_id["megatron-test-tiny-tp1-distopt-h100"].measured.peak_gb == round(4.379479885101318 * 2**30 / 1e9, 3)
    # allocated: the prediction leaves out the CUDA context and framework workspaces and the allocator's slack
    peak = by_id["megatron-test-7b-tp4-pp1-h100"]
    *_, row = price_run(peak, peak.id)
    allocated = V.predicted_peak_bytes(row.memory.terms, "allocated")
    (s,) = [s for s, p in zip(scored, peaks) if p.id == peak.id]
    assert s.predicted_gb == pytest.approx(allocated / 1e9, rel=1e-12)


def test_the_zero_bubble_papers_memory_figures_check_each_schedules_micro_batches_in_flight():
    """validation/memory_peaks_zero_bubble.yaml (56 figures of Qi et al., arXiv 2401.10241, under 1F1B, interleaved
    1F1B, ZB-1p, ZB-2p and ZB-V; kept out of PEAK_RATIO): priced as `validate --memory --dataset` prices it, within 3%
    (median) and 10% (worst) of the paper's figures taken as allocated 10^9 bytes, each schedule's median within 5%,
    every verdict right. Measured 2026-12-07: 2.0% median, 9.4% worst (ZB-2p at 2 micro-batches, where the delayed W
    passes hold more than ddplan's count). In Table 4 ZB-2p's figures sit 1.6-2.0x 1F1B's beside them (59 vs
    30 GB at 1.5B): priced with 1F1B's in-flight count they would be far under, so this checks the schedules'
    counts, not only the states."""
    import statistics
    from pathlib import Path

    from ddplan.runs import ZB_PEAKS, shipped_dataset

    peaks = load_peaks(str(Path(shipped_dataset()).with_name(ZB_PEAKS))).peaks
    scored = [V.score_peak(p, p.id) for p in peaks]
    assert len(scored) == 56
    errors = [abs(s.predicted_gb / s.measured_gb - 1) for s in scored]
    assert statistics.median(errors) <= 0.03 and max(errors) <= 0.10
    for schedule in ("1f1b", "1f1bi", "zb1p", "zb2p", "zbv"):
        mine = [abs(s.predicted_gb / s.measured_gb - 1) for s in scored if s.id.endswith("-" + schedule)]
        assert mine and statistics.median(mine) <= 0.05, schedule
    summary = V.peak_summary(scored)
    assert summary["false_does_not_fit"] == 0 and summary["false_fits"] == 0
    # the same ZB-2p configurations priced as 1F1B read a fifth or more under the paper's figures
    zb2p = [p for p in peaks if p.id.startswith("zb-t4-") and p.id.endswith("-zb2p")]
    assert len(zb2p) == 4
    for p in zb2p:
        as_1f1b = V.score_peak(p.model_copy(update={"layout": p.layout.model_copy(update={"schedule": None})}), p.id)
        assert as_1f1b.predicted_gb / as_1f1b.measured_gb - 1 < -0.2, p.id


def test_torchtitans_reserved_peaks_are_scored_apart_and_read_far_under():
    """validation/memory_peaks_torchtitan.yaml (AWS's torchtitan test case: Llama 3 8B, FSDP2 over 32 H100, batch 1 x
    8,192, per-op checkpointing; torchtitan logs torch's max_memory_reserved, 68.57 and 63.48 GiB): kept out of
    PEAK_RATIO. Both ran, and ddplan says fits (right); its peaks, 38.1 and 35.7 GB, are 48% under: the finding the
    file records (its header). The GiB figures convert to the file's GB by hand: 68.57 x 2^30 / 1e9 = 73.63. With
    them in, the band's 95th percentile would move from 1.21 to about 1.68 (two readings of one source setting it)."""
    from pathlib import Path

    from ddplan.runs import TORCHTITAN_PEAKS, shipped_dataset

    peaks = load_peaks(str(Path(shipped_dataset()).with_name(TORCHTITAN_PEAKS))).peaks
    assert [p.measured.peak_gb for p in peaks] == [73.63, 68.16] and all(p.measured.what == "reserved" for p in peaks)
    scored = [V.score_peak(p, p.id) for p in peaks]
    assert all(s.verdict == "fits" for s in scored)
    assert V.peak_summary(scored)["false_does_not_fit"] == 0
    for s in scored:
        assert -0.55 < s.predicted_gb / s.measured_gb - 1 < -0.40, s.id
    shipped = [V.score_peak(p, p.id) for p in load_peaks().peaks]
    assert V.peak_band(shipped)[1] < 1.25 < 1.6 < V.peak_band(shipped + scored)[1]
