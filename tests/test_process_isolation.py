"""The process isolation's building blocks, each on its own: the seccomp filter, freezing, audits, arenas, the
wire, the PID namespace — and the record a verdict carries. (The attacks themselves are hack fixtures,
tests/fixtures/hacks/*.py, run by test_guards.)
"""
from __future__ import annotations

import ctypes
import errno
import json
import os
import platform
import resource
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import recorded_pid
import torch

from kernelcraft.evaluate import evaluate
from kernelcraft.judge.process import arena, freeze, heap, isolation, procs
from kernelcraft.judge.process.audit import Audit, reference_tampering
from kernelcraft.judge.process.wire import Closed, JudgeEnd, SideEnd

FIXTURES = Path(__file__).parent / "fixtures"
SECCOMP = platform.machine() in ("x86_64", "aarch64")


def _in_child(fn) -> int:
    """Run fn() in a forked child; its return value (0-255) is the exit code."""
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            code = int(fn())
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.WEXITSTATUS(status)


@pytest.mark.skipif(not SECCOMP, reason="seccomp filter only on x86_64/aarch64")
def test_seccomp_filter_fences_off_protected_pids():
    parent = os.getpid()
    bystander = os.fork()
    if bystander == 0:
        time.sleep(30)
        os._exit(0)
    try:
        def child():
            if not isolation.install_filter([parent, bystander]):
                return 10
            results = []
            nr = NR[platform.machine()]
            info = ctypes.create_string_buffer(128)
            ctypes.memmove(info, (ctypes.c_int * 3)(signal.SIGUSR1, 0, -1), 12)  # si_code SI_QUEUE
            for call in (lambda: os.kill(parent, 0), lambda: os.kill(bystander, 0), lambda: os.kill(-1, 0),
                         lambda: os.sched_setaffinity(bystander, {0}), lambda: os.setsid(),
                         lambda: os.setpriority(os.PRIO_PROCESS, bystander, 19),
                         lambda: os.setpriority(os.PRIO_USER, 4242424, 19),  # a whole user's (none: ESRCH)
                         lambda: _syscall(nr["rt_sigqueueinfo"], bystander, signal.SIGUSR1, info),
                         lambda: _syscall(nr["rt_tgsigqueueinfo"], bystander, bystander, signal.SIGUSR1, info),
                         lambda: _syscall(nr["tgkill"], bystander, bystander, 0),
                         lambda: _syscall(nr["kcmp"], os.getpid(), bystander, 0, 0, 0),
                         lambda: _syscall(nr["umount2"], b"/kc-no-such-mount-point", 0)):  # (else ENOENT)
                try:
                    call()
                    results.append(False)
                except PermissionError:
                    results.append(True)
            if not all(results):
                return 20 + results.index(False)
            # what stays allowed: its own process, its own children, its own affinity
            os.kill(os.getpid(), 0)
            os.sched_setaffinity(0, os.sched_getaffinity(0))
            kid = os.fork()
            if kid == 0:
                time.sleep(30)
                os._exit(0)
            os.kill(kid, signal.SIGSTOP)
            # SIGCONT is refused whatever the target (its own child included): only the judge thaws a process
            for call in (lambda: os.kill(kid, signal.SIGCONT), lambda: os.killpg(os.getpgid(kid), signal.SIGCONT),
                         lambda: signal.pthread_kill(__import__("threading").get_ident(), signal.SIGCONT)):
                try:
                    call()
                    return 40
                except PermissionError:
                    pass
            os.kill(kid, signal.SIGKILL)
            os.waitpid(kid, 0)
            return 0

        assert _in_child(child) == 0
    finally:
        os.kill(bystander, signal.SIGKILL)
        os.waitpid(bystander, 0)


NR = {"x86_64": {"rt_sigqueueinfo": 129, "rt_tgsigqueueinfo": 297, "tgkill": 234, "kcmp": 312, "umount2": 166},
      "aarch64": {"rt_sigqueueinfo": 138, "rt_tgsigqueueinfo": 240, "tgkill": 131, "kcmp": 272, "umount2": 39}}


