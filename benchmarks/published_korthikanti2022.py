"""ddplan against Korthikanti et al. 2022 (arXiv 2205.05198): Table 5 iteration times and Figure 1 memory,
each priced through the CLI exactly as a user would ask for it.

    python benchmarks/published_korthikanti2022.py

Rows and layouts: the korthikanti2022 runs of validation/published_runs.yaml (each with its source), priced
with the `ddplan table` command each stands for (ddplan.replay.table_command). The "present work" rows use
sequence parallelism with selective recompute (--sequence-parallel).
Prints, per row, the command, the prediction with its band, the measured time and the error; then the
median and largest |error| and how many measurements fall inside the band. tests/test_price.py holds
each row within 15%.
"""

from __future__ import annotations

import contextlib
import csv
import io
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ddplan import cli  # noqa: E402
from ddplan.replay import table_command  # noqa: E402
from ddplan.runs import load_runs  # noqa: E402

# Figure 1 (GPT-3 175B, tp 8, pp 8, micro-batch 1, no recompute): GiB per GPU
FIG1_STATES_GIB, FIG1_ACTIVATIONS_GIB = 45.56, 66.84


def run_csv(argv: list[str]) -> list[dict]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main([*argv, "--format", "csv"])
    if code:
        raise SystemExit(f"ddplan {' '.join(argv)}: {err.getvalue().strip()}")
    data = "".join(line for line in out.getvalue().splitlines(keepends=True) if not line.startswith("#"))
    return list(csv.DictReader(io.StringIO(data)))


def main() -> None:
    rows = [r for r in load_runs().runs if r.source.name == "korthikanti2022"]
    print(f"{'model':10s} {'recompute':10s} {'measured s':>10s} {'ddplan s (band)':>24s} {'error':>7s}  command")
    errors, inside = [], 0
    for r in rows:
        argv = table_command(r)
        (row,) = run_csv(argv)
        pred, lo, hi = float(row["step_s"]), float(row["step_low_s"]), float(row["step_high_s"])
        meas = r.measured.step_time_s
        err = (pred - meas) / meas
        errors.append(abs(err))
        inside += lo <= meas <= hi
        label = r.layout.recompute + ("+SP" if r.layout.sequence_parallel else "")
        print(f"{r.model.base:10s} {label:10s} {meas:10.2f} {pred:10.2f} ({lo:6.2f}-{hi:6.2f}) {100 * err:+6.1f}%  "
              f"ddplan {' '.join(argv)}")
    print(f"\nTable 5: median |error| {100 * statistics.median(errors):.1f}%, max {100 * max(errors):.1f}%, "
          f"{inside} of {len(rows)} measurements inside the band")
    mem_argv = ["memory", "--model", "gpt3-175b", "--hardware", "a100-sxm-80gb", "--gpus", "64", "--tp", "8", "--pp",
                "8", "--vp", "3", "--device-batch-size", "1", "--attention", "megatron-unfused", "--no-compile", "--zero", "0"]
    (m,) = run_csv(mem_argv)
    states = float(m["params_gib"]) + float(m["gradients_gib"]) + float(m["optimizer_gib"])
    print(f"\nFigure 1, GPT-3 175B (ddplan {' '.join(mem_argv)}):")
    print(f"  params + grads + optimizer per GPU: published {FIG1_STATES_GIB} GiB, ddplan {states:.2f} GiB "
          f"({100 * (states / FIG1_STATES_GIB - 1):+.1f}%)")
    acts = float(m["activations_gib"])
    print(f"  activations, no recompute:          published {FIG1_ACTIVATIONS_GIB} GiB, ddplan {acts:.2f} GiB "
          f"({100 * (acts / FIG1_ACTIVATIONS_GIB - 1):+.1f}%, dropout masks included)")


if __name__ == "__main__":
    main()
