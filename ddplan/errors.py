"""The only errors a user sees. Each renders as one line: `error: <file>: <field>: <what>`."""

from __future__ import annotations


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


class LayoutError(DdplanError):
    """A parallel layout that cannot exist (degrees that do not divide, batch that does not split)."""
