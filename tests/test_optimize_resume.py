"""Resumability: kill -9 the optimize process mid-run, run the same command again, and nothing is lost or
evaluated twice (only the evaluation that was in flight is redone)."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

from conftest import FIXTURES

TASK = FIXTURES / "tasks" / "algebra_mix.py"


def _cmd(out):
    return [sys.executable, "-m", "kernelcraft.cli", "optimize", str(TASK), "--device", "cpu", "--budget", "5",
            "--skip", "compile", "--confirm", "0", "--patience", "0", "--jobs", "1", "--eval-time", "0.5",
            "--out", str(out), "--json"]


def _states(db_path):
    if not db_path.exists():
        return []
    con = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=5)
    try:
        return con.execute("SELECT id, sha256, state FROM candidates ORDER BY id").fetchall()
    except sqlite3.OperationalError:
        return []
    finally:
        con.close()


def test_kill_mid_run_then_resume(tmp_path, cache_dir):
    out = tmp_path / "run"
    env = dict(os.environ, KERNELCRAFT_CACHE=str(cache_dir))
    proc = subprocess.Popen(_cmd(out), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    deadline = time.monotonic() + 240
    before = []
    while time.monotonic() < deadline:
        before = _states(out / "run.db")
        if any(s == "done" for _, _, s in before) and any(s == "in_flight" for _, _, s in before):
            break
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        time.sleep(0.1)
    else:
        proc.kill()
        raise AssertionError(f"the run never had a finished and an in-flight candidate: {before}")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    before = _states(out / "run.db")  # what the database says after the kill
    in_flight = [i for i, _, s in before if s == "in_flight"]
    assert len(in_flight) == 1

    again = subprocess.run(_cmd(out), capture_output=True, text=True, env=env, timeout=400)
    assert again.returncode == 0, again.stderr[-3000:]
    summary = json.loads(again.stdout.strip().splitlines()[-1])
    assert summary["candidates"] == 5

    con = sqlite3.connect(str(out / "run.db"))
    rows = {r[0]: r[1:] for r in con.execute("SELECT id, sha256, state, attempts, evals_done, norm_hash FROM candidates")}
    events = [json.loads(d) for k, d in con.execute("SELECT kind, data FROM events WHERE kind = 'start' ORDER BY id")]
    con.close()
    assert len(rows) == 5
    for cid, sha, _ in before:  # nothing proposed before the kill was lost or changed
        assert rows[cid][0] == sha
    assert all(state == "done" and done == 1 for _, state, _, done, _ in rows.values())  # evaluated once each
    assert rows[in_flight[0]][2] == 2  # the in-flight one was started twice, finished once
    assert all(attempts == 1 for cid, (_, _, attempts, _, _) in rows.items() if cid != in_flight[0])
    assert len({r[4] for r in rows.values()}) == 5  # no duplicates
    assert events[-1]["requeued"] == in_flight and events[-1]["resumed"] is True
