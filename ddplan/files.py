"""Writing output files: atomically, with the permissions the umask gives (never half-written, never 0600)."""

from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path


@functools.lru_cache(maxsize=1)
def _umask() -> int:
    """The process umask, read once (reading it means setting it for an instant)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write(path: Path, text: str) -> None:
    """Write text to path via a temporary file in the same folder and os.replace: never half-written.
    The file gets the permissions the umask gives a new file (mkstemp's own are 0600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
