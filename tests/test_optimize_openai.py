"""The `openai:MODEL` policy against a local OpenAI-compatible server started by the test, replying with
recorded completions: good code, prose only, truncated code, code without ModelNew, wrong code, a
duplicate, and a 500 error that the policy retries."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("openai")

from kernelcraft.protocol import Protocol  # noqa: E402
from kernelcraft.search.optimize import Options, optimize  # noqa: E402
from kernelcraft.search.policies import PolicyError  # noqa: E402
from kernelcraft.search.rundb import RunDB  # noqa: E402

from conftest import FIXTURES, run_story  # noqa: E402

REPLIES = FIXTURES / "replies"


class FakeEndpoint:
    """/v1/chat/completions answering from a script: ("reply", file, finish_reason) or ("status", code)."""

    def __init__(self, script):
        self.script, self.requests, self.lock = list(script), [], threading.Lock()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with endpoint.lock:
                    endpoint.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), **body})
                    step = endpoint.script.pop(0) if endpoint.script else ("reply", "no_code.md", "stop")
                if step[0] == "status":
                    self._send(step[1], {"error": {"message": "scripted failure", "type": "server_error"}})
                    return
                text = (REPLIES / step[1]).read_text()
                self._send(200, {
                    "id": "chatcmpl-test", "object": "chat.completion", "created": 0, "model": body["model"],
                    "choices": [{"index": 0, "finish_reason": step[2],
                                 "message": {"role": "assistant", "content": text}}],
                    "usage": {"prompt_tokens": len(json.dumps(body["messages"])) // 4,
                              "completion_tokens": len(text) // 4,
                              "total_tokens": len(json.dumps(body["messages"])) // 4 + len(text) // 4}})

            def _send(self, code, obj):
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


SCRIPT = [  # round 1 (3 requests in flight; the one that gets the 500 retries and gets the 4th entry)
    ("status", 500), ("reply", "good.md", "stop"), ("reply", "no_code.md", "stop"), ("reply", "truncated.md", "length"),
    # round 2: the prompt now shows the good candidate and its speedup
    ("reply", "no_modelnew.md", "stop"), ("reply", "wrong.md", "stop"), ("reply", "good_duplicate.md", "stop"),
    # round 3 (the duplicate did not count)
    ("reply", "good_second.md", "stop"),
]


@pytest.fixture
def endpoint():
    ep = FakeEndpoint(SCRIPT)
    yield ep
    ep.close()


def test_openai_policy_end_to_end(endpoint, tmp_path, cache_dir, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    opts = Options(policy="openai:test-model", device="cpu", budget=6, k=3, confirm=1, patience=None,
                   protocol=Protocol(time_budget_s=0.5), policy_options={"base_url": endpoint.url, "api_key": "sk-test",
                                                    "backoff_s": 0.01, "temperature": 0.2, "max_tokens": 2048})
    res = optimize(FIXTURES / "tasks" / "diag_matmul_tall.py", tmp_path, opts)  # ~8x: the improvement is sure
    rows = RunDB(tmp_path).rows()
    assert res.candidates == 6 and len(rows) == 6
    assert res.status == "improved" and res.best_speedup > 1.0, f"{res}\n{run_story(tmp_path)}"
    by_status = sorted(r.status for r in rows)
    assert by_status == ["correct", "correct", "incorrect", "parse_error", "parse_error", "parse_error"]
    parse = {r.reasons[0] for r in rows if r.status == "parse_error"}
    assert parse == {"no_code_block", "truncated", "no_modelnew"}
    for r in rows:  # every proposal keeps its prompt, raw reply and token usage
        assert r.prompt and "[user]" in r.prompt and r.reply and r.usage["completion_tokens"] > 0
        assert r.policy == "openai:test-model"
    good = next(r for r in rows if r.source and "A.unsqueeze(1) * B" in r.source)
    assert good.duplicates == 1  # the reformatted duplicate was recognised, not evaluated
    assert good.meta["sections"] == ["Algorithm Design", "Code Implementation", "Performance Analysis"]
    assert any(r.usage["attempts"] == 2 for r in rows)  # the 500 was retried
    truncated = next(r for r in rows if r.reasons == ["truncated"])
    assert truncated.meta.get("truncated_by_max_tokens") is True
    assert res.tokens["prompt"] > 0 and res.tokens["completion"] > 0

    reqs = endpoint.requests
    assert len(reqs) == len(SCRIPT)  # every scripted answer used once: 7 completions + one 500 (retried)
    assert all(r["path"] == "/v1/chat/completions" and r["auth"] == "Bearer sk-test" for r in reqs)
    assert all(r["model"] == "test-model" and r["temperature"] == 0.2 and r["max_tokens"] == 2048 for r in reqs)
    first_user = reqs[0]["messages"][1]["content"]
    assert "None yet" in first_user and "torch.diag(A) @ B" in first_user
    later = [r["messages"][1]["content"] for r in reqs[4:]]
    # round 2 and 3 prompts show the measured candidate with its speedup, and the recent failures
    assert all("A.unsqueeze(1) * B" in u and "x (the fastest shown)" in u for u in later)
    assert any("Attempt #" in u and "parse_error" in u for u in later)
    assert reqs[0]["messages"][0]["role"] == "system"


def test_auth_failure_stops_the_run(tmp_path, cache_dir):
    ep = FakeEndpoint([("status", 401)] * 5)
    try:
        opts = Options(policy="openai:m", device="cpu", budget=2, k=1,
                       policy_options={"base_url": ep.url, "api_key": "bad", "backoff_s": 0.01})
        with pytest.raises(PolicyError, match="refused"):
            optimize("tiny/level1/diag_matmul", tmp_path, opts)
    finally:
        ep.close()
    assert RunDB(tmp_path).count() == 0


def test_endpoint_down_stops_the_run(tmp_path, cache_dir):
    ep = FakeEndpoint([("status", 503)] * 20)
    try:
        opts = Options(policy="openai:m", device="cpu", budget=4, k=2,
                       policy_options={"base_url": ep.url, "backoff_s": 0.001, "max_retries": 2})
        with pytest.raises(PolicyError, match="every request"):
            optimize("tiny/level1/diag_matmul", tmp_path, opts)
        assert len(ep.requests) == 6  # 2 requests x 3 attempts, then give up
    finally:
        ep.close()


def test_missing_key_is_a_configuration_error(monkeypatch):
    from kernelcraft.search.policies import make_policy

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(PolicyError, match="OPENAI_API_KEY"):
        make_policy("openai:gpt-x")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    assert make_policy("openai:gpt-x").api_key == "EMPTY"  # a local server needs no key


def test_unreachable_endpoint_fails_fast_naming_its_url(tmp_path, cache_dir):
    """Nothing listens on the port: the preflight stops the run before anything is evaluated, and a request that
    gets there anyway gives up after a couple of quick retries, naming the URL, in a few seconds."""
    import socket
    import time

    from kernelcraft.search.llm import OpenAIPolicy

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    opts = Options(policy="openai:m", device="cpu", budget=2, k=2, policy_options={"base_url": url})
    t0 = time.monotonic()
    with pytest.raises(PolicyError, match=f"cannot reach the LLM endpoint {url}/chat/completions"):
        optimize("tiny/level1/diag_matmul", tmp_path, opts)
    assert time.monotonic() - t0 < 10 and RunDB(tmp_path).count() == 0
    assert RunDB(tmp_path).get_meta("null_control") is None  # stopped before the null control

    policy = OpenAIPolicy("m", base_url=url)
    ctx = _context_for_test()
    t0 = time.monotonic()
    with pytest.raises(PolicyError) as e:
        policy.propose(ctx)
    took = time.monotonic() - t0
    assert f"{url}/chat/completions" in str(e.value) and "after 3 attempts" in str(e.value), str(e.value)
    assert took < 6, took


def _context_for_test():
    import random

    from kernelcraft.devices import device_info
    from kernelcraft.search.policies import Context
    from kernelcraft.task import load_task

    return Context(task=load_task("tiny/level1/diag_matmul"), device=device_info("cpu"), round=1, k=2, history=[],
                   failures=[], sample_exemplars=lambda: [], rng=random.Random(0))
