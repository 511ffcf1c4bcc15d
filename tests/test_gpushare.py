"""Admission of a process's jobs to a GPU by the device memory their task is known to take (`gpushare`): the
footprints learned from the judge's reports, kept across runs, and the order jobs enter in."""
import json
import threading
import time

from kernelcraft.judge.caller import gpushare, runner, warm
from kernelcraft.judge.caller.gpushare import Footprints, Share

GIB = 1 << 30


def _holder(share: Share, need: int, log: list, name: str, release: threading.Event) -> threading.Thread:
    def hold() -> None:
        with share.shared(need):
            log.append(name)
            release.wait(10)
    t = threading.Thread(target=hold, daemon=True)
    t.start()
    return t


def test_a_job_whose_footprint_does_not_fit_waits_and_later_arrivals_queue_behind_it():
    s = Share()
    s.learn_total(100 * GIB)  # room for 90 GiB of known footprints
    log, release_a, release_rest = [], threading.Event(), threading.Event()
    a = _holder(s, 60 * GIB, log, "a", release_a)
    time.sleep(0.2)
    b = _holder(s, 40 * GIB, log, "b", release_rest)  # 60 + 40 > 90: waits for a
    time.sleep(0.2)
    c = _holder(s, 1 * GIB, log, "c", release_rest)  # would fit now, but b came first
    time.sleep(0.3)
    assert log == ["a"]
    release_a.set()
    a.join(5)
    time.sleep(0.3)
    assert log == ["a", "b", "c"]  # b in once a left; c fits beside b
    release_rest.set()
    b.join(5), c.join(5)
    assert s.readers == 0 and s.committed == 0


def test_jobs_that_fit_share_the_gpu_and_unknown_footprints_enter_on_trust():
    s = Share()
    s.learn_total(100 * GIB)
    log, release = [], threading.Event()
    ts = [_holder(s, 30 * GIB, log, f"known{i}", release) for i in range(3)]  # 90 GiB: all three fit
    time.sleep(0.3)
    ts.append(_holder(s, 0, log, "unknown", release))  # a task never measured: as before, on trust
    time.sleep(0.3)
    assert sorted(log) == ["known0", "known1", "known2", "unknown"]
    release.set()
    for t in ts:
        t.join(5)


def test_a_footprint_larger_than_the_budget_runs_alone_and_nothing_is_refused_before_the_gpu_is_known():
    s = Share()
    log, release = [], threading.Event()
    ts = [_holder(s, 500 * GIB, log, f"x{i}", release) for i in range(2)]  # the GPU's size unknown yet: no refusal
    time.sleep(0.3)
    assert sorted(log) == ["x0", "x1"]
    release.set()
    for t in ts:
        t.join(5)
    s.learn_total(100 * GIB)
    log.clear()
    release_big, release_small = threading.Event(), threading.Event()
    big = _holder(s, 120 * GIB, log, "big", release_big)  # alone it enters, whatever it needs
    time.sleep(0.2)
    small = _holder(s, 1 * GIB, log, "small", release_small)
    time.sleep(0.3)
    assert log == ["big"]
    release_big.set()
    big.join(5)
    time.sleep(0.3)
    assert log == ["big", "small"]
    release_small.set()
    small.join(5)


def test_footprints_keep_the_largest_peak_and_survive_the_process(tmp_path):
    path = tmp_path / gpushare.FOOTPRINTS_FILE
    f = Footprints(path)
    f.learn("task-a", 10 * GIB)
    f.learn("task-a", 4 * GIB)  # a smaller peak never shrinks it
    f.learn("task-b", 2 * GIB)
    f.learn(None, GIB), f.learn("task-c", 0)  # nothing to learn
    assert (f.need("task-a"), f.need("task-b"), f.need("task-c"), f.need(None)) == (10 * GIB, 2 * GIB, 0, 0)
    other = Footprints(path)  # another process on the same cache root
    other.learn("task-c", 3 * GIB)
    again = Footprints(path)
    assert (again.need("task-a"), again.need("task-c")) == (10 * GIB, 3 * GIB)  # merged, not overwritten
    path.write_text("{torn")
    assert Footprints(path).need("task-a") == 0  # a torn file: admission starts on trust
    path.write_text(json.dumps({"task-a": "lots", "task-b": -1, "task-d": 5}))
    assert Footprints(path).known == {"task-d": 5}


def _fake_run(peaks: dict, log: list, gates: dict):
    """A `runner._run` whose job reports the device peak `peaks[name]` (and a 100 GiB GPU), after `gates[name]`."""
    def run(job, work_dir, timeout_s, build_timeout_s, warm_key, reuse, root=None, visible_gpu=None):
        out = runner.WorkerOutcome(start="fork")
        log.append(("start", job["name"]))
        if job["name"] in gates:
            gates[job["name"]].wait(10)
        out.result = {"status": "correct", "reasons": [], "message": "",
                      "device_peak": {"bytes": peaks[job["name"]], "total": 100 * GIB}}
        runner.take_device_peak(out)  # as `_run` does with the worker's report
        log.append(("end", job["name"]))
        return out
    return run


