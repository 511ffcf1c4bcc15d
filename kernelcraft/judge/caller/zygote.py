"""The zygote: a process that has imported torch and the judge once, and forks a fresh judge process per
evaluation.

The zygote never runs candidate code, never initialises CUDA and holds no job; each evaluation gets a process of
its own. Nothing outlives its judge process (the zygote and its children are child subreapers; the zygote kills
children it did not fork, and all of them when the caller goes away). Not used with bwrap; `KERNELCRAFT_ZYGOTE=0`
turns it off. Both ends of its socket protocol live here: the zygote process, then `ForkedWorker`/`Zygote`/`get`.

Rationale: docs/design/judge-caller.md#zygote
"""
from __future__ import annotations

import importlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from kernelcraft.judge.caller import sandbox
from kernelcraft.judge.process.procs import children

ENV_SWITCH = "KERNELCRAFT_ZYGOTE"
# read by the child (or lazily, after the fork), never at import: they may differ between forks of one zygote
# (PYTEST_CURRENT_TEST names the running test: keyed on, it cost every test a new zygote, ~5 s of imports)
PER_JOB_ENV = ("CUDA_VISIBLE_DEVICES", "KERNELCRAFT_WORKER_TAG", "TORCH_EXTENSIONS_DIR", "TRITON_CACHE_DIR",
               "TORCHINDUCTOR_CACHE_DIR", "CUDA_CACHE_PATH", "MAX_JOBS", "PYTEST_CURRENT_TEST",
               "KERNELCRAFT_CHANNEL_FD")  # the last: a spawned judge's result channel, a different fd per job
MAX_ZYGOTES = 3  # distinct environments kept; an idle one goes first
READY_TIMEOUT_S = 180.0
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


# -- the zygote process ------------------------------------------------------------------------------
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


# -- the caller's side -------------------------------------------------------------------------------
class ForkedWorker:
    """A worker forked by the zygote, with the parts of `subprocess.Popen` the runner uses."""

    def __init__(self, pid: int, reply: socket.socket, stdin_w: int, on_end=None):
        self.pid, self._reply, self._on_end = pid, reply, on_end
        self.stdin = os.fdopen(stdin_w, "wb")
        self.returncode: int | None = None
        self.lost = False  # the zygote died first: the exit status is unknown
        self._buf = b""

    def poll(self) -> int | None:
        self._read(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None and not self.lost:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout)
            self._read(left)
        return self.returncode

    def _read(self, timeout: float | None) -> None:
        if self.returncode is not None or self.lost:
            return
        ready, _, _ = select.select([self._reply], [], [], timeout)
        if not ready:
            return
        chunk = self._reply.recv(4096)
        if not chunk:
            self.lost = True
            self._end()
            return
        self._buf += chunk
        for line in self._buf.split(b"\n")[:-1]:
            msg = json.loads(line)
            if "exit" in msg:
                self.returncode = int(msg["exit"])
                self._end()
        self._buf = self._buf.rsplit(b"\n", 1)[-1]

    def _end(self) -> None:
        self._reply.close()
        if self._on_end is not None:
            self._on_end, on_end = None, self._on_end
            on_end()


