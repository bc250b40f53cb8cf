"""A published run priced as `ddplan table` prices it: one row of ddplan.table.build_table per run.

ddplan.runs holds what a run is (the runs file's schema, loading, the model spec it ran); this module turns a
run into the table request it stands for (price_run) or the command line that asks for it (table_command),
so a validation row and a table row of the same layout are one number. ddplan.validation scores the rows.
"""

from __future__ import annotations

import difflib
import functools
from pathlib import Path

import yaml

from ddplan import runconfig
from ddplan.errors import DdplanError, SpecError, UsageError
from ddplan.files import atomic_write
from ddplan.frameworks import profile_weights
from ddplan.registry import load_framework, load_hardware
from ddplan.runfields import FIELDS, OPTION_FIELDS, PROFILE_FP8_ONLY, RunField
from ddplan.runs import PublishedRun, RunFacts, run_spec
from ddplan.specs import KERNELS, Efficiency, run_variant
from ddplan.table import TableRequest, build_table, fp8_params_apply, framework_options


# How a published run states each field of a run configuration (ddplan.runconfig): the runs format's field, or why
# it has none. A test walks both: a new run-configuration field needs its line here.
STATED_BY: dict[tuple[str, ...], str] = {
    ("model",): "model.base (with model.architecture)", ("hardware",): "hardware", ("gpus",): "layout.gpus",
    ("layout", "tp"): "layout.tp", ("layout", "pp"): "layout.pp", ("layout", "vp"): "layout.vp",
    ("layout", "schedule"): "layout.schedule",
    ("layout", "cp"): "layout.cp", ("layout", "ep"): "layout.ep", ("layout", "etp"): "layout.etp",
    ("layout", "zero"): "layout.zero",
    ("precision", "dtype"): "precision", ("precision", "grads"): "model.grads",
    ("precision", "weights"): "model.weights", ("precision", "moments"): "model.moments",
    ("precision", "fp8"): "precision",
    ("precision", "fp8_recipe"): "fp8_recipe",
    ("recompute",): "layout.recompute", ("attention",): "layout.attention", ("window",): "layout.window",
    ("seq_len",): "model.seq_len", ("framework",): "framework",
    ("cross_entropy",): "cross_entropy (else its framework profile's)",
    ("moe_weighting",): "framework (its profile's)", ("fusions",): "fusions (else its framework profile's)",
    ("fp8_weight_casts",): "fp8_weight_casts (else its framework profile's)",
    ("compiled",): "layout.compiled",
    ("moe_imbalance",): "model.routing",
    ("batch", "device"): "layout.micro_batch", ("batch", "total_tokens"): "layout.global_batch_sequences",
    ("measured", "step_time_s"): "measured", ("measured", "gpus"): "layout.gpus", ("measured", "tp"): "layout.tp",
    ("measured", "pp"): "layout.pp", ("measured", "attention"): "layout.attention",
    ("measured", "window"): "layout.window",
    # the framework options: the layout's field of the same name (a profile's value where the run states none)
    **{f.path: f"layout.{f.param}" for f in OPTION_FIELDS},
}
# fields that are not the step a run measured: what the run costs around its steps, or how ddplan reports
NOT_A_STEP: dict[tuple[str, ...], str] = {
    **{("budget", k): "the training budget: a published step time does not depend on it"
       for k in ("steps", "tokens", "param_data_ratio")},
    **{("outside", k): "time outside the steps: not in a measured step" for k in (
        "startup_min", "eval_every", "eval_tokens", "checkpoint_every", "interruptions_per_gpu_hour", "restart_min")},
    ("price_usd_per_gpu_hour",): "what a GPU-hour costs: not in a step time",

    ("headroom",): "the memory a plan keeps free; a run that ran fit",
    ("calibration",): "this machine's measurements; a published run is scored uncalibrated",
    ("measured", "fit"): "which efficiency a measured step calibrates; validate scores, it does not fit",
    ("measured", "peak_gb"): "a measured peak: no published run in the dataset states one",
    ("measured", "peak_kind"): "what a measured peak counts: as peak_gb (validation/memory_peaks.yaml states it as "
                               "measured.what)",
    ("layout", "tp_across_nodes"): "plan's search space; a run states its tp",
    **{("plan", k): "what plan optimises" for k in ("objective", "deadline_h", "budget_usd", "top")},
}


