"""A first call that may autotune through inductor or Triton (judge/process/tuning.py): it shares the device while it
compiles and asks for the device alone at the trusted libraries' first benchmark, once; the hooks are gone after
the call; an ask anywhere else is a wire violation (hacks/ask_alone_outside_first_call.py)."""
import fcntl
import importlib
import importlib.util
import socket
import threading
import time

import pytest

from kernelcraft.evaluate import evaluate
from kernelcraft.judge.caller.runner import cache_root
from kernelcraft.judge.process import tuning

TASK = "tiny/level1/relu"

# stands for a `torch.compile` candidate: its compile (CPU work, marked by a file) first, then inductor benchmarks
# a kernel's configurations (here on a CPU, where the benchmark itself fails: the ask comes before it)
TUNED = '''
import pathlib, time
import torch, torch.nn as nn
from torch._inductor.runtime.benchmarking import benchmarker
MARK = pathlib.Path({mark!r})
class ModelNew(nn.Module):
    """Tuned the way inductor's autotune does, at its first call."""
    def __init__(self):
        super().__init__()
        self.tuned = False
    def forward(self, x):
        if not self.tuned:
            self.tuned = True
            MARK.write_text(str(time.time()))  # "compiling": the device is still shared
            try:
                benchmarker.benchmark_gpu(lambda: None)
            except Exception:
                pass
        return torch.relu(x)
'''


def _share_until(path, mark, held, released, give_s=1.0, limit_s=60.0):
    """A neighbour's checks: the device lock held shared until the candidate's compile has begun (`mark` exists),
    then `give_s` more; `released` says whether that happened before `limit_s`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_SH)
        held.set()
        deadline = time.monotonic() + limit_s
        while not mark.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        released.append(mark.exists())
        time.sleep(give_s)
        fcntl.flock(f, fcntl.LOCK_UN)


def _judge_beside_a_sharer(cache_dir, tmp_path, lock_scope, **share):
    """The TUNED candidate judged on the CPU while a neighbour shares the device (`_share_until`): (verdict, whether
    the neighbour saw the compile begin while it held the device, the mark)."""
    lock = cache_root(cache_dir) / "locks" / f"cpu-{socket.gethostname()}.lock"
    mark = tmp_path / "compiling"
    held, released = threading.Event(), []
    t = threading.Thread(target=_share_until, args=(lock, mark, held, released), kwargs=share)
    t.start()
    held.wait()
    v = evaluate(TASK, TUNED.format(mark=str(mark)), device="cpu", trials=2, timing=False, timeout_s=30.0,
                 lock_scope=lock_scope, cache_dir=cache_dir)
    t.join()
    return v, released, mark


def test_a_compiling_first_call_shares_the_device_until_its_first_benchmark(cache_dir, tmp_path):
    """The candidate's compile runs while a neighbour still holds the device shared (were the whole call alone, it
    could not start until the neighbour gave up); its benchmark then waits for the device alone (on no clock), and
    the verdict says `tuning`."""
    v, released, _ = _judge_beside_a_sharer(cache_dir, tmp_path, "timing")
    assert v.status == "correct", v.message
    assert released == [True], "the first call did not start while the neighbour shared the device"
    assert v.env.first_call == "tuning", v.env
    assert v.phases_s["wait_device"] > 0.0, v.phases_s


def test_a_hold_asks_once_at_the_first_benchmark_and_leaves_no_hook():
    bench = importlib.import_module(tuning.INDUCTOR_BENCHMARKING)
    classes = tuning._subclasses(bench.Benchmarker)
    before = {(c, k): v for c in classes for k, v in vars(c).items()}
    asks = []
    with tuning.FirstCallHold(lambda: asks.append(1)) as hold:
        assert not asks and not hold.asked  # hooked, nothing asked before a benchmark runs
        hooked = [(c, k) for (c, k), v in before.items() if vars(c)[k] is not v]
        assert any(k == "benchmark_gpu" for _, k in hooked), hooked
        assert not any("cpu" in k for _, k in hooked), hooked  # CPU benchmarks never ask
        for _ in range(3):
            try:
                bench.benchmarker.benchmark_gpu(lambda: None)
            except Exception:  # noqa: BLE001 - no GPU here: the ask comes before the benchmark
                pass
    assert asks == [1]
    assert {(c, k): v for c in classes for k, v in vars(c).items()} == before  # every hook undone


def test_triton_benchmarks_are_hooked_where_triton_is_loaded():
    triton_testing = importlib.import_module("triton.testing") if importlib.util.find_spec("triton") else None
    found = tuning.targets()
    if triton_testing is None:
        assert not any(getattr(o, "__name__", "").startswith("triton") for o, _ in found)
        return
    autotuner = importlib.import_module("triton.runtime.autotuner").Autotuner
    found = tuning.targets()
    assert (autotuner, "_bench") in found and (triton_testing, "do_bench") in found, found


def test_a_hold_with_nothing_to_hook_asks_at_once(monkeypatch):
    """Another library version whose benchmarkers are not found: the whole call alone, as for cuDNN's tuning."""
    monkeypatch.setattr(tuning, "targets", lambda: [])
    asks = []
    with tuning.FirstCallHold(lambda: asks.append(1)):
        assert asks == [1]
    assert asks == [1]


def test_a_real_triton_autotune_asks_before_it_benchmarks():
    """A @triton.autotune kernel's first launch (Triton's CPU interpreter: the benchmark itself then fails for want
    of a GPU driver, after the ask) asks once, through the hooks a first call puts in place."""
    pytest.importorskip("triton")
    import triton_interpreter

    proc = triton_interpreter.run("""
        import torch, triton, triton.language as tl
        from kernelcraft.judge.process import tuning

        @triton.autotune(configs=[triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 32})], key=["n"])
        @triton.jit
        def twice(x_ptr, o_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            m = offs < n
            tl.store(o_ptr + offs, tl.load(x_ptr + offs, mask=m) * 2, mask=m)

        x = torch.randn(100)
        o = torch.empty_like(x)
        asks = []
        with tuning.FirstCallHold(lambda: asks.append(1)):
            print("BEFORE", len(asks))  # hooked, not asked yet
            try:
                twice[lambda meta: (triton.cdiv(100, meta["BLOCK"]),)](x, o, 100)
            except Exception:
                pass
        print("ASKS", len(asks))
    """, timeout=300)
    assert "BEFORE 0" in proc.stdout and "ASKS 1" in proc.stdout, proc.stdout + proc.stderr


def test_the_first_call_scope_holds_the_whole_first_call(cache_dir, tmp_path):
    """`lock_scope="first_call"`: the same candidate's compile cannot start while a neighbour shares the device (the
    mark appears only after the neighbour let go), and the verdict says `alone`."""
    v, released, mark = _judge_beside_a_sharer(cache_dir, tmp_path, "first_call", give_s=0.0, limit_s=3.0)
    assert v.status == "correct", v.message
    assert released == [False] and mark.exists()
    assert v.env.first_call == "alone", v.env
