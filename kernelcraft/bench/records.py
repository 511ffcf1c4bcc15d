"""What the bench writes per line: verdict records with the bench's fields, and what it hands an optimize run.

Every line of `verdicts.jsonl` and `baselines.jsonl` is verdict-shaped: the evaluator's record unchanged plus
the bench's fields, or `bench_verdict` for what the bench settles without an evaluation.
Rationale: docs/design/bench.md#records
"""
from __future__ import annotations

import hashlib

from kernelcraft.bench import baselines as bl
from kernelcraft.bench.sources import Item


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def bench_verdict(it: Item, status: str, message: str, dev: str, mode: str, env: dict) -> dict:
    """A verdict-shaped record for what the bench settles without an evaluation."""
    return {"task": it.name, "candidate_sha256": text_sha256(it.candidate) if it.candidate is not None else None,
            "device": dev, "status": status, "reasons": [status], "message": message, "correctness": None,
            "timing": None, "speedup": None, "build_s": 0.0, "wall_s": 0.0, "env": env, "mode": mode, "guards": []}


def record(verdict: dict, group: list[Item]) -> dict:
    it = group[0]
    return {**verdict, "key": it.key, "item": it.name, "items": [g.name for g in group],
            "task_sha256": it.task.sha256 if it.task is not None else None, "level": it.level,
            "task_id": it.task_id, "origin": it.origin, "candidate_path": it.candidate_path or verdict.get(
                "candidate_path"), "extra": it.extra}


def base_record(verdict: dict, sha: str, name: str, ck: str) -> dict:
    return {**verdict, "key": ck, "baseline": name, "task_sha256": sha}


def measured_texts(base: dict, task_sha: str) -> dict:
    """This task's baseline verdicts by candidate text (sha256): the recipes policy's first round proposes the
    same texts (`compile:default`, `cudagraph`), and the run takes these instead of measuring them again."""
    return {rec["candidate_sha256"]: rec for (sha, _), rec in base.items()
            if sha == task_sha and rec.get("candidate_sha256") and bl.cacheable(rec)}