class Zygote:
    def __init__(self, env: dict, log_path: Path):
        self.env = env
        self.lock = threading.Lock()
        self.active = 0  # workers forked and not yet ended
        self.broken = False
        self.used = time.monotonic()
        self.ctl, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kernelcraft.judge.caller.zygote", str(theirs.fileno())], env=env,
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, pass_fds=(theirs.fileno(),),
                start_new_session=True, cwd=str(log_path.parent))
        theirs.close()
        self.ctl.settimeout(READY_TIMEOUT_S)
        try:
            hello = json.loads(self.ctl.recv(MAX_MSG) or b"{}")
        except (OSError, ValueError) as e:
            hello = {"ready": False, "why": f"no answer: {e}"}
        self.ctl.settimeout(None)
        self.ready, self.why = bool(hello.get("ready")), hello.get("why")
        if not self.ready:
            self.close()

    @property
    def alive(self) -> bool:
        return self.ready and not self.broken and self.proc.poll() is None

    def fork(self, env: dict, cwd: Path, rlimits: dict, log_fd: int, chan_fd: int, early: bool = False) -> ForkedWorker:
        """A worker; `early`: it may come before the zygote's Triton and dynamo (a build-only job)."""
        msg = json.dumps({"env": env, "cwd": str(cwd), "rlimits": rlimits, "early": early}).encode()
        stdin_r, stdin_w = os.pipe()
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with self.lock:
                socket.send_fds(self.ctl, [msg], [theirs.fileno(), stdin_r, log_fd, chan_fd])
        except BaseException:
            self.broken = True
            raise
        finally:
            theirs.close()
            os.close(stdin_r)
        try:
            mine.settimeout(30)
            line = b""
            while b"\n" not in line:
                chunk = mine.recv(4096)
                if not chunk:
                    raise OSError("the zygote closed the reply socket")
                line += chunk
            mine.settimeout(None)
            first, _, rest = line.partition(b"\n")
            pid = int(json.loads(first)["pid"])
        except BaseException:
            mine.close()
            os.close(stdin_w)
            self.broken = True  # replaced on the next get(); workers it forked run on
            raise
        with self.lock:
            self.active += 1
            self.used = time.monotonic()
        w = ForkedWorker(pid, mine, stdin_w, self._ended)
        w._buf = rest
        return w

    def _ended(self) -> None:
        with self.lock:
            self.active -= 1

    def close(self) -> None:
        try:
            self.ctl.close()
        finally:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)


_ZYGOTES: dict[tuple, Zygote] = {}
_DISABLED: dict[tuple, str] = {}
_LOCK = threading.Lock()


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "off", "false", "no")


def will_fork(mode: str | None = None) -> bool:
    """Whether workers started now would be forked (the zygote is on and the sandbox mode allows it)."""
    try:
        return enabled() and sandbox.fork_settings({}, mode) is not None
    except sandbox.SandboxError:
        return False


def get(env: dict, root: Path) -> Zygote | None:
    """The zygote for workers with this environment (its per-job variables aside), started on first use;
    None where forking is off or cannot work here (then the caller spawns)."""
    base = {k: v for k, v in env.items() if k not in PER_JOB_ENV}
    key = (sys.executable, tuple(sorted(base.items())))
    with _LOCK:
        if key in _DISABLED:
            return None
        z = _ZYGOTES.get(key)
        if z is not None and z.alive:
            return z
        if z is not None:  # dead or broken: a new one; the old one goes when its last worker has ended
            del _ZYGOTES[key]
            if z.active == 0:
                z.close()
            if z.proc.poll() == EXTRAS_BROKE_FORK:  # a new one would do the same: spawn from now on
                return _disable(key, "importing Triton and dynamo initialised CUDA")
        idle = sorted((z.used, k) for k, z in _ZYGOTES.items() if z.active == 0)
        while len(_ZYGOTES) >= MAX_ZYGOTES and idle:
            _ZYGOTES.pop(idle.pop(0)[1]).close()
        zdir = root / "zygote"
        zdir.mkdir(parents=True, exist_ok=True)
        z = Zygote(base, zdir / f"zygote-{os.getpid()}.log")
        if not z.ready:
            return _disable(key, z.why or "unknown")
        _ZYGOTES[key] = z
        return z


def _disable(key: tuple, why: str) -> None:
    """No zygote for this environment from now on (callers spawn); said once. Called under `_LOCK`."""
    _DISABLED[key] = why
    print(f"kernelcraft: worker zygote unusable ({why}); spawning workers", file=sys.stderr)


def shutdown() -> None:
    with _LOCK:
        for z in _ZYGOTES.values():
            z.close()
        _ZYGOTES.clear()


if __name__ == "__main__":
    serve(int(sys.argv[1]))