def run_weights(run: RunFacts) -> str | None:
    """How a run kept its weights (ddplan.specs.run_variant): as it states (model.weights), else as its framework's
    profile says the stack does (frameworks/*.yaml `weights`, e.g. Megatron-Core's 16-bit weights with fp32
    masters), else None (the base spec's)."""
    return run.model.weights or profile_weights(_profile_value(run, "weights"), run.precision == "fp8")


def run_option_values(run: RunFacts) -> dict:
    """The framework options (ddplan.runfields.OPTION_FIELDS) a run ran with, by parameter name: as its layout states
    each, else (a layout field left None, as overlap_grad_reduce may be) as its framework's profile says the stack
    does (Megatron-Core: no gradient reduce overlap without --overlap-grad-reduce), else the field's default."""
    values = {}
    for f in OPTION_FIELDS:
        stated, found = getattr(run.layout, f.param), _profile_option(run, f.param)
        values[f.param] = stated if stated is not None else found.value if found is not None else f.default
    return values


def _profile_option(run: RunFacts, name: str):
    """The run's framework profile's item for option `name` (frameworks/*.yaml `applies`), or None: no profile, no
    such item, or an fp8 item on a run without fp8 (runfields.PROFILE_FP8_ONLY: the stack's way of running fp8, as
    `ddplan table` leaves it out without --fp8)."""
    profile = _profile(run)
    if profile is None or name in PROFILE_FP8_ONLY and run.precision != "fp8":
        return None
    return profile.applies.get(name)


def run_zero(run: RunFacts) -> int | None:
    """The ZeRO stage a run is priced at: as it states, else its framework profile's (as `ddplan table --framework`
    takes it), else None (the model's native setup)."""
    if run.layout.zero is not None:
        return run.layout.zero
    found = _profile_value(run, "zero")
    return int(found) if found is not None else None


def run_fp8_recipe(run: RunFacts) -> str | None:
    """The fp8 recipe a run is priced with: as it states, else (an fp8 run) its framework profile's, else None (the
    model's)."""
    if run.fp8_recipe or run.precision != "fp8":
        return run.fp8_recipe
    return _profile_value(run, "fp8_recipe")


def run_fp8_params(run: RunFacts, spec) -> dict:
    """run_option_values, with a profile's fp8 weights (NeMo's) only where they can apply on this run's spec, as
    `ddplan table` applies a profile's (ddplan.inputs.profile_fp8_params)."""
    values, zero = run_option_values(run), run_zero(run)
    zeros = (zero,) if zero is not None else ()
    if (values["fp8_params"] and run.layout.fp8_params is None
            and not fp8_params_apply(spec, run.precision == "fp8", run_fp8_recipe(run), zeros)):
        values["fp8_params"] = False
    return values


def run_kernels(run: RunFacts) -> dict[str, str]:
    """The kernel fields (ddplan.specs.KERNELS: the loss, the MoE weighting, the block's fusions, the fp8 weight casts)
    a run ran where its framework profile sets them (Megatron-Core's vocab-parallel loss, weighted SwiGLU,
    Transformer Engine modules and fp8 weights cast once a step; llm-foundry's fused loss), the loss the run states
    over its profile's (RunFacts.cross_entropy, RunFacts.fp8_weight_casts, RunFacts.fusions); the base spec's for the
    rest."""
    kernels = {name: value for name in KERNELS if (value := _profile_value(run, name)) is not None}
    if run.cross_entropy is not None:
        kernels["cross_entropy"] = run.cross_entropy
    if run.fp8_weight_casts is not None:
        kernels["fp8_weight_casts"] = run.fp8_weight_casts
    if run.fusions is not None:
        kernels["fusions"] = run.fusions
    return kernels


