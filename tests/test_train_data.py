"""Training data and config: run databases and judged pairs files -> deduplicated examples split by task,
with a dataset card; a pairs row enters only with a `correct` verdict of our judge; the YAML config is
validated with errors that name the key. Nothing is evaluated here (verdict records are written by hand in
the bench's format), so these run in about a second.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from kernelcraft.search.rundb import RunDB
from kernelcraft.task import load_task
from kernelcraft.train.config import ConfigError, load_config, parse_config
from kernelcraft.train.data import build_dataset, is_heldout, load_examples, task_key
from kernelcraft.train.models import TrainError

RELU, GELU, SOFTMAX = (load_task(f"tiny/level1/{n}") for n in ("relu", "gelu", "softmax"))
SHARED = Path(os.environ.get("KERNELCRAFT_DATASETS", "/nonexistent")) / "cuda_l1"


def cand(expr: str, comment: str = "") -> str:
    return f"import torch\nimport torch.nn as nn\n{comment}\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return {expr}\n"


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def verdict(task, candidate, status="correct", speedup=1.5):
    return {"task": task.name, "task_sha256": task.sha256, "candidate_sha256": sha(candidate), "status": status,
            "speedup": speedup if status == "correct" else None, "device": "cuda:0 NVIDIA H100 80GB HBM3",
            "env": {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130", "cuda": "13.0"}}


def config(tmp_path, **data):
    return parse_config({"out": str(tmp_path / "run"), "model": {"path": str(tmp_path / "model")}, "data": data},
                        base_dir=tmp_path)


def write_pairs(tmp_path):
    rows = [
        {"level_id": 1, "task_id": 1, "ref_code": RELU.source, "custom_code": cand("x.clamp_min(0.0)"),
         "score_default": 9.9},                                                   # correct: enters
        {"level_id": 1, "task_id": 2, "ref_code": GELU.source, "custom_code": cand("x")},  # incorrect
        {"level_id": 1, "task_id": 3, "ref_code": SOFTMAX.source, "custom_code": cand("x.softmax(-1)")},  # no verdict
        {"level_id": 1, "task_id": 4, "ref_code": GELU.source, "custom_code": cand("torch.nn.functional.gelu(x)")},
        {"level_id": 1, "task_id": 5, "ref_code": RELU.source, "custom_code": "None"},   # no kernel released
    ]
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "LICENSE").write_text("MIT License\n\nCopyright ...\n")
    vs = [verdict(RELU, rows[0]["custom_code"], speedup=1.25), verdict(GELU, rows[1]["custom_code"], "incorrect"),
          verdict(GELU, rows[3]["custom_code"], speedup=1.1), verdict(GELU, rows[3]["custom_code"], "rejected")]
    (tmp_path / "verdicts.jsonl").write_text("".join(json.dumps(v) + "\n" for v in vs))
    return pairs


def write_run(tmp_path, task, rows):
    run = tmp_path / "runs" / task.stem
    db = RunDB(run)
    db.set_meta("task", task.name)
    db.set_meta("task_source", task.source)
    db.set_meta("device", "CPU: test, 2 cores; PyTorch 2.13.")
    for source, status, speedup, prompt, reply in rows:
        cid, _ = db.add_candidate(source, policy="openai:m" if reply else "recipes", round=1, prompt=prompt, reply=reply)
        db.claim(cid)
        db.finish(cid, {"status": status, "speedup": speedup, "reasons": [], "timing": {"ci95": [speedup, speedup]}})
    db.close()
    return run


def test_pairs_enter_only_with_a_correct_verdict_and_the_card_counts_each_step(tmp_path):
    pairs = write_pairs(tmp_path)
    cfg = config(tmp_path, pairs=[{"path": str(pairs), "verdicts": [str(tmp_path / "verdicts.jsonl")]}],
                 heldout_fraction=0.0)
    card = build_dataset(cfg)
    src = card["sources"][0]
    assert (src["rows"], src["no_verdict"], src["with_verdict"], src["correct"], src["examples"]) == (5, 1, 3, 1, 1)
    assert src["not_correct"] == 1 and src["conflicting_verdicts"] == 1 and src["unusable_or_no_candidate"] == 1
    assert src["licence"].startswith("MIT License")
    train = load_examples(cfg.out_dir / "data" / "train.jsonl")
    assert len(train) == 1
    e = train[0]
    assert e["speedup"] == 1.25  # our judge's number, not the file's score_default
    assert e["prompt"][0]["role"] == "system" and "NVIDIA H100" in e["prompt"][1]["content"]
    assert "x.clamp_min(0.0)" in e["completion"][0]["content"] and "1.25x" in e["completion"][0]["content"]
    assert (cfg.out_dir / "data" / "card.md").read_text().count("pairs") >= 1


def test_verdicts_may_be_gzip_compressed_and_a_broken_file_is_one_error(tmp_path):
    import gzip

    pairs = write_pairs(tmp_path)
    gz = tmp_path / "verdicts.jsonl.gz"
    gz.write_bytes(gzip.compress((tmp_path / "verdicts.jsonl").read_bytes()))
    cfg = config(tmp_path, pairs=[{"path": str(pairs), "verdicts": [str(gz)]}], heldout_fraction=0.0)
    assert build_dataset(cfg)["sources"][0]["examples"] == 1  # as from the plain file (the test above)
    gz.write_bytes(b"not gzip")
    with pytest.raises(TrainError, match="cannot read verdicts"):
        build_dataset(cfg)


def test_run_databases_keep_the_replies_and_prompts_of_correct_candidates(tmp_path):
    prompt = "[system]\nYou write kernels.\n[user]\nMake it fast."
    llm_reply = "## Performance Analysis\nfewer ops\n\n## Code Implementation\n```python\n" + cand("x.clamp(min=0)") + "```"
    run = write_run(tmp_path, RELU, [(cand("x.clamp(min=0)"), "correct", 1.4, prompt, llm_reply),
                                     (cand("torch.relu(x)"), "correct", 1.1, None, None),
                                     (cand("x"), "incorrect", None, None, None)])
    cfg = config(tmp_path, run_dbs=[str(run.parent)], heldout_fraction=0.0)
    card = build_dataset(cfg)
    assert card["sources"][0]["candidates"] == 3 and card["sources"][0]["correct"] == 2
    train = {e["speedup"]: e for e in load_examples(cfg.out_dir / "data" / "train.jsonl")}
    assert train[1.4]["completion"][0]["content"] == llm_reply  # the model's own answer
    assert train[1.4]["prompt"] == [{"role": "system", "content": "You write kernels."},
                                    {"role": "user", "content": "Make it fast."}]
    assert "torch.relu(x)" in train[1.1]["completion"][0]["content"]  # a template answer for a recipe
    assert "Performance Analysis" in train[1.1]["completion"][0]["content"]


def test_duplicates_across_sources_keep_the_fastest(tmp_path):
    pairs = write_pairs(tmp_path)
    run = write_run(tmp_path, RELU, [(cand("x.clamp_min(0.0)", "# same code, another comment"), "correct", 1.6,
                                      None, None)])
    cfg = config(tmp_path, run_dbs=[str(run)], heldout_fraction=0.0,
                 pairs=[{"path": str(pairs), "verdicts": [str(tmp_path / "verdicts.jsonl")]}])
    card = build_dataset(cfg)
    assert card["examples_read"] == 2 and card["duplicates_dropped"] == 1
    assert [e["speedup"] for e in load_examples(cfg.out_dir / "data" / "train.jsonl")] == [1.6]


def test_the_split_is_by_task_stable_as_tasks_are_added_and_sizes_do_not_count():
    keys = [f"source:{i:04d}" for i in range(400)]
    held = [k for k in keys if is_heldout(k, 0.25, seed=3)]
    assert 60 < len(held) < 140  # ~25%
    assert [k for k in keys[:100] if is_heldout(k, 0.25, seed=3)] == [k for k in held if k in keys[:100]]
    # the tiers of a task (other sizes), comments and formatting: one task; another operator: another task
    assert task_key(RELU.source) == task_key(load_task("gpu/level1/relu").source) == task_key(RELU.source + "# c\n")
    assert task_key(RELU.source) != task_key(GELU.source)


def test_held_out_tasks_never_leak_into_train(tmp_path):
    run_dirs = [write_run(tmp_path, load_task(f"tiny/level1/{n}"), [(cand(f"x * {i}"), "correct", 1.0 + i / 10, None, None)
                                                                   for i in range(3)])
                for n in ("relu", "gelu", "softmax", "layernorm", "cumsum", "sum_reduction")]
    cfg = config(tmp_path, run_dbs=[str(r) for r in run_dirs], heldout_fraction=0.5, seed=1)
    card = build_dataset(cfg)
    train = {e["task_key"] for e in load_examples(cfg.out_dir / "data" / "train.jsonl")}
    held = {e["task_key"] for e in load_examples(cfg.out_dir / "data" / "heldout.jsonl")}
    assert train and held and not (train & held) and card["leak_check"]
    assert card["splits"]["train"]["examples"] + card["splits"]["heldout"]["examples"] == 18


@pytest.mark.skipif(not (SHARED / "h100.jsonl").is_file(), reason="CUDA-L1's kernels: set KERNELCRAFT_DATASETS")
def test_cuda_l1_rows_without_our_verdicts_do_not_enter(tmp_path):
    cfg = config(tmp_path, pairs=[{"path": str(SHARED / "h100.jsonl")}])
    card = build_dataset(cfg)
    src = card["sources"][0]
    assert src["rows"] == 200 and src["examples"] == 0 and src["no_verdict"] >= 150
    assert src["licence"].startswith("MIT License")


def test_config_errors_name_the_key(tmp_path):
    base = {"out": "run", "model": {"path": "m"}}
    with pytest.raises(ConfigError, match="grpo.gruop_size"):
        parse_config({**base, "grpo": {"gruop_size": 4}})
    with pytest.raises(ConfigError, match="service.options.*trials"):
        parse_config({**base, "service": {"options": {"trials": 0}}})
    with pytest.raises(ConfigError, match="screen"):
        parse_config({**base, "service": {"options": {"screen": False}}})
    with pytest.raises(ConfigError, match="device"):
        parse_config({**base, "service": {"options": {"device": "tpu"}}})
    with pytest.raises(ConfigError, match="group_size"):
        parse_config({**base, "grpo": {"group_size": 1}})
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("- a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(tmp_path / "bad.yaml")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "ok.yaml").write_text("out: run\nmodel: {path: m}\nservice: {options: {device: cpu, "
                                               "time_budget_s: 0.2}}\n")
    cfg = load_config(tmp_path / "sub" / "ok.yaml")
    assert cfg.out_dir == tmp_path / "sub" / "run"  # relative to the config file
    assert cfg.service.options == {"time_budget_s": 0.2, "device": "cpu"}


def test_config_paths_expand_environment_variables_and_name_an_unset_one(tmp_path, monkeypatch):
    cfg = parse_config({"out": "$KC_TEST_RUNS/run", "model": {"path": "m"}, "base_dir": str(tmp_path)})
    monkeypatch.setenv("KC_TEST_RUNS", str(tmp_path / "runs"))
    assert cfg.out_dir == tmp_path / "runs" / "run"
    monkeypatch.delenv("KC_TEST_RUNS")
    with pytest.raises(ConfigError, match="KC_TEST_RUNS is not set"):
        cfg.out_dir
