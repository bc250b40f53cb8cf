"""Step times from a training log: `ddplan calibrate --from-log FILE` (no torch needed).

nanochat's scripts/base_train.py prints, on rank 0, one line per step:

    step 00012/08352 (0.14%) | loss: 6.123456 | lrm: 1.00 | dt: 7712.34ms | tok/sec: 67,981 | bf16_mfu: 27.46 | ...

(older versions: `mfu: 27.46`, and no `/total`); under torchrun each line may carry a prefix such
as `[rank0]: ` or `[default0]:`. tok/sec is int(total_batch_tokens / dt), all ranks together, and
nanochat adds dt to its training time only for steps > 10 (the first steps include compilation).
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path

from ddplan.calibration import CalibrationSpec, StepMeasurement
from ddplan.errors import SpecError, UsageError
from ddplan.inputs import check_pattern

# "step 00012/08352" or "step 00012", anywhere in the line (after any launcher prefix)
_STEP = re.compile(r"(?<![A-Za-z_])step\s+(\d+)(?:/(\d+))?")
_DT = re.compile(r"\bdt:\s*([0-9]*\.?[0-9]+)\s*ms")
_TOK = re.compile(r"tok/sec:\s*([0-9][0-9,]*)")
_MFU = re.compile(r"\b(?:bf16_)?mfu:\s*([0-9]*\.?[0-9]+)")
_LOSS = re.compile(r"\bloss:\s*([-+0-9.eE]+|nan|inf)")
WARMUP_STEPS = 10  # nanochat: `if step > 10: total_training_time += dt`
TOKEN_ROUNDING = 1024


def parse_log(text: str) -> list[dict]:
    """The step lines of a log, in order: step, num_iterations, dt_s, tok_per_sec, mfu_pct, loss.

    A line counts when it has `step N` and `dt: X ms`; tok/sec, mfu and loss are None where absent.
    Carriage-return progress lines (`\\rstep ...`) are split like newlines.
    """
    rows = []
    for line in text.splitlines():
        step, dt = _STEP.search(line), _DT.search(line)
        if step is None or dt is None:
            continue
        tok, mfu, loss = _TOK.search(line), _MFU.search(line), _LOSS.search(line)
        rows.append({
            "step": int(step.group(1)),
            "num_iterations": int(step.group(2)) if step.group(2) else None,
            "dt_s": float(dt.group(1)) * 1e-3,
            "tok_per_sec": int(tok.group(1).replace(",", "")) if tok else None,
            "mfu_pct": float(mfu.group(1)) if mfu else None,
            "loss": float(loss.group(1)) if loss else None,
        })
    return rows


def measurement_from_log(text: str, *, model: str, gpus: int, device_batch_size: int,
                         total_batch_tokens: int | None = None, attention: str,
                         window_pattern: str | None = None, source: str, seq_len: int | None = None,
                         compiled: bool = True) -> StepMeasurement:
    """A StepMeasurement from a log: the median dt over steps > 10 (nanochat's own timer skips the rest).

    A step logged twice (a resumed run) counts once, its last line. total_batch_tokens, when not
    given, is inferred as the median of tok/sec x dt over those steps, rounded to the nearest multiple
    of 1024, and the source says so. Raises ValueError when the log has no step lines, none after
    step 10, or (inferring) no tok/sec.
    """
    rows = parse_log(text)
    if not rows:
        raise ValueError("no step lines")
    by_step = {r["step"]: r for r in rows}
    timed = [r for s, r in sorted(by_step.items()) if s > WARMUP_STEPS]
    if not timed:
        raise ValueError(f"no step lines after step {WARMUP_STEPS} (found steps {min(by_step)}..{max(by_step)}; "
                         f"nanochat's timer skips the first {WARMUP_STEPS}, which include compilation)")
    step_time_s = statistics.median(r["dt_s"] for r in timed)
    notes = [f"median dt of {len(timed)} steps {timed[0]['step']}..{timed[-1]['step']} "
             f"(steps <= {WARMUP_STEPS} excluded)"]
    if total_batch_tokens is None:
        products = [r["tok_per_sec"] * r["dt_s"] for r in timed if r["tok_per_sec"]]
        if not products:
            raise ValueError("total_batch_tokens not given and the log has no tok/sec to infer it from")
        total_batch_tokens = max(TOKEN_ROUNDING,
                                 round(statistics.median(products) / TOKEN_ROUNDING) * TOKEN_ROUNDING)
        notes.append(f"total_batch_tokens {total_batch_tokens:,} inferred from tok/sec x dt, "
                     f"rounded to a multiple of {TOKEN_ROUNDING}")
    return StepMeasurement(
        model=model, gpus=gpus, step_time_s=step_time_s, device_batch_size=device_batch_size,
        total_batch_tokens=total_batch_tokens, attention=attention, window_pattern=window_pattern,
        seq_len=seq_len, compiled=compiled, source=f"{source}; {'; '.join(notes)}",
    )


def calibration_from_log(path: str, spec, hw, *, gpus: int, device_batch_size: int | None,
                         total_batch_size: int | None, attention: str | None, window: str | None
                         ) -> tuple[dict, StepMeasurement]:
    """(a calibration file's data holding the log's step, that step) for `calibrate --from-log PATH`: the run
    the log records on `hw` (--hardware, required), its attention one of the hardware's (default: its default)
    and its micro-batch and window the recipe's unless given. Errors name the flag or the file."""
    if hw is None:
        raise UsageError("--from-log needs --hardware (the GPU the log was written on)", field="--hardware")
    names = [a.name for a in hw.attention]
    if attention is not None and attention not in names:
        raise UsageError(f"{attention!r} is not an attention implementation of {hw.name}; allowed: "
                         f"{', '.join(names)}", field="--log-attention")
    if window:
        check_pattern(window, "--window")
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
    return data, m