def run_attention(run: RunFacts, hw) -> str:
    """The attention a run is priced with: as it states (layout.attention), else its framework profile's where the
    hardware spec has it (torchtitan's flex; ddplan.frameworks.FrameworkProfile.attention_on: its `elsewhere` on
    hardware without it), else the spec's default."""
    if run.layout.attention:
        return run.layout.attention
    profile = _profile(run)
    profiled = profile.attention_on({a.name for a in hw.attention}, run.compute_dtype) if profile is not None else None
    return profiled or hw.default_attention


def run_framework(run: RunFacts) -> str | None:
    """The run's stack as `--framework` can name it: its name where it has a profile, else None."""
    return run.framework if _profile(run) is not None else None


def _profile(run: RunFacts):
    """The run's framework profile (frameworks/*.yaml), or None: no framework, or a stack without a profile
    (a name frameworks/ does not hold)."""
    return _profile_named(run.framework) if run.framework else None


@functools.lru_cache(maxsize=64)
def _profile_named(name: str):
    """load_framework(name), or None where no profile has that name; read once a process (a dataset names a few
    stacks over and over)."""
    try:
        return load_framework(name)
    except DdplanError:
        return None


def _profile_value(run: RunFacts, item: str) -> str | None:
    """The value the run's framework profile applies for `item` (frameworks/*.yaml), or None: no profile, or a
    profile without the item."""
    profile = _profile(run)
    found = profile.applies.get(item) if profile is not None else None
    return str(found.value) if found is not None else None


def table_command(run: PublishedRun, folder: Path | None = None) -> list[str] | None:
    """The `ddplan table` arguments that price this run as one row. A run whose model has architecture overrides,
    or whose network differs from its hardware spec's, has no flag for them: its model spec and hardware spec are
    written into `folder` as YAML files (the model and hardware as price_run builds them) and named by path; None
    for such a run without a folder."""
    model, hardware = run.model.base, run.hardware
    if run.model.architecture or run.network is not None:
        if folder is None:
            return None
        where = f"{run.id} (table_command)"
        if run.model.architecture:
            model = _write_spec(folder / f"{run.id}.model.yaml", run_spec(run, where, weights=run_weights(run)))
        if run.network is not None:
            hardware = _write_spec(folder / f"{run.id}.hardware.yaml", run_hardware(run, where))
    lay, zero, recipe = run.layout, run_zero(run), run_fp8_recipe(run)
    argv = ["table", "--model", model, "--hardware", hardware, "--gpus", str(lay.gpus),
            "--tp", str(lay.tp), "--pp", str(lay.pp), "--vp", str(lay.vp), "--cp", str(lay.cp), "--ep", str(lay.ep),
            *(["--schedule", lay.schedule] if lay.schedule else []),
            *(["--zero", str(zero)] if zero is not None else []), *(["--etp", "1"] if lay.etp else []),
            "--device-batch-size", ",".join(map(str, micro_batches(run))), "--total-batch-size",
            str(run.tokens_per_step),
            "--recompute", lay.recompute, "--seq-len", str(run.model.seq_len),
            "--dtype", run.compute_dtype,
            "--compile" if lay.compiled else "--no-compile"]
    if run.model.grads:
        argv += ["--grads", run.model.grads]
    if run_weights(run):
        argv += ["--weights", run_weights(run)]
    if run.model.moments:
        argv += ["--moments", run.model.moments]
    for name, value in run_kernels(run).items():
        argv += ["--" + name.replace("_", "-"), value]
    if _profile(run) is not None:  # its stack's published runs weigh in the band (ddplan.evidence)
        argv += ["--framework", run.framework]
        if not run.model.grads:  # the profile fills only what validate prices: the gradients stay the spec's
            argv += ["--grads", run_spec(run, f"{run.id} (table_command)").dtypes.grads]
    if run.model.routing == "balanced":
        argv += ["--moe-imbalance", "1"]
    argv += ["--attention", run_attention(run, run_hardware(run, f"{run.id} (table_command)"))]
    if lay.window:
        argv += ["--window", lay.window]
    argv += option_flags(run)
    if run.precision == "fp8":
        argv.append("--fp8")
    if recipe:
        argv += ["--fp8-recipe", recipe]
    return argv


