"""timing.median_ci on known distributions, timing.measure with synthetic CPU functions, RoundTripClock on CPU.

The synthetic functions busy-wait on time.perf_counter (more stable than sleep on a loaded 2-core CI box);
tolerances are generous, and the stable-pair tests take the median of a paired ratio, which a stray
preemption of one call barely moves.
"""
from __future__ import annotations

import math
import os
import random
import statistics
import time

import pytest
import torch

from kernelcraft.judge.speed import timing

CPU = torch.device("cpu")


def spin(ms: float) -> None:
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        pass


def no_round(i):
    return None


def timed(fn):
    """A `time_*` function: the host time of one call of fn, in ms (what the judge's round trip measures)."""
    def call():
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    return call


NULL = timed(lambda: None)


# -- median_ci ------------------------------------------------------------------------------------------

def test_median_ci_small_samples():
    assert timing.median_ci([2.0]) == (2.0, 2.0, 2.0)
    assert timing.median_ci([3.0, 1.0]) == (2.0, 1.0, 3.0)
    med, lo, hi = timing.median_ci([5.0, 1.0, 3.0])
    assert med == 3.0 and lo <= med <= hi


def test_median_ci_constant_values_has_zero_width():
    med, lo, hi = timing.median_ci([1.5] * 50)
    assert med == lo == hi == 1.5


def test_median_ci_bounds_are_sample_values_and_ordered():
    rng = random.Random(1)
    v = [rng.lognormvariate(0, 0.5) for _ in range(101)]
    med, lo, hi = timing.median_ci(v)
    assert med == statistics.median(v)
    assert lo in v and hi in v
    assert lo <= med <= hi


@pytest.mark.parametrize("dist", ["normal", "lognormal", "uniform"])
def test_median_ci_covers_true_median(dist):
    """Over many repetitions, the ~95% CI contains the true median about 95% of the time."""
    rng = random.Random(1234)
    draw, true_median = {
        "normal": (lambda: rng.gauss(10.0, 2.0), 10.0),
        "lognormal": (lambda: rng.lognormvariate(0.0, 1.0), 1.0),  # median e^0
        "uniform": (lambda: rng.uniform(2.0, 4.0), 3.0),
    }[dist]
    reps, covered = 400, 0
    for _ in range(reps):
        _, lo, hi = timing.median_ci([draw() for _ in range(61)])
        covered += lo <= true_median <= hi
    assert 0.90 <= covered / reps <= 0.995, covered / reps


def test_median_ci_narrows_with_n():
    rng = random.Random(7)

    def mean_width(n: int) -> float:
        widths = []
        for _ in range(50):
            _, lo, hi = timing.median_ci([rng.gauss(0.0, 1.0) for _ in range(n)])
            widths.append(hi - lo)
        return statistics.mean(widths)

    w20, w200, w2000 = mean_width(20), mean_width(200), mean_width(2000)
    assert w20 > w200 > w2000
    # order statistics: the width shrinks like 1/sqrt(n) (sqrt(10) ~ 3.2 per step)
    assert 2.0 < w20 / w200 < 5.0
    assert 2.0 < w200 / w2000 < 5.0


# -- measure --------------------------------------------------------------------------------------------

def test_measure_stable_pair_speedup_two():
    """Reference spins ~2 ms, candidate ~1 ms: speedup ≈ 2, converged within the budget, CI within ±target."""
    target = 0.02
    t0 = time.perf_counter()
    res = timing.measure(timed(lambda: spin(2.0)), timed(lambda: spin(1.0)), NULL, no_round, no_round,
                         budget_s=6.0, target=target, min_rounds=10, warmup_s=0.05, seed=3)
    elapsed = time.perf_counter() - t0
    assert res.converged, res
    assert abs(res.speedup - 2.0) / 2.0 < 0.15, res
    lo, hi = res.ci95
    assert lo <= res.speedup <= hi
    assert hi / res.speedup - 1 <= target + 1e-12 and 1 - lo / res.speedup <= target + 1e-12, res
    assert res.samples >= 10 and res.spot_checks == res.samples
    assert 1.7 < res.ref_ms < 4.0 and 0.85 < res.cand_ms < 3.0, res
    assert res.method.startswith("cpu") and res.clock == "judge"
    assert 0 <= res.overhead_ms < 0.5
    assert elapsed < 6.0 + 2.0
    rec = res.record()
    assert "ref_samples" not in rec and rec["speedup"] == res.speedup


