"""The reward: completions -> verdicts from the reward service -> checked, smoothed, clipped rewards.

Raw reward: the speedup for `correct` (its CI low end with `conservative`), else `fail`, `cheat` (rejected, a
jump that did not survive re-measurement, a judge model's veto) or `unparsable`. Reward = clip((r − μ) / σ,
±clip) over a per-task window (0 when σ = 0). A speedup above `jump_above` or `jump_vs_best` × the task's best
counts only after re-measurement, at the lowest. A distinct (task, normalised source) is judged once per call
and remembered for the run; a 5xx or a lost connection is retried, a 4xx stops training. `state_dict()` is what
a resume needs.

Rationale: docs/design/train.md#rewards
"""
from __future__ import annotations

import math
import statistics
import time
from collections import deque
from dataclasses import dataclass, field

from kernelcraft.candidate import normalized_hash
from kernelcraft.client import ServiceError
from kernelcraft.task import Task
from kernelcraft.train.models import TrainError
from kernelcraft.train.prompting import extract_code

EPS = 1e-9


@dataclass
class Outcome:
    """What one completion earned, and why."""
    raw: float
    reward: float = 0.0
    status: str = "parse_error"  # a verdict status, or parse_error
    speedup: float | None = None
    reason: str = ""
    code: str | None = None
    remeasured: bool = False
    verdict: dict | None = None
    evaluated: bool = field(default=False, repr=False)


class Smoother:
    """(r − μ) / σ over a running window of raw rewards per task, clipped to ±clip."""

    def __init__(self, window: int, clip: float):
        self.window, self.clip = window, clip
        self.windows: dict[str, deque] = {}

    def shape(self, key: str, raws: list[float]) -> list[float]:
        w = self.windows.setdefault(key, deque(maxlen=self.window))
        w.extend(raws)
        mu, sigma = statistics.fmean(w), statistics.pstdev(w)
        if sigma < EPS:
            return [0.0 for _ in raws]
        return [max(-self.clip, min(self.clip, (r - mu) / sigma)) for r in raws]

    def state_dict(self) -> dict:
        return {k: list(v) for k, v in self.windows.items()}

    def load_state_dict(self, state: dict) -> None:
        self.windows = {k: deque(v, maxlen=self.window) for k, v in state.items()}


