"""The `ddplan` command line: parse flags, load specs, call the model, render. No math here.

Errors: a DdplanError prints one line `error: <file>: <field>: <what>` on stderr and exits 1 (2 for
usage errors); typer's own usage errors are reduced to one line too. DDPLAN_DEBUG=1 re-raises.
"""

from __future__ import annotations

import contextlib
import os
import sys
from enum import Enum
from pathlib import Path

import typer

from ddplan import bounds, runfields
from ddplan.errors import DdplanError, UsageError
from ddplan.gcpause import no_cycle_collection

app = typer.Typer(
    name="ddplan",
    help="""Plan distributed training of language models: time, cost, memory, and what to fix first.

\b
Examples:
  ddplan table --model d24 --gpus 1,8
  ddplan plan --model d26 --hardware all --gpus 8-64 --budget 500
  ddplan memory --model llama-3-8b --hardware h100-sxm --gpus 8 --zero 2
  ddplan specs list

`ddplan COMMAND --help` shows each command's examples and options.""",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _today():
    """The date a --price offer is stamped with (a function, so tests can fix it without patching datetime)."""
    import datetime as dt

    return dt.date.today()


def _version(value: bool) -> None:
    if value:
        from ddplan import __version__

        print(f"ddplan {__version__}")
        raise typer.Exit()


@app.callback()
def _app(version: bool = typer.Option(False, "--version", is_eager=True, callback=_version,
                                      help="Print ddplan's version and exit.")) -> None:
    """Plan distributed training of language models: time, cost, memory, and what to fix first."""


specs_app = typer.Typer(help="""The built-in hardware and model specs (any spec can also be a YAML path).

\b
Examples:
  ddplan specs list
  ddplan specs show h100-sxm""", no_args_is_help=True)
app.add_typer(specs_app, name="specs", short_help="The built-in hardware and model specs.")


# --help groups the planning commands' options into panels (issue 38: table --help listed 52 options in one run):
# each run field's panel (ddplan.runfields), and the output options'
PANELS = runfields.PANELS
class PanelledCommand(typer.core.TyperCommand):
    """A command whose --help lists its options in PANELS' groups, in that order (the rest under 'Other
    options', --help last)."""

    def format_options(self, ctx, formatter) -> None:
        groups: dict[str, list] = {panel: [] for panel in (*PANELS, "Other options")}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None and param.param_type_name == "option":
                groups[PANEL_OF.get(param.name, "Other options")].append(record)
        for panel, records in groups.items():
            if records:
                with formatter.section(panel):
                    formatter.write_dl(records)


class SpecFormat(str, Enum):
    text = "text"
    json = "json"


class Format(str, Enum):
    table = "table"
    markdown = "markdown"
    csv = "csv"
    json = "json"


RECOMPUTE = runfields.RECOMPUTE  # lightest first (plan searches in this order)
FormatOpt = typer.Option(Format.table, "--format", help="Output format; csv and json are data only.")


def _config_callback(ctx: typer.Context, param: typer.CallbackParam, value: str | None) -> str | None:
    """--config FILE (eager: read before every other option): the file's fields become the command's defaults
    (click's default_map), so that a flag given on the command line wins over the file."""
    if value is None:
        return None
    from ddplan import runconfig
    from ddplan.errors import UsageError
    from ddplan.specfile import read_yaml, validate

    path = Path(value).expanduser()
    if not path.is_file():
        raise UsageError(f"no such file: {value!r}" if not path.is_dir() else f"{value!r} is a folder", field="--config")
    config = validate(runconfig.RunConfig, read_yaml(path), str(path))
    lists = runconfig.LIST_PARAMS.get(ctx.info_name or "", frozenset())
    single = {p.name: p.name not in lists for p in ctx.command.params}
    defaults, lists, unread = runconfig.defaults_for(config, single, str(path))
    ctx.default_map = {**(ctx.default_map or {}), **defaults}  # over a --framework profile's values
    ctx.meta["config_names"] = set(defaults)
    ctx.meta["config_lists"] = lists  # said by _config_first unless the flag is given
    ctx.meta["config_unread"] = (str(path), unread)  # said by _config_first
    return value


def _framework_callback(ctx: typer.Context, param: typer.CallbackParam, value: str | None) -> str | None:
    """--framework NAME (eager, or a run file's `framework:`): the profile's fields (ddplan.frameworks) become
    the command's defaults where nothing else states them: a flag given and a run file's field both win."""
    if value is None:
        return None
    from ddplan import runconfig
    from ddplan.registry import load_framework

    profile = load_framework(value)
    params = {p.name for p in ctx.command.params}
    if ctx.info_name == "plan":  # plan searches the choices the stack offers (ZeRO stages, recompute), not its default;
        params -= runconfig.LIST_PARAMS["plan"] - {"attention"}  # its attention kernel is the stack's (torchtitan's flex)
    filled = {runconfig.FLAGS[path]: runconfig.as_flag_value(v) for path, v in profile.fields().items()
              if runconfig.FLAGS[path] in params}
    ctx.meta["framework_unread"] = [".".join(path) for path in profile.fields()
                                    if runconfig.FLAGS[path] not in {p.name for p in ctx.command.params}]
    ctx.default_map = {**filled, **(ctx.default_map or {})}  # a run file's field, read first or after, wins
    ctx.meta["framework"] = profile
    ctx.meta["framework_names"] = set(filled)
    return value




def _config_first(ctx: typer.Context, print_config: bool) -> bool:
    """What a command does with --config and --print-config before its own work: a list the file gives for a
    flag of one value (memory's --gpus) is an error unless the flag is given; with --print-config, the run
    configuration of what was stated (on the command line or by the file) as YAML on stdout. True: done."""
    from ddplan.errors import SpecError

    for name, (source, field, values) in ctx.meta.get("config_lists", {}).items():
        if _source(ctx, name) != "COMMANDLINE":
            flag = "--" + name.replace("_", "-")
            raise SpecError(f"`ddplan {ctx.info_name}` prices one value; the file lists {len(values)}: {values} (keep "
                            f"one there, or give {flag})", file=source, field=field)
    source, unread = ctx.meta.get("config_unread", ("", []))
    if unread:  # a field the command has no flag for is not silently dropped
        _warn([f"{source}: `ddplan {ctx.info_name}` has no flag for {', '.join(unread)}, so it does not read "
               f"{'it' if len(unread) == 1 else 'them'}"])
    if not print_config:
        return False
    from ddplan import render, runconfig  # here: the schema's models cost ~0.1 s to build, on every command

    stated = {name for name in ctx.params if _given(ctx, name) and not _from_profile(ctx, name)}  # from `framework`
    render.echo(runconfig.to_yaml(runconfig.from_params(ctx.params, stated)).rstrip("\n"))
    return True


WideOpt = typer.Option(False, "--wide", help="On a terminal, show every column however wide (pipes and files "
                       "always get every column, at full width).")



# the options that say how to read and show a run, not what run is priced: each declared here once
PLOT_HELP = {"table": "wall-clock and cost against GPU count", "memory": "the memory per GPU, stacked by term",
             "plan": "the Pareto layouts, the choice and the budget or deadline"}
OUTPUT_OPTIONS = {
    "config": (str, lambda command: typer.Option(
        None, "--config", is_eager=True, callback=_config_callback,
        help="A run configuration file (kind: run; examples/seed-d24-mi300x.yaml): its fields are the flags' values, "
             "and a flag given wins over its field.")),
    "print_config": (bool, lambda command: typer.Option(
        False, "--print-config", help="Print this command line as a run configuration file (YAML, for --config) "
                                      "instead of pricing it.")),
    "format": (Format, lambda command: FormatOpt),
    "wide": (bool, lambda command: WideOpt),
    "quiet": (bool, lambda command: typer.Option(False, "--quiet", "-q", help="Print the answer only (the verdict's "
                                                 "first lines; warnings still go to stderr).")),
    "explain": (bool, lambda command: typer.Option(False, "--explain", help="Also print every assumption behind the "
                                                   "figures (model recipe, hardware efficiencies, price, band, memory "
                                                   "rule).")),
    "plot": (str, lambda command: typer.Option(None, "--plot", help=f"Also write a plot of {PLOT_HELP[command]} (PNG "
                                               "or SVG).")),
}
PANEL_OF = {**{f.param: f.panel for f in runfields.FIELDS}, "config": runfields.MODEL,
            **{name: runfields.OUTPUT for name in OUTPUT_OPTIONS if name != "config"}}
CALLBACKS = {"framework": _framework_callback}


def _run_option(command: str, name: str) -> tuple[object, object]:
    """(the typer option of parameter `name` of a planning command, its type): an output option as declared
    above, else the run field's (ddplan.runfields): its flags, its help and default for this command, a comma-
    separated text where the command takes several values."""
    if name in OUTPUT_OPTIONS:
        kind, make = OUTPUT_OPTIONS[name]
        return make(command), kind
    f = runfields.BY_PARAM[name]
    many = command in f.many
    kind = str if many or isinstance(f.kind, tuple) else f.kind
    default = f.default_for(command)
    if many and default is not None and default is not runfields.REQUIRED:
        default = str(default)
    choices = f"[{'|'.join(str(k) for k in f.kind)}]" if isinstance(f.kind, tuple) and not many else None
    callback = CALLBACKS.get(name)
    return typer.Option(default, *f.decls, help=f.help_for(command), metavar=choices, is_eager=callback is not None,
                        callback=callback), kind


def run_options(command: str):
    """Give a planning command its options from their one definition: every run field that names the command
    (ddplan.runfields: RunField.commands), in the run file's order, then the output options the function names;
    each gets its flag, help, default and type, and every number given is checked against its field's range before
    the command runs (ddplan.bounds). The function names ctx, the output options and the run fields it reads itself,
    and takes the others as **run (the requests read them all from ctx.params)."""
    import functools
    import inspect

    def wrap(func):
        sig = inspect.signature(func)
        own = [p for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD and p.name != "ctx"]
        fields = [f.param for f in runfields.FIELDS if command in f.commands]
        stray = [p.name for p in own if p.name not in OUTPUT_OPTIONS and p.name not in fields]
        if stray:
            raise TypeError(f"{func.__name__} names {', '.join(stray)}, not a field {command} takes (runfields)")
        names = fields + [p.name for p in own if p.name in OUTPUT_OPTIONS]
        params = [sig.parameters["ctx"]] + [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=kind)
            for name in names for opt, kind in [_run_option(command, name)]]

        @functools.wraps(func)
        def checked(ctx: typer.Context, **values):
            for name, value in values.items():
                f = runfields.BY_PARAM.get(name)
                if f is None or value is None or command in f.many:
                    continue
                if f.range is not None:
                    bounds.check(f.flag, value)
                elif isinstance(f.kind, tuple) and value not in f.kind:
                    raise UsageError(f"{value!r} is not one of {', '.join(map(repr, f.kind))}.", field=f.flag)
                elif f.check is not None:
                    try:
                        f.check(value)
                    except ValueError as e:
                        raise UsageError(str(e), field=f.flag) from None
            return func(ctx, **values)

        checked.__signature__ = sig.replace(parameters=params)
        return checked

    return wrap

