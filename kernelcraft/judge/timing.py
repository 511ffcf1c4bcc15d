"""Timing: reference and candidate, paired, interleaved, on fresh inputs, until the speedup is known.

Design decisions
- The clocks are bound at import of this module (`perf_counter_ns`, and on GPU `torch.cuda.Event`,
  `Event.record`, `Event.elapsed_time`, `torch.cuda.synchronize`). The worker imports it before any
  candidate code, so a candidate that patches `time` or `torch.cuda` later does not reach these.
- One *round* times both sides once, in random order, on the same input values. The two calls of a round
  share conditions (clocks, temperature, neighbours), so their ratio is a low-noise *paired* sample.
  The speedup is the median of the per-round ratios; its 95% CI comes from order statistics of those
  ratios (distribution-free). Rounds continue in batches until the CI is within ±target (default 1%)
  or the time budget is spent. `ref_ms`/`cand_ms` are the medians of each side (so their quotient can
  differ slightly from the paired estimate).
- GPU: before each timed call the L2 is flushed (a buffer of 2×L2 is zeroed) and the *device* is
  synchronized; the call is bracketed by CUDA events on the current stream, followed by a device-wide
  synchronize and a host clock read. Samples are the event times (host jitter would blur them), but
  both clocks are kept: if the candidate's host time exceeds its event time by clearly more than the
  reference's does, device work ran where the events could not see it (another stream). Then the
  host times (less the calibrated sync overhead) are used for both sides, and a large gap is
  reported as `hidden_work_ms` for the worker to reject.
- CPU: host clock around the call, same pairing. No cache flush (documented limitation).
- Every round's candidate output is compared with that round's reference output (`spot_check`), so an
  answer cached from an earlier call fails; `next_inputs` supplies values that were never seen before
  at fixed addresses (see the worker).
"""
from __future__ import annotations

import math
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

_perf_ns = time.perf_counter_ns
_cuda_sync = torch.cuda.synchronize
_Event = torch.cuda.Event
_event_record = torch.cuda.Event.record
_event_elapsed = torch.cuda.Event.elapsed_time
_Z = 1.959963984540054


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
    hidden_work_ms: float = 0.0
    ref_samples: list[float] = field(repr=False, default_factory=list)
    cand_samples: list[float] = field(repr=False, default_factory=list)

    def record(self) -> dict:
        d = dict(self.__dict__)
        d.pop("ref_samples"), d.pop("cand_samples")
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


def _quartiles(v: list[float]) -> tuple[float, float]:
    if len(v) < 4:
        return min(v), max(v)
    q = statistics.quantiles(v, n=4)
    return q[0], q[2]


class Clock:
    """Times one call on one device: events + device sync on GPU, host clock on CPU."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self.sync_overhead_ms = 0.0
        if self.cuda:
            l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 << 20) or (50 << 20)
            self.flush_buf = torch.empty(max(2 * l2, 64 << 20) // 4, dtype=torch.int32, device=device)
            self.start, self.end = _Event(enable_timing=True), _Event(enable_timing=True)
            self.sync_overhead_ms = self._calibrate()

    def _calibrate(self) -> float:
        """Median host time of an empty bracket: what a sample's host time carries beyond the work."""
        vals = []
        for _ in range(20):
            _cuda_sync()
            t0 = _perf_ns()
            _event_record(self.start)
            _event_record(self.end)
            _cuda_sync()
            vals.append((_perf_ns() - t0) / 1e6)
        return statistics.median(vals)

    def sync(self):
        if self.cuda:
            _cuda_sync()

    def time_call(self, fn: Callable[[], object]) -> tuple[float, float, object]:
        """(sample_ms, host_ms, output) for one call."""
        if not self.cuda:
            t0 = _perf_ns()
            out = fn()
            ms = (_perf_ns() - t0) / 1e6
            return ms, ms, out
        self.flush_buf.zero_()
        _cuda_sync()
        t0 = _perf_ns()
        _event_record(self.start)
        out = fn()
        _event_record(self.end)
        _cuda_sync()
        host_ms = (_perf_ns() - t0) / 1e6
        event_ms = _event_elapsed(self.start, self.end)
        return event_ms, host_ms, out


