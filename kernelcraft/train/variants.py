"""The exemplar database of a training run: every measured variant per task, shown back in prompts.

One run database per task under OUT/exemplars/ (the shape of an `optimize` run's), seeded once from the
training data and grown with every correct completion; each prompt draws its exemplars afresh
(`search.exemplars.select`). A task's best correct speedup is the jump check's reference.

Rationale: docs/design/train.md#variants
"""
from __future__ import annotations

import hashlib
import random
import re
import threading
from pathlib import Path

from kernelcraft.search import exemplars as ex
from kernelcraft.search.rundb import RunDB
from kernelcraft.search.techniques import techniques
from kernelcraft.task import Task, load_task
from kernelcraft.train.prompting import messages


def slug(task: Task) -> str:
    base = re.sub(r"[^A-Za-z0-9._-]+", "-", task.name.strip("/")).strip("-")[-60:] or "task"
    return f"{base}-{task.sha256[:8]}"


class VariantStore:
    def __init__(self, root: Path, device, prompt_settings=None, *, n: int = 2, tau: float = 1.0,
                 bucket_width: float = 0.1, selector: str = "contrastive"):
        self.root, self.device, self.prompt_settings = Path(root), device, prompt_settings
        self.n, self.tau, self.bucket_width, self.selector = n, tau, bucket_width, selector
        self._dbs: dict[str, RunDB] = {}
        self._lock = threading.RLock()

    def __getstate__(self) -> dict:
        """Picklable by its settings (datasets fingerprints the prompt generator by pickling it): a copy
        opens its own connections to the same databases."""
        return {k: v for k, v in self.__dict__.items() if k not in ("_dbs", "_lock")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._dbs, self._lock = {}, threading.RLock()

    def db(self, task: Task) -> RunDB:
        with self._lock:
            if task.sha256 not in self._dbs:
                db = RunDB(self.root / slug(task))
                if db.get_meta("task_sha256") is None:
                    db.set_meta("task", task.name)
                    db.set_meta("task_sha256", task.sha256)
                    db.set_meta("task_source", task.source)
                    db.set_meta("device", self.device.describe())
                self._dbs[task.sha256] = db
            return self._dbs[task.sha256]

    def close(self) -> None:
        with self._lock:
            for db in self._dbs.values():
                db.close()
            self._dbs.clear()

    def seed(self, task: Task, examples: list[dict]) -> int:
        """Store the training data's correct candidates for `task` once; returns how many were new."""
        db = self.db(task)
        if db.get_meta("seeded"):
            return 0
        new = 0
        for e in examples:
            if e["task_source"] == task.source:
                new += self.add(task, e["candidate"], _seed_verdict(task, e), policy="data", round=0,
                                meta={"origin": e["origin"]})
        db.set_meta("seeded", True)
        return new

    def add(self, task: Task, code: str, verdict: dict, *, policy: str, round: int, meta=None,
            prompt: str | None = None, reply: str | None = None) -> bool:
        """Record a judged variant (any status); True when its source was new."""
        db = self.db(task)
        cid, new = db.add_candidate(code, policy=policy, round=round, meta=meta, prompt=prompt, reply=reply)
        if new:
            db.claim(cid)
            db.finish(cid, verdict)
        return new

    def exemplars(self, task: Task) -> list[ex.Exemplar]:
        return [ex.Exemplar(r.id, r.source, r.speedup, techniques(r.source, r.meta))
                for r in self.db(task).rows("WHERE status = 'correct' AND speedup IS NOT NULL")]

    def best(self, task: Task) -> float | None:
        with self._lock:
            r = self.db(task).conn.execute("SELECT MAX(speedup) FROM candidates WHERE status = 'correct'").fetchone()
        return r[0]

    def prompt(self, task: Task, rng: random.Random) -> tuple[list[dict], list[int]]:
        """A fresh prompt for `task`: messages, and the ids of the variants it shows."""
        items = self.exemplars(task)
        shown = ex.select(items, rng, selector=self.selector, n=self.n, tau=self.tau,
                          bucket_width=self.bucket_width) if items and self.n else []
        return messages(task.source, shown, self.device, self.prompt_settings), [e.id for e in shown]


def _seed_verdict(task: Task, e: dict) -> dict:
    """The verdict-shaped record a seeded variant is stored with (the data file keeps its origin)."""
    return {"task": task.name, "candidate_sha256": hashlib.sha256(e["candidate"].encode()).hexdigest(),
            "status": "correct", "reasons": [], "message": f"from the training data: {e['origin']}",
            "speedup": e["speedup"], "timing": {"speedup": e["speedup"], "ci95": [e["speedup"], e["speedup"]]}}


def resolve_tasks(names: list[str] | None, examples: list[dict], cfg) -> list[Task]:
    """The stage's tasks: the config's names (built-in or files), else the train split's tasks."""
    if names:
        return [load_task(n if "\n" in n or not n.endswith(".py") else str(cfg.path(n))) for n in names]
    seen: dict[str, Task] = {}
    for e in examples:
        t = Task(name=e["task"], source=e["task_source"])
        seen.setdefault(t.sha256, t)
    return list(seen.values())
