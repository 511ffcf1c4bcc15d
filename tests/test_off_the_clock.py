"""Nothing runs off the clock, and a timed call looks and is judged like a checked one.

- Every forward the judge asks for is the same request (`sideproc.RUN`): trials, timed rounds, a second process's
  trial and the weights trial.
- The sides touch a candidate's objects only through type-level calls, and the empty round trip (`null`) touches
  nothing the candidate made: an attribute planted on an output never runs in the harness.
- The judge copies each timed output when the call ends; the kernel's CPU accounting of the candidate's process
  tree outside its timed calls is billed (`treecpu`).
(The attacks themselves are fixtures run by test_guards: tests/fixtures/hacks/storage_hook_in_null.py,
zeros_after_trials.py, zeros_when_timed.py.)
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from kernelcraft.evaluate import evaluate
from kernelcraft.judge.speed import treecpu
from kernelcraft.judge.process.side import Side

FIX = Path(__file__).parent / "fixtures"


class _Planted(Exception):
    pass


def _planted_tensor(n: int = 8) -> torch.Tensor:
    """A plain tensor whose instance attributes shadow every method a harness might call: each one raises."""
    t = torch.randn(n)

    def boom(*a, **k):
        raise _Planted("a method planted on the candidate's tensor ran in the harness")

    for name in ("untyped_storage", "numel", "size", "dim", "data_ptr", "is_contiguous", "contiguous", "reshape",
                 "detach", "clone", "copy_", "to", "float", "view", "__getitem__", "storage", "stride"):
        t.__dict__[name] = boom
    return t


def _side(n: int = 8) -> Side:
    side = Side("candidate")
    side.device = torch.device("cpu")
    side.guarded = True
    side.outs = [torch.full((n,), float("nan"))]
    side.out_kind = "tensor"
    side._null_outs = [torch.empty(n)]
    return side


def test_the_structure_check_and_the_copy_use_type_level_calls_only():
    side = _side()
    out = _planted_tensor()
    reply = side._deliver(out)
    assert reply["type"] == "done"
    assert torch.equal(side.outs[0], torch.Tensor.clone(out))


def test_the_null_touches_nothing_the_candidate_made():
    side = _side()
    side._last_out = _planted_tensor()
    before = side.outs[0].clone()
    assert side.cmd_null({}, ())["type"] == "done"
    assert torch.equal(side.outs[0].isnan(), before.isnan())  # the arena as it was: the null only reads it


_LOGGING = '''
import json, os, sys
import torch
import torch.nn as nn

LOG = {log!r}


def _request():
    frame = sys._getframe(1)
    while frame is not None:
        msg = frame.f_locals.get("msg")
        if isinstance(msg, dict) and msg.get("cmd") == "run":
            return msg
        frame = frame.f_back
    return None


class ModelNew(nn.Module):
    def __init__(self, dim, steps):
        super().__init__()
        self.W = nn.Parameter(torch.randn(dim, dim) / dim ** 0.5)
        self.steps = steps

    def forward(self, x):
        with open(LOG, "a") as f:
            f.write(json.dumps({{"pid": os.getpid(), "msg": _request()}}) + "\\n")
        for _ in range(self.steps):
            x = torch.tanh(x @ self.W)
        return x
'''


def test_every_forward_is_asked_for_with_the_same_request(tmp_path):
    """From inside the candidate's process a checked call and a timed one are the same request (the first call,
    never judged, also carries nothing else unless the task is stateful or the candidate may autotune). The timing
    record says how busy the host was meanwhile: at least the timed sides themselves."""
    log = tmp_path / "requests.jsonl"
    cand = tmp_path / "logging_candidate.py"
    cand.write_text(_LOGGING.format(log=str(log)))
    v = evaluate(FIX / "tasks" / "guard_slow.py", cand, device="cpu", screen=False, time_budget_s=0.3,
                 processes=2, remeasure_above=None)
    assert v.status == "correct", v.message
    seen = [json.loads(line) for line in log.read_text().splitlines()]
    assert len({s["pid"] for s in seen}) >= 2  # both candidate processes were asked
    assert len(seen) > v.timing.samples  # trials, the weights trial and every timed round
    assert {json.dumps(s["msg"], sort_keys=True) for s in seen} == {json.dumps({"cmd": "run"})}
    assert v.timing.host_busy_cores is not None and v.timing.host_busy_cores > 0, v.timing


def test_tree_cpu_counts_threads_and_reaped_children():
    code = textwrap.dedent("""
        import subprocess, sys, threading, time
        def burn(s):
            t = time.process_time()
            while time.process_time() - t < s:
                pass
        subprocess.run([sys.executable, "-c", "import time\\nt=time.process_time()\\nwhile time.process_time()-t<0.3: pass"])
        th = threading.Thread(target=burn, args=(0.3,)); th.start(); th.join()
        print("done", flush=True)
        time.sleep(30)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "done"
        used = treecpu.tree_cpu_ns(proc.pid) / 1e9
        assert used >= 0.5, used  # the thread's 0.3 s (exited) and the reaped child's 0.3 s
    finally:
        proc.kill()
        proc.wait()