@specs_app.command("list")
def specs_list(wide: bool = WideOpt) -> None:
    """List the built-in hardware, models and framework profiles, one line each.

    \b
    Examples:
      ddplan specs list
      ddplan specs list --wide
    """
    from ddplan import render
    from ddplan.describe import list_rows

    render.echo(render.spec_list(list_rows(), render.screen("table", wide)))


@specs_app.command("show")
def specs_show(
    name: str = typer.Argument(..., help="A built-in name or alias (mi300x, d24, nanochat-d24, gpt2), a YAML path, "
                               "or a Hugging Face config.json (as --model takes them)."),
    format: SpecFormat = typer.Option(SpecFormat.text, "--format", help="text: the spec as YAML and derived "
                                      "figures; json: both as one JSON object."),
) -> None:
    """Show one spec, with the figures ddplan derives from it.

    \b
    Examples:
      ddplan specs show mi300x
      ddplan specs show d24 --format json
    """
    from ddplan import render
    from ddplan.describe import describe

    spec, derived = describe(name)
    render.echo(render.spec_json(spec, derived) if format is SpecFormat.json else render.spec_text(spec, derived))


@specs_app.command("import", short_help="A model spec from a Hugging Face config.json.")
def specs_import(
    config: str = typer.Argument(..., help="A Hugging Face config.json, or a folder holding one (read locally)."),
    out: str = typer.Option(..., "--out", "-o", help="Where to write the model spec (YAML), for editing."),
) -> None:
    """Write a ddplan model spec built from a local Hugging Face config.json, for editing.

    \b
    Examples:
      ddplan specs import config.json -o model.yaml
      ddplan table --model model.yaml --gpus 8
      ddplan table --model config.json --gpus 8

    Every default it had to assume (precision, optimizer, recipe, budget) is named in its `source` fields.
    `--model CONFIG` reads a config.json directly, as the last example does.
    """
    import yaml

    from ddplan.errors import UsageError
    from ddplan.files import atomic_write, check_output_path
    from ddplan.hf import config_path, spec_from_config

    path = config_path(config)
    if path is None:
        raise UsageError(f"not a config.json or a folder holding one: {config!r}", field="CONFIG")
    if not path.is_file():
        raise UsageError(f"no such file: {str(path)!r}", field="CONFIG")
    target = check_output_path(out, "--out", (".yaml", ".yml"))
    spec = spec_from_config(path)
    text = (f"# written by `ddplan specs import {config}`: the architecture is the config's; the dtypes, recipe and\n"
            f"# budget are ddplan's stated defaults (see source): edit them to your run\n"
            + yaml.safe_dump(spec.model_dump(mode="json", exclude_defaults=True), sort_keys=False, width=110))
    atomic_write(target, text)
    print(f"wrote {target} ({spec.name})", file=sys.stderr)


