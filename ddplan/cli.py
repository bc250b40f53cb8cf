"""The `ddplan` command line: parse flags, load specs, call the model, render. No math here.

Errors: a DdplanError prints one line `error: <file>: <field>: <what>` on stderr and exits 1 (2 for
usage errors); typer's own usage errors are reduced to one line too. DDPLAN_DEBUG=1 re-raises.
"""

from __future__ import annotations

import os
import sys
from enum import Enum

import typer

from ddplan.errors import DdplanError

app = typer.Typer(
    name="ddplan",
    help="Plan distributed training of language models: time, cost, memory, and what to fix first.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
specs_app = typer.Typer(help="The built-in hardware and model specs (any spec can also be a YAML path).",
                        no_args_is_help=True)
app.add_typer(specs_app, name="specs")


class SpecFormat(str, Enum):
    text = "text"
    json = "json"


class Format(str, Enum):
    table = "table"
    markdown = "markdown"
    csv = "csv"
    json = "json"


class Recompute(str, Enum):
    none = "none"
    selective = "selective"
    full = "full"


DEFAULT_HARDWARE = "mi300x"  # the canonical case (shared/seed): nanochat d24 on AMD MI300X

ModelOpt = typer.Option(..., "--model", "-m", help="Model: a built-in (d24, nanochat-d24, gpt2, llama-3-8b), "
                        "any nanochat dN, or a YAML path.")
HardwareOpt = typer.Option(DEFAULT_HARDWARE, "--hardware", help="GPU: a built-in (mi300x, h100-sxm, h200, b200, "
                           "...) or a YAML path. Default mi300x, the canonical case.")
FormatOpt = typer.Option(Format.table, "--format", help="Output format; csv and json are data only.")


def _positive(value: int | float | None, flag: str) -> None:
    from ddplan.errors import UsageError

    if value is not None and value <= 0:
        raise UsageError(f"must be positive, got {value}", field=flag)


@specs_app.command("list")
def specs_list() -> None:
    """List the built-in hardware and models, one line each."""
    from ddplan import render
    from ddplan.describe import list_rows

    render.echo(render.spec_list(list_rows()))


@specs_app.command("show")
def specs_show(
    name: str = typer.Argument(..., help="A built-in name or alias (mi300x, d24, nanochat-d24, gpt2) or a YAML path."),
    format: SpecFormat = typer.Option(SpecFormat.text, "--format", help="text: the spec as YAML and derived "
                                      "figures; json: both as one JSON object."),
) -> None:
    """Show one spec, with the figures ddplan derives from it."""
    from ddplan import render
    from ddplan.describe import describe

    spec, derived = describe(name)
    render.echo(render.spec_json(spec, derived) if format is SpecFormat.json else render.spec_text(spec, derived))


@app.command("memory")
def memory_cmd(
    model: str = ModelOpt,
    hardware: str = HardwareOpt,
    gpus: int = typer.Option(1, "--gpus", help="GPUs in the data-parallel group (x tp x pp)."),
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel degree."),
    pp: int = typer.Option(1, "--pp", help="Pipeline-parallel degree."),
    zero: str = typer.Option("0,1,2,3", "--zero", help="ZeRO stages to show, comma-separated."),
    device_batch_size: int = typer.Option(None, "--device-batch-size", help="Sequences per GPU per micro-batch "
                                          "(default: the recipe's)."),
    attention: str = typer.Option(None, "--attention", help="Attention implementation (default: the hardware's "
                                  "default; see `ddplan specs show HARDWARE`)."),
    recompute: Recompute = typer.Option(Recompute.none, "--recompute", help="Activation recompute policy."),
    window_pattern: str = typer.Option(None, "--window-pattern", help="Override the window pattern (e.g. L, SSSL)."),
    compiled: bool = typer.Option(None, "--compile/--no-compile", help="torch.compile'd model (changes what is "
                                  "saved for backward; default: the recipe's)."),
    measured_peak: float = typer.Option(None, "--measured-peak", help="A measured peak in GB (1e9 bytes): say which "
                                        "attention and recompute setups it is consistent with."),
    calibration: str = typer.Option(None, "--calibration", help="A calibration file: its measured peak memory for "
                                    "this model (if any) is used as --measured-peak."),
    plot: str = typer.Option(None, "--plot", help="Also write the memory per GPU, stacked by term (PNG or SVG)."),
    format: Format = FormatOpt,
) -> None:
    """Memory per GPU by ZeRO stage: each term, the total against usable memory, and the verdict."""
    from ddplan import render
    from ddplan.fit import Setup, alternatives, consistent_with, verdict, zero_rows
    from ddplan.layout import Layout, check_layout
    from ddplan.registry import load_hardware, load_model

    for value, flag in ((gpus, "--gpus"), (tp, "--tp"), (pp, "--pp"), (device_batch_size, "--device-batch-size"),
                        (measured_peak, "--measured-peak")):
        _positive(value, flag)
    stages = _int_list(zero, "--zero", allowed=(0, 1, 2, 3))
    spec, hw = load_model(model), load_hardware(hardware)
    if calibration and measured_peak is None:
        from ddplan.registry import load_calibration

        from ddplan.calibration import steps_for_model

        peaks = [m.peak_memory_gb for m in steps_for_model(load_calibration(calibration), {spec.name, *spec.aliases})
                 if m.peak_memory_gb]
        measured_peak = peaks[0] if peaks else None
    _check_pattern(window_pattern)
    mb = device_batch_size or spec.recipe.device_batch_size
    dp = gpus
    accum = max(1, spec.recipe.total_batch_tokens // (dp * mb * spec.recipe.seq_len))
    layout = Layout(dp=dp, tp=tp, pp=pp, micro_batch=mb, grad_accum=accum,
                    attention=attention or hw.default_attention, recompute=recompute.value,
                    compiled=spec.recipe.compiled if compiled is None else compiled)
    try:
        check_layout(layout, spec)
    except DdplanError as e:
        e.field = e.field or "--gpus/--tp/--pp"
        raise
    setup = Setup(layout=layout, window_pattern=window_pattern)
    _check_plot_path(plot)
    rows = zero_rows(spec, hw, setup, stages)
    if plot:
        from ddplan.plot import plot_memory

        plot_memory(rows, plot, title=f"{spec.name} on {gpus * tp * pp} x {hw.name}",
                    capacity_gib=hw.memory.usable_gib.value)
    alts = alternatives(spec, hw, setup) if not any(r["fits"] and r["setup"] == "native" for r in rows) else []
    words = verdict(spec, hw, rows, alts)
    matches = consistent_with(spec, hw, setup, measured_peak) if measured_peak else []
    if measured_peak:
        ok = [m for m in matches if m["consistent"]]
        words.append(f"Measured {measured_peak:g} GB is consistent with: " + (
            "; ".join(f"{m['attention']}, recompute {m['recompute']}, {'compiled' if m['compiled'] else 'eager'} "
                      f"({m['predicted_gb']:.1f} GB, {m['error_pct']:+.0f}%)" for m in ok[:4])
            if ok else "none of the configurations within 10% (closest: "
            f"{matches[0]['attention']}, {matches[0]['recompute']}, {matches[0]['predicted_gb']:.1f} GB)") + ".")
    title = (f"{spec.name} on {gpus * tp * pp} x {hw.name} (dp {dp}, tp {tp}, pp {pp}), device batch {mb} x "
             f"{spec.recipe.seq_len}, {layout.attention}, recompute {layout.recompute}, "
             f"{'compiled' if layout.compiled else 'eager'}: memory per GPU (GiB = 2^30 bytes; fits = at most "
             f"95% of usable)")
    if format is Format.json:
        import json

        render.echo(json.dumps({"title": title, "rows": rows, "verdict": words, "measured_peak_matches": matches},
                               indent=2))
        return
    render.echo(render.table(rows, format.value, title=title))
    if format in (Format.table, Format.markdown):
        render.echo(render.lines(words, format.value))


class Knob(str, Enum):
    auto = "auto"
    gemm = "gemm"
    attention = "attention"
    compute = "compute"


@app.command("table")
def table_cmd(
    model: str = ModelOpt,
    hardware: str = HardwareOpt,
    gpus: str = typer.Option("1,8", "--gpus", help="GPU counts, comma-separated (pure data parallelism)."),
    attention: str = typer.Option(None, "--attention", help="Attention implementations, comma-separated "
                                  "(default: every one on the hardware)."),
    window: str = typer.Option(None, "--window", help="Window patterns, comma-separated, e.g. L,SSSL (default: the "
                               "model's, and L when it differs)."),
    price: float = typer.Option(None, "--price", help="USD per GPU-hour (default: the hardware spec's first price)."),
    steps: int = typer.Option(None, "--steps", help="Optimizer steps (overrides the recipe's budget)."),
    tokens: float = typer.Option(None, "--tokens", help="Training tokens (overrides the recipe's budget)."),
    param_data_ratio: float = typer.Option(None, "--param-data-ratio", help="Tokens per parameter (overrides the "
                                           "recipe's budget)."),
    total_batch_size: int = typer.Option(None, "--total-batch-size", help="Tokens per optimizer step (default: the "
                                         "recipe's)."),
    device_batch_size: int = typer.Option(None, "--device-batch-size", help="Sequences per GPU per micro-batch."),
    recompute: Recompute = typer.Option(Recompute.none, "--recompute", help="Activation recompute policy."),
    compiled: bool = typer.Option(None, "--compile/--no-compile", help="torch.compile'd model (default: recipe)."),
    calibration: str = typer.Option(None, "--calibration", help="A calibration file (from `ddplan calibrate` or "
                                    "written by hand): measurements replace assumptions."),
    measured_step_time: float = typer.Option(None, "--measured-step-time", help="A step time you measured, "
                                             "seconds; ddplan fits one knob to it and derives the other rows."),
    measured_gpus: int = typer.Option(None, "--measured-gpus", help="GPUs of the measured run (default: the "
                                      "smallest of --gpus)."),
    measured_attention: str = typer.Option(None, "--measured-attention", help="Attention of the measured run "
                                           "(default: the hardware's default)."),
    measured_window: str = typer.Option(None, "--measured-window", help="Window pattern of the measured run "
                                        "(default: the first of --window)."),
    fit: Knob = typer.Option(Knob.auto, "--fit", help="Which efficiency the measurement calibrates; auto picks "
                             "the one whose range moves the measured row most."),
    startup_min: float = typer.Option(5.0, "--startup-min", help="Minutes outside steps at start (launch, "
                                      "compile warm-up)."),
    eval_every: int = typer.Option(None, "--eval-every", help="Evaluate every N steps (0: never; default: the "
                                   "recipe's)."),
    eval_tokens: int = typer.Option(None, "--eval-tokens", help="Tokens per evaluation (default: the recipe's)."),
    checkpoint_every: int = typer.Option(0, "--checkpoint-every", help="Checkpoint every N steps (0: at the end "
                                         "only)."),
    fp8: bool = typer.Option(False, "--fp8", help="Run eligible GEMMs in fp8 (refused where the model's fp8 format "
                             "does not run on the hardware)."),
    plot: str = typer.Option(None, "--plot", help="Also write wall-clock and cost against GPU count (PNG or SVG)."),
    format: Format = FormatOpt,
) -> None:
    """The decision table: time, cost, MFU and memory for each GPU count, attention and window, explained."""
    import datetime as dt

    from ddplan import render
    from ddplan.calibration import StepMeasurement
    from ddplan.errors import UsageError
    from ddplan.plan import TableRequest, build_table
    from ddplan.registry import load_calibration, load_hardware, load_model
    from ddplan.run import RunOverheads
    from ddplan.specs import Budget, Price

    for value, flag in ((price, "--price"), (steps, "--steps"), (tokens, "--tokens"),
                        (param_data_ratio, "--param-data-ratio"), (total_batch_size, "--total-batch-size"),
                        (device_batch_size, "--device-batch-size"), (measured_step_time, "--measured-step-time"),
                        (measured_gpus, "--measured-gpus"), (eval_tokens, "--eval-tokens")):
        _positive(value, flag)
    for value, flag in ((startup_min, "--startup-min"), (eval_every, "--eval-every"),
                        (checkpoint_every, "--checkpoint-every")):
        if value is not None and value < 0:
            raise UsageError(f"must be >= 0, got {value}", field=flag)
    gpu_list = tuple(_int_list(gpus, "--gpus"))
    windows = tuple(w.strip() for w in window.split(",")) if window else ()
    for w in windows:
        _check_pattern(w, "--window")
    given = [f for f, v in (("--steps", steps), ("--tokens", tokens), ("--param-data-ratio", param_data_ratio)) if v]
    if len(given) > 1:
        raise UsageError(f"give at most one of --steps, --tokens, --param-data-ratio (got {', '.join(given)})",
                         field=given[1])
    spec, hw = load_model(model), load_hardware(hardware)
    budget = None
    if given:
        budget = Budget(steps=steps, tokens=int(tokens) if tokens else None, param_data_ratio=param_data_ratio,
                        ratio_params=spec.recipe.budget.ratio_params)
    price_spec = None
    if price is not None:
        price_spec = Price(usd_per_gpu_hour=price, billing="per_gpu", provider="--price", date=dt.date.today(),
                           source="given on the command line")
    cal = load_calibration(calibration) if calibration else None
    if cal is not None and cal.hardware not in (hw.name, *hw.aliases):
        raise UsageError(f"calibration file is for {cal.hardware!r}, the table for {hw.name!r}", field="--calibration")
    measurement = None
    if measured_step_time is not None:
        if measured_window:
            _check_pattern(measured_window, "--measured-window")
        measurement = StepMeasurement(
            model=spec.name, gpus=measured_gpus or min(gpu_list), step_time_s=measured_step_time,
            device_batch_size=device_batch_size or spec.recipe.device_batch_size,
            total_batch_tokens=total_batch_size or spec.recipe.total_batch_tokens,
            attention=measured_attention or hw.default_attention,
            window_pattern=measured_window or (windows[0] if windows else spec.architecture.window_pattern),
            compiled=spec.recipe.compiled if compiled is None else compiled, recompute=recompute.value,
            source="stated with --measured-step-time")
    elif any(v is not None for v in (measured_gpus, measured_attention, measured_window)):
        raise UsageError("needs --measured-step-time", field="--measured-gpus/--measured-attention/--measured-window")
    req = TableRequest(
        model=spec, hardware=hw, gpus=gpu_list,
        attentions=tuple(a.strip() for a in attention.split(",")) if attention else (), windows=windows,
        device_batch_size=device_batch_size, total_batch_tokens=total_batch_size, budget=budget, price=price_spec,
        overheads=RunOverheads(startup_s=startup_min * 60, eval_every_steps=eval_every, eval_tokens=eval_tokens,
                               checkpoint_every_steps=checkpoint_every),
        compiled=compiled, recompute=recompute.value, measurement=measurement, knob=fit.value, calibration=cal,
        fp8=fp8)
    _check_plot_path(plot)
    result = build_table(req)
    if plot:
        from ddplan.plot import plot_scenarios

        plot_scenarios(result.rows, plot, title=f"{spec.name} on {hw.name}")
    title = (f"{spec.name} on {hw.name}: decision table (steps {result.rows[0]['steps']:,}, "
             f"{result.rows[0]['global_batch_tokens']:,} tokens/step)")
    if format is Format.json:
        import json

        render.echo(json.dumps({"title": title, "rows": result.rows, "verdict": result.verdict,
                                "warnings": result.warnings, "assumptions": result.assumptions}, indent=2))
        return
    if format is Format.csv:
        render.echo(render.table(result.rows, "csv"))
        _warn(sorted(set(result.warnings)))
        return
    render.echo(render.table(render.decision_rows(result.rows), format.value, title=title))
    render.echo(render.lines([
        "Columns: step_s = compute_s (attention included: attn_s) + exposed comm_s + optim_s (+ pipeline bubble); "
        "band = every efficiency at the slow and fast ends of its range; basis: measured | fitted (derived from "
        "a measurement) | model (assumptions only); '!' = flagged, see the warnings on stderr."], format.value))
    render.echo(render.lines(["Verdict:"] + result.verdict, format.value))
    if result.warnings:
        _warn(sorted(set(result.warnings)))
    render.echo(render.lines(["Assumptions:"] + result.assumptions, format.value))


@app.command("calibrate")
def calibrate_cmd(
    model: str = ModelOpt,
    hardware: str = typer.Option(None, "--hardware", help="The hardware spec these measurements refine (default: "
                                 "guessed from the device name; on CPU a spec is built from the measurements)."),
    device: str = typer.Option("auto", "--device", help="auto (a GPU if torch sees one), cuda (NVIDIA or ROCm), "
                               "or cpu (small shapes, for tests)."),
    quick: bool = typer.Option(False, "--quick", help="Fewer shapes and repeats (a short run)."),
    out: str = typer.Option("calibration.yaml", "--out", help="Where to write the calibration file."),
    nproc: int = typer.Option(None, "--nproc", help="GPUs on this box for the collectives (default: all visible; "
                              "launches itself under torchrun)."),
    micro_batches: str = typer.Option(None, "--micro-batches", help="Micro-batch sizes for the GEMM shapes, "
                                      "comma-separated (default: the recipe's device batch, /2 and /4)."),
    device_batch_size: int = typer.Option(None, "--device-batch-size", help="Micro-batch of the held-out training "
                                          "step and the attention benchmark (default: the recipe's)."),
    seq_len: int = typer.Option(None, "--seq-len", help="Sequence length (default: the recipe's)."),
    attention: str = typer.Option(None, "--attention", help="Attention implementations to time, comma-separated "
                                  "(default: every one in the hardware spec)."),
    from_log: str = typer.Option(None, "--from-log", help="Read step times from a training log (nanochat's format) "
                                 "instead of running benchmarks."),
    gpus: int = typer.Option(1, "--gpus", help="--from-log: GPUs of the logged run."),
    total_batch_size: int = typer.Option(None, "--total-batch-size", help="--from-log: tokens per step (default: "
                                         "from tok/sec x dt)."),
    log_attention: str = typer.Option(None, "--log-attention", help="--from-log: attention implementation of the "
                                      "logged run (default: the hardware's default)."),
    window: str = typer.Option(None, "--window", help="--from-log: window pattern of the logged run."),
) -> None:
    """Measure what the planner otherwise assumes, on this machine, and write a calibration file."""
    from ddplan.registry import load_hardware, load_model

    for value, flag in ((nproc, "--nproc"), (device_batch_size, "--device-batch-size"), (seq_len, "--seq-len"),
                        (gpus, "--gpus"), (total_batch_size, "--total-batch-size")):
        _positive(value, flag)
    spec = load_model(model)
    hw = load_hardware(hardware) if hardware else None
    if from_log:
        _calibrate_from_log(spec, hw, from_log, out, gpus, device_batch_size, total_batch_size, log_attention, window)
        return
    _calibrate_run(spec, hw, device, quick, out, nproc, micro_batches, device_batch_size, seq_len, attention)


def _calibrate_from_log(spec, hw, path, out, gpus, device_batch_size, total_batch_size, attention, window) -> None:
    from pathlib import Path

    import yaml

    from ddplan import render
    from ddplan.calibrate.fromlog import measurement_from_log
    from ddplan.calibrate.runner import atomic_write
    from ddplan.calibration import CalibrationSpec
    from ddplan.errors import SpecError, UsageError

    if hw is None:
        raise UsageError("--from-log needs --hardware (the GPU the log was written on)", field="--hardware")
    if window:
        _check_pattern(window, "--window")
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise SpecError(f"cannot read: {e.strerror}", file=path) from None
    try:
        m = measurement_from_log(text, model=spec.name, gpus=gpus,
                                 device_batch_size=device_batch_size or spec.recipe.device_batch_size,
                                 total_batch_tokens=total_batch_size, attention=attention or hw.default_attention,
                                 window_pattern=window or spec.architecture.window_pattern,
                                 source=f"training log {Path(path).name}")
    except ValueError as e:
        raise SpecError(str(e), file=path) from None
    data = {"kind": "calibration", "version": 1, "hardware": hw.name, "step_times": [m.model_dump(mode="json")]}
    CalibrationSpec.model_validate(data)
    atomic_write(Path(out), "# written by `ddplan calibrate --from-log`\n" + yaml.safe_dump(data, sort_keys=False))
    render.echo(f"{m.step_time_s:.4g} s/step (median over the logged steps after step 10), {m.gpus} GPU(s), "
                f"{m.total_batch_tokens:,} tokens/step -> {out}")


def _calibrate_run(spec, hw, device, quick, out, nproc, micro_batches, device_batch_size, seq_len, attention) -> None:
    from pathlib import Path

    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from ddplan import render
    from ddplan.errors import UsageError

    try:
        import torch
    except ImportError:
        raise UsageError("needs torch: pip install 'ddplan[calibrate]' (a CUDA or ROCm build on a GPU box)",
                         field="calibrate") from None
    from ddplan.calibrate.runner import CalibrateRequest, check_step, run

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise UsageError(f"must be auto, cuda or cpu, got {device!r}", field="--device")
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("torch sees no GPU (CUDA or ROCm); use --device cpu for a test run", field="--device")
    if nproc is None:
        nproc = torch.cuda.device_count() if device == "cuda" else 1
    req = CalibrateRequest(
        model=spec, hardware=hw, device=device, out=Path(out), quick=quick,
        micro_batches=tuple(_int_list(micro_batches, "--micro-batches")) if micro_batches else (),
        attention=tuple(a.strip() for a in attention.split(",")) if attention else (), nproc=nproc,
        seq_len=seq_len, step_batch=device_batch_size)
    console = Console(stderr=True)
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console,
                  transient=True) as bar:
        task = bar.add_task("calibrate", total=9)

        def progress(msg: str) -> None:
            bar.update(task, description=msg, advance=1)

        cal, hw_used, held_out = run(req, progress)
    rows = [{"figure": "peak GEMM", "value": cal.peak_gemm_tflops, "unit": "TFLOP/s"},
            {"figure": "GEMM shapes measured", "value": len(cal.gemm), "unit": "shapes"},
            {"figure": "attention points", "value": len(cal.attention), "unit": "points"},
            {"figure": "HBM copy", "value": cal.hbm_tbyte_per_s, "unit": "TB/s"},
            {"figure": "elementwise ops", "value": cal.pointwise_tbyte_per_s, "unit": "TB/s"},
            {"figure": "AdamW step", "value": cal.optimizer_tbyte_per_s, "unit": "TB/s"},
            {"figure": "kernel overhead", "value": cal.kernel_overhead_us, "unit": "us"},
            {"figure": "collective points", "value": len(cal.collectives), "unit": "points"}]
    render.echo(render.table(rows, "table", title=f"calibration of {hw_used.name} -> {out}", digits=4))
    check = check_step(spec, hw_used, cal, held_out, device)
    if check:
        render.echo(render.table(check, "table", title="held-out training step: measured vs predicted "
                                 "(before = hardware spec, after = micro-benchmarks)", digits=4))
    for failure in cal.failures:
        console.print(f"note: {failure}", highlight=False)


class Objective(str, Enum):
    time = "time"
    cost = "cost"


@app.command("plan")
def plan_cmd(
    model: str = ModelOpt,
    hardware: str = typer.Option(DEFAULT_HARDWARE, "--hardware", help="One or more GPUs, comma-separated "
                                 "(built-in names or YAML paths)."),
    gpus: str = typer.Option("8", "--gpus", help="GPU counts to search, comma-separated (e.g. 8,16,64)."),
    objective: Objective = typer.Option(Objective.time, "--objective", help="Rank by wall-clock or by cost."),
    deadline: float = typer.Option(None, "--deadline", help="Hours: the cheapest layout that finishes in time."),
    budget: float = typer.Option(None, "--budget", help="USD: the fastest layout within the budget."),
    calibration: str = typer.Option(None, "--calibration", help="A calibration file (measurements replace "
                                    "assumptions)."),
    price: float = typer.Option(None, "--price", help="USD per GPU-hour (default: each hardware's first price)."),
    total_batch_size: int = typer.Option(None, "--total-batch-size", help="Tokens per optimizer step."),
    tp_across_nodes: bool = typer.Option(False, "--tp-across-nodes", help="Allow tensor parallelism beyond one "
                                         "node (kept inside a node by default)."),
    top: int = typer.Option(10, "--top", help="How many layouts to list (table, markdown, json; csv lists all)."),
    headroom: float = typer.Option(0.05, "--headroom", help="Fraction of usable memory a layout must leave free."),
    startup_min: float = typer.Option(5.0, "--startup-min", help="Minutes outside steps at start."),
    plot: str = typer.Option(None, "--plot", help="Also write a plot (PNG or SVG) of the Pareto layouts."),
    format: Format = FormatOpt,
) -> None:
    """Search the layouts (dp, tp, pp, ZeRO, micro-batch, attention, recompute, schedule) and recommend one."""
    import datetime as dt

    from ddplan import render
    from ddplan.errors import UsageError
    from ddplan.registry import load_calibration, load_hardware, load_model
    from ddplan.run import RunOverheads
    from ddplan.search import PlanRequest, best_per_family, describe, search
    from ddplan.specs import Price

    for value, flag in ((deadline, "--deadline"), (budget, "--budget"), (price, "--price"),
                        (total_batch_size, "--total-batch-size"), (top, "--top")):
        _positive(value, flag)
    if startup_min < 0:
        raise UsageError(f"must be >= 0, got {startup_min}", field="--startup-min")
    if not 0 <= headroom < 1:
        raise UsageError(f"must be in [0, 1), got {headroom}", field="--headroom")
    _check_plot_path(plot)
    spec = load_model(model)
    hws = tuple(load_hardware(h.strip()) for h in hardware.split(",") if h.strip())
    price_spec = None if price is None else Price(usd_per_gpu_hour=price, billing="per_gpu", provider="--price",
                                                  date=dt.date.today(), source="given on the command line")
    req = PlanRequest(model=spec, hardware=hws, gpus=tuple(_int_list(gpus, "--gpus")), objective=objective.value,
                      deadline_h=deadline, budget_usd=budget, top=top,
                      calibration=load_calibration(calibration) if calibration else None, price=price_spec,
                      overheads=RunOverheads(startup_s=startup_min * 60), total_batch_tokens=total_batch_size,
                      tp_across_nodes=tp_across_nodes, headroom=headroom)
    result = search(req)
    columns = ["hardware", "gpus", "dp", "tp", "pp", "zero", "micro_batch", "accum", "attention", "recompute",
               "schedule", "family", "step_s", "wall_clock_h", "cost_usd", "mfu_pct", "memory_gib"]
    shown = [{c: r[c] for c in columns} for r in result.rows[:top]]
    if format is Format.json:
        import json

        render.echo(json.dumps({"rows": result.rows[:top], "pareto": result.pareto, "reasons": result.reasons,
                                "warnings": result.warnings, "considered": result.considered,
                                "rejected": result.rejected}, indent=2, default=str))
    elif format is Format.csv:  # data: every kept layout, ranked (--top limits the human formats)
        render.echo(render.table([{c: r[c] for c in columns} for r in result.rows], "csv"))
    else:
        title = (f"{spec.name}: best {min(top, len(result.rows))} of {len(result.rows):,} layouts that fit "
                 f"({result.considered:,} considered; rejected: {result.rejected['memory']:,} memory "
                 f"(> {100 * (1 - headroom):.0f}% of usable), "
                 f"{result.rejected['divisibility']:,} divisibility, {result.rejected['dominated']:,} dominated "
                 f"by less recompute), by {objective.value}")
        if shown:
            render.echo(render.table(shown, format.value, title=title, digits=2))
        render.echo(render.lines(["Why:"] + result.reasons, format.value))
        if result.pareto:
            render.echo(render.lines(["Pareto front (time vs cost):"] + [
                f"{describe(r)}: {r['wall_clock_h']:.1f} h, ${r['cost_usd']:,.0f}" for r in result.pareto[:8]],
                format.value))
        if result.warnings:
            _warn(result.warnings)
    if format in (Format.csv, Format.json):  # data on stdout; warnings still reach the user
        _warn(result.warnings + ([] if result.rows else result.reasons))
    if plot and result.pareto:
        from ddplan.plot import plot_scenarios

        plot_scenarios(best_per_family(result.rows), plot, title=f"{spec.name}: best layout per family")


def _int_list(text: str, flag: str, allowed: tuple[int, ...] | None = None) -> list[int]:
    from ddplan.errors import UsageError

    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"expected comma-separated integers, got {text!r}", field=flag) from None
    if not values:
        raise UsageError("expected at least one value", field=flag)
    bad = [v for v in values if (allowed is not None and v not in allowed) or v <= 0 and allowed is None]
    if bad:
        allowed_text = ", ".join(map(str, allowed)) if allowed else "positive integers"
        raise UsageError(f"invalid values {bad}; allowed: {allowed_text}", field=flag)
    return values


