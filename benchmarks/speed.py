"""How long ddplan makes people wait: one table, each figure the median of --runs runs with min and max.

    python benchmarks/speed.py [--runs 5] [--slow-runs 1] [--skip suite,calibrate] [--markdown]

Rows (each a fresh subprocess, what a user or CI waits, interpreter start-up and imports included):
  - the test suite: the README's test command (`python -m pytest -q`), its wall time;
  - `ddplan --help`;
  - `ddplan table --model d24 --gpus 1,8` (the seed command);
  - `ddplan memory --model llama-3-8b --hardware h100-sxm --gpus 8`;
  - `ddplan plan --model llama-3-70b --hardware h100-sxm --gpus 64,128`, and the layout search alone
    in-process (ddplan.plan.search on the same request, specs loaded once), as layouts considered a second;
  - `ddplan validate` and `ddplan validate --leave-one-source-out`;
  - `ddplan calibrate -m d4 --device cpu --quick` (torch on the CPU).
The limits are the fast-feedback issue's (issue 32), on a 2-core machine: suite <= 180 s, validate <= 3 s,
leave-one-source-out <= 30 s, table <= 0.5 s, search >= 100,000 layouts/s. A script, not a test: timings
are reported, never asserted (STYLE.md, Tests). The machine it ran on is printed under the table.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (key, label, argv after `ddplan`, limit as (comparison, value, unit) or None)
COMMANDS = (
    ("help", "--help", ["--help"], None),
    ("table", "table --model d24 --gpus 1,8", ["table", "--model", "d24", "--gpus", "1,8"], ("<=", 0.5, "s")),
    ("memory", "memory --model llama-3-8b --hardware h100-sxm --gpus 8",
     ["memory", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8"], None),
    ("plan", "plan --model llama-3-70b --hardware h100-sxm --gpus 64,128",
     ["plan", "--model", "llama-3-70b", "--hardware", "h100-sxm", "--gpus", "64,128"], None),
    ("validate", "validate", ["validate"], ("<=", 3.0, "s")),
    ("loso", "validate --leave-one-source-out", ["validate", "--leave-one-source-out"], ("<=", 30.0, "s")),
)
SEARCH_LIMIT = 100_000  # layouts considered a second, one core (issue 32)
SUITE_LIMIT_S = 180.0


def ddplan_argv() -> list[str]:
    exe = shutil.which("ddplan")
    return [exe] if exe else [sys.executable, "-m", "ddplan.cli"]


# as users run: Python writes and reads its bytecode caches (some sandboxes set PYTHONDONTWRITEBYTECODE, which
# makes every process compile ddplan from source, ~0.3 s more a command)
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def timed_runs(argv: list[str], runs: int, cwd: Path = ROOT, warm: bool = True) -> list[float]:
    """Wall seconds of each of `runs` runs of a command, after one untimed run (bytecode and file caches
    warm) unless warm is False; output discarded; a failing run stops the script."""
    out = []
    for i in range(runs + warm):
        t0 = time.perf_counter()
        done = subprocess.run(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV)
        if i >= warm:
            out.append(time.perf_counter() - t0)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return out


def search_rates(runs: int) -> list[float]:
    """Layouts considered per second by ddplan.plan.search for Llama-3-70B on 64 and 128 H100s, in-process."""
    sys.path.insert(0, str(ROOT))
    from ddplan.plan import PlanRequest, search
    from ddplan.registry import load_hardware, load_model

    req = PlanRequest(model=load_model("llama-3-70b"), hardware=(load_hardware("h100-sxm"),), gpus=(64, 128))
    search(PlanRequest(model=req.model, hardware=req.hardware, gpus=(8,)))  # imports (pandas) outside the timing
    rates = []
    for _ in range(runs):
        t0 = time.perf_counter()
        result = search(req)
        rates.append(result.considered / (time.perf_counter() - t0))
    return rates


def row(label: str, xs: list[float], unit: str, limit: tuple[str, float, str] | None) -> list[str]:
    med = statistics.median(xs)
    fmt = (lambda v: f"{v:,.0f}") if unit == "layouts/s" else (lambda v: f"{v:.2f}")
    verdict = "-"
    if limit is not None:
        op, value, _ = limit
        ok = med <= value if op == "<=" else med >= value
        verdict = f"{'within' if ok else 'OVER'} {op} {value:,g}"
    return [label, unit, fmt(med), fmt(min(xs)), fmt(max(xs)), str(len(xs)), verdict]


def render(rows: list[list[str]], markdown: bool) -> str:
    header = ["what", "unit", "median", "min", "max", "runs", "limit (issue 32)"]
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
    widths = [max(len(x[i]) for x in [header, *rows]) for i in range(len(header))]
    fmt = lambda r: "  ".join(c.rjust(w) if 1 < i < 6 else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
    return "\n".join([fmt(header).rstrip(), "  ".join("-" * w for w in widths)] + [fmt(r).rstrip() for r in rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each figure (median, min, max)")
    parser.add_argument("--slow-runs", type=int, default=None,
                        help="runs of the test suite and calibrate rows (default: --runs)")
    parser.add_argument("--skip", default="", help="comma-separated: suite, calibrate, or a command key "
                        f"({', '.join(k for k, *_ in COMMANDS)}, search)")
    parser.add_argument("--markdown", action="store_true", help="a Markdown table (for docs/performance.md)")
    args = parser.parse_args()
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    slow = args.slow_runs or args.runs
    ddplan = ddplan_argv()
    rows = []
    if "suite" not in skip:
        xs = timed_runs([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], slow, warm=False)
        rows.append(row("test suite (python -m pytest -q)", xs, "s", ("<=", SUITE_LIMIT_S, "s")))
    for key, label, argv, limit in COMMANDS:
        if key not in skip:
            rows.append(row(f"ddplan {label}", timed_runs([*ddplan, *argv], args.runs), "s", limit))
        if key == "plan" and "search" not in skip:
            rows.append(row("plan's layout search, in-process (llama-3-70b, 64 and 128 h100-sxm)",
                            search_rates(args.runs), "layouts/s", (">=", SEARCH_LIMIT, "layouts/s")))
    if "calibrate" not in skip:
        with tempfile.TemporaryDirectory() as tmp:
            argv = [*ddplan, "calibrate", "-m", "d4", "--device", "cpu", "--quick", "--out", str(Path(tmp) / "c.yaml")]
            rows.append(row("ddplan calibrate -m d4 --device cpu --quick", timed_runs(argv, slow, warm=False),
                            "s", None))
    print(render(rows, args.markdown))
    print(f"\n{time.strftime('%Y-%m-%d')}; {platform.machine()}, {os.cpu_count()} cores, "
          f"{platform.python_implementation()} {platform.python_version()}; each row a fresh process "
          f"except the in-process search")


if __name__ == "__main__":
    main()
