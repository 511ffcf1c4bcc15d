"""Baselines for `kernelcraft bench`: what a candidate has to beat besides the reference itself.

A baseline (`inductor`, `inductor-max-autotune`, `cudagraph`) is an ordinary candidate rendered from the task
and judged under the candidates' protocol; `eager` is the reference itself (1.0, never timed). Verdicts are
cached in `<cache>/bench/baselines.sqlite` by task, device identity, versions, baseline and protocol; verdicts
of the moment (timeouts, harness errors, crashes, out of memory) are never cached.
Rationale: docs/design/bench.md#baselines
"""
from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
from pathlib import Path

from kernelcraft.judge.caller.runner import cache_root
from kernelcraft.search.recipes.render import render
from kernelcraft.version import __version__

COMPILE_BASELINES = ("inductor", "inductor-max-autotune")
RECIPES = {
    "eager": None,
    "inductor": ["compile:default"],
    "inductor-max-autotune": ["compile:max-autotune-no-cudagraphs"],
    "cudagraph": ["cudagraph"],
}
ALIASES = {"compile": "inductor", "torch.compile": "inductor", "default": "inductor",
           "max-autotune": "inductor-max-autotune", "inductor-max": "inductor-max-autotune",
           "cuda-graph": "cudagraph", "cudagraphs": "cudagraph", "graph": "cudagraph"}
DEFAULT = "eager,inductor,cudagraph"
# torch.compile compiles at the first forward, inside the evaluation's run clock (`timeout_s`, by default 180 s on
# a CPU, 300 s on a GPU): compile baselines get at least this long (max-autotune benchmarks many kernel variants).
MIN_TIMEOUT_S = {"inductor": 600.0, "inductor-max-autotune": 1200.0}
GPU_ONLY = ("cudagraph",)
_UNCACHED_REASONS = {"harness_error", "crashed", "timeout", "out_of_memory"}


def parse(spec: str | None, device: str) -> tuple[list[str], dict[str, str]]:
    """(baselines to measure, in a fixed order; {baseline: why skipped}) from `eager,inductor,...`.

    `all` means every baseline. Unknown names raise ValueError. GPU-only baselines on a CPU are skipped
    with a note, not an error (the same command line works on both).
    """
    names: list[str] = []
    for raw in (spec if spec is not None else DEFAULT).split(","):
        name = raw.strip().lower()
        if not name or name == "none":
            continue
        if name == "all":
            names += list(RECIPES)
            continue
        name = ALIASES.get(name, name)
        if name not in RECIPES:
            raise ValueError(f"unknown baseline {raw.strip()!r}: choose from {', '.join(RECIPES)} (or all)")
        names.append(name)
    skipped = {}
    if not device.startswith("cuda"):
        for n in GPU_ONLY:
            if n in names:
                skipped[n] = "needs a CUDA device (CUDA-graph replay)"
    ordered = [n for n in RECIPES if n in names and n not in skipped]
    return ordered, skipped


def source(task_source: str, name: str) -> str:
    """The baseline's candidate source for a task (not for `eager`, which is the reference itself)."""
    recipe = RECIPES[name]
    if recipe is None:
        raise ValueError("eager is the reference itself; it has no candidate source")
    return render(task_source, recipe)


def cache_key(task_sha256: str, device: str, baseline: str, protocol: dict) -> str:
    import torch

    material = json.dumps({"task": task_sha256, "device": device, "torch": torch.__version__,
                           "kernelcraft": __version__, "baseline": baseline,
                           "protocol": protocol}, sort_keys=True)
    return hashlib.sha256(material.encode()).hexdigest()


def cacheable(record: dict) -> bool:
    if record.get("status") == "timeout" or _UNCACHED_REASONS & set(record.get("reasons") or []):
        return False
    # the reference's own out-of-memory is a task_error by reason, but the moment's all the same
    return not (record.get("status") != "correct" and "out of memory" in str(record.get("message", "")).lower())


class Cache:
    """A small SQLite key -> verdict-record store, safe for several bench processes at once."""

    def __init__(self, root: str | os.PathLike | None = None):
        d = Path(root) if root is not None else cache_root() / "bench"
        d.mkdir(parents=True, exist_ok=True)
        self.path = d / "baselines.sqlite"
        self._lock = threading.Lock()
        self._con = sqlite3.connect(str(self.path), timeout=30, check_same_thread=False)
        self._con.execute("PRAGMA journal_mode=WAL")
        self._con.execute("CREATE TABLE IF NOT EXISTS baselines (key TEXT PRIMARY KEY, record TEXT NOT NULL, "
                          "created_at REAL NOT NULL)")
        self._con.commit()

    def get(self, key: str) -> dict | None:
        with self._lock:
            row = self._con.execute("SELECT record FROM baselines WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else None

    def put(self, key: str, record: dict) -> None:
        if not cacheable(record):
            return
        with self._lock:
            self._con.execute("INSERT OR REPLACE INTO baselines (key, record, created_at) VALUES (?, ?, ?)",
                              (key, json.dumps(record), time.time()))
            self._con.commit()

    def close(self) -> None:
        with self._lock:
            self._con.close()
