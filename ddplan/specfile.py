"""Reading a spec file: YAML through a safe loader with size, depth and duplicate-key checks, and validation
into a pydantic schema, every failure one SpecError naming the file, the line or field path, and what is allowed.

ddplan.registry finds specs by name and reads them through this; ddplan.hf and ddplan.runs validate what they
build with it (a module below both, so neither imports the other).
"""

from __future__ import annotations

import difflib
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from ddplan.errors import SpecError, kind_of

T = TypeVar("T", bound=BaseModel)


MAX_SPEC_BYTES = 1_000_000  # a spec or calibration file is kilobytes; a megabyte is a mistake
# a dataset of published runs holds hundreds of entries, each with its sources and assumptions written out: the
# shipped one is over a megabyte (1.17 MB with 257 runs, 2026-12-07)
MAX_DATASET_BYTES = 8_000_000
MAX_DEPTH = 32  # nesting levels of a spec (the deepest built-in has 5)


class _UniqueKeys:
    """A safe loader's constructor that refuses a key given twice in one mapping (YAML would silently keep
    the last); mixed into PyYAML's safe loaders below."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor` merges, it is not a key
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                if key in seen:
                    raise _DuplicateKey(f"duplicate key {key!r} on lines {seen[key]} and {line}", key_node.start_mark)
                seen[key] = line
            except TypeError:  # an unhashable key: SafeLoader's own error says so
                continue
        return super().construct_mapping(node, deep=deep)


class _PyUniqueKeyLoader(_UniqueKeys, yaml.SafeLoader):
    """The pure-Python safe loader, refusing duplicate keys."""


# PyYAML's C parser (libyaml) where PyYAML was built with it: the same safe constructor on a parser about 10x
# faster (all 30 built-in specs: 1.09 s -> 0.11 s); the pure-Python one elsewhere.
if getattr(yaml, "__with_libyaml__", False):
    class _UniqueKeyLoader(_UniqueKeys, yaml.CSafeLoader):
        """The C-parser safe loader, refusing duplicate keys."""
else:  # pragma: no cover - PyYAML without libyaml
    _UniqueKeyLoader = _PyUniqueKeyLoader


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, problem: str, mark):
        super().__init__(problem)
        self.problem, self.problem_mark = problem, mark


MAX_NODES = 100_000  # values in a spec once aliases are expanded (the largest built-in has a few hundred)


def _depth(data: Any, limit: int) -> int:
    """Nesting depth of parsed YAML, stopping at limit + 1 (no recursion: safe on any input). Raises
    SpecError past MAX_NODES values: aliases can make a small file expand to billions (an alias bomb)."""
    deepest, stack, seen = 0, [(data, 1)], 0
    while stack:
        node, d = stack.pop()
        deepest, seen = max(deepest, d), seen + 1
        if deepest > limit:
            break
        if seen > MAX_NODES:
            raise SpecError(f"more than {MAX_NODES:,} values once aliases are expanded (a spec has hundreds)")
        if isinstance(node, dict):
            stack += [(v, d + 1) for v in node.values()]
        elif isinstance(node, list):
            stack += [(v, d + 1) for v in node]
    return deepest


def read_text(path: Path, what: str = "a YAML file", max_bytes: int = MAX_SPEC_BYTES) -> str:
    """A small text file's contents; every failure names the file: unreadable, a folder, over max_bytes (a spec's
    MAX_SPEC_BYTES unless the caller reads a larger kind of file), or not UTF-8."""
    if path.is_dir():
        raise SpecError(f"is a folder, not {what}", file=str(path))
    try:
        size = path.stat().st_size
        if size > max_bytes:
            what_is = "a spec" if max_bytes == MAX_SPEC_BYTES else "this file"
            raise SpecError(f"{size:,} bytes: {what_is} is at most {max_bytes:,}", file=str(path))
        return path.read_bytes().decode("utf-8")
    except OSError as e:
        raise SpecError(f"cannot read: {e.strerror}", file=str(path)) from None
    except UnicodeDecodeError as e:
        raise SpecError(f"not UTF-8 text (byte {e.start}: {e.reason})", file=str(path)) from None


def read_yaml(path: Path, max_bytes: int = MAX_SPEC_BYTES) -> Any:
    """Parse a YAML file with a safe loader; every failure names the file (and the line where known): those of
    read_text (at most max_bytes), a syntax error, a duplicate key, too deep, or a number Python refuses (an integer
    of more than 4,300 digits)."""
    text = read_text(path, max_bytes=max_bytes)
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 -- a SafeLoader subclass
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "YAML"
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        if "maximum nesting depth" in problem:  # libyaml's own limit (the C loader)
            raise SpecError(f"nested too deeply (a spec has at most {MAX_DEPTH} levels)", file=str(path)) from None
        what = problem if isinstance(e, _DuplicateKey) else f"YAML syntax error: {problem}"
        raise SpecError(what, file=str(path), field=where) from None
    except RecursionError:
        raise SpecError(f"nested too deeply (a spec has at most {MAX_DEPTH} levels)", file=str(path)) from None
    except ValueError as e:  # int() of a number over 4,300 digits (Python's limit), or the like
        what = "an integer of more than 4,300 digits" if "digits" in str(e) else " ".join(str(e).split())[:100]
        raise SpecError(f"a value Python cannot read: {what}", file=str(path)) from None
    try:
        too_deep = _depth(data, MAX_DEPTH) > MAX_DEPTH
    except SpecError as e:
        raise SpecError(e.message, file=str(path)) from None
    if too_deep:
        raise SpecError(f"nested too deeply (a spec has at most {MAX_DEPTH} levels)", file=str(path))
    return data


KINDS = ("hardware", "model", "calibration", "runs", "run", "framework", "memory_peaks")  # the files ddplan reads, by their `kind`


def validate(schema: type[T], data: Any, source: str) -> T:
    """Validate data against a schema; the first error names the field path and what is allowed."""
    if not isinstance(data, dict):
        raise SpecError(f"expected a mapping of keys to values, got {kind_of(data)}", file=source)
    kind = getattr(schema, "model_fields", {}).get("kind")
    expected = typing.get_args(kind.annotation) if kind is not None else ()
    given = data.get("kind")
    if expected and given in KINDS and given not in expected:  # e.g. a model as --hardware (a typo: pydantic's words)
        raise SpecError(f"this is a {given} file (kind: {given}), where a {expected[0]} spec "
                        f"(kind: {expected[0]}) is expected", file=source, field="kind")
    try:
        return schema.model_validate(data)
    except ValidationError as e:
        err = _first_error(e.errors())
        raise SpecError(_describe(schema, err), file=source,
                        field=".".join(str(p) for p in _untagged(err["loc"])) or None) from None


def _first_error(errors: list[dict]) -> dict:
    """The error to report: an unknown key before anything else, since a misspelled key
    (`num_layer`) also makes the real one (`num_layers`) missing, and the typo is the cause. A field that takes
    one value or a list of them (`zero: 1` or `zero: [0, 1]`) fails once per form: the one value's error says
    what is wrong with it, the list's only "must be a list"."""
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    same = [e for e in errors if _untagged(e["loc"]) == _untagged(first["loc"]) and e["type"] != "list_type"]
    return same[0] if first["type"] == "list_type" and same else first


