"""Sharing a GPU among this process's jobs: shared while they run, exclusive for a job run again after it ran
out of device memory beside them.

Every job holds its GPU's `Share` shared from spawn to exit and learns whether another job overlapped it; the
runner runs an overlapped job's out-of-memory outcome once more holding the share exclusively (writer preference:
a busy pool cannot starve it). In-process only: another program's memory is never waited for.

Rationale: docs/design/judge-caller.md#gpushare
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