def option_flags(run: RunFacts) -> list[str]:
    """The flags that state a run's framework options (run_option_values) to `ddplan table`: each that differs from
    the run's framework profile's value (which table, given the profile, takes without the flag), and without a
    profile each that is not the field's default. A value the profile sets is left to it, as a user's command
    leaves it: where it cannot apply (the stack's sequence parallelism at tp 1) table drops it, where a flag would
    be refused."""
    values, argv = run_option_values(run), []
    for f in OPTION_FIELDS:
        value, found = values[f.param], _profile_option(run, f.param)
        default = value == f.default or value in (0, None) and f.default is None  # shard_group 0: none
        if found is not None and found.value == value or found is None and default:
            continue
        if value in (0, None) and f.default is None:  # "none" has no flag value (--shard-group takes 2 and up)
            raise ValueError(f"{run.id}: {f.param} unset cannot be stated over the {run.framework} profile's "
                             f"{found.value!r} as a table flag")
        if f.kind is bool:
            argv.append(f.flag if value else "--no-" + f.flag[2:])
        else:
            argv += [f.flag, str(value)]
    return argv


def _write_spec(path: Path, spec) -> str:
    """A spec as the YAML file a --model or --hardware path reads (written whole or not at all); returns the path."""
    atomic_write(path, yaml.safe_dump(spec.model_dump(mode="json", exclude_none=True), sort_keys=False))
    return str(path)


# each flag of `ddplan table` -> (its run field, the value a bool flag states; None: the flag takes the next word)
_FLAGS: dict[str, tuple[RunField, bool | None]] = {}
for _f in FIELDS:
    for _decl in _f.decls:
        if _f.kind is bool:
            on, _, off = _decl.partition("/")
            _FLAGS[on] = (_f, True)
            if off:
                _FLAGS[off] = (_f, False)
        else:
            _FLAGS[_decl] = (_f, None)


def run_configuration(run: PublishedRun, folder: Path) -> runconfig.RunConfig:
    """The run configuration (ddplan.runconfig) of a published run: its table_command's flags as the run file's
    fields, so `ddplan table --config FILE` prices the step validate scores. A model with architecture overrides, or
    a network of its own, is written into folder as a spec file (table_command) and named by its file name, which a
    run file reads from its own folder."""
    argv = table_command(run, folder)
    params: dict = {}
    words = iter(argv[1:])
    for word in words:
        field, value = _FLAGS[word]
        params[field.param] = value if value is not None else next(words)
    for name in ("model", "hardware"):
        if Path(params[name]).parent == folder:  # a spec written beside the run file: named as that file reads it
            params[name] = Path(params[name]).name
        elif Path(params[name]).is_file():  # a user's spec file: from anywhere (a run file reads from its folder)
            params[name] = str(Path(params[name]).resolve())
    return runconfig.from_params(params, set(params))


