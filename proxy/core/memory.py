"""Freed large buffers go back to the system: glibc's mmap threshold pinned at start-up.

glibc serves an allocation from its own mapping only above a threshold that it raises to the size of each mapped
block freed (up to 32 MiB). Once the first multi-megabyte answer is freed, later ones come from the heap, where one
kept answer (an idempotency key's) pins the freed pages around it, so RSS outgrows the bytes held. Measured with
``python -m loadtest.bench abuse_idempotency --quick``: RSS growth 1.26x the idempotency budget with glibc's
default, 0.97x with the threshold pinned at 1 MiB. An operator's ``MALLOC_MMAP_THRESHOLD_`` wins.
"""

from __future__ import annotations

import ctypes
import os
import sys

M_MMAP_THRESHOLD = -3
"""glibc's ``mallopt`` parameter number (malloc.h); setting it also stops the threshold from moving."""
THRESHOLD_BYTES = 1024 * 1024


def pin_mmap_threshold(size: int = THRESHOLD_BYTES) -> bool:
    """Serve allocations of ``size`` bytes or more from their own mappings; ``False`` where that cannot be set (not
    glibc, or the operator chose a threshold)."""
    if not sys.platform.startswith("linux") or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    return mallopt is not None and bool(mallopt(M_MMAP_THRESHOLD, size))
