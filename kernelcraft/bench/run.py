"""`kernelcraft bench SOURCE`: judge a whole suite of (task, candidate) pairs against baselines and summarise.

Every candidate and baseline goes through one `serve.pool.Pool` under one protocol, submitted task by task;
tasks without a candidate are optimized (`OUT/runs/<task>`, `--task-jobs` at a time) and their verified-faster
`best.py` judged afresh, or their fallback scored (`bench.fallback`). Each result is appended to
`OUT/verdicts.jsonl` as it arrives (fsync'd), keyed by (task sha, candidate sha or optimize settings): a rerun
with the same `--out` resumes from it. On a GPU with known peaks each task's minimal work is counted first
(`bench.roofline`, cached in `OUT/roofline.jsonl`). `OUT/bench.json` pins the device and the protocol; a rerun
with others is refused. Ctrl-C keeps finished lines and raises `Interrupted`.
The library prints nothing: progress goes to `on_event(kind, **data)`.
Rationale: docs/design/bench.md#run
"""
from __future__ import annotations

import json
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import as_completed
from dataclasses import replace
from pathlib import Path

from kernelcraft import devices
from kernelcraft.bench import baselines as bl
from kernelcraft.bench import fallback, roofline
from kernelcraft.bench.metrics import fallback_label, first_line, metrics, outcome, summarise
from kernelcraft.bench.options import BenchOptions
from kernelcraft.bench.records import base_record, bench_verdict, measured_texts, record, text_sha256
from kernelcraft.bench.report import write_report
from kernelcraft.bench.sources import BenchError, Item, Source, resolve
from kernelcraft.bench.taskpool import DeviceLease, OneAtATime, run_tasks
from kernelcraft.evaluate import _env, memory_key
from kernelcraft.judge.caller import gpushare, runner
from kernelcraft.judge.caller.runner import kill_live_workers
from kernelcraft.protocol import Protocol
from kernelcraft.search.optimize import Cancelled, Options, RunInUse, RunLock, optimize
from kernelcraft.search.policies import PolicyError, make_policy
from kernelcraft.search.rundb import RunDB
from kernelcraft.serve.pool import Pool

__all__ = ["BenchError", "BenchOptions", "Interrupted", "Item", "Source", "default_out", "metrics", "resolve", "run"]

BENCH_STATUSES = ("no_candidate", "input_error")


class Interrupted(KeyboardInterrupt):
    """Ctrl-C: finished verdicts are on disk; rerun the same command to resume."""

    def __init__(self, done: int, out: Path, baselines: int = 0):
        super().__init__(f"interrupted with {done} verdict(s) and {baselines} new baseline verdict(s) kept in {out}")
        self.done, self.out, self.baselines = done, out, baselines


# ---- the run ------------------------------------------------------------------------------------------------

class _Log:
    """An append-only JSONL file: every line flushed and fsync'd; a torn last line (kill -9) is skipped."""

    def __init__(self, path: Path):
        self.path = path
        self.records: dict[str, dict] = {}
        if path.exists():
            raw = path.read_bytes()
            for line in raw.splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if isinstance(rec, dict) and rec.get("key"):
                    self.records[rec["key"]] = rec
            needs_newline = bool(raw) and not raw.endswith(b"\n")
        else:
            needs_newline = False
        self.f = open(path, "a", encoding="utf-8")  # noqa: SIM115 - held open for the run, closed in close()
        if needs_newline:
            self.f.write("\n")

    def append(self, rec: dict) -> None:
        self.f.write(json.dumps(rec) + "\n")
        self.f.flush()
        os.fsync(self.f.fileno())
        self.records[rec["key"]] = rec

    def close(self) -> None:
        self.f.close()


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.@-]+", "_", name).strip("_") or "task"


def default_out(source: Source) -> Path:
    return Path("runs") / f"bench-{_slug(source.name)}"


