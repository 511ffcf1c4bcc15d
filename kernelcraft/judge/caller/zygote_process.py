"""The zygote process: imports torch and the judge once, then forks a fresh judge process per request.

It never runs candidate code, never initialises CUDA and holds no job. It and its children are child subreapers;
it kills children it did not fork, and all of them when the caller goes away (its control socket closes). Once
idle it imports what most evaluations import (Triton, dynamo, `FORK_SAFE_EXTRAS`), holding requests for a full
worker until then; if that initialised CUDA it exits with `EXTRAS_BROKE_FORK`. The caller's end of the protocol
is `zygote.py`; this module is what `python -m kernelcraft.judge.caller.zygote_process FD` runs.

Rationale: docs/design/judge-caller.md#zygote
"""
from __future__ import annotations

import importlib
import json
import os
import select
import signal
import socket
import sys
import time

from kernelcraft.judge.process.procs import children

NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"  # set in the zygote for good: a child gets the caller's environment
EXTRAS_GRACE_S = 0.2  # after ready, early requests get this long (from the last) before the extras are imported
EXTRAS_BROKE_FORK = 75  # the zygote's exit code when those imports initialised CUDA
# imported among the extras where a forked child shows it safe: inductor's compiler, which every `torch.compile`
# candidate and baseline imports in its prepare phase (median 2.4 s of it on an H200 host judging level 2)
FORK_SAFE_EXTRAS = ("torch._inductor.compile_fx",)
MAX_MSG = 1 << 20
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_NAME = 15


