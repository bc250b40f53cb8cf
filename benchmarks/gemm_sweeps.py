"""ddplan's GEMM time against published GEMM sweeps, and the shape curve fitted to them.

    python benchmarks/gemm_sweeps.py

For each sweep in validation/gemm_sweeps.yaml (Azure's cuBLASLt / hipBLASLt tables): the half_dim, the
fixed cost of a call and the level that fit it best (ddplan.sweeps.fit_half_dim), the same with the
hardware spec's half_dim, and every point's error under the spec's values. These are the numbers the
specs' efficiency.gemm.half_dim and fixed_us cite. A few seconds.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ddplan.registry import load_hardware  # noqa: E402
from ddplan.sweeps import fit_half_dim, load_sweeps  # noqa: E402


def main() -> None:
    print(f"{'hardware':14s} {'dtype':5s} {'best half_dim':>13s} {'us/call':>7s} {'rms':>6s}   "
          f"{'spec half_dim':>13s} {'us/call':>7s} {'rms':>6s} {'max':>6s}")
    for sweep in load_sweeps().sweeps:
        hw = load_hardware(sweep.hardware)
        free = fit_half_dim(sweep, hw)
        spec = fit_half_dim(sweep, hw, half_dim=hw.efficiency.gemm.half_dim.value)
        edge = " (edge)" if free.at_lower_edge else ""
        worst = max(abs(e) for *_, e in spec.residuals)
        print(f"{hw.name:14s} {sweep.dtype:5s} {free.half_dim:13.1f} {free.fixed_us:7.2f} {100 * free.rms():5.1f}%   "
              f"{spec.half_dim:13.0f} {spec.fixed_us:7.2f} {100 * spec.rms():5.1f}% {100 * worst:5.1f}%{edge}")
        for m, n, k, tflops, err in spec.residuals:
            print(f"    {m:>7d} x {n:>6d} x {k:>6d}  measured {tflops:8.1f} TFLOP/s  ddplan {tflops * (1 + err):8.1f}  "
                  f"{100 * err:+6.1f}%")
    print("\n(edge): the best half_dim is the search's lower bound; the sweep does not bound it from below, the spec "
          "keeps a value within a point of the best rms")


if __name__ == "__main__":
    main()