def measure(
    clock: Clock,
    run_ref: Callable[[object], object],
    run_cand: Callable[[object], object],
    next_inputs: Callable[[int], tuple[object, object]],
    spot_check: Callable[[object, object], None],
    *,
    budget_s: float = 3.0,
    target: float = 0.01,
    min_rounds: int = 10,
    max_rounds: int = 5000,
    warmup_s: float = 0.2,
    batch: int = 10,
    seed: int = 0,
    prepare: Callable[[str], None] | None = None,
) -> TimingResult:
    """Paired, interleaved timing until the speedup CI is within ±target or `budget_s` is spent.

    At least `min_rounds` rounds are timed unless that would take over 3× the budget (slow forwards).

    `next_inputs(i)` returns (ref_args, cand_args) for round i; `spot_check(ref_out, cand_out)` raises
    if the candidate's output of a timed call is wrong; `prepare("ref" | "cand")` runs before each side's
    call, outside the timed region. Both sides are timed through identical code paths.
    """
    rng = random.Random(seed)
    prepare = prepare or (lambda side: None)

    def time_ref(args):
        prepare("ref")
        return clock.time_call(lambda: run_ref(args))

    def time_cand(args):
        prepare("cand")
        return clock.time_call(lambda: run_cand(args))
    # warm-up: both sides, until each has run 3 times and warmup_s has passed (capped at 50 calls)
    t_end = _perf_ns() + int(warmup_s * 1e9)
    for i in range(50):
        ref_args, cand_args = next_inputs(-1 - i)
        prepare("ref")
        r_out = run_ref(ref_args)
        prepare("cand")
        spot_check(r_out, run_cand(cand_args))
        clock.sync()
        if i >= 2 and _perf_ns() > t_end:
            break

    ref_s, cand_s, ref_h, cand_h, ratios = [], [], [], [], []
    start = _perf_ns()
    deadline = start + int(budget_s * 1e9)
    hard_deadline = start + int(3 * max(budget_s, 1.0) * 1e9)  # min_rounds yields to this
    converged = False
    checks = 0
    rounds = 0
    while rounds < max_rounds:
        for _ in range(batch):
            ref_args, cand_args = next_inputs(rounds)
            if rng.random() < 0.5:
                r, rh, r_out = time_ref(ref_args)
                c, ch, c_out = time_cand(cand_args)
            else:
                c, ch, c_out = time_cand(cand_args)
                r, rh, r_out = time_ref(ref_args)
            prepare("cand")
            spot_check(r_out, c_out)
            checks += 1
            del r_out, c_out
            ref_s.append(r), cand_s.append(c), ref_h.append(rh), cand_h.append(ch)
            ratios.append(r / max(c, 1e-6))
            rounds += 1
        med, lo, hi = median_ci(ratios)
        if rounds >= min_rounds and hi / med - 1 <= target and 1 - lo / med <= target:
            converged = True
            break
        now = _perf_ns()
        if now > deadline and (rounds >= min_rounds or (now > hard_deadline and rounds >= 3)):
            break
    method = ("cuda: L2 flush, CUDA events + device-wide sync, host-clock cross-check; paired rounds"
              if clock.cuda else "cpu: host perf_counter; paired rounds")
    hidden = 0.0
    if clock.cuda:
        gap = lambda h, e: statistics.median(x - y for x, y in zip(h, e))  # noqa: E731
        hidden = gap(cand_h, cand_s) - gap(ref_h, ref_s)
        cand_med = statistics.median(cand_s)
        if hidden > max(0.1 * cand_med, 0.02):  # device work the candidate's events missed
            o = clock.sync_overhead_ms
            ref_s = [max(h - o, e) for h, e in zip(ref_h, ref_s)]
            cand_s = [max(h - o, e) for h, e in zip(cand_h, cand_s)]
            ratios = [r / max(c, 1e-6) for r, c in zip(ref_s, cand_s)]
            method += "; host times used (device work outlived the candidate's stream)"
    med, lo, hi = median_ci(ratios)
    return TimingResult(
        ref_ms=statistics.median(ref_s), cand_ms=statistics.median(cand_s), speedup=med, ci95=(lo, hi),
        samples=rounds, converged=converged, method=method,
        ref_spread_ms=_quartiles(ref_s), cand_spread_ms=_quartiles(cand_s),
        host_ref_ms=statistics.median(ref_h), host_cand_ms=statistics.median(cand_h),
        spot_checks=checks, hidden_work_ms=hidden, ref_samples=ref_s, cand_samples=cand_s)
