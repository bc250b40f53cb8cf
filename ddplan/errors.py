"""The only errors a user sees. Each renders as one line: `error: <file>: <field>: <what>`."""

from __future__ import annotations

from typing import Any


class DdplanError(Exception):
    """A user-facing error: bad spec, bad flag, impossible layout. Exit code 1 unless `exit_code` says."""

    exit_code = 1

    def __init__(self, message: str, *, file: str | None = None, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.file = file
        self.field = field

    def one_line(self) -> str:
        parts = [p for p in (self.file, self.field) if p]
        text = ": ".join([*parts, self.message])
        return "error: " + " ".join(text.split())  # collapse newlines: one line, always


class SpecError(DdplanError):
    """A hardware, model or calibration spec that cannot be found, parsed or validated."""


class UsageError(DdplanError):
    """A flag value that is out of range or inconsistent with another flag (exit code 2)."""

    exit_code = 2


class ImpossibleMeasurement(UsageError):
    """A measured step the hardware cannot have run as stated (faster than its FLOPs at peak, or needing kernels
    faster than the device's best GEMM): always an error, also for a calibration file's own step."""


class LayoutError(DdplanError):
    """A parallel layout that cannot exist (degrees that do not divide, batch that does not split)."""


class InputWarning(UserWarning):
    """Something in the user's input that ddplan read but could not use as stated (e.g. fields of a config.json
    it does not read). Raised with warnings.warn; the CLI prints each as one `warning: ` line on stderr."""


def kind_of(value: Any) -> str:
    """What a YAML or JSON value is, in the words of the file and not of Python ("nothing", not NoneType)."""
    if value is None:
        return "nothing (an empty value)"
    if isinstance(value, bool):
        return f"{str(value).lower()} (a true/false value)"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    if isinstance(value, str):
        return f"the text {value[:40]!r}"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    return f"a {type(value).__name__}"