_BRANCH_NAMES = {"str", "int", "float", "bool", "none", "list", "dict"}


def _untagged(loc: tuple) -> tuple:
    """A pydantic error location without the union branches it names ('list[constrained-int]', 'literal[0,1]',
    'str'): the path of keys in the file."""
    return tuple(p for p in loc if not (isinstance(p, str) and ("[" in p or "-" in p or p in _BRANCH_NAMES)))


# pydantic's sentences that speak Python ("a valid dictionary or instance of MoE"), in a spec's words
_WORDS = {"model_type": "must be a mapping of keys to values", "dict_type": "must be a mapping of keys to values",
          "model_attributes_type": "must be a mapping of keys to values", "list_type": "must be a list",
          "tuple_type": "must be a list", "string_type": "must be text", "int_type": "must be a whole number",
          "int_parsing": "must be a whole number", "int_from_float": "must be a whole number",
          "float_type": "must be a number", "float_parsing": "must be a number",
          "bool_type": "must be true or false", "bool_parsing": "must be true or false",
          "date_type": "must be a date (YYYY-MM-DD)", "date_parsing": "must be a date (YYYY-MM-DD)",
          "date_from_datetime_parsing": "must be a date (YYYY-MM-DD)", "datetime_type": "must be a date and time",
          "datetime_parsing": "must be a date and time", "finite_number": "must be a finite number"}


def _describe(schema: type[BaseModel], err: dict) -> str:
    """One sentence for a pydantic error, with the allowed keys for an unknown one."""
    msg = _WORDS.get(err["type"], err["msg"])
    if err["type"] == "extra_forbidden":
        allowed = _fields_at(schema, err["loc"][:-1])
        if allowed:
            close = difflib.get_close_matches(str(err["loc"][-1]), allowed, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ";"
            return f"unknown key{hint} allowed keys: {', '.join(allowed)}"
        return "unknown key"
    if err["type"] == "missing":
        return "missing required field"
    if err["type"] not in {"value_error", "assertion_error"} and "input" in err:
        got = err["input"]
        shown = kind_of(got) if isinstance(got, (dict, list, tuple, bool, type(None))) else repr(got)
        return f"{msg} (got {shown if len(shown) <= 80 else shown[:77] + '...'})"
    return msg.removeprefix("Value error, ")


def _fields_at(schema: type[BaseModel], loc: tuple) -> list[str]:
    """Field names of the sub-model at a location path, following nested models, lists and dicts."""
    model: Any = schema
    for part in loc:
        if isinstance(part, int) or model is None:
            continue  # list index or dict key: the element type is handled below
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            if isinstance(part, str) and model is not None:
                continue  # a dict key (e.g. a collective name)
            return []
        model = _model_in(field.annotation)
    return list(getattr(model, "model_fields", {}))


def _model_in(annotation: Any) -> Any:
    """The first BaseModel class inside an annotation such as `X | None`, `list[X]`, `dict[str, X]`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    return None