def test_the_ledger_bills_only_what_exceeds_the_references_windows():
    ledger = treecpu.Ledger()
    ledger.untimed_ns = {"reference": 10 * 100_000, "candidate": 10 * 100_000}
    ledger.windows = {"reference": 10, "candidate": 10}
    assert ledger.excess_ns() == 0 and ledger.billed_ms(10) == 0
    ledger.untimed_ns["candidate"] = 10 * 1_100_000  # 1 ms more per window
    assert ledger.billed_ms(10) == pytest.approx((11_000_000 - 10 * (110_000 + treecpu.ALLOWANCE_NS)) / 1e7)


_WORKER = '''
import threading
import torch
import torch.nn as nn


def _spin():
    a = torch.randn(64, 64)
    while True:
        a = torch.tanh(a @ a) * 0.5


class ModelNew(nn.Module):
    def __init__(self, dim, steps):
        super().__init__()
        self.W = nn.Parameter(torch.randn(dim, dim) / dim ** 0.5)
        self.steps = steps
        threading.Thread(target=_spin, daemon=True).start()

    def forward(self, x):
        for _ in range(self.steps):
            x = torch.tanh(x @ self.W)
        return x
'''


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel's CPU clocks of other processes")
def test_cpu_a_candidate_uses_outside_its_timed_calls_is_billed(tmp_path):
    """A thread of the candidate's that runs whenever its process is thawed works in the empty requests too: the
    judge reads that CPU time from the kernel and bills it (here the in-process tripwires are off, as a candidate
    that silenced them would have them)."""
    cand = tmp_path / "spinning_thread.py"
    cand.write_text(_WORKER)
    v = evaluate(FIX / "tasks" / "guard_slow.py", cand, device="cpu", screen=False, runtime_guards=False,
                 time_budget_s=0.5, processes=1, remeasure_above=None)
    assert v.status == "correct", v.message
    t = v.timing
    assert t.untimed_cpu_ms["candidate"] > 1.5 * t.untimed_cpu_ms["reference"], t
    assert t.billed_ms > 0, t
    assert next(iter(t.untimed_cpu_top)).endswith("(side)"), t.untimed_cpu_top  # the spinning thread's process


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel's CPU clocks of other processes")
def test_compile_workers_torch_compile_left_are_not_billed(monkeypatch):
    """`torch.compile` leaves a pool of idle compile-worker processes in the candidate's process group (on a GPU,
    after compiling Triton kernels; the fixture starts it on the CPU); woken at every thaw, they would be billed for
    the judge's own freezing. The side shuts the pool after its first call, so during timing only the side's own
    process uses untimed CPU time."""
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "2")  # a pool whatever the host's core count
    v = evaluate(FIX / "tasks" / "guard_elementwise.py", FIX / "legit" / "guard_compile_worker_pool.py", device="cpu",
                 time_budget_s=0.3, processes=1, remeasure_above=None)
    assert v.status == "correct", v.message
    assert v.timing.untimed_cpu_top and all(name.endswith("(side)") for name in v.timing.untimed_cpu_top), v.timing