class ImportFormat(str, Enum):
    torchtitan = "torchtitan"
    megatron = "megatron"
    megatron_bridge = "megatron-bridge"
    nemo = "nemo"
    nanochat = "nanochat"


@app.command("import", short_help="A run file from a torchtitan TOML, Megatron-LM/-Bridge config, NeMo YAML, nanochat.")
def import_cmd(
    file: str = typer.Argument(..., help="The stack's file: a torchtitan job TOML, a Megatron-LM launch script or "
                                         "argument file, a Megatron-Bridge run_config.yaml or training log (its "
                                         "Task Configuration), a NeMo training YAML, or a file holding a nanochat "
                                         "base_train command line."),
    out: str = typer.Option(..., "--out", "-o", help="Where to write the run configuration (YAML)."),
    source_format: ImportFormat | None = typer.Option(None, "--from", help="The file's format (default: from its "
                                                                                "name and contents)."),
    gpus: int | None = typer.Option(None, "--gpus", min=1, help="GPUs in total, where the file does not say (or "
                                                                    "to override it)."),
    hardware: str | None = typer.Option(None, "--hardware", help="The GPU, which none of these files names "
                                                                    "(default: h100-sxm, marked assumed)."),
    model: str | None = typer.Option(None, "--model", help="The model, where the file's is not one import reads "
                                                              "(a built-in, a model YAML or a config.json)."),
) -> None:
    """Write a ddplan run configuration from the file a training stack already runs, with its framework set.

    \b
    Examples:
      ddplan import llama3_8b.toml -o run.yaml
      ddplan table --config run.yaml
      ddplan import train_gpt3_175b_distributed.sh -o gpt3.yaml --gpus 1024

    Every field the file states is written; fields it does not state are left to the framework's profile
    (frameworks/), except those no profile sets (GPUs, hardware), which are written marked `# assumed:`. Options
    not priced as stated are warnings; options that do not change a step's cost (learning rates, data, logging)
    are counted. A model that is no built-in is written beside as OUT's name with .config.json.
    """
    import warnings

    from ddplan import importers
    from ddplan.errors import InputWarning, UsageError
    from ddplan.files import check_output_path
    from ddplan.registry import load_hardware, load_model

    path = Path(file).expanduser()
    if not path.exists():
        raise UsageError(f"no such file: {file!r}", field="FILE")
    target = check_output_path(out, "--out", (".yaml", ".yml"))
    if hardware:
        load_hardware(hardware)  # a typo is one error line naming the choices, before anything is written
    if model:
        load_model(model)
    imp = importers.read(path, source_format.value if source_format else None, gpus=gpus, hardware=hardware,
                         model=model)
    command = "ddplan import " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["import"] else f"ddplan import {file}"
    extra = importers.write(imp, target, command)
    for w in imp.warnings:
        warnings.warn(InputWarning(f"{file}: {w}"))
    assumed = ", ".join(".".join(p) for p in imp.assumed)
    print(f"import: wrote {target} ({imp.format}: framework {importers.PROFILE[imp.format]}, {len(imp.fields)} fields"
          + (f"; assumed, check them: {assumed}" if assumed else "") + ")"
          + (f" and {extra} (the model's architecture)" if extra else ""), file=sys.stderr)
    if imp.ignored:
        shown = ", ".join(imp.ignored[:6]) + (", ..." if len(imp.ignored) > 6 else "")
        print(f"import: not read, as they do not change a step's cost: {len(imp.ignored)} options ({shown})", file=sys.stderr)
    print(f"import: next: ddplan table --config {target}", file=sys.stderr)


