"""How fast `ddplan plan` is: the layout search in-process, and the command end to end.

    python benchmarks/bench_plan.py [--runs 3] [--max-gpus 512]

Prints one small table per case, (nanochat d24, mi300x) and (llama-3-70b, h100-sxm):
  - `ddplan.plan.search` over GPU counts 1, 2, 4, ..., --max-gpus in one request (median of --runs,
    specs loaded once beforehand): layouts considered, kept (fit, divide, least recompute), seconds,
    layouts considered per second;
  - the same search per GPU count alone (one run each), to see where the time goes;
  - `ddplan plan --model M --hardware H --gpus 1,2,...,--max-gpus --format csv` run as a subprocess
    (median of --runs): what a user waits, interpreter start-up and imports included.
The issue's target (issue 6, outcome 3): a search over every layout for 1 to 512 GPUs within 2 s.
A script, not a test: timings are reported, never asserted (STYLE.md, Tests).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = (("d24", "mi300x"), ("llama-3-70b", "h100-sxm"))
TARGET_S = 2.0


def search_once(model, hardware, gpus: tuple[int, ...]):
    from ddplan.plan import PlanRequest, search

    t0 = time.perf_counter()
    result = search(PlanRequest(model=model, hardware=(hardware,), gpus=gpus))
    return time.perf_counter() - t0, result


def median_subprocess_s(argv: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(argv, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def print_table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for i, r in enumerate(rows):
        print("  ".join(c.rjust(w) if j else c.ljust(w) for j, (c, w) in enumerate(zip(r, widths))).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))


def main() -> None:
    from ddplan.reasons import plan_reasons

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--max-gpus", type=int, default=512)
    args = parser.parse_args()

    sys.path.insert(0, str(ROOT))
    from ddplan.registry import load_hardware, load_model

    gpus = tuple(2**i for i in range(args.max_gpus.bit_length()) if 2**i <= args.max_gpus)
    ddplan = shutil.which("ddplan")
    cmd = [ddplan] if ddplan else [sys.executable, "-m", "ddplan.cli"]
    header = ("gpus", "considered", "kept", "seconds", "layouts/s")
    for model_name, hw_name in CASES:
        model, hw = load_model(model_name), load_hardware(hw_name)
        search_once(model, hw, (8,))  # warm the imports (pandas) outside the timing
        runs = [search_once(model, hw, gpus) for _ in range(args.runs)]
        seconds = statistics.median(t for t, _ in runs)
        result = runs[0][1]
        rows = [header]
        for g in gpus:
            t, r = search_once(model, hw, (g,))
            rows.append((str(g), f"{r.considered:,}", f"{len(r.rows):,}", f"{t:.3f}", f"{r.considered / t:,.0f}"))
        rows.append((f"{gpus[0]}-{gpus[-1]} (median of {args.runs})", f"{result.considered:,}",
                     f"{len(result.rows):,}", f"{seconds:.3f}", f"{result.considered / seconds:,.0f}"))
        argv = [*cmd, "plan", "--model", model_name, "--hardware", hw_name, "--gpus", ",".join(map(str, gpus)),
                "--format", "csv"]
        e2e = median_subprocess_s(argv, args.runs)
        print(f"\nddplan.plan.search: {model.name} on {hw.name}, GPU counts {gpus[0]}..{gpus[-1]}")
        print_table(rows)
        verdict = "within" if seconds <= TARGET_S else "OVER"
        print(f"one search over {gpus[0]}-{gpus[-1]} GPUs: {seconds:.2f} s ({verdict} the {TARGET_S:g} s target); "
              f"choice: {plan_reasons(result)[0] if result.rows else '-'}")
        print(f"end to end: `ddplan plan --model {model_name} --hardware {hw_name} --gpus {gpus[0]},...,{gpus[-1]} "
              f"--format csv` (subprocess, median of {args.runs}): {e2e:.2f} s")
    print(f"\n(python {sys.version.split()[0]}, {'`ddplan` console script' if ddplan else 'python -m ddplan.cli'})")


if __name__ == "__main__":
    main()
