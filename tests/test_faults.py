"""Faulty candidates (tests/fixtures/faults/*.py, CPU ones): each gets exactly the verdict its header names,
the caller survives every one of them, and the worker's whole process group dies with it.

A fixture is data: its leading comment lines are a header,

    # expect: STATUS/REASON — what the candidate does
    # task: tiny_elementwise.py            (a file under tests/fixtures/tasks/)
    # options: {"timeout_s": 5}            (optional: extra keyword arguments for evaluate)
    # message: REGEX                       (optional: the verdict's message must match, re.search)

All CPU fault fixtures are evaluated once per module, two at a time (the failing C++ build takes ~30 s and
runs beside the quick ones); the parametrized tests then check one verdict each.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import recorded_pid
from fixture_header import read_header
from kernelcraft.evaluate import evaluate, evaluate_many

FIXTURES = Path(__file__).parent / "fixtures"
FAULTS = FIXTURES / "faults"
LEGIT = FIXTURES / "legit"
TASKS = FIXTURES / "tasks"
PIDFILE_ENV = "KC_TEST_PIDFILE"
SANDBOX_ENV = "KERNELCRAFT_SANDBOX"

# quick options: correctness only, few trials; `timeout_s` is the clock after the build
QUICK = dict(timing=False, trials=2, timeout_s=30.0, build_timeout_s=300.0)


# gpu_*.py: tests/test_gpu_eval.py; guard_*.py (if any) belong to tests/test_guards.py
CPU_FAULTS = sorted(p for p in FAULTS.glob("*.py") if not p.name.startswith(("gpu_", "guard_")))


def wait_dead(record: str, within_s: float = 10.0) -> bool:
    """Is the process a candidate recorded (`recorded_pid`) gone (a zombie nobody reaped yet counts as gone)?"""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if recorded_pid.host_pid(record) is None:
            return True
        time.sleep(0.1)
    return recorded_pid.host_pid(record) is None


def kill_leftover(path: Path) -> None:
    """Kill a process a fixture recorded, if the harness left it alive (never leak it into CI)."""
    try:
        pid = recorded_pid.host_pid(path.read_text())
    except (OSError, ValueError):
        return
    if pid is not None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture(scope="module")
def pidfile(cache_dir, tmp_path_factory):
    """$KC_TEST_PIDFILE: where fixtures that start processes record their pids (PATH, PATH.daemon)."""
    path = tmp_path_factory.mktemp("pids") / "child.pid"
    # the worker inherits the caller's environment. The sandbox is pinned to the library default (rlimits):
    # under bwrap, /tmp is private and pids are namespaced, so the candidate's pid files would mean nothing here
    saved = {k: os.environ.get(k) for k in (PIDFILE_ENV, SANDBOX_ENV)}
    os.environ[PIDFILE_ENV] = str(path)
    os.environ[SANDBOX_ENV] = "rlimits"
    yield path
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    for p in (path, Path(str(path) + ".daemon")):
        kill_leftover(p)


@pytest.fixture(scope="module")
def fault_verdicts(cache_dir, pidfile):
    """{fixture name: (verdict, seconds)} for every CPU fault fixture, evaluated two at a time."""

    def one(path: Path):
        head = read_header(path)
        t0 = time.monotonic()
        v = evaluate(TASKS / head["task"], path, **{**QUICK, **head["options"]})
        return path.name, (v, time.monotonic() - t0)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(one, CPU_FAULTS))


def test_fault_fixtures_exist_and_have_headers():
    assert len(CPU_FAULTS) >= 15
    for p in CPU_FAULTS:
        head = read_header(p)
        assert head["status"] in ("incorrect", "compile_error", "runtime_error", "timeout", "rejected"), p.name
        assert head["reason"], f"{p.name}: a fault fixture must name its reason code"
        assert (TASKS / head["task"]).is_file(), p.name


@pytest.mark.parametrize("path", CPU_FAULTS, ids=lambda p: p.stem)
def test_fault_verdict(path, fault_verdicts):
    head = read_header(path)
    v, _ = fault_verdicts[path.name]
    detail = f"{path.name}: got {v.status}/{v.reasons}: {v.message[:1500]}"
    assert v.status == head["status"], detail
    assert v.reasons == [head["reason"]], detail
    assert v.speedup is None, detail
    assert v.message.strip(), detail
    assert v.candidate_sha256 == hashlib.sha256(path.read_text().encode()).hexdigest()
    assert v.task.endswith(head["task"])
    assert v.device == "cpu"
    assert v.wall_s > 0
    if head["message"]:
        assert re.search(head["message"], v.message), detail
    rec = v.to_json()
    assert rec["status"] == head["status"] and rec["speedup"] is None
    json.dumps(rec)  # serialisable


def test_build_failure_message_is_trimmed(fault_verdicts):
    v, _ = fault_verdicts["build_failed_cpp.py"]
    assert v.status == "compile_error" and v.reasons == ["build_failed"], v.message
    # the compiler's own error line, with its position in the generated source ...
    assert re.search(r"main\.cpp:\d+:\d+: error: expected .,. or .;. before .return.", v.message), v.message
    # ... and not the build noise: command lines, ninja chatter, hundreds of lines of output
    assert "-isystem" not in v.message and "ninja: build stopped" not in v.message, v.message
    assert len(v.message.splitlines()) <= 45, v.message
    assert len(v.message) < 6000
    assert v.build_s > 0.5, "the failed compile's time is reported as build time"


def test_segfault_is_crashed_with_signal_named(fault_verdicts):
    v, _ = fault_verdicts["segfault_forward.py"]
    assert (v.status, v.reasons) == ("runtime_error", ["crashed"]), v.message
    assert "segmentation fault" in v.message.lower(), v.message


def test_exceptions_name_the_candidate(fault_verdicts):
    for name, text in (("exception_forward.py", "ValueError: kc-test: boom in forward"),
                       ("exception_init.py", "RuntimeError: kc-test: boom in __init__"),
                       ("exception_import.py", "ImportError: kc-test: boom at import")):
        v, _ = fault_verdicts[name]
        assert text in v.message, (name, v.message)
        assert "candidate line" in v.message or "line" in v.message, (name, v.message)


def test_timeout_kills_worker_process_group(fault_verdicts, pidfile):
    v, seconds = fault_verdicts["infinite_loop_forward.py"]
    assert (v.status, v.reasons) == ("timeout", ["timeout"]), v.message
    assert v.speedup is None and v.timing is None
    # killed about when the 5 s run clock ran out: not before, and not much later
    assert 5.0 <= seconds < 60.0, seconds
    assert pidfile.is_file(), "the candidate should have recorded its child's pid before looping"
    record = pidfile.read_text()
    recorded_pid.parse(record)
    assert wait_dead(record), f"the candidate's `sleep 1000` child ({record}) outlived the timed-out worker"


def test_process_escaping_the_process_group_is_killed_and_rejected(fault_verdicts, pidfile):
    """A child that leaves the worker's process group (fork + setsid) is out of reach of killpg. It must still
    not outlive the evaluation, and a candidate that leaves processes running is `thread_injection`."""
    v, _ = fault_verdicts["escaping_daemon.py"]
    daemon = Path(str(pidfile) + ".daemon")
    assert daemon.is_file(), f"the candidate's child should have recorded its pid ({v.status}: {v.message[:500]})"
    record = daemon.read_text()
    recorded_pid.parse(record)
    try:
        assert wait_dead(record, within_s=5), f"the candidate's setsid() child ({record}) outlived its worker"
    finally:
        kill_leftover(daemon)
    assert (v.status, v.reasons) == ("rejected", ["thread_injection"]), f"{v.status}/{v.reasons}: {v.message}"


def test_import_sleep_is_killed_by_build_clock(fault_verdicts):
    v, seconds = fault_verdicts["sleep_at_import.py"]
    assert (v.status, v.reasons) == ("timeout", ["timeout"]), v.message
    assert 8.0 <= seconds < 60.0, seconds


def test_fault_evaluations_are_fast(fault_verdicts):
    """Nothing but the timeout and the build waits long: a crash is noticed at once, not at a time limit."""
    for name, (v, seconds) in fault_verdicts.items():
        if name in ("infinite_loop_forward.py", "build_failed_cpp.py", "sleep_at_import.py"):
            continue
        assert seconds < 25, (name, seconds, v.status)


def test_caller_survives_faults_and_next_evaluation_is_correct(fault_verdicts, cache_dir):
    # this process has just lived through segfaults, os._exit, sys.exit and a timeout in its workers
    assert len(fault_verdicts) == len(CPU_FAULTS)
    v = evaluate(TASKS / "tiny_elementwise.py", LEGIT / "torch_elementwise.py", **QUICK)
    assert v.status == "correct", v.message
    assert v.reasons == [] and v.correctness.passed == v.correctness.trials == 2


def test_evaluate_many_mixed_good_and_crashing_in_order(cache_dir):
    task = TASKS / "tiny_elementwise.py"
    names = [LEGIT / "torch_elementwise.py", FAULTS / "segfault_forward.py", LEGIT / "own_get_inputs.py",
             FAULTS / "os_exit_forward.py", FAULTS / "exception_forward.py", FAULTS / "value_mismatch.py",
             LEGIT / "torch_elementwise.py"]
    expected = [("correct", []), ("runtime_error", ["crashed"]), ("correct", []), ("runtime_error", ["crashed"]),
                ("runtime_error", ["exception"]), ("incorrect", ["value_mismatch"]), ("correct", [])]
    verdicts = evaluate_many([(task, p) for p in names], max_workers=2, **QUICK)
    assert len(verdicts) == len(names)
    got = [(v.status, v.reasons) for v in verdicts]
    assert got == expected, [(p.name, g) for p, g in zip(names, got)]
    for p, v in zip(names, verdicts):
        assert v.candidate_sha256 == hashlib.sha256(p.read_text().encode()).hexdigest(), p.name