@app.command("memory", short_help="Memory per GPU by ZeRO stage, and what fits.", cls=PanelledCommand)
@run_options("memory")
def memory_cmd(
    ctx: typer.Context, calibration, plot, config, print_config, format, wide, quiet, **run
) -> None:
    """Memory per GPU by ZeRO stage: each term, the total against usable memory, and the verdict.

    \b
    Examples:
      ddplan memory --model d24 --gpus 8
      ddplan memory -m llama-3-8b --hardware h100 --gpus 8 --zero 2 --seq-len 8192
      ddplan memory --model d24 --measured-peak 105
      ddplan memory -m llama-3-8b --hardware h100 --gpus 8 --fp8
    """
    from ddplan import inputs

    if _config_first(ctx, print_config):
        return
    from ddplan import report
    from ddplan.provenance import provenance
    from ddplan.sizing import PEAK_TOLERANCE, consistent_with, fixes_for, zero_rows
    from ddplan.verdicts import outside_terms

    stated = _stated(ctx)
    ask = inputs.memory_request(ctx.params, stated)
    spec, hw, cal, setup = ask.spec, ask.hardware, ask.calibration, ask.setup
    _framework_notes(ctx, spec, stated)
    _check_plot_path(plot)
    prov = provenance(model=spec, hardware=hw, calibration=(Path(calibration).name, cal) if cal is not None else None)
    rows = zero_rows(spec, hw, setup, ask.stages)
    asked = next((r for r in rows if r["zero"] == setup.layout.zero), None)
    step_s, fixes = fixes_for(spec, hw, setup, asked, ask.block_recompute, ask.lacks, ask.recomputes_offered)
    matches = consistent_with(spec, hw, setup, ask.measured_peak, ask.peak_kind) if ask.measured_peak else []
    _warn(stated.inert)  # options given that no layout here can take
    outside = outside_terms(cal, Path(calibration).name if calibration else None)
    report.memory(ask, rows, fixes, step_s, matches, outside, prov, format.value, wide, quiet, plot, PEAK_TOLERANCE)


def _source(ctx: typer.Context, name: str) -> str | None:
    """Where parameter `name`'s value came from: COMMANDLINE, DEFAULT_MAP (a --config file's field), DEFAULT..."""
    # by name: typer >= 0.22 carries its own copy of click, whose ParameterSource is another enum class
    return getattr(ctx.get_parameter_source(name), "name", None)


def _as_flag(ctx: typer.Context, name: str) -> str:
    """Parameter `name`'s value as the flag that would give it: --zero 3, --no-compile, --sequence-parallel."""
    param = next(p for p in ctx.command.params if p.name == name)
    value = ctx.params[name]
    if isinstance(value, bool):
        return param.opts[0] if value else (param.secondary_opts or [f"no {param.opts[0]}"])[0]
    return f"{param.opts[0]} {value}"


def _from_profile(ctx: typer.Context, name: str) -> bool:
    """Whether parameter `name` took its value from the --framework profile (not a flag, not the run file)."""
    return (_source(ctx, name) == "DEFAULT_MAP" and name in ctx.meta.get("framework_names", set())
            and name not in ctx.meta.get("config_names", set()))


