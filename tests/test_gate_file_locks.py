"""Evaluations sharing a device never wait on each other through a file lock: a compile cache's lock (inductor's,
a build directory's) may be held by a side that a timer's arrival froze. So a side steps aside only once it holds no
file lock (for at most `worker.LOCK_GRACE_S`), and a timer builds its further processes before it takes the device
alone, never while the others are frozen."""
import fcntl
import socket
import threading
import time

from kernelcraft.evaluate import evaluate
from kernelcraft.judge.caller.runner import cache_root
from kernelcraft.judge.process import freeze
from kernelcraft.judge.speed.gate import DeviceGate

TASK = "tiny/level1/relu"

# built under a lock the way a compile cache builds: the lock taken, held for the build, let go
BUILT_UNDER_A_LOCK = '''
import fcntl, pathlib, torch, torch.nn as nn
LOCK, BUILT = {lock!r}, pathlib.Path({built!r})
class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        with open(LOCK, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            fcntl.flock(f, fcntl.LOCK_UN)
        with open(BUILT, "a") as f:
            f.write("built\\n")
    def forward(self, x):
        return torch.relu(x)
'''

# its first call holds a lock for a while (`holding` appears once it has it, `released` once it let go)
HOLDS_A_LOCK = '''
import fcntl, pathlib, time, torch, torch.nn as nn
LOCK, HOLDING, RELEASED = {lock!r}, pathlib.Path({holding!r}), pathlib.Path({released!r})
class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = True
    def forward(self, x):
        if self.first:
            self.first = False
            with open(LOCK, "a") as f:
                fcntl.flock(f, fcntl.LOCK_EX)
                HOLDING.write_text("")
                time.sleep(2.0)
                fcntl.flock(f, fcntl.LOCK_UN)
            RELEASED.write_text("")
        return torch.relu(x)
'''


def _device_lock(cache_dir):
    return cache_root(cache_dir) / "locks" / f"cpu-{socket.gethostname()}.lock"


def _wait_for(cond, limit_s=120.0) -> bool:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return False


def test_a_timer_builds_its_processes_before_it_takes_the_device_alone(cache_dir, tmp_path):
    """A neighbour's build holds the cache lock the candidate's processes take when built. Once the first process is
    built, the neighbour takes that lock and, as a frozen side does, keeps it while a timer holds the device (for 3 s
    if none comes). The candidate's further processes (3 on a CPU) wait for it beside the neighbour, then the timed
    rounds run: a correct verdict. Built under the exclusive hold they would wait for the neighbour, which waits for
    their timer: a timeout."""
    lock, built = tmp_path / "cache.lock", tmp_path / "built"
    gate = DeviceGate(str(_device_lock(cache_dir)))
    seen: dict = {}

    def neighbour():
        gate.share()
        if not _wait_for(lambda: built.exists()):
            return
        with open(lock, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            t0 = time.monotonic()
            while time.monotonic() - t0 < 3.0:
                if gate.wanted():  # frozen: the lock stays taken until the timer is done
                    seen["stepped_aside_after_s"] = time.monotonic() - t0
                    gate.step_aside()
                    break
                time.sleep(0.02)
            fcntl.flock(f, fcntl.LOCK_UN)
        gate.close()

    t = threading.Thread(target=neighbour)
    t.start()
    try:
        v = evaluate(TASK, BUILT_UNDER_A_LOCK.format(lock=str(lock), built=str(built)), device="cpu", trials=1,
                     timeout_s=40.0, lock_scope="timing", processes=3, cache_dir=cache_dir)
    finally:
        t.join()
    assert v.status == "correct", v.message
    assert built.read_text().count("built") >= 3  # every process was built
    assert "stepped_aside_after_s" not in seen, seen  # no timer came while the neighbour held the lock


def test_a_side_holding_a_file_lock_steps_aside_once_it_lets_go(cache_dir, tmp_path):
    """A timer arrives while the candidate's first call holds a lock: the side runs on until it lets go (2 s, well
    inside `LOCK_GRACE_S`) and only then is frozen and the device handed over; the verdict is correct."""
    lock, holding, released = tmp_path / "cache.lock", tmp_path / "holding", tmp_path / "released"
    src = HOLDS_A_LOCK.format(lock=str(lock), holding=str(holding), released=str(released))
    got: dict = {}

    def run():
        got["v"] = evaluate(TASK, src, device="cpu", trials=1, timing=False, timeout_s=40.0, lock_scope="timing",
                            cache_dir=cache_dir)

    ev = threading.Thread(target=run)
    ev.start()
    try:
        assert _wait_for(lambda: holding.exists()), "the candidate never took its lock"
        gate = DeviceGate(str(_device_lock(cache_dir)))
        gate.exclusive()
        released_when_alone = released.exists()
        gate.close()
    finally:
        ev.join()
    v = got["v"]
    assert v.status == "correct", v.message
    assert released_when_alone  # the side was not frozen holding the lock


def test_lock_holders_are_read_from_proc_locks(tmp_path):
    import os

    assert not freeze.holds_lock([os.getpid()])
    with open(tmp_path / "l", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        assert freeze.holds_lock([os.getpid()]) and not freeze.holds_lock([os.getpid() + 10_000_000])
        fcntl.flock(f, fcntl.LOCK_UN)
    assert not freeze.holds_lock([os.getpid()])