def _warn(warnings: list[str]) -> None:
    """Warnings go to stderr, one line each: stdout carries the result only."""
    for w in warnings:
        print("warning: " + " ".join(w.split()), file=sys.stderr)


def _check_plot_path(path: str | None) -> None:
    """A plot path must end in .png or .svg and its folder must exist: say so before any work."""
    from pathlib import Path

    from ddplan.errors import UsageError

    if path is None:
        return
    if Path(path).suffix.lower() not in (".png", ".svg"):
        raise UsageError(f"must end in .png or .svg, got {path!r}", field="--plot")
    if not Path(path).expanduser().resolve().parent.is_dir():
        raise UsageError(f"folder does not exist: {Path(path).parent}", field="--plot")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("needs matplotlib: pip install 'ddplan[plot]'", field="--plot") from None


def _check_pattern(pattern: str | None, flag: str = "--window-pattern") -> None:
    from ddplan.errors import UsageError

    if pattern is not None and (not pattern or set(pattern) - {"S", "L"}):
        raise UsageError(f"window pattern must be letters S and L only (e.g. L, SSSL), got {pattern!r}", field=flag)


def main(argv: list[str] | None = None) -> int:
    """Console entry point; returns the exit code instead of raising SystemExit inside tests."""
    debug = os.environ.get("DDPLAN_DEBUG") == "1"
    try:
        result = app(args=argv, standalone_mode=False, prog_name="ddplan")
        return result if isinstance(result, int) else 0
    except DdplanError as e:
        if debug:
            raise
        print(e.one_line(), file=sys.stderr)
        return e.exit_code
    except Exception as e:  # typer/click usage errors carry exit_code and format_message
        if debug:
            raise
        if type(e).__name__ == "NoArgsIsHelpError":  # a bare `ddplan` / `ddplan specs`: the help was shown
            return 0
        if hasattr(e, "format_message") and hasattr(e, "exit_code"):
            print("error: " + " ".join(e.format_message().split()), file=sys.stderr)
            return int(e.exit_code)
        if type(e).__name__ == "Abort":
            print("error: aborted", file=sys.stderr)
            return 1
        message = " ".join(str(e).split())
        print(f"error: internal error: {type(e).__name__}: {message} (set DDPLAN_DEBUG=1 for the traceback)",
              file=sys.stderr)
        return 1


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
