"""Warm judges (`judge.warm`, `judge.forker`): the reference side is kept between candidates of one task, every
candidate gets a fresh side, and nothing a candidate did survives into the next candidate's evaluation."""
from __future__ import annotations

import os
import time

import pytest
import recorded_pid
import torch

from kernelcraft.evaluate import evaluate
from kernelcraft.judge.caller import warm

FAST = dict(device="cpu", trials=3, time_budget_s=0.2, min_rounds=3, remeasure_above=None)

TASK = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(16))

    def forward(self, x):
        return torch.tanh(x * self.scale)

def get_inputs():
    return [torch.randn(8, 16)]

def get_init_inputs():
    return []
'''

MIRROR = TASK.replace("class Model(", "class ModelNew(")
WRONG = MIRROR.replace("torch.tanh(", "torch.sigmoid(")
CRASH = MIRROR.replace("        return torch.tanh", "        import os\n        os._exit(3)\n        return torch.tanh")
DAEMON = MIRROR.replace("        return torch.tanh", '''        import os, time
        if not getattr(ModelNew, "_spawned", False):
            ModelNew._spawned = True
            if os.fork() == 0:          # a grandchild that outlives its parent: adopted (judge or namespace init)
                if os.fork() == 0:
                    rec = os.readlink("/proc/self/ns/pid") + " " + str(os.getpid())  # (tests/recorded_pid.py)
                    open(os.environ["KC_TEST_PIDFILE"], "w").write(rec)
                    time.sleep(120)
                os._exit(0)
        return torch.tanh''')


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    warm.discard_all()
    monkeypatch.setattr(warm, "_capacity", warm.MAX_IDLE)  # a pool made by an earlier test may have raised it
    yield
    warm.discard_all()


def _eval(task, src, **kw):
    return evaluate(task, src, **{**FAST, **kw})


def test_candidates_of_one_task_reuse_the_reference():
    first = _eval(TASK, MIRROR + "\n# 1\n")
    assert first.status == "correct", first.message
    assert first.env.reference == "fresh"
    assert warm.idle_count() == 1
    for i in range(2):
        v = _eval(TASK, MIRROR + f"\n# {i + 2}\n")
        assert v.status == "correct", v.message
        assert v.env.reference == "warm"
    wrong = _eval(TASK, WRONG)
    assert wrong.status == "incorrect" and wrong.env.reference == "warm"


def test_another_protocol_or_task_gets_its_own_judge():
    _eval(TASK, MIRROR)
    other_seed = _eval(TASK, MIRROR, seed=1234)
    assert other_seed.env.reference == "fresh"
    other_task = _eval(TASK.replace("8, 16", "4, 16"), MIRROR)
    assert other_task.env.reference == "fresh"
    assert warm.idle_count() == 3


def test_a_crashing_candidate_does_not_cost_the_next_one(tmp_path):
    assert _eval(TASK, MIRROR).status == "correct"
    crash = _eval(TASK, CRASH)
    assert crash.status == "runtime_error" and "crashed" in crash.reasons, crash.message
    assert crash.env.reference == "warm"
    after = _eval(TASK, MIRROR + "\n# after\n")
    assert after.status == "correct", after.message
    assert after.env.reference == "warm"


def test_processes_a_candidate_left_behind_are_gone_before_the_next_candidate(tmp_path, monkeypatch):
    pidfile = tmp_path / "daemon.pid"
    monkeypatch.setenv("KC_TEST_PIDFILE", str(pidfile))
    _eval(TASK, MIRROR, screen=False)  # the judge this test reuses (same protocol; the variable is in its key)
    v = _eval(TASK, DAEMON, screen=False)
    assert v.status in ("rejected", "correct"), v.message  # the audit may or may not catch the orphan in time
    assert v.env.reference == "warm"
    deadline = time.monotonic() + 10
    while not pidfile.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pidfile.exists()
    record = pidfile.read_text()
    recorded_pid.parse(record)
    deadline = time.monotonic() + 10
    while recorded_pid.host_pid(record) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert recorded_pid.host_pid(record) is None, "the candidate's orphan outlived its evaluation"
    nxt = _eval(TASK, MIRROR + "\n# next\n", screen=False)
    assert nxt.status == "correct", nxt.message


def test_warm_reuse_can_be_switched_off(monkeypatch):
    monkeypatch.setenv(warm.ENV_SWITCH, "0")
    _eval(TASK, MIRROR)
    v = _eval(TASK, MIRROR + "\n# again\n")
    assert v.status == "correct" and v.env.reference == "fresh"
    assert warm.idle_count() == 0


class _FakeProc:
    def __init__(self, pid):
        self.pid, self.dead = pid, False

    def poll(self):
        return 0 if self.dead else None

    def wait(self, timeout=None):
        return 0


def _fake(pid, killed):
    w = warm.WarmWorker(_FakeProc(pid), os.open(os.devnull, os.O_RDONLY), "t", [], False, "fork")
    w.kill = lambda w=w: (killed.append(w.proc.pid), os.close(w.r_fd))
    return w


def test_idle_judges_are_bounded_and_expire(monkeypatch):
    killed: list[int] = []
    for i in range(warm.MAX_IDLE + 2):
        warm.put(f"k{i}", _fake(10_000 + i, killed))
    assert warm.idle_count() == warm.MAX_IDLE
    assert killed == [10_000, 10_001]  # the oldest go first
    w = warm.take(f"k{warm.MAX_IDLE + 1}")
    assert w is not None and w.proc.pid == 10_000 + warm.MAX_IDLE + 1
    dead = _fake(20_000, killed)
    dead.proc.dead = True
    warm.put("dead", dead)
    assert warm.take("dead") is None and 20_000 in killed  # a judge that died while idle is never handed out
    monkeypatch.setattr(warm, "IDLE_S", 0.0)
    time.sleep(0.01)
    assert warm.take("k2") is None
    assert warm.idle_count() == 0


def test_a_pool_keeps_as_many_idle_judges_as_it_has_slots():
    """A pool of 8 slots running 8 tasks at once: the judge a task's round leaves idle must outlive the other
    tasks' rounds until its next one starts, so the bound rises to the slots (never below `MAX_IDLE`)."""
    from kernelcraft.serve.pool import Pool

    killed: list[int] = []
    assert warm.hold_at_least(2) == warm.MAX_IDLE
    with Pool(devices="cpu", per_device=warm.MAX_IDLE + 4):
        pass
    assert warm.capacity() == warm.MAX_IDLE + 4
    for i in range(warm.MAX_IDLE + 6):
        warm.put(f"k{i}", _fake(30_000 + i, killed))
    assert warm.idle_count() == warm.MAX_IDLE + 4 and killed == [30_000, 30_001]


def test_idle_judges_hold_at_most_a_share_of_their_gpu():
    """Four idle judges of 6 GiB-input tasks held ~139 of an H200's 140 GiB and 58 of 91 baseline evaluations ran
    out of memory: the idle judges of one GPU keep at most IDLE_MEMORY_SHARE of it, the oldest killed first;
    other GPUs' (and CPU judges, which hold nothing) are not counted."""
    warm.discard_all()
    killed: list[int] = []
    gib = 1 << 30

    def on(pid, device, held):
        w = _fake(pid, killed)
        w.device, w.device_bytes, w.device_total = device, held * gib, 100 * gib
        return w

    warm.put("a", on(1, "0", 10))
    warm.put("b", on(2, "1", 20))  # another GPU
    warm.put("c", on(3, "0", 10))
    assert killed == [] and warm.idle_count() == 3
    warm.put("d", on(4, "0", 10))  # 30 GiB of 100 on GPU 0: the oldest of GPU 0 goes
    assert killed == [1] and warm.idle_count() == 3
    warm.put("e", on(5, "0", 30))  # alone above the share: not kept; the older ones still fit
    assert killed == [1, 5] and warm.take("b") is not None
    assert warm.discard_device("0") == 2 and sorted(killed) == [1, 3, 4, 5] and warm.idle_count() == 0
    warm.put("f", on(6, "1", 5))
    warm.put("g", _fake(7, killed))  # a CPU judge: no device, never counted
    assert warm.discard_device("1") == 1 and 6 in killed and warm.idle_count() == 1
    warm.discard_all()


def test_a_judge_of_a_task_that_takes_a_large_share_of_its_gpu_is_not_kept():
    """KernelBench's 8-16 GiB tasks ran out of memory on an 80 GB H100 beside a 16.6 GiB judge of the same task
    kept (or taken and waiting for the lock) with its reference's arenas: such judges are not kept warm."""
    from types import SimpleNamespace

    from kernelcraft.judge.process.arena import TensorSpec
    from kernelcraft.judge.process.jobs import WARM_MAX_SHARE, worth_keeping

    gib = 1 << 30
    total = 80 * gib

    def ev(device, in_gib, out_gib):
        spec = lambda g: TensorSpec((g * gib // 4,), (1,), "float32")  # noqa: E731
        return SimpleNamespace(device=torch.device(device), in_specs=[spec(in_gib), None], out_specs=[spec(out_gib)])

    assert worth_keeping(ev("cuda", 1, 1), total)  # 2 of 80 GiB: kept
    assert not worth_keeping(ev("cuda", 8, 5), total)  # 13 of 80: a cold start next time
    assert worth_keeping(ev("cpu", 8, 5), total)  # a CPU judge holds no device memory
    assert worth_keeping(ev("cuda", 2, 2), total) == (4 <= WARM_MAX_SHARE * 80)


def test_a_job_crowded_out_of_device_memory_by_idle_judges_runs_again(monkeypatch, tmp_path):
    """A job that ran out of device memory while idle judges held part of its GPU is run once more, cold, after
    they are killed; without idle judges on that GPU the out-of-memory verdict stands."""
    from kernelcraft.judge.caller import runner

    calls = []

    def fake_run(job, work_dir, timeout_s, build_timeout_s, warm_key, reuse, root=None, visible_gpu=None):
        calls.append((warm_key, reuse))
        out = runner.WorkerOutcome(start="fork")
        out.result = ({"status": "runtime_error", "reasons": ["harness_error"],
                       "message": "kernelcraft failed: OutOfMemoryError: CUDA out of memory."}
                      if len(calls) == 1 else {"status": "correct", "reasons": [], "message": ""})
        return out

    monkeypatch.setattr(runner, "_run", fake_run)
    discarded = []
    monkeypatch.setattr(warm, "discard_device", lambda d: discarded.append(d) or 2)
    out = runner.run_worker({}, tmp_path, tmp_path, "0", 10, 10)
    assert out.result["status"] == "correct" and out.crowded_out and "run again" in out.start
    assert discarded == ["0"] and len(calls) == 2 and calls[1] == (None, None)  # cold, and not kept warm
    calls.clear()
    monkeypatch.setattr(warm, "discard_device", lambda d: 0)  # nobody else held memory: the verdict stands
    out = runner.run_worker({}, tmp_path, tmp_path, "0", 10, 10)
    assert out.result["status"] == "runtime_error" and len(calls) == 1 and not out.crowded_out
    calls.clear()
    out = runner.run_worker({}, tmp_path, tmp_path, None, 10, 10)  # a CPU job: never retried
    assert len(calls) == 1
    assert not runner._out_of_memory(runner.WorkerOutcome(result={  # a candidate's own exception text is not one
        "status": "runtime_error", "reasons": ["exception"], "message": "RuntimeError: out of memory (says who?)"}))
    assert runner._out_of_memory(runner.WorkerOutcome(result={
        "status": "runtime_error", "reasons": ["task_error"], "message": "the reference failed: out of memory"}))


def test_reset_restores_the_reference_as_constructed(tmp_path):
    """What a warm reference is before each candidate: its constructed weights, buffers, modes and RNG states,
    whatever an earlier job (a weight perturbation, the task's own forward) did to it."""
    from kernelcraft.judge.process.side import Side

    path = tmp_path / "reference.py"
    path.write_text(TASK.replace("self.scale = nn.Parameter(torch.randn(16))",
                                 "self.scale = nn.Parameter(torch.randn(16))\n        self.drop = nn.Dropout(0.5)"))
    side = Side("reference")
    side.cmd_import(dict(device="cpu", path=str(path), cache_dir=str(tmp_path)), ())
    side.cmd_construct(dict(init=[], seed=42), ())
    before = side.model.scale.detach().clone()
    draw = torch.rand(3)
    with torch.no_grad():
        side.model.scale.add_(1.0)
    side.model.eval()
    torch.rand(5)
    side.cmd_reset({}, ())
    assert torch.equal(side.model.scale, before)
    assert side.model.training and side.model.drop.training
    assert torch.equal(torch.rand(3), draw)  # the RNG stream continues from construction again


def test_spawned_workers_are_kept_warm_too(monkeypatch):
    """Without the zygote the judge is exec'd, so it and its reference carry the first job's tag in their
    environment: a job's clean-up (kill_tagged) must spare them and still kill what the candidate exec'd."""
    monkeypatch.setenv("KERNELCRAFT_ZYGOTE", "0")
    first = _eval(TASK, MIRROR)
    assert first.status == "correct" and first.env.worker_start == "spawn", first.message
    again = _eval(TASK, MIRROR + "\n# again\n")
    assert again.status == "correct" and again.env.reference == "warm", again.message


def test_a_judge_that_died_between_jobs_is_replaced_not_blamed(monkeypatch):
    """A kept judge that dies after it was handed out (between the liveness check and the job) sends no word of
    the job: the job runs again in a fresh worker, and the dead judge's channel is closed exactly once."""
    import signal

    assert _eval(TASK, MIRROR).status == "correct"
    (idle,) = [w for ws in warm._IDLE.values() for w in ws]
    os.killpg(idle.proc.pid, signal.SIGKILL)
    idle.proc.wait(timeout=10)
    monkeypatch.setattr(warm.WarmWorker, "alive", lambda self: True)  # handed out all the same
    v = _eval(TASK, MIRROR + "\n# after the death\n")
    assert v.status == "correct", v.message
    assert v.env.reference == "fresh"


def test_a_job_crowded_out_of_device_memory_by_running_jobs_runs_again_alone(monkeypatch, tmp_path):
    """An out-of-memory verdict of a job that ran beside other jobs of this process on its GPU is run once more
    with the GPU to itself (`gpushare`): the retry waits until the job beside it has exited."""
    import threading

    from kernelcraft.judge.caller import runner

    monkeypatch.setattr(warm, "discard_device", lambda d: 0)  # no idle judges: only running jobs crowd it
    b_running, b_release, order = threading.Event(), threading.Event(), []

    def fake_run(job, work_dir, timeout_s, build_timeout_s, warm_key, reuse, root=None, visible_gpu=None):
        out = runner.WorkerOutcome(start="fork")
        if job["name"] == "b":
            b_running.set()
            b_release.wait(10)
            order.append("b done")
            out.result = {"status": "correct", "reasons": [], "message": ""}
        elif "a oom" not in order:
            b_running.wait(10)
            order.append("a oom")
            out.result = {"status": "runtime_error", "reasons": ["out_of_memory"],
                          "message": "out of memory during check: CUDA out of memory"}
            threading.Timer(0.3, b_release.set).start()
        else:
            order.append("a again")
            out.result = {"status": "correct", "reasons": [], "message": ""}
        return out

    monkeypatch.setattr(runner, "_run", fake_run)
    got = {}
    tb = threading.Thread(target=lambda: got.setdefault("b", runner.run_worker({"name": "b"}, tmp_path, tmp_path, "0", 10, 10)))
    tb.start()
    b_running.wait(10)
    got["a"] = runner.run_worker({"name": "a"}, tmp_path, tmp_path, "0", 10, 10)
    tb.join(10)
    assert order == ["a oom", "b done", "a again"], order  # the retry ran after b had exited
    assert got["a"].result["status"] == "correct" and got["a"].crowded_out and "alone" in got["a"].start
    assert got["b"].result["status"] == "correct" and not got["b"].crowded_out
    order.clear()
    b_running.set()
    alone = runner.run_worker({"name": "a"}, tmp_path, tmp_path, "0", 10, 10)  # nobody beside it: the verdict stands
    assert alone.result["status"] == "runtime_error" and order == ["a oom"] and not alone.crowded_out


def test_gpu_share_prefers_a_waiting_exclusive_holder():
    """Jobs arriving while an out-of-memory retry waits queue behind it, so a busy pool cannot starve it."""
    import threading
    import time

    from kernelcraft.judge.caller.gpushare import Share

    s, log, release = Share(), [], threading.Event()

    def hold(kind: str) -> None:
        with (s.exclusive() if kind == "exclusive" else s.shared()):
            log.append(kind)
            release.wait(5)

    with s.shared() as seen:
        w = threading.Thread(target=hold, args=("exclusive",))
        w.start()
        time.sleep(0.2)
        r = threading.Thread(target=hold, args=("late shared",))
        r.start()
        time.sleep(0.2)
        assert log == []  # the writer waits for this holder; the late reader waits behind the writer
    assert not seen["overlapped"]  # nobody else held it shared meanwhile
    time.sleep(0.2)
    assert log == ["exclusive"]
    release.set()
    w.join(5), r.join(5)
    assert log == ["exclusive", "late shared"]
