"""Timing: the judge's clock around each side's round trip, paired and interleaved, until the speedup is known.

A sample is the judge's host time around a side's whole round trip, ending when the side is frozen and the device
idle; nothing a side reports is a time. The empty round trip's overhead is subtracted (from the candidate's
samples, the smaller of both sides'). A round times both sides once, in random order, on the same inputs; the
speedup is order-stratified (`balanced_ci`) and its interval widened to a reproducibility interval (`reproduce`).
`measure` knows nothing of processes.

Rationale: docs/design/judge-speed.md#timing
"""
from __future__ import annotations

import math
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from kernelcraft.judge.speed.reproduce import RESOLUTION_FLOOR, Z95 as _Z, between_run_sd, relative_spread

_perf_ns = time.perf_counter_ns
_cuda_sync = torch.cuda.synchronize
NOISY_SPAN = 1.5  # a 95% CI whose upper end is beyond 1.5x its lower end cannot resolve the speedup: say so
SETTLE_LIMIT_S = 30.0  # a device still busy this long after `done` is a rejection, not a sample
IDLE_WAIT_S = 30.0  # a timer waits at most this long for work other evaluations left queued (`await_idle`)
IDLE_RUN = 5  # consecutive probes at idle speed that say the device is idle

STOP_SHARE = 0.5  # stop once the within-run half-width is this share of the between-run one (or within target)


@dataclass
class TimingResult:
    ref_ms: float
    cand_ms: float
    speedup: float
    ci95: tuple[float, float]
    samples: int
    converged: bool
    method: str
    ref_spread_ms: tuple[float, float]
    cand_spread_ms: tuple[float, float]
    host_ref_ms: float
    host_cand_ms: float
    spot_checks: int
    overhead_ms: float = 0.0
    hidden_work_ms: float = 0.0
    clock: str = "judge"
    processes: int = 1
    process_speedups: list[float] | None = None
    within_ci95: tuple[float, float] | None = None
    between_run_sd: float | None = None
    cand_overhead_ms: float | None = None  # the null round trip answered by the candidate's process (footing)
    ref_samples: list[float] = field(repr=False, default_factory=list)
    cand_samples: list[float] = field(repr=False, default_factory=list)
    ref_first: list[bool] = field(repr=False, default_factory=list)  # per round: did the reference go first

    def record(self) -> dict:
        d = dict(self.__dict__)
        d.pop("ref_samples"), d.pop("cand_samples"), d.pop("ref_first")
        return d


def median_ci(values: list[float], z: float = _Z) -> tuple[float, float, float]:
    """Median and a distribution-free ~95% confidence interval (order statistics)."""
    v = sorted(values)
    n = len(v)
    med = statistics.median(v)
    if n < 3:
        return med, v[0], v[-1]
    half = z * math.sqrt(n) / 2
    lo = max(0, int(math.floor(n / 2 - half)))
    hi = min(n - 1, int(math.ceil(n / 2 + half)))
    return med, v[lo], v[hi]


def balanced_ci(ratios: list[float], ref_first: list[bool], z: float = _Z) -> tuple[float, float, float]:
    """The order-stratified speedup and its ~95% CI (docs/design/judge-speed.md#timing): the geometric mean of
    the median ratio of the reference-first rounds and that of the candidate-first rounds; each median's
    order-statistic interval, as log half-widths, combined as for a mean of two independent estimates. Fewer than
    3 rounds in an order: the plain `median_ci`."""
    a = [x for x, f in zip(ratios, ref_first) if f]
    b = [x for x, f in zip(ratios, ref_first) if not f]
    if len(a) < 3 or len(b) < 3 or min(ratios) <= 0:
        return median_ci(ratios, z)
    (ma, la, ha), (mb, lb, hb) = median_ci(a, z), median_ci(b, z)
    mid = (math.log(ma) + math.log(mb)) / 2
    down = math.hypot(math.log(ma / la), math.log(mb / lb)) / 2
    up = math.hypot(math.log(ha / ma), math.log(hb / mb)) / 2
    return math.exp(mid), math.exp(mid - down), math.exp(mid + up)


