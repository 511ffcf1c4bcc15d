"""The wire between the judge and a side: length-prefixed frames on a Unix socket pair.

Asymmetric: judge → side is pickle with descriptors by SCM_RIGHTS; side → judge is JSON only, at most `MAX_FRAME`
bytes, parsed into plain values, so nothing a side sends can run code in the judge. A closed end raises `Closed`.

Rationale: docs/design/judge-process.md#wire
"""
from __future__ import annotations

import json
import pickle
import select
import socket
import struct

MAX_FRAME = 1 << 20
_HEAD = struct.Struct("!I")


class Closed(Exception):
    """The other end of the wire is gone."""


def _recv_exact(sock: socket.socket, n: int, fds: list[int] | None = None) -> bytes:
    buf = b""
    while len(buf) < n:
        if fds is not None and not buf:
            chunk, got, _, _ = socket.recv_fds(sock, n - len(buf), 4)
            fds.extend(got)
        else:
            chunk = sock.recv(n - len(buf))
        if not chunk:
            raise Closed()
        buf += chunk
    return buf


class JudgeEnd:
    """The judge's end of the wire to one side."""

    def __init__(self, sock: socket.socket):
        self.sock = sock

    def send(self, msg: dict, fds: list[int] = ()) -> None:
        data = pickle.dumps(msg)
        frame = _HEAD.pack(len(data)) + data
        try:
            if fds:
                socket.send_fds(self.sock, [frame[:_HEAD.size]], list(fds))
                self.sock.sendall(frame[_HEAD.size:])
            else:
                self.sock.sendall(frame)
        except OSError as e:
            raise Closed() from e

    def recv(self) -> dict:
        try:
            (n,) = _HEAD.unpack(_recv_exact(self.sock, _HEAD.size))
            if n > MAX_FRAME:
                raise ValueError(f"a side sent a {n}-byte frame (limit {MAX_FRAME})")
            msg = json.loads(_recv_exact(self.sock, n))
        except OSError as e:
            raise Closed() from e
        if not isinstance(msg, dict):
            raise ValueError("a side sent a frame that is not a JSON object")
        return msg

    def wait(self, timeout_s: float) -> bool:
        """Whether a frame (or the end of the wire) is there to read within `timeout_s`."""
        return bool(select.select([self.sock], [], [], timeout_s)[0])

    def pending(self) -> bool:
        """Bytes waiting that no request asked for (a reply sent ahead of its request)."""
        return bool(select.select([self.sock], [], [], 0)[0])


class SideEnd:
    """A side's end of the wire."""

    def __init__(self, sock: socket.socket):
        self.sock = sock

    def recv(self) -> tuple[dict, list[int]]:
        fds: list[int] = []
        (n,) = _HEAD.unpack(_recv_exact(self.sock, _HEAD.size, fds))
        return pickle.loads(_recv_exact(self.sock, n)), fds

    def send(self, msg: dict) -> None:
        data = json.dumps(msg, default=str).encode()
        if len(data) > MAX_FRAME:
            data = json.dumps({"type": msg.get("type", "error"), "truncated": True}).encode()
        self.sock.sendall(_HEAD.pack(len(data)) + data)
