"""The run configuration: one training run stated in a file, read by `table`, `memory` and `plan --config FILE`.

A YAML file, `kind: run`, `version: 1`, grouped as a run is described (the seed's: examples/seed-d24-mi300x.yaml):

    kind: run
    version: 1
    model: d24                        # a built-in name, a model YAML, or a Hugging Face config.json
    hardware: mi300x
    gpus: [1, 8]                      # a list makes one row per value, as `--gpus 1,8` does
    layout: {tp: 1, pp: 1, zero: 1}
    precision: {dtype: bf16}
    attention: [sdpa-fused, flash-attn-ck]
    window: [L, SSSL]
    batch: {device: 32, total_tokens: 524288}
    measured: {step_time_s: 7.7, gpus: 1, attention: sdpa-fused, window: L}

Every field is optional and is exactly one command-line flag (FLAGS below): a field stated in the file is read as
if its flag were given, and a flag given on the command line wins over the file's field. A command reads the fields
it has flags for (`memory` prices one layout: a list there must hold one value; `plan` searches the layout degrees
itself) and no other. `--print-config` writes the configuration of a command line in this form.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, create_model, model_validator

from ddplan.runfields import FIELDS, RunField
from ddplan.specs import Strict

GPU_RANGES = r"^\s*\d+(\s*-\s*\d+)?(\s*,\s*\d+(\s*-\s*\d+)?)*\s*$"  # as --gpus takes them: 1,8-64
# the sections of a run file, in its order, with what each holds
SECTION_DOCS = {
    "layout": "How the GPUs split the model and the data (one row per value of each list, in `table`).",
    "precision": "Compute, gradient and weight dtypes, and fp8.",
    "batch": "The batch: per GPU per micro-batch, and per optimizer step.",
    "budget": "How long the run trains: at most one of the three (the recipe's budget otherwise).",
    "outside": "Time outside the training steps.",
    "measured": "A step measured on this run (table fits one efficiency to it; memory takes its peak).",
    "plan": "What `plan` optimises.",
}


def _as_text(value: Any) -> Any:
    """A number as its text (a YAML number where a field parses text: its grammar then says what is allowed),
    anything else as it is."""
    return str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


def annotation(f: RunField) -> Any:
    """The type a run file's value of field f must have: its kind within its range, or a list of them where a
    command takes several (--gpus also as the flag's ranges, '1,8-64')."""
    if isinstance(f.kind, tuple):
        one: Any = Literal[f.kind]
    elif f.check is not None:  # a number where a text is parsed (grad_bucket: 134217728) is read as its text
        one = Annotated[f.kind, BeforeValidator(_as_text), AfterValidator(f.check)]
    elif f.range is None or f.kind not in (int, float):
        one = f.kind
    else:
        r = f.range
        one = Annotated[f.kind, Field(**{"gt" if r.low_open else "ge": r.low, "lt" if r.high_open else "le": r.high})]
    typed = list[one] | one if f.many else one
    if f.param == "gpus":
        typed = typed | Annotated[str, Field(pattern=GPU_RANGES)]
    return typed | None


def _fields(fields: list[RunField]) -> dict[str, Any]:
    return {f.path[-1]: (annotation(f), Field(default=None, description=f"{f.help} ({f.flag})")) for f in fields}


SECTIONS: dict[str, type[Strict]] = {
    name: create_model(name.capitalize(), __base__=Strict, __doc__=doc,
                       **_fields([f for f in FIELDS if f.path[0] == name]))
    for name, doc in SECTION_DOCS.items()
}
_top: dict[str, Any] = {}
for _f in FIELDS:  # in the file's order: a section where its first field is
    if len(_f.path) == 1:
        _top.update(_fields([_f]))
    elif _f.path[0] not in _top:
        _top[_f.path[0]] = (SECTIONS[_f.path[0]], SECTIONS[_f.path[0]]())
_RunFields = create_model("_RunFields", __base__=Strict, kind=(Literal["run"], ...), version=(Literal[1], 1), **_top)


class RunConfig(_RunFields):
    """One training run: what `table`, `memory` and `plan` price. Every field optional (its flag's default);
    the fields are ddplan.runfields.FIELDS."""

    @model_validator(mode="after")
    def _one_budget(self) -> RunConfig:
        given = [k for k, v in self.budget.model_dump().items() if v is not None]
        if len(given) > 1:
            raise ValueError(f"budget: give at most one of steps, tokens, param_data_ratio (got {', '.join(given)})")
        return self


# field path in the file -> the command's parameter (its flag: the name with - for _)
FLAGS: dict[tuple[str, ...], str] = {f.path: f.param for f in FIELDS}
# the parameters each command takes as a comma-separated list (one row each, or a search's choices); every other
# parameter takes one value, and a list in the file for it is an error unless its flag is given
LIST_PARAMS = {command: frozenset(f.param for f in FIELDS if command in f.many) for command in ("table", "memory",
                                                                                                "plan")}
# names or file paths: text even when written in digits (a file named 7); a relative path is the run file's folder's
NAMES = frozenset(f.param for f in FIELDS if f.names_a_file)


def field_paths() -> list[tuple[str, ...]]:
    """Every leaf field of RunConfig, as a path (kind and version excepted)."""
    out = []
    for name in RunConfig.model_fields:
        if name in ("kind", "version"):
            continue
        out += [(name, k) for k in SECTIONS[name].model_fields] if name in SECTIONS else [(name,)]
    return out


def _get(config: RunConfig, path: tuple[str, ...]) -> Any:
    node: Any = config
    for part in path:
        node = getattr(node, part)
    return node


def _beside(source: str, value: Any) -> Any:
    """A relative file path in the run file (model: my-model.yaml) read from the run file's folder, as a reader
    of the file would (a built-in name, or a path that only exists from the working folder, as given)."""
    from pathlib import Path

    if isinstance(value, list):
        return [_beside(source, v) for v in value]
    if not isinstance(value, str) or Path(value).is_absolute():
        return value
    here = Path(source).expanduser().parent / value
    return str(here) if here.exists() and not Path(value).exists() else value


def as_flag_value(value: Any) -> Any:
    """A field's value as its flag takes it: a list joined with commas, anything else as is."""
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return value


def defaults_for(config: RunConfig, params: dict[str, bool], source: str
                 ) -> tuple[dict[str, Any], dict[str, tuple[str, str, list]], list[str]]:
    """(the command's parameter defaults the file states, as click's default_map: each stated field under its
    parameter's name, for the parameters this command has; the lists of several values given for a parameter of
    one value, by name: (file, field, values), an error unless the flag is given; the stated fields this command
    has no flag for, which it does not read). params: name -> whether it takes one value (memory's --gpus) rather
    than a comma-separated list (table's)."""
    out: dict[str, Any] = {}
    lists: dict[str, tuple[str, str, list]] = {}
    unread: list[str] = []
    for path, name in FLAGS.items():
        value = _get(config, path)
        if value is None:
            continue
        if name not in params:
            unread.append(".".join(path))
            continue
        if name in NAMES:
            value = _beside(source, value)
        if params[name] and isinstance(value, list):
            if len(value) != 1:
                lists[name] = (source, ".".join(path), value)
                continue
            value = value[0]
        out[name] = as_flag_value(value)
    return out, lists, unread


def from_params(params: dict[str, Any], stated: set[str]) -> RunConfig:
    """The run configuration of a command line: each parameter in `stated` (given on the command line or by a
    file) under its field; lists written as lists."""
    data: dict[str, Any] = {"kind": "run", "version": 1}
    for path, name in FLAGS.items():
        if name not in stated or params.get(name) is None:
            continue
        value = params[name]
        value = getattr(value, "value", value)  # an Enum choice
        if isinstance(value, str) and "," in value:
            items = [v.strip() for v in value.split(",")]
            numbers = all(v.isdigit() for v in items)
            value = [int(v) for v in items] if numbers else value if name == "gpus" else items
        elif isinstance(value, str) and value.strip().isdigit() and name not in NAMES:
            value = int(value)  # a list flag given one count: `--zero 1`
        node = data
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    return RunConfig.model_validate(data)


def flow(value: Any) -> str:
    """One value in YAML's flow style, on one line: d24, [1, 8], '1,8-64', {device: 32}."""
    import yaml

    text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
    return text[:-3].strip() if text.endswith("\n...") or text.endswith("...") else text


def to_yaml(config: RunConfig) -> str:
    """The configuration as a file: the stated fields only, in the schema's order."""
    data = config.model_dump(mode="json", exclude_none=True, exclude_defaults=False)
    # a key a line, a section's few fields on its line: `batch: {device: 32, total_tokens: 524288}`
    lines = "".join(f"{k}: {flow(v)}\n" for k, v in data.items() if v != {})
    return ("# a ddplan run configuration: `ddplan table --config FILE` (or memory, plan) prices it; a flag given\n"
            "# with it wins over its field. Fields: ddplan/runfields.py\n" + lines)
