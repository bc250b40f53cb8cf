"""A command's values as ddplan's inputs: comma-separated lists and ranges, the specs they name, the rules
between options, the training budget and the time outside steps.

What `table`, `memory` and `plan` share between a value given (a flag, or a run file's field: ddplan.runconfig)
and a request priced: every rule a value must follow lives here, each failure one UsageError naming the flag, so
ddplan.cli only parses, calls and prints (issue 34).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from ddplan import bounds
from ddplan.calibration import StepMeasurement, check_against_hardware, measurement_for, steps_for_model
from ddplan.errors import DdplanError, SpecError, UsageError
from ddplan.layout import Options
from ddplan.registry import builtin_names, calibration_hardware, load_calibration, load_hardware, load_model
from ddplan.run import RunOverheads
from ddplan.specs import WEIGHTS, Budget, run_variant

DEFAULT_HARDWARE = "mi300x"  # the canonical case (shared/seed): nanochat d24 on AMD MI300X


def training_budget(spec, steps: int | None, tokens: float | None, param_data_ratio: float | None):
    """--steps, --tokens or --param-data-ratio as a Budget (at most one of them); None: the recipe's."""
    given = [f for f, v in (("--steps", steps), ("--tokens", tokens), ("--param-data-ratio", param_data_ratio)) if v]
    if len(given) > 1:
        raise UsageError(f"give at most one of --steps, --tokens, --param-data-ratio (got {', '.join(given)})",
                         field=given[1])
    if not given:
        return None
    return Budget(steps=steps, tokens=int(tokens) if tokens else None, param_data_ratio=param_data_ratio,
                  ratio_params=spec.recipe.budget.ratio_params)


def overheads(startup_min: float, eval_every: int | None, eval_tokens: int | None, checkpoint_every: int,
               interruptions: float | None, restart_min: float):
    """The time outside steps from its flags (minutes as seconds)."""
    return RunOverheads(startup_s=startup_min * 60, eval_every_steps=eval_every, eval_tokens=eval_tokens,
                        checkpoint_every_steps=checkpoint_every, interruptions_per_gpu_hour=interruptions,
                        restart_s=restart_min * 60)


def load(model: str, hardware: str | None, calibration: str | None, seq_len: int | None, dtype: str | None,
            check_hardware: bool = True, grads: str | None = None, moe_imbalance: float | None = None,
            weights: str | None = None):
    """(model spec, hardware spec, calibration or None). A calibration file supplies what is not given:
    its hardware (the spec it carries, or the built-in it names) and, when it measured this model, its
    sequence length and compute dtype."""
    cal = load_calibration(calibration) if calibration else None
    if hardware and hardware.strip().lower() == "all":
        raise UsageError("this command prices one hardware; `ddplan plan --hardware all` compares every built-in",
                         field="--hardware")
    if hardware:
        hw = load_hardware(hardware)
        if check_hardware:
            check_calibration_hardware(cal, (hw,), calibration)
    else:
        hw = calibration_hardware(cal, calibration) if cal is not None else load_hardware(DEFAULT_HARDWARE)
        if cal is not None:
            check_against_hardware(cal, hw, calibration)
    spec = load_model(model)
    if cal is not None and measurement_for(cal, spec) is not None:  # the shapes it measured this model at
        given = (seq_len, dtype)
        seq_len = seq_len if seq_len is not None else cal.seq_len
        dtype = dtype if dtype is not None else cal.dtype
        if (seq_len, dtype) != given:
            try:
                return variant(spec, seq_len, dtype, grads, moe_imbalance, weights), hw, cal
            except DdplanError as e:
                if e.field == "--moe-imbalance":
                    raise
                raise SpecError(f"its sequence length or dtype does not fit {spec.name}: {e.message}",
                                file=calibration) from None
    return variant(spec, seq_len, dtype, grads, moe_imbalance, weights), hw, cal


