"""The judge process's life: its helpers forked first, then jobs from stdin, one verdict each, warm in between.

The forker and the reference side are forked before any job (and its nonce) is read. A job marked `warm` keeps the
judge, forker and reference alive for the next job of its task unless its verdict, a death or the reference's
state puts them in doubt (`NOT_REUSABLE`, `audit.reference_tampering`) or its task is too large
(`worth_keeping`). Every job gets a fresh candidate side; the device lock is released at each job's end, after its
device memory went back.

Rationale: docs/design/judge-process.md#jobs
"""
from __future__ import annotations

import gc
import json
import os
import signal
import sys
import time
from dataclasses import dataclass

import torch

from kernelcraft.judge.process import audit, failures, isolation
from kernelcraft.judge.process.arena import Arena, total_bytes
from kernelcraft.judge.process.forker import Forker
from kernelcraft.judge.reject import Reject
from kernelcraft.judge.process.sideproc import SideProc, end_candidate
from kernelcraft.judge.caller.gpushare import CONTEXT_BYTES, JOB_PROCESSES
from kernelcraft.judge.caller.single import Single


class Channel:
    def __init__(self, fd: int, nonce: str):
        self._f = os.fdopen(fd, "w", buffering=1)
        self.nonce = nonce  # the current job's

    def send(self, kind: str, **data) -> None:
        """One message; `sent` is when (CLOCK_MONOTONIC, one clock for every process of the host): the caller
        times phases by it, not by when it got to read the message."""
        self._f.write(json.dumps({"nonce": self.nonce, "type": kind, "sent": time.monotonic(), **data},
                                 default=str) + "\n")
        self._f.flush()


@dataclass
class Warm:
    """What a judge keeps for the next candidate of the same task: the task module (for its draws), the
    reference side (imported and constructed; `reset` before each use), its arenas and the output structure."""
    task: object
    in_specs: list
    values: list
    in_arena: Arena
    out_specs: list
    out_kind: str
    out_arena: Arena
    ref_construct: dict  # the reference's reply to `construct` (what its construction left, e.g. its mode)
    stateful: bool = False  # its forward changes plain-attribute state (`side.cmd_describe`)
    tf32_convolutions: bool = False  # its convolutions may run in TF32 (`side.cmd_describe`, `precision`)


NOT_REUSABLE = {"task_error", "harness_error", "peer_tampering", "thread_injection"}


def serve(fd: int, evaluation_cls) -> None:
    """Fork the forker and the reference side, then judge jobs from stdin until it closes (or a job leaves
    nothing worth keeping): each job's result goes on the channel under that job's nonce.

    A job that asks for it (`warm`, sent by the runner for candidates of one task) keeps this process, its
    reference side and their arenas for the next job of the same task; every job gets a fresh candidate side
    from the forker. The first job is judged exactly as a one-shot worker judges it."""
    hardening = isolation.harden_judge()
    forker = ref = None
    try:  # before any job (and its nonce) is read: no side and no forker ever has one in memory
        forker = Forker.start(close=[fd])
        ref = SideProc.fork("reference", [os.getpid()], [fd, forker.sock.fileno()])
        hardening["reference"] = ref.request({"cmd": "hello"}).get("hardening")
    except Exception as e:  # noqa: BLE001
        sides_error = e
    else:
        sides_error = None
    # the judge's own torch work (draws, copies, comparisons) runs single-threaded: an OpenMP pool here would
    # spin after every op and compete with the side being timed for the host's cores
    torch.set_num_threads(1)
    chan = Channel(fd, "")
    warm: Warm | None = None
    while True:
        line = sys.stdin.readline()
        if not line:
            break
        job = json.loads(line)
        chan.nonce = job.pop("nonce")
        job.pop("fd", None)
        out, keep, lock = _judge_one(job, chan, forker, ref, dict(hardening), warm, sides_error, evaluation_cls)
        if keep is not None:
            out["warm"].update(_footprint(ref, job))
        elif lock is not None:
            _free_device_memory(job)
        if lock is not None:  # only now: the next job on this device must not meet this one's memory
            lock.__exit__(None, None, None)
        chan.send("result", result=out)
        sys.stdout.flush()
        if keep is None:
            break
        warm = keep
    os._exit(0)


