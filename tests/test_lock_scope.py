"""lock_scope="device": the worker waits for the device lock after its imports, the wait counts against
no clock, and once held the lock covers construction, checks and timing."""
import fcntl
import socket
import threading
import time

import pytest

from kernelcraft.evaluate import evaluate
from kernelcraft.judge.caller.runner import cache_root
from kernelcraft.judge.speed.gate import DeviceGate

TASK = "tiny/level1/relu"
CAND = '''
import torch, torch.nn as nn
class ModelNew(nn.Module):
    def forward(self, x):
        return torch.relu(x)
'''


def _hold_lock(path, seconds, held, how=fcntl.LOCK_EX):
    """Another evaluation's hold on the device lock file: exclusive, or `fcntl.LOCK_SH` (a sharer's)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, how)
        held.set()
        time.sleep(seconds)
        fcntl.flock(f, fcntl.LOCK_UN)


def test_waiting_for_the_device_is_on_no_clock(cache_dir):
    lock = cache_root(cache_dir) / "locks" / f"cpu-{socket.gethostname()}.lock"
    held = threading.Event()
    t = threading.Thread(target=_hold_lock, args=(lock, 8.0, held))
    t.start()
    held.wait()
    t0 = time.perf_counter()
    # the run clock (timeout_s) is far shorter than the wait: it must not be running while we wait
    v = evaluate(TASK, CAND, device="cpu", trials=1, timing=False, timeout_s=5.0, lock_scope="device",
                 cache_dir=cache_dir)
    waited = time.perf_counter() - t0
    t.join()
    assert v.status == "correct", v.message
    assert waited >= 7.0  # it did wait for the holder: construction and checks ran under the lock


def _time_like_a_timer(path, seconds, held, waited):
    """What a timer does (`gate.DeviceGate.exclusive`): the gate, then the lock, both exclusively."""
    gate = DeviceGate(str(path))
    t0 = time.monotonic()
    gate.exclusive()
    waited.append(time.monotonic() - t0)
    held.set()
    time.sleep(seconds)
    gate.close()


def test_timing_scope_checks_share_the_device(cache_dir):
    """Another evaluation's checks (a shared hold) do not hold this one's checks back."""
    lock = cache_root(cache_dir) / "locks" / f"cpu-{socket.gethostname()}.lock"
    held = threading.Event()
    t = threading.Thread(target=_hold_lock, args=(lock, 20.0, held, fcntl.LOCK_SH))
    t.start()
    held.wait()
    t0 = time.perf_counter()
    v = evaluate(TASK, CAND, device="cpu", trials=1, timing=False, lock_scope="timing", cache_dir=cache_dir)
    took = time.perf_counter() - t0
    t.join()
    assert v.status == "correct", v.message
    assert took < 18.0  # it ran beside the sharer


def test_timing_scope_checks_wait_for_a_timer(cache_dir):
    lock = cache_root(cache_dir) / "locks" / f"cpu-{socket.gethostname()}.lock"
    held, waited = threading.Event(), []
    t = threading.Thread(target=_time_like_a_timer, args=(lock, 8.0, held, waited))
    t.start()
    held.wait()
    v = evaluate(TASK, CAND, device="cpu", trials=1, timing=False, timeout_s=5.0, lock_scope="timing",
                 cache_dir=cache_dir)
    t.join()
    assert v.status == "correct", v.message
    assert v.phases_s["wait_device"] >= 4.0, v.phases_s  # and the run clock (5 s) did not run meanwhile


SLOW = '''
import time, torch, torch.nn as nn
class ModelNew(nn.Module):
    def forward(self, x):
        time.sleep(0.4)
        return torch.relu(x)
'''


def test_a_sharer_steps_aside_for_a_timer_mid_request(cache_dir):
    """A timer that comes while an evaluation's candidate runs a slow forward gets the device within a poll or so
    (the candidate frozen mid-call), holds it alone, and the evaluation goes on to a correct verdict after it, its
    time out counted as `wait_device`, on no clock."""
    lock = cache_root(cache_dir) / "locks" / f"cpu-{socket.gethostname()}.lock"
    got: dict = {}

    def run():
        got["v"] = evaluate(TASK, SLOW, device="cpu", trials=6, timing=False, timeout_s=8.0, lock_scope="timing",
                            cache_dir=cache_dir)

    ev = threading.Thread(target=run)
    ev.start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (lock.exists() and _someone_shares(lock)):
        time.sleep(0.05)
    time.sleep(1.0)  # inside the trials: each forward sleeps 0.4 s
    held, waited = threading.Event(), []
    timer = threading.Thread(target=_time_like_a_timer, args=(lock, 6.0, held, waited))
    timer.start()
    timer.join()
    ev.join()
    v = got["v"]
    assert v.status == "correct", v.message
    assert waited and waited[0] < 3.0, waited  # not the rest of the evaluation: it stepped aside
    assert v.phases_s["wait_device"] >= 4.0, v.phases_s


def _someone_shares(lock) -> bool:
    with open(lock, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


def test_bad_lock_scope_is_a_usage_error():
    with pytest.raises(ValueError, match="lock_scope"):
        evaluate(TASK, CAND, device="cpu", lock_scope="gpu")


def test_device_lock_taken_before_import_unless_it_compiles(cache_dir):
    """Code a candidate runs at import must not overlap another evaluation's GPU work: the lock is taken
    before the import, except when the import compiles an extension (nvcc stays off the device lock).
    And a clock after a wait starts afresh: a long wait never eats the import's build budget."""
    from pathlib import Path

    fixtures = Path(__file__).parent / "fixtures"
    plain = evaluate(TASK, CAND, device="cpu", trials=1, timing=False, lock_scope="device", cache_dir=cache_dir)
    assert plain.status == "correct", plain.message
    order = list(plain.phases_s)
    assert order.index("wait_device") < order.index("import") < order.index("init"), order

    built = evaluate(fixtures / "tasks" / "guard_elementwise.py", fixtures / "legit" / "guard_cpp_inline_strict.py",
                     device="cpu", trials=1, timing=False, mode="strict", lock_scope="device", cache_dir=cache_dir)
    assert built.status == "correct", built.message
    order = list(built.phases_s)
    assert order.index("import") < order.index("wait_device") < order.index("init"), order

    lock = cache_root(cache_dir) / "locks" / f"cpu-{socket.gethostname()}.lock"
    held = threading.Event()
    t = threading.Thread(target=_hold_lock, args=(lock, 16.0, held))
    t.start()
    held.wait()
    # build_timeout_s is shorter than the wait: the build clock stops while the job waits and goes on after it
    v = evaluate(TASK, CAND, device="cpu", trials=1, timing=False, timeout_s=5.0, build_timeout_s=12.0,
                 lock_scope="device", cache_dir=cache_dir)
    t.join()
    assert v.status == "correct", v.message
    assert v.phases_s["wait_device"] >= 8.0, v.phases_s