def test_the_runner_learns_a_task_footprint_and_admits_its_next_jobs_by_it(monkeypatch, tmp_path):
    monkeypatch.setattr(warm, "discard_device", lambda d: 0)
    monkeypatch.setattr(gpushare, "_SHARES", {})
    monkeypatch.setattr(gpushare, "_FOOTPRINTS", {})
    log, gates = [], {}
    monkeypatch.setattr(runner, "_run", _fake_run({"first": 70 * GIB, "a": 70 * GIB, "b": 70 * GIB}, log, gates))
    first = runner.run_worker({"name": "first"}, tmp_path, tmp_path, "0", 10, 10, memory_key="big-task")
    assert first.device_peak == 70 * GIB and "device_peak" not in first.result
    assert gpushare.footprints(tmp_path).need("big-task") == 70 * GIB
    assert json.loads((tmp_path / gpushare.FOOTPRINTS_FILE).read_text()) == {"big-task": 70 * GIB}
    log.clear()
    gates["a"] = threading.Event()
    ta = threading.Thread(target=runner.run_worker, args=({"name": "a"}, tmp_path, tmp_path, "0", 10, 10),
                          kwargs={"memory_key": "big-task"})
    ta.start()
    time.sleep(0.2)
    tb = threading.Thread(target=runner.run_worker, args=({"name": "b"}, tmp_path, tmp_path, "0", 10, 10),
                          kwargs={"memory_key": "big-task"})
    tb.start()
    time.sleep(0.3)
    assert log == [("start", "a")]  # 70 + 70 GiB do not fit in 90% of 100: b waits for a to exit
    gates["a"].set()
    ta.join(5), tb.join(5)
    assert log == [("start", "a"), ("end", "a"), ("start", "b"), ("end", "b")]


def test_a_footprint_that_let_its_job_be_crowded_out_grows(monkeypatch, tmp_path):
    monkeypatch.setattr(warm, "discard_device", lambda d: 0)
    monkeypatch.setattr(gpushare, "_SHARES", {})
    monkeypatch.setattr(gpushare, "_FOOTPRINTS", {})
    gpushare.footprints(tmp_path).learn("task", 10 * GIB)
    other_in, release = threading.Event(), threading.Event()
    calls = []

    def run(job, work_dir, timeout_s, build_timeout_s, warm_key, reuse, root=None, visible_gpu=None):
        out = runner.WorkerOutcome(start="fork")
        if job["name"] == "other":
            other_in.set()
            release.wait(10)
            out.result = {"status": "correct", "reasons": [], "message": ""}
            return out
        calls.append(job["name"])
        if len(calls) == 1:
            other_in.wait(10)
            threading.Timer(0.2, release.set).start()
            out.result = {"status": "runtime_error", "reasons": ["out_of_memory"], "message": "CUDA out of memory"}
        else:
            out.result = {"status": "correct", "reasons": [], "message": ""}
        return out

    monkeypatch.setattr(runner, "_run", run)
    t = threading.Thread(target=runner.run_worker, args=({"name": "other"}, tmp_path, tmp_path, "0", 10, 10))
    t.start()
    other_in.wait(10)
    got = runner.run_worker({"name": "job"}, tmp_path, tmp_path, "0", 10, 10, memory_key="task")
    t.join(5)
    assert got.crowded_out and got.result["status"] == "correct" and calls == ["job", "job"]
    assert gpushare.footprints(tmp_path).need("task") == int(10 * GIB * runner.CROWDED_NEED_GROWTH)


def test_an_arrival_that_stops_waiting_does_not_hold_up_those_behind_it():
    import signal

    import pytest

    s = Share()
    s.learn_total(100 * GIB)
    log, release = [], threading.Event()
    a = _holder(s, 80 * GIB, log, "a", release)
    time.sleep(0.2)

    def interrupt(signum, frame):
        raise TimeoutError("stopped waiting")

    old = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(TimeoutError):
            with s.shared(80 * GIB):  # does not fit beside a: waits, then is interrupted
                pass
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    c = _holder(s, 5 * GIB, log, "c", release)  # fits beside a, and is not kept behind the arrival that left
    time.sleep(0.3)
    assert log == ["a", "c"]
    release.set()
    a.join(5), c.join(5)
    assert s.readers == 0 and s.committed == 0 and not s.abandoned


def test_an_estimate_stands_in_until_the_first_report_replaces_it(tmp_path):
    f = Footprints(tmp_path / gpushare.FOOTPRINTS_FILE)
    f.estimate("task", 8 * GIB)
    assert f.need("task") == gpushare.ESTIMATE_PER_IO_BYTE * 8 * GIB + gpushare.JOB_PROCESSES * gpushare.CONTEXT_BYTES
    f.learn("task", 30 * GIB)  # measured: smaller than the estimate, and it stands
    assert f.need("task") == 30 * GIB
    assert json.loads((tmp_path / gpushare.FOOTPRINTS_FILE).read_text()) == {"task": 30 * GIB}  # estimates stay out


def test_the_bench_estimates_footprints_from_its_roofline_work(monkeypatch, tmp_path):
    from kernelcraft.bench.run import estimate_footprints
    from kernelcraft.evaluate import memory_key

    monkeypatch.setattr(gpushare, "_FOOTPRINTS", {})
    protocol = {"trials": 5}
    estimate_footprints(tmp_path, {"a": {"bytes": GIB, "bytes_inputs": GIB}, "b": {"error": "TypeError: ..."}},
                        protocol)
    known = gpushare.footprints(tmp_path)
    assert known.need(memory_key("a", protocol)) == gpushare.ESTIMATE_PER_IO_BYTE * GIB + gpushare.JOB_PROCESSES * gpushare.CONTEXT_BYTES
    assert known.need(memory_key("b", protocol)) == 0  # no work counted: on trust
    assert known.need(memory_key("a", {"trials": 3})) == 0  # another protocol, another key
