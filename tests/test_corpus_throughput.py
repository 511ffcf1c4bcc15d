"""benchmarks/corpus_throughput.py: `pack` samples CUDA-L1 rows by its rule (stratified by level, every code field a
candidate, baselines per sampled task, reproducible by seed) and `run` judges a pack per lock scope on the CPU,
writing blocks that a re-run skips."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernelcraft.bench import baselines as bl
from kernelcraft.task import load_task

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "corpus_throughput.py"
spec = importlib.util.spec_from_file_location("corpus_throughput", SCRIPT)
corpus = importlib.util.module_from_spec(spec)
spec.loader.exec_module(corpus)

RELU_NEW = """import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return {body}
"""
CHAIN_NEW = RELU_NEW.format(body="torch.clamp(torch.tanh(x * 2.0 + 1.0) * 0.5, min=-0.45, max=0.45)")


@pytest.fixture
def datasets(tmp_path) -> Path:
    """Two tasks in KernelBench's layout (tiny sizes) and CUDA-L1 rows: level 1 with three candidates, level 2 with
    two (an empty cuda_graph_code), and a row whose task has no file."""
    relu, chain = load_task("tiny/level1/relu").source, load_task("tiny/level2/elementwise_chain").source
    root = tmp_path / "datasets"
    for rel, text in (("level1/1_TinyRelu.py", relu), ("level2/1_TinyChain.py", chain)):
        (root / "kernelbench" / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / "kernelbench" / rel).write_text(text)
    rows = [
        {"level_id": 1, "task_id": 1, "ref_code": relu, "custom_code": RELU_NEW.format(body="torch.clamp_min(x, 0.0)"),
         "cuda_graph_code": RELU_NEW.format(body="torch.nn.functional.relu(x)"),
         "cudnn_code": RELU_NEW.format(body="x.relu()")},
        {"level_id": 2, "task_id": 1, "ref_code": chain, "custom_code": CHAIN_NEW, "cuda_graph_code": "",
         "cudnn_code": CHAIN_NEW},
        {"level_id": 1, "task_id": 7, "ref_code": relu, "custom_code": RELU_NEW.format(body="x.relu()"),
         "cuda_graph_code": "None", "cudnn_code": ""},
    ]
    (root / "cuda_l1").mkdir()
    (root / "cuda_l1" / "h100.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def pack(datasets: Path, out: Path, *args: str) -> list[dict]:
    assert corpus.main(["pack", "--datasets", str(datasets), "--out", str(out), *args]) == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_quotas_follow_the_pool_with_one_per_level_at_least():
    assert corpus.level_quotas({1: 80, 2: 80, 3: 40}, 24) == {1: 10, 2: 9, 3: 5}
    assert corpus.level_quotas({1: 100, 2: 1}, 5) == {1: 4, 2: 1}
    assert corpus.level_quotas({1: 3, 2: 2}, 3) == {1: 2, 2: 1}
    assert corpus.level_quotas({1: 3, 2: 2}, 50) == {1: 3, 2: 2}
    with pytest.raises(ValueError, match="fewer than the 3 levels"):
        corpus.level_quotas({1: 5, 2: 5, 3: 5}, 2)


def test_pack_samples_by_level_with_baselines_and_repeats_by_seed(datasets, tmp_path):
    rows = pack(datasets, tmp_path / "a.jsonl", "--n", "3", "--seed", "0")
    candidates = [r for r in rows if r["kind"] != "inductor"]
    assert [r["level"] for r in candidates].count(1) == 2 and [r["level"] for r in candidates].count(2) == 1
    assert all(r["task_id"] == 1 for r in rows), "the row without a task file is no candidate"
    assert {r["kind"] for r in candidates} <= {"custom", "cuda_graph", "cudnn"}
    assert rows == sorted(rows, key=lambda r: (r["level"], r["task_id"], r["kind"]))
    assert all(r["item"] == f"{r['level']}_{r['task_id']}_{r['kind']}" for r in rows)
    baselines = [r for r in rows if r["kind"] == "inductor"]
    assert [(r["level"], r["task_id"]) for r in baselines] == [(1, 1), (2, 1)]
    assert all(r["code"] == bl.source(r["ref_code"], "inductor") for r in baselines)

    everything = pack(datasets, tmp_path / "all.jsonl", "--n", "50", "--baselines", "none")
    assert [r["item"] for r in everything] == ["1_1_cuda_graph", "1_1_cudnn", "1_1_custom", "2_1_cudnn", "2_1_custom"]
    again = pack(datasets, tmp_path / "b.jsonl", "--n", "3", "--seed", "0")
    assert again == rows
    draws = {tuple(r["item"] for r in pack(datasets, tmp_path / f"s{s}.jsonl", "--n", "2", "--seed", str(s),
                                           "--baselines", "none")) for s in range(8)}
    assert len(draws) > 1 and all(len(d) == 2 and d[0][0] == "1" and d[1][0] == "2" for d in draws)


def test_pack_refuses_what_it_cannot_use(datasets, tmp_path):
    for args, message in ((["--baselines", "eager"], "eager is the reference"),
                          (["--baselines", "nonsense"], "unknown baseline"),
                          (["--n", "1"], "fewer than the 2 levels"),
                          (["--gpu-file", "a100"], "need")):
        with pytest.raises(SystemExit, match=message):
            corpus.main(["pack", "--datasets", str(datasets), "--out", str(tmp_path / "x.jsonl"), *args])


def test_run_on_cpu_writes_a_block_per_scope_and_a_rerun_skips_them(datasets, tmp_path):
    pack_file = tmp_path / "pack.jsonl"
    items = [r["item"] for r in pack(datasets, pack_file, "--n", "2", "--baselines", "none")]
    out = tmp_path / "result.json"
    cmd = [sys.executable, str(SCRIPT), "run", "--pack", str(pack_file), "--device", "cpu", "--scopes",
           "timing:1,device", "--phases", "cold", "--time-budget", "0.1", "--out", str(out), "--markdown"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and result["cache_dirs"] == {}
    assert [(b["scope"], b["phase"], b["cache"], b["per_gpu"]) for b in result["blocks"]] == [
        ("timing:1", "cold", "cold", 1), ("device", "cold", "cold", None)]  # a scope may name its slots
    for block in result["blocks"]:
        assert block["n"] == 2 and block["wall_s"] > 0 and block["per_gpu_min"] > 0
        assert sum(block["statuses"].values()) == 2
        span = block["makespan"]  # the slowest verdict ran inside the block, and no schedule beats both bounds
        assert span["slots"] == block["per_gpu"] or (block["per_gpu"] is None and span["slots"] >= 1)
        assert 0 < span["longest_s"] <= block["wall_s"] and span["wall_over_bound"] > 0
        assert span["packed_s"] == round(sum(v["wall_s"] for v in block["verdicts"]) / span["slots"], 2)
        assert block["device_s"]["median"] <= block["device_s"]["p90"]
        assert block["alone_s"]["median"] <= block["alone_s"]["p90"] and 0 < block["alone_s"]["busy_share"] <= 1
        assert [v["item"] for v in block["verdicts"]] == items
        for v in block["verdicts"]:
            assert set(v) == {"item", "status", "reasons", "speedup", "ci95", "phases_s", "wall_s", "device", "timing"}
            assert v["status"] == "correct", v
            assert v["device"].startswith("cpu") and v["timing"]["ref_ms"] > 0 and len(v["timing"]["ref_spread_ms"]) == 2
            assert v["ci95"][0] <= v["ci95"][1] and v["phases_s"]
        assert set(block["phase_medians"]) == {p for v in block["verdicts"] for p in v["phases_s"]}
    assert "| timing:1 | cold | 2 |" in first.stdout and "same status 2/2" in first.stdout

    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("already in") == 2
    assert json.loads(out.read_text())["blocks"] == result["blocks"]


def test_run_refuses_a_pack_row_it_cannot_judge(datasets, tmp_path):
    row = pack(datasets, tmp_path / "pack.jsonl", "--n", "2", "--baselines", "none")[0]
    for name, broken, message in (("nocode.jsonl", {**row, "code": None}, "needs item, kind, code and level"),
                                  ("noref.jsonl", {**row, "ref_code": ""}, "no ref_code")):
        (tmp_path / name).write_text(json.dumps(broken) + "\n")
        with pytest.raises(SystemExit, match=message):
            corpus.main(["run", "--pack", str(tmp_path / name), "--device", "cpu", "--out", str(tmp_path / "r.json")])
    assert not (tmp_path / "r.json").exists()


def test_run_refuses_bad_scopes(datasets, tmp_path):
    pack_file = tmp_path / "pack.jsonl"
    pack(datasets, pack_file, "--n", "2", "--baselines", "none")
    for bad in ("gpu", "timing:0", "timing:x", ""):
        with pytest.raises(SystemExit, match="--scopes"):
            corpus.main(["run", "--pack", str(pack_file), "--device", "cpu", "--scopes", bad,
                         "--out", str(tmp_path / "r.json")])


def test_run_refuses_a_result_file_of_another_pack(datasets, tmp_path):
    out = tmp_path / "result.json"
    out.write_text(json.dumps({"pack_sha256": "0" * 64, "device": "cpu", "blocks": []}))
    pack_file = tmp_path / "pack.jsonl"
    pack(datasets, pack_file, "--n", "2", "--baselines", "none")
    with pytest.raises(SystemExit, match="another pack_sha256"):
        corpus.main(["run", "--pack", str(pack_file), "--device", "cpu", "--out", str(out)])