def _framework_notes(ctx: typer.Context, spec, stated) -> None:
    """With a --framework profile: what it set (an info line, without what the request left out: stated.dropped)
    and what the stack runs that the figures leave out (a warning each; the expert items only for a mixture of
    experts), then what of it this run cannot take (stated.notes)."""
    profile = ctx.meta.get("framework")
    if profile is None:
        return
    used = [name for name in sorted(ctx.meta.get("framework_names", set())) if _from_profile(ctx, name)
            and (name not in runfields.PROFILE_FP8_ONLY or ctx.params.get("fp8")) and name not in stated.dropped]
    from ddplan.verdicts import profile_set, profile_unread

    _info([profile_set(ctx.info_name, profile, [_as_flag(ctx, n) for n in used])])
    _warn(profile.unpriced_words(moe=spec.architecture.moe is not None))
    unread = ctx.meta.get("framework_unread", [])
    if unread:  # a profile field this command has no flag for: said, not dropped silently
        _warn([profile_unread(ctx.info_name, profile, unread)])
    _warn(stated.notes)  # what of the profile this run cannot take: after what it set


def _stated(ctx: typer.Context):
    """Where the command's values came from (ddplan.inputs.Stated): given by a flag or the run file, set by the
    --framework profile, and each given value's source in words."""
    from ddplan.inputs import Stated

    given = _given_names(ctx)
    return Stated(given=frozenset(given), profile=frozenset(n for n in ctx.params if _from_profile(ctx, n)),
                  words={n: _stated_by(ctx, n) for n in given if n in runfields.BY_PARAM})


def _given_names(ctx: typer.Context) -> set[str]:
    """The parameters whose flags were given (on the command line or as a --config file's field); a --framework
    profile's values are defaults, below what a calibration measured (review: the profile's --no-compile had
    replaced a measured compiled step)."""
    return {name for name in ctx.params if _given(ctx, name) and not _from_profile(ctx, name)}


def _given(ctx: typer.Context, name: str) -> bool:
    """Whether the flag of parameter `name` was given: on the command line, or as a --config file's field."""
    return _source(ctx, name) in ("COMMANDLINE", "DEFAULT_MAP")


def _stated_by(ctx: typer.Context, name: str) -> str:
    """Where a given value came from, in words: its flag, the --config file's field, or the framework profile."""
    if _source(ctx, name) == "DEFAULT_MAP":
        path = runfields.BY_PARAM[name].path
        if name in ctx.meta.get("config_names", set()):
            return f"the run file's {'.'.join(path)}"
        return f"the {ctx.meta['framework'].name} profile's {'.'.join(path)}"
    return runfields.BY_PARAM[name].flag


@app.command("table", short_help="The decision table: time, cost, MFU, memory per layout.", cls=PanelledCommand)
@run_options("table")
def table_cmd(
    ctx: typer.Context, calibration, plot, config, print_config, format, wide, quiet, explain, **run
) -> None:
    """The decision table: time, cost, MFU and memory for each layout, attention and window, explained.

    \b
    Examples:
      ddplan table --model d24 --gpus 1,8
      ddplan table -m llama-3-8b --hardware h100 --gpus 8-64 --zero 2,3
      ddplan table -m d24 --hardware h100 --gpus 8,16 --measured-step-time 1.8

    The last one: a step time measured on the first of --gpus (8 GPUs), at the recipe's batch (d24:
    1,048,576 tokens; else --total-batch-size), priced forward to 16. With
    --calibration and no --model, the table prices what the calibration measured (its model, GPUs, tp/pp,
    ZeRO, micro-batch, batch, recompute, attention, window, compile mode and sequence length; flags given
    win): `ddplan table --calibration cal.yaml`.
    """
    from ddplan import inputs

    if _config_first(ctx, print_config):
        return
    from ddplan import report
    from ddplan.provenance import provenance
    from ddplan.table import build_table

    stated = _stated(ctx)
    req, spec, hw, cal = inputs.table_request(ctx.params, stated, _today())
    _framework_notes(ctx, spec, stated)
    _check_plot_path(plot)
    result = build_table(req, _progress("table"))
    # options given that none of the rows built can take (skipped layouts take nothing): once the table is built
    _warn(inputs.inert_options(req.options, stated, inputs.degrees_of(r.layout for r in result.rows), "table", spec,
                               ctx.params, {r.layout.recompute for r in result.rows}))
    prov = provenance(model=spec, hardware=hw, calibration=(Path(calibration).name, cal) if cal is not None else None)
    _warn(report.table(result, prov, format.value, wide, quiet, explain, plot))


