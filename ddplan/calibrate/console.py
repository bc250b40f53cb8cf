"""What `ddplan calibrate` shows while it measures: its plan and estimate, the stages as they run, the calibration
table and the held-out step's check (ddplan.cli parses the flags and calls these; torch is imported here, when a
calibration runs)."""

from __future__ import annotations

from pathlib import Path

from ddplan.errors import DdplanError
from ddplan.render import info as _info


def from_log(spec, hw, path, out, gpus, device_batch_size, total_batch_size, attention, window) -> None:
    """`calibrate --from-log`: a calibration read from a training log (ddplan.calibrate.fromlog), written atomically,
    and one line saying what it found."""
    import yaml

    from ddplan import render
    from ddplan.calibrate.fromlog import calibration_from_log
    from ddplan.files import atomic_write
    from ddplan.verdicts import from_log_line

    data, m = calibration_from_log(path, spec, hw, gpus=gpus, device_batch_size=device_batch_size,
                                   total_batch_size=total_batch_size, attention=attention, window=window)
    atomic_write(Path(out), "# written by `ddplan calibrate --from-log`\n" + yaml.safe_dump(data, sort_keys=False))
    render.echo(from_log_line(m, out))


def measure(spec, hw, device, quick, out, nproc, micro_batches, device_batch_size, seq_len, attention,
            compile_step, cpu_malloc=None) -> None:
    """`calibrate` on this machine: its plan and first estimate on stderr, the stages with the time left (a spinner
    on a terminal, a line a stage in a log), then the calibration table and the held-out step's check on stdout."""
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from ddplan import inputs

    from ddplan import render
    from ddplan.errors import UsageError

    try:
        import torch
    except ImportError:
        raise UsageError("needs torch: pip install 'ddplan[calibrate]' (a CUDA or ROCm build on a GPU box)",
                         field="calibrate") from None
    from ddplan import verdicts
    from ddplan.calibrate.eta import StageLines
    from ddplan.calibrate.runner import CalibrateRequest, Interrupted, check_step, prepare, resolve_device, run

    device, nproc = resolve_device(device, nproc)
    req = CalibrateRequest(
        model=spec, hardware=hw, device=device, out=Path(out), quick=quick,
        micro_batches=tuple(inputs.int_list(micro_batches, "--micro-batches")) if micro_batches else (),
        attention=tuple(a.strip() for a in attention.split(",")) if attention else (), nproc=nproc,
        seq_len=seq_len, step_batch=device_batch_size, compile_step=compile_step, cpu_malloc=cpu_malloc)
    console = Console(stderr=True)
    ready = prepare(req, torch.cuda.mem_get_info()[0] if device == "cuda" else None)
    shapes, stages, plan = ready.shapes, ready.stages, ready.progress_args()
    _info(verdicts.calibrate_plan(spec, req, shapes, stages, ready.gemm_shape_count, ready.program, ready.compile_s,
                                  ready.first_estimate_s))
    try:
        if console.is_terminal:
            with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console,
                          transient=True) as bar:
                task = bar.add_task("calibrate", total=len(stages))
                lines = StageLines(**plan, every_s=1.0,
                                    show=lambda text, stage: bar.update(task, description=text, completed=stage))
                with lines.beating():
                    cal, hw_used, held_out = run(req, lines.stage, shapes, lines.within, lines.probed)
        else:  # a log, a pipe: a line per stage and at least every PROGRESS_EVERY_S, with the time left
            lines = StageLines(**plan)
            with lines.beating():
                cal, hw_used, held_out = run(req, lines.stage, shapes, lines.within, lines.probed)
    except (Interrupted, KeyboardInterrupt) as e:
        kept = (f"{out} keeps what was measured and lists what was not" if Path(out).exists()
                else "nothing was written yet")
        raise DdplanError(f"interrupted ({e or 'SIGINT'}); {kept}", field="calibrate") from None
    rows = verdicts.calibration_rows(cal)
    render.echo(render.table(rows, "table", title=f"calibration of {hw_used.name} -> {out}", digits=4))
    check = check_step(spec, hw_used, cal, held_out, device)
    if check:
        render.echo(render.table(check, "table", title=verdicts.held_out_title(cal), digits=4,  # seconds to 0.1 ms
                                 column_digits={k: 1 for k in check[0] if k.endswith("_pct")}))
    _info(verdicts.calibrate_summary(cal))
