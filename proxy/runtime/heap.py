"""The process's heap once start-up is done: what start-up built moved out of the collector's way.

`interlock serve` calls `settle_after_start` once, after the application is listening and before
it serves a call:

- everything start-up built (modules, the configuration, the application) lives as long as the
  process: it is moved out of the collector's generations (`gc.freeze`), so a full collection
  during calls walks only what calls created;
- the young generation is collected after `YOUNG_THRESHOLD` net allocations instead of the
  interpreter's 700 (2,000 is CPython 3.13's own default). A young collection walks every young
  object still alive, and with tens of calls in flight that is their whole working state
  (futures, entries, pending ledger writes: roughly a thousand objects at 32 side-effecting
  calls): at 700 the collector ran every ten or so calls and walked all of it each time (99
  collections per 1,000 side-effecting calls at concurrency 32 through `serve`, 4 % of their
  instructions; 6 at 2,000). The threshold is not higher because garbage that only the collector
  frees (reference cycles, and whatever they hold) waits for the next collection: at 2,000 about
  three times what the interpreter's default keeps waiting. (A failed call's retry loop was such
  a cycle, holding the call's frames; `proxy.runtime.retries.run_attempts` now lets go of it.)
- the free pages start-up left behind are handed back to the system (glibc's `malloc_trim`).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc

__all__ = ["YOUNG_THRESHOLD", "settle_after_start"]

YOUNG_THRESHOLD = 2_000


def settle_after_start() -> None:
    """Freeze what start-up built, collect the young generation less often and return the
    freed memory (see the module note)."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
    _return_freed_memory()


def _return_freed_memory() -> None:
    """Hand the C allocator's free pages back to the system (glibc's `malloc_trim`).

    Start-up frees much of what it allocated (imports' temporaries, the migration check, config
    parsing); without a trim those pages stay resident for the process's life (about 5 MB).
    Elsewhere than glibc this does nothing.
    """
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