def check_calibration_hardware(cal, hws, path: str | None = None) -> None:
    """A calibration given with --hardware must be for one of them (its seq_len and dtype would otherwise
    be applied to hardware it never measured), and its figures possible on it (calibration.check_against_hardware)."""
    if cal is None:
        return
    if not any(cal.hardware in (h.name, *h.aliases) for h in hws):
        raise UsageError(f"calibration file is for {cal.hardware!r}, not --hardware "
                         f"{', '.join(h.name for h in hws)}; drop --hardware to use the calibration's",
                         field="--calibration")
    for h in hws:
        if cal.hardware in (h.name, *h.aliases):
            check_against_hardware(cal, h, path or "--calibration")


def check_ranges(*pairs: tuple[int | float | None, str]) -> None:
    """Every (value, flag) finite and in the flag's range (ddplan.bounds.RANGES); None means not given."""
    for value, flag in pairs:
        bounds.check(flag, value)


def variant(spec, seq_len: int | None, dtype: str | None, grads: str | None = None,
            moe_imbalance: float | None = None, weights: str | None = None):
    """The model at the run's sequence length, compute dtype, gradient dtype, weight storage and MoE load
    imbalance (ddplan.specs.run_variant)."""
    check_ranges((seq_len, "--seq-len"), (moe_imbalance, "--moe-imbalance"))
    if moe_imbalance is not None:
        try:
            spec = run_variant(spec, load_imbalance=moe_imbalance)
        except ValueError as e:
            raise UsageError(str(e), field="--moe-imbalance") from None
    if dtype is not None and dtype not in ("bf16", "fp16", "fp32"):
        raise UsageError(f"must be bf16, fp16 or fp32, got {dtype!r}", field="--dtype")
    if grads is not None and grads not in ("param", "fp32"):
        raise UsageError(f"must be param or fp32, got {grads!r}", field="--grads")
    if weights is not None and weights not in WEIGHTS:
        raise UsageError(f"must be {' or '.join(WEIGHTS)}, got {weights!r}", field="--weights")
    try:
        return run_variant(spec, seq_len=seq_len, dtype=dtype, grads=grads, weights=weights)
    except ValueError as e:
        raise UsageError(str(e), field="--seq-len") from None


