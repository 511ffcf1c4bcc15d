"""Runner: the caller's side of a judge process — spawn, feed, watch, kill, and map deaths to outcomes.

A judge process is forked by the `zygote` or spawned through the `sandbox`, and leads its own process group, so a
timeout or clean-up kills everything the candidate started. Two clocks: `build_timeout_s` during `BUILD_PHASES`,
`timeout_s` after; waiting for the device (`WAIT_PHASES`) stops the running one, which goes on where it stopped.
Results arrive on a private pipe, each line carrying the caller's nonce; anything else marks the outcome `forged`.
A job enters its GPU when the device memory its task is known to take fits beside this process's other jobs there;
one that ran out of device memory because of idle warm judges or those jobs is run once more (`warm`, `gpushare`).

Rationale: docs/design/judge-caller.md#runner
"""
from __future__ import annotations

import json
import math
import os
import secrets
import selectors
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from kernelcraft.judge.caller import gpushare, sandbox, warm, zygote
from kernelcraft.judge.process.procs import CHANNEL_FD_VAR, WORKER_TAG_VAR, describe_signal, kill_tagged

MAX_CHANNEL_BYTES = 16 << 20
PACKAGE_PARENT = Path(__file__).resolve().parents[2]  # the directory holding kernelcraft/
BUILD_PHASES = ("spawn", "start", "warmup", "reference", "prepare", "import")  # start-up and build: the build clock
WAIT_PHASES = ("wait_device",)  # waiting for another evaluation to free the device: on neither clock
WAIT_LIMIT_S = 3600.0  # a holder is bounded by its own clock; this only bounds a wedged lock


@dataclass
class WorkerOutcome:
    result: dict | None = None
    phase: str = "spawn"
    timed_out: bool = False
    returncode: int | None = None
    log_tail: str = ""
    build_s: float = 0.0
    forged: bool = False
    start: str = "spawn"  # or "fork": forked by the zygote
    phases: list[tuple[str, float]] = field(default_factory=list)  # (phase, s since spawn); ("end", s) last
    crowded_out: bool = False  # run again after idle judges or other running jobs made it run out of device memory
    device_peak: int = 0  # the job's processes' peak device bytes, as the judge counted them (0: not counted)
    device_total: int = 0  # its GPU's memory in bytes (0: not reported)

    def durations(self) -> dict[str, float]:
        """Seconds spent in each phase; `spawn` is interpreter start-up and imports before the first."""
        marks = [("spawn", 0.0)] + list(self.phases)
        spans: dict[str, float] = {}
        for (name, t), (_, t_next) in zip(marks, marks[1:]):
            spans[name] = round(spans.get(name, 0.0) + max(0.0, t_next - t), 4)
        return spans


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    root = Path(cache_dir or os.environ.get("KERNELCRAFT_CACHE") or Path.home() / ".cache" / "kernelcraft")
    root.mkdir(parents=True, exist_ok=True)
    return root


def worker_env(root: Path, visible_gpu: str | None) -> dict:
    env = dict(os.environ)
    pkg_parent = str(PACKAGE_PARENT)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_parent, env.get("PYTHONPATH")) if p)
    env.setdefault("TORCH_EXTENSIONS_DIR", str(root / "torch_extensions"))
    env.setdefault("TRITON_CACHE_DIR", str(root / "triton"))
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(root / "inductor"))
    env.setdefault("MAX_JOBS", str(os.cpu_count() or 2))
    # torch.compile compiles in the candidate's own process: a pool of compile workers (one per core, up to 32)
    # costs seconds to start for a level-1 graph's one or two kernels, and its idle processes would sit in the side's
    # process group through timing (the side shuts any pool after its first call: `Side.cmd_settle`)
    env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    # OpenMP threads that spin after a parallel region (libgomp's default) and are then frozen with their side
    # (SIGSTOP between calls) stall the next call by tens of milliseconds: sleep-waiting is forced for every
    # process of an evaluation (read when libgomp loads, i.e. at `import torch` in the zygote/judge)
    env["OMP_WAIT_POLICY"] = "passive"
    env["KMP_BLOCKTIME"] = "0"
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if visible_gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible_gpu
    else:
        env["CUDA_VISIBLE_DEVICES"] = ""  # a CPU evaluation never touches a GPU
    return env


