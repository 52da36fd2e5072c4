"""Python's cyclic garbage collector around start-up (docs/design.md, "Runtime cold start").

Start-up creates some 100,000 objects that live as long as the process (modules, the server, the
session's wrappers) and almost no garbage. Left on, the collector runs about 150 times while the
modules import, each pass over a growing heap with the GIL held, so the engine thread waits too;
once serving, every full pass walks all of those objects again between requests.

So the runtime pauses the collector before its imports and, once it serves (or start-up ended
otherwise), freezes every object alive into the permanent generation, which collections skip, and
turns the collector back on. Reference counting frees objects as usual throughout; the only
cost is that cycles made during start-up (a few thousand objects) are kept.
"""

from __future__ import annotations

import gc


def pause() -> None:
    """Before the start-up imports: no collections until :func:`resume`."""
    gc.disable()


def resume() -> int:
    """After start-up: freeze what is alive (never scanned again) and collect from here on; the
    number of objects frozen. Idempotent."""
    gc.freeze()
    gc.enable()
    return gc.get_freeze_count()
