"""The GPU check: run `ddplan calibrate --quick` on one GPU for a small nanochat depth and for d24, and
print what a person checks against the datasheet and the best-known measured rates.

    python benchmarks/gpu_check.py                      # on a CUDA or ROCm box (one GPU; ~8 minutes at most)
    python benchmarks/gpu_check.py --device cpu --models d2 --seq-len 64   # a dry run (the test suite runs it)

Per model it prints: GEMM TFLOP/s (best of the sweep, and the median over the model's own shapes)
against the dense datasheet peak and the best-known measured rate (the hardware spec's GEMM
efficiency); attention TFLOP/s per backend (forward and backward, best point); HBM copy TB/s against
the datasheet; and the held-out training step, measured against the prediction before calibration
(the hardware spec) and after (the micro-benchmarks). The calibration files are kept in --out-dir.
A script, not a test: it reports, it asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--models", default="d4,d24", help="comma-separated model names (default d4,d24)")
    parser.add_argument("--seq-len", type=int, default=None, help="default: the recipe's (256 on CPU)")
    parser.add_argument("--out-dir", default=".", help="where the calibration files go")
    args = parser.parse_args()

    import torch

    from ddplan.calibrate.runner import CalibrateRequest, check_step, plan_shapes, run
    from ddplan.registry import load_model
    from ddplan.memory import MemoryAssumptions

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("torch sees no GPU (CUDA or ROCm); use --device cpu for a dry run")
    start = time.monotonic()
    for name in (m.strip() for m in args.models.split(",") if m.strip()):
        spec = load_model(name)
        req = CalibrateRequest(model=spec, hardware=None, device=args.device, quick=True, seq_len=args.seq_len,
                               out=Path(args.out_dir) / f"calibration-{spec.name}.yaml")
        free = torch.cuda.mem_get_info()[0] if args.device == "cuda" else None
        shapes = plan_shapes(req, free)
        t0 = time.monotonic()
        cal, hw, held_out = run(req, lambda msg: print(f"  {name}: {msg}", file=sys.stderr, flush=True), shapes)
        dtype = "fp32" if args.device == "cpu" else spec.dtypes.compute
        peak = hw.peak.flops_per_s(dtype) / 1e12
        best_known = hw.efficiency.gemm.best.value * peak
        print(f"\n{spec.name} on {cal.provenance.device_name if cal.provenance else args.device} "
              f"(hardware spec {hw.name}; sequence {shapes.seq_len}, held-out micro-batch {shapes.step_batch}; "
              f"{time.monotonic() - t0:.0f} s)")
        if cal.peak_gemm_tflops:
            print(f"  GEMM {dtype}: best of the sweep {cal.peak_gemm_tflops:.4g} TFLOP/s = "
                  f"{100 * cal.peak_gemm_tflops / peak:.1f}% of the {peak:.4g} datasheet peak; best known "
                  f"{best_known:.4g} ({hw.efficiency.gemm.best.source[:60]})")
        if cal.gemm:
            print(f"  GEMM at the model's {len(cal.gemm)} shapes: median {statistics.median(p.tflops for p in cal.gemm):.4g}"
                  f" TFLOP/s, median spread {statistics.median(p.spread_pct or 0 for p in cal.gemm):.3g}%")
        for impl in sorted({p.implementation for p in cal.attention}):
            pts = [p for p in cal.attention if p.implementation == impl]
            print(f"  attention {impl}: forward up to {max(p.fwd_tflops for p in pts):.4g}, backward up to "
                  f"{max(p.bwd_tflops for p in pts):.4g} TFLOP/s ({len(pts)} points)")
        if cal.hbm_tbyte_per_s:
            print(f"  HBM copy {cal.hbm_tbyte_per_s:.4g} TB/s = {100 * cal.hbm_tbyte_per_s * 1e12 / hw.memory.hbm_bytes_per_s:.0f}% "
                  f"of the {hw.memory.hbm_tbyte_per_s.value:g} TB/s datasheet")
        for row in check_step(spec, hw, cal, held_out, args.device):
            print(f"  held-out step, {row['term']}: measured {row['measured_s']:.4g} s; predicted "
                  f"{row['before_s']:.4g} s before calibration ({row['before_error_pct']:+.1f}%), "
                  f"{row['after_s']:.4g} s after ({row['after_error_pct']:+.1f}%)")
        if cal.memory is not None and cal.memory.measured is not None:
            m = cal.memory.measured
            print(f"  memory at the held-out step (micro-batch {m.batch}): allocated {m.allocated_gb:.4g} GB, reserved "
                  f"{m.reserved_gb:.4g} GB (allocator slack {100 * cal.memory.allocator_fraction:.3g}% of the "
                  f"{m.predicted_activations_gb:.4g} GB of predicted activations; assumed "
                  f"{100 * MemoryAssumptions().allocator_fraction:g}%), outside the allocator "
                  f"{m.outside_allocator_gb:.4g} GB (framework {cal.memory.framework_gib:.3g} GiB; assumed "
                  f"{MemoryAssumptions().framework_gib:g})")
            for step in cal.step_times[:1]:
                if step.peak_memory_gb:
                    print(f"  held-out peak: measured {step.peak_memory_gb:.4g} GB allocated; `ddplan memory "
                          f"--calibration FILE` compares it with the prediction")
        for failure in cal.failures:
            print(f"  not measured: {failure}")
    print(f"\ntotal {time.monotonic() - start:.0f} s (python {sys.version.split()[0]}, torch {torch.__version__})")


if __name__ == "__main__":
    main()
