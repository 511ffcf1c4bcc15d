"""The forker: a CUDA-free child of the judge that makes candidate sides, so a judge can stay warm.

Forked before the judge touches CUDA or reads a job, it only forks candidate sides on request (a double fork: the
side is re-parented to the judge), each in a PID namespace of its own where the host allows one. Nothing secret
passes through it: a request carries only a working directory, a log file, the job's worker tag and the pids to
protect.

Rationale: docs/design/judge-process.md#forker
"""
from __future__ import annotations

import json
import os
import socket

from kernelcraft.judge.process import isolation, side as side_mod
from kernelcraft.judge.process.procs import WORKER_TAG_VAR

MAX_REQUEST = 1 << 16


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
                try:
                    namespace = isolation.probe_namespace()
                except ValueError as e:  # a bad KERNELCRAFT_PIDNS: every request says so
                    namespace = e
                _serve(theirs, namespace)
            finally:
                os._exit(0)
        theirs.close()
        return cls(pid, mine)

    def candidate(self, *, cwd: str, log_path: str | None, tag: str | None, protected: list[int],
                  close_in_side: list[int]) -> tuple[int, socket.socket, dict]:
        """A fresh candidate side: (its pid, the judge's end of its wire, its namespace: {"init": the pid of its
        pid 1 or None, "kind": "pid", "user" or None, "note": why not, or what failed first}). Raises OSError if
        the forker is gone or could not make the side."""
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
        return int(reply["pid"]), socket.socket(fileno=fds[0]), reply["namespace"]

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def _serve(sock: socket.socket, namespace: tuple[str | None, str] | ValueError) -> None:
    """The forker's loop: one request, one side. Ends when the judge closes its end. `namespace`: what
    `isolation.probe_namespace` found (the kind to make, and a note), or the error in its setting."""
    while True:
        try:
            raw = sock.recv(MAX_REQUEST)
        except OSError:
            return
        if not raw:
            return
        try:
            if isinstance(namespace, ValueError):
                raise namespace
            req = json.loads(raw)
            kind, note = namespace
            pid, init, judge_end = _fork_side(req, sock.fileno(), kind, note)
            ns = {"init": init, "kind": kind, "note": note}
            socket.send_fds(sock, [json.dumps({"pid": pid, "namespace": ns}).encode()], [judge_end.fileno()])
            judge_end.close()
        except Exception as e:  # noqa: BLE001 - the judge turns this into a harness error
            r, w = os.pipe()  # a descriptor must travel with every reply (the judge reads one)
            os.close(w)
            try:
                socket.send_fds(sock, [json.dumps({"error": repr(e)[:500]}).encode()], [r])
            finally:
                os.close(r)


def _fork_side(req: dict, ctl_fd: int, kind: str | None, note: str) -> tuple[int, int | None, socket.socket]:
    """(the side's pid, its namespace init's pid or None, the judge's end of its wire)."""
    judge_end, side_end = socket.socketpair()
    pid_r, pid_w = os.pipe()
    go_r, go_w = os.pipe()  # re-parenting done: one byte for the side, one for the namespace's init
    mid = os.fork()
    if mid == 0:  # the intermediate: (a namespace and its init,) the side, report both pids, exit
        try:
            os.close(pid_r)
            os.close(go_w)
            init = 0
            if kind:
                isolation.unshare_namespace(kind)
                init = _start_init(go_r, close=[ctl_fd, judge_end.fileno(), side_end.fileno(), pid_w])
            pid = os.fork()
            if pid == 0:
                os.close(pid_w)
                _become_side(req, side_end, go_r, {"kind": kind, "note": note} if kind or note else None,
                             close=[ctl_fd, judge_end.fileno()])
            os.write(pid_w, f"{pid} {init}".encode())
        except BaseException as e:  # noqa: BLE001 - the judge turns this into a harness error
            os.write(pid_w, f"error {e}".encode()[:500])
        finally:
            os._exit(0)
    os.close(pid_w)
    os.close(go_r)
    side_end.close()
    with os.fdopen(pid_r, "rb") as f:
        text = f.read().decode(errors="replace")
    os.waitpid(mid, 0)  # the intermediate is reaped: its children are the judge's now
    try:
        os.write(go_w, b"gg")
    except OSError:
        pass  # nobody reads: the side died, which its first request will say
    finally:
        os.close(go_w)
    if not text or text.startswith("error"):
        judge_end.close()
        raise OSError(text.removeprefix("error ") or "the intermediate process died before forking the side")
    pid, init = (int(x) for x in text.split())
    return pid, init or None, judge_end


def _start_init(go_fd: int, close: list[int]) -> int:
    """In the intermediate, after `isolation.unshare_namespace`: fork the namespace's pid 1, wait until it has set
    the namespace up, return its pid. Raises OSError with the init's reason if it could not."""
    r, w = os.pipe()
    init = os.fork()
    if init == 0:
        try:
            os.close(r)
            for fd in close:
                os.close(fd)
            try:
                isolation.setup_namespace()
            except OSError as e:
                os.write(w, str(e).encode()[:400])
                os._exit(0)
            os.write(w, b"ok")
            os.close(w)
            isolation.namespace_init(go_fd)
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        said = f.read().decode(errors="replace")
    if said != "ok":
        os.waitpid(init, 0)
        raise OSError(f"the candidate's PID namespace could not be set up: {said or 'its init died'}")
    return init


def _become_side(req: dict, sock: socket.socket, go_fd: int, namespace: dict | None, close: list[int]) -> None:
    try:
        os.setsid()
        got = os.read(go_fd, 1)  # until the intermediate has exited and the judge adopted us
        os.close(go_fd)
        if not got:
            os._exit(70)
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
        # in a namespace the judge's pids name nothing (or another process): its init is what there is to protect
        protected = [1] if namespace and namespace.get("kind") else [int(p) for p in req["protected"]]
        side_mod.serve("candidate", sock, protected, namespace)
    finally:
        os._exit(0)
