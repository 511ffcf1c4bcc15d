"""The run database: dedup by normalised source, parse errors kept, in-flight rows re-queued, WAL."""
from __future__ import annotations

import sqlite3
import threading

from kernelcraft.search.rundb import DB_NAME, RunDB

SRC = "import torch\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x * 2\n"
SAME = "import torch\nclass ModelNew(torch.nn.Module):   # reformatted, commented\n    def forward(self, x):\n\n        return x*2\n"
OTHER = SRC.replace("x * 2", "x + x")


def verdict(status="correct", speedup=2.0, ci=(1.8, 2.2)):
    return {"status": status, "reasons": [] if status == "correct" else ["value_mismatch"],
            "message": "" if status == "correct" else "mismatch", "speedup": speedup if status == "correct" else None,
            "timing": {"speedup": speedup, "ci95": list(ci)} if status == "correct" else None}


def test_add_dedup_and_lifecycle(tmp_path):
    db = RunDB(tmp_path)
    assert (tmp_path / DB_NAME).is_file()
    cid, new = db.add_candidate(SRC, policy="recipes", round=1, parents=[], meta={"recipe": ["a"]})
    assert new and cid == 1
    dup, new2 = db.add_candidate(SAME, policy="openai:m", round=2)
    assert (dup, new2) == (cid, False)  # comments/whitespace do not make a new candidate
    assert db.get(cid).duplicates == 1 and db.count() == 1
    other, new3 = db.add_candidate(OTHER, policy="recipes", round=2, parents=[cid], prompt="p", reply="r",
                                   usage={"prompt_tokens": 10})
    assert new3 and db.get(other).parents == [cid] and db.get(other).usage == {"prompt_tokens": 10}
    assert [r.id for r in db.queued()] == [cid, other]
    db.claim(cid)
    assert db.get(cid).state == "in_flight" and db.get(cid).attempts == 1
    db.finish(cid, verdict())
    row = db.get(cid)
    assert (row.state, row.status, row.speedup, row.ci_low, row.evals_done) == ("done", "correct", 2.0, 1.8, 1)
    assert row.correct and row.faster_than(1.0) and not row.faster_than(1.8) and row.meta == {"recipe": ["a"]}
    db.claim(other)
    db.finish(other, verdict("incorrect"))
    bad = db.get(other)
    assert bad.status == "incorrect" and bad.speedup is None and bad.reasons == ["value_mismatch"]
    assert not bad.correct


def test_parse_errors_are_rows_with_the_reply(tmp_path):
    db = RunDB(tmp_path)
    pid = db.add_parse_error(policy="openai:m", round=1, reply="no code here", message="no block",
                             reason="no_code_block", prompt="the prompt", usage={"completion_tokens": 3})
    r = db.get(pid)
    assert (r.state, r.status, r.reasons, r.reply, r.source) == ("done", "parse_error", ["no_code_block"],
                                                                 "no code here", None)
    assert db.queued() == [] and db.count() == 1
    # parse errors never collide with each other (no source, no hash)
    db.add_parse_error(policy="openai:m", round=1, reply="again", message="no block")
    assert db.count() == 2


def test_in_flight_rows_survive_reopen_and_are_requeued(tmp_path):
    db = RunDB(tmp_path)
    a, _ = db.add_candidate(SRC, policy="recipes", round=1)
    b, _ = db.add_candidate(OTHER, policy="recipes", round=1)
    db.claim(a)
    db.finish(a, verdict())
    db.claim(b)
    del db  # no close: as if killed
    db2 = RunDB(tmp_path)
    assert db2.get(b).state == "in_flight"
    assert db2.requeue_in_flight() == [b]
    assert [r.id for r in db2.queued()] == [b]
    assert db2.get(a).state == "done" and db2.get(a).evals_done == 1
    db2.claim(b)
    db2.finish(b, verdict())
    assert db2.get(b).attempts == 2 and db2.get(b).evals_done == 1


def test_wal_meta_events_confirmations(tmp_path):
    db = RunDB(tmp_path)
    mode = sqlite3.connect(str(tmp_path / DB_NAME)).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"
    db.set_meta("task", "tiny/level1/x")
    db.set_meta("task", "tiny/level1/y")
    db.set_meta("options", {"budget": 3})
    assert db.get_meta("task") == "tiny/level1/y" and db.get_meta("options") == {"budget": 3}
    assert db.get_meta("missing", 7) == 7
    db.log("start", requeued=[1])
    assert db.events("start")[0]["requeued"] == [1]
    cid, _ = db.add_candidate(SRC, policy="recipes", round=1)
    db.add_confirmation(cid, verdict(speedup=1.9, ci=(1.7, 2.0)))
    db.add_confirmation(cid, verdict(speedup=2.1, ci=(2.0, 2.2)))
    assert db.confirmations()[cid]["speedup"] == 2.1  # the latest one
    assert db.last_round() == 1


def test_concurrent_writers_from_threads(tmp_path):
    db = RunDB(tmp_path)
    ids = [db.add_candidate(SRC.replace("2", str(i + 3)), policy="recipes", round=1)[0] for i in range(16)]

    def work(cid):
        db.claim(cid)
        db.finish(cid, verdict(speedup=1.0 + cid / 10))

    threads = [threading.Thread(target=work, args=(i,)) for i in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rows = db.rows()
    assert len(rows) == 16 and all(r.state == "done" and r.evals_done == 1 for r in rows)
