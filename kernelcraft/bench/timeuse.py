"""Where a bench's seconds went: its evaluations by kind and level, and their time off the device, waiting for it
and on it, per worker phase.

Read back from every verdict the run directory holds (`phases_s`), whichever invocation measured it; cached
baselines and verdicts an optimize run took from the bench's baselines (`shared`) are not counted again.
Rationale: docs/design/bench.md#timeuse
"""
from __future__ import annotations

import json
import sqlite3
import statistics
from collections.abc import Iterable
from pathlib import Path

from kernelcraft.judge.caller.runner import BUILD_PHASES, WAIT_PHASES


def _clocks(phases: dict) -> tuple[float, float, float]:
    """(off the device, waiting for it, on it) seconds of one verdict's phases."""
    off = wait = on = 0.0
    for name, s in (phases or {}).items():
        if not isinstance(s, (int, float)):
            continue
        if name in BUILD_PHASES:
            off += s
        elif name in WAIT_PHASES:
            wait += s
        else:
            on += s
    return off, wait, on


def _run_records(db: Path):
    """(kind, task sha256 or None, verdict) of one optimize run's database, read-only."""
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    except sqlite3.Error:
        return
    try:
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        sha = json.loads(meta["task_sha256"]) if meta.get("task_sha256") else None  # meta values are JSON
        rows = [("search", v) for (v,) in conn.execute("SELECT verdict FROM candidates WHERE verdict IS NOT NULL")]
        rows += [("confirm", v) for (v,) in conn.execute("SELECT verdict FROM confirmations")]
        if meta.get("null_control"):
            rows.append(("null", meta["null_control"]))
    except sqlite3.Error:
        return
    finally:
        conn.close()
    for kind, text in rows:
        try:
            v = json.loads(text)
        except (TypeError, ValueError):
            continue
        if isinstance(v, dict) and not v.get("shared"):
            yield kind, sha, v


def records(verdicts: Iterable[dict], baselines: Iterable[dict], runs: Path):
    """(kind, task sha256 or None, level or None, verdict) for every evaluation: the bench's verdict records, its
    baseline records, and the optimize runs' databases under `runs`."""
    for rec in verdicts:
        if rec.get("status") in ("input_error", "no_candidate") or (rec.get("fallback") or {}).get("kind") == "reference":
            continue  # settled by the bench: no evaluation
        yield "candidate", rec.get("task_sha256"), rec.get("level"), rec
    for rec in baselines:
        if not rec.get("cached"):
            yield str(rec.get("baseline") or "baseline"), rec.get("task_sha256"), None, rec
    for db in sorted(Path(runs).glob("*/run.db")) if Path(runs).is_dir() else []:
        for kind, sha, v in _run_records(db):
            yield kind, sha, None, v


def _block() -> dict:
    return {"evaluations": 0, "tasks": set(), "off_device_s": 0.0, "wait_s": 0.0, "device_s": 0.0, "_device": [],
            "phases_s": {}}


def _add(b: dict, sha, phases: dict) -> None:
    off, wait, on = _clocks(phases)
    b["evaluations"] += 1
    if sha:
        b["tasks"].add(sha)
    b["off_device_s"] += off
    b["wait_s"] += wait
    b["device_s"] += on
    b["_device"].append(on)
    for name, s in (phases or {}).items():
        if isinstance(s, (int, float)):
            b["phases_s"][name] = b["phases_s"].get(name, 0.0) + s


def _done(b: dict) -> dict:
    dev = b.pop("_device")
    tasks = len(b.pop("tasks"))
    return {"evaluations": b["evaluations"], "tasks": tasks, "device_s": round(b["device_s"], 1),
            "device_s_per_task": round(b["device_s"] / tasks, 2) if tasks else None,
            "median_device_s": round(statistics.median(dev), 3) if dev else None,
            "off_device_s": round(b["off_device_s"], 1), "wait_s": round(b["wait_s"], 1),
            "phases_s": {k: round(v, 1) for k, v in sorted(b["phases_s"].items(), key=lambda kv: -kv[1])}}


def time_use(verdicts: Iterable[dict], baselines: Iterable[dict], runs: Path, levels: dict | None = None) -> dict:
    """The evaluations (`records`) summed: overall, `by_kind` and `by_level` (`levels`: task sha256 -> level, for the
    records that do not carry their level). Empty blocks are left out."""
    levels = levels or {}
    total, kinds, by_level = _block(), {}, {}
    for kind, sha, level, v in records(verdicts, baselines, runs):
        phases = v.get("phases_s") or {}
        level = level if level is not None else levels.get(sha)
        _add(total, sha, phases)
        _add(kinds.setdefault(kind, _block()), sha, phases)
        _add(by_level.setdefault(str(level) if level is not None else "other", _block()), sha, phases)
    return {**_done(total), "by_kind": {k: _done(b) for k, b in kinds.items()},
            "by_level": {k: _done(b) for k, b in sorted(by_level.items())}}


def one_line(t: dict) -> str:
    """The summary as a line for a person: evaluations, device seconds (per task) and where they went."""
    if not t.get("evaluations"):
        return "time: no evaluation measured in this directory yet"
    top = ", ".join(f"{k} {v:.0f} s" for k, v in list(t["phases_s"].items())[:4])
    per_task = f" ({t['device_s_per_task']:.1f} s per task)" if t.get("device_s_per_task") else ""
    return (f"time: {t['evaluations']} evaluations, {t['device_s']:.0f} s on the device{per_task}, "
            f"{t['off_device_s']:.0f} s off it, {t['wait_s']:.0f} s waiting for it · largest phases: {top}")
