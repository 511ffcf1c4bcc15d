"""benchmarks/reward_load.py: batches of distinct candidates drawn from a pack go one after another through the
reward service it starts in-process, every candidate gets a verdict, and the JSON holds per-verdict, per-batch and
overall figures and the service's stats; bad input is a one-line error before anything starts."""
from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from test_corpus_throughput import datasets, pack  # noqa: F401  (a fixture and the pack helper)

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "reward_load.py"
spec = importlib.util.spec_from_file_location("reward_load", SCRIPT)
load = importlib.util.module_from_spec(spec)
spec.loader.exec_module(load)


def test_bad_input_is_a_one_line_error(tmp_path):
    for args, message in ((["--pack", str(tmp_path / "none.jsonl")], "no pack file"),
                          (["--pack", str(tmp_path / "none.jsonl"), "--batch", "0"], "--batch must be at least 1"),
                          (["--pack", "x", "--batches", "0"], "--batches must be at least 1"),
                          (["--pack", "x", "--time-budget", "0"], "--time-budget takes seconds")):
        with pytest.raises(SystemExit, match=message) as e:
            load.main(args)
        assert "\n" not in str(e.value.code)


def test_draws_are_seeded_with_replacement_and_every_text_distinct():
    pairs = [({"item": f"i{k}", "code": f"code {k}\n"}, None) for k in range(3)]
    first = load.draw(pairs, 8, 0, random.Random(5))
    assert load.draw(pairs, 8, 0, random.Random(5)) == first
    assert len({row["item"] for row, _, _ in first}) < 8  # with replacement
    texts = [code for b in range(2) for _, _, code in load.draw(pairs, 8, b, random.Random(5))]
    assert len(set(texts)) == 16 and all(c.startswith("code ") and "# policy sample" in c for c in texts)


def test_two_batches_on_cpu_give_every_candidate_a_verdict(datasets, tmp_path):  # noqa: F811
    pack_file = tmp_path / "pack.jsonl"
    items = {r["item"] for r in pack(datasets, pack_file, "--n", "50", "--baselines", "none")}
    out = tmp_path / "load.json"
    cmd = [sys.executable, str(SCRIPT), "--pack", str(pack_file), "--device", "cpu", "--batch", "4", "--batches", "2",
           "--time-budget", "0.1", "--out", str(out), "--markdown"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and result["gpus"] == 1 and result["batch"] == 4
    batches = result["batch_results"]
    assert [b["index"] for b in batches] == [0, 1]
    for b in batches:
        assert b["n"] == 4 and len(b["verdicts"]) == 4 and sum(b["statuses"].values()) == 4 and b["wall_s"] > 0
        assert 0 <= b["busy_share"] <= 1
        for v in b["verdicts"]:
            assert v["item"] in items and v["status"] == "correct", v
            assert v["latency_s"] == b["wall_s"] and v["phases_s"].get("time", 0) > 0
    s = result["summary"]
    assert s["batches"] == 2 and s["candidates"] == 8 and s["statuses"] == {"correct": 8}
    assert s["per_min"] > 0 and s["per_gpu_min"] == s["per_min"] and 0 < s["busy_share"] <= 1
    assert s["batch_latency_s"]["p50"] <= s["batch_latency_s"]["p95"]
    assert result["stats"]["service"]["evaluations"] == 8 and result["stats"]["service"]["batches"] == 2
    assert result["stats"]["completed"] == 8
    table = [line for line in r.stdout.splitlines() if line.startswith("|")]
    assert len(table) == 3 and "correct 8" in table[2] and table[2].startswith("| 2 | 4 |")


def test_a_local_ray_cluster_on_a_small_cpu_host_answers(datasets, tmp_path):  # noqa: F811
    """`--cluster ray` on the CPU: two CPU timing actors and a build actor on a host of any size (on 2 CPUs the
    timing actors hold both, and the build actor must still start)."""
    pack_file = tmp_path / "pack.jsonl"
    pack(datasets, pack_file, "--n", "2", "--baselines", "none")
    out = tmp_path / "load.json"
    cmd = [sys.executable, str(SCRIPT), "--pack", str(pack_file), "--device", "cpu", "--cluster", "ray", "--batch", "2",
           "--batches", "1", "--time-budget", "0.1", "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads(out.read_text())["summary"]
    assert s["candidates"] == 2 and s["statuses"] == {"correct": 2}, s
