"""Files ddplan writes and the JSON it reads.

Output files: checked before any work starts (`check_output_path`), then written atomically with the
permissions the umask gives (never half-written, never 0600). JSON: duplicate keys refused, as YAML's are
(ddplan.registry): `{"num_hidden_layers": 32, ..., "num_hidden_layers": 80}` is an error, not 80.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from ddplan.errors import DdplanError, UsageError


@functools.lru_cache(maxsize=1)
def _umask() -> int:
    """The process umask, read once (reading it means setting it for an instant)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write(path: Path, text: str) -> None:
    """Write text to path via a temporary file in the same folder and os.replace: never half-written.
    The file gets the permissions the umask gives a new file (mkstemp's own are 0600)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:  # the folder went away or turned read-only after check_output_path
        raise DdplanError(f"cannot write here: {_reason(e)}", file=str(path)) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise DdplanError(f"cannot write here: {_reason(e)}", file=str(path)) from None
        raise


def _reason(e: OSError) -> str:
    """An OSError in words: 'read-only file system', 'permission denied', 'no space left on device'."""
    return (e.strerror or errno.errorcode.get(e.errno or 0, type(e).__name__)).lower()


def check_output_path(path: str | os.PathLike, flag: str, suffixes: tuple[str, ...] = ()) -> Path:
    """The output file a flag names, checked before any work starts: not a folder, its suffix one of
    `suffixes` (when given), and a folder above it that exists as a folder and takes a new file (probed by
    making and removing one; a missing folder below it is created at write time). One-line UsageError naming
    the flag otherwise."""
    if not str(path).strip():
        raise UsageError("is empty: give a file name", field=flag)
    try:
        target = Path(path).expanduser()
    except RuntimeError as e:  # ~someone who has no home here
        raise UsageError(f"cannot write {str(path)!r}: {e}", field=flag) from None
    if suffixes and target.suffix.lower() not in suffixes:
        raise UsageError(f"must end in {' or '.join(suffixes)}, got {str(path)!r}", field=flag)
    try:
        return _writable(target, str(path), flag)
    except OSError as e:  # a name too long for the filesystem, a path through something unreadable
        raise UsageError(f"cannot write {str(path)[:80]!r}: {_reason(e)}", field=flag) from None


def _writable(target: Path, path: str, flag: str) -> Path:
    if target.is_dir():
        raise UsageError(f"{path!r} is a folder: give a file name inside it", field=flag)
    if target.exists() and not os.access(target, os.W_OK):
        raise UsageError(f"{path!r} exists and cannot be written (permission denied)", field=flag)
    if len(target.name.encode()) > 255:  # NAME_MAX of every common filesystem; is_dir() may not say so
        raise OSError(errno.ENAMETOOLONG, "file name too long")
    folder = target.absolute().parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise UsageError(f"{str(folder)!r} is a file, not a folder: cannot write {path!r}", field=flag)
    try:  # a real probe: permissions alone miss a read-only mount, /proc, and everything for root
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".ddplan-probe.", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise UsageError(f"cannot write in {str(folder)!r} ({_reason(e)})", field=flag) from None
    return target


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    seen: dict = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"duplicate key {key!r}")
        seen[key] = value
    return seen


def loads_json(text: str) -> Any:
    """json.loads with duplicate keys refused (ValueError "duplicate key 'k'"); JSONDecodeError as json's."""
    return json.loads(text, object_pairs_hook=_no_duplicates)