def _subreaper(name: bytes | None = None) -> None:
    """Become a child subreaper (and take `name` as the process name `ps -o comm` and `top` show)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        if name:
            libc.prctl(_PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)
    except Exception:  # noqa: BLE001 - best effort (non-Linux)
        pass


def serve(ctl_fd: int) -> None:
    ctl = socket.socket(fileno=ctl_fd)
    try:
        os.environ[NVML_CHECK] = "1"
        import torch

        from kernelcraft.judge.process import worker  # noqa: F401  (binds clocks, imports torch and the harness)
        why = _fork_unusable(torch)
    except BaseException as e:  # noqa: BLE001
        why = f"import failed: {type(e).__name__}: {e}"
    ctl.send(json.dumps({"ready": why is None, "why": why, "pid": os.getpid()}).encode())
    if why is not None:
        return
    _subreaper(b"kc-zygote")
    live: dict[int, socket.socket] = {}
    last_sweep = 0.0
    held: list | None = []  # requests for a full worker, held until the extras are imported (None: they are)
    try:
        while True:
            readable, _, _ = select.select([ctl], [], [], 0.1 if held is None else 0.0 if held else EXTRAS_GRACE_S)
            if readable:
                try:
                    msg, fds, _, _ = socket.recv_fds(ctl, MAX_MSG, 4)
                except OSError:
                    break
                if not msg:
                    break  # the caller is gone
                if held is not None and not _early(msg):
                    held.append((msg, fds))
                else:
                    _fork_one(msg, fds, ctl, live)
                continue  # take every request already waiting before anything else
            if held is not None:
                why = _import_extras(torch)
                if why is not None:  # held requests see their reply socket close and spawn; forked workers run on
                    print(f"kc-zygote: {why}; no more forks from this zygote", file=sys.stderr, flush=True)
                    os._exit(EXTRAS_BROKE_FORK)  # the caller's `get` sees the code and spawns from then on
                for msg, fds in held:
                    _fork_one(msg, fds, ctl, live)
                held = None
            _reap(live)
            if time.monotonic() - last_sweep > 0.5:
                last_sweep = time.monotonic()
                _kill_orphans(live)
    finally:
        for pid in list(live):
            _killpg(pid)
        _kill_orphans({})


def _early(msg: bytes) -> bool:
    """A request that may be forked before the extras (a build-only job: it needs neither Triton nor dynamo)."""
    try:
        req = json.loads(msg)
    except ValueError:
        return True  # refused at once by `_fork_one`
    return not isinstance(req, dict) or bool(req.get("early"))


def _import_extras(torch) -> str | None:
    """What most evaluations import sooner or later, imported once here while the zygote is idle; returns why
    forking no longer works if the imports initialised CUDA (then the zygote must stop)."""
    try:
        import triton  # noqa: F401  (Triton candidates import it; 0.2-0.5 s each otherwise)
    except Exception:  # noqa: BLE001
        pass
    try:  # the reference's float64 run (judge/correctness/fp64.py) uses a dispatch mode, whose first use imports dynamo:
        import torch._dynamo  # noqa: F401  (~1.4 s per fresh reference otherwise; torch.compile candidates too)
    except Exception:  # noqa: BLE001
        pass
    for name in FORK_SAFE_EXTRAS:
        _import_if_fork_safe(name, torch)
    return _fork_unusable(torch)


def _import_if_fork_safe(name: str, torch) -> None:
    """Import `name` here only if a forked child that imports it first can still use CUDA after a fork: an import
    that initialised CUDA would end this zygote's forks (`EXTRAS_BROKE_FORK`) for every evaluation after it. Without
    a visible GPU (NVML's count: no CUDA initialised to ask) there is nothing to break, and no child is forked."""
    if torch.cuda.is_available():
        pid = _fork()
        if pid == 0:
            try:
                importlib.import_module(name)
                os._exit(0 if _fork_unusable(torch) is None else 1)
            except BaseException:  # noqa: BLE001 - any failure: not imported here
                os._exit(1)
        if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0:
            return
    try:
        importlib.import_module(name)
    except Exception:  # noqa: BLE001 - the candidate's own import will say so
        pass


def _fork_unusable(torch) -> str | None:
    if torch.cuda.is_initialized():
        return "CUDA was initialised during the imports"
    pid = _fork()
    if pid == 0:
        bad = getattr(torch._C, "_cuda_isInBadFork", lambda: False)()
        os._exit(1 if bad else 0)
    _, status = os.waitpid(pid, 0)
    return None if os.waitstatus_to_exitcode(status) == 0 else "torch marks a forked child unable to use CUDA"


def _fork() -> int:
    # Python 3.12 warns on every fork of a process with threads (here: BLAS thread pools, idle; their
    # libraries reset them in the child): expected, and it would fill the zygote's log
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return os.fork()


def _fork_one(msg: bytes, fds: list[int], ctl: socket.socket, live: dict) -> None:
    if len(fds) != 4:
        for fd in fds:
            os.close(fd)
        return
    reply = socket.socket(fileno=fds[0])
    try:
        req = json.loads(msg)
    except ValueError:
        req = None
    if not isinstance(req, dict):
        reply.close()
        for fd in fds[1:]:
            os.close(fd)
        return
    try:
        pid = _fork()
    except OSError:  # out of processes or memory: the caller sees the reply socket close and spawns
        pid = None
    if pid == 0:
        _child(req, fds, ctl, reply, live)  # never returns
    for fd in fds[1:]:
        os.close(fd)
    if pid is None:
        reply.close()
        return
    live[pid] = reply
    try:
        reply.send(json.dumps({"pid": pid}).encode() + b"\n")
    except OSError:
        pass


def _child(req: dict, fds: list[int], ctl, reply, live) -> None:
    code = 70
    try:
        ctl.close()
        reply.close()
        for s in live.values():
            s.close()
        _, stdin_r, log, chan = fds
        os.setsid()
        os.dup2(stdin_r, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(stdin_r)
        os.close(log)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        sys.dont_write_bytecode = bool(req["env"].get("PYTHONDONTWRITEBYTECODE"))
        import resource

        for name, value in req.get("rlimits", {}).items():
            r = getattr(resource, name)
            hard = resource.getrlimit(r)[1]
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(r, (value, value))
        _subreaper(b"kc-worker")
        from kernelcraft.judge.process import worker

        sys.modules["__main__"] = worker  # as in a spawned worker (`python -m kernelcraft.judge.process.worker`)
        worker.main(chan_fd=chan)  # ends with os._exit
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _reap(live: dict) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        reply = live.pop(pid, None)
        if reply is not None:
            try:
                reply.send(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
            except OSError:
                pass
            reply.close()


def _kill_orphans(live: dict) -> None:
    """Children the zygote did not fork were re-parented to it: their worker is gone; so are they."""
    for pid in children(os.getpid()):
        if pid not in live:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


if __name__ == "__main__":
    serve(int(sys.argv[1]))
