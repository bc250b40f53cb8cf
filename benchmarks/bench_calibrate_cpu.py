"""Closing the loop on this CPU: calibrate, then predict a held-out training step of the reference model.

For several tiny models, run `ddplan calibrate` on the CPU (micro-benchmarks only feed the model), time
one real training step of the reference model, and print the prediction error per term before and
after calibration. Issue 5's target: the calibrated step within 20% on every shape.

    python benchmarks/bench_calibrate_cpu.py [--quick]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from ddplan.calibrate.runner import CalibrateRequest, check_step, run
from ddplan.registry import load_model


def tiny(name: str, seq_len: int, **arch):
    spec = load_model(name)
    a = spec.architecture.model_copy(update=arch)
    return spec.model_copy(update={"architecture": a, "recipe": spec.recipe.model_copy(update={"seq_len": seq_len})})


CASES = [
    # (label, spec, micro-batch)
    ("nanochat d2, vocab 32768, 4 x 256", tiny("d2", 256), 4),
    ("nanochat d4, vocab 8192, 2 x 512", tiny("d4", 512, vocab_size=8192), 2),
    ("gpt2 4 layers x 256, 8 x 256", tiny("gpt2", 256, num_layers=4, d_model=256, num_heads=4, num_kv_heads=4,
                                          mlp_hidden_dim=1024), 8),
    ("llama 2 layers x 256, GQA 8/2, 4 x 256", tiny("llama-3-8b", 256, num_layers=2, d_model=256, num_heads=8,
                                                    num_kv_heads=2, head_dim=32, mlp_hidden_dim=768,
                                                    vocab_size=16384, max_seq_len=512), 4),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print(f"{'model':42s} {'measured s':>10s} {'before %':>9s} {'after %':>8s}  worst term after calibration")
    worst_overall = 0.0
    for label, spec, mb in CASES:
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            req = CalibrateRequest(model=spec, hardware=None, device="cpu", out=Path(tmp) / "cal.yaml",
                                   quick=args.quick, step_batch=mb)
            cal, hw, held_out = run(req)
            rows = check_step(spec, hw, cal, held_out, "cpu")
        step = next(r for r in rows if r["term"] == "step")
        terms = [r for r in rows if r["term"] != "step"]
        worst = max(terms, key=lambda r: abs(r["after_error_pct"]))
        worst_overall = max(worst_overall, abs(step["after_error_pct"]))
        print(f"{label:42s} {step['measured_s']:10.4f} {step['before_error_pct']:+9.1f} "
              f"{step['after_error_pct']:+8.1f}  {worst['term']} {worst['after_error_pct']:+.1f}% "
              f"({time.perf_counter() - t0:.0f} s)")
    print(f"worst calibrated step error: {worst_overall:.1f}% (target: 20%)")


if __name__ == "__main__":
    main()
