"""The forker: a CUDA-free child of the judge that makes candidate sides, so a judge can stay warm.

Design decisions
- Why it exists. A side must be forked from a process that has not touched CUDA (a forked CUDA context is
  unusable), but a warm judge has: it holds its clock, arenas and probe on the device. So before the judge
  touches CUDA or reads a job, it forks this process, which only ever forks candidate sides on request. The
  reference side stays alive across jobs; every candidate gets a fresh side from here.
- The side is the judge's child. The forker double-forks: the intermediate exits at once and the side is
  re-parented to the nearest child subreaper, the judge (`isolation.harden_judge`), which can then freeze it
  and confirm with waitpid as it does any side. The side waits for that re-parenting before it arms its
  parent-death signal (armed earlier, the intermediate's exit would kill it).
- Nothing secret passes through here. The forker was forked before the judge read its first job, and a
  request carries only what the side's process needs to look like a fresh worker of that job: its working
  directory, its log file (stdout and stderr: the runner reads this job's log for a crash's tail), the
  job's worker tag (processes the candidate execs carry it, so the runner's `kill_tagged` finds them) and the
  pids the side's seccomp filter must protect. The judge's end of the side's wire comes back by SCM_RIGHTS.
- Same process shape as a first-job side: own session, stdin and the judge's descriptors closed, `side.serve`.
"""
from __future__ import annotations

import json
import os
import socket
import time

from kernelcraft.judge.process import isolation, side as side_mod
from kernelcraft.judge.process.procs import WORKER_TAG_VAR

MAX_REQUEST = 1 << 16
REPARENT_WAIT_S = 5.0


class Forker:
    """The judge's handle on its forker process."""

    def __init__(self, pid: int, sock: socket.socket):
        self.pid, self.sock = pid, sock

    @classmethod
    def start(cls, close: list[int]) -> "Forker":
        """Fork the forker (before the judge touches CUDA). `close`: the judge's descriptors it must not keep."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            try:
                os.setsid()
                isolation.die_with_parent()
                for fd in [0, mine.fileno(), *close]:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
                _serve(theirs)
            finally:
                os._exit(0)
        theirs.close()
        return cls(pid, mine)

    def candidate(self, *, cwd: str, log_path: str | None, tag: str | None, protected: list[int],
                  close_in_side: list[int]) -> tuple[int, socket.socket]:
        """A fresh candidate side: (its pid, the judge's end of its wire). Raises OSError if the forker is gone."""
        req = dict(cwd=cwd, log=log_path, tag=tag, protected=protected, close=close_in_side)
        self.sock.sendall(json.dumps(req).encode())
        msg, fds, _, _ = socket.recv_fds(self.sock, MAX_REQUEST, 1)
        if not msg or not fds:
            raise OSError("the forker did not answer")
        reply = json.loads(msg)
        if "error" in reply:
            for fd in fds:
                os.close(fd)
            raise OSError(f"the forker could not start a side: {reply['error']}")
        return int(reply["pid"]), socket.socket(fileno=fds[0])

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def _serve(sock: socket.socket) -> None:
    """The forker's loop: one request, one side. Ends when the judge closes its end."""
    judge = os.getppid()
    while True:
        try:
            raw = sock.recv(MAX_REQUEST)
        except OSError:
            return
        if not raw:
            return
        try:
            req = json.loads(raw)
            pid, judge_end = _fork_side(req, judge, sock.fileno())
            socket.send_fds(sock, [json.dumps({"pid": pid}).encode()], [judge_end.fileno()])
            judge_end.close()
        except Exception as e:  # noqa: BLE001 - the judge turns this into a harness error
            r, w = os.pipe()  # a descriptor must travel with every reply (the judge reads one)
            os.close(w)
            try:
                socket.send_fds(sock, [json.dumps({"error": repr(e)[:500]}).encode()], [r])
            finally:
                os.close(r)


def _fork_side(req: dict, judge: int, ctl_fd: int) -> tuple[int, socket.socket]:
    judge_end, side_end = socket.socketpair()
    pid_r, pid_w = os.pipe()
    mid = os.fork()
    if mid == 0:  # the intermediate: fork the side, report its pid, exit (the side goes to the judge)
        try:
            os.close(pid_r)
            pid = os.fork()
            if pid == 0:
                os.close(pid_w)
                _become_side(req, side_end, judge, close=[ctl_fd, judge_end.fileno()])
            os.write(pid_w, str(pid).encode())
        finally:
            os._exit(0)
    os.close(pid_w)
    side_end.close()
    with os.fdopen(pid_r, "rb") as f:
        text = f.read()
    os.waitpid(mid, 0)
    if not text:
        judge_end.close()
        raise OSError("the intermediate process died before forking the side")
    return int(text), judge_end


def _become_side(req: dict, sock: socket.socket, judge: int, close: list[int]) -> None:
    try:
        os.setsid()
        deadline = time.monotonic() + REPARENT_WAIT_S
        while os.getppid() != judge:  # until the intermediate has exited and the judge adopted us
            if time.monotonic() > deadline:
                os._exit(70)
            time.sleep(0.0005)
        for fd in [*close, *req.get("close", [])]:
            try:
                os.close(fd)
            except OSError:
                pass
        if req.get("log"):
            fd = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.close(fd)
        os.chdir(req["cwd"])
        if req.get("tag"):
            os.environ[WORKER_TAG_VAR] = req["tag"]
        side_mod.serve("candidate", sock, [int(p) for p in req["protected"]])
    finally:
        os._exit(0)