def choices(text: str, flag: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    values = tuple(v.strip() for v in text.split(",") if v.strip())
    bad = [v for v in values if v not in allowed]
    if bad or not values:
        raise UsageError(f"invalid values {bad or [text]}; allowed: {', '.join(allowed)}", field=flag)
    return values


def step_values(cal, m) -> dict:
    """What the measured step m (a step of calibration cal) ran, by the name of the flag that sets it."""
    return dict(gpus=m.gpus, tp=m.tp, pp=m.pp, vp=m.pp_virtual_stages, zero=m.zero,
                device_batch_size=m.device_batch_size, total_batch_size=m.total_batch_tokens, recompute=m.recompute,
                attention=m.attention, window=m.window_pattern, compiled=m.compiled, seq_len=cal.seq_len or m.seq_len)


def expert_tp(etp: int | None, spec) -> int:
    """--etp as Options.expert_tp: 1, or 0 (the default: the experts' tp is tp); only for a mixture of experts."""
    if etp is None:
        return 0
    if etp != 1:
        raise UsageError(f"must be 1 (experts whole on each GPU); leave it out for the experts to split over tp, got "
                         f"{etp}", field="--etp")
    if spec.architecture.moe is None:
        raise UsageError(f"{spec.name} is dense (no experts)", field="--etp")
    return 1


def options(sequence_parallel: bool, tp_comm_overlap: bool, max_tp: int | None, shard_group: int | None = None,
             reshard_after_forward: bool = True, overlap_param_gather: bool = False, cp_comm: str = "ring",
             expert_tp: int = 0, spec=None, fp8_all_gather: bool = False, offload_optimizer: bool = False):
    """The framework options (ddplan.layout.Options) from their flags, for the model (Options.for_model: a
    mixture of experts runs tp > 1 with sequence parallelism, on by itself). --sequence-parallel and
    --tp-comm-overlap are Megatron's, so they need tensor parallelism, and overlap needs sequence
    parallelism (Megatron-Core refuses --tp-comm-overlap without it)."""
    moe = spec is not None and spec.architecture.moe is not None
    if tp_comm_overlap and not (sequence_parallel or moe):
        raise UsageError("needs --sequence-parallel (Megatron-Core overlaps tensor-parallel communication only with "
                         "sequence parallelism)", field="--tp-comm-overlap")
    if sequence_parallel and max_tp == 1:
        raise UsageError("needs tensor parallelism: give --tp above 1", field="--sequence-parallel")
    check_ranges((shard_group, "--shard-group"))
    if cp_comm not in ("ring", "all-gather"):
        raise UsageError(f"must be ring or all-gather, got {cp_comm!r}", field="--cp-comm")
    options = Options(sequence_parallel=sequence_parallel, tp_overlap=tp_comm_overlap, shard_group=shard_group or 0,
                      reshard_after_forward=reshard_after_forward, overlap_param_gather=overlap_param_gather,
                      cp_comm=cp_comm.replace("-", "_"), expert_tp=expert_tp, fp8_all_gather=fp8_all_gather,
                      offload_optimizer=offload_optimizer)
    return options.for_model(spec) if spec is not None else options


def int_list(text: str, flag: str, allowed: tuple[int, ...] | None = None, ranges: bool = False) -> list[int]:
    """Comma-separated integers, each once (in the order given), each allowed or within the flag's range.
    With `ranges`, an item A-B doubles from A up to B: 1-512 is 1, 2, 4, ..., 512 (`8,16-64`: 8, 16, 32, 64)."""
    parts = [v.strip() for v in text.split(",")]
    shape = "comma-separated integers" + (" or doubling ranges A-B (e.g. 8,16 or 1-512)" if ranges else "")
    if "" in parts and text.strip():  # "1,,8" or "8,": a count left out, not a separator to skip
        raise UsageError(f"expected {shape}, got {text!r}: an empty item between commas", field=flag)
    parts = [v for v in parts if v]
    if not parts or any(len(v) > 50 or not (v.lstrip("+-").isdigit() or ranges and is_range(v)) for v in parts):
        raise UsageError(f"expected {shape}, got {text!r}", field=flag)
    values: list[int] = []
    for part in parts:
        if not is_range(part) or not ranges:
            values.append(int(part))
            continue
        low, high = (int(x) for x in part.split("-"))
        for v in (low, high):
            bounds.check(flag, v)
        if low > high:
            raise UsageError(f"range {part!r} runs backwards: give the smaller count first (e.g. 1-512)", field=flag)
        while low <= high:
            values.append(low)
            low *= 2
    values = list(dict.fromkeys(values))
    if allowed is not None:
        bad = [v for v in values if v not in allowed]
        if bad:
            raise UsageError(f"invalid values {bad}; allowed: {', '.join(map(str, allowed))}", field=flag)
    else:
        for v in values:
            bounds.check(flag, v)
    return values


def is_range(text: str) -> bool:
    low, dash, high = text.partition("-")
    return bool(dash) and low.isdigit() and high.isdigit()


def hardware_list(text: str | None) -> list[str]:
    """--hardware of `plan`: comma-separated names or YAML paths, `all` for every built-in, each once."""
    names = [h.strip() for h in (text or "").split(",") if h.strip()]
    out = [n for name in names for n in (builtin_names("hardware") if name.lower() == "all" else [name])]
    return list(dict.fromkeys(out))


def check_pattern(pattern: str | None, flag: str = "--window-pattern") -> None:
    if pattern is not None and (not pattern or set(pattern) - {"S", "L"}):
        raise UsageError(f"window pattern must be letters S and L only (e.g. L, SSSL), got {pattern!r}", field=flag)


def calibrated_model(calibration: str | None) -> tuple:
    """`table` or `memory --calibration FILE` without --model: (the model the calibration's first measured step
    ran, the calibration, that step); the model must be a built-in (a calibration names it, it does not carry
    it)."""
    if calibration is None:
        raise UsageError("give a model (or --calibration FILE with a measured step to price what it ran)",
                         field="--model")
    cal = load_calibration(calibration)
    if not cal.step_times:
        raise UsageError(f"{calibration} holds no measured training step to take the model from; give --model",
                         field="--model")
    m = cal.step_times[0]
    try:
        load_model(m.model)
    except DdplanError:
        raise UsageError(f"{calibration} measured model '{m.model}', which is not a built-in; give its spec with "
                         "--model PATH", field="--model") from None
    return m.model, cal, m


# the values table takes as comma-separated lists (text); memory takes them as integers
LISTED = ("gpus", "tp", "pp", "vp", "zero", "device_batch_size")


def as_measured(cal, m, values: dict, given: Collection[str], as_text: bool = True) -> dict:
    """The run a measured step ran (step m of calibration cal: its GPUs, tp, pp, vp, ZeRO, micro-batch, batch,
    recompute, attention, window, compile mode and sequence length), each of `values` not in `given` taking
    the measured value and a given one kept: a flag given wins. as_text: the LISTED values as text, as table's
    comma-separated flags are (else as integers, as memory's)."""
    measured = {k: (str(v) if as_text and k in LISTED and v is not None else v)
                for k, v in step_values(cal, m).items()}
    return {k: v if k in given else measured[k] for k, v in values.items()}


def stated_measurement(spec, hw, step_time_s: float | None, *, gpus: int, tp: int, pp: int, vp: int,
                       zero: int | None, micro_batch: int | None, total_batch_tokens: int | None,
                       attention: str | None, window: str | None, compiled: bool | None, recompute: str,
                       others_given: bool) -> StepMeasurement | None:
    """The step a user measured (--measured-step-time, or a run file's measured.step_time_s) as ddplan's
    StepMeasurement: the layout it ran, each part not stated being the table's first row's (the caller passes
    those), else the recipe's micro-batch, batch and compile mode and the hardware's default attention. None
    without a step time; the measured run's other flags without one are an error (they would say nothing)."""
    if step_time_s is None:
        if others_given:
            raise UsageError("needs --measured-step-time",
                             field="--measured-gpus/--measured-tp/--measured-pp/--measured-attention/--measured-window")
        return None
    check_pattern(window, "--measured-window")
    return StepMeasurement(
        model=spec.name, gpus=gpus, step_time_s=step_time_s,
        device_batch_size=micro_batch or spec.recipe.device_batch_size,
        total_batch_tokens=total_batch_tokens or spec.recipe.total_batch_tokens, tp=tp, pp=pp,
        pp_virtual_stages=vp, zero=zero, attention=attention or hw.default_attention,
        window_pattern=window or spec.architecture.window_pattern,
        compiled=spec.recipe.compiled if compiled is None else compiled, recompute=recompute,
        source="stated with --measured-step-time")


def peak_step(cal, spec, from_calibration: bool):
    """The measured step whose peak memory `memory` compares with its prediction: the calibration's first step
    when the run is the calibration's (no --model), else this model's first step with a peak; None when it has
    none (or there is no calibration)."""
    if cal is None:
        return None
    steps = cal.step_times[:1] if from_calibration else steps_for_model(cal, {spec.name, *spec.aliases})
    return next((m for m in steps if m.peak_memory_gb), None)


def moved_from(cal, m, now: dict, given: Collection[str], stages: Sequence[int]) -> list[str]:
    """The flags given that move the run away from the shape measured step m ran (its peak then says nothing of
    it): each given value in `now` that differs from the step's, and --zero when one stage is asked that is not
    the step's."""
    ran = {**step_values(cal, m), "dtype": cal.dtype}
    moved = [f"--{k.replace('_', '-')}" for k in now if k in given and now[k] != ran[k]]
    if len(stages) == 1 and m.zero is not None and stages[0] != m.zero:
        moved.append("--zero")
    return moved


def expert_degrees(text: str | None, spec) -> tuple[int, ...]:
    """plan's --ep: the expert-parallel degrees to search (() = every one that divides, ddplan.layout); above 1
    only for a mixture-of-experts model."""
    eps = tuple(int_list(text, "--ep")) if text else ()
    if spec.architecture.moe is None and any(e > 1 for e in eps):
        raise UsageError(f"{spec.name} is dense (no experts): expert parallelism needs a mixture-of-experts model",
                         field="--ep")
    return eps