def run_named(runs: list[PublishedRun], run_id: str, where: str) -> PublishedRun:
    """The run of a dataset with this id; an unknown id is an error naming the closest ids."""
    by_id = {r.id: r for r in runs}
    if run_id in by_id:
        return by_id[run_id]
    close = difflib.get_close_matches(run_id, list(by_id), n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise UsageError(f"no run {run_id!r} in {where}: {hint}`ddplan validate --format csv` lists every id",
                     field="--export-run")


def export_run(run: PublishedRun, folder: Path) -> list[Path]:
    """Write a published run as a run file, FOLDER/ID.yaml (run_configuration), with the spec files it names; returns
    the files written, the run file first."""
    path = folder / f"{run.id}.yaml"
    text = runconfig.to_yaml(run_configuration(run, folder))
    atomic_write(path, f"# {run.id}: {run.source.ref}, {run.source.where}\n"
                       f"# priced as `ddplan validate` prices it: ddplan table --config {path.name}\n" + text)
    written = {"model": bool(run.model.architecture), "hardware": run.network is not None}  # as table_command writes
    return [path, *(folder / f"{run.id}.{kind}.yaml" for kind, wrote in written.items() if wrote)]


def run_hardware(run: RunFacts, where: str):
    """The hardware a run ran on: its spec, with the nodes and inter-node network the run states where they differ
    (runs.Network): its NICs, and the GPUs of a node as the job was placed (at most the spec's)."""
    try:
        hw = load_hardware(run.hardware)
    except DdplanError as e:
        raise SpecError(e.message, file=where, field="hardware") from None
    n = run.network
    if n is not None and n.nics_per_node is not None:
        nic = hw.inter_node.nic_gbit_per_s.model_copy(update={"value": n.nic_gbit_per_s, "source": n.why})
        hw = hw.model_copy(update={"inter_node": hw.inter_node.model_copy(
            update={"nics_per_node": n.nics_per_node, "nic_gbit_per_s": nic})})
    if n is not None and n.gpus_per_node is not None:
        if n.gpus_per_node > hw.gpus_per_node:
            raise SpecError(f"{n.gpus_per_node} is more than {hw.name}'s "
                            f"{hw.gpus_per_node} GPUs a node (allowed: 1 to {hw.gpus_per_node})", file=where,
                            field="network.gpus_per_node")
        if n.nics_per_node is None:  # the spec's NICs a GPU, on the smaller node
            nics, rest = divmod(hw.inter_node.nics_per_node * n.gpus_per_node, hw.gpus_per_node)
            if rest or not nics:
                raise SpecError(f"{hw.name}'s {hw.inter_node.nics_per_node} NICs on {hw.gpus_per_node} GPUs do not "
                                f"split whole over {n.gpus_per_node}: state network.nics_per_node and "
                                f"nic_gbit_per_s too", file=where, field="network.gpus_per_node")
            hw = hw.model_copy(update={"inter_node": hw.inter_node.model_copy(update={"nics_per_node": nics})})
        hw = hw.model_copy(update={"gpus_per_node": n.gpus_per_node})
    return hw


FP8_FIT = ":fp8"  # a re-fit's key suffix: "h100-sxm:fp8" holds the fraction fp8 training keeps (sustained_fp8)
FP8_STACK_FIT = "fp8 stacks"  # a re-fit's key of what other stacks keep of it (ddplan.fp8.FP8_STACK_KEPT)
# a re-fit key's suffix marking its fraction a fallback, not fitted on the GPU's own runs ("b200:assumed",
# "h100-sxm:fp8:assumed": a GPU left with too few runs, the fp8 fraction falling back to the 16-bit one); such a
# fraction keeps the best GEMM rate's range in the band, as a shipped assumed one does (ddplan.roofline.best_gemm)
ASSUMED_FIT = ":assumed"


def fp8_fit_key(hardware: str) -> str:
    """The key of a hardware's fp8 fraction in a dict of re-fitted fractions (price_run's `sustained`)."""
    return hardware + FP8_FIT


def with_sustained(hw, fraction: float, source: str, field: str = "sustained", basis: str = "fitted"):
    """The hardware spec with its GEMM sustained fraction (field "sustained", 16-bit, or "sustained_fp8")
    replaced by a point value (no range): fitted (validation's re-fits), or assumed (a fallback, ASSUMED_FIT)."""
    if field not in ("sustained", "sustained_fp8"):
        raise ValueError(f"field must be sustained or sustained_fp8, got {field!r}")
    g = hw.efficiency.gemm
    kept = Efficiency(value=fraction, basis=basis, source=source)
    return hw.model_copy(update={"efficiency": hw.efficiency.model_copy(
        update={"gemm": g.model_copy(update={field: kept})})})


def price_run(run: RunFacts, where: str, sustained: dict[str, float] | None = None,
              imbalance: float | None = None, shared: dict | None = None, evidence: bool = True,
              bands: bool = True):
    """(spec, hardware, priced row) of one run, through ddplan.table.build_table as `ddplan table` prices it.

    sustained: hardware name -> GEMM sustained fraction replacing the spec's, fp8_fit_key(name) -> the fraction
    fp8 training keeps, and FP8_STACK_FIT -> what a stack other than the tuned ones keeps of it (validation's re-fits);
    imbalance: the dropless load imbalance replacing the spec's (run_spec); shared: build_table's
    rate-independent cache, kept by the caller across prices of this run at one imbalance; evidence=False: the
    base uncalibrated band, not widened where the evidence is thin (leave-one-source-out widens it by tables made
    without the run's source); bands=False: the row's value only, its band collapsed to it (a fit's cost)."""
    hw = run_hardware(run, where)
    for key, field in ((hw.name, "sustained"), (fp8_fit_key(hw.name), "sustained_fp8")):
        if sustained and key in sustained:
            basis = "assumed" if sustained.get(key + ASSUMED_FIT) else "fitted"
            hw = with_sustained(hw, sustained[key], "re-fitted by ddplan.validation", field, basis)
    # the spec moves with neither the rates nor the recompute policy: a caller's cache (shared) keeps it
    spec = shared.get("run spec") if shared is not None else None
    if spec is None:
        spec = run_spec(run, where, imbalance, weights=run_weights(run))
        if shared is not None:
            shared["run spec"] = spec
    if run_kernels(run):
        spec = run_variant(spec, **run_kernels(run))
    lay = run.layout
    attention, zero = run_attention(run, hw), run_zero(run)
    # an unstated micro-batch is the fastest that fits (fastest_fitting): which fit does not move with the rates, so
    # a caller's cache keeps them after the first price and later prices skip the rest (the same row comes out)
    candidates = micro_batches(run)
    fitting_key = ("fitting micro-batches", lay.recompute)
    known = shared.get(fitting_key) if shared is not None and len(candidates) > 1 else None
    req = TableRequest(model=spec, hardware=hw, gpus=(lay.gpus,), tps=(lay.tp,), pps=(lay.pp,), vps=(lay.vp,),
                       schedule=lay.schedule, cps=(lay.cp,), eps=(lay.ep,),
                       zeros=(zero,) if zero is not None else (), micro_batches=known or candidates,
                       recomputes=(lay.recompute,),
                       attentions=(attention,), windows=(lay.window or spec.architecture.window_pattern,),
                       total_batch_tokens=run.tokens_per_step, compiled=lay.compiled, fp8=run.precision == "fp8",
                       framework=run_framework(run), evidence=evidence, bands=bands,
                       compile_offered=False,  # a published run is priced as it ran; no verdict reads a twin
                       fp8_recipe=run_fp8_recipe(run), fp8_stack_kept=(sustained or {}).get(FP8_STACK_FIT),
                       options=framework_options(run_fp8_params(run, spec), lay.etp or 0).for_model(spec))
    try:
        table = build_table(req, shared=shared)
    except DdplanError as e:
        raise SpecError(e.message, file=where, field="layout") from None
    row = fastest_fitting(table.rows)
    if shared is not None and len(candidates) > 1 and known is None:
        fits = tuple(dict.fromkeys(r.layout.micro_batch for r in table.rows if r.memory.fits))
        shared[fitting_key] = fits or (min(r.layout.micro_batch for r in table.rows),)
    if lay.micro_batch and row.layout.micro_batch != lay.micro_batch or row.global_batch_tokens != run.tokens_per_step:
        raise SpecError(f"the layout does not split as it ran: {lay.global_batch_sequences} sequences over dp "
                        f"{row.layout.dp} at micro-batch {lay.micro_batch}", file=where, field="layout")
    return spec, hw, row


def micro_batches(run: RunFacts) -> tuple[int, ...]:
    """The micro-batches a run is priced at: the one it states, else every power of two that divides the
    sequences of one data-parallel rank (fastest_fitting picks among them)."""
    lay = run.layout
    if lay.micro_batch:
        return (lay.micro_batch,)
    per_rank = lay.global_batch_sequences // (lay.gpus // (lay.tp * lay.pp * lay.cp))
    return tuple(m for m in (2 ** i for i in range(17)) if m <= per_rank and per_rank % m == 0) or (1,)


def fastest_fitting(rows: list):
    """The row a run with an unstated micro-batch is scored by: the fastest that fits in memory (a published
    throughput figure is the tuned one), else the smallest micro-batch; with one row, that row."""
    fits = [r for r in rows if r.memory.fits]
    return min(fits, key=lambda r: r.step_s) if fits else min(rows, key=lambda r: r.layout.micro_batch)
