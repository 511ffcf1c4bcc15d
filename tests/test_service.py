"""The reward service over real HTTP: `kernelcraft serve` in a subprocess, called with httpx and with
kernelcraft.client. Auth (401), malformed input (422/400 with a message), oversized bodies (413), one
evaluation, a batch in order with a candidate that kills its worker in the middle, and /v1/stats.

One server for the module (cpu, 2 timing slots, 1 build slot); candidates are tiny and untimed.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from kernelcraft.client import Client, ServiceError  # noqa: E402

KEY = "kc-test-key-0123456789abcdef"
TASK = "tiny/level1/relu"
QUICK = {"timing": False, "trials": 2, "timeout_s": 30}

RELU_OK = """
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, x):
        return x.clamp_min(0.0)
"""
RELU_WRONG = RELU_OK.replace("x.clamp_min(0.0)", "x.clamp_min(0.0) + 1.0")
RELU_SEGFAULT = """
import ctypes
import torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, x):
        ctypes.string_at(0)
        return x
"""
RELU_EXIT = """
import os
import torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, x):
        os._exit(3)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(cache_dir, tmp_path_factory):
    port = _free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    env = dict(os.environ, KERNELCRAFT_API_KEY=KEY)
    with open(log, "wb") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kernelcraft.cli", "serve", "--port", str(port), "--device", "cpu",
             "--workers", "2", "--build-workers", "1", "--cache-dir", str(cache_dir), "--max-body-mb", "0.25",
             "--max-batch", "8", "--log-level", "warning"], stdout=f, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            if httpx.get(url + "/v1/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"kernelcraft serve did not come up:\n{log.read_text()[-3000:]}")
        time.sleep(0.3)
    yield url
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


def auth(key=KEY):
    return {"Authorization": f"Bearer {key}"}


def test_refuses_to_start_without_a_key():
    env = {k: v for k, v in os.environ.items() if k != "KERNELCRAFT_API_KEY"}
    r = subprocess.run([sys.executable, "-m", "kernelcraft.cli", "serve"], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "KERNELCRAFT_API_KEY" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "kernelcraft.cli", "serve", "--insecure-no-auth", "--host", "0.0.0.0"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "loopback" in r.stderr, r.stderr


def test_health_is_public_and_everything_else_needs_the_key(server):
    r = httpx.get(server + "/v1/health")
    assert r.status_code == 200 and r.json()["ok"] is True
    body = {"task": TASK, "candidate": RELU_OK}
    for headers in ({}, auth("wrong-key"), {"Authorization": KEY}, {"Authorization": "Basic " + KEY}):
        assert httpx.get(server + "/v1/stats", headers=headers).status_code == 401
        r = httpx.post(server + "/v1/evaluate", json=body, headers=headers)
        assert r.status_code == 401 and "API key" in r.json()["message"]
    # auth is checked before the body is read: garbage without a key is 401, not 422
    r = httpx.post(server + "/v1/evaluate", content=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 401
    assert httpx.get(server + "/v1/stats", headers=auth()).status_code == 200
    with pytest.raises(ServiceError) as e:
        Client(server, api_key="wrong").stats()
    assert e.value.status == 401


@pytest.mark.parametrize("body, status, needle", [
    (b"{not json", 422, "malformed JSON"),
    (b'{"task": "tiny/level1/relu"}', 422, "candidate"),
    (b'{"task": "tiny/level1/relu", "candidate": ""}', 422, "candidate"),
    (b'{"task": "tiny/level1/relu", "candidate": "x", "options": {"trails": 3}}', 422, "trails"),
    (b'{"task": "tiny/level1/relu", "candidate": "x", "options": {"mode": "lenient"}}', 422, "mode"),
    (b'{"task": "tiny/level1/relu", "candidate": "x", "options": {"screen": false}}', 422, "screen"),
    (b'{"task": "tiny/level1/relu", "candidate": "x", "options": {"device": "tpu"}}', 422, "device"),
    (b'{"task": "tiny/level1/relu", "candidate": "x", "extra": 1}', 422, "extra"),
    (b'{"task": "tiny/level9/nope", "candidate": "x"}', 400, "tiny/level9/nope"),
    (b'{"task": "/etc/passwd.py", "candidate": "x"}', 400, "not a path"),
    (b'{"task": "tiny/level1/relu", "candidate": "x", "options": {"device": "cuda"}}', 400, "cuda"),
    (b'[1, 2]', 422, "invalid request"),
])
def test_malformed_requests_get_4xx_with_a_message(server, body, status, needle):
    r = httpx.post(server + "/v1/evaluate", content=body,
                   headers={**auth(), "Content-Type": "application/json"})
    assert r.status_code == status, r.text
    assert needle in r.json()["message"], r.json()


def test_oversized_requests_get_413(server):
    big = {"task": TASK, "candidate": RELU_OK + "#" * 300_000}
    r = httpx.post(server + "/v1/evaluate", json=big, headers=auth())
    assert r.status_code == 413 and "limit" in r.json()["message"]

    def chunks():  # no Content-Length: the limit is enforced while reading
        yield b'{"task": "tiny/level1/relu", "candidate": "'
        for _ in range(40):
            yield b"#" * 10_000
        yield b'"}'

    r = httpx.post(server + "/v1/evaluate", content=chunks(), headers={**auth(), "Content-Type": "application/json"})
    assert r.status_code == 413
    r = httpx.post(server + "/v1/evaluate/batch", headers=auth(),
                   json={"items": [{"task": TASK, "candidate": RELU_OK}] * 9})
    assert r.status_code == 413 and "at most 8" in r.json()["message"]
    r = httpx.post(server + "/v1/evaluate/batch", headers=auth(), json={"items": []})
    assert r.status_code == 422


def test_evaluate_one_with_the_client(server):
    v = Client(server, api_key=KEY).evaluate(TASK, RELU_OK, **QUICK)
    assert v["status"] == "correct", v["message"]
    assert v["task"] == TASK and v["device"] == "cpu" and v["correctness"]["passed"] == 2
    assert len(v["candidate_sha256"]) == 64 and v["env"]["kernelcraft"]


def test_batch_in_order_with_a_candidate_that_kills_its_worker(server):
    client = Client(server, api_key=KEY)
    items = [(TASK, RELU_OK), (TASK, RELU_SEGFAULT), (TASK, RELU_WRONG), (TASK, RELU_EXIT),
             (TASK, "import torch\n"), (TASK, RELU_OK, {"trials": 1})]
    results = client.evaluate_batch(items, **QUICK)
    got = [(r["status"], r["reasons"]) for r in results]
    assert got == [("correct", []), ("runtime_error", ["crashed"]), ("incorrect", ["value_mismatch"]),
                   ("runtime_error", ["crashed"]), ("compile_error", ["no_modelnew"]), ("correct", [])], got
    assert results[-1]["correctness"]["trials"] == 1
    assert all(r["task"] == TASK for r in results)

    s = client.stats()
    for key in ("queue_depth", "throughput_per_min", "build_cache", "completed", "by_status", "timing_slots"):
        assert key in s, s
    assert s["queue_depth"] == 0 and s["completed"] >= len(items)
    assert s["by_status"]["runtime_error"] >= 2 and s["throughput_per_min"] > 0
    assert "hit_rate" in s["build_cache"] and s["sandbox"]["rlimits"]["RLIMIT_CORE"] == 0
    assert s["sandbox"]["worker_start"] == ("spawn" if s["sandbox"]["effective"] == "bwrap" else "fork")
    assert s["service"]["batches"] >= 1


def test_async_client(server):
    import asyncio

    client = Client(server, api_key=KEY)

    async def both():
        return await asyncio.wait_for(asyncio.gather(
            client.aevaluate(TASK, RELU_WRONG, **QUICK), client.aevaluate_batch([(TASK, RELU_OK)], **QUICK)), 120)

    a, b = asyncio.run(both())
    assert a["status"] == "incorrect" and b[0]["status"] == "correct"


def test_trl_reward_example_scores_completions(server):
    import asyncio
    import importlib.util
    import math
    from pathlib import Path

    path = Path(__file__).parent.parent / "examples" / "trl_reward.py"
    spec = importlib.util.spec_from_file_location("kc_trl_reward_example", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # imports without trl
    assert mod.shape({"status": "correct", "speedup": 1.0}) == mod.shape({"status": "correct", "speedup": 1.0,
                                                                           "timing": {"ci95": [1.0, 1.2]}})
    assert math.isclose(mod.shape({"status": "correct", "speedup": 1.0}, conservative=False), 0.65)
    assert mod.shape({"status": "correct", "speedup": 100.0}) <= 1.0
    assert mod.shape({"status": "correct", "speedup": 0.5}) > mod.shape({"status": "incorrect"}) > 0
    assert mod.shape({"status": "rejected"}) == 0.0
    fn = mod.make_reward(server, KEY, options={**QUICK, "mode": "open"})
    good = f"Sure:\n```python\n{RELU_OK}\n```\n"
    chat = [{"role": "assistant", "content": f"```python\n{RELU_WRONG}```"}]
    rewards = asyncio.run(fn(["p"] * 4, [good, chat, "no code here", good], task=[TASK] * 4))
    assert rewards[0] == rewards[3] == 0.3  # correct, untimed; the repeat is served from the cache
    assert rewards[1] == 0.1 and rewards[2] == 0.0
