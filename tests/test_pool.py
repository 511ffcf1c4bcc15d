"""The local pool: 2 timing slots with crashing candidates in the middle lose nothing; build slots compile
extension candidates before a timing slot sees them (and a cache hit skips the build stage); scheduler
failures, stalls and shutdown all still end in verdicts.

Real evaluations use tiny CPU tasks without timing. The scheduler-logic tests use a fake backend (no worker
processes), so they take milliseconds.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from kernelcraft.protocol import ProtocolError
from kernelcraft.serve.pool import LocalBackend, Pool, gpu_slots
from kernelcraft.judge.caller.runner import WorkerOutcome
from kernelcraft.verdict import Verdict

FIXTURES = Path(__file__).parent / "fixtures"
TINY = FIXTURES / "tasks" / "tiny_elementwise.py"
QUICK = dict(timing=False, trials=2, timeout_s=30.0)


def test_two_workers_crashes_in_the_middle_lose_nothing(cache_dir):
    cands = ["legit/torch_elementwise.py", "faults/segfault_forward.py", "faults/value_mismatch.py",
             "faults/os_exit_forward.py", "faults/no_modelnew.py", "legit/torch_elementwise.py"]
    expect = [("correct", []), ("runtime_error", ["crashed"]), ("incorrect", ["value_mismatch"]),
              ("runtime_error", ["crashed"]), ("compile_error", ["no_modelnew"]), ("correct", [])]
    with Pool("cpu", per_device=2, build_workers=1, **QUICK) as pool:
        seen = list(pool.stream([(TINY, FIXTURES / c) for c in cands]))
        stats = pool.stats()
    assert sorted(i for i, _ in seen) == list(range(len(cands))), "every submission answered exactly once"
    got = {i: (v.status, v.reasons) for i, v in seen}
    assert [got[i] for i in range(len(cands))] == expect, got
    assert stats["completed"] == len(cands) and stats["queue_depth"] == 0 and stats["harness_errors"] == 0
    assert stats["timing_slots"] == ["cpu", "cpu"] and stats["throughput_per_min"] > 0
    assert all(v.task.endswith("tiny_elementwise.py") and v.device == "cpu" for _, v in seen)
    ok = dict(seen)[0]
    # where the worker's time went: start-up, then each phase it announced, up to its result
    assert list(ok.phases_s)[:2] == ["spawn", "reference"] and "check" in ok.phases_s, ok.phases_s
    assert all(s >= 0 for s in ok.phases_s.values()) and 0 < sum(ok.phases_s.values()) <= ok.wall_s


def test_phase_durations_and_gpu_slots():
    out = WorkerOutcome(phases=[("reference", 5.0), ("import", 5.5), ("check", 6.0), ("time", 7.5), ("end", 8.0)])
    assert out.durations() == {"spawn": 5.0, "reference": 0.5, "import": 0.5, "check": 1.5, "time": 0.5}
    assert WorkerOutcome().durations() == {}
    # enough workers starting up beside the one on the device, by cores per GPU, within 2..12 (spawned) or
    # 2..4 (forked: start-up is short)
    spawned = [gpu_slots(1, c, forked=False) for c in (16, 2, 64)] + [gpu_slots(8, 128, False), gpu_slots(4, 16, False)]
    assert spawned == [10, 2, 12, 10, 2]
    forked = [gpu_slots(1, c, forked=True) for c in (16, 2, 64)] + [gpu_slots(8, 128, True), gpu_slots(4, 16, True)]
    assert forked == [4, 2, 4, 4, 2]


class RecordingBackend(LocalBackend):
    """The real local backend, recording which kind of slot ran which candidate."""

    def __init__(self, cache_dir):
        super().__init__(cache_dir)
        self.calls: list[tuple[str, str]] = []

    def build_slot(self, index):
        run = super().build_slot(index)
        return lambda cand, arch, opts: (self.calls.append(("build", cand.sha256)), run(cand, arch, opts))[1]

    def timing_slot(self, device):
        run = super().timing_slot(device)
        return lambda task, cand, opts: (self.calls.append(("time", cand.sha256)), run(task, cand, opts))[1]


def test_build_slots_compile_before_timing_and_hits_skip_the_build(cache_dir):
    """A C++ load_inline candidate is compiled by a build slot; the timing slot finds it built. Submitted
    again, it skips the build stage entirely. (Cold, the C++ build takes ~30-40 s on 2 cores; in a full run
    test_build_cache has usually built it already and the build slot finds it in the cache.)"""
    cand = FIXTURES / "legit" / "cpp_inline_elementwise.py"
    backend = RecordingBackend(cache_dir)
    with Pool("cpu", per_device=1, build_workers=1, backend=backend, **QUICK) as pool:
        first = pool.submit(TINY, cand).result(timeout=600)
        second = pool.submit(TINY, cand).result(timeout=120)
        plain = pool.submit(TINY, FIXTURES / "legit" / "torch_elementwise.py").result(timeout=120)
        stats = pool.stats()
    for v in (first, second, plain):
        assert v.status == "correct", f"{v.status}/{v.reasons}: {v.message}"
    kinds = [k for k, _ in backend.calls]
    assert kinds == ["build", "time", "time", "time"], backend.calls  # built once, then cache hits
    assert first.build_s < 10 and second.build_s < 10, "the timing slot should find the build done"
    assert stats["build_cache"]["builds"] == 1 and stats["build_cache"]["hits"] == 1
    assert stats["build_cache"]["hit_rate"] == 0.5
    assert list((Path(cache_dir) / "prebuilt").iterdir()), "a prebuilt marker was left"


# -- scheduler logic, with a fake backend ------------------------------------------------------------

def _cand(tag: str) -> str:
    return (f"# {tag}\nimport torch.nn as nn\n\n"
            "class ModelNew(nn.Module):\n    def forward(self, a, b):\n        return a\n")


def _verdict(task, cand, status="correct", **kw) -> Verdict:
    return Verdict(task=task.name, candidate_sha256=cand.sha256, device="cpu", status=status, **kw)


class FakeBackend:
    """Timing: a candidate tagged RAISE raises, HANG blocks until released, SLOW sleeps; build: a
    candidate mentioning load_inline and BROKEN fails to compile."""

    def __init__(self, cache_dir):
        self.cache_dir = cache_dir
        self.release = threading.Event()
        self.builds = 0
        self.timed: list[str] = []

    def build_slot(self, index):
        def run(cand, arch, opts):
            self.builds += 1
            if "BROKEN" in cand.source:
                return _verdict(type("T", (), {"name": "<prebuild>"}), cand, "compile_error",
                                reasons=["build_failed"], message="error: expected ';'")
            return None
        return run

    def timing_slot(self, device):
        def run(task, cand, opts):
            tag = cand.source.split("\n", 1)[0][2:]
            if tag.startswith("RAISE"):
                raise OSError("disk on fire")
            if tag.startswith("HANG"):
                self.release.wait(30)
            if tag.startswith("SLOW"):
                time.sleep(0.5)
            self.timed.append(tag)
            return _verdict(task, cand)
        return run

    def arch(self, device):
        return None

    def discard(self, run):
        pass

    def close(self):
        self.release.set()


def test_scheduler_failures_and_stalls_become_verdicts(tmp_path):
    backend = FakeBackend(tmp_path)
    pool = Pool("cpu", per_device=2, build_workers=1, backend=backend, stall_s=1.0)
    try:
        tags = ["ok-1", "RAISE", "HANG", "ok-2", "ok-3", "ok-4"]
        verdicts = pool.map([(TINY, _cand(t)) for t in tags])
        by_tag = dict(zip(tags, verdicts))
        assert by_tag["RAISE"].status == "runtime_error" and by_tag["RAISE"].reasons == ["harness_error"]
        assert "OSError: disk on fire" in by_tag["RAISE"].message
        assert by_tag["HANG"].status == "timeout" and by_tag["HANG"].reasons == ["timeout", "harness_error"]
        assert "slot was replaced" in by_tag["HANG"].message
        assert all(by_tag[t].status == "correct" for t in tags if t.startswith("ok"))
        s = pool.stats()
        assert s["stalled"] == 1 and s["harness_errors"] == 2 and s["completed"] == len(tags)
        # the stuck slot was replaced: two slots still serve
        more = pool.map([(TINY, _cand(f"ok-more-{i}")) for i in range(4)])
        assert all(v.status == "correct" for v in more)
        backend.release.set()  # the stuck call returns late: its answer is dropped, nothing breaks
        time.sleep(0.2)
        assert pool.stats()["completed"] == len(tags) + 4
    finally:
        pool.close()


def test_build_stage_compile_errors_are_remembered(tmp_path):
    backend = FakeBackend(tmp_path)
    broken = _cand("x") + "# load_inline BROKEN\n"
    fine = _cand("y") + "# load_inline\n"
    with Pool("cpu", per_device=1, build_workers=2, backend=backend) as pool:
        v1 = pool.submit(TINY, broken).result(timeout=10)
        v2 = pool.submit(TINY, broken).result(timeout=10)
        v3 = pool.submit(TINY, fine).result(timeout=10)
        v4 = pool.submit(TINY, fine).result(timeout=10)
        s = pool.stats()
    for v in (v1, v2):
        assert (v.status, v.reasons) == ("compile_error", ["build_failed"]) and v.task.endswith("tiny_elementwise.py")
    assert v3.status == v4.status == "correct"
    assert backend.builds == 2, "each distinct candidate is built once"
    assert s["build_cache"] == {"candidates_with_extensions": 4, "hits": 2, "builds": 2, "hit_rate": 0.5}


def test_bad_options_raise_at_submit_and_close_resolves_the_queue(tmp_path):
    backend = FakeBackend(tmp_path)
    pool = Pool("cpu", per_device=1, build_workers=1, backend=backend)
    with pytest.raises(ProtocolError, match="trails: unknown option"):
        pool.submit(TINY, _cand("a"), trails=3)
    with pytest.raises(ValueError, match="cuda"):
        pool.submit(TINY, _cand("a"), device="cuda")
    with pytest.raises(ValueError, match="mode"):
        pool.submit(TINY, _cand("a"), mode="lenient")
    futures = [pool.submit(TINY, _cand(f"SLOW-{i}")) for i in range(4)]
    time.sleep(0.1)
    pool.close(cancel=True)
    verdicts = [f.result(timeout=10) for f in futures]
    assert verdicts[0].status == "correct"
    assert any("shut down" in v.message for v in verdicts[1:])
    with pytest.raises(RuntimeError, match="closed"):
        pool.submit(TINY, _cand("late"))