def _syscall(nr: int, *args) -> int:
    """A raw system call; OSError (PermissionError for EPERM) on failure, as os.* calls raise."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(nr, *args) == -1:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e)) if e != errno.EPERM else PermissionError(e, os.strerror(e))
    return 0


def test_freeze_and_thaw_a_child():
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.setsid()
        while True:
            os.write(w, b"x")
            time.sleep(0.005)
    try:
        assert os.read(r, 1) == b"x"  # running (and past its setsid)
        freeze.freeze(pid)
        time.sleep(0.05)
        while True:  # drain what it wrote before it stopped
            os.set_blocking(r, False)
            try:
                if not os.read(r, 4096):
                    break
            except BlockingIOError:
                break
        time.sleep(0.1)
        with pytest.raises(BlockingIOError):
            os.read(r, 4096)  # frozen: nothing new
        freeze.thaw(pid)
        time.sleep(0.1)
        assert os.read(r, 4096)  # running again
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    with pytest.raises(freeze.SideGone):
        freeze.freeze(pid)  # reaped: not a child any more


def test_audit_sees_a_renice_of_the_reference_and_an_adopted_orphan():
    """Played in a forked "judge" (its only children: the two sides), as in a real evaluation."""
    def judge():
        ref = os.fork()
        if ref == 0:
            time.sleep(30)
            os._exit(0)
        cand = os.fork()
        if cand == 0:
            os.setsid()
            time.sleep(30)
            os._exit(0)
        isolation.harden_judge()  # a subreaper: orphans come here
        audit = Audit(os.getpid(), {"reference": ref, "candidate": cand})
        try:
            if audit.problems():
                return 10
            os.setpriority(os.PRIO_PROCESS, ref, 10)
            found = audit.problems()
            if not (found and "re-scheduled" in found[0]):
                return 11
            os.setpriority(os.PRIO_PROCESS, ref, 0) if os.geteuid() == 0 else None
            orphan = os.fork()  # stands in for a candidate's double-forked grandchild, re-parented here
            if orphan == 0:
                time.sleep(30)
                os._exit(0)
            found = audit.problems()
            if not any("detached" in f and str(orphan) in f for f in found):
                return 12
            audit.kill_strays()
            os.waitpid(orphan, 0)
            return 0
        finally:
            for p in (ref, cand):
                os.kill(p, signal.SIGKILL)
                os.waitpid(p, 0)

    assert _in_child(judge) == 0


def test_arena_bytes_cross_to_a_forked_side():
    specs = [arena.TensorSpec((4, 3), (3, 1), "float32"), None, arena.TensorSpec((3, 4), (1, 3), "int64")]
    a = arena.Arena(specs, torch.device("cpu"))
    desc, fds = a.handle()
    mine, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            msg, got = SideEnd(theirs).recv()
            views = arena.attach(msg["arena"], got)
            assert views[1] is None and views[2].stride() == (1, 3)
            views[0].copy_(torch.arange(12, dtype=torch.float32).view(4, 3))
            views[2].fill_(7)
            SideEnd(theirs).send({"type": "ok"})
            code = 0
        finally:
            os._exit(code)
    JudgeEnd(mine).send({"arena": desc}, fds)
    assert JudgeEnd(mine).recv() == {"type": "ok"}
    os.waitpid(pid, 0)
    assert torch.equal(a.tensors[0], torch.arange(12, dtype=torch.float32).view(4, 3))
    assert bool((a.tensors[2] == 7).all())


_HEAP_CALLS = """
import ctypes, resource, sys
from kernelcraft.judge.process import heap
fixed, history = sys.argv[1] == "1", sys.argv[2] == "1"
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]

def calls(n, size=1 << 20):  # minor page faults of n calls
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(n):
        bufs = [libc.malloc(size) for _ in range(8)]
        for b in bufs:
            ctypes.memset(b, 1, size)
        for b in reversed(bufs):
            libc.free(b)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

if fixed and not heap.fix():
    sys.exit(255)
if history:
    calls(1, 8 << 20)
