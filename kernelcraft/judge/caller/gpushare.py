"""Sharing a GPU among this process's jobs: admitted by the device memory their task is known to take, shared
while they run, exclusive for a job run again after it ran out of device memory beside them.

Every job holds its GPU's `Share` shared from spawn to exit and learns whether another job overlapped it. Jobs
enter in arrival order; one whose task's footprint is known (`Footprints`: the largest peak an earlier job of
the task reported) enters only where it fits beside the known footprints already in (`BUDGET_SHARE` of the
GPU), or alone. A job of a task not yet measured enters by an estimate from its bytes where the caller has one
(`Footprints.estimate`), else on trust. The runner runs an overlapped job's
out-of-memory outcome once more holding the share exclusively (writer preference: a busy pool cannot starve it).
In-process only: another program's memory is never waited for. Footprints are advice for admission, never a
verdict; they come from the judge process, never from the candidate's.

Rationale: docs/design/judge-caller.md#gpushare
"""
from __future__ import annotations

import json
import os
import threading
from contextlib import contextmanager
from pathlib import Path

BUDGET_SHARE = 0.9  # of a GPU's memory, for the known footprints of the jobs running on it
CONTEXT_BYTES = 512 << 20  # a CUDA context's own device memory (not in the allocator's count), per process
JOB_PROCESSES = 3  # the judge, the reference's side and the candidate's, each with a context
# a task never measured, whose inputs, parameters and outputs are known (the bench's roofline pass): its jobs
# reported 9-13 times those bytes on KernelBench's level 1, plus the contexts (BENCHMARKS.md)
ESTIMATE_PER_IO_BYTE = 10
FOOTPRINTS_FILE = "device_footprints.json"  # under the cache root: what a task's jobs took, across runs
MAX_FOOTPRINTS = 4096  # the file keeps the most recently learned
_LOCK = threading.Lock()
_SHARES: dict[str, "Share"] = {}
_FOOTPRINTS: dict[str, "Footprints"] = {}


class Share:
    """A writer-preferring reader-writer lease on one GPU, first come first served, with readers admitted by
    memory; counts who overlapped whom."""

    def __init__(self) -> None:
        self.cv = threading.Condition()
        self.readers = 0
        self.writer = False
        self.waiting_writers = 0
        self.entries = 0  # shared entries so far: a holder saw others if more entered while it held
        self.tickets = 0  # shared arrivals so far
        self.serving = 0  # the arrival allowed to enter next: nobody passes a job waiting for room
        self.abandoned: set[int] = set()  # arrivals that stopped waiting (an exception): passed over in turn
        self.committed = 0  # the known footprints of the jobs holding it shared (bytes)
        self.total = 0  # the GPU's memory in bytes, once a job has reported it (0: unknown, nothing is refused)

    def fits(self, need: int) -> bool:
        """Would a job that takes `need` bytes (0: unknown) fit beside the jobs in now?"""
        return (not need or not self.total or self.readers == 0
                or self.committed + need <= BUDGET_SHARE * self.total)

    @contextmanager
    def shared(self, need: int = 0):
        """Hold the GPU shared, once the arrivals before this one are in and `need` bytes fit; yields a dict whose
        "overlapped" is set on exit (another job ran beside this)."""
        with self.cv:
            ticket, self.tickets = self.tickets, self.tickets + 1
            try:
                while self.writer or self.waiting_writers or self.serving != ticket or not self.fits(need):
                    self.cv.wait()
            except BaseException:  # interrupted while waiting: the arrivals behind it must not wait for it
                self.abandoned.add(ticket)
                self._next()
                raise
            self._next(entered=ticket)
            others, self.readers = self.readers, self.readers + 1
            self.committed += need
            self.entries += 1
            first = self.entries
        seen = {"overlapped": False}
        try:
            yield seen
        finally:
            with self.cv:
                self.readers -= 1
                self.committed -= need
                seen["overlapped"] = others > 0 or self.entries > first
                self.cv.notify_all()

    def _next(self, entered: int | None = None) -> None:
        """The turn passes on: past the arrival that just entered and past those that stopped waiting."""
        if entered is not None:
            self.serving += 1
        while self.serving in self.abandoned:
            self.abandoned.discard(self.serving)
            self.serving += 1
        self.cv.notify_all()

    @contextmanager
    def exclusive(self):
        """Hold the GPU alone among this process's jobs."""
        with self.cv:
            self.waiting_writers += 1
            try:
                while self.writer or self.readers:
                    self.cv.wait()
            finally:
                self.waiting_writers -= 1
                self.cv.notify_all()  # readers held back for it go on if it stopped waiting
            self.writer = True
        try:
            yield
        finally:
            with self.cv:
                self.writer = False
                self.cv.notify_all()

    def learn_total(self, total: int) -> None:
        if total > 0:
            with self.cv:
                self.total = max(self.total, total)
                self.cv.notify_all()


class Footprints:
    """The device bytes each task's jobs took at their peak (the largest seen), by key (task text and protocol),
    kept in memory and in `FOOTPRINTS_FILE` under the cache root so a later run starts from them."""

    def __init__(self, path: Path | None):
        self.path = path
        self.lock = threading.Lock()
        self.known: dict[str, int] = self._read()
        self.estimated: dict[str, int] = {}  # until a job of the task reports (never written to the file)

    def need(self, key: str | None) -> int:
        with self.lock:
            return (self.known.get(key) or self.estimated.get(key, 0)) if key else 0

    def estimate(self, key: str, io_bytes: int) -> None:
        """A footprint for a task none of whose jobs has reported yet, from its inputs', parameters' and outputs'
        bytes (`ESTIMATE_PER_IO_BYTE`); the first report replaces it, larger or smaller."""
        if io_bytes > 0:
            with self.lock:
                self.estimated[key] = ESTIMATE_PER_IO_BYTE * io_bytes + JOB_PROCESSES * CONTEXT_BYTES

    def learn(self, key: str | None, peak: int) -> None:
        """Keep `peak` for `key` where it is the largest yet (the file rewritten when it grows by 5% or more)."""
        if not key or peak <= 0:
            return
        with self.lock:
            old = self.known.get(key, 0)
            if peak <= old:
                return
            self.known.pop(key, None)
            self.known[key] = peak  # the most recently learned last: the file keeps the newest MAX_FOOTPRINTS
            if peak >= 1.05 * old:
                self._write()

    def _read(self) -> dict[str, int]:
        if self.path is None:
            return {}
        try:
            got = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}  # none yet, or torn: admission starts on trust
        if not isinstance(got, dict):
            return {}
        return {k: int(v) for k, v in got.items() if isinstance(k, str) and isinstance(v, int) and v > 0}

    def _write(self) -> None:
        if self.path is None:
            return
        merged = {**self._read(), **self.known}  # another process's footprints kept
        merged = dict(list(merged.items())[-MAX_FOOTPRINTS:])
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(merged))
            os.replace(tmp, self.path)
        except OSError:
            tmp.unlink(missing_ok=True)  # advice only: a read-only cache keeps them in memory


def share(gpu: str) -> Share:
    with _LOCK:
        return _SHARES.setdefault(gpu, Share())


def footprints(root: Path | None) -> Footprints:
    """The footprints kept under the cache root `root` (in memory only without one)."""
    name = str(root) if root is not None else ""
    with _LOCK:
        if name not in _FOOTPRINTS:
            _FOOTPRINTS[name] = Footprints(Path(root) / FOOTPRINTS_FILE if root is not None else None)
        return _FOOTPRINTS[name]