def test_trusted_imports_named_for_preloading_off_the_lock():
    from kernelcraft.candidate import preloads

    assert preloads("import torch\nimport triton\nimport triton.language as tl\n") == ["triton"]
    assert preloads("    from triton import jit\n") == ["triton"]
    assert preloads("import torch\n# triton is not used\n") == []
    # torch.compile: inductor's compiler (~1-2 s of imports) before the lock, not in the candidate's construction
    assert preloads("import torch\nf = torch.compile(g, mode='default')\n") == ["torch._inductor.compile_fx"]
    assert preloads("from torch import compile\nf = compile(g)\n") == ["torch._inductor.compile_fx"]
    assert preloads("import torch\nx = compile_all(y)\n") == []


def test_candidate_prepared_off_the_lock_then_imported_on_it(cache_dir):
    """`prepare` (CUDA, the tracer, trusted imports: no candidate code) runs before the wait for the lock; the
    candidate's module, after it."""
    lock = cache_root(cache_dir) / "locks" / f"cpu-{socket.gethostname()}.lock"
    held = threading.Event()
    t = threading.Thread(target=_hold_lock, args=(lock, 10.0, held))
    t.start()
    held.wait()
    v = evaluate(TASK, CAND, device="cpu", trials=1, timing=False, lock_scope="device", cache_dir=cache_dir)
    t.join()
    assert v.status == "correct", v.message
    order = list(v.phases_s)
    assert order.index("prepare") < order.index("wait_device") < order.index("import") < order.index("init"), order
    assert v.phases_s["wait_device"] >= 2.0, v.phases_s
    # where `prepare` went, part by part (on a CPU: no CUDA context, no kernel tracer)
    assert set(v.env.prepare_s) == {"build_cache", "preload", "process_state"}, v.env.prepare_s
    assert all(s >= 0 for s in v.env.prepare_s.values()) and sum(v.env.prepare_s.values()) <= v.phases_s["prepare"]


