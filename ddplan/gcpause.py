"""Pause Python's cyclic garbage collector while pricing many layouts (one context manager, for the library
and the CLI alike)."""

from __future__ import annotations

import contextlib
import gc


@contextlib.contextmanager
def no_cycle_collection():
    """Pause Python's cyclic garbage collector while pricing many layouts (a search, a table, validation).

    Pricing allocates hundreds of thousands of small acyclic objects (ops of anatomies, priced layouts,
    dicts, tuples; reference counting frees them) while holding large anatomies; the collector's full
    passes over those cost a quarter of a search and nearly half of `ddplan validate` (benchmarks/speed.py)
    and find nothing to free. Nested uses leave it paused; the outermost restores it.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
