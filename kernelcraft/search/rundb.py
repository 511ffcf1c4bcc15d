"""The run database: one SQLite file per run directory holding every candidate and what became of it.

One transaction per state change (WAL): a kill loses only in-flight evaluations, which `requeue_in_flight`
puts back. Candidates are unique by normalised source; parse errors are rows too; confirmations have their own
table; `invocations` reads each invocation's span back from what is stored.
Rationale: docs/design/search.md#rundb
"""
from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from kernelcraft.candidate import normalized_hash

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS candidates (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    created_at REAL NOT NULL,
    round INTEGER NOT NULL,
    policy TEXT NOT NULL,
    sha256 TEXT,
    norm_hash TEXT UNIQUE,
    source TEXT,
    parents TEXT NOT NULL DEFAULT '[]',
    meta TEXT NOT NULL DEFAULT '{}',
    prompt TEXT,
    reply TEXT,
    usage TEXT,
    state TEXT NOT NULL,
    status TEXT,
    reasons TEXT NOT NULL DEFAULT '[]',
    message TEXT NOT NULL DEFAULT '',
    speedup REAL,
    ci_low REAL,
    ci_high REAL,
    verdict TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    evals_done INTEGER NOT NULL DEFAULT 0,
    duplicates INTEGER NOT NULL DEFAULT 0,
    started_at REAL,
    finished_at REAL
);
CREATE INDEX IF NOT EXISTS candidates_state ON candidates(state);
CREATE TABLE IF NOT EXISTS confirmations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    candidate_id INTEGER NOT NULL REFERENCES candidates(id),
    created_at REAL NOT NULL,
    status TEXT NOT NULL,
    speedup REAL,
    ci_low REAL,
    ci_high REAL,
    verdict TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    kind TEXT NOT NULL,
    data TEXT NOT NULL DEFAULT '{}'
);
"""

DB_NAME = "run.db"


@dataclass
class Row:
    """One candidate as stored (JSON columns decoded)."""
    id: int
    round: int
    policy: str
    source: str | None
    sha256: str | None
    state: str
    status: str | None
    speedup: float | None
    ci_low: float | None
    ci_high: float | None
    parents: list = field(default_factory=list)
    meta: dict = field(default_factory=dict)
    reasons: list = field(default_factory=list)
    message: str = ""
    verdict: dict | None = None
    prompt: str | None = None
    reply: str | None = None
    usage: dict | None = None
    attempts: int = 0
    evals_done: int = 0
    duplicates: int = 0
    created_at: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None

    @property
    def correct(self) -> bool:
        return self.status == "correct" and self.speedup is not None

    def faster_than(self, bar: float = 1.0) -> bool:
        """Correct, and faster than `bar` beyond timing noise (95% CI lower bound above it)."""
        return self.correct and self.ci_low is not None and self.ci_low > bar


_JSON = ("parents", "meta", "reasons", "verdict", "usage")


def _row(r: sqlite3.Row) -> Row:
    d = {k: r[k] for k in r.keys() if k in Row.__dataclass_fields__}
    for k in _JSON:
        if k in d and d[k] is not None:
            d[k] = json.loads(d[k])
    return Row(**d)


class RunDB:
    def __init__(self, path: str | Path):
        path = Path(path)
        if path.is_dir() or not path.suffix:
            path.mkdir(parents=True, exist_ok=True)
            path = path / DB_NAME
        self.path = path
        self._lock = threading.RLock()
        self.conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None, timeout=30)
        self.conn.row_factory = sqlite3.Row
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across process kills
        self.conn.executescript(SCHEMA)

    def close(self) -> None:
        with self._lock:
            self.conn.close()

    def __enter__(self) -> "RunDB":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _write(self, sql: str, args=()) -> sqlite3.Cursor:
        with self._lock:
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                cur = self.conn.execute(sql, args)
                self.conn.execute("COMMIT")
                return cur
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise

    # -- meta / events ---------------------------------------------------------------------------
    def get_meta(self, key: str, default=None):
        with self._lock:
            r = self.conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return json.loads(r[0]) if r else default

    def set_meta(self, key: str, value) -> None:
        self._write("INSERT INTO meta(key, value) VALUES(?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                    (key, json.dumps(value)))

    def log(self, kind: str, **data) -> None:
        self._write("INSERT INTO events(at, kind, data) VALUES(?, ?, ?)", (time.time(), kind, json.dumps(data)))

    def events(self, kind: str | None = None) -> list[dict]:
        with self._lock:
            rows = self.conn.execute("SELECT at, kind, data FROM events" + (" WHERE kind = ?" if kind else "")
                                     + " ORDER BY id", (kind,) if kind else ()).fetchall()
        return [{"at": r[0], "kind": r[1], **json.loads(r[2])} for r in rows]

    def invocations(self) -> list[tuple[float, float]]:
        """(start, end) of every invocation of the run (`optimize` logs a `start` event for each); the end is
        the last timestamp written before the next start: events, candidates, confirmations."""
        with self._lock:
            starts = [r[0] for r in self.conn.execute("SELECT at FROM events WHERE kind = 'start' ORDER BY id")]
            stamps = [r[0] for r in self.conn.execute(
                "SELECT at FROM events UNION ALL SELECT created_at FROM candidates UNION ALL "
                "SELECT started_at FROM candidates WHERE started_at IS NOT NULL UNION ALL "
                "SELECT finished_at FROM candidates WHERE finished_at IS NOT NULL UNION ALL "
                "SELECT created_at FROM confirmations")]
        spans = []
        for i, t0 in enumerate(starts):
            t1 = starts[i + 1] if i + 1 < len(starts) else float("inf")
            spans.append((t0, max([t for t in stamps if t0 <= t < t1], default=t0)))
        return spans

    # -- candidates ------------------------------------------------------------------------------
    def add_candidate(self, source: str, *, policy: str, round: int, parents=(), meta=None, prompt=None,
                      reply=None, usage=None) -> tuple[int, bool]:
        """(id, True) for a new candidate, queued for evaluation; (existing id, False) for a duplicate."""
        import hashlib

        norm = normalized_hash(source)
        with self._lock:
            old = self.conn.execute("SELECT id FROM candidates WHERE norm_hash = ?", (norm,)).fetchone()
            if old:
                self._write("UPDATE candidates SET duplicates = duplicates + 1 WHERE id = ?", (old[0],))
                return old[0], False
            cur = self._write(
                "INSERT INTO candidates(created_at, round, policy, sha256, norm_hash, source, parents, meta, prompt,"
                " reply, usage, state) VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'queued')",
                (time.time(), round, policy, hashlib.sha256(source.encode()).hexdigest(), norm, source,
                 json.dumps(list(parents)), json.dumps(meta or {}), prompt, reply,
                 json.dumps(usage) if usage is not None else None))
            return cur.lastrowid, True

    def add_parse_error(self, *, policy: str, round: int, reply: str | None, message: str, reason: str = "parse_error",
                        prompt=None, usage=None, meta=None, parents=()) -> int:
        """A proposal with no usable code: kept (with the reply) and counted, never evaluated."""
        now = time.time()
        cur = self._write(
            "INSERT INTO candidates(created_at, round, policy, parents, meta, prompt, reply, usage, state, status,"
            " reasons, message, finished_at) VALUES(?, ?, ?, ?, ?, ?, ?, ?, 'done', 'parse_error', ?, ?, ?)",
            (now, round, policy, json.dumps(list(parents)), json.dumps(meta or {}), prompt, reply,
             json.dumps(usage) if usage is not None else None, json.dumps([reason]), message, now))
        return cur.lastrowid

    def claim(self, cid: int) -> None:
        self._write("UPDATE candidates SET state = 'in_flight', attempts = attempts + 1, started_at = ? WHERE id = ?",
                    (time.time(), cid))

    def finish(self, cid: int, verdict: dict) -> None:
        t = verdict.get("timing") or {}
        ci = t.get("ci95") or (None, None)
        ok = verdict.get("status") == "correct"
        self._write(
            "UPDATE candidates SET state = 'done', status = ?, reasons = ?, message = ?, speedup = ?, ci_low = ?,"
            " ci_high = ?, verdict = ?, evals_done = evals_done + 1, finished_at = ? WHERE id = ?",
            (verdict.get("status"), json.dumps(verdict.get("reasons", [])), verdict.get("message", ""),
             verdict.get("speedup") if ok else None, ci[0] if ok else None, ci[1] if ok else None,
             json.dumps(verdict), time.time(), cid))

    def requeue_in_flight(self) -> list[int]:
        with self._lock:
            ids = [r[0] for r in self.conn.execute("SELECT id FROM candidates WHERE state = 'in_flight'")]
        if ids:
            self._write("UPDATE candidates SET state = 'queued' WHERE state = 'in_flight'")
        return ids

    def get(self, cid: int) -> Row:
        with self._lock:
            r = self.conn.execute("SELECT * FROM candidates WHERE id = ?", (cid,)).fetchone()
        if r is None:
            raise KeyError(cid)
        return _row(r)

    def rows(self, where: str = "", args=()) -> list[Row]:
        with self._lock:
            rs = self.conn.execute("SELECT * FROM candidates " + where + " ORDER BY id", args).fetchall()
        return [_row(r) for r in rs]

    def queued(self) -> list[Row]:
        return self.rows("WHERE state = 'queued'")

    def count(self) -> int:
        with self._lock:
            return self.conn.execute("SELECT COUNT(*) FROM candidates").fetchone()[0]

    def last_round(self) -> int:
        with self._lock:
            r = self.conn.execute("SELECT MAX(round) FROM candidates").fetchone()[0]
        return r or 0

    # -- confirmations ---------------------------------------------------------------------------
    def add_confirmation(self, cid: int, verdict: dict) -> None:
        t = verdict.get("timing") or {}
        ci = t.get("ci95") or (None, None)
        ok = verdict.get("status") == "correct"
        self._write("INSERT INTO confirmations(candidate_id, created_at, status, speedup, ci_low, ci_high, verdict)"
                    " VALUES(?, ?, ?, ?, ?, ?, ?)",
                    (cid, time.time(), verdict.get("status"), verdict.get("speedup") if ok else None,
                     ci[0] if ok else None, ci[1] if ok else None, json.dumps(verdict)))

    def confirmations(self) -> dict[int, dict]:
        """The latest confirmation per candidate id."""
        with self._lock:
            rs = self.conn.execute("SELECT candidate_id, status, speedup, ci_low, ci_high, verdict FROM confirmations"
                                   " ORDER BY id").fetchall()
        return {r[0]: {"status": r[1], "speedup": r[2], "ci_low": r[3], "ci_high": r[4],
                       "verdict": json.loads(r[5])} for r in rs}