def _quartiles(v: list[float]) -> tuple[float, float]:
    if len(v) < 4:
        return min(v), max(v)
    q = statistics.quantiles(v, n=4)
    return q[0], q[2]


class DeviceBusy(Exception):
    """The device stayed busy long after a side said `done`."""


class RoundTripClock:
    """The judge's clock: host time around a side's round trip; on a GPU, L2 flush and the idle probe."""

    def __init__(self, device: torch.device, floor_ms: float | None = None):
        """`floor_ms`: the device's known idle probe latency (`gate.DeviceGate.idle_floor`); given, the clock first
        waits for work other evaluations left queued to drain (`await_idle`), then calibrates."""
        self.device = device
        self.cuda = device.type == "cuda"
        self.idle_ms = 0.0
        self.busy_ms = 0.0
        self.busy_probes = 0  # probes that found the device busy (work left behind, or another process's)
        self.idle_wait_ms = 0.0
        if self.cuda:
            l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 << 20) or (50 << 20)
            self.flush_buf = torch.empty(max(2 * l2, 64 << 20) // 4, dtype=torch.int32, device=device)
            self.probe_buf = torch.zeros(1, dtype=torch.int32, device=device)
            if floor_ms:
                self.idle_wait_ms = self.await_idle(floor_ms)
            self.calibrate()

    def _probe(self) -> float:
        t0 = _perf_ns()
        self.probe_buf.add_(1)
        _cuda_sync()
        return (_perf_ns() - t0) / 1e6

    def await_idle(self, floor_ms: float, limit_s: float = IDLE_WAIT_S) -> float:
        """Probe until `IDLE_RUN` probes in a row answer at idle speed (within 3x `floor_ms`, or 30 us of it): kernels
        another context left queued are done. Ms waited; gives up after `limit_s` (the calibration then reads the
        busy device, and the timed calls' own settling still sees it)."""
        limit = max(3 * floor_ms, floor_ms + 0.03)
        t0, run = _perf_ns(), 0
        while run < IDLE_RUN and (_perf_ns() - t0) / 1e9 < limit_s:
            run = run + 1 if self._probe() <= limit else 0
        return (_perf_ns() - t0) / 1e6

    def calibrate(self) -> None:
        """Idle latency of the probe (a 1-element add + sync in the judge's own context)."""
        for _ in range(5):
            self._probe()
        vals = sorted(self._probe() for _ in range(41))
        self.idle_ms = statistics.median(vals)
        self.busy_ms = max(3 * self.idle_ms, self.idle_ms + 0.03)

    def flush(self) -> None:
        if self.cuda:
            self.flush_buf.zero_()
            _cuda_sync()

    def now(self) -> int:
        return _perf_ns()

    def settle(self) -> float:
        """GPU: probe until the device answers at idle speed; returns the ms spent beyond one idle probe
        (work some side left running). CPU: 0."""
        if not self.cuda:
            return 0.0
        t0 = _perf_ns()
        while self._probe() > self.busy_ms:
            self.busy_probes += 1
            if (_perf_ns() - t0) / 1e9 > SETTLE_LIMIT_S:
                raise DeviceBusy(f"the device was still busy {SETTLE_LIMIT_S:g} s after the call returned")
        return max(0.0, (_perf_ns() - t0) / 1e6 - self.idle_ms)


def measure(
    time_ref: Callable[[], float],
    time_cand: Callable[[], float],
    time_null: Callable[[], "float | tuple[float, float]"],
    next_round: Callable[[int], None],
    check_round: Callable[[int], None],
    *,
    cuda: bool = False,
    budget_s: float = 3.0,
    target: float = 0.01,
    min_rounds: int = 10,
    max_rounds: int = 5000,
    warmup_s: float = 0.2,
    warmup_rounds: int = 3,
    interval: Callable[[list[float], list[bool]], tuple[float, float, float]] | None = None,
    batch: int = 10,
    seed: int = 0,
    billed: Callable[[int], float] | None = None,
) -> TimingResult:
    """Paired, interleaved rounds until the speedup CI is within ±target (or within `STOP_SHARE` of the
    between-run half-width, docs/design/judge-speed.md#timing) or `budget_s` is spent.

    At least `min_rounds` rounds are timed unless that would take over 3× the budget (slow forwards).
    `next_round(i)` puts round i's fresh inputs in place (warm-up rounds are negative); `time_*()` time one
    call each (ms, overhead included); `check_round(i)` raises when round i's outputs or inputs are wrong.
    `interval(ratios, ref_first)` -> (speedup, lo, hi) is the CI the stopping rule tests (default `balanced_ci`;
    several candidate processes test the interval spanning each one's, as the record will report it).
    `billed(rounds)` -> ms added to every candidate sample: CPU time its processes used outside the clock
    (`treecpu.Ledger`).
    """
    rng = random.Random(seed)
    t_end = _perf_ns() + int(warmup_s * 1e9)
    for i in range(max(50, warmup_rounds)):  # warm-up: until both sides ran `warmup_rounds` times and warmup_s passed
        next_round(-1 - i)
        time_ref(), time_cand()
        check_round(-1 - i)
        if i >= warmup_rounds - 1 and _perf_ns() > t_end:
            break

    ref_h, cand_h, nulls, cand_nulls, firsts = [], [], [], [], []
    own_nulls = False  # `time_null` timed the candidate's process too (it returned pairs)
    start = _perf_ns()
    deadline = start + int(budget_s * 1e9)
    hard_deadline = start + int(3 * max(budget_s, 1.0) * 1e9)  # min_rounds yields to this
    converged = False
    rounds = 0

    def ratios_now():
        o = statistics.median(nulls)
        o_cand = min(o, statistics.median(cand_nulls))  # the candidate's own null only where it is the smaller
        floor = max(RESOLUTION_FLOOR * o, 1e-6)
        bill = billed(len(cand_h)) if billed is not None else 0.0
        refs = [max(r - o, floor) for r in ref_h]
        cands = [max(c - o_cand + bill, floor) for c in cand_h]
        return refs, cands, [r / c for r, c in zip(refs, cands)], o

    while rounds < max_rounds:
        for _ in range(batch):
            next_round(rounds)
            ref_first = rng.random() < 0.5
            if ref_first:
                r = time_ref()
                c = time_cand()
            else:
                c = time_cand()
                r = time_ref()
            got = time_null()  # the reference's null, or (the reference's, the candidate's)
            own_nulls = own_nulls or isinstance(got, tuple)
            o_ref, o_cand = got if isinstance(got, tuple) else (got, got)
            nulls.append(o_ref), cand_nulls.append(o_cand)
            check_round(rounds)
            ref_h.append(r), cand_h.append(c), firsts.append(ref_first)
            rounds += 1
        refs, cands, ratios, o = ratios_now()
        med, lo, hi = (interval or balanced_ci)(ratios, firsts)
        r_med, c_med = statistics.median(refs), statistics.median(cands)
        enough = target if target <= 0 else max(  # a target of 0 asks for the whole budget
            target, STOP_SHARE * _Z * between_run_sd(r_med, c_med, o, "cuda" if cuda else "cpu",
                                                     relative_spread(_quartiles(refs), r_med),
                                                     relative_spread(_quartiles(cands), c_med)))
        if rounds >= min_rounds and hi / med - 1 <= enough and 1 - lo / med <= enough:
            converged = True
            break
        now = _perf_ns()
        if now > deadline and (rounds >= min_rounds or (now > hard_deadline and rounds >= 3)):
            break
    refs, cands, ratios, overhead = ratios_now()
    med, lo, hi = balanced_ci(ratios, firsts)
    method = ("cuda: judge host clock around each side's round trip (thaw, run, outputs copied, device sync, "
              "judge's idle probe), L2 flush, other side frozen; paired rounds in random order, speedup "
              "stratified by order, round-trip overhead subtracted" if cuda else "cpu: judge host clock around "
              "each side's round trip, other side frozen; paired rounds in random order, speedup stratified by "
              "order, round-trip overhead subtracted") + (
              " (the reference's null; the candidate's own where smaller)" if own_nulls else "")
    return TimingResult(
        ref_ms=statistics.median(refs), cand_ms=statistics.median(cands), speedup=med, ci95=(lo, hi),
        samples=rounds, converged=converged, method=method,
        ref_spread_ms=_quartiles(refs), cand_spread_ms=_quartiles(cands),
        host_ref_ms=statistics.median(ref_h), host_cand_ms=statistics.median(cand_h),
        spot_checks=rounds, overhead_ms=overhead, ref_samples=refs, cand_samples=cands, ref_first=firsts,
        cand_overhead_ms=statistics.median(cand_nulls) if own_nulls else None)


def spanning_ci(groups: list[tuple[list[float], list[bool]]]) -> tuple[float, float, float]:
    """(speedup of every group's rounds pooled, lo, hi): the pooled interval widened to span each group's own —
    the interval `combine` reports for the per-process results `split` makes, computed from the ratios and
    orders alone (so `measure`'s stopping rule can test it while the rounds come in)."""
    med, lo, hi = balanced_ci([x for g in groups for x in g[0]], [f for g in groups for f in g[1]])
    ends = [balanced_ci(*g) for g in groups if g[0]]
    return med, min([lo] + [e[1] for e in ends]), max([hi] + [e[2] for e in ends])


def split(res: TimingResult, who: list[int], k: int) -> list[TimingResult]:
    """One interleaved `measure` run as `k` per-process results: round i timed candidate process `who[i]`.

    The rounds of every process are paired with reference calls of the same moments, so a load that changes
    during the run moves every process's ratios alike; what still differs between them is the process."""
    out = []
    for j in range(k):
        idx = [i for i, w in enumerate(who[:res.samples]) if w == j]
        if not idx:
            continue
        refs = [res.ref_samples[i] for i in idx]
        cands = [res.cand_samples[i] for i in idx]
        firsts = [res.ref_first[i] for i in idx] if res.ref_first else []
        med, lo, hi = balanced_ci([r / c for r, c in zip(refs, cands)], firsts)
        out.append(TimingResult(
            ref_ms=statistics.median(refs), cand_ms=statistics.median(cands), speedup=med, ci95=(lo, hi),
            samples=len(idx), converged=res.converged, method=res.method,
            ref_spread_ms=_quartiles(refs), cand_spread_ms=_quartiles(cands),
            host_ref_ms=res.host_ref_ms, host_cand_ms=res.host_cand_ms, spot_checks=len(idx),
            overhead_ms=res.overhead_ms, ref_samples=refs, cand_samples=cands, ref_first=firsts))
    return out


def combine(blocks: list[TimingResult]) -> TimingResult:
    """The rounds of independent candidate processes (`Protocol.processes`, see `split`), as one result.

    The speedup is every process's paired ratios pooled (`balanced_ci`); its CI spans the pooled rounds' own
    interval and every process's interval. Rounds within one process are not independent of that process (its
    memory layout, where its threads ran), so a within-run interval misses the next run (measured on the 2-core
    host: a 5x candidate's point estimates over 10 invocations spread 4.77-5.54 with ±2.5% intervals, 0 of 9
    inside the first). Spanning independent processes is what makes the interval cover the variation a user
    sees between runs; `process_speedups` records each process's median."""
    if len(blocks) == 1:
        return blocks[0]
    ratios = [r / c for b in blocks for r, c in zip(b.ref_samples, b.cand_samples)]
    refs = [x for b in blocks for x in b.ref_samples]
    cands = [x for b in blocks for x in b.cand_samples]
    firsts = [f for b in blocks for f in b.ref_first] if all(b.ref_first for b in blocks) else []
    med, lo, hi = balanced_ci(ratios, firsts)
    first = blocks[0]
    out = TimingResult(
        ref_ms=statistics.median(refs), cand_ms=statistics.median(cands), speedup=med,
        ci95=(min([lo] + [b.ci95[0] for b in blocks]), max([hi] + [b.ci95[1] for b in blocks])),
        samples=sum(b.samples for b in blocks), converged=all(b.converged for b in blocks),
        method=first.method + f"; {len(blocks)} candidate processes interleaved in blocks of rounds, CI spanning each one's",
        ref_spread_ms=_quartiles(refs), cand_spread_ms=_quartiles(cands),
        host_ref_ms=statistics.median([b.host_ref_ms for b in blocks]),
        host_cand_ms=statistics.median([b.host_cand_ms for b in blocks]),
        spot_checks=sum(b.spot_checks for b in blocks),
        overhead_ms=statistics.median([b.overhead_ms for b in blocks]), ref_samples=refs, cand_samples=cands,
        ref_first=firsts)
    out.processes = len(blocks)
    out.process_speedups = [round(b.speedup, 6) for b in blocks]
    out.within_ci95 = (lo, hi)
    return out


def noise_note(res: TimingResult, kind: str | None = None) -> str | None:
    """'host too noisy' when the interval cannot resolve the speedup (its ends more than NOISY_SPAN apart): the
    number is still reported (a reward needs one) but must not be read as a measurement of the candidate. When
    the between-run part dominates, more rounds would not help: the note says why instead — a side so host-bound
    that its time moves with its process (when the part `kind`'s calibration adds for the sides' spreads is most
    of it), else times too short for the judge's round trip."""
    lo, hi = res.ci95
    if lo > 0 and hi / lo <= NOISY_SPAN:
        return None
    span = f"x{hi / lo:.2f}" if lo > 0 else "unbounded"
    head = f"host too noisy: the 95% CI {lo:.3g}-{hi:.3g} spans {span} (more than x{NOISY_SPAN:g}); "
    wlo, whi = res.within_ci95 or (lo, hi)
    within = max(math.log(res.speedup / wlo), math.log(whi / res.speedup)) if min(wlo, res.speedup) > 0 else math.inf
    if res.between_run_sd and _Z * res.between_run_sd > within:
        spreads = {"reference": relative_spread(res.ref_spread_ms, res.ref_ms),
                   "candidate": relative_spread(res.cand_spread_ms, res.cand_ms)}
        rest = between_run_sd(res.ref_ms, res.cand_ms, res.overhead_ms, kind) if kind else res.between_run_sd
        if res.between_run_sd ** 2 > 2 * rest ** 2:  # the sides' spreads are most of the between-run part
            side = max(spreads, key=spreads.get)
            return head + (f"the {side} is host-bound (its rounds' interquartile range is {spreads[side]:.0%} of "
                           "its median): its time moves with the process it runs in, so another run may read "
                           "differently and more rounds would not help — compare programs of this task by their own "
                           "times (bench: speedup_vs_compile_by_time)")
        return head + (f"the times (reference {res.ref_ms:.3g} ms, candidate {res.cand_ms:.3g} ms) are short "
                       f"against the judge's round trip ({res.overhead_ms:.3g} ms), whose error between runs "
                       "does not shrink with more rounds — compare on larger inputs")
    return head + "the speedup does not resolve the candidate here — re-run on a quieter host or with a larger --time-budget"


def inconsistent(blocks: list[TimingResult]) -> str | None:
    """A note when candidate processes disagree about the speedup beyond 2x *and* beyond their own intervals.
    The processes are interleaved in blocks of rounds, so this is a process-dependent speed, not the host's load
    changing (when blocks ran one after another, the reference's own code read 0.20x, 0.46x, 0.20x in three
    processes on the 2-core host under load 4-6). It stays a note, not a rejection: an honest candidate's speed
    may depend on its process (an autotuner's choice), the CI already spans every process, and a large speedup
    is re-measured in fresh workers, which report the lowest."""
    if len(blocks) < 2:
        return None
    lo = min(blocks, key=lambda b: b.speedup)
    hi = max(blocks, key=lambda b: b.speedup)
    half = lambda b: max(math.log(b.ci95[1] / b.speedup), math.log(b.speedup / b.ci95[0]))  # noqa: E731
    if min(lo.speedup, lo.ci95[0], hi.ci95[0]) <= 0:
        return None
    if math.log(hi.speedup / lo.speedup) <= math.log(2.0) + half(lo) + half(hi):
        return None
    listing = ", ".join(f"{b.speedup:.3f}x [{b.ci95[0]:.3f}-{b.ci95[1]:.3f}]" for b in blocks)
    return f"the speedup differs between the candidate's own processes beyond 2x and their intervals: {listing}"