class KernelReward:
    def __init__(self, evaluator, settings, *, options: dict | None = None, variants=None, hackcases=None,
                 judge_model=None, stage: str = "grpo", max_batch: int = 64, cache_size: int = 100_000,
                 retries: int = 4):
        self.evaluator, self.s = evaluator, settings
        self.options = dict(options or {})
        self.variants, self.hackcases, self.judge_model = variants, hackcases, judge_model
        self.stage, self.max_batch, self.cache_size, self.retries = stage, max_batch, cache_size, retries
        self.smoother = Smoother(settings.window, settings.clip)
        self.cache: dict[tuple[str, str], Outcome] = {}
        self._parsed_memo: dict[str, tuple] = {}  # completion text -> (code, why, normalised hash)
        self.evaluations = 0
        self.active_s = 0.0  # seconds spent waiting for the service
        self.latencies: list[float] = []
        self.last_stats: dict = {}

    # -- the service -------------------------------------------------------------------------------
    def _judge(self, items: list[dict]) -> list[dict]:
        verdicts = []
        for i in range(0, len(items), self.max_batch):
            t0 = time.monotonic()
            verdicts += self._batch(items[i:i + self.max_batch])
            dt = time.monotonic() - t0
            self.active_s += dt
            self.latencies.append(dt)
        self.evaluations += len(items)
        return verdicts

    def _batch(self, items: list[dict]) -> list[dict]:
        """One batch request; a connection error or a 5xx is retried with backoff, a 4xx is our bug."""
        for attempt in range(self.retries + 1):
            try:
                return self.evaluator.evaluate_batch(items)
            except ServiceError as e:
                if e.status < 500 or attempt == self.retries:
                    raise TrainError(f"the reward service refused a batch: {e}") from None
            except OSError as e:  # urllib's URLError, a reset connection
                if attempt == self.retries:
                    raise TrainError(f"the reward service is unreachable: {e}") from None
            time.sleep(min(60.0, 2.0 ** attempt))
        raise AssertionError("unreachable")

    def _item(self, task: Task, code: str, **extra) -> dict:
        return {"task": task.source, "candidate": code, "options": {**self.options, **extra}}

    # -- checks ------------------------------------------------------------------------------------
    def _is_jump(self, speedup: float, best: float | None) -> str | None:
        if self.s.jump_above is not None and speedup > self.s.jump_above:
            return f"speedup {speedup:.2f}x above {self.s.jump_above:g}x"
        if self.s.jump_vs_best is not None and best and speedup > self.s.jump_vs_best * best:
            return f"speedup {speedup:.2f}x above {self.s.jump_vs_best:g}x the task's best ({best:.2f}x)"
        return None

    def _remeasure(self, task: Task, code: str, first: dict) -> tuple[dict | None, str, str]:
        """(verdict to count or None, hack reason, detail) after `remeasure` fresh-worker evaluations."""
        seed = int(self.options.get("seed", 42))
        items = [self._item(task, code, seed=seed + 1009 * (i + 1)) for i in range(self.s.remeasure)]
        again = self._judge(items)
        bad = next((v for v in again if v.get("status") != "correct" or not v.get("speedup")), None)
        if bad is not None:
            return None, "jump_not_reproduced", (f"{first['speedup']:.2f}x, then {bad.get('status')} in a fresh "
                                                 f"worker: {bad.get('message', '')}"[:1000])
        speeds = [first["speedup"]] + [v["speedup"] for v in again]
        if max(speeds) / min(speeds) > self.s.max_spread:
            return None, "jump_spread", "re-measured speedups " + ", ".join(f"{s:.2f}x" for s in speeds)
        low = min(zip(speeds, [first] + again), key=lambda p: p[0])[1]
        return dict(low, remeasured_speeds=speeds), "", ""

    def _hack(self, task: Task, code: str, verdict: dict, label: str, reason: str, detail: str, review=None):
        if self.hackcases is not None:
            self.hackcases.add(stage=self.stage, task=task.name, task_sha256=task.sha256, code=code, label=label,
                               reason=reason, detail=detail, verdict=verdict, review=review)

    def _settle(self, task: Task, code: str, verdict: dict, best: float | None, step: int) -> Outcome:
        status = verdict.get("status")
        out = Outcome(raw=self.s.fail, status=status or "error", code=code, verdict=verdict, evaluated=True,
                      reason=",".join(verdict.get("reasons") or []))
        if status == "rejected":
            out.raw = self.s.cheat
            self._hack(task, code, verdict, "hack", out.reason or "rejected", verdict.get("message", ""))
            return out
        if status != "correct" or not verdict.get("speedup"):
            return out
        speedup = float(verdict["speedup"])
        flag = self._is_jump(speedup, best)
        if flag:
            if "remeasured" in (verdict.get("guards") or []):
                out.remeasured = True  # the judge re-measured it in fresh workers and reports the lowest
            else:
                counted, reason, detail = self._remeasure(task, code, verdict)
                if counted is None:
                    out.raw, out.status, out.reason = self.s.cheat, "rejected", reason
                    self._hack(task, code, verdict, "hack", reason, f"{flag}; {detail}")
                    return out
                verdict, speedup, out.remeasured = counted, float(counted["speedup"]), True
                out.verdict = verdict
            review = None
            if self.judge_model is not None:
                review = self.judge_model.review(reference=task.source, candidate=code, speedup=speedup, flag=flag,
                                                 similar=self.hackcases.similar(code, self.judge_model.s.similar)
                                                 if self.hackcases is not None else [])
                if review.get("veto"):
                    out.raw, out.status, out.reason = self.s.cheat, "rejected", "judge_veto"
                    self._hack(task, code, verdict, "hack", "judge_veto", review.get("reason", ""), review)
                    return out
            self._hack(task, code, verdict, "suspicious", "jump", flag, review)
        out.speedup = speedup
        ci = (verdict.get("timing") or {}).get("ci95")
        out.raw = float(ci[0]) if self.s.conservative and ci else speedup
        if self.variants is not None:
            self.variants.add(task, code, verdict, policy=self.stage, round=step)
        return out

    # -- scoring -----------------------------------------------------------------------------------
    def _parsed(self, comp) -> tuple[str | None, str, str | None]:
        """(code, why, normalised hash) of a completion; remembered for text completions (a GRPO group, or a
        small policy, repeats itself, and parsing and hashing a candidate costs more than a cached verdict)."""
        hit = self._parsed_memo.get(comp) if isinstance(comp, str) else None
        if hit is None:
            code, why = extract_code(comp)
            hit = (code, why, normalized_hash(code) if code is not None else None)
            if isinstance(comp, str) and len(self._parsed_memo) < self.cache_size:
                self._parsed_memo[comp] = hit
        return hit

    def judge(self, tasks: list[Task], completions: list, *, step: int = 0) -> list[Outcome]:
        """Verdict-backed raw rewards (no smoothing): parse, judge once per distinct candidate, check jumps."""
        if len(tasks) != len(completions):
            raise ValueError(f"{len(tasks)} tasks for {len(completions)} completions")
        outs: list[Outcome | None] = [None] * len(completions)
        todo: dict[tuple[str, str], list[int]] = {}
        for i, (task, comp) in enumerate(zip(tasks, completions)):
            code, why, h = self._parsed(comp)
            if code is None:
                outs[i] = Outcome(raw=self.s.unparsable, status="parse_error", reason=why)
                continue
            key = (task.sha256, h)
            if key in self.cache:
                outs[i] = Outcome(**{**self.cache[key].__dict__, "evaluated": False})
            else:
                todo.setdefault(key, []).append(i)
        keys = list(todo)
        if keys:
            firsts = [todo[k][0] for k in keys]
            bests = {tasks[i].sha256: (self.variants.best(tasks[i]) if self.variants is not None else None)
                     for i in firsts}
            codes = {i: self._parsed(completions[i])[0] for i in firsts}
            verdicts = self._judge([self._item(tasks[i], codes[i]) for i in firsts])
            for k, i, v in zip(keys, firsts, verdicts):
                o = self._settle(tasks[i], codes[i], v, bests[tasks[i].sha256], step)
                if len(self.cache) < self.cache_size:
                    self.cache[k] = o
                for j in todo[k]:
                    outs[j] = o if j == i else Outcome(**{**o.__dict__, "evaluated": False})
        return outs

    def score(self, tasks: list[Task], completions: list, *, step: int = 0) -> list[Outcome]:
        """Judge, then smooth per task (in input order) and clip; `last_stats` describes the call."""
        evals0, t0 = self.evaluations, time.monotonic()
        outs = self.judge(tasks, completions, step=step)
        by_task: dict[str, list[int]] = {}
        for i, t in enumerate(tasks):
            by_task.setdefault(t.sha256, []).append(i)
        for key, idx in by_task.items():
            for i, r in zip(idx, self.smoother.shape(key, [outs[i].raw for i in idx])):
                outs[i].reward = r
        n = len(outs) or 1
        correct = [o for o in outs if o.status == "correct"]
        self.last_stats = {
            "reward_mean": sum(o.reward for o in outs) / n, "reward_max": max((o.reward for o in outs), default=0.0),
            "raw_reward_mean": sum(o.raw for o in outs) / n, "raw_reward_max": max((o.raw for o in outs), default=0.0),
            "correct_rate": len(correct) / n, "fast_1": sum(1 for o in correct if (o.speedup or 0) > 1.0) / n,
            "parse_error_rate": sum(1 for o in outs if o.status == "parse_error") / n,
            "rejected": sum(1 for o in outs if o.status == "rejected"),
            "remeasured": sum(1 for o in outs if o.remeasured and o.evaluated),
            "evaluations": self.evaluations - evals0, "evaluations_total": self.evaluations,
            "reward_call_s": time.monotonic() - t0,
        }
        return outs

    # -- resume ------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"windows": self.smoother.state_dict(), "evaluations": self.evaluations, "active_s": self.active_s,
                "latencies": self.latencies[-10_000:]}

    def load_state_dict(self, state: dict) -> None:
        self.smoother.load_state_dict(state.get("windows", {}))
        self.evaluations = int(state.get("evaluations", 0))
        self.active_s = float(state.get("active_s", 0.0))
        self.latencies = list(state.get("latencies", []))


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    s = sorted(values)
    return s[max(0, min(len(s) - 1, math.ceil(q / 100 * len(s)) - 1))]