@app.command("calibrate", short_help="Measure this machine; write a calibration file.")
def calibrate_cmd(
    model: str = typer.Option(..., "--model", "-m", help="The model to measure: a built-in (d24, gpt2, ...), any "
                              "nanochat dN, or a YAML path."),
    hardware: str = typer.Option(None, "--hardware", help="The hardware spec these measurements refine (default: "
                                 "guessed from the device name; on CPU a spec is built from the measurements)."),
    device: str = typer.Option("auto", "--device", help="auto (a GPU if torch sees one), cuda (NVIDIA or ROCm), "
                               "or cpu (small shapes, for tests)."),
    quick: bool = typer.Option(False, "--quick", help="Fewer shapes and repeats (a short run; the held-out step "
                               "runs eager)."),
    compile_step: bool = typer.Option(None, "--compiled-step/--eager-step", help="Held-out training step "
                                      "torch.compile'd as the model's training program runs it (the recipe's "
                                      "compiled model; nanochat's compiled optimizer kernels), or eager (default: "
                                      "compiled, eager with --quick)."),
    cpu_malloc: str = typer.Option(None, "--cpu-malloc", help="On CPU: reuse (glibc malloc keeps freed memory "
                                   "for the run, as a GPU's caching allocator does, so large tensors do not "
                                   "re-fault their pages every step; plans for 1.5x the memory) or system "
                                   "(malloc as it is). Default: reuse, system with --quick."),
    out: str = typer.Option("calibration.yaml", "--out", "-o", help="Where to write the calibration file."),
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
    """Measure what the planner otherwise assumes, on this machine, and write a calibration file.

    \b
    Examples:
      ddplan calibrate -m d2 --device cpu --quick --seq-len 128 -o cal.yaml
      ddplan calibrate -m d24 --hardware mi300x --from-log train.log -o cal.yaml
      ddplan table -m d24 --gpus 1,8 --calibration cal.yaml

    On a GPU box run `ddplan calibrate --model MODEL` (all visible GPUs; it launches itself under torchrun
    for the collectives); the first example is a quick test run on a CPU.
    """
    from ddplan import inputs
    from ddplan.files import check_output_path
    from ddplan.registry import load_hardware, load_model

    inputs.check_ranges((nproc, "--nproc"), (device_batch_size, "--device-batch-size"), (seq_len, "--seq-len"),
                        (gpus, "--gpus"), (total_batch_size, "--total-batch-size"))
    spec = load_model(model)
    hw = load_hardware(hardware) if hardware else None
    check_output_path(out, "--out")  # before any benchmark: a bad path is said now, not after minutes of work
    if from_log:
        from ddplan.calibrate.console import from_log as calibrate_from_log

        calibrate_from_log(spec, hw, from_log, out, gpus, device_batch_size, total_batch_size, log_attention, window)
        return
    inputs.check_benchmark_flags(cpu_malloc, log_attention=log_attention, window=window, gpus=gpus,
                                 total_batch_size=total_batch_size)
    if attention is not None:
        from ddplan.calibrate.runner import check_attention  # torch: calibrate runs it anyway

        check_attention([a.strip() for a in attention.split(",")], hw)
    if micro_batches:
        inputs.int_list(micro_batches, "--micro-batches")
    from ddplan.calibrate.console import measure

    measure(spec, hw, device, quick, out, nproc, micro_batches, device_batch_size, seq_len, attention, compile_step,
            cpu_malloc)


@app.command("plan", short_help="Search the layouts and recommend one.", cls=PanelledCommand)
@run_options("plan")
def plan_cmd(
    ctx: typer.Context, calibration, objective, deadline, budget, top, headroom, plot, config, print_config, format,
    wide, quiet, **run
) -> None:
    """Search the layouts (dp, tp, pp, ZeRO, micro-batch, attention, recompute, schedule) and recommend one.

    \b
    Examples:
      ddplan plan --model d24 --gpus 8
      ddplan plan --model d26 --hardware all --gpus 8-64 --budget 500
      ddplan plan -m llama-3-8b --hardware h100,b200 --gpus 8-16 --objective cost
    """
    from ddplan import inputs

    if _config_first(ctx, print_config):
        return

    from ddplan import report
    from ddplan.plan import search
    from ddplan.provenance import provenance

    _check_plot_path(plot)
    stated = _stated(ctx)
    req, spec, hws, cal = inputs.plan_request(ctx.params, stated, _today(), every_band=format is Format.csv)
    _framework_notes(ctx, spec, stated)
    result = search(req, _progress("plan"))
    ordered = sorted(hws, key=lambda h: h.name)  # the same provenance whatever order --hardware names them in
    prov = provenance(model=spec, calibration=(Path(calibration).name, req.calibration) if req.calibration else None,
                      **{("hardware" if len(hws) == 1 else f"hardware-{i + 1}"): h for i, h in enumerate(ordered)})
    warnings, missed = report.plan(result, prov, format.value, wide, quiet, top, headroom, objective, deadline, budget,
                                   plot)
    _warn(warnings)
    if missed:  # the ranking is printed (the closest first); the exit code says no layout meets the limit
        flags = "/".join(f"--{what}" for what, _ in result.missed)
        print(f"error: {flags}: {missed}", file=sys.stderr)
        return 1


@app.command("validate", short_help="How far to trust ddplan: published runs, priced.")
def validate_cmd(
    ctx: typer.Context,
    dataset: str = typer.Option(None, "--dataset", help="A runs file (YAML, `kind: runs`; see validation/"
                                "published_runs.yaml). Default: the published runs shipped with ddplan."),
    loso: bool = typer.Option(True, "--leave-one-source-out/--in-sample", help="Re-fit the fitted parameters "
                              "without each source (and its sibling campaigns) in turn and price that source with "
                              "them, its band made without it too: the out-of-sample error a new run can expect "
                              "and how often its band holds (the default; --in-sample scores only the fits that saw "
                              "every run)."),
    plot: str = typer.Option(None, "--plot", help="Also write the error of each run against its GPU count (PNG or "
                             "SVG)."),
    memory: bool = typer.Option(False, "--memory", help="Score the memory model instead: measured peaks per GPU "
                                "(validation/memory_peaks.yaml, or --dataset FILE of `kind: memory_peaks`) against "
                                "ddplan's prediction, and its fits verdict."),
    export_run: str = typer.Option(None, "--export-run", metavar="ID", help="Instead of scoring, write the run "
                                   "with this id as a run file, ID.yaml, that `ddplan table --config` prices as "
                                   "validate does (with the model and hardware spec files it needs), into "
                                   "--export-dir."),
    export_dir: str = typer.Option(".", "--export-dir", metavar="DIR", help="Where --export-run writes."),
    format: Format = FormatOpt,
    wide: bool = WideOpt,
) -> None:
    """How far to trust ddplan: published measured runs priced as `ddplan table` prices them.

    \b
    Examples:
      ddplan validate
      ddplan validate --in-sample
      ddplan validate --memory
      ddplan validate --export-run olmocore-7b-h100-8g-s4096-bf16

    First the bottom line (the error leaving each source out, its worst run, the share inside the band); for
    each run: predicted vs measured step time, the error, and whether the measurement falls inside
    the band; then the error by kind (dense, MoE), hardware, size, precision, family and source. With
    --memory: predicted vs measured peak memory per GPU, and whether the fits verdict was right.
    """
    from ddplan import report, validation
    from ddplan.provenance import provenance
    from ddplan.runs import load_runs, shipped_dataset

    if memory:
        from ddplan.errors import UsageError

        if plot:
            raise UsageError("--memory scores the measured peaks; it has no --plot yet", field="--memory")
        if export_run is not None:
            raise UsageError("--export-run writes a published run (a step time) as a run file; a measured peak has "
                             "no export yet", field="--memory")
        _validate_memory(dataset, format, wide, loso)
        return
    where = dataset or shipped_dataset()
    if export_run is not None:
        from ddplan.errors import UsageError
        from ddplan.files import check_output_path

        ignored = [f for f, name in (("--plot", "plot"), ("--leave-one-source-out/--in-sample", "loso"),
                                     ("--format", "format"), ("--wide", "wide")) if _given(ctx, name)]
        if ignored:
            raise UsageError(f"writes a run file and scores nothing: {', '.join(ignored)} "
                             f"{'has' if len(ignored) == 1 else 'have'} nothing to act on", field="--export-run")
        from ddplan.replay import export_run as export, run_named

        run = run_named(load_runs(dataset).runs, export_run, where)
        folder = check_output_path(Path(export_dir) / f"{run.id}.yaml", "--export-dir").parent
        written = export(run, folder)
        _info([f"wrote {p}" for p in written] + [f"`ddplan table --config {written[0]}` prices it as validate does"])
        return
    _check_plot_path(plot)
    runs = load_runs(dataset)
    scorer = validation.Scorer()  # leave-one-source-out re-uses what the in-sample pass priced
    scored = validation.score_all(runs, where, progress=_progress("validate"), scorer=scorer)
    held = validation.leave_one_source_out(runs, where, validation.fitted_hardware(), progress=_progress("validate"),
                                           scorer=scorer) if loso else None
    prov = provenance(dataset=(Path(where).name, runs))
    report.validation(scored, held, where, prov, format.value, wide, plot)


def _validate_memory(dataset: str | None, format: Format, wide: bool, loso: bool) -> None:
    """`validate --memory`: each measured peak priced as `ddplan table` prices its layout, its verdict under the
    band fitted without its source (loso) or the shipped band, then summaries."""
    from ddplan import report, validation
    from ddplan.provenance import provenance
    from ddplan.registry import builtin_dir
    from ddplan.runs import DATASET, MEMORY_PEAKS, load_peaks
    from ddplan.verdicts import peaks_title

    where = dataset or str(builtin_dir("validation") / MEMORY_PEAKS)
    peaks = load_peaks(dataset)
    scored = validation.score_memory(dataset)
    if loso:
        scored = validation.peaks_leaving_each_source_out(scored)
    ran = sum(s.what == validation.RAN for s in scored)
    title = peaks_title(len(scored) - ran, ran, where, DATASET, loso)
    report.peaks(scored, validation.peak_summaries(scored), title, loso, provenance(dataset=(Path(where).name, peaks)),
                 format.value, wide)


def _progress(command: str):
    """A progress callback on stderr, one line at a time, so that it shows in a terminal and in a log
    alike: silent for the first 2 s (most commands are done by then), then at most one line a second."""
    import time

    start = last = time.monotonic()

    def report(what: str, done: int, total: int) -> None:
        nonlocal last
        now = time.monotonic()
        if now - start >= 2.0 and now - last >= 1.0:
            last = now
            print(f"{command}: {what} ({done + 1}/{total}, {now - start:.0f} s)", file=sys.stderr, flush=True)

    return report


def _info(lines: list[str]) -> None:
    """Information for the user on stderr, one line each (ddplan.render.info, imported when there is some)."""
    from ddplan.render import info

    info(lines)


def command_paths(group=None, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and group of the app, as argv prefixes, parents first: (), ('table',), ('specs',),
    ('specs', 'list'), ... (the help tests and tools/cli_reference.py walk them)."""
    import typer.main

    group = group or typer.main.get_command(app)
    paths = [prefix]
    for name, command in getattr(group, "commands", {}).items():
        paths += command_paths(command, (*prefix, name)) if hasattr(command, "commands") else [(*prefix, name)]
    return paths


def _warn(warnings: list[str]) -> None:
    """Warnings go to stderr, one line each: stdout carries the result only. A line given n times is
    printed once, with ' (xn)'."""
    import shutil
    import textwrap
    from collections import Counter

    from ddplan.render import MIN_WIDTH

    width = shutil.get_terminal_size().columns if sys.stderr.isatty() else 0  # a file or pipe: one line each
    for w, n in Counter(" ".join(w.split()) for w in warnings).items():
        text = "warning: " + w + (f" (x{n})" if n > 1 else "")
        if width:
            text = textwrap.fill(text, width=max(MIN_WIDTH, width), subsequent_indent="  ",
                                 break_on_hyphens=False)
        print(text, file=sys.stderr)


def _check_plot_path(path: str | None) -> None:
    """A plot path must end in .png or .svg and be writable (ddplan.files.check_output_path): said before any work."""
    from ddplan.errors import UsageError
    from ddplan.files import check_output_path

    if path is None:
        return
    check_output_path(path, "--plot", (".png", ".svg"))
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("needs matplotlib: pip install 'ddplan[plot]'", field="--plot") from None


def _click_words(message: str) -> str:
    """click's usage error in ddplan's form: "Invalid value for '--fit': Value error, 'x' is not one of ..." ->
    "--fit: 'x' is not one of ...", on one line."""
    import re

    text = " ".join(message.split())
    found = re.match(r"Invalid value for '(-[^']+)'(?: / '[^']+')*: (.*)", text)
    if found:
        text = f"{found.group(1)}: {found.group(2)}"
    for python, words in (("Input should be a valid number, unable to parse string as a number", "must be a number"),
                          ("Input should be a valid integer, unable to parse string as an integer",
                           "must be a whole number"),
                          ("Input should be a valid integer", "must be a whole number"),
                          ("Input should be a valid number", "must be a number"), ("Value error, ", "")):
        text = text.replace(python, words)
    return text


def _empty_value(args: list[str]) -> str | None:
    """The flag (or argument) given an empty value (`--window ''`, `--ep=`), if any: no flag of ddplan takes an
    empty string, and reading one as "not given" would silently price the default."""
    for i, arg in enumerate(args):
        if arg.startswith("--") and arg.endswith("=") and len(arg) > 3:
            return arg[:-1]
        if not arg.strip():
            before = args[i - 1] if i else ""
            return before if before.startswith("-") and "=" not in before else "an argument"
    return None


@contextlib.contextmanager
def _input_warnings():
    """ddplan.errors.InputWarning raised while a command runs: each one `warning: ` line on stderr, every time."""
    import warnings

    from ddplan.errors import InputWarning

    with warnings.catch_warnings():  # restores the filters and showwarning after
        warnings.simplefilter("always", InputWarning)
        default = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if issubclass(category, InputWarning):
                print("warning: " + " ".join(str(message).split()), file=sys.stderr)
            else:
                default(message, category, filename, lineno, file, line)
        warnings.showwarning = show
        yield


def main(argv: list[str] | None = None) -> int:
    """Console entry point; returns the exit code instead of raising SystemExit inside tests."""
    debug = os.environ.get("DDPLAN_DEBUG") == "1"
    # The planning commands run with Python's cyclic garbage collector paused (restored on return): they make
    # hundreds of thousands of small acyclic objects that reference counting frees, and its full passes over
    # the anatomies they hold took a third of `validate` and freed nothing. calibrate (torch) keeps it.
    args = sys.argv[1:] if argv is None else argv
    torch_run = args[:1] == ["calibrate"] and "--from-log" not in args
    empty = _empty_value(args)
    if empty is not None:
        print(f"error: {empty}: is empty; give a value, or leave the flag out for its default", file=sys.stderr)
        return 2
    try:
        with contextlib.nullcontext() if torch_run else no_cycle_collection(), _input_warnings():
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
        if type(e).__name__ == "ValidationError" and hasattr(e, "errors"):  # pydantic, from values built here
            err = e.errors()[0]
            where = ".".join(str(p) for p in err.get("loc", ())) or "value"
            what = " ".join(str(err.get("msg", e)).split()).removeprefix("Value error, ")  # pydantic's own wording
            print(f"error: {where}: {what}", file=sys.stderr)
            return 2
        if type(e).__name__ == "NoArgsIsHelpError":  # a bare `ddplan` / `ddplan specs`: show the help
            print(e.ctx.get_help() if getattr(e, "ctx", None) is not None else e.format_message())
            return 0
        if hasattr(e, "format_message") and hasattr(e, "exit_code"):
            print("error: " + _click_words(e.format_message()), file=sys.stderr)
            return int(e.exit_code)
        if type(e).__name__ == "Abort":
            print("error: aborted", file=sys.stderr)
            return 1
        message = " ".join(str(e).split())
        print(f"error: internal error: {type(e).__name__}: {message} (set DDPLAN_DEBUG=1 for the traceback)",
              file=sys.stderr)
        return 1


def entry() -> None:
    """The `ddplan` command. Output piped into a reader that stops early (`ddplan table | head`) ends the
    process as it ends any Unix filter, by SIGPIPE (exit 141 in a shell), not as an error (exit 1) after a
    half-written line; calibrate keeps Python's handling, since its collectives talk over sockets."""
    import signal

    if hasattr(signal, "SIGPIPE") and sys.argv[1:2] != ["calibrate"]:
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())


if __name__ == "__main__":
    entry()
