"""A command's values as ddplan's inputs: comma-separated lists and ranges, the specs they name, the rules
between options, the training budget and the time outside steps.

What `table`, `memory` and `plan` share between a value given (a flag, or a run file's field: ddplan.runconfig)
and a request priced: every rule a value must follow lives here, each failure one UsageError naming the flag, so
ddplan.cli only parses, calls and prints (issue 34).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace

from ddplan import bounds
from ddplan.calibration import (StepMeasurement, check_against_hardware, measurement_for, memory_assumptions,
                                steps_for_model)
from ddplan.errors import DdplanError, SpecError, UsageError
from ddplan.frameworks import (LACK_WORDS, LACKS, ZERO_LACKS, profile_weights, recompute_family,
                               searched_recomputes)
from ddplan.layout import Options
from ddplan.offload import check_activation_offload, check_offload
from ddplan.plan import PlanRequest
from ddplan.registry import (builtin_names, calibration_hardware, load_calibration, load_framework, load_hardware,
                             load_model)
from ddplan.run import RunOverheads
from ddplan.runfields import (BY_PARAM, OPTION_FIELDS, PROFILE_FP8_ONLY, RECOMPUTE, RECOMPUTE_HINT, SCHEDULES,
                              recompute_layers, recompute_policy)
from ddplan.sizing import memory_setup
from ddplan.specs import GRADS, KERNELS, MOMENTS, WEIGHTS, Budget, Price, run_variant
from ddplan.table import TableRequest, check_fp8, check_fp8_options, fp8_params_apply, framework_options

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
            weights: str | None = None, kernels: dict[str, str | None] | None = None, weights_given: bool = True):
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
                return variant(spec, seq_len, dtype, grads, moe_imbalance, weights, kernels, weights_given), hw, cal
            except DdplanError as e:
                if e.field == "--moe-imbalance":
                    raise
                raise SpecError(f"its sequence length or dtype does not fit {spec.name}: {e.message}",
                                file=calibration) from None
    return variant(spec, seq_len, dtype, grads, moe_imbalance, weights, kernels, weights_given), hw, cal


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
            moe_imbalance: float | None = None, weights: str | None = None,
            kernels: dict[str, str | None] | None = None, weights_given: bool = True):
    """The model at the run's sequence length, compute dtype, gradient dtype, weight storage, kernels (the loss, the
    MoE weighting, the block's fusions: ddplan.specs.KERNELS) and MoE load imbalance (ddplan.specs.run_variant).
    weights_given: the weights are the user's (a flag or a run file's field), not a profile's: remainder masters
    asked for weights that are not bf16 are refused (a profile's are kept whole there: Optimizer.adamw_bytes)."""
    check_ranges((seq_len, "--seq-len"), (moe_imbalance, "--moe-imbalance"))
    if moe_imbalance is not None:
        try:
            spec = run_variant(spec, load_imbalance=moe_imbalance)
        except ValueError as e:
            raise UsageError(str(e), field="--moe-imbalance") from None
    if dtype is not None and dtype not in ("bf16", "fp16", "fp32"):
        raise UsageError(f"must be bf16, fp16 or fp32, got {dtype!r}", field="--dtype")
    if grads is not None and grads not in GRADS:
        raise UsageError(f"must be one of {', '.join(GRADS)}, got {grads!r}", field="--grads")
    if weights is not None and weights not in WEIGHTS:
        raise UsageError(f"must be {', '.join(WEIGHTS)}, got {weights!r}", field="--weights")
    kernels = dict(kernels or {})
    moments = kernels.get("moments")
    if moments is not None and moments not in MOMENTS:
        raise UsageError(f"must be {', '.join(MOMENTS)}, got {moments!r}", field="--moments")
    compute = dtype or spec.dtypes.compute
    if weights == "remainder" and compute != "bf16" and weights_given:
        raise UsageError(f"remainder keeps the 16 bits of an fp32 master that a bf16 weight lacks; the compute dtype "
                         f"is {compute}: use --weights master", field="--weights")
    try:
        return run_variant(spec, seq_len=seq_len, dtype=dtype, grads=grads, weights=weights, **kernels)
    except ValueError as e:
        raise UsageError(str(e), field="--seq-len") from None


def choices(text: str, flag: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    values = tuple(v.strip() for v in text.split(",") if v.strip())
    bad = [v for v in values if v not in allowed]
    if bad or not values:
        raise UsageError(f"invalid values {bad or [text]}; allowed: {', '.join(allowed)}", field=flag)
    return values


def policies(text: str) -> tuple[str, ...]:
    """--recompute's comma-separated policies, each in its one spelling (ddplan.runfields.recompute_policy)."""
    values = tuple(v.strip() for v in text.split(",") if v.strip())
    if not values:
        raise UsageError(f"no policy in {text!r}; allowed: {RECOMPUTE_HINT}", field="--recompute")
    try:
        return tuple(dict.fromkeys(recompute_policy(v) for v in values))
    except ValueError as e:
        raise UsageError(str(e), field="--recompute") from None


def step_values(cal, m) -> dict:
    """What the measured step m (a step of calibration cal) ran, by the name of the flag that sets it."""
    return dict(gpus=m.gpus, tp=m.tp, pp=m.pp, vp=m.pp_virtual_stages, schedule=m.pp_schedule, zero=m.zero,
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


def options(values: dict, max_tp: int | None, spec=None, expert_tp: int = 0):
    """The framework options (ddplan.layout.Options) from a command's values (ddplan.table.framework_options), for
    the model (Options.for_model: a mixture of experts runs tp > 1 with sequence parallelism, on by itself), after the
    rules between them: --sequence-parallel and --tp-comm-overlap are Megatron's, so they need tensor parallelism,
    and overlap needs sequence parallelism (Megatron-Core refuses --tp-comm-overlap without it)."""
    moe = spec is not None and spec.architecture.moe is not None
    if values.get("tp_comm_overlap") and not (values.get("sequence_parallel") or moe):
        raise UsageError("needs --sequence-parallel (Megatron-Core overlaps tensor-parallel communication only with "
                         "sequence parallelism)", field="--tp-comm-overlap")
    if values.get("sequence_parallel") and max_tp == 1:
        raise UsageError("needs tensor parallelism: give --tp above 1", field="--sequence-parallel")
    check_ranges((values.get("shard_group"), "--shard-group"))
    options = framework_options(values, expert_tp)
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
                       schedule: str | None, zero: int | None, micro_batch: int | None, total_batch_tokens: int | None,
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
        pp_virtual_stages=vp, pp_schedule=schedule, zero=zero, attention=attention or hw.default_attention,
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


@dataclass(frozen=True)
class Stated:
    """Where a command's values came from: the names given (a flag, or a run file's field), the names a
    --framework profile set (defaults below a calibration's measurement), and each given value's source in
    words (its flag, `the run file's batch.total_tokens`, `the torchtitan profile's ...`)."""

    given: frozenset[str] = frozenset()
    profile: frozenset[str] = frozenset()
    words: dict[str, str] = field(default_factory=dict)
    # what the request left out of the profile's values: their names (not said as set) and, in words, why
    dropped: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)
    # the framework options given (a flag or the run file's field) that change none of the command's layouts
    # (inert_options), one line each
    inert: list[str] = field(default_factory=list)

    def by(self, name: str) -> str:
        return self.words.get(name, BY_PARAM[name].flag)


def price_given(price: float | None, today) -> Price | None:
    """--price as the offer every row is billed at, dated today."""
    if price is None:
        return None
    return Price(usd_per_gpu_hour=price, billing="per_gpu", provider="--price", date=today,
                 source="given on the command line")


def fp8_recipe(v: dict, stated: Stated) -> str | None:
    """--fp8-recipe, but a profile's recipe only with --fp8: it says how the stack runs fp8 when fp8 is on; a recipe
    named as another stack spells it, the --framework profile's own where it lists one (its fp8_recipe_names:
    under torchtitan, mxfp8 is torchao's MXFP8Linear, not Transformer Engine's), said once in stated.notes."""
    recipe = v["fp8_recipe"]
    if not v["fp8"] and "fp8_recipe" in stated.profile:
        return None
    if recipe is None or not v.get("framework"):
        return recipe
    profile = load_framework(v["framework"])
    item = profile.fp8_recipe_names.get(recipe)
    if item is None:
        return recipe
    note = (f"{stated.by('fp8_recipe')} {recipe} under {profile.name} is {profile.name}'s own: priced as "
            f"{item.value} ({item.where})")
    if note not in stated.notes:
        stated.notes.append(note)
    return str(item.value)


def without_profile_fp8(v: dict, stated: Stated) -> dict:
    """The values, with what a profile says of fp8 (runfields.PROFILE_FP8_ONLY: NeMo's fp8 weights) left at its field's
    default when fp8 is off: the stack's way of running fp8, not a request for it; and with fp8 on, a profile's
    remainder masters (NeMo's and Megatron-Bridge's perf launchers, for their bf16 runs) as whole ones, which
    Megatron-Core keeps then (ddplan.table.check_fp8_options)."""
    if "weights" in stated.profile and profile_weights(v["weights"], v["fp8"]) != v["weights"]:
        stated.notes.append(f"the {framework_name(v['framework'])} profile's remainder masters are its 16-bit runs' "
                            f"(Megatron-Core keeps whole fp32 masters with fp8): priced with --weights master")
        v = {**v, "weights": profile_weights(v["weights"], v["fp8"])}
    if v["fp8"]:
        return v
    dropped = [name for name in PROFILE_FP8_ONLY - {"fp8_recipe"} if name in stated.profile]
    stated.dropped.update(dropped)
    return {**v, **{name: BY_PARAM[name].default for name in dropped}}


def profile_attention(v: dict, stated: Stated, hws, per_hardware: bool = False, dtype: str | None = None) -> str | None:
    """--attention, but a profile's attention (the stack's kernel, torchtitan's flex) only on hardware whose spec has
    it: elsewhere what the profile says the stack runs there (its `elsewhere`, nanochat's SDPA off Hopper) where the
    spec has that, else None (each spec's own implementations), said in stated.notes; per_hardware (plan over several
    hardware): the profile's choices in order, comma-separated, for the search to take the first each hardware has
    (PlanRequest.attentions_where_available). A value the user gives is checked against the spec as ever (an error
    where it is missing)."""
    value = v["attention"]
    if value is None or "attention" not in stated.profile:
        return value
    profile = load_framework(v["framework"])
    item = profile.applies["attention"]
    if value != str(item.value):  # set by what ranks above the profile (a calibration's measured run)
        return value
    chosen = {hw.name: profile.attention_on({a.name for a in hw.attention}, dtype) for hw in hws}
    moved = {name: a for name, a in chosen.items() if a != value}
    if moved:
        there = "; ".join(f"{', '.join(n for n in moved if moved[n] == a)}: "
                          + (f"{a}, as the profile prices it there" if a else "the spec's own implementations")
                          for a in dict.fromkeys(moved.values()))
        why = (f"runs in {', '.join(item.dtypes)} only, not {dtype}"
               if item.dtypes and dtype is not None and dtype not in item.dtypes
               else f"has no efficiency in the {', '.join(moved)} spec")
        stated.notes.append(f"the {profile.name} profile's attention, {value}, {why}: priced with {there} (give "
                            f"--attention to choose one)")
    if per_hardware:
        if all(a is None for a in chosen.values()):
            stated.dropped.add("attention")
            return None
        return ",".join(a for a in (str(item.value), item.elsewhere) if a is not None and a in chosen.values())
    (only,) = chosen.values()
    if only != value:
        stated.dropped.add("attention")
    return only


def profile_fp8_params(v: dict, stated: Stated, spec, recipe: str | None, zeros: tuple[int, ...] | None) -> bool:
    """--fp8-params, but a profile's (NeMo keeps its fp8 GEMMs' weights in fp8) only where it can apply
    (ddplan.table.fp8_params_apply: fp8 on, fp32 masters, a Transformer Engine recipe, ZeRO-1, 2 or 3): the stack's
    way of running fp8, not a request to refuse."""
    if v["fp8_params"] and "fp8_params" in stated.profile and not fp8_params_apply(spec, v["fp8"], recipe, zeros):
        stated.dropped.add("fp8_params")
        if v["fp8"]:  # without fp8 the profile's fp8 items are the stack's fp8 setup, not news (without_profile_fp8)
            stated.notes.append(f"the {framework_name(v['framework'])} profile keeps the fp8 GEMMs' weights in fp8 "
                                f"(--fp8-params), which this run cannot take (it needs whole fp32 masters, not "
                                f"remainders, a Transformer Engine recipe and ZeRO-1, 2 or 3): priced without it")
        return False
    return v["fp8_params"]


def tp_to_check(tp: int | None, stated: Stated) -> int | None:
    """The tp that --sequence-parallel is checked against: a profile's sequence parallelism is the stack's default
    where there is tensor parallelism (ddplan.layout.Options.for_layout), not a request that needs it."""
    return None if "sequence_parallel" in stated.profile else tp


def degrees_of(layouts) -> set[tuple[int, int, int, int, int]]:
    """(tp, ranks, zero, cp, pp) of each layout, as inert_options weighs them (ranks: dp x cp, which shard model
    states)."""
    return {(lay.tp, lay.grad_ranks, lay.zero, lay.cp, lay.pp) for lay in layouts}


# options given through a field of their own spelling: the run field's param -> the Options attribute it sets
# (--etp 1 is Options.expert_tp = 1 by ddplan.inputs.expert_tp)
DERIVED_OPTIONS = {"etp": "expert_tp"}


def inert_options(options: Options, stated: Stated, degrees: Collection[tuple[int, int, int, int, int]],
                  command: str, spec=None, values: dict | None = None, recomputes: Collection[str] = ()) -> list[str]:
    """One line for each framework option given (a flag or the run file's field, not a profile's) that changes none
    of the layouts a command prices: each option applies where it can (Options.for_layout: a ZeRO-3 option to the
    ZeRO-3 layouts, sequence parallelism and --etp 1 to tp > 1, ...) and is otherwise left out, which a user who
    typed it should hear; and one where the model overrides it (Options.for_model: a mixture of experts runs
    sequence parallelism at tp > 1 whatever --no-sequence-parallel says; values: the command's, for the value
    given where the model moved it). degrees: (tp, ranks, zero, cp, pp) of
    every layout the command prices (the rows built, not the ones skipped); recomputes: the recompute policies of
    table's rows (whether recompute stops early changes nothing without one; memory's fixes may add one, so it passes
    none). One at a time, each one said reset
    before the next is weighed, so of two that do the same (--no-reshard-after-forward and
    --no-reshard-under-pipeline with pp > 1) only one is said. --shard-group is left to its own note
    (ddplan.verdicts.table_notes)."""
    out = []
    fields = [(f.param, f.option, f.kind) for f in OPTION_FIELDS if f.option != "shard_group"]
    fields += [(param, option, int) for param, option in DERIVED_OPTIONS.items()]
    for param, option, kind in fields:
        if param not in stated.given:
            continue
        default = Options.__dataclass_fields__[option].default
        value = (values or {}).get(param, getattr(options, option))
        by = stated.by(param)
        if kind is bool and by.startswith("--") and not value:
            by = "--no-" + by[2:]  # the flag as typed
        plain = replace(options, **{option: default})
        forced = spec is not None and getattr(plain.for_model(spec), option) != default
        if forced and value == default and any(d[0] > 1 for d in degrees):
            out.append(f"{by} is overridden: {spec.name} is a mixture of experts, which Megatron-Core runs with "
                       "sequence parallelism at tp > 1 (its MoE README, \"Parallelism\")")
            continue
        if value == default or getattr(options, option) == default:
            continue
        if option == "recompute_early_stop" and recomputes and all(r == "none" for r in recomputes):
            out.append(f"{by} changes nothing here: no row re-runs anything (its recompute is none)")
            continue
        if spec is not None:
            plain = plain.for_model(spec)
        if all(options.for_layout(*d) == plain.for_layout(*d) for d in degrees):
            why = (f"{spec.name} is a mixture of experts, which runs sequence parallelism at tp > 1 anyway" if forced
                   else f"none of the layouts asked for can take it (see `ddplan {command} --help`)")
            out.append(f"{by} changes nothing here: {why}")
            options = plain
    return out


def check_schedule(schedule: str | None, pps: Sequence[int], stated: Stated, framework: str | None = None,
                   vps: Sequence[int] = (1,)) -> None:
    """A pipeline schedule asked of layouts without a pipeline says nothing: refused in one line naming the flag or
    the run file's field, where no pipeline degree asked is above 1. With --framework, a schedule the stack offers
    nothing priced as (its profile's pipeline_schedules) is said once in stated.notes and priced as asked, as a
    recompute policy is (check_recompute)."""
    if schedule is not None and schedule != "1f1b" and all(p == 1 for p in pps):
        raise UsageError(f"the {schedule} schedule needs pipeline parallelism: no layout asked has pp > 1 (give --pp)",
                         field=stated.by("schedule"))
    profile = load_framework(framework) if framework and any(p > 1 for p in pps) else None
    offered = profile.schedules_offered() if profile else None
    if offered is None:
        return
    asked = {schedule or ("interleaved" if vp > 1 else "1f1b") for vp in vps}
    for name in sorted(asked - set(offered)):
        stacks = ", ".join(f"{s.name} = {' or '.join(s.priced_as)}" for s in profile.pipeline_schedules if s.priced_as)
        by = stated.by("schedule") if schedule else stated.by("vp")
        stated.notes.append(f"{by}: {profile.name} (@{profile.commit[:7]}) has no pipeline schedule priced as {name} "
                            f"(its schedules, as ddplan prices them: {stacks}); priced as asked")


def table_request(v: dict, stated: Stated, today):
    """The table a command line (or run file) asks for: (TableRequest, model, hardware, calibration). Without a
    model, the run the calibration measured, as it ran (flags given win); a measured step time is tied to the
    first of each list unless its own flags say otherwise."""
    v = without_profile_fp8(dict(v), stated)
    zero_by = stated.by("zero")  # where a refused ZeRO stage came from: a flag or the run file's field, else
    if v["model"] is None:
        v["model"], cal, m = calibrated_model(v["calibration"])
        if "zero" not in stated.given:  # the calibration's measured step
            zero_by = f"{v['calibration']}'s measured step (zero: {m.zero})"
        names = ("gpus", "tp", "pp", "vp", "schedule", "zero", "device_batch_size", "total_batch_size", "recompute",
                 "attention", "window", "compiled", "seq_len")
        v.update(as_measured(cal, m, {k: v[k] for k in names}, stated.given))
    gpu_list = tuple(int_list(v["gpus"], "--gpus", ranges=True))
    tps, pps, vps, cps, eps = (tuple(int_list(v[k], "--" + k)) for k in ("tp", "pp", "vp", "cp", "ep"))
    check_schedule(v["schedule"], pps, stated, v["framework"], vps)
    zeros = tuple(int_list(v["zero"], "--zero", allowed=(0, 1, 2, 3))) if v["zero"] else ()
    mbs = tuple(int_list(v["device_batch_size"], "--device-batch-size")) if v["device_batch_size"] else ()
    recomputes = policies(v["recompute"])
    if "recompute" in stated.given:
        check_recompute(v["framework"], recomputes, stated)
    windows = tuple(w.strip() for w in v["window"].split(",")) if v["window"] else ()
    for w in windows:
        check_pattern(w, "--window")
    spec, hw, cal = load(v["model"], v["hardware"], v["calibration"], v["seq_len"], v["dtype"], grads=v["grads"],
                         weights=v["weights"], moe_imbalance=v["moe_imbalance"], kernels=given_kernels(v),
                         weights_given="weights" not in stated.profile)
    sharded = any(g > t * p for g in gpu_list for t in tps or (1,) for p in pps or (1,))  # a row with dp x cp > 1
    check_lacks(v["framework"], spec, zero=zeros if sharded else (), zero_by=zero_by, compiled=v["compiled"],
                tp=(*tps, v["measured_tp"] or 1), pp=(*pps, v["measured_pp"] or 1), cp=cps,
                ep=eps)  # the rows' layouts and a measured run's
    v["attention"] = profile_attention(v, stated, (hw,), dtype=spec.dtypes.compute)
    v["fp8_params"] = profile_fp8_params(v, stated, spec, fp8_recipe(v, stated), zeros)
    attentions = tuple(a.strip() for a in v["attention"].split(",")) if v["attention"] else ()
    measured_flags = ("measured_gpus", "measured_tp", "measured_pp", "measured_attention", "measured_window")
    measurement = stated_measurement(
        spec, hw, v["measured_step_time"], gpus=v["measured_gpus"] or gpu_list[0], tp=v["measured_tp"] or tps[0],
        pp=v["measured_pp"] or pps[0], vp=vps[0], schedule=v["schedule"], zero=zeros[0] if zeros else None,
        micro_batch=mbs[0] if mbs else None, total_batch_tokens=v["total_batch_size"],
        attention=v["measured_attention"] or (attentions[0] if attentions else None),
        window=v["measured_window"] or (windows[0] if windows else None), compiled=v["compiled"],
        recompute=recomputes[0], others_given=any(v[k] is not None for k in measured_flags))
    if "total_batch_size" in stated.given:
        batch_from = stated.by("total_batch_size") + (", the measured step's" if measurement is not None else "")
    else:
        batch_from = "the measured step's batch" if v["total_batch_size"] is not None else "the recipe's batch"
    req = TableRequest(
        model=spec, hardware=hw, gpus=gpu_list, tps=tps, pps=pps, vps=vps, schedule=v["schedule"], cps=cps, eps=eps,
        zeros=zeros,
        micro_batches=mbs, recomputes=recomputes, attentions=attentions, windows=windows,
        total_batch_tokens=v["total_batch_size"],
        budget=training_budget(spec, v["steps"], v["tokens"], v["param_data_ratio"]),
        price=price_given(v["price"], today), batch_from=batch_from, overheads=_overheads(v),
        compiled=v["compiled"], measurement=measurement, knob=v["fit"], calibration=cal,
        calibration_path=v["calibration"], fp8=v["fp8"], fp8_recipe=fp8_recipe(v, stated),
        headroom=v["headroom"], options=_options(v, spec, tp_to_check(max(tps), stated), stated),
        framework=framework_name(v["framework"]),
        compile_offered=not v["framework"] or "compile" not in load_framework(v["framework"]).lacks)
    return req, spec, hw, cal


def plan_request(v: dict, stated: Stated, today, every_band: bool = False):
    """The search a command line (or run file) asks for: (PlanRequest, model, hardware list, calibration); with
    several hardware the calibration applies to the one it names (ddplan.plan.pricer_for), in any order.
    every_band: every kept row gets its band (csv lists every row), not only the rows shown."""
    v = without_profile_fp8(v, stated)
    names = hardware_list(v["hardware"])
    spec, hw0, cal = load(v["model"], names[0] if names else None, v["calibration"], v["seq_len"], v["dtype"],
                          check_hardware=False, grads=v["grads"], weights=v["weights"],
                          moe_imbalance=v["moe_imbalance"], kernels=given_kernels(v),
                          weights_given="weights" not in stated.profile)
    hws = (hw0, *(load_hardware(h) for h in names[1:]))
    check_calibration_hardware(cal, hws, v["calibration"])
    v = {**v, "attention": profile_attention(v, stated, hws, per_hardware=True, dtype=spec.dtypes.compute)}
    stages = tuple(sorted(set(int_list(v["zero"], "--zero", allowed=(0, 1, 2, 3))))) if v["zero"] else (0, 1, 2, 3)
    v["fp8_params"] = profile_fp8_params(v, stated, spec, fp8_recipe(v, stated), stages)
    asked = policies(v["recompute"]) if v["recompute"] else stack_recomputes(v["framework"], stated)
    check_recompute(v["framework"], asked, stated)
    # lightest first (ddplan.plan.layouts_for): the named ones in their order, a per-module one after selective,
    # the layer policies before full (they re-run some of full's layers), fewer re-run layers first (full:N by N,
    # every:K by K falling); the search prices each policy no lighter fitting one is known to dominate
    recomputes = tuple(sorted(asked, key=_recompute_order))
    gpus = tuple(int_list(v["gpus"], "--gpus", ranges=True))
    check_lacks(v["framework"], spec, zero=stages if v["zero"] and max(gpus) > 1 else (), zero_by=stated.by("zero"),
                cp=tuple(int_list(v["cp"], "--cp")) if v["cp"] else (),
                ep=tuple(int_list(v["ep"], "--ep")) if v["ep"] else ())  # the degrees asked to search
    lacks = lacked(v["framework"], spec, stated, "plan leaves out")  # ddplan.plan.layouts_for searches none of it
    req = PlanRequest(
        model=spec, hardware=hws, gpus=gpus, objective=v["objective"],
        deadline_h=v["deadline"], budget_usd=v["budget"], top=v["top"], calibration=cal,
        calibration_path=v["calibration"], price=price_given(v["price"], today), overheads=_overheads(v),
        budget=training_budget(spec, v["steps"], v["tokens"], v["param_data_ratio"]), recomputes=recomputes,
        zero_stages=stages,
        attentions=tuple(a.strip() for a in v["attention"].split(",")) if v["attention"] else (),
        total_batch_tokens=v["total_batch_size"], tp_across_nodes=v["tp_across_nodes"], headroom=v["headroom"],
        fp8=v["fp8"], fp8_recipe=fp8_recipe(v, stated),
        cps=tuple(int_list(v["cp"], "--cp")) if v["cp"] else (), eps=expert_degrees(v["ep"], spec),
        attentions_where_available="attention" in stated.profile,
        options=_options(v, spec, None, stated), framework=framework_name(v["framework"]), band_every_row=every_band,
        block_recompute=block_recompute(v["framework"]), lacks=lacks,
        schedules=schedule_list(v["schedule"], stated) if v["schedule"] else stack_schedules(v["framework"], stated))
    return req, spec, hws, cal


def lacked(framework: str | None, spec, stated: Stated, command: str) -> frozenset[str]:
    """What the --framework stack cannot run for this model (its profile's `lacks`), which a search leaves out,
    said once in stated.notes, which `command` begins ("plan leaves out", "memory's fixes leave out")."""
    if not framework:
        return frozenset()
    profile = load_framework(framework)
    moe = spec.architecture.moe is not None
    out = frozenset(profile.lacked(tp=2, pp=2, cp=2, ep=2 if moe else 1, tied=spec.architecture.tied_embeddings)
                    + [k for k in ZERO_LACKS if k in profile.lacks])
    if out:
        names = [n for n in LACKS if n in out]
        where = "; ".join(dict.fromkeys(profile.lacks[n].where for n in names))
        stated.notes.append(f"{command} what {profile.name} (@{profile.commit[:7]}) cannot run: "
                            f"{', '.join(LACK_WORDS[n] for n in names)} ({where})")
    return out


def _recompute_order(policy: str) -> tuple[float, int]:
    """plan's order of the recompute policies it searches, lightest first (plan_request)."""
    if policy in RECOMPUTE:
        return RECOMPUTE.index(policy), 0
    layers = recompute_layers(policy)
    if layers is None:
        return 1.5, 0
    kind, n = layers
    return 2.5, n if kind == "first" else -n


def given_kernels(v: dict) -> dict[str, str | None]:
    """The kernel fields (ddplan.specs.KERNELS) and the AdamW moments' dtype as given (None: the model spec's), as
    ddplan.specs.run_variant takes them."""
    return {**{name: v[name] for name in KERNELS}, "moments": v["moments"]}


def check_lacks(framework: str | None, spec, zero: tuple[int, ...] = (), zero_by: str = "--zero",
                compiled: bool | None = None, **degrees: tuple[int, ...]) -> None:
    """Refuse, in one line, a layout the --framework stack cannot run (its profile's `lacks`): degrees by flag name
    (tp, pp, cp, ep), each the values asked; under a pipeline a tied-embedding model where the stack refuses it;
    zero: the ZeRO stages asked for layouts with more than one data-parallel rank (one rank shards nothing: pass
    none), each one the stack runs, named as zero_by says (the flag, or the run file's field); compiled: --compile
    asked, on a stack without whole-model torch.compile."""
    if not framework:
        return
    profile = load_framework(framework)
    if not profile.lacks:
        return
    if compiled and "compile" in profile.lacks:
        raise UsageError(f"{profile.lack_words('compile')}: drop --compile or choose another --framework to price "
                         f"one", field="--compile")
    for z in zero:
        for name in profile.lacked(zero=z):
            runs = " or ".join(map(str, profile.zero_stages()))
            raise UsageError(f"{profile.lack_words(name)}: choose --zero {runs} (what it runs over more than one "
                             f"data-parallel rank) or another --framework", field=zero_by)
    most = {k: max(v, default=1) for k, v in degrees.items()}
    for name in profile.lacked(**most, tied=spec.architecture.tied_embeddings):
        flag = {"tied_embeddings_with_pp": "--pp", "tp_with_ep": "--ep"}.get(name, f"--{name}")
        raise UsageError(f"{profile.lack_words(name)}: no layout with {flag[2:]} above 1"
                         + (" and tp above 1" if name == "tp_with_ep" else "") + " runs on it; choose another "
                         f"--framework to price one", field=flag)


def schedule_list(text: str, stated: Stated) -> tuple[str, ...]:
    """plan's --schedule: the pipeline schedules to search, comma-separated, each one of ddplan.runfields.SCHEDULES
    (1F1B is always searched: a layout without a pipeline has no other); one line naming the flag for another."""
    names = tuple(dict.fromkeys(n.strip() for n in str(text).split(",") if n.strip()))
    bad = [n for n in names if n not in SCHEDULES]
    if bad or not names:
        raise UsageError(f"{', '.join(map(repr, bad)) or repr(text)} is not a schedule: give some of "
                         f"{', '.join(SCHEDULES)}", field=stated.by("schedule"))
    return names


def stack_schedules(framework: str | None, stated: Stated) -> tuple[str, ...]:
    """The pipeline schedules plan searches at pp > 1: with --framework those its stack offers as ddplan prices them
    (FrameworkProfile.schedules_offered: torchtitan's 1F1B, interleaved and ZB-V; Megatron-DeepSpeed's 1F1B alone),
    else 1F1B and interleaved; said once in stated.notes where they differ from that default."""
    offered = load_framework(framework).schedules_offered() if framework else None
    out = offered or PlanRequest.schedules
    if out != PlanRequest.schedules:
        stated.notes.append(f"plan searches the pipeline schedules {load_framework(framework).name} offers, as ddplan "
                            f"prices them: {', '.join(out)}")
    return out


def stack_recomputes(framework: str | None, stated: Stated) -> tuple[str, ...]:
    """The recompute policies plan searches unless told (ddplan.frameworks.searched_recomputes: with --framework those
    its stack offers, torchtitan's none, per-op and full, nanochat's none), said once in stated.notes where they
    differ from the default."""
    out = searched_recomputes(load_framework(framework).recompute_offered() if framework else None)
    if out != PlanRequest.recomputes:
        stated.notes.append(f"plan searches the recompute policies {load_framework(framework).name} offers, as ddplan "
                            f"prices them: {', '.join(out)}")
    return out


def check_recompute(framework: str | None, asked: tuple[str, ...], stated: Stated) -> None:
    """Say once (stated.notes) each policy asked that the --framework stack offers nothing priced as at its profile's
    commit (its recompute_policies and what each is priced as), priced as asked all the same: an older version of the
    stack may have had it (torchtitan's every:K until 2026-03), or the user's own checkpointing wraps it. A profile
    that lists no policy says nothing."""
    if not framework:
        return
    by = stated.by("recompute")
    profile = load_framework(framework)
    offered = profile.recompute_offered()
    for policy in asked:
        if offered is not None and recompute_family(policy) not in offered:
            names = ", ".join(f"{p.name} = {' or '.join(p.priced_as)}" for p in profile.recompute_policies
                              if p.priced_as)
            stated.notes.append(f"{by} {policy}: {profile.name} (@{profile.commit[:7]}) has no policy priced "
                                f"as it (its policies, as ddplan prices them: {names}); priced as asked")


def framework_name(given: str | None) -> str | None:
    """A --framework value (a built-in name, an alias or a profile file) as its profile's name, or None."""
    return load_framework(given).name if given else None


def _overheads(v: dict) -> RunOverheads:
    return overheads(v["startup_min"], v["eval_every"], v["eval_tokens"], v["checkpoint_every"], v["interruptions"],
                     v["restart_min"])


def _options(v: dict, spec, max_tp: int | None, stated: Stated) -> Options:
    moe = spec is not None and spec.architecture.moe is not None
    if v.get("tp_comm_overlap") and "tp_comm_overlap" in stated.profile and not (v.get("sequence_parallel") or moe):
        # a profile's overlap is the stack's default where it can run (NeMo's callback turns it off without sequence
        # parallelism), not a request that needs it
        v = {**v, "tp_comm_overlap": False}
        stated.dropped.add("tp_comm_overlap")
    if v.get("replica_reduce_once") and not v.get("shard_group") and "replica_reduce_once" not in stated.profile:
        raise UsageError("needs hybrid sharding: give --shard-group N (ZeRO-3 sharded over N ranks, replicated across "
                         "the rest); the all-reduce it times is the replicas'", field="--replica-reduce-once")
    return options(v, max_tp, spec, expert_tp(v["etp"], spec))


@dataclass(frozen=True)
class MemoryAsk:
    """What `memory` prices: the setup (its layout at the ZeRO stage the verdict is about), the stages shown,
    and the measured peak compared with it (given, or the calibration's step's when the shape is the one it ran;
    else that step and what moved away from it)."""

    spec: object
    hardware: object
    calibration: object
    setup: object
    stages: tuple[int, ...]
    measured_peak: float | None
    peak_step: object = None  # the calibration's step whose peak is not compared, and why
    moved: tuple[str, ...] = ()
    peak_kind: str = "device"  # what the measured peak counts (ddplan.memory.NOT_COUNTED)
    # the stack re-runs some layers whole (its profile lists a block method: Megatron-Core's, NeMo's): a fix may be
    # full:N, fewer layers re-run than full recompute
    block_recompute: bool = False
    lacks: frozenset[str] = frozenset()  # what the stack cannot run (its profile's `lacks`): no fix uses it
    # the recompute families the stack offers (FrameworkProfile.recompute_offered; None: unknown): the fixes' policies
    recomputes_offered: tuple[str, ...] | None = None


def memory_request(v: dict, stated: Stated) -> MemoryAsk:
    """The memory question a command line (or run file) asks: without a model, the run the calibration measured,
    as it ran; with a calibration whose step measured its peak, that shape unless a flag moves it (then the peak
    is not compared: a peak says nothing of another shape)."""
    v = without_profile_fp8(dict(v), stated)
    shape = ("gpus", "tp", "pp", "vp", "schedule", "device_batch_size", "recompute", "attention", "window", "compiled")
    from_calibration = v["model"] is None
    if from_calibration:  # the run the calibration measured, as it ran
        v["model"], cal, m = calibrated_model(v["calibration"])
        v.update(as_measured(cal, m, {k: v[k] for k in (*shape, "seq_len")}, stated.given, as_text=False))
    check_ranges(*((v[k], "--" + k.replace("_", "-")) for k in ("gpus", "tp", "pp", "vp", "device_batch_size")))
    check_schedule(v["schedule"], (v["pp"],), stated, v["framework"], (v["vp"],))
    stages = tuple(int_list(v["zero"], "--zero", allowed=(0, 1, 2, 3)))
    spec, hw, cal = load(v["model"], v["hardware"], v["calibration"], v["seq_len"], v["dtype"], grads=v["grads"],
                         weights=v["weights"], moe_imbalance=v["moe_imbalance"], kernels=given_kernels(v),
                         weights_given="weights" not in stated.profile)
    v["attention"] = profile_attention(v, stated, (hw,), dtype=spec.dtypes.compute)
    if "recompute" in stated.given:
        check_recompute(v["framework"], policies(v["recompute"]), stated)
    check_lacks(v["framework"], spec, compiled=v["compiled"])
    lacks = lacked(v["framework"], spec, stated, "memory's fixes leave out")
    if (v["gpus"] or 1) > (v["tp"] or 1) * (v["pp"] or 1):  # more than one data-parallel rank (one shards nothing)
        if "zero" in stated.given:
            check_lacks(v["framework"], spec, zero=stages, zero_by=stated.by("zero"))
        else:  # the stages shown by default: those the stack runs
            stages = tuple(z for z in stages if f"zero{z}" not in lacks) or stages
    v["fp8_params"] = profile_fp8_params(v, stated, spec, fp8_recipe(v, stated), stages)
    # fp8: what the fp8 GEMMs save is the recipe's (ddplan.fp8.with_fp8_saves); gathering or keeping weights in fp8
    # implies it
    fp8 = bool(v["fp8"] or v["fp8_all_gather"] or v["fp8_params"])
    recipe = fp8_recipe({**v, "fp8": fp8}, stated)
    if fp8:
        check_fp8(spec, hw, recipe)
    check_fp8_options(spec, fp8, recipe, v["fp8_all_gather"], stages, v["fp8_params"])
    if v["offload_optimizer"]:
        check_offload(spec, hw, stages)
    check_activation_offload(hw, v["offload_activations"] or 0)
    measured_peak, measured_zero, step, moved = v["measured_peak"], None, None, ()
    peak_kind = v["measured_peak_kind"]
    m = peak_step(cal, spec, from_calibration=from_calibration) if measured_peak is None else None
    if m is not None:
        if not from_calibration:  # its peak is for the shape it ran: price that shape, unless a flag says otherwise
            v.update(as_measured(cal, m, {k: v[k] for k in shape}, stated.given, as_text=False))
        now = {k: v[k] for k in (*shape, "seq_len", "dtype")}
        moved = tuple(moved_from(cal, m, now, stated.given, stages))
        if moved:
            step = m
        else:
            measured_peak, measured_zero, peak_kind = m.peak_memory_gb, m.zero, m.peak_memory_kind
    check_pattern(v["window"], "--window")
    check_lacks(v["framework"], spec, **{k: (v[k] or 1,) for k in ("tp", "pp", "cp", "ep")})  # as priced (calibrated)
    options = _options(v, spec, tp_to_check(v["tp"], stated), stated)
    setup = memory_setup(spec, hw, gpus=v["gpus"], tp=v["tp"], pp=v["pp"], vp=v["vp"], cp=v["cp"], ep=v["ep"],
                         micro_batch=v["device_batch_size"], attention=v["attention"],
                         recompute=policies(v["recompute"])[0], compiled=v["compiled"],
                         window_pattern=v["window"], headroom=v["headroom"], options=options,
                         assumptions=memory_assumptions(cal), fp8=fp8, fp8_recipe=recipe, schedule=v["schedule"])
    lay = setup.layout
    stated.inert.extend(inert_options(options, stated, {(lay.tp, lay.grad_ranks, z, lay.cp, lay.pp)
                                                        for z in (stages or (lay.zero,))}, "memory", spec, v))
    if len(stages) == 1:  # one stage asked about: the verdict is about it (else the model's native stage)
        setup = replace(setup, layout=setup.at_zero(stages[0]))
    elif measured_zero is not None and measured_zero in stages:  # else the measured step's
        setup = replace(setup, layout=setup.at_zero(measured_zero))
    return MemoryAsk(spec, hw, cal, setup, stages, measured_peak, step, moved, peak_kind,
                     block_recompute(v["framework"]), lacks,
                     load_framework(v["framework"]).recompute_offered() if v["framework"] else None)


def block_recompute(framework: str | None) -> bool:
    """Whether the stack re-runs some layers whole (its profile lists a block method of recompute: Megatron-Core's,
    NeMo's), so that memory's fixes and plan's search try the fewest layers a chunk (full:N)."""
    return bool(framework) and any("block" in p.name for p in load_framework(framework).recompute_policies)


def check_benchmark_flags(cpu_malloc: str | None, **log_flags) -> None:
    """`calibrate` without --from-log: --cpu-malloc is reuse or system, and no flag that describes a logged run
    (--log-attention, --window, --gpus other than 1, --total-batch-size) is given."""
    if cpu_malloc not in (None, "reuse", "system"):
        raise UsageError(f"must be reuse or system, got {cpu_malloc!r}", field="--cpu-malloc")
    for name, value in log_flags.items():
        if value is not None and not (name == "gpus" and value == 1):
            raise UsageError("only with --from-log (it describes the logged run)", field="--" + name.replace("_", "-"))
