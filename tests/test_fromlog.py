"""ddplan.calibrate.fromlog: step times from a nanochat training log (no torch)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ddplan.calibrate.fromlog import measurement_from_log, parse_log

# nanochat base_train.py's step line (print0 on rank 0), under torchrun prefixes, with other lines mixed in
SAMPLE = """\
W0601 12:00:00.000000 1234 torch/distributed/run.py:792] Setting OMP_NUM_THREADS environment variable
[rank0]: Vocab size: 32,768
[rank0]: step 00000/08352 (0.00%) | loss: 10.397 | lrm: 1.00 | dt: 41234.50ms | tok/sec: 25,426 | bf16_mfu: 5.13 | epoch: 1 | total time: 0.00m
[rank0]: step 00010/08352 (0.12%) | loss: 7.912 | lrm: 1.00 | dt: 7800.00ms | tok/sec: 67,216 | bf16_mfu: 27.15 | epoch: 1 | total time: 0.00m
[rank0]: step 00011/08352 (0.13%) | loss: 7.701 | lrm: 1.00 | dt: 7712.34ms | tok/sec: 67,981 | bf16_mfu: 27.46 | epoch: 1 | total time: 0.13m
[default0]:step 00012/08352 (0.14%) | loss: 7.650 | lrm: 1.00 | dt: 7700.00ms | tok/sec: 68,089 | bf16_mfu: 27.50 | epoch: 1 | total time: 0.26m | eta: 1071.2m
[rank0]: Step 00012 | Validation bpb: 1.2345
step 00013/08352 (0.16%) | loss: 7.600 | lrm: 1.00 | dt: 7750.00ms | tok/sec: 67,650 | mfu: 27.32 | epoch: 1 | total time: 0.39m | eta: 1071.0m
[rank0]: step 00014/08352 (0.17%) | loss: 7.550 | lrm: 1.00 | dt: 7720.00ms | tok/sec: 67,913 | bf16_mfu: 27.43 | epoch: 1 | total time: 0.52m
"""


def test_parse_log_reads_every_step_line_and_skips_the_rest():
    rows = parse_log(SAMPLE)
    assert [r["step"] for r in rows] == [0, 10, 11, 12, 13, 14]
    r = rows[2]
    assert r["dt_s"] == pytest.approx(7.71234)
    assert r["tok_per_sec"] == 67_981
    assert r["mfu_pct"] == pytest.approx(27.46)
    assert r["num_iterations"] == 8352
    assert r["loss"] == pytest.approx(7.701)
    assert rows[3]["dt_s"] == pytest.approx(7.7)  # [default0]: prefix without a space
    assert rows[4]["mfu_pct"] == pytest.approx(27.32)  # older nanochat: "mfu:"


def test_parse_log_handles_carriage_return_progress_lines():
    text = "\rstep 00011 (1.0%) | loss: 3.0 | dt: 100ms | tok/sec: 5,242 | mfu: 40.1% | remaining: 10s" \
           "\rstep 00012 (1.1%) | loss: 3.0 | dt: 102ms | tok/sec: 5,140 | mfu: 39.3% | remaining: 9s\n"
    rows = parse_log(text)
    assert [(r["step"], r["num_iterations"], r["mfu_pct"]) for r in rows] == [(11, None, 40.1), (12, None, 39.3)]
    assert [r["dt_s"] for r in rows] == pytest.approx([0.1, 0.102])


def test_measurement_is_the_median_after_step_10_and_infers_the_batch():
    m = measurement_from_log(SAMPLE, model="nanochat-d24", gpus=8, device_batch_size=32, attention="sdpa-fused",
                             window_pattern="L", source="sample log")
    # steps 11..14: 7.71234, 7.70, 7.75, 7.72 -> median (7.71234 + 7.72) / 2
    assert m.step_time_s == pytest.approx((7.71234 + 7.72) / 2)
    assert m.total_batch_tokens == 524_288  # 67,981 x 7.71234 s = 524,292 -> nearest multiple of 1024
    assert "inferred from tok/sec x dt" in m.source and m.source.startswith("sample log")
    assert (m.gpus, m.device_batch_size, m.window_pattern, m.compiled) == (8, 32, "L", True)


def test_measurement_keeps_a_given_batch_and_counts_a_repeated_step_once():
    text = SAMPLE + "[rank0]: step 00014/08352 (0.17%) | loss: 7.5 | lrm: 1.00 | dt: 9000.00ms | tok/sec: 58,254\n"
    m = measurement_from_log(text, model="d24", gpus=8, device_batch_size=32, total_batch_tokens=1_048_576,
                             attention="sdpa-fused", source="sample log")
    assert m.total_batch_tokens == 1_048_576 and "inferred" not in m.source
    assert m.step_time_s == pytest.approx((7.71234 + 7.75) / 2)  # step 14 now 9.0 s: 7.70, 7.71, 7.75, 9.0


def test_measurement_errors():
    with pytest.raises(ValueError, match="no step lines"):
        measurement_from_log("nothing here\n[rank0]: Vocab size: 32,768\n", model="d24", gpus=1,
                             device_batch_size=32, attention="sdpa-fused", source="x log")
    with pytest.raises(ValueError, match="after step 10"):
        measurement_from_log(SAMPLE.split("[rank0]: step 00011")[0], model="d24", gpus=1,
                             device_batch_size=32, attention="sdpa-fused", source="x log")


def test_fromlog_does_not_import_torch():
    code = "import sys, ddplan.calibrate.fromlog; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
