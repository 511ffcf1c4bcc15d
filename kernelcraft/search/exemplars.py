"""Exemplar selection: which previous candidates (with their scores) the policy is shown.

`contrastive`: N distinct score buckets (ln speedup, width `bucket_width`) drawn with
P ∝ exp((bucket mean − overall mean) / τ), one candidate from each; `random`: N distinct candidates. Best
first; every draw uses the caller's `random.Random`.
Rationale: docs/design/search.md#exemplars
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
    """N exemplars from N distinct score buckets (see docs/design/search.md#exemplars), best first."""
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
