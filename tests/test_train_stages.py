"""The pieces the stages stand on, without the reward service: the offline tiny model and its chat
template, SFT through TRL with LoRA merged on save, SFT resuming from the newest complete checkpoint,
contrastive prompts from the exemplar database, the CLI's usage errors, and that the package and the CLI
import without the training libraries.
"""
from __future__ import annotations

import json
import pickle
import random
import shutil
import subprocess
import sys

import pytest

from kernelcraft.task import load_task
from kernelcraft.train.checkpoints import complete_checkpoints, last_checkpoint
from kernelcraft.train.config import parse_config
from kernelcraft.train.metrics import MetricsLog, read_metrics
from kernelcraft.train.prompting import Described
from kernelcraft.train.variants import VariantStore

RELU = load_task("tiny/level1/relu")


def kc(*args, timeout=180):
    return subprocess.run([sys.executable, "-m", "kernelcraft.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_the_package_and_cli_import_without_training_libraries():
    code = ("import sys, kernelcraft.cli, kernelcraft.train.pipeline, kernelcraft.train.report\n"
            "print([m for m in ('trl', 'transformers', 'peft', 'datasets', 'torch') if m in sys.modules])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stderr


def test_cli_usage_errors(tmp_path):
    (tmp_path / "c.yaml").write_text("out: run\nmodel: {path: m}\ngrpo: {steps: 0}\n")
    r = kc("train", "grpo", str(tmp_path / "c.yaml"))
    assert r.returncode == 2 and "grpo.steps" in r.stderr
    r = kc("train", "data", str(tmp_path / "nope.yaml"))
    assert r.returncode == 2 and "config not found" in r.stderr
    (tmp_path / "ok.yaml").write_text("out: run\nmodel: {path: m}\n")
    r = kc("train", "data", str(tmp_path / "ok.yaml"))
    assert r.returncode == 2 and "no data sources" in r.stderr
    r = kc("train", "sft", str(tmp_path / "ok.yaml"))
    assert r.returncode == 2 and "train data CONFIG" in r.stderr  # no dataset yet: says which command makes it
    r = kc("train", "hack-cases", str(tmp_path))
    assert r.returncode == 2 and "hackcases.db" in r.stderr


def test_contrastive_prompts_from_the_exemplar_database(tmp_path):
    store = VariantStore(tmp_path / "ex", Described("a test GPU"), n=2, tau=0.5)
    msgs, shown = store.prompt(RELU, random.Random(0))
    assert shown == [] and "None yet" in msgs[1]["content"] and "a test GPU" in msgs[1]["content"]
    for i, s in enumerate([0.5, 1.0, 2.0, 4.0]):  # four score buckets
        store.add(RELU, f"import torch.nn as nn\nclass ModelNew(nn.Module):\n    def forward(self, x):\n"
                        f"        return x.clamp_min({i}.0 * 0)\n", {"status": "correct", "speedup": s},
                  policy="test", round=1)
    store.add(RELU, "class ModelNew: pass\n", {"status": "incorrect"}, policy="test", round=1)
    assert store.best(RELU) == 4.0 and len(store.exemplars(RELU)) == 4  # only correct ones are exemplars
    draws = [store.prompt(RELU, random.Random(seed)) for seed in range(40)]
    assert all(len(ids) == 2 and len(set(ids)) == 2 for _, ids in draws)  # two distinct buckets every time
    top = sum(1 for _, ids in draws if max(ids) == 4)
    assert top > 25  # tau = 0.5 favours the fast buckets
    msgs, ids = draws[0]
    assert "speedup 4.00x" in msgs[1]["content"] or "speedup 2.00x" in msgs[1]["content"]
    copy = pickle.loads(pickle.dumps(store))  # datasets pickles the prompt generator
    assert copy.best(RELU) == 4.0
    copy.close()
    store.close()


def test_checkpoints_count_only_when_complete(tmp_path):
    for step, files in ((1, ["trainer_state.json", "r.json"]), (2, ["trainer_state.json"]), (3, ["r.json"])):
        d = tmp_path / f"checkpoint-{step}"
        d.mkdir()
        for f in files:
            (d / f).write_text("{}")
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["checkpoint-1", "checkpoint-2"]
    assert last_checkpoint(tmp_path, ("trainer_state.json", "r.json")).name == "checkpoint-1"
    (tmp_path / "checkpoint-2" / "trainer_state.json").write_text("{torn")
    assert last_checkpoint(tmp_path).name == "checkpoint-1"


def test_metrics_merge_records_of_one_step(tmp_path):
    log = MetricsLog(tmp_path, tensorboard=False)
    log.write("sft", 2, {"loss": 1.0})
    log.write("sft", 2, {"train_loss": 0.5, "note": "not a number", "nan": float("nan")})
    log.write("grpo", 1, {"kl": 0.1})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"stage": "grpo", "st')  # torn by a kill
    recs = read_metrics(tmp_path)
    assert [(r["stage"], r["step"]) for r in recs] == [("sft", 2), ("grpo", 1)]
    assert recs[0]["loss"] == 1.0 and recs[0]["train_loss"] == 0.5 and "note" not in recs[0] and "nan" not in recs[0]


@pytest.mark.slow
def test_sft_with_lora_merges_and_resumes_from_its_checkpoint(tmp_path):
    pytest.importorskip("trl")
    pytest.importorskip("peft")
    from kernelcraft.train.models import build_random_model, load_model, load_tokenizer
    from kernelcraft.train.sft import fine_tune

    model = build_random_model(tmp_path / "m", "tiny")
    tok = load_tokenizer(model)
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    cfg = parse_config({"out": str(tmp_path / "run"), "device": "cpu",
                        "model": {"path": str(model), "lora": {"r": 4, "alpha": 8, "target_modules": "all-linear"}},
                        "sft": {"max_steps": 4, "save_steps": 2, "logging_steps": 1, "learning_rate": 1e-3}})
    ex = [{"prompt": [{"role": "user", "content": f"task {i}"}],
           "completion": [{"role": "assistant", "content": f"```python\nclass ModelNew: {i}\n```"}]} for i in range(4)]
    log = MetricsLog(cfg.out_dir, tensorboard=False)
    out = fine_tune(cfg, ex, init_model=model, stage_dir=cfg.out_dir / "sft", settings=cfg.sft, log=log)
    assert not (out / "adapter_config.json").exists()  # merged: a plain model directory
    assert load_model(out).config.hidden_size == 64
    # kill after step 2: drop what steps 3-4 wrote, and the final model; the rerun resumes at checkpoint-2
    shutil.rmtree(out)
    (cfg.out_dir / "sft" / "checkpoint-4" / "trainer_state.json").unlink()
    again = fine_tune(cfg, ex, init_model=model, stage_dir=cfg.out_dir / "sft", settings=cfg.sft, log=log)
    assert again == out and (out / "config.json").is_file()
    recs = [r for r in read_metrics(cfg.out_dir) if r["stage"] == "sft"]
    assert [r["resumed_from_step"] for r in recs if "resumed_from_step" in r] == [2]
    state = json.loads((cfg.out_dir / "sft" / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["global_step"] == 4


@pytest.fixture
def fake_openai():
    """A local OpenAI-compatible /v1/chat/completions that echoes which prompt it got."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(body)
            last = body["messages"][-1]["content"]
            text = ('{"hack": true, "reason": "precomputed"}' if "Similar stored cases" in last
                    else f"answer to {last}")
            data = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                               "choices": [{"index": 0, "finish_reason": "stop",
                                            "message": {"role": "assistant", "content": text}}],
                               "usage": {"prompt_tokens": 3, "completion_tokens": len(text.split()),
                                         "total_tokens": 3}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1", seen
    server.shutdown()


def test_self_training_samples_from_a_server_and_a_judge_model_over_http(fake_openai):
    pytest.importorskip("openai")
    from kernelcraft.train.config import GeneratorSettings, JudgeModelSettings
    from kernelcraft.train.generate import generate_server
    from kernelcraft.train.judgemodel import JudgeModel

    url, seen = fake_openai
    prompts = [[{"role": "user", "content": f"task {i}"}] for i in range(5)]
    out = generate_server(GeneratorSettings(base_url=url, model="policy", concurrency=2), prompts, temperature=0.5,
                          max_new_tokens=64)
    assert out == [(f"answer to task {i}", 4) for i in range(5)]  # in order, with the server's token counts
    assert {r["model"] for r in seen} == {"policy"} and all(r["temperature"] == 0.5 for r in seen)
    review = JudgeModel(JudgeModelSettings(model="reviewer", base_url=url)).review(
        reference="ref", candidate="class ModelNew: pass", speedup=5.0, flag="speedup 5.00x above 3x", similar=[])
    assert review["veto"] is True and review["reason"] == "precomputed"