def test_measure_subtracts_the_null_round_trip_from_both_sides():
    """A fixed 1 ms of overhead on every call (the round trip) is measured by the null call and removed:
    1.5 ms + 1 ms vs 0.5 ms + 1 ms reads 3x, not 1.67x."""
    res = timing.measure(timed(lambda: spin(2.5)), timed(lambda: spin(1.5)), timed(lambda: spin(1.0)),
                         no_round, no_round, budget_s=3.0, target=0.03, min_rounds=10, warmup_s=0.02, seed=4)
    assert 0.9 < res.overhead_ms < 1.6, res
    assert 2.2 < res.speedup < 3.8, res


def null_pair(ref_ms: float, cand_ms: float):
    """A `time_null` that times both sides' empty requests: (the reference's, the candidate's)."""
    ref, cand = timed(lambda: spin(ref_ms)), timed(lambda: spin(cand_ms))
    return lambda: (ref(), cand())


def test_the_candidate_is_billed_its_own_null_where_it_is_the_smaller():
    """A candidate process whose round trip costs 0.5 ms where the reference's costs 1 ms (a quieter core: the GPU's
    52x outlier in BENCHMARKS.md, 2026-11-28 · f34fff3) does 0.5 ms of work against the reference's 2 ms: 4x. With
    the reference's null subtracted from both it would read 1.0 - 1.0 = the resolution floor, 40x. A candidate that
    slows its own null (3 ms) gains nothing: the larger null is never subtracted from it."""
    honest = timing.measure(timed(lambda: spin(3.0)), timed(lambda: spin(1.0)), null_pair(1.0, 0.5), no_round,
                            no_round, budget_s=3.0, target=0.03, min_rounds=10, warmup_s=0.02, seed=4)
    assert 3.0 < honest.speedup < 5.5, honest
    assert honest.cand_overhead_ms < honest.overhead_ms and "candidate's own where smaller" in honest.method
    slowed = timing.measure(timed(lambda: spin(3.0)), timed(lambda: spin(1.5)), null_pair(1.0, 3.0), no_round,
                            no_round, budget_s=3.0, target=0.03, min_rounds=10, warmup_s=0.02, seed=4)
    assert 3.0 < slowed.speedup < 5.5 and slowed.cand_overhead_ms > 2.5, slowed
    assert timing.measure(NULL, NULL, NULL, no_round, no_round, budget_s=0.05, target=0.5,
                          warmup_s=0.0).cand_overhead_ms is None  # one null for both: nothing to record


def test_measure_floors_differences_below_the_resolution():
    """Calls no slower than the null round trip: the ratio stays finite (both floored), not inf or negative."""
    res = timing.measure(timed(lambda: None), timed(lambda: None), timed(lambda: spin(0.2)),
                         no_round, no_round, budget_s=0.3, target=0.5, min_rounds=10, warmup_s=0.0, seed=1)
    assert 0.5 < res.speedup < 2.0 and res.ref_ms > 0 and res.cand_ms > 0


def test_measure_slower_candidate_has_speedup_below_one():
    res = timing.measure(timed(lambda: spin(0.5)), timed(lambda: spin(1.5)), NULL, no_round, no_round,
                         budget_s=3.0, target=0.05, min_rounds=10, warmup_s=0.02, seed=5)
    assert abs(res.speedup - 1 / 3) / (1 / 3) < 0.2, res
    assert res.ci95[1] < 1.0