def _judge_one(job: dict, chan: Channel, forker, ref, hardening: dict, warm: Warm | None, sides_error,
               evaluation_cls):
    """One job: (the result, what the next job may reuse or None)."""
    if job.get("cwd"):
        os.chdir(job["cwd"])
    t0 = time.perf_counter()
    ev, cand = None, None
    try:
        if sides_error is not None:
            raise Reject("runtime_error", ["harness_error"], f"kernelcraft could not start the sides: {sides_error}")
        try:
            cand = SideProc.from_forker(forker, cwd=job.get("cwd") or os.getcwd(), log_path=job.get("log_path"),
                                        tag=job.get("tag"), protected=[os.getpid(), ref.pid, forker.pid])
            hardening["candidate"] = cand.request({"cmd": "hello"}).get("hardening")
        except (OSError, Reject) as e:
            raise Reject("runtime_error", ["harness_error"], f"kernelcraft could not start the candidate's side: "
                         f"{getattr(e, 'message', e)}") from None
        sides = {"reference": ref, "candidate": cand}
        if job.get("probe") or job.get("build_only"):
            ev = Single(job, chan, sides)
            result = ev.probe() if job.get("probe") else ev.build_only()
        else:
            ev = evaluation_cls(job, chan, sides, hardening, warm)
            ev.forker_pid = forker.pid

            def spawn_candidate() -> SideProc:  # another candidate process for timing (`processes` > 1, `siblings`)
                side = SideProc.from_forker(forker, cwd=job.get("cwd") or os.getcwd(), log_path=job.get("log_path"),
                                            tag=job.get("tag"), protected=[os.getpid(), ref.pid, forker.pid])
                side.request({"cmd": "hello"})
                return side
            ev.spawn_candidate = spawn_candidate
            result = ev.run()
        out = {"status": "correct", "reasons": [], "message": "", **result}
    except BaseException as e:  # noqa: BLE001 - every failure becomes a verdict
        rej = e if isinstance(e, Reject) else Reject(
            "runtime_error", ["harness_error"], f"kernelcraft failed: {failures.describe_exception(e)}")
        out = {"status": rej.status, "reasons": rej.reasons, "message": rej.message,
               **(ev.result if ev is not None else {})}
    out["device_peak"] = _device_peak(ref if sides_error is None else None, job)  # before a reference not kept ends
    lock = ev.hand_over_lock() if isinstance(ev, evaluation_cls) else None
    if getattr(ev, "cand", None) is not None:
        cand = ev.cand  # the first of the candidate's processes (its siblings ended with timing, or end below)
    end_candidate(cand, keep={p.pid for p in (ref, forker) if p is not None})
    out.update(build_s=max(getattr(ev, "build_s", 0.0), cand.build_s if cand is not None else 0.0),
               worker_s=time.perf_counter() - t0,
               phase=getattr(ev, "phase", "start"))
    out.setdefault("build_cache", {"builds": 0, "hits": 0})
    keep = None
    if (job.get("warm") and isinstance(ev, evaluation_cls) and ev.ready is not None and out["status"] != "timeout"
            and not NOT_REUSABLE & set(out["reasons"]) and _alive(ref.pid) and _alive(forker.pid)
            and worth_keeping(ev) and not audit.reference_tampering(os.getpid(), ref.pid)):
        keep = ev.ready
    out["warm"] = {"kept": keep is not None, "pids": [os.getpid(), ref.pid, forker.pid] if keep else []}
    if keep is None:
        for p in (ref, forker):
            if p is not None:
                _kill_group(p.pid)
    return out, keep, lock


WARM_MAX_SHARE = 1 / 16  # a task whose inputs and outputs take more of the GPU is not kept warm (`worth_keeping`)


def worth_keeping(ev, total: int | None = None) -> bool:
    """Is this judge worth keeping warm? Not when its task's inputs and outputs take more than `WARM_MAX_SHARE` of
    its GPU (`total` bytes; the device's own by default): kept, or taken by the next job and waiting for the device
    lock, it holds the reference's arenas, and on a shared 80 GB H100 KernelBench's 8-16 GiB tasks ran out of
    memory beside such judges (a 16.6 GiB one). Such a task's evaluations are long; a cold start costs seconds."""
    if ev.device.type != "cuda":
        return True
    io = total_bytes(list(ev.in_specs) + list(ev.out_specs))
    total = total if total is not None else torch.cuda.get_device_properties(ev.device).total_memory
    return io <= WARM_MAX_SHARE * total


def _free_device_memory(job: dict) -> bool:
    """The job's own tensors (draws, copies, arenas of the candidate) back to the device: its evaluation is gone
    by now, but closures may hold it in a reference cycle. False on a CPU."""
    if not str(job.get("device", "")).startswith("cuda") or not torch.cuda.is_initialized():
        return False
    try:
        gc.collect()
        torch.cuda.empty_cache()
    except Exception:  # noqa: BLE001 - a device that faulted: the verdict still goes out, the lock still goes back
        return False
    return True


def _device_peak(ref: SideProc | None, job: dict) -> dict:
    """The job's peak device bytes, for the runner's admission of the task's next jobs (`gpushare`): the judge's
    and the reference's allocator peaks (both reset for a next job in these processes), the candidate taken as
    the reference (nothing the candidate's process says is asked), and a CUDA context per process. `{}` on a CPU,
    before CUDA, or when the reference does not answer: advice, never a verdict."""
    if ref is None or not str(job.get("device", "")).startswith("cuda") or not torch.cuda.is_initialized():
        return {}
    try:
        judge = int(torch.cuda.max_memory_reserved())
        torch.cuda.reset_peak_memory_stats()
        reference = int(ref.request({"cmd": "memory"}, phase="idle").get("peak", 0))
        return {"bytes": judge + 2 * reference + JOB_PROCESSES * CONTEXT_BYTES,
                "total": int(torch.cuda.get_device_properties(0).total_memory)}
    except Exception:  # noqa: BLE001 - a dead reference or a faulted device: the verdict goes out without it
        return {}


def _footprint(ref: SideProc, job: dict) -> dict:
    """What a judge kept warm holds on its device once the job's own tensors are gone: the allocator's free
    blocks go back (here and in the reference), and the rest is reported so the runner can cap what idle judges
    hold (`warm.put`). `{}` on a CPU or when the reference does not answer (the runner then counts nothing)."""
    if not _free_device_memory(job):
        return {}
    try:
        got = ref.request({"cmd": "idle"}, phase="idle")
        held = int(torch.cuda.memory_reserved()) + int(got.get("reserved", 0)) + 2 * CONTEXT_BYTES
        return {"device_bytes": held, "device_total": int(torch.cuda.get_device_properties(0).total_memory)}
    except Exception:  # noqa: BLE001 - a footprint is advice for the cache, never a verdict
        return {}


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _alive(pid: int) -> bool:
    try:
        got, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return False
    return got == 0

