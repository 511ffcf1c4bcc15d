"""The C heap's settings in a side: fixed, the same in both roles, so a call's page faults follow from its own
allocations and never from what the process did before.

Design decisions
- glibc's malloc adapts to a process's history: freeing a block it had mmapped raises the mmap threshold to that
  block's size and the heap's trim threshold to twice that, up to 32 MiB. So two processes running the same forward
  pay differently for it: the reference's side, whose float64 evaluation (`fp64`) had freed larger blocks, kept a
  float32 forward's freed memory mapped, while a fresh candidate side handed it back to the kernel after every call
  (the heap's top trimmed) and faulted it in again in the next one, inside the judge's clock. On the 2-core CPU host
  the reference's own small conv net (two 3x3 convolutions on 16x8x32x32, both intra-op threads) as the candidate
  took 256-512 minor faults and ~1.5 ms more per ~4 ms call than the reference (0 faults): 0.42-0.82x.
- Both sides fix the thresholds first thing (`side.serve`, before any model exists): blocks below `MMAP_BYTES`
  (the most glibc's own adaptation reaches) come from the heap, and the heap keeps what it has unless more than
  `TRIM_BYTES` is free at its top. Setting them switches the adaptation off, so after its first calls either side
  runs a forward with no fault in its heap; a larger block is mapped and unmapped in every call, in both sides
  alike. The price: a side holds on to the most heap it ever used at once (blocks below 32 MiB; a larger one goes
  back when freed) until it exits. What a candidate then does to its own process's allocator (its own buffers, its
  own mallopt) is its own speed.
- Only where the C library has `mallopt` (glibc); elsewhere nothing changes and `fix` says so (False).
"""
from __future__ import annotations

import ctypes

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_BYTES = 32 << 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit: the dynamic threshold's ceiling
TRIM_BYTES = (1 << 31) - 1  # the largest value mallopt takes (an int): a heap's top is in effect never trimmed


def fix() -> bool:
    """Fix this process's malloc thresholds (module docstring). True when both took effect."""
    try:
        mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    except OSError:
        return False
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(M_MMAP_THRESHOLD, MMAP_BYTES) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_BYTES) == 1
