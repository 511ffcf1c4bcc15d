"""Verdicts of identical (task, candidate, options) judged once: a persistent cache in front of any evaluator.

Key: the SHA-256 of the task source, the candidate's normalised hash, a hash of the options. A cached verdict
is never re-measured (timing noise is frozen per pair). One JSON line per verdict, appended as it arrives; a
torn line is skipped on load.

Rationale: docs/design/train.md#judgecache
"""
from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

from kernelcraft.candidate import normalized_hash
from kernelcraft.task import Task


def key_of(item: dict) -> str:
    opts = json.dumps(item.get("options") or {}, sort_keys=True)
    return "|".join([hashlib.sha256(item["task"].encode()).hexdigest(), normalized_hash(item["candidate"]),
                     hashlib.sha256(opts.encode()).hexdigest()[:16]])


class LocalJudge:
    """The judge in this process (`kernelcraft.evaluate.evaluate_many`): the reward service's batch API
    without the service. Item options are `evaluate`'s knobs (`device`, `trials`, `time_budget_s`, ...)."""

    def __init__(self, jobs: int = 1):
        self.jobs = jobs

    def evaluate_batch(self, items: list[dict]) -> list[dict]:
        from kernelcraft.evaluate import evaluate

        def one(it):
            return evaluate(Task(name="<source>", source=it["task"]), it["candidate"], **(it.get("options") or {}))

        if self.jobs <= 1 or len(items) <= 1:
            return [one(it).to_json() for it in items]
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(self.jobs) as pool:
            return [v.to_json() for v in pool.map(one, items)]


class CachedJudge:
    def __init__(self, inner, path: str | Path | None = None):
        self.inner = inner
        self.path = Path(path) if path else None
        self.verdicts: dict[str, dict] = {}
        self.hits = self.misses = 0
        self._lock = threading.Lock()
        if self.path is not None and self.path.is_file():
            for line in self.path.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue  # a line torn by a kill
                self.verdicts[rec["key"]] = rec["verdict"]

    def evaluate_batch(self, items: list[dict]) -> list[dict]:
        keys = [key_of(it) for it in items]
        with self._lock:
            todo = {k: it for k, it in zip(keys, items) if k not in self.verdicts}
            self.hits += len(items) - len(todo)
            self.misses += len(todo)
        if todo:
            got = self.inner.evaluate_batch(list(todo.values()))
            with self._lock:
                for k, v in zip(todo, got):
                    self.verdicts[k] = v
                    if self.path is not None:
                        self.path.parent.mkdir(parents=True, exist_ok=True)
                        with open(self.path, "a") as f:
                            f.write(json.dumps({"key": k, "verdict": v}) + "\n")
        return [self.verdicts[k] for k in keys]