def run(source: Source, out: str | os.PathLike | None = None, options: BenchOptions | None = None, *,
        on_event: Callable[..., None] | None = None, cancel: threading.Event | None = None) -> dict:
    """Run (or resume) a bench into `out` and return the summary (also written to OUT/summary.json).

    With more than one task optimized at once, `on_event` also gets called from those runs' threads
    ("optimize_start", "optimize"), so it must be thread-safe; "result" events come from the calling thread."""
    opts = options or BenchOptions()
    emit = on_event or (lambda kind, **data: None)
    try:
        devs = devices.resolve_many(opts.device)
    except ValueError as e:
        raise BenchError(str(e)) from None
    dev = devs[0]  # records and the protocol: every device of the list is the same product
    proto = opts.protocol.resolved(dev)
    if opts.task_jobs is not None and opts.task_jobs < 1:
        raise BenchError("task_jobs must be at least 1")
    opts = replace(opts, device=",".join(devs), task_jobs=opts.task_jobs or len(devs))  # resolved, as reported
    try:
        wanted, skipped = bl.parse(opts.baselines, dev)
    except ValueError as e:
        raise BenchError(str(e)) from None
    out = Path(out) if out is not None else default_out(source)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    protocol = proto.key()
    devname = devices.timing_identity(dev)
    optimize_cfg = {"policy": opts.policy, "budget": opts.budget, **opts.optimize_options}
    lock = RunLock(out, "bench.lock", "bench", BenchError)
    log = base_log = cache = pool = None
    stats = {"from_run": 0, "cache_hits": 0, "measured_now": 0}
    try:
        _check_meta(out, source, devname, protocol, optimize_cfg)
        items = source.items[: opts.limit] if opts.limit else list(source.items)
        opt_key = "optimize-" + text_sha256(json.dumps(optimize_cfg, sort_keys=True, default=str))[:16]
        for it in items:
            if it.error is not None or it.task is None:
                it.key = "input-" + text_sha256(f"{it.origin}\0{it.error}")[:32]
            elif it.candidate is not None:
                it.key = f"{it.task.sha256}:{text_sha256(it.candidate)}"
            elif it.missing is not None or source.has_candidates:
                it.missing = it.missing or "no candidate"
                it.key = f"{it.task.sha256}:none"
            else:
                it.key = f"{it.task.sha256}:{opt_key}"
        log = _Log(out / "verdicts.jsonl")
        base_log = _Log(out / "baselines.jsonl")
        cache = bl.Cache(Path(opts.cache_dir) / "bench" if opts.cache_dir else None)
        env = _env(None).model_dump(mode="json")
        groups: dict[str, list[Item]] = {}
        for it in items:
            groups.setdefault(it.key, []).append(it)
        resumed = sum(len(g) for k, g in groups.items() if k in log.records)

        # bench-only records (input errors, missing candidates) cost nothing: write them now
        for key, group in groups.items():
            it = group[0]
            if key in log.records or (it.error is None and it.missing is None):
                continue
            status = "input_error" if it.error is not None else "no_candidate"
            log.append(record(bench_verdict(it, status, it.error or it.missing, dev, proto.mode, env), group))

        # baselines: from this run's log, the shared cache, or measured
        tasks = {}
        for it in items:
            if it.task is not None and it.error is None:
                tasks.setdefault(it.task.sha256, it.task)
        base: dict[tuple[str, str], dict] = {}
        todo_base: list[tuple[str, str, str]] = []  # (task sha, baseline, cache key)
        evaluated = 0
        for sha in tasks:
            for b in wanted:
                if b == "eager":
                    continue
                ck = bl.cache_key(sha, devname, b, protocol)
                rec = base_log.records.get(ck)
                if rec is not None:
                    stats["from_run"] += 1
                elif opts.baseline_cache and (rec := cache.get(ck)) is not None:
                    stats["cache_hits"] += 1
                    rec = {**rec, "key": ck, "cached": True}  # as a resume reads it back: measured elsewhere
                    base_log.append(rec)
                if rec is not None:
                    base[(sha, b)] = rec
                else:
                    todo_base.append((sha, b, ck))
        todo_items = [] if opts.baselines_only else [k for k, g in groups.items()
                                                     if k not in log.records and g[0].candidate is not None]
        todo_opt = [] if opts.baselines_only else [k for k, g in groups.items() if k not in log.records
                                                   and g[0].error is None and g[0].missing is None
                                                   and g[0].candidate is None]
        emit("start", out=str(out), device=devname, items=len(items), tasks=len(tasks), resumed=resumed,
             total=len(todo_base) + len(todo_items) + len(todo_opt), baselines=wanted, skipped=skipped,
             baseline_stats=dict(stats), optimize=len(todo_opt), task_jobs=opts.task_jobs, notes=list(source.notes))
        peak = roofline.peaks(devname)  # each task's minimal work, on `meta`, for the roofline (docs/bench.md#roofline)
        if peak is not None:
            emit("roofline", tasks=len(tasks), product=peak["product"])
        work = roofline.cached_work(out, {sha: t.source for sha, t in tasks.items()}) if peak is not None else {}

        if any(devices.kind(d) == "cuda" for d in devs):
            estimate_footprints(runner.cache_root(opts.cache_dir), work, protocol)

        def roof(rec: dict, it: Item) -> float | None:  # a correct candidate's fraction of the roof, as it lands
            return roofline.of_candidate(work.get(it.task.sha256), peak, rec)

        policy = None
        if todo_opt:  # one policy for every task (an LLM client or a local model is built once), checked first
            try:
                policy = make_policy(opts.policy, **opts.optimize_options.get("policy_options", {}))
            except PolicyError as e:
                raise BenchError(str(e)) from None
            if opts.task_jobs > 1 and len(todo_opt) > 1 and not getattr(policy, "thread_safe", False):
                policy = OneAtATime(policy)

        jobs = opts.jobs
        if jobs is None and dev == "cpu":
            jobs = devices.default_jobs("cpu")
        pool = Pool(devices=devs, per_device=jobs, cache_dir=opts.cache_dir, protocol=proto)
        futures = {}
        by_task: dict[str, list] = {}  # submitted task by task (its baselines, then its candidates): a partial
        for sha, b, ck in todo_base:  # bench has complete rows, and the pool keeps the order within a slot
            by_task.setdefault(sha, []).append(("baseline", sha, b, ck))
        for key in todo_items:
            by_task.setdefault(groups[key][0].task.sha256, []).append(("item", key))
        for what in (w for ws in by_task.values() for w in ws):
            if what[0] == "item":
                it = groups[what[1]][0]
                futures[pool.submit(it.task, it.candidate)] = what
                continue
            _, sha, b, ck = what
            try:
                src = bl.source(tasks[sha].source, b)
            except Exception as e:  # noqa: BLE001 - a task the wrapper cannot render: a failed baseline
                rec = bench_verdict(Item(name=tasks[sha].name, task=tasks[sha]), "compile_error",
                                     f"could not render the {b} baseline: {type(e).__name__}: {e}", dev, proto.mode, env)
                rec.update(status="compile_error", reasons=["build_failed"])
                base[(sha, b)] = base_record(rec, sha, b, ck)
                base_log.append(base[(sha, b)])
                stats["measured_now"] += 1
                emit("result", what="baseline", name=f"{tasks[sha].name} [{b}]", status="compile_error",
                     speedup=None, message=rec["message"])
                continue
            timeout = max(proto.timeout_s, bl.MIN_TIMEOUT_S.get(b, 0.0))
            futures[pool.submit(tasks[sha], src, timeout_s=timeout)] = what
        for f in as_completed(futures):
            what = futures[f]
            v = f.result().to_json()
            if what[0] == "baseline":
                _, sha, b, ck = what
                rec = base_record(v, sha, b, ck)
                base_log.append(rec)
                cache.put(ck, rec)
                base[(sha, b)] = rec
                stats["measured_now"] += 1
                emit("result", what="baseline", name=f"{tasks[sha].name} [{b}]", status=v["status"],
                     speedup=v["speedup"], message=first_line(v["message"]))
            else:
                group = groups[what[1]]
                log.append(record(v, group))
                evaluated += len(group)
                emit("result", what="item", name=group[0].name, status=v["status"], speedup=v["speedup"],
                     message=first_line(v["message"]), outcome=outcome(v), ci95=(v.get("timing") or {}).get("ci95"),
                     roofline=roof(v, group[0]))

        stop = cancel or threading.Event()  # set on Ctrl-C or a failed task: the optimize runs stop
        lease = DeviceLease(devs)
        evaluated += _optimize_tasks(todo_opt, groups, log, opts.task_jobs, stop, emit, roof, lambda it: lease.run(
            lambda d: _optimize_item(it, out, opts, d, proto, pool, env, emit, policy, stop,
                                     known=measured_texts(base, it.task.sha256))))
        pool.close()
        pool = None
        summary = summarise(source, items, log.records, base, wanted, skipped, stats, out, devname, opts,
                             protocol, resumed, evaluated, time.monotonic() - t0, work=work)
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        if opts.report:

            write_report(summary, out / "report.html")
            summary["report"] = str(out / "report.html")
            (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        emit("done", summary=summary)
        return summary
    except KeyboardInterrupt:
        if pool is not None:
            pool.close(cancel=True, wait=False)
            pool = None

        kill_live_workers()
        raise Interrupted(len(log.records) if log else 0, out, stats.get("measured_now", 0)) from None
    finally:
        if pool is not None:
            pool.close(cancel=True, wait=False)
        for x in (log, base_log, cache):
            if x is not None:
                x.close()
        lock.release()


def estimate_footprints(root: Path, work: dict[str, dict], protocol: dict) -> None:
    """Each task's device footprint estimated from its roofline bytes, for the jobs of tasks none of whose jobs
    has reported one yet (`gpushare`): their first jobs, side by side, are not crowded out on trust."""
    known = gpushare.footprints(root)
    for sha, w in work.items():
        if isinstance(w, dict) and isinstance(w.get("bytes"), int):
            known.estimate(memory_key(sha, protocol), w["bytes"])


def _check_meta(out: Path, source: Source, devname: str, protocol: dict, optimize_cfg: dict) -> None:
    path = out / "bench.json"
    meta = {"device": devname, "protocol": protocol}
    if path.exists():
        try:
            old = json.loads(path.read_text())
        except ValueError:
            old = {}
        diff = [k for k in meta if k in old and old[k] != meta[k]]
        if diff:
            raise BenchError(f"{out} holds a bench measured with other settings ({', '.join(diff)}: "
                             f"{', '.join(str(old[k]) for k in diff)}); use another --out")
    else:
        path.write_text(json.dumps({**meta, "source": source.spec, "optimize": optimize_cfg,
                                    "created_at": time.time()}, indent=2) + "\n")


def _optimize_tasks(keys: list[str], groups: dict, log: _Log, jobs: int, stop: threading.Event, emit,
                    roof: Callable[[dict, Item], float | None], optimize_one: Callable[[Item], dict]) -> int:
    """Optimize the tasks `keys`, `jobs` at a time (docs/design/bench.md#run; `taskpool.run_tasks`); returns the items
    judged. Every record is logged and reported here, in the calling thread, in completion order."""
    def finished(key: str, rec: dict) -> int:
        group = groups[key]
        log.append(record(rec, group))
        emit("result", what="item", name=group[0].name, status=rec["status"], speedup=rec["speedup"],
             message=first_line(rec["message"]), outcome=outcome(rec), ci95=(rec.get("timing") or {}).get("ci95"),
             fallback=fallback_label(rec.get("fallback")), roofline=roof(rec, group[0]))
        return len(group)

    return run_tasks(keys, jobs, stop, lambda key: optimize_one(groups[key][0]), finished,
                     label=lambda key: groups[key][0].name)


def _optimize_item(it: Item, out: Path, opts: BenchOptions, dev: str, proto: Protocol, pool, env: dict,
                   emit, policy, stop: threading.Event | None = None, known: dict | None = None) -> dict:
    run_dir = out / "runs" / _slug(it.name)
    o = Options(policy=opts.policy, budget=opts.budget, device=dev, protocol=proto, **opts.optimize_options)
    o.known_verdicts = dict(known or {})
    emit("optimize_start", name=it.name, run_dir=str(run_dir))
    try:
        res = optimize(it.task, run_dir, o, policy=policy, cancel=stop,
                       on_event=lambda kind, **d: emit("optimize", name=it.name, event=kind, data=d))
    except (RunInUse, PolicyError, ValueError) as e:  # a bad option or a clashing run directory
        raise BenchError(f"optimize {it.name}: {e}") from None
    summary = res.to_json()
    with RunDB(run_dir) as db:  # the run's candidates: what a fallback may not repeat, and their statuses
        rows = db.rows()

    def judge(source: str, baseline: str | None = None, what: str = "its fallback") -> dict:
        if stop is not None and stop.is_set():
            raise Cancelled(f"optimize {it.name}: cancelled before judging {what}")
        timeout = {"timeout_s": max(proto.timeout_s, bl.MIN_TIMEOUT_S.get(baseline, 0.0))} if baseline else {}
        v = pool.submit(it.task, source, **timeout).result().to_json()
        if stop is not None and stop.is_set():  # its worker may have been killed: not a verdict
            raise Cancelled(f"optimize {it.name}: cancelled while judging {what}")
        return v

    if res.best_path:  # the search's own numbers are its maximum: judge best.py afresh, like any candidate
        rec = judge(Path(res.best_path).read_text(), what="best.py")
        rec.update(candidate_path=res.best_path)
    else:
        why = {"no_improvement": f"optimize found {res.correct} correct candidate(s) but none verified faster than "
                                 "the reference",
               "no_correct": "optimize found no correct candidate"}.get(res.status, res.status)
        why += f" ({res.candidates} candidates, policy {res.policy})"
        rec = fallback.record(it, res, {r.sha256 for r in rows}, known or {}, judge, why, dev=dev,
                              mode=proto.mode, env=env) if res.fallback else None
        if rec is None:  # strict mode: the reference is no answer there (docs/bench.md#fallbacks)
            nothing = "no fallback strict mode accepts" if res.fallback else "no best.py"
            rec = bench_verdict(it, "no_candidate", f"{why}: {nothing}, counted as a failure", dev, proto.mode, env)
    rec["optimize"] = {k: summary[k] for k in ("status", "best_speedup", "best_ci95", "confirmed", "candidates",
                                               "correct", "verified_faster", "stopped", "run_dir", "best_techniques",
                                               "wall_s", "best_kind", "fallback")}
    # the run's finished candidates by status: why a search without a correct candidate failed
    rec["optimize"]["statuses"] = dict(Counter(r.status or "?" for r in rows if r.state == "done"))
    return rec
