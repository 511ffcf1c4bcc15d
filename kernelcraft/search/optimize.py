"""The optimisation loop: propose (policy) -> record (run database) -> evaluate (workers) -> repeat.

Every proposal is stored before it is evaluated and every verdict as it arrives, so a run resumes (same
`--out`) where it stopped; the budget counts candidates across invocations. A null control sets the bar.
The best is a candidate that is correct, verified faster (95% CI lower bound above the bar), a drop-in for the
reference's weights and, unless `confirm` is 0, confirmed by a re-measurement in a fresh worker; `OUT/best.py`
is byte-identical to it. Without one, a finished run writes its fallback there (`search.fallback`), labelled.
The run's protocol is pinned in the database. The library prints nothing (`on_event`); `cancel` stops a run,
dropping verdicts that arrive after it.
Rationale: docs/design/search.md#optimize
"""
from __future__ import annotations

import fcntl
import json
import math
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from kernelcraft.devices import default_device, default_jobs, device_info
from kernelcraft.evaluate import evaluate
from kernelcraft.protocol import Protocol
from kernelcraft.search import exemplars as ex
from kernelcraft.search import fallback
from kernelcraft.search.policies import Context, Policy, make_policy
from kernelcraft.search.prompt import Failure
from kernelcraft.search.rundb import RunDB
from kernelcraft.search.shared import shared_verdict
from kernelcraft.task import Task, load_task
from kernelcraft.search.techniques import techniques


def drop_in(verdict: dict | None) -> bool:
    """Would the reference's state_dict() load into this candidate? False only when the judge found it would not
    (`weights.matched` False: a `correct` verdict says so only where the reference holds nothing but constant
    buffers, or where a judge that did not apply the `weights_mismatch` rule stored it); records without a
    `weights` field say nothing and count as drop-ins."""
    return ((verdict or {}).get("weights") or {}).get("matched") is not False


class RunInUse(RuntimeError):
    """Another process is running an optimisation in this directory."""


class Cancelled(RuntimeError):
    """The caller set `cancel`: the run stopped; a resume re-queues what was in flight (docs/design/search.md#optimize)."""


@dataclass
class Options:
    policy: str = "recipes"
    budget: int | None = 16
    time_limit_s: float | None = None
    k: int = 4
    jobs: int | None = None
    patience: int | None = 3
    min_gain: float = 0.01
    exemplars: int = 2
    tau: float = 1.0
    bucket_width: float = 0.1
    selector: str = "contrastive"
    failures: int = 3
    seed: int = 0
    device: str | None = None
    protocol: Protocol = field(default_factory=Protocol)  # how every candidate is judged (its seed: candidates')
    confirm: int = 2
    min_speedup: float = 1.0
    null_control: bool = True
    allow_precision_change: bool = False
    backend: str = "any"
    policy_options: dict = field(default_factory=dict)
    # verdicts already measured for exact candidate texts (candidate sha256 -> verdict record), e.g. the bench's
    # baselines, which the recipes policy's first round proposes again: taken instead of a new evaluation when
    # judged under this run's protocol (`search.shared`). An execution setting: not pinned, not stored in the options.
    known_verdicts: dict = field(default_factory=dict)


@dataclass
class Result:
    task: str
    status: str  # improved | no_improvement | no_correct
    best_path: str | None  # the verified-faster best's (best_* and confirmed: null/False without one)
    best_speedup: float | None
    candidates: int
    run_dir: str
    best_ci95: list | None = None
    best_candidate: int | None = None
    best_techniques: list = field(default_factory=list)
    best_note: str | None = None  # the policy's word on what the best is (the `tuned` recipe: template and configuration)
    confirmed: bool = False
    correct: int = 0
    verified_faster: int = 0
    failed: int = 0
    parse_errors: int = 0
    rounds: int = 0
    stopped: str = ""
    policy: str = ""
    device: str = ""
    tokens: dict = field(default_factory=dict)
    null_control_speedup: float | None = None
    bar: float = 1.0
    wall_s: float = 0.0
    stopped_detail: str = ""
    budget: int | None = None
    wall_s_total: float = 0.0
    invocations: int = 1
    best_kind: str = ""  # what OUT/best.py holds: candidate | fallback_candidate | reference (fallback.KINDS)
    fallback: dict | None = None  # without a verified-faster best: what best.py holds, its speedup and CI

    def to_json(self) -> dict:
        return asdict(self)