def test_measure_noisy_pair_stops_at_budget_unconverged():
    """A candidate whose time is all over the place never reaches a ±0.1% CI: timing stops at the budget."""
    rng = random.Random(11)
    budget = 0.6
    t0 = time.perf_counter()
    res = timing.measure(timed(lambda: spin(0.3)), timed(lambda: spin(rng.uniform(0.05, 1.0))), NULL,
                         no_round, no_round, budget_s=budget, target=0.001, min_rounds=10, warmup_s=0.02,
                         batch=10, seed=9)
    elapsed = time.perf_counter() - t0
    assert not res.converged, res
    assert res.samples >= 10
    # one batch (10 rounds of at most ~1.3 ms) may run past the deadline; allow for a loaded machine
    assert budget <= elapsed < budget + 2.0, elapsed
    lo, hi = res.ci95
    assert lo < hi


def test_measure_prepares_and_checks_every_round():
    prepared, checked = [], []
    res = timing.measure(NULL, NULL, NULL, prepared.append, checked.append, budget_s=0.2, target=0.5,
                         min_rounds=10, warmup_s=0.0, batch=10, seed=0)
    timed_rounds = [i for i in prepared if i >= 0]
    assert timed_rounds == list(range(res.samples)), "round indices 0..n-1, warm-up rounds negative"
    assert any(i < 0 for i in prepared)
    assert checked == prepared, "every prepared round is checked, warm-up included"


def test_measure_check_failure_propagates():
    class Wrong(Exception):
        pass

    calls = {"n": 0}

    def check(i):
        calls["n"] += 1
        if calls["n"] >= 8:  # goes stale after a few rounds
            raise Wrong()

    with pytest.raises(Wrong):
        timing.measure(NULL, NULL, NULL, no_round, check, budget_s=1.0, warmup_s=0.0)


def test_measure_order_is_randomised_within_rounds():
    order = []
    timing.measure(timed(lambda: order.append("r")), timed(lambda: order.append("c")), NULL, no_round, no_round,
                   budget_s=0.1, target=0.5, min_rounds=40, warmup_s=0.0, batch=40, seed=2)
    # warm-up runs ref then cand; the timed rounds must contain both orders
    pairs = [tuple(order[i:i + 2]) for i in range(len(order) - 80, len(order), 2)]
    assert ("r", "c") in pairs and ("c", "r") in pairs


def test_round_trip_clock_cpu_has_no_probe():
    clock = timing.RoundTripClock(CPU)
    assert not clock.cuda and clock.settle() == 0.0
    t0 = clock.now()
    spin(1.0)
    assert 0.9 < (clock.now() - t0) / 1e6 < 50


