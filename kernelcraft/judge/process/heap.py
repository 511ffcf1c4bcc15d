"""The C heap's settings in a side: fixed, the same in both roles, so a call's page faults follow from its own
allocations and never from what the process did before.

`fix` sets glibc's mmap and trim thresholds (`MMAP_BYTES`, `TRIM_BYTES`) before any model exists, which switches
malloc's adaptation off; it returns False where the C library has no `mallopt`.

Rationale: docs/design/judge-process.md#heap
"""
from __future__ import annotations

import ctypes

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_BYTES = 32 << 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit: the dynamic threshold's ceiling
TRIM_BYTES = (1 << 31) - 1  # the largest value mallopt takes (an int): a heap's top is in effect never trimmed


def fix() -> bool:
    """Fix this process's malloc thresholds (docs/design/judge-process.md#heap). True when both took effect."""
    try:
        mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    except OSError:
        return False
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(M_MMAP_THRESHOLD, MMAP_BYTES) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_BYTES) == 1