class RunLock:
    """One process per output directory (a flock on `<out>/<name>`, freed if the holder dies)."""

    def __init__(self, out: Path, name: str = "run.lock", command: str = "optimize", error: type = RunInUse):
        self.f = open(out / name, "w")
        try:
            fcntl.flock(self.f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.f.close()
            raise error(f"{out} is in use by another `kernelcraft {command}` ({name} is held)") from None

    def release(self) -> None:
        fcntl.flock(self.f, fcntl.LOCK_UN)
        self.f.close()


def optimize(task: "str | Path | Task", out: "str | Path", options: Options | None = None, *,
             policy: Policy | None = None, on_event: Callable[..., None] | None = None,
             cancel: threading.Event | None = None) -> Result:
    """Run (or resume) a search in `out` and return its summary (also written to out/summary.json)."""
    opts = options or Options()
    task = load_task(task)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    device = opts.device or default_device()
    lock = RunLock(out)
    db = RunDB(out)
    try:
        run = _Run(task, out, db, opts, device, policy, on_event or (lambda kind, **data: None), cancel)
        return run.go()
    finally:
        db.close()
        lock.release()


def _pooled(search: float, confirmed: float) -> float:
    """A leader's speedup over its two measurements (geometric mean): what picks the best among confirmed leaders.
    Picking by the confirmations alone would re-select on noise (the larger of two re-measurements of equal
    programs reads high); the number reported is still the confirmation's."""
    return math.sqrt(search * confirmed)


class _Run:
    def __init__(self, task: Task, out: Path, db: RunDB, opts: Options, device: str, policy, emit,
                 cancel: threading.Event | None = None):
        self.task, self.out, self.db, self.opts, self.device, self.emit = task, out, db, opts, device, emit
        self.cancel = cancel
        known = db.get_meta("task_sha256")
        if known is not None and known != task.sha256:
            raise ValueError(f"{out} holds a run of another task ({db.get_meta('task')}); use another --out")
        if known is None:
            db.set_meta("task", task.name)
            db.set_meta("task_sha256", task.sha256)
            db.set_meta("task_source", task.source)
            db.set_meta("created_at", time.time())
        self.protocol = opts.protocol.resolved(device)
        pinned, now = (db.get_meta("options") or {}).get("protocol"), self.protocol.key()
        if pinned is not None and pinned != now:
            changed = sorted(k for k in set(pinned) | set(now) if pinned.get(k) != now.get(k))
            raise ValueError(f"{out} holds a run judged under another protocol ({', '.join(changed)} differ): "
                             "resume it with the same options, or use another --out")
        db.set_meta("options", {**{k: v for k, v in asdict(opts).items()
                                   if k not in ("policy_options", "protocol", "known_verdicts")},
                                "protocol": now})
        self.info = device_info(device)
        db.set_meta("device", self.info.describe())
        self.policy = policy or make_policy(opts.policy, **opts.policy_options)
        self.eval_time = self.protocol.time_budget_s
        self.jobs = opts.jobs or default_jobs(device)
        self.bar = opts.min_speedup
        self.control = None

    def _check(self) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise Cancelled(f"optimize {self.task.name}: cancelled")

    # -- evaluation --------------------------------------------------------------------------------
    def _evaluate(self, source: str, seed: int, time_budget: float) -> dict:
        self._check()
        best = self.best_verified()
        try:  # a speedup far above the best so far is re-measured in a fresh worker by the evaluator
            v = evaluate(self.task, source, protocol=self.protocol.with_(seed=seed, time_budget_s=time_budget),
                         device=self.device, best_known_speedup=best if best > 1.0 else None).to_json()
        except ValueError:
            raise  # a bad option (device, mode): the caller's error, not the candidate's
        except Exception as e:  # noqa: BLE001 - a harness bug must not kill a long run
            v = {"status": "runtime_error", "reasons": ["harness_error"], "speedup": None,
                 "message": f"kernelcraft failed evaluating this candidate: {type(e).__name__}: {e}"}
        self._check()  # cancelled meanwhile: its worker may have been killed, so the verdict is not recorded
        return v

    def _eval_one(self, row) -> None:
        self.db.claim(row.id)
        self.emit("eval_start", id=row.id)
        first = self.protocol.with_(time_budget_s=self.eval_time)  # what `_evaluate` below would judge under
        verdict = (shared_verdict(self.opts.known_verdicts, row.source, first.key(), self.info)
                   or self._evaluate(row.source, first.seed, first.time_budget_s))
        self.db.finish(row.id, verdict)
        done = self.db.get(row.id)
        self.emit("verdict", id=row.id, status=done.status, speedup=done.speedup,
                  ci95=[done.ci_low, done.ci_high], techniques=techniques(done.source, done.meta),
                  message=(done.message or "").splitlines()[0][:200] if done.message else "")

    def _drain(self) -> None:
        queued = self.db.queued()
        if not queued:
            return
        with ThreadPoolExecutor(max_workers=min(self.jobs, len(queued))) as pool:
            for f in [pool.submit(self._eval_one, r) for r in queued]:
                f.result()

    # -- proposing ---------------------------------------------------------------------------------
    def _context(self, rnd: int, k: int, rows) -> Context:
        rng = random.Random(f"{self.opts.seed}:{rnd}")
        items = [ex.Exemplar(r.id, r.source, r.speedup, techniques(r.source, r.meta), r.meta)
                 for r in rows if r.correct]
        sel = dict(n=self.opts.exemplars, tau=self.opts.tau, bucket_width=self.opts.bucket_width)
        if self.opts.selector == "random":
            sel = dict(n=self.opts.exemplars)
        failed = [r for r in rows if r.state == "done" and not r.correct][-self.opts.failures:] \
            if self.opts.failures else []
        failures = [Failure(r.id, r.status or "?", r.reasons, r.message) for r in failed]
        p = self.protocol
        tol = (f"atol {p.atol:g}, rtol {p.rtol if p.rtol is not None else p.atol:g}" if p.atol is not None
               else "1e-4 for float32, 1e-2 for float16/bfloat16; atol scales with the output's RMS")
        return Context(task=self.task, device=self.info, round=rnd, k=k, history=rows, failures=failures,
                       sample_exemplars=lambda: ex.select(items, rng, selector=self.opts.selector, **sel),
                       rng=rng, allow_precision_change=self.opts.allow_precision_change,
                       backend=self.opts.backend, tolerance=tol, mode=p.mode)

    def _record(self, proposals, rnd: int) -> tuple[int, int]:
        new = dups = 0
        for p in proposals:
            if p.source is None:
                self.db.add_parse_error(policy=self.opts.policy, round=rnd, reply=p.reply, prompt=p.prompt,
                                        usage=p.usage, meta=p.meta, parents=p.parents,
                                        message=p.error or "no code", reason=p.reason or "parse_error")
                new += 1
                self.emit("verdict", id=None, status="parse_error", speedup=None, ci95=[None, None],
                          techniques=[], message=p.error or "")
                continue
            _, is_new = self.db.add_candidate(p.source, policy=self.opts.policy, round=rnd, parents=p.parents,
                                              meta=p.meta, prompt=p.prompt, reply=p.reply, usage=p.usage)
            new += is_new
            dups += not is_new
        return new, dups

    def best_verified(self) -> float:
        rows = [r for r in self.db.rows("WHERE status = 'correct'") if self._faster(r.ci_low)]
        return max((r.speedup for r in rows), default=1.0)

    def _faster(self, ci_low) -> bool:
        return ci_low is not None and ci_low > self.bar

    def _null_control(self) -> None:
        """Time the reference against itself once per run; its speedup raises the bar (docs/design/search.md#optimize)."""
        rec = self.db.get_meta("null_control")
        if rec is None and self.opts.null_control:
            self.emit("control_start")
            src = (self.task.source.rstrip() + "\n\n\nclass ModelNew(Model):\n"
                   '    """The reference itself: a null control for the timing harness."""\n')
            v = self._evaluate(src, self.protocol.seed, self.eval_time)
            rec = {"status": v.get("status"), "speedup": v.get("speedup"),
                   "ci95": (v.get("timing") or {}).get("ci95"), "message": (v.get("message") or "")[:500],
                   "phases_s": v.get("phases_s") or {}}  # its cost, for the bench's `time_use`
            self.db.set_meta("null_control", rec)
            self.emit("control", **rec)
        self.control = rec
        bias = fallback.control_bias(rec)
        if bias is not None:
            self.bar = max(self.opts.min_speedup, bias)  # a bias the CI excludes: correct for it

    # -- the loop ----------------------------------------------------------------------------------
    def go(self) -> Result:
        t0 = time.monotonic()
        requeued = self.db.requeue_in_flight()
        self.db.log("start", resumed=self.db.count() > 0, requeued=requeued, policy=self.opts.policy)
        done = self.db.rows("WHERE state = 'done'")
        self.emit("start", resumed=self.db.count() > 0, requeued=requeued, candidates=self.db.count(),
                  done=len(done), correct=sum(r.correct for r in done), budget=self.opts.budget,
                  jobs=self.jobs, device=self.info.describe())
        preflight = getattr(self.policy, "preflight", None)
        if preflight is not None:
            preflight()  # an unreachable endpoint is reported now, with what was tried (PolicyError)
        self._null_control()
        self._drain()
        rnd, stale, flat, stopped, detail = self.db.last_round(), 0, 0, "", ""
        while True:
            n = self.db.count()
            if self.opts.budget is not None and n >= self.opts.budget:
                stopped, detail = "budget", f"the budget of {self.opts.budget} candidates is used"
                break
            if self.opts.time_limit_s is not None and time.monotonic() - t0 >= self.opts.time_limit_s:
                stopped, detail = "time", f"the time limit of {self.opts.time_limit_s:g} s was reached"
                break
            self._check()
            rnd += 1
            k = self.opts.k if self.opts.budget is None else min(self.opts.k, self.opts.budget - n)
            before = self.best_verified()
            ctx = self._context(rnd, k, self.db.rows())
            proposals = self.policy.propose(ctx)[:k]
            if not proposals:
                stopped, detail = "exhausted", self._exhausted(ctx)
                break
            new, dups = self._record(proposals, rnd)
            self.emit("round", round=rnd, proposed=len(proposals), new=new, duplicates=dups)
            stale = stale + 1 if new == 0 else 0
            if stale >= 3:
                stopped, detail = "exhausted", f"the {self.opts.policy} policy proposed only duplicates of earlier " \
                    "candidates 3 rounds in a row"
                break
            self._drain()
            flat = 0 if self.best_verified() > before * (1 + self.opts.min_gain) else flat + 1
            if self.opts.patience and flat >= self.opts.patience:
                stopped, detail = "patience", (f"{flat} rounds in a row without a >{self.opts.min_gain:.0%} gain in the "
                                               "best verified speedup (--patience)")
                break
        self.db.log("stop", reason=stopped, detail=detail)
        result = self._finish(stopped, rnd, time.monotonic() - t0, detail)
        self.emit("done", **result.to_json())
        return result

    def _exhausted(self, ctx: Context) -> str:
        explain = getattr(self.policy, "exhausted", None)
        try:
            why = explain(ctx) if explain is not None else ""
        except Exception as e:  # noqa: BLE001 - an explanation must not end a finished run
            why = f"({type(e).__name__} while explaining: {e})"
        return why or (f"the {self.opts.policy} policy has nothing new to propose after {self.db.count()} distinct "
                       "candidate(s)")

    def _confirm(self, r) -> dict:
        """Re-evaluate `r` in a fresh worker (new inputs, seed + 1000, twice the timing budget) and store it."""
        self.emit("confirm_start", id=r.id)
        self.db.add_confirmation(r.id, self._evaluate(r.source, self.protocol.seed + 1000, 2 * self.eval_time))
        c = self.db.confirmations()[r.id]
        self.emit("confirm", id=r.id, status=c["status"], speedup=c["speedup"], ci95=[c["ci_low"], c["ci_high"]])
        return c

    def _finish(self, stopped: str, rounds: int, wall: float, detail: str = "") -> Result:
        rows = self.db.rows()
        leaders = sorted((r for r in rows if r.correct and self._faster(r.ci_low) and drop_in(r.verdict)),
                         key=lambda r: -r.speedup)
        best, best_sp, best_ci, is_conf = None, None, None, False
        if self.opts.confirm:
            ok, tries = [], 0
            for r in leaders:  # confirm leaders in order until `confirm` of them hold up (bounded effort)
                if len(ok) >= self.opts.confirm or tries >= 2 * self.opts.confirm:
                    break
                c = self.db.confirmations().get(r.id)
                if c is None and ok and r.ci_high is not None and r.ci_high < max(x["speedup"] for _, x in ok):
                    continue  # its interval lies below a confirmed leader's number: it would not be the best
                if c is None:
                    tries += 1
                    c = self._confirm(r)
                if c["status"] == "correct" and self._faster(c["ci_low"]):
                    ok.append((r, c))
            confs = self.db.confirmations()  # every leader whose confirmation holds, earlier invocations' too
            held = [(r, confs[r.id]) for r in leaders if r.id in confs and confs[r.id]["status"] == "correct"
                    and self._faster(confs[r.id]["ci_low"])]
            if held:  # decided by every measurement of each, reported at its confirmation (docs/search.md)
                best, c = max(held, key=lambda rc: (_pooled(rc[0].speedup, rc[1]["speedup"]), -rc[0].id))
                best_sp, best_ci, is_conf = c["speedup"], [c["ci_low"], c["ci_high"]], True
        elif leaders:
            best, best_sp, best_ci = leaders[0], leaders[0].speedup, [leaders[0].ci_low, leaders[0].ci_high]
        best_path, fb = self.out / "best.py", None
        if best is not None:
            fallback.write(best_path, best.source)
            status = "improved"
        else:  # the fallback, with its header (docs/search.md#the-fallback)
            status = "no_improvement" if any(r.correct for r in rows) else "no_correct"
            fb = fallback.choose([r for r in rows if r.correct and drop_in(r.verdict)], self.db.confirmations(),
                                 bar=self.bar, floor_=fallback.floor(self.control), confirm=self.opts.confirm,
                                 confirm_one=self._confirm)
            fallback.write(best_path, fallback.program(fb, self.task, status=status, bar=self.bar,
                                                       mode=self.protocol.mode))
        tokens = {"prompt": 0, "completion": 0}
        for r in rows:
            for k in tokens:
                tokens[k] += int((r.usage or {}).get(f"{k}_tokens", 0) or 0)
        res = Result(
            task=self.task.name, status=status, best_path=str(best_path) if best else None,
            best_speedup=best_sp, candidates=len(rows), run_dir=str(self.out), best_ci95=best_ci,
            best_candidate=best.id if best else None, best_techniques=techniques(best.source, best.meta) if best else [],
            best_note=(best.meta or {}).get("note") if best else None, confirmed=is_conf, correct=sum(r.correct for r in rows),
            verified_faster=sum(bool(r.correct and self._faster(r.ci_low)) for r in rows),
            failed=sum(r.state == "done" and not r.correct and r.status != "parse_error" for r in rows),
            parse_errors=sum(r.status == "parse_error" for r in rows), rounds=rounds, stopped=stopped,
            policy=self.opts.policy, device=self.info.describe(), tokens=tokens, bar=self.bar,
            null_control_speedup=(self.control or {}).get("speedup"), wall_s=round(wall, 2),
            stopped_detail=detail, budget=self.opts.budget, best_kind=fb.kind if fb else "candidate",
            fallback=fb.to_json(best_path) if fb else None)
        spans = self.db.invocations()
        res.invocations = len(spans) or 1  # this one is the last: its own clock, the earlier ones as stored
        res.wall_s_total = round(sum(b - a for a, b in spans[:-1]) + wall, 2)
        (self.out / "summary.json").write_text(json.dumps(res.to_json(), indent=2) + "\n")
        self.db.set_meta("summary", res.to_json())
        return res

