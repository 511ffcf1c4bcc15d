"""Contrastive exemplar selection: bucket probabilities follow exp((mean_bucket - mean)/tau), draws match
them statistically (fixed RNG), buckets are distinct, the code within a bucket is uniform."""
from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from kernelcraft.search.exemplars import Exemplar, bucket_probabilities, buckets, contrastive, score_of, select, uniform

SPEEDUPS = [0.5, 0.52, 1.0, 1.02, 1.04, 2.0, 4.0, 4.05]  # 4 buckets of width 0.1 in ln(speedup)


def items():
    return [Exemplar(i, f"src{i}", s) for i, s in enumerate(SPEEDUPS)]


def test_buckets_are_fixed_width_bins_of_log_speedup():
    groups = buckets(items(), bucket_width=0.1)
    sizes = sorted(len(g) for g in groups.values())
    assert sizes == [1, 2, 2, 3]
    assert {tuple(sorted(e.speedup for e in g)) for g in groups.values()} == {
        (0.5, 0.52), (1.0, 1.02, 1.04), (2.0,), (4.0, 4.05)}
    with pytest.raises(ValueError):
        buckets(items(), bucket_width=0)


@pytest.mark.parametrize("tau", [0.3, 1.0, 3.0])
@pytest.mark.parametrize("score", ["log", "speedup"])
def test_bucket_probabilities_follow_the_formula(tau, score):
    groups = buckets(items(), bucket_width=0.1)
    probs = bucket_probabilities(groups, tau=tau, score=score)
    mean_all = sum(score_of(s, score) for s in SPEEDUPS) / len(SPEEDUPS)
    w = {b: math.exp((sum(score_of(e.speedup, score) for e in g) / len(g) - mean_all) / tau) for b, g in groups.items()}
    z = sum(w.values())
    for b in groups:
        assert probs[b] == pytest.approx(w[b] / z, rel=1e-12)
    assert sum(probs.values()) == pytest.approx(1.0)
    best = max(groups, key=lambda b: max(e.speedup for e in groups[b]))
    assert probs[best] == max(probs.values())  # better buckets are more likely


def _exact_pair_probs(groups, tau):
    """P(unordered pair of buckets) for two draws without replacement, mean fixed over everyone."""
    p1 = bucket_probabilities(groups, tau=tau)
    out = Counter()
    for a in groups:
        p2 = bucket_probabilities(groups, tau=tau, exclude=[a])
        for b in p2:
            out[frozenset((a, b))] += p1[a] * p2[b]
    return out


def test_draws_match_the_distribution_statistically():
    tau, n = 0.7, 20000
    its = items()
    groups = buckets(its, bucket_width=0.1)
    bucket_of = {e.id: b for b, g in groups.items() for e in g}
    expected = _exact_pair_probs(groups, tau)
    rng = random.Random(1234)
    seen_pairs, seen_ids = Counter(), Counter()
    for _ in range(n):
        pick = contrastive(its, rng, n=2, tau=tau, bucket_width=0.1)
        assert len(pick) == 2 and pick[0].speedup >= pick[1].speedup  # best first
        pair = frozenset(bucket_of[e.id] for e in pick)
        assert len(pair) == 2  # two distinct buckets, always
        seen_pairs[pair] += 1
        seen_ids.update(e.id for e in pick)
    # chi-square goodness of fit over the 6 pairs (df = 5): 20.5 is the 0.999 quantile
    chi2 = sum((seen_pairs[p] - n * q) ** 2 / (n * q) for p, q in expected.items())
    assert len(expected) == 6
    assert chi2 < 20.5, (chi2, seen_pairs, expected)
    # uniform within a bucket: ids 2, 3, 4 share a bucket and must be drawn about equally often
    trio = [seen_ids[i] for i in (2, 3, 4)]
    mean = sum(trio) / 3
    assert all(abs(c - mean) < 5 * math.sqrt(mean) for c in trio), trio


def test_low_temperature_concentrates_on_the_best_buckets():
    its = items()
    rng = random.Random(7)
    firsts = Counter(contrastive(its, rng, n=2, tau=0.05)[0].speedup >= 4.0 for _ in range(500))
    assert firsts[True] == 500  # the 4x bucket is always one of the two
    rng = random.Random(7)
    bucket_of = {e.id: b for b, g in buckets(its).items() for e in g}
    hot = Counter(frozenset(bucket_of[e.id] for e in contrastive(its, rng, n=2, tau=100.0)) for _ in range(3000))
    assert len(hot) == 6  # every pair of buckets shows up at high temperature


def test_n_and_fewer_buckets_than_n():
    its = items()
    rng = random.Random(0)
    assert len(contrastive(its, rng, n=3)) == 3
    assert len(contrastive(its, rng, n=10)) == 4  # only 4 buckets exist
    one_bucket = [Exemplar(i, "s", 2.0 + 0.001 * i) for i in range(5)]
    assert len(contrastive(one_bucket, rng, n=2)) == 1
    assert contrastive([], rng) == []


def test_same_seed_same_draws():
    its = items()
    a = [[e.id for e in contrastive(its, random.Random(99), n=2)] for _ in range(3)]
    assert a[0] == a[1] == a[2]


def test_random_selector_is_uniform_and_distinct():
    its = items()
    rng = random.Random(5)
    counts = Counter()
    n = 8000
    for _ in range(n):
        pick = uniform(its, rng, n=2)
        assert len({e.id for e in pick}) == 2 and pick[0].speedup >= pick[1].speedup
        counts.update(e.id for e in pick)
    expect = n * 2 / len(its)
    chi2 = sum((counts[i] - expect) ** 2 / expect for i in range(len(its)))
    assert chi2 < 24.3  # df = 7, 0.999 quantile
    assert {e.id for e in select(its, rng, selector="random", n=20)} == set(range(len(its)))
    with pytest.raises(ValueError):
        select(its, rng, selector="nope")


def test_contrastive_prefers_better_buckets_than_random():
    its = items()
    r1, r2 = random.Random(3), random.Random(3)
    mean_c = sum(sum(math.log(e.speedup) for e in contrastive(its, r1, tau=0.3)) for _ in range(2000))
    mean_r = sum(sum(math.log(e.speedup) for e in uniform(its, r2)) for _ in range(2000))
    assert mean_c > mean_r
