"""The hack-case table: every rejected or suspicious candidate training produced, with code, verdict and
reason — a labelled dataset of reward-hacking attempts, exportable as JSON lines.

sqlite (WAL) in OUT/hackcases.db, one row per (task, normalised source, reason) with a `count`; labels `hack`
and `suspicious`; `similar(code)` ranks stored cases by token-set Jaccard similarity.

Rationale: docs/design/train.md#hackcases
"""
from __future__ import annotations

import json
import re
import sqlite3
import threading
import time
from pathlib import Path

from kernelcraft.candidate import normalized_hash

SCHEMA = """
CREATE TABLE IF NOT EXISTS cases (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    stage TEXT NOT NULL,
    task TEXT NOT NULL,
    task_sha256 TEXT NOT NULL,
    norm_hash TEXT NOT NULL,
    code TEXT NOT NULL,
    label TEXT NOT NULL,
    reason TEXT NOT NULL,
    detail TEXT NOT NULL DEFAULT '',
    status TEXT,
    speedup REAL,
    verdict TEXT NOT NULL,
    review TEXT,
    count INTEGER NOT NULL DEFAULT 1,
    UNIQUE(task_sha256, norm_hash, reason)
);
"""
LABELS = ("hack", "suspicious")
_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\S")


class HackCases:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self.conn = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None, timeout=30)
        self.conn.row_factory = sqlite3.Row
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.executescript(SCHEMA)

    def close(self) -> None:
        with self._lock:
            self.conn.close()

    def add(self, *, stage: str, task: str, task_sha256: str, code: str, label: str, reason: str, verdict: dict,
            detail: str = "", review: dict | None = None) -> int:
        if label not in LABELS:
            raise ValueError(f"label must be one of {LABELS}, not {label!r}")
        now = time.time()
        with self._lock:
            self.conn.execute(
                "INSERT INTO cases(created_at, updated_at, stage, task, task_sha256, norm_hash, code, label, reason,"
                " detail, status, speedup, verdict, review) VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT(task_sha256, norm_hash, reason) DO UPDATE SET count = count + 1,"
                " updated_at = excluded.updated_at, label = excluded.label, review = COALESCE(excluded.review, review)",
                (now, now, stage, task, task_sha256, normalized_hash(code), code, label, reason, detail,
                 verdict.get("status"), verdict.get("speedup"), json.dumps(verdict),
                 json.dumps(review) if review is not None else None))
            return self.conn.execute("SELECT id FROM cases WHERE task_sha256 = ? AND norm_hash = ? AND reason = ?",
                                     (task_sha256, normalized_hash(code), reason)).fetchone()[0]

    def rows(self, label: str | None = None) -> list[dict]:
        with self._lock:
            rs = self.conn.execute("SELECT * FROM cases" + (" WHERE label = ?" if label else "") + " ORDER BY id",
                                   (label,) if label else ()).fetchall()
        out = []
        for r in rs:
            d = dict(r)
            d["verdict"] = json.loads(d["verdict"])
            d["review"] = json.loads(d["review"]) if d["review"] else None
            out.append(d)
        return out

    def counts(self) -> dict[str, int]:
        with self._lock:
            return {r[0]: r[1] for r in self.conn.execute("SELECT label, COUNT(*) FROM cases GROUP BY label")}

    def export_jsonl(self, out: str | Path, label: str | None = None) -> int:
        """Write every case (of `label`) as one JSON line (code, label, reason, verdict, ...); returns the count."""
        rows = self.rows(label)
        Path(out).write_text("".join(json.dumps(r) + "\n" for r in rows))
        return len(rows)

    def similar(self, code: str, n: int = 3) -> list[dict]:
        """The `n` stored cases most like `code` (token-set Jaccard), most similar first."""
        if n <= 0:
            return []
        mine = set(_TOKEN.findall(code))
        scored = []
        for r in self.rows():
            theirs = set(_TOKEN.findall(r["code"]))
            j = len(mine & theirs) / max(1, len(mine | theirs))
            scored.append((j, -r["id"], r))
        scored.sort(key=lambda x: (x[0], x[1]), reverse=True)
        return [{**r, "similarity": round(j, 3)} for j, _, r in scored[:n]]
