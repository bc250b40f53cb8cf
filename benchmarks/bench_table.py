"""How fast `ddplan table` is: end to end, at import, and the step model alone.

    python benchmarks/bench_table.py [--runs 5] [--layouts 1000]

Prints one small table:
  - `ddplan table --model d24 --gpus 1,8` run as a subprocess (median of --runs), what a user waits;
  - `python -c "import ddplan.cli"` (median of --runs): interpreter start-up plus ddplan's imports;
  - the step model: `ddplan.anatomy.build_anatomy` + `ddplan.step.step_time` over --layouts layouts of
    nanochat d24 on MI300X (micro-batch x GPUs x attention x window x recompute, cycled), as ms per
    1,000 layouts and layouts per second.
A script, not a test: timings are reported, never asserted (STYLE.md, Tests).
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def median_subprocess_s(argv: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(argv, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def step_model_s(n: int) -> float:
    """Seconds to evaluate n layouts (anatomy + step time), specs loaded once beforehand."""
    sys.path.insert(0, str(ROOT))
    from ddplan.anatomy import build_anatomy
    from ddplan.layout import NATIVE_ZERO, Layout
    from ddplan.registry import load_hardware, load_model
    from ddplan.roofline import rates
    from ddplan.step import step_time

    spec, hw = load_model("d24"), load_hardware("mi300x")
    total = spec.recipe.total_batch_tokens // spec.recipe.seq_len  # sequences per step
    grid = list(itertools.product((1, 2, 4, 8, 16, 32), (1, 2, 4, 8), [a.name for a in hw.attention],
                                  ("L", "SSSL", "SSL"), ("none", "selective", "full")))
    cases = list(itertools.islice(itertools.cycle(grid), n))
    impls = {a.name: a for a in hw.attention}
    r = {a: rates(hw, a) for a in impls}
    zero = NATIVE_ZERO[spec.recipe.distribution]
    t0 = time.perf_counter()
    for mb, gpus, att, window, recompute in cases:
        impl = impls[att]
        layout = Layout(dp=gpus, zero=zero, micro_batch=mb, grad_accum=max(1, total // (gpus * mb)), attention=att,
                        recompute=recompute, compiled=True)
        anatomy = build_anatomy(spec, batch=mb, attention=impl.kind, windows=impl.windows, recompute=recompute,
                                compiled=True, window_pattern=window)
        step_time(spec, hw, layout, anatomy, r[att])
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--layouts", type=int, default=1000)
    args = parser.parse_args()

    ddplan = shutil.which("ddplan")
    cmd = [ddplan] if ddplan else [sys.executable, "-m", "ddplan.cli"]
    table_s = median_subprocess_s([*cmd, "table", "--model", "d24", "--gpus", "1,8"], args.runs)
    import_s = median_subprocess_s([sys.executable, "-c", "import ddplan.cli"], args.runs)
    model_s = step_model_s(args.layouts)

    rows = [
        ("ddplan table --model d24 --gpus 1,8 (subprocess)", f"{1000 * table_s:.0f} ms", f"median of {args.runs}"),
        ('python -c "import ddplan.cli"', f"{1000 * import_s:.0f} ms", f"median of {args.runs}"),
        ("step model: build_anatomy + step_time", f"{1000 * model_s * 1000 / args.layouts:.0f} ms / 1,000 layouts",
         f"{args.layouts / model_s:,.0f} layouts/s"),
    ]
    widths = [max(len(r[i]) for r in [("what", "time", "note"), *rows]) for i in range(3)]
    for r in [("what", "time", "note"), tuple("-" * w for w in widths), *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    print(f"\n(python {sys.version.split()[0]}, {'`ddplan` console script' if ddplan else 'python -m ddplan.cli'})")


if __name__ == "__main__":
    main()
