"""Exemplar selection: which previous candidates (with their scores) the policy is shown.

Design decisions
- Contrastive selection as in CUDA-L1: correct candidates are grouped into score buckets; N distinct
  buckets are drawn without replacement with P(bucket) ∝ exp((mean_score_bucket − mean_score) / τ),
  where mean_score is the mean over all correct candidates, and one candidate is drawn uniformly from
  each chosen bucket. Showing codes from *different* score levels is the point: the policy can contrast
  a fast and a slow implementation and reason about why one is faster.
- The score is ln(speedup) by default: equal ratios are equal steps (1x -> 2x counts as much as
  2x -> 4x), so τ means the same on every task. Buckets are fixed-width bins of the score
  (`bucket_width`, default 0.1 ≈ 10% speedup steps): candidates within a bin are indistinguishable
  given timing noise. `score="speedup"` uses raw speedups (CUDA-L1's literal choice).
- When fewer than N buckets exist, all of them are used (never the same bucket twice).
- Exemplars come back best first. `random` (uniform over correct candidates, distinct) is the
  comparison baseline. Every draw uses the caller's `random.Random`, so runs replay with a seed.
"""
from __future__ import annotations

import math
import random
from collections import defaultdict
from dataclasses import dataclass, field


@dataclass
class Exemplar:
    id: int
    source: str
    speedup: float
    techniques: list[str] = field(default_factory=list)
    meta: dict = field(default_factory=dict)


def score_of(speedup: float, score: str = "log") -> float:
    if score == "log":
        return math.log(max(speedup, 1e-9))
    if score == "speedup":
        return float(speedup)
    raise ValueError(f"unknown score {score!r}: use log or speedup")


def buckets(items: list[Exemplar], *, bucket_width: float = 0.1, score: str = "log") -> dict[int, list[Exemplar]]:
    """Candidates grouped by floor(score / bucket_width)."""
    if bucket_width <= 0:
        raise ValueError("bucket_width must be positive")
    out: dict[int, list[Exemplar]] = defaultdict(list)
    for it in items:
        out[math.floor(score_of(it.speedup, score) / bucket_width)].append(it)
    return dict(out)


def bucket_probabilities(groups: dict[int, list[Exemplar]], *, tau: float = 1.0, score: str = "log",
                         exclude=()) -> dict[int, float]:
    """P(bucket) ∝ exp((mean_score_bucket − mean_score) / τ) over the buckets not in `exclude`.

    mean_score is the mean over all candidates (all buckets), fixed while drawing without replacement."""
    if tau <= 0:
        raise ValueError("tau must be positive")
    everyone = [score_of(e.speedup, score) for g in groups.values() for e in g]
    if not everyone:
        return {}
    mean_all = sum(everyone) / len(everyone)
    logits = {}
    for b, g in groups.items():
        if b in exclude:
            continue
        mean_b = sum(score_of(e.speedup, score) for e in g) / len(g)
        logits[b] = (mean_b - mean_all) / tau
    if not logits:
        return {}
    top = max(logits.values())
    w = {b: math.exp(v - top) for b, v in logits.items()}  # shifted for stability; ratios unchanged
    total = sum(w.values())
    return {b: v / total for b, v in w.items()}


def contrastive(items: list[Exemplar], rng: random.Random, *, n: int = 2, tau: float = 1.0,
                bucket_width: float = 0.1, score: str = "log") -> list[Exemplar]:
    """N exemplars from N distinct score buckets (see module docstring), best first."""
    groups = buckets(items, bucket_width=bucket_width, score=score)
    chosen: list[int] = []
    for _ in range(min(n, len(groups))):
        probs = bucket_probabilities(groups, tau=tau, score=score, exclude=chosen)
        keys = sorted(probs)
        chosen.append(rng.choices(keys, weights=[probs[k] for k in keys])[0])
    picks = [rng.choice(sorted(groups[b], key=lambda e: e.id)) for b in chosen]
    return sorted(picks, key=lambda e: -e.speedup)


def uniform(items: list[Exemplar], rng: random.Random, *, n: int = 2, **_) -> list[Exemplar]:
    """The `random` selector: n distinct candidates uniformly, best first."""
    ordered = sorted(items, key=lambda e: e.id)
    return sorted(rng.sample(ordered, min(n, len(ordered))), key=lambda e: -e.speedup)


SELECTORS = {"contrastive": contrastive, "random": uniform}


def select(items: list[Exemplar], rng: random.Random, *, selector: str = "contrastive", **opts) -> list[Exemplar]:
    if selector not in SELECTORS:
        raise ValueError(f"unknown selector {selector!r}: use {' or '.join(SELECTORS)}")
    return SELECTORS[selector](items, rng, **opts)
