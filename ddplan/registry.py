"""Find, read and validate specs: built-in names, aliases, nanochat's `dN`, or a path to a user's YAML.

Every failure becomes a SpecError that names the file, the line or field path, and the allowed
values, so the CLI can print it on one line.
"""

from __future__ import annotations

import difflib
import functools
from importlib import resources
from pathlib import Path

from ddplan.calibration import CalibrationSpec
from ddplan.errors import SpecError
from ddplan.frameworks import FrameworkProfile
from ddplan.hf import config_path, spec_from_config
from ddplan.nanochat import nanochat_spec
from ddplan.specfile import read_yaml, validate
from ddplan.specs import HardwareSpec, ModelSpec, nanochat_depth

MAX_NANOCHAT_DEPTH = 256


def builtin_dir(kind: str) -> Path:
    """The folder of built-in specs: inside the wheel (ddplan/_specs/KIND) or, from a checkout, the top-level KIND/."""
    packaged = Path(str(resources.files("ddplan"))) / "_specs" / kind
    if packaged.is_dir():
        return packaged
    checkout = Path(__file__).resolve().parent.parent / kind
    if checkout.is_dir():
        return checkout
    raise SpecError(f"built-in {kind} specs not found (looked in {packaged} and {checkout}); reinstall ddplan")


# --------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _builtins(kind: str) -> dict[str, Path]:
    """Map every built-in name and alias of a kind to its file (names are file stems)."""
    table: dict[str, Path] = {}
    for path in _builtin_files(kind).values():
        table[path.stem] = path
        data = read_yaml(path)
        for alias in (data or {}).get("aliases", []) if isinstance(data, dict) else []:
            table.setdefault(str(alias).lower(), path)
    return table


@functools.lru_cache(maxsize=None)
def _builtin_files(kind: str) -> dict[str, Path]:
    """Built-in names (file stems) of a kind -> their files, without reading them."""
    return {path.stem: path for path in sorted(builtin_dir(kind).glob("*.yaml"))}


def builtin_names(kind: str) -> list[str]:
    return sorted(_builtin_files(kind))


def _builtin(kind: str, key: str) -> Path | None:
    """The built-in file of a lower-case name: a file stem first (read nothing), else an alias (reads them all)."""
    return _builtin_files(kind).get(key) or _builtins(kind).get(key)


def _looks_like_path(name: str) -> bool:
    return name.endswith((".yaml", ".yml")) or "/" in name or "\\" in name


def _resolve(kind: str, name: str, flag: str) -> Path:
    if _looks_like_path(name):
        path = Path(name).expanduser()
        if path.is_dir():
            raise SpecError(f"is a folder, not a YAML file, for {flag}", file=name)
        if not path.is_file():
            raise SpecError(f"no such file for {flag}", file=name)
        return path
    key = name.lower()
    found = _builtin(kind, key)
    if found is not None:
        return found
    close = difflib.get_close_matches(key, list(_builtins(kind)), n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise SpecError(f"unknown {kind[:-1] if kind.endswith('s') else kind} {name!r}; {hint}"
                    f"built-ins: {', '.join(builtin_names(kind))} (or a path to a YAML file)", field=flag)


@functools.lru_cache(maxsize=64)
def load_hardware(name: str) -> HardwareSpec:
    """A hardware spec by built-in name, alias, or YAML path."""
    path = _resolve("hardware", name, "--hardware")
    return validate(HardwareSpec, read_yaml(path), str(path))


@functools.lru_cache(maxsize=64)
def load_model(name: str) -> ModelSpec:
    """A model spec by built-in name, alias, nanochat `dN`/`nanochat-dN` (any depth), or YAML path."""
    hf = config_path(name)
    if hf is not None:
        return spec_from_config(hf)
    depth = nanochat_depth(name.lower())
    if depth is not None and _builtin("models", name.lower()) is None:
        if not 1 <= depth <= MAX_NANOCHAT_DEPTH:
            raise SpecError(f"nanochat depth must be in 1..{MAX_NANOCHAT_DEPTH} (d{MAX_NANOCHAT_DEPTH}: "
                            f"width {MAX_NANOCHAT_DEPTH * 64}, about 0.8 T parameters), got {name!r}", field="--model")
        return nanochat_spec(depth)
    path = _resolve("models", name, "--model")
    return validate(ModelSpec, read_yaml(path), str(path))


@functools.lru_cache(maxsize=16)
def load_framework(name: str) -> FrameworkProfile:
    """A framework profile (ddplan.frameworks) by built-in name, alias, or YAML path."""
    path = _resolve("frameworks", name, "--framework")
    return validate(FrameworkProfile, read_yaml(path), str(path))


def calibration_hardware(cal, path: str) -> HardwareSpec:
    """The hardware a calibration file refines: the spec it carries, else the built-in it names."""
    if cal.hardware_spec is not None:
        hw = validate(HardwareSpec, cal.hardware_spec, f"{path}: hardware_spec")
        if cal.hardware not in (hw.name, *hw.aliases):
            raise SpecError(f"hardware_spec is named {hw.name!r}, the file says hardware {cal.hardware!r}: one of them "
                            f"is wrong", file=path, field="hardware")
        return hw
    try:
        return load_hardware(cal.hardware)
    except SpecError as e:
        raise SpecError(f"names hardware {cal.hardware!r}, which is not a built-in, and carries no hardware_spec "
                        f"({e.message})", file=path, field="hardware") from None


def load_calibration(path: str):
    """A calibration file (YAML, `kind: calibration`): see ddplan.calibration."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise SpecError("is a folder, not a YAML file, for --calibration", file=path)
    if not p.is_file():
        raise SpecError("no such file for --calibration", file=path)
    return validate(CalibrationSpec, read_yaml(p), str(p))
