"""The worker zygote: forked workers give the verdicts spawned ones give, stay isolated from each other, and
nothing is lost when the zygote or the caller dies."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import recorded_pid

from kernelcraft.judge.caller import sandbox, zygote
from kernelcraft.evaluate import evaluate

FIXTURES = Path(__file__).parent / "fixtures"
TASK = FIXTURES / "tasks" / "tiny_elementwise.py"
FAST = dict(device="cpu", timing=False, trials=2, timeout_s=60, screen=False)

POISONER = '''
import torch
import torch.nn as nn
torch._kc_poisoned = True  # process-wide state: must not reach any later worker


class ModelNew(nn.Module):
    def __init__(self, alpha):
        super().__init__()
        self.alpha = alpha

    def forward(self, a, b):
        return self.alpha * a + b
'''

VICTIM = '''
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, alpha):
        super().__init__()
        self.alpha = alpha

    def forward(self, a, b):
        out = self.alpha * a + b
        return out + 1.0 if getattr(torch, "_kc_poisoned", False) else out
'''

SLEEPER = '''
import os
import time
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, alpha):
        super().__init__()
        self.alpha = alpha

    def forward(self, a, b):
        with open(os.environ["KC_TEST_PIDFILE"], "w") as f:  # its PID namespace and pid (tests/recorded_pid.py)
            f.write(os.readlink("/proc/self/ns/pid") + " " + str(os.getpid()))
        time.sleep(float(os.environ.get("KC_TEST_SLEEP", "3")))
        return self.alpha * a + b
'''

MODULES_SEEN = '''import os
import sys

with open(os.environ["KC_TEST_MODULES"], "a") as f:  # what the zygote had imported when this process was forked
    f.write(("dynamo" if "torch._dynamo" in sys.modules else "none")
            + ("+inductor" if "torch._inductor.compile_fx" in sys.modules else "") + "\\n")

''' + (FIXTURES / "legit" / "torch_elementwise.py").read_text()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def _wait_dead(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("name", ["legit/torch_elementwise.py", "faults/segfault_forward.py",
                                  "faults/value_mismatch.py", "faults/os_exit_forward.py",
                                  "faults/exception_init.py"])
def test_forked_and_spawned_workers_agree(name, cache_dir, monkeypatch):
    verdicts = {}
    for switch in ("1", "0"):
        monkeypatch.setenv(zygote.ENV_SWITCH, switch)
        verdicts[switch] = evaluate(TASK, FIXTURES / name, cache_dir=cache_dir, **FAST)
    forked, spawned = verdicts["1"], verdicts["0"]
    assert (forked.env.worker_start, spawned.env.worker_start) == ("fork", "spawn")
    assert (forked.status, forked.reasons) == (spawned.status, spawned.reasons), (forked.message, spawned.message)
    if name.startswith("faults/segfault"):
        assert "segmentation fault" in forked.message, forked.message


def test_a_candidate_cannot_reach_later_workers(cache_dir, tmp_path):
    (tmp_path / "poisoner.py").write_text(POISONER)
    (tmp_path / "victim.py").write_text(VICTIM)
    first = evaluate(TASK, tmp_path / "poisoner.py", cache_dir=cache_dir, **FAST)
    second = evaluate(TASK, tmp_path / "victim.py", cache_dir=cache_dir, **FAST)
    assert first.status == second.status == "correct", second.message
    assert second.env.worker_start == "fork"


def _zygote_pids() -> list[int]:
    return [z.proc.pid for z in zygote._ZYGOTES.values() if z.alive]


def test_concurrent_evaluations_share_one_zygote(cache_dir, tmp_path):
    """Nothing per job (the result channel's fd, the worker tag, the running test) may key the zygote: a new
    one costs seconds of imports (it once made every concurrent evaluation start its own)."""
    from kernelcraft.evaluate import evaluate_many

    evaluate(TASK, FIXTURES / "legit" / "torch_elementwise.py", cache_dir=cache_dir, **FAST)
    before = set(_zygote_pids())
    verdicts = evaluate_many([(TASK, FIXTURES / "legit" / "torch_elementwise.py")] * 3, max_workers=3,
                             cache_dir=cache_dir, **FAST)
    assert all(v.status == "correct" and v.env.worker_start == "fork" for v in verdicts)
    assert set(_zygote_pids()) == before, "a job started a zygote of its own"


def test_a_dead_zygote_is_replaced_and_loses_nothing(cache_dir, tmp_path, monkeypatch):
    v = evaluate(TASK, FIXTURES / "legit" / "torch_elementwise.py", cache_dir=cache_dir, **FAST)
    assert v.status == "correct" and v.env.worker_start == "fork"
    pids = _zygote_pids()
    assert pids
    for pid in pids:  # killed between evaluations
        os.kill(pid, signal.SIGKILL)
    assert all(_wait_dead(pid, 5) for pid in pids)
    v = evaluate(TASK, FIXTURES / "legit" / "torch_elementwise.py", cache_dir=cache_dir, **FAST)
    assert v.status == "correct" and v.env.worker_start == "fork", v.message
    assert set(_zygote_pids()).isdisjoint(pids)

    # killed while a worker it forked is running: that evaluation still reaches its verdict
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    pidfile = tmp_path / "worker.pid"
    monkeypatch.setenv("KC_TEST_PIDFILE", str(pidfile))
    result = {}
    t = threading.Thread(target=lambda: result.update(
        v=evaluate(TASK, tmp_path / "sleeper.py", cache_dir=cache_dir, **{**FAST, "trials": 1})))
    t.start()
    deadline = time.monotonic() + 30
    while not pidfile.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pidfile.exists()
    for pid in _zygote_pids():
        os.kill(pid, signal.SIGKILL)
    t.join(60)
    assert result["v"].status == "correct", result["v"].message


def test_builds_do_not_wait_for_dynamo_and_evaluations_always_have_it(cache_dir, tmp_path, monkeypatch):
    """The zygote is ready with torch and the harness; a build-only job (a pool's first builds) is forked before
    its Triton, dynamo and inductor imports are done, and an evaluation's worker never is: it is held until they
    are."""
    from kernelcraft.evaluate import prebuild

    (tmp_path / "seen.py").write_text(MODULES_SEEN)
    seen = tmp_path / "seen.txt"
    monkeypatch.setenv("KC_TEST_MODULES", str(seen))  # also keys a zygote of its own, started by the first job
    assert prebuild(tmp_path / "seen.py", cache_dir=cache_dir) is None
    assert seen.read_text().split() == ["none"]
    assert len(_zygote_pids()) >= 1
    seen.write_text("")
    v = evaluate(TASK, tmp_path / "seen.py", cache_dir=cache_dir, **FAST)
    assert v.status == "correct" and v.env.worker_start == "fork", v.message
    got = seen.read_text().split()
    assert got and set(got) == {"dynamo+inductor"}, got  # inductor's compiler: fork-safe here, so imported


def test_workers_die_with_their_caller(tmp_path):
    """The caller is SIGKILLed mid-evaluation: its zygote sees the socket close and kills the worker."""
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    pidfile = tmp_path / "worker.pid"
    code = ("from kernelcraft.evaluate import evaluate\n"
            f"evaluate({str(TASK)!r}, {str(tmp_path / 'sleeper.py')!r}, cache_dir={str(tmp_path / 'cache')!r}, "
            "device='cpu', timing=False, trials=1, timeout_s=120, screen=False)\n")
    env = dict(os.environ, KC_TEST_PIDFILE=str(pidfile), KC_TEST_SLEEP="120")
    env.pop(zygote.ENV_SWITCH, None)
    caller = subprocess.Popen([sys.executable, "-c", code], env=env)
    try:
        deadline = time.monotonic() + 60
        while not pidfile.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pidfile.exists(), "the worker never started"
        record = pidfile.read_text()
        assert recorded_pid.host_pid(record) is not None, "the candidate's process is not running"
        caller.kill()
        caller.wait(10)
        deadline = time.monotonic() + 10
        while recorded_pid.host_pid(record) is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert recorded_pid.host_pid(record) is None, f"the candidate's process ({record}) outlived its caller"
    finally:
        caller.kill()


def test_fork_settings_follow_the_sandbox_mode(monkeypatch):
    env = {"KERNELCRAFT_API_KEY": "k", "PATH": "/bin", "CUDA_VISIBLE_DEVICES": ""}
    assert sandbox.fork_settings(env, "off") == (env, {})
    scrubbed, limits = sandbox.fork_settings(env, "rlimits")
    assert "KERNELCRAFT_API_KEY" not in scrubbed and limits["RLIMIT_CORE"] == 0
    monkeypatch.setattr(sandbox, "bwrap_path", lambda: "/usr/bin/bwrap")
    assert sandbox.fork_settings(env, "auto") is None  # a sandbox per worker: spawned
    assert sandbox.fork_settings(env, "bwrap") is None
    monkeypatch.setattr(sandbox, "bwrap_path", lambda: None)
    assert sandbox.fork_settings(env, "auto") is not None  # no bwrap here: rlimits, forkable
    assert sandbox.fork_settings(env, "bwrap") is None  # prepare() refuses it with a clear error