def run_worker(job: dict, work_dir: Path, root: Path, visible_gpu: str | None,
               timeout_s: float, build_timeout_s: float, warm_key: str | None = None,
               memory_key: str | None = None) -> WorkerOutcome:
    """Run one job in a worker and watch it. With `warm_key` (candidates of one task, see `warm`), an idle
    judge kept from an earlier job of that key takes it, and this one is kept if it ends cleanly. With
    `memory_key` (the task and protocol), the job waits on a GPU until the device memory that key's jobs took
    fits beside the jobs running there, and its own peak is learned for the next (`gpushare`)."""
    if warm_key is not None:  # the caller's key (task, protocol) and everything a worker is started with
        base = {k: v for k, v in worker_env(root, visible_gpu).items() if k not in zygote.PER_JOB_ENV}
        warm_key = warm.key(warm_key, str(root), visible_gpu, base)
    if visible_gpu is None:
        return _first_run(job, work_dir, root, visible_gpu, timeout_s, build_timeout_s, warm_key)
    lease, known = gpushare.share(visible_gpu), gpushare.footprints(root)
    need = known.need(memory_key)
    with lease.shared(need) as seen:
        out = _first_run(job, work_dir, root, visible_gpu, timeout_s, build_timeout_s, warm_key)
    _learn(lease, known, memory_key, out)
    if out.crowded_out or not seen["overlapped"] or not _out_of_memory(out):
        return out
    if need:  # admitted by its footprint and still crowded out: the footprint was short
        known.learn(memory_key, int(need * CROWDED_NEED_GROWTH))
    with lease.exclusive():  # other jobs of ours held the GPU's memory: once more, alone (`gpushare`)
        again = _run_again(job, work_dir, root, visible_gpu, timeout_s, build_timeout_s,
                           "run again alone on its GPU: other evaluations had crowded it out of device memory")
    _learn(lease, known, memory_key, again)
    return again


CROWDED_NEED_GROWTH = 1.5  # a footprint that let its job be crowded out grows by this much


def _learn(lease: gpushare.Share, known: gpushare.Footprints, memory_key: str | None, out: WorkerOutcome) -> None:
    lease.learn_total(out.device_total)
    known.learn(memory_key, out.device_peak)


def _first_run(job: dict, work_dir: Path, root: Path, visible_gpu: str | None, timeout_s: float,
               build_timeout_s: float, warm_key: str | None) -> WorkerOutcome:
    if warm_key is not None and warm.enabled():
        w = warm.take(warm_key)
        if w is not None:
            out = _run(job, work_dir, timeout_s, build_timeout_s, warm_key, w)
            if out is not None:
                return _unless_crowded_out(out, job, work_dir, root, visible_gpu, timeout_s, build_timeout_s)
    out = _run(job, work_dir, timeout_s, build_timeout_s, warm_key if warm.enabled() else None, None,
               root=root, visible_gpu=visible_gpu)
    return _unless_crowded_out(out, job, work_dir, root, visible_gpu, timeout_s, build_timeout_s)


