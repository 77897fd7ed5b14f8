"""The cyclic garbage collector, paused where millions of acyclic objects are built and let go
together (a page of pods parsed, a cluster's turn, a bulk write): rescanning them is most of the
cost otherwise. Used by the readers, the writers and the Dagster shell alike."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused_gc(*, freeze: bool = True) -> Iterator[None]:
    """No cyclic garbage collection inside (nested uses keep it off until the outermost ends).

    With `freeze`, what was built inside is taken as long-lived and acyclic, and moved out of the
    collector's sight at the end instead of being scanned by the next collection (refcounting
    still frees it). Without, the collector goes back to work as it was: for a scope whose
    objects are let go at its end."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            if freeze:
                gc.freeze()
            gc.enable()
