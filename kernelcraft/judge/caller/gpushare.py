"""Sharing a GPU among this process's jobs: shared while they run, exclusive for a job run again after it ran
out of device memory beside them.

Design decisions
- Several jobs of one caller (a bench pool's slots, an optimize run's jobs) run on one GPU at once; the device
  lock (`rounds.DeviceLock`) makes their timing exclusive, not their memory. A job's processes hold device memory
  from construction until they exit, so one job can run out of memory because the others hold most of the GPU:
  a CUDA graph of a KernelBench convolution could not allocate 8 GiB with 6.7 of 140 GiB free while two other
  evaluations' processes held 58 and 32 GiB. That is the caller's crowding, not the candidate's failure.
- Every job holds its GPU's `Share` shared from spawn to exit and remembers whether another job entered or was
  there meanwhile (`overlapped`). An out-of-memory verdict from a job that overlapped others is run once more,
  cold, holding the share exclusively: it waits until the jobs then running have exited, and jobs that arrive
  while it waits queue behind it (writer preference: a busy pool cannot starve it). Alone, the verdict stands.
- In-process only (a threading condition): another program's memory on the same GPU is not ours to wait for,
  and an out-of-memory there still stands — with the message naming the other processes.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager

_LOCK = threading.Lock()
_SHARES: dict[str, "Share"] = {}


class Share:
    """A writer-preferring reader-writer lease on one GPU, counting who overlapped whom."""

    def __init__(self) -> None:
        self.cv = threading.Condition()
        self.readers = 0
        self.writer = False
        self.waiting_writers = 0
        self.entries = 0  # shared entries so far: a holder saw others if more entered while it held

    @contextmanager
    def shared(self):
        """Hold the GPU shared; yields a dict whose "overlapped" is set on exit (another job ran beside this)."""
        with self.cv:
            while self.writer or self.waiting_writers:
                self.cv.wait()
            others, self.readers = self.readers, self.readers + 1
            self.entries += 1
            first = self.entries
        seen = {"overlapped": False}
        try:
            yield seen
        finally:
            with self.cv:
                self.readers -= 1
                seen["overlapped"] = others > 0 or self.entries > first
                self.cv.notify_all()

    @contextmanager
    def exclusive(self):
        """Hold the GPU alone among this process's jobs."""
        with self.cv:
            self.waiting_writers += 1
            while self.writer or self.readers:
                self.cv.wait()
            self.waiting_writers -= 1
            self.writer = True
        try:
            yield
        finally:
            with self.cv:
                self.writer = False
                self.cv.notify_all()


def share(gpu: str) -> Share:
    with _LOCK:
        return _SHARES.setdefault(gpu, Share())
