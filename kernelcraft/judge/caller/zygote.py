"""The zygote, the caller's end: a process that has imported torch and the judge once, and forks a fresh judge
process per evaluation (what runs in it: `zygote_process.py`).

The zygote never runs candidate code, never initialises CUDA and holds no job; each evaluation gets a process of
its own. Nothing outlives its judge process. One zygote per environment (its per-job variables aside), started on
first use (`get`); a worker it forks is a `ForkedWorker`. Not used with bwrap; `KERNELCRAFT_ZYGOTE=0` turns it off.

Rationale: docs/design/judge-caller.md#zygote
"""
from __future__ import annotations

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
from kernelcraft.judge.caller.zygote_process import EXTRAS_BROKE_FORK, MAX_MSG

ENV_SWITCH = "KERNELCRAFT_ZYGOTE"
# read by the child (or lazily, after the fork), never at import: they may differ between forks of one zygote
# (PYTEST_CURRENT_TEST names the running test: keyed on, it cost every test a new zygote, ~5 s of imports)
PER_JOB_ENV = ("CUDA_VISIBLE_DEVICES", "KERNELCRAFT_WORKER_TAG", "TORCH_EXTENSIONS_DIR", "TRITON_CACHE_DIR",
               "TORCHINDUCTOR_CACHE_DIR", "CUDA_CACHE_PATH", "MAX_JOBS", "PYTEST_CURRENT_TEST",
               "KERNELCRAFT_CHANNEL_FD")  # the last: a spawned judge's result channel, a different fd per job
MAX_ZYGOTES = 3  # distinct environments kept; an idle one goes first
READY_TIMEOUT_S = 180.0


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
                [sys.executable, "-m", "kernelcraft.judge.caller.zygote_process", str(theirs.fileno())], env=env,
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