def _block(ratios, lo, hi):
    from kernelcraft.judge.speed.timing import TimingResult
    refs = [2.0 * r for r in ratios]
    cands = [2.0] * len(ratios)
    med = sorted(ratios)[len(ratios) // 2]
    return TimingResult(ref_ms=2 * med, cand_ms=2.0, speedup=med, ci95=(lo, hi), samples=len(ratios), converged=True,
                        method="m", ref_spread_ms=(1, 1), cand_spread_ms=(1, 1), host_ref_ms=1, host_cand_ms=1,
                        spot_checks=len(ratios), overhead_ms=0.5, ref_samples=refs, cand_samples=cands)


def test_combine_spans_every_process_interval():
    """Independent candidate processes (protocol.processes): the CI spans each block's own interval and the pooled
    one; the point estimate is the pooled median; each block's median is recorded."""
    from kernelcraft.judge.speed.timing import combine
    a = _block([4.9, 5.0, 5.1] * 10, 4.95, 5.05)
    b = _block([5.4, 5.5, 5.6] * 10, 5.45, 5.55)
    c = _block([5.1, 5.2, 5.3] * 10, 5.15, 5.25)
    out = combine([a, b, c])
    assert out.processes == 3 and out.process_speedups == [5.0, 5.5, 5.2]
    assert out.ci95[0] <= 4.95 and out.ci95[1] >= 5.55
    assert out.within_ci95[0] > out.ci95[0] and out.within_ci95[1] < out.ci95[1]  # pooled rounds alone: narrower
    assert out.speedup == 5.2 and out.samples == 90
    assert combine([a]) is a  # one process: the block's own result, unchanged


def test_a_ci_that_cannot_resolve_the_speedup_says_host_too_noisy():
    from kernelcraft.judge.speed.timing import noise_note
    assert noise_note(_block([1.0] * 9, 0.98, 1.02)) is None
    note = noise_note(_block([5.0] * 9, 1.8, 23.8))
    assert note.startswith("host too noisy") and "x13.22" in note
    assert noise_note(_block([5.0] * 9, 0.0, 2.0)).startswith("host too noisy")


def test_reproducible_interval_widens_by_the_between_run_deviation():
    """The reported interval is where a re-run's estimate falls (reproduce.reproducible): this run's interval and the
    calibrated between-run deviation, x sqrt 2 in log space; this run's own interval is kept as within_ci95."""
    from kernelcraft.judge.speed.reproduce import BETWEEN_RUN, between_run_sd, reproducible
    b = _block([2.0] * 9, 1.98, 2.02)  # ref 4 ms, candidate 2 ms, overhead 0.5 ms
    cal = BETWEEN_RUN["cuda"]
    sd = between_run_sd(4.0, 2.0, 0.5, "cuda:1")
    assert sd == pytest.approx(math.sqrt(2 * cal.rho ** 2 + (cal.kappa * 0.5) ** 2 * (1 / 16 + 1 / 4)))
    out = reproducible(b, "cuda")
    assert out.within_ci95 == (1.98, 2.02) and out.between_run_sd == pytest.approx(sd, abs=1e-6)
    # small errors: the linear form, sqrt 2 x the root sum of squares of the within half-width and z x sd
    down = math.sqrt(2) * math.hypot(math.log(2 / 1.98), 1.959963984540054 * sd)
    assert out.ci95[0] == pytest.approx(2 * math.exp(-down), rel=0.02) and out.ci95[1] > 2.02 * math.exp(sd)
    assert "re-run" in out.method and out.speedup == 2.0


def test_a_host_bound_side_widens_the_interval_by_its_own_spread_on_a_gpu():
    """A launch-bound eager network's time moves with the process it got (1.3-1.9x between evaluations on two
    H200s) and its rounds spread wide within a run; a GPU-bound side's rounds do not. On a GPU the between-run part
    grows by `beta` x each side's interquartile range over its median; the CPU's calibration has no such term."""
    from kernelcraft.judge.speed.reproduce import BETWEEN_RUN, between_run_sd, relative_spread, reproducible
    assert relative_spread((9.0, 11.0), 10.0) == pytest.approx(0.2)
    assert relative_spread(None, 10.0) == 0.0 and relative_spread((1.0, 2.0), 0.0) == 0.0
    narrow = between_run_sd(10.0, 4.0, 0.5, "cuda", 0.01, 0.01)
    wide = between_run_sd(10.0, 4.0, 0.5, "cuda", 0.2, 0.01)
    beta = BETWEEN_RUN["cuda"].beta
    assert beta > 0 and wide == pytest.approx(math.sqrt(narrow ** 2 + (beta * 0.2) ** 2 - (beta * 0.01) ** 2))
    assert between_run_sd(10.0, 4.0, 0.5, "cpu", 0.2, 0.01) == between_run_sd(10.0, 4.0, 0.5, "cpu")

    def run(ref_quartiles):
        b = _block([2.5] * 9, 2.45, 2.55)
        b.ref_ms, b.cand_ms, b.ref_spread_ms, b.cand_spread_ms = 10.0, 4.0, ref_quartiles, (3.98, 4.02)
        return b
    gpu_bound, host_bound = reproducible(run((9.95, 10.05)), "cuda"), reproducible(run((9.0, 11.0)), "cuda")
    assert host_bound.ci95[0] < gpu_bound.ci95[0] < 2.45 and host_bound.ci95[1] > gpu_bound.ci95[1] > 2.55
    assert host_bound.between_run_sd > 3 * gpu_bound.between_run_sd
    assert reproducible(run((9.0, 11.0)), "cpu").ci95 == reproducible(run((9.95, 10.05)), "cpu").ci95


def test_a_candidate_far_below_the_round_trip_is_still_faster_at_the_lower_end():
    """30x with the candidate's time at a tenth of the round trip: another run may read far more (the upper end is
    wide), but not less than a clear gain — the error is on the times, not on their ratio."""
    from kernelcraft.judge.speed.reproduce import reproducible
    b = _block([30.0] * 9, 27.0, 33.0)
    b.ref_ms, b.cand_ms, b.overhead_ms = 0.3, 0.01, 0.08
    out = reproducible(b, "cpu")
    assert 5.0 < out.ci95[0] < 27.0 and out.ci95[1] > 2 * 33.0


def test_between_run_deviation_grows_as_times_shrink_against_the_round_trip():
    """An absolute error of the overhead subtraction: negligible for long calls, dominant for calls far below the
    round trip (the same code read 0.76-1.34x at 0.2 ms under a 0.7 ms round trip on a GPU); the CPU's is larger."""
    from kernelcraft.judge.speed.reproduce import between_run_sd
    long_calls, short_calls = between_run_sd(30.0, 30.0, 0.6, "cuda"), between_run_sd(0.2, 0.2, 0.6, "cuda")
    assert long_calls < 0.02 < 0.15 < short_calls
    assert between_run_sd(0.2, 0.02, 0.6, "cuda") > 3 * between_run_sd(0.2, 0.2, 0.6, "cuda") / 2
    assert between_run_sd(1.0, 1.0, 0.1, "cpu") > between_run_sd(1.0, 1.0, 0.1, "cuda")
    assert between_run_sd(0.2, 0.0, 0.6, "cuda") < float("inf")  # a time floored at the resolution, not zero


def test_a_reference_process_slow_at_everything_widens_the_lower_end_only():
    """The footing: when the reference's process answers its null round trip slower than the candidate's does, the
    run may overstate the candidate, so the lower end widens by the log of their ratio; a candidate that slows its
    own null widens only its upper end (its own null is never subtracted where it is the larger)."""
    from kernelcraft.judge.speed.reproduce import reproducible

    def run(cand_overhead):
        b = _block([5.0] * 9, 4.9, 5.1)
        b.ref_ms, b.cand_ms, b.overhead_ms, b.cand_overhead_ms = 4.0, 0.8, 0.18, cand_overhead
        return reproducible(b, "cpu").ci95

    even, ref_slow, cand_slow = run(None), run(0.08), run(0.40)
    assert ref_slow[0] < 0.5 * even[0] and ref_slow[1] == pytest.approx(even[1])
    assert cand_slow[1] > 1.5 * even[1] and cand_slow[0] == pytest.approx(even[0])
    assert run(0.18) == pytest.approx(even)


def test_a_sub_resolution_interval_says_the_calls_are_too_short():
    """When the between-run part dominates, 'host too noisy' says more rounds would not help."""
    from kernelcraft.judge.speed.reproduce import reproducible
    from kernelcraft.judge.speed.timing import noise_note
    b = _block([5.0] * 9, 4.9, 5.1)
    b.ref_ms, b.cand_ms, b.overhead_ms = 0.3, 0.06, 0.7
    note = noise_note(reproducible(b, "cuda"))
    assert note.startswith("host too noisy") and "short against the judge's round trip" in note
    wide = _block([5.0] * 9, 2.0, 12.0)
    wide.ref_ms, wide.cand_ms = 50.0, 10.0
    assert "larger --time-budget" in noise_note(reproducible(wide, "cuda"))


def test_a_host_bound_reference_is_named_when_its_spread_makes_the_interval_wide():
    """A launch-bound reference (rounds' interquartile range 40% of its median) on a GPU: the between-run part
    dominates because of its spread, not the round trip, and the note says so; on a CPU (no such term) the
    interval stays narrow and there is no note."""
    from kernelcraft.judge.speed.reproduce import reproducible
    from kernelcraft.judge.speed.timing import noise_note

    def run():
        b = _block([2.5] * 9, 2.45, 2.55)
        b.ref_ms, b.cand_ms, b.ref_spread_ms, b.cand_spread_ms = 10.0, 4.0, (8.0, 12.0), (3.98, 4.02)
        return b
    note = noise_note(reproducible(run(), "cuda"), "cuda")
    assert note.startswith("host too noisy") and "the reference is host-bound" in note and "40%" in note
    assert "short against the judge's round trip" not in note
    assert noise_note(reproducible(run(), "cpu"), "cpu") is None


def test_processes_that_disagree_beyond_2x_and_their_intervals_are_noted():
    from kernelcraft.judge.speed.timing import inconsistent
    fast, slow = _block([50.0] * 9, 45.0, 55.0), _block([0.12] * 9, 0.11, 0.13)
    assert "differs between the candidate's own processes" in inconsistent([fast, slow, fast])
    noisy_a, noisy_b = _block([4.4] * 9, 1.8, 12.0), _block([6.8] * 9, 2.5, 20.0)  # a busy host: wide intervals
    assert inconsistent([noisy_a, noisy_b]) is None
    assert inconsistent([_block([5.0] * 9, 4.9, 5.1), _block([5.6] * 9, 5.5, 5.7)]) is None  # < 2x apart
    assert inconsistent([fast]) is None


def test_interleaved_processes_are_split_per_process_and_time_alike():
    """`processes` > 1: one `measure` run whose rounds cycle over the candidate's processes in blocks
    (`siblings.Schedule`); `split` gives each process its own rounds. A process that is slower than its sibling is seen as such, while a
    load that changes during the run (here: every call slowed in the second half) moves both processes alike."""
    from kernelcraft.judge.speed.siblings import Schedule
    order = Schedule(2, seed=3)
    calls = {"n": 0}
    slow_half = {"on": False}

    def next_round(i):
        order.pick(i)
        slow_half["on"] = i >= 40

    def ref():
        calls["n"] += 1
        spin(0.8 * (2 if slow_half["on"] else 1))

    def cand():
        spin((0.2 if order.current == 0 else 0.4) * (2 if slow_half["on"] else 1))

    res = timing.measure(timed(ref), timed(cand), NULL, next_round, no_round, budget_s=60.0, target=0.0,
                         min_rounds=80, max_rounds=80, warmup_rounds=6, seed=1)
    assert res.samples == 80 and len(order.who) == 80
    blocks = [order.who[i:i + order.block] for i in range(0, 80, order.block)]
    assert all(len(set(b)) == 1 for b in blocks), "a block is one process's"
    assert all(sorted(b[0] for b in blocks[i:i + 2]) == [0, 1] for i in range(0, len(blocks), 2)), \
        "every cycle gives each process one block"
    a, b = timing.split(res, order.who, 2)
    assert a.samples == b.samples == 40
    assert 3.0 < a.speedup < 5.0 and 1.5 < b.speedup < 2.5, (a.speedup, b.speedup)
    out = timing.combine([a, b])
    assert out.processes == 2 and out.ci95[0] <= b.ci95[0] and out.ci95[1] >= a.ci95[1]


def test_schedule_warm_up_visits_every_process():
    from kernelcraft.judge.speed.siblings import Schedule
    order = Schedule(3, seed=0, block=2)
    seen = []
    for i in range(6):
        order.pick(-1 - i)
        seen.append(order.current)
    assert seen == [0, 1, 2, 0, 1, 2]
    assert order.who == []  # warm-up rounds are not recorded
    switches = [order.pick(i) for i in range(60)]
    picks = order.who
    assert all(picks[i] == picks[i + 1] for i in range(0, 60, 2)), "blocks of 2 rounds"
    firsts = picks[::2]
    assert all(sorted(firsts[i:i + 3]) == [0, 1, 2] for i in range(0, 30, 3)), "each process once per cycle"
    assert firsts != [0, 1, 2] * 10, "cycles are shuffled"
    assert not any(switches[i] for i in range(1, 60, 2)), "no switch inside a block"
    assert all(switches[i] == (picks[i] != picks[i - 1]) for i in range(2, 60, 2))


def test_measure_stops_on_the_interval_it_is_given():
    """The stopping rule tests the CI the record will report (with several processes: the one spanning each)."""
    seen = []

    def wide(ratios, firsts):
        assert len(firsts) == len(ratios)
        seen.append(len(ratios))
        med = statistics.median(ratios)
        return med, med / 2, med * 2  # never within the target

    res = timing.measure(timed(lambda: spin(0.2)), timed(lambda: spin(0.1)), NULL, no_round, no_round,
                         budget_s=0.3, target=0.5, min_rounds=10, interval=wide)
    assert seen and not res.converged


def test_spanning_ci_is_what_combine_reports_for_split_results():
    """The stopping rule's interval for several processes (`spanning_ci`) is the one the record reports
    (`combine` of `split`): computed from the ratios alone, the same numbers."""
    from kernelcraft.judge.speed.timing import TimingResult, combine, spanning_ci, split
    rng = random.Random(5)
    who = [rng.randrange(2) for _ in range(60)]
    firsts = [rng.random() < 0.5 for _ in range(60)]
    refs = [1.0 + (0.5 if w else 0.0) + (0.1 if f else 0.0) + rng.random() * 0.2 for w, f in zip(who, firsts)]
    cands = [0.5] * 60
    res = TimingResult(ref_ms=1, cand_ms=0.5, speedup=2, ci95=(1, 3), samples=60, converged=False, method="m",
                       ref_spread_ms=(1, 1), cand_spread_ms=(1, 1), host_ref_ms=1, host_cand_ms=1, spot_checks=60,
                       ref_samples=refs, cand_samples=cands, ref_first=firsts)
    out = combine(split(res, who, 2))
    ratios = [r / c for r, c in zip(refs, cands)]
    med, lo, hi = spanning_ci([([x for x, w in zip(ratios, who) if w == j], [f for f, w in zip(firsts, who) if w == j])
                               for j in range(2)])
    assert (lo, hi) == out.ci95 and med == out.speedup


# -- the order-stratified speedup (balanced_ci) ----------------------------------------------------------------------

def _rounds(n: int, seed: int, first_cost: float, slow_share: float = 0.0, slow: float = 2.0, ref_first=None):
    """Identical sides (1.0 ms), the first call of a round `first_cost` slower, a share of the reference's calls
    `slow` ms slower (a busier core): (ratios, ref_first)."""
    rng = random.Random(seed)
    ratios, firsts = [], []
    for i in range(n):
        f = (rng.random() < 0.5) if ref_first is None else ref_first(i)
        r = 1.0 + (first_cost if f else 0.0) + (slow if rng.random() < slow_share else 0.0) + rng.gauss(0, 0.01)
        c = 1.0 + (0.0 if f else first_cost) + rng.gauss(0, 0.01)
        ratios.append(r / c), firsts.append(f)
    return ratios, firsts


def test_the_order_split_no_longer_decides_the_speedup():
    """A first-call cost of 20% made the plain median bimodal: it read ~1.2 or ~0.83 depending on which order had
    more rounds. The stratified speedup reads 1 whatever the split."""
    for share_first in (0.3, 0.5, 0.7):
        ratios, firsts = _rounds(200, 1, 0.2, ref_first=lambda i, s=share_first: (i % 10) < s * 10)
        med, lo, hi = timing.balanced_ci(ratios, firsts)
        assert 0.97 < med < 1.03 and lo <= med <= hi, (share_first, med)
        plain = timing.median_ci(ratios)[0]
        assert abs(plain - 1.0) > 0.1 or share_first == 0.5, (share_first, plain)  # what it replaces


def test_slow_calls_of_one_side_in_a_third_of_the_rounds_do_not_move_the_speedup():
    """Balanced pairs (ABBA, (r1 + r2) / (c1 + c2)) read identical sides at ~2x when 35% of the reference's calls were
    slow (a pair is hit when either round is); per-round strata tolerate up to half of each."""
    ratios, firsts = _rounds(400, 2, 0.05, slow_share=0.35, ref_first=lambda i: i % 4 in (0, 3))  # ABBA orders
    med, _, _ = timing.balanced_ci(ratios, firsts)
    assert med < 1.15, med
    pairs = [(ratios[i] + ratios[i + 1]) / 2 for i in range(0, len(ratios), 2)]  # a pair's mean, ~ its sum ratio
    assert statistics.median(pairs) > 1.4  # the statistic it replaces


def test_balanced_ci_covers_and_falls_back():
    ratios, firsts = _rounds(60, 3, 0.1)
    med, lo, hi = timing.balanced_ci(ratios, firsts)
    assert lo < med < hi and 0.95 < med < 1.05
    assert timing.balanced_ci([1.0, 2.0, 3.0, 4.0], [True, True, True, False]) == timing.median_ci([1.0, 2.0, 3.0, 4.0])
    assert timing.balanced_ci([1.0, 2.0], []) == timing.median_ci([1.0, 2.0])
    # coverage: the interval holds the true speedup (1) in ~95% of runs of 40 rounds
    hits = sum(lo <= 1.0 <= hi for lo, hi in (timing.balanced_ci(*_rounds(40, s, 0.1))[1:] for s in range(200)))
    assert hits >= 180, hits


def test_timing_stops_once_more_rounds_cannot_narrow_the_reported_interval():
    """A call far below the round trip (its between-run part is large) stops after min_rounds instead of spending
    the budget; a long call runs until its interval is within half its (small) between-run part; a target of 0
    spends the whole budget either way."""
    from kernelcraft.judge.speed.timing import measure

    def run(call_ms, null_ms, target, jitter=0.02):
        def call(ms, seed):
            rng = random.Random(seed)
            return lambda: ms * (1 + jitter * rng.random())  # its own jitter per side
        return measure(call(null_ms + call_ms, 1), call(null_ms + call_ms, 2), call(null_ms, 3), lambda i: None,
                       lambda i: None, budget_s=0.3, target=target, min_rounds=10, warmup_s=0.0)

    short = run(0.1, 0.5, 0.001)
    assert short.converged and short.samples <= 20, short
    assert not run(0.1, 0.5, 0.0).converged  # asked for the whole budget
    long_calls = run(50.0, 0.5, 0.001, jitter=0.2)
    assert long_calls.converged and long_calls.samples > short.samples
    hw = max(long_calls.ci95[1] / long_calls.speedup - 1, 1 - long_calls.ci95[0] / long_calls.speedup)
    assert 0.001 < hw < 0.02  # stopped well before the +-0.1% target, at about half the between-run part


def test_host_busy_cores_reads_the_hosts_cpu_ticks(tmp_path):
    from kernelcraft.judge.speed import treecpu

    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3 4 5 6 7 8\n")
    before = treecpu.host_cpu_jiffies(str(stat))
    assert before == (150, 1000)
    stat.write_text("cpu  400 0 100 1000 100 0 0 0 0 0\n")
    after = treecpu.host_cpu_jiffies(str(stat))
    cpus = os.cpu_count() or 1
    assert treecpu.host_busy_cores(before, after) == round(350 / 600 * cpus, 2)  # 350 of 600 ticks busy
    assert treecpu.host_busy_cores(before, None) is None and treecpu.host_busy_cores(after, before) is None
    assert treecpu.host_cpu_jiffies(str(tmp_path / "missing")) is None