def _int(x) -> int:
    return int(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 else 0


def _out_of_memory(out: WorkerOutcome) -> bool:
    """The judge reported an out-of-memory: the candidate's (`out_of_memory`), or the judge's or reference's own
    (harness or task error naming it). Not a candidate's exception whose text merely says so."""
    r = out.result if isinstance(out.result, dict) else None
    if not r or r.get("status") != "runtime_error":
        return False
    reasons = r.get("reasons") or []
    return "out_of_memory" in reasons or (bool({"harness_error", "task_error"} & set(reasons))
                                          and "out of memory" in str(r.get("message", "")).lower())


def _unless_crowded_out(out: WorkerOutcome, job: dict, work_dir: Path, root: Path | None, visible_gpu: str | None,
                        timeout_s: float, build_timeout_s: float) -> WorkerOutcome:
    """A job that ran out of device memory while idle judges held part of its GPU is run once more, cold, after
    they are killed (`warm.discard_device`): the shortage was the cache's, not the candidate's or the task's."""
    if visible_gpu is None or not _out_of_memory(out) or warm.discard_device(visible_gpu) == 0:
        return out
    return _run_again(job, work_dir, root, visible_gpu, timeout_s, build_timeout_s,
                      "run again: idle judges had crowded it out of device memory")


def _run_again(job: dict, work_dir: Path, root: Path | None, visible_gpu: str, timeout_s: float,
               build_timeout_s: float, why: str) -> WorkerOutcome:
    """The job once more, cold (no warm judge taken or kept), marked as crowded out and why."""
    again = _run(job, work_dir, timeout_s, build_timeout_s, None, None, root=root or cache_root(),
                 visible_gpu=visible_gpu)
    again.crowded_out = True
    again.start = f"{again.start} ({why})"
    return again


def take_device_peak(out: WorkerOutcome) -> None:
    """The judge's count of the job's peak device bytes, moved from its result to the outcome: advice for
    admission (`gpushare`), not part of the verdict."""
    peak = out.result.pop("device_peak", None) if isinstance(out.result, dict) else None
    if isinstance(peak, dict) and not out.forged:
        out.device_peak, out.device_total = _int(peak.get("bytes")), _int(peak.get("total"))


def _run(job: dict, work_dir: Path, timeout_s: float, build_timeout_s: float, warm_key: str | None,
         reuse: "warm.WarmWorker | None", root: Path | None = None, visible_gpu: str | None = None):
    out = WorkerOutcome()
    log_path = work_dir / "worker.log"
    nonce = secrets.token_hex(16)
    t_start = time.monotonic()
    job_tag = secrets.token_hex(12)  # this job's processes (all of them, when the worker starts with it)
    job = {**job, "warm": warm_key is not None, "cwd": str(work_dir), "tag": job_tag}
    if reuse is not None:
        log_path.touch()
        proc, r_fd, bwrapped, out.start, first_tag = reuse.proc, reuse.r_fd, reuse.bwrapped, reuse.start, reuse.tag
        job["log_path"] = str(log_path)  # the candidate's fresh side writes here; the judge's log is its first job's
    else:
        r_fd, w_fd = os.pipe()
        first_tag = job_tag
        with open(log_path, "wb") as log:
            env = {**worker_env(root, visible_gpu), WORKER_TAG_VAR: job_tag, CHANNEL_FD_VAR: str(w_fd)}
            proc, bwrapped = _fork(env, work_dir, root, log.fileno(), w_fd, bool(job.get("build_only"))), False
            if proc is not None:
                out.start = "fork"
            else:
                argv, env = sandbox.prepare([sys.executable, "-m", "kernelcraft.judge.process.worker"], env,
                                            work_dir=work_dir, cache_dir=root)
                bwrapped = argv[0] == sandbox.bwrap_path()
                proc = subprocess.Popen(
                    argv, stdin=subprocess.PIPE, stdout=log,
                    stderr=subprocess.STDOUT, pass_fds=(w_fd,), start_new_session=True, cwd=work_dir,
                    env=env)
        os.close(w_fd)
    with _LIVE_LOCK:
        _LIVE[proc.pid] = (proc, first_tag)
    try:
        proc.stdin.write((json.dumps({**job, "nonce": nonce}) + "\n").encode())
        proc.stdin.flush()
        if warm_key is None:
            proc.stdin.close()
    except (BrokenPipeError, OSError, ValueError):
        if reuse is not None:  # it died while idle: not this candidate's doing, start a fresh one
            reuse.kill()
            with _LIVE_LOCK:
                _LIVE.pop(proc.pid, None)
            return None
    _watch(out, r_fd, nonce, t_start, timeout_s, build_timeout_s)
    kept, retry = None, False
    try:
        if reuse is not None and out.result is None and not out.timed_out and not out.forged and not out.phases:
            retry = True  # died between jobs, before a word of this one: run it again in a fresh worker
        else:
            take_device_peak(out)
            info = out.result.pop("warm", None) if isinstance(out.result, dict) else None
            if (warm_key is not None and isinstance(info, dict) and info.get("kept") and not out.timed_out
                    and not out.forged):
                pids = [int(p) for p in info.get("pids", []) if isinstance(p, int)]
                kill_tagged(job_tag, keep=set(pids))  # what this job's candidate exec'd; never the judge's own
                gpu = visible_gpu if visible_gpu is not None else getattr(reuse, "device", None)
                kept = warm.WarmWorker(proc, r_fd, first_tag, pids, bwrapped, out.start,
                                       jobs=(reuse.jobs + 1) if reuse else 1, device=gpu,
                                       device_bytes=_int(info.get("device_bytes")),
                                       device_total=_int(info.get("device_total")))
    finally:
        if kept is None:
            if not retry and not out.timed_out and not out.forged and out.result is None:
                try:  # the channel closed without a result: let the worker exit by itself, to see its real status
                    proc.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    pass
            kill_tagged(job_tag)  # descendants that left the process group (setsid, double fork)
            if reuse is not None:
                reuse.kill()  # its group, its sides' groups, its first job's tag, its channel (closed once)
            else:
                os.close(r_fd)
                _kill_group(proc)
                kill_tagged(first_tag)
        with _LIVE_LOCK:
            _LIVE.pop(proc.pid, None)
        out.returncode = proc.returncode
        if bwrapped and out.returncode is not None and out.returncode > 128:
            out.returncode = 128 - out.returncode  # bwrap exits 128 + the signal that killed the worker
        out.log_tail = _tail(log_path)
    if kept is not None:
        warm.put(warm_key, kept)
    return None if retry else out


def _watch(out: WorkerOutcome, r_fd: int, nonce: str, t_start: float, timeout_s: float,
           build_timeout_s: float) -> None:
    """Read the channel until this job's result, a timeout, a forged message flood or the channel's end."""
    phase_start = t_start
    paused: tuple[bool, float] | None = None  # (a build clock?, its seconds used) while a wait stops it
    buf, total = b"", 0
    sel = selectors.DefaultSelector()
    sel.register(r_fd, selectors.EVENT_READ)
    try:
        while True:
            limit = (build_timeout_s if out.phase in BUILD_PHASES else
                     WAIT_LIMIT_S if out.phase in WAIT_PHASES else timeout_s)
            remaining = (phase_start + limit) - time.monotonic()
            if remaining <= 0:
                out.timed_out = True
                break
            if not sel.select(timeout=min(remaining, 1.0)):
                continue
            chunk = os.read(r_fd, 65536)
            if not chunk:
                break
            total += len(chunk)
            if total > MAX_CHANNEL_BYTES:
                out.forged = True
                break
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                msg = _parse(line, nonce)
                if msg is None:
                    out.forged = True
                    continue
                if msg["type"] == "phase":
                    prev = out.phase
                    out.phase = msg["phase"]
                    out.build_s = msg.get("build_s", out.build_s)
                    now = _sent_at(msg, t_start + (out.phases[-1][1] if out.phases else 0.0))
                    out.phases.append((out.phase, now - t_start))
                    if out.phase in WAIT_PHASES and prev not in WAIT_PHASES:  # a clock stops while its job waits
                        paused = (prev in BUILD_PHASES, now - phase_start)
                        phase_start = now
                    elif prev in WAIT_PHASES and out.phase not in WAIT_PHASES:  # ... and goes on where it stopped,
                        same = paused is not None and paused[0] == (out.phase in BUILD_PHASES)  # or, the build
                        phase_start = now - paused[1] if same else now  # done, the run clock starts
                    elif prev in BUILD_PHASES and out.phase not in BUILD_PHASES:
                        phase_start = now  # the run clock starts once built
                elif msg["type"] == "result":
                    out.result = msg.get("result")
                    out.phases.append(("end", time.monotonic() - t_start))
            if out.result is not None:
                break
    finally:
        sel.close()


def _sent_at(msg: dict, last: float) -> float:
    """When the judge sent a message (its `sent`), held between the previous phase's start and now: a caller that
    reads the channel late (a loaded host) would otherwise move time from one phase into the next."""
    now = time.monotonic()
    sent = msg.get("sent")
    return min(max(float(sent), last), now) if isinstance(sent, (int, float)) and math.isfinite(sent) else now


def _fork(env: dict, work_dir: Path, root: Path, log_fd: int, chan_fd: int, early: bool = False):
    """A worker forked by the zygote, or None (zygote off or unusable, bwrap sandbox): then spawn one. `early`: a
    build-only job, which the zygote forks before its Triton and dynamo imports are done (`zygote`)."""
    if not zygote.enabled():
        return None
    settings = sandbox.fork_settings(env)
    if settings is None:
        return None
    env, limits = settings
    z = zygote.get(env, root)
    if z is None:
        return None
    try:
        return z.fork(env, work_dir, limits, log_fd, chan_fd, early)
    except (OSError, ValueError, KeyError):  # the zygote died under us: spawn this one, restart it next time
        return None


_LIVE: dict[int, tuple[subprocess.Popen, str]] = {}  # pid -> (worker, tag), while run_worker watches it
_LIVE_LOCK = threading.Lock()


def kill_live_workers() -> int:
    """Kill every worker this process is running now (an interrupted caller abandoning its evaluations).

    The threads watching them see the channel close and return a `crashed` verdict, which such a
    caller drops. Returns how many workers were killed.
    """
    with _LIVE_LOCK:
        live = list(_LIVE.values())
    warm.discard_all()
    for proc, tag in live:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        kill_tagged(tag)
    return len(live)


def _parse(line: bytes, nonce: str) -> dict | None:
    try:
        msg = json.loads(line)
    except ValueError:
        return None
    if not isinstance(msg, dict) or msg.get("nonce") != nonce or msg.get("type") not in ("phase", "result"):
        return None
    return msg


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


def _tail(path: Path, lines: int = 25, max_chars: int = 3000) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    tail = "\n".join(text.strip().splitlines()[-lines:])
    return tail[-max_chars:]


def describe_workers(mode: str | None = None) -> dict:
    """How workers are isolated and started here (`sandbox.describe` + fork or spawn): for `/v1/stats`, logs
    and bug reports."""
    return {**sandbox.describe(mode), "worker_start": "fork" if zygote.will_fork(mode) else "spawn"}


def describe_death(out: WorkerOutcome) -> str:
    rc = out.returncode
    if rc is not None and rc < 0:
        head = f"the worker died from {describe_signal(-rc)} during {out.phase}"
    else:
        head = f"the worker exited with code {rc} during {out.phase} without reporting (os._exit or sys.exit?)"
    return head + (f"\n--- worker output (tail) ---\n{out.log_tail}" if out.log_tail else "")