AUTOTUNED = '''
import torch, torch.nn as nn
torch.backends.cudnn.benchmark = True
class ModelNew(nn.Module):
    """Stands for a candidate whose convolutions cuDNN's benchmark mode tunes on their first call."""
    def forward(self, x):
        return torch.relu(x)
'''


def test_an_autotuning_candidates_first_call_has_the_device_alone(cache_dir):
    """A candidate that may autotune out of the judge's sight (cuDNN's benchmark mode) makes its first call with the
    device to itself, so its picks are not made beside other evaluations' work: it waits for a sharer's checks to
    end (on no clock), then shares again; the verdict says so. A plain candidate's first call shares (the test
    above). Inductor's and Triton's tuning asks for the device at its first benchmark (test_first_call_hold.py)."""
    lock = cache_root(cache_dir) / "locks" / f"cpu-{socket.gethostname()}.lock"
    held = threading.Event()
    t = threading.Thread(target=_hold_lock, args=(lock, 8.0, held, fcntl.LOCK_SH))
    t.start()
    held.wait()
    v = evaluate(TASK, AUTOTUNED, device="cpu", trials=2, timing=False, timeout_s=5.0, lock_scope="timing",
                 cache_dir=cache_dir)
    t.join()
    assert v.status == "correct", v.message
    assert v.env.first_call == "alone"
    assert v.phases_s["wait_device"] >= 4.0, v.phases_s
    plain = evaluate(TASK, CAND, device="cpu", trials=1, timing=False, lock_scope="timing", cache_dir=cache_dir)
    assert plain.status == "correct" and plain.env.first_call is None
    held_all = evaluate(TASK, CAND, device="cpu", trials=1, timing=False, lock_scope="device", cache_dir=cache_dir)
    assert held_all.status == "correct" and held_all.env.first_call == "alone"  # the job held the device throughout


def test_which_candidates_may_autotune():
    from kernelcraft.candidate import autotunes

    assert autotunes("import triton\n@triton.autotune(configs=[], key=['n'])\n@triton.jit\ndef k(): pass\n")
    assert autotunes("import torch\nf = torch.compile(g, mode='max-autotune')\n")
    assert autotunes("import torch\n@torch.compile\ndef f(x): return x\n")
    assert autotunes("from torch import compile\nf = compile(g)\n")
    assert autotunes("import torch\ntorch.backends.cudnn.benchmark = True\n")
    assert not autotunes("import torch, re\npat = re.compile('x')\nclass ModelNew: pass\n")


def test_how_a_tuning_candidates_first_call_holds_the_device():
    from kernelcraft.candidate import first_call_hold

    assert first_call_hold("import torch\nf = torch.compile(g)\n") == "tuning"  # inductor's benchmarkers: hooked
    assert first_call_hold("import triton\n@triton.autotune(configs=[], key=['n'])\n@triton.jit\ndef k(): pass\n") \
        == "tuning"
    assert first_call_hold("import torch\ntorch.backends.cudnn.benchmark = True\nf = torch.compile(g)\n") == "call"
    assert first_call_hold("import torch\nclass ModelNew: pass\n") is None