calls(2)
sys.exit(min(calls(10) // 256, 254))
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc thresholds")
def test_fixed_heap_makes_a_calls_page_faults_independent_of_the_process_history():
    """A side's heap settings (`heap.fix`): a call that allocates, writes and frees eight 1 MiB buffers faults
    their pages in during the first calls only, whether or not the process freed larger blocks before (the
    reference's float64 evaluation does). Without them the same calls cost a fresh process 8 MiB of faults every
    time and a process with that history none (glibc's thresholds adapt to what it freed before): the
    reference's own code timed slower as the candidate. Each case runs in a fresh interpreter: a forked child
    would inherit the test process's own malloc history."""
    def steady(fixed: bool, history: bool) -> int:  # MiB faulted in by 10 calls after two warm-up calls
        env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
        return subprocess.run([sys.executable, "-c", _HEAP_CALLS, str(int(fixed)), str(int(history))],
                              env=env, timeout=120).returncode

    # (at most 1 MiB of stray faults: the interpreter's own allocations, a page the kernel took back)
    assert steady(fixed=True, history=False) <= 1 and steady(fixed=True, history=True) <= 1
    assert steady(fixed=False, history=False) >= 10 * 7 and steady(fixed=False, history=True) <= 1


def test_wire_refuses_oversized_and_non_object_frames():
    mine, theirs = socket.socketpair()
    theirs.sendall(struct.pack("!I", 1 << 30))
    with pytest.raises(ValueError):
        JudgeEnd(mine).recv()
    mine, theirs = socket.socketpair()
    data = json.dumps([1, 2]).encode()
    theirs.sendall(struct.pack("!I", len(data)) + data)
    with pytest.raises(ValueError):
        JudgeEnd(mine).recv()
    theirs.close()
    with pytest.raises(Closed):
        JudgeEnd(mine).recv()


def test_verdict_records_the_judges_clock_and_isolation(tmp_path):
    v = evaluate(FIXTURES / "tasks" / "tiny_elementwise.py", FIXTURES / "legit" / "torch_elementwise.py",
                 device="cpu", time_budget_s=0.3, remeasure_above=None, cache_dir=tmp_path)
    assert v.status == "correct", v.message
    t = v.timing
    assert t.clock == "judge" and t.overhead_ms > 0 and t.audits >= 2
    assert t.host_ref_ms > t.ref_ms  # the round trip's overhead was subtracted
    iso = v.env.isolation
    assert iso["non_dumpable"] and iso["subreaper"] and iso["candidate"]["pdeathsig"]
    assert iso["candidate"]["seccomp"] == SECCOMP
    for g in ("separate_processes", "secret_inputs", "inputs_verified", "outputs_poisoned", "frozen_peer",
              "judge_clock", "audits"):
        assert g in v.guards, v.guards


def test_inputs_are_fresh_and_secret_every_evaluation(tmp_path):
    """Two evaluations with the same protocol seed see different inputs (no input is derivable from the seed),
    while the weights stay KernelBench-compatible (identical for the same seed)."""
    cand = tmp_path / "record.py"
    out = tmp_path / "seen.txt"
    cand.write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
        "    def __init__(self, alpha):\n        super().__init__()\n        self.alpha = alpha\n"
        f"        open({str(out)!r}, 'a').write('w ' + repr(float(torch.randn(1))) + '\\n')\n\n"
        "    def forward(self, a, b):\n"
        f"        open({str(out)!r}, 'a').write('x ' + repr(float(a.flatten()[0])) + '\\n')\n"
        "        return self.alpha * a + b\n")
    for _ in range(2):
        v = evaluate(FIXTURES / "tasks" / "tiny_elementwise.py", cand, device="cpu", timing=False, screen=False,
                     partial_trials=0, cache_dir=tmp_path / "cache")  # partial trials repeat most values on purpose
        assert v.status == "correct", v.message
    lines = out.read_text().split("\n")
    weights = {ln for ln in lines if ln.startswith("w ")}
    inputs = [ln for ln in lines if ln.startswith("x ")]
    assert len(weights) == 1, "the same seed gives the same weights"
    # five trials and the unjudged first call (`Evaluation.first_call`) per evaluation, every one on fresh inputs
    assert len(inputs) == 12 and len(set(inputs)) == 12, "every trial of every evaluation sees fresh inputs"


def test_running_threads_reads_stopped_and_running_processes():
    """`freeze.running_threads` (the audit's read-back of the candidate's other processes): a frozen process
    reads as stopped, every thread of it; a running one does not."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.setpgid(0, 0)
        os.write(w, b"x")
        while True:
            pass
    try:
        os.read(r, 1)
        assert freeze.running_threads(pid), "a spinning process is running"
        freeze.freeze(pid)
        assert freeze.running_threads(pid) == []
        freeze.thaw(pid)
        time.sleep(0.05)
        assert freeze.running_threads(pid)
    finally:
        os.killpg(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(r), os.close(w)


def test_candidate_processes_are_timed_interleaved(tmp_path):
    """`processes` = 2: both candidate processes are alive through timing and take turns round by round (not one
    block after the other); each passed a correctness trial; the siblings are gone after the job."""
    task = FIXTURES / "tasks" / "guard_slow.py"
    log = tmp_path / "calls.log"
    cand = "import os\n" + task.read_text().replace("class Model(", "class ModelNew(").replace(
        "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n",
        "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n"
        # each process's PID namespace and pid there (tests/recorded_pid.py): which process made each call
        f"        open({str(log)!r}, 'a').write(os.readlink('/proc/self/ns/pid') + f' {{os.getpid()}}\\n')\n")
    assert "getpid" in cand
    v = evaluate(str(task), cand, device="cpu", processes=2, time_budget_s=0.5, remeasure_above=None,
                 cache_dir=tmp_path / "cache")
    assert v.status == "correct", v.message
    assert v.timing.processes == 2 and len(v.timing.process_speedups) == 2
    pids = log.read_text().splitlines()
    first, second = pids[0], next(p for p in pids if p != pids[0])
    timed = pids[pids.index(second) + 1:]  # after the sibling's own trial
    switches = sum(1 for a, b in zip(timed, timed[1:]) if a != b)
    assert {first, second} <= set(timed) and switches >= 10, (len(timed), switches)
    for record in (first, second):
        assert recorded_pid.host_pid(record) is None, f"candidate process {record} outlived its job"


def test_timing_spans_fresh_candidate_processes(tmp_path):
    """`processes`: the candidate runs in several processes, timed interleaved; the record names each process's
    speedup and the CI contains them all (what makes it reproduce between invocations)."""
    task = FIXTURES / "tasks" / "guard_slow.py"
    cand = task.read_text().replace("class Model(", "class ModelNew(")
    v = evaluate(str(task), cand, device="cpu", processes=3, time_budget_s=0.6, remeasure_above=None,
                 cache_dir=tmp_path / "cache")
    assert v.status == "correct", v.message
    t = v.timing
    assert t.processes == 3 and len(t.process_speedups) == 3
    assert all(t.ci95[0] <= s <= t.ci95[1] for s in t.process_speedups)
    assert t.ci95[0] <= t.within_ci95[0] and t.within_ci95[1] <= t.ci95[1]
    one = evaluate(str(task), cand, device="cpu", processes=1, time_budget_s=0.3, remeasure_above=None,
                   cache_dir=tmp_path / "cache")
    assert one.timing.processes in (1, None) and one.timing.process_speedups is None


@pytest.mark.parametrize("wrong_call, status", [(1, "correct"), (2, "incorrect")])
def test_a_candidate_processs_first_forward_is_not_judged(tmp_path, wrong_call, status):
    """Like the reference's first call (`describe`), every candidate process's first forward (the checked one's and
    each timing sibling's) is left unjudged (`Evaluation.first_call`: a CPU library's first call was inexact on one
    thread). Its second call is the first trial: a wrong answer there is still `incorrect`."""
    cand = tmp_path / "cand.py"
    cand.write_text(f'''import torch
import torch.nn as nn

_calls = [0]  # per process


class ModelNew(nn.Module):
    def __init__(self, alpha: float):
        super().__init__()
        self.alpha = alpha

    def forward(self, a, b):
        _calls[0] += 1
        out = torch.add(b, a, alpha=self.alpha)
        return out * 0 if _calls[0] == {wrong_call} else out
''')
    v = evaluate(FIXTURES / "tasks" / "tiny_elementwise.py", cand, device="cpu", time_budget_s=0.3, processes=3,
                 remeasure_above=None, cache_dir=tmp_path)
    assert v.status == status, v.message
    if status == "correct":
        assert v.timing.processes == 3, v.timing


@pytest.mark.parametrize("oom_call, reason", [(1, "task_error"), (2, "harness_error")])
def test_a_reference_out_of_memory_is_the_tasks_only_before_it_has_run_once(tmp_path, oom_call, reason):
    """A reference that runs out of memory on its first forward (`describe`) does not fit: the task's error. Once it
    has run at the task's size, running out is the judge's (its float64 copies) or a neighbour's on a shared GPU
    (KernelBench's 35_GroupNorm was named `task_error` beside another job holding 43 GiB): `harness_error`, which the
    bench and the pool re-run instead of caching, and which names neither the task nor the candidate."""
    task = tmp_path / "task.py"
    task.write_text((FIXTURES / "tasks" / "tiny_elementwise.py").read_text().replace(
        "    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:\n",
        "    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:\n"
        "        _calls[0] += a.dtype == torch.float32  # the float64 truth runs that OOM are retried cheaper\n"
        "        if _calls[0] == %d:\n"
        "            raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB')\n" % oom_call)
        .replace("class Model(", "_calls = [0]\n\n\nclass Model("))
    assert "_calls[0] += a.dtype" in task.read_text()
    v = evaluate(task, FIXTURES / "legit" / "torch_elementwise.py", device="cpu", timing=False, cache_dir=tmp_path)
    assert v.status == "runtime_error" and v.reasons == [reason], (v.status, v.reasons, v.message)
    assert "out of memory" in v.message


def test_audit_reads_signals_pending_for_the_reference_and_a_reniced_session():
    """The reference holds the signals only another process sends blocked (`isolation.held_signals`): one sent to it
    by thread id stays pending, and the audit names it; so does a renice of its session's autogroup."""
    def judge():
        r, w = os.pipe()
        ref = os.fork()
        if ref == 0:
            os.setsid()  # a session (and autogroup) of its own, as a side has
            signal.pthread_sigmask(signal.SIG_BLOCK, isolation.held_signals())
            os.write(w, b"x")
            time.sleep(30)
            os._exit(0)
        os.read(r, 1)
        audit = Audit(os.getpid(), {"reference": ref})
        try:
            if audit.problems():
                return 10
            _syscall({"x86_64": 200, "aarch64": 130}[platform.machine()], ref, int(signal.SIGRTMIN) + 3)  # tkill
            found = audit.problems()
            if not (found and "signals were sent to the reference" in found[0] and "SIGRTMIN+3" in found[0]):
                return 11
            if reference_tampering(os.getpid(), ref) != found:  # what keeps a warm reference from reuse
                return 12
            if os.path.exists(f"/proc/{ref}/autogroup"):
                with open(f"/proc/{ref}/autogroup", "w") as f:
                    f.write("19")
                if not any("autogroup" in f for f in audit.problems()):
                    return 13
            return 0
        finally:
            os.kill(ref, signal.SIGKILL)
            os.waitpid(ref, 0)

    assert _in_child(judge) == 0


def _namespace_or_skip() -> str:
    kind, note = isolation.probe_namespace()
    if kind is None:
        pytest.skip(f"no PID namespace for a candidate here: {note}")
    return kind


def _nspid(pid: int) -> list[str]:
    status = Path(f"/proc/{pid}/status").read_text()
    return next(ln.split(":", 1)[1].split() for ln in status.splitlines() if ln.startswith("NSpid"))


def test_candidate_side_lives_in_a_pid_namespace_of_its_own(tmp_path):
    """A candidate side from the forker: the second process of a PID namespace whose pid 1 is the forker's init, the
    judge's child all the same (frozen and thawed like any side); inside, /proc shows that namespace only and no pid
    of the judge names anything; an orphan it leaves is adopted by the init, where the audit sees it; ending the
    side ends the namespace."""
    from kernelcraft.judge.process.forker import Forker
    from kernelcraft.judge.tripwires.guards import Reject
    from kernelcraft.judge.process.sideproc import SideProc, end_candidate

    kind = _namespace_or_skip()
    report = tmp_path / "seen.json"
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import json, os, time\n"
        "seen = {'pid': os.getpid(), 'ppid': os.getppid(), 'procs': sorted(int(p) for p in os.listdir('/proc')"
        " if p.isdigit())}\n"
        "for name, call in (('kill', lambda: os.kill(JUDGE, 0)), ('affinity', lambda: os.sched_getaffinity(JUDGE))):\n"
        "    try:\n        call()\n        seen[name] = 'reached'\n"
        "    except OSError as e:\n        seen[name] = e.errno\n"
        "if os.fork() == 0:\n    if os.fork() == 0:\n        time.sleep(30)\n    os._exit(0)\n"
        "os.wait()\n"
        f"open({str(report)!r}, 'w').write(json.dumps(seen))\n")

    def judge():
        isolation.harden_judge()
        forker = Forker.start(close=[])
        side = None
        try:
            probe.write_text(probe.read_text().replace("JUDGE", str(os.getpid())))
            side = SideProc.from_forker(forker, cwd=str(tmp_path), log_path=None, tag=None, protected=[os.getpid()])
            hello = side.request({"cmd": "hello"})["hardening"]
            if hello.get("pid_namespace") != kind or not hello["seccomp"] == SECCOMP:
                return 10
            if side.namespace != kind or _nspid(side.init_pid)[-1] != "1" or len(_nspid(side.pid)) != 2:
                return 11
            try:
                side.request(dict(cmd="import", path=str(probe), device="cpu", cache_dir=str(tmp_path / "cache")))
            except Reject:  # no ModelNew: the probe ran at import
                pass
            seen = json.loads(report.read_text())
            if seen["pid"] != int(_nspid(side.pid)[-1]) or seen["ppid"] != 0 or 1 not in seen["procs"]:
                return 12
            if set(seen["procs"]) != {1, seen["pid"]} or "reached" in seen.values():
                return 13
            audit = Audit(os.getpid(), {"reference": forker.pid, "candidate": side.pid}, {side.pid: side.init_pid})
            orphans = [f for f in audit.problems() if "detached" in f]
            if not orphans:
                return 14
            side.freeze()
            if not freeze.running_threads(side.pid) == []:
                return 15
            side.thaw()
            inside = [side.pid, side.init_pid] + procs.children(side.init_pid)
            end_candidate(side, keep={forker.pid})
            side = None
            time.sleep(0.2)
            if any(Path(f"/proc/{p}").exists() for p in inside):
                return 16
            return 0
        finally:
            if side is not None:
                end_candidate(side, keep={forker.pid})
            forker.close()
            os.kill(forker.pid, signal.SIGKILL)
            os.waitpid(forker.pid, 0)

    assert _in_child(judge) == 0


def test_the_pid_namespace_setting_is_checked(monkeypatch):
    for value, kinds in (("", ("pid", "user")), ("auto", ("pid", "user")), ("off", ()), ("0", ()), ("user", ("user",))):
        monkeypatch.setenv(isolation.PIDNS_SWITCH, value)
        assert isolation.namespace_kinds() == kinds
    monkeypatch.setenv(isolation.PIDNS_SWITCH, "yes please")
    with pytest.raises(ValueError, match="KERNELCRAFT_PIDNS"):
        isolation.namespace_kinds()
    assert "KERNELCRAFT_PIDNS" in isolation.describe()["pid_namespace"]
    monkeypatch.setenv(isolation.PIDNS_SWITCH, "off")
    assert isolation.probe_namespace() == (None, "KERNELCRAFT_PIDNS=off")
