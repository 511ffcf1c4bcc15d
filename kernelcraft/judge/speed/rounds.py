"""The timed rounds of one evaluation: the judge's clock around both sides, the candidate's processes, output checks.

`time_candidate` runs after the correctness trials and gives `timing.measure` functions that time one call of each
side, prepare a round (fresh draw, poisoned outputs, fresh secret indices) and check it (every timed output held to
the trials' `Acceptance`, audits at random rounds). Untimed requests during timing go through the CPU ledger
(`treecpu`). The timed rounds, and only they, hold the device alone (`gate`): other evaluations' checks step aside
(frozen) and what they left queued drains before the clock calibrates. The candidate's further processes are built
and checked before that, beside the others: a frozen neighbour may hold what a build waits for (a compile cache's
file lock), and a timer waiting on it would wait for the neighbour's thaw, that is for itself.

Rationale: docs/design/judge-speed.md#rounds
"""
from __future__ import annotations

from kernelcraft.judge.speed import reproduce, siblings, timing, treecpu
from kernelcraft.judge.speed.gate import EXCLUSIVE, SHARED, DeviceGate
from kernelcraft.judge.correctness.acceptance import Acceptance, Sample
from kernelcraft.judge.reject import Reject
from kernelcraft.judge.process.sideproc import NULL, RUN, SideProc

AUDIT_SHARE = 0.2  # share of timing rounds followed by an audit (at random: the candidate cannot tell which)
FIRST_IDLE_FLOOR_MS = 0.02  # the idle probe's floor on a device no timer has calibrated yet (H100/H200: 0.011-0.031)


def idle_floor(gate: DeviceGate) -> float | None:
    """The idle speed a timer waits for before it calibrates: the device's lowest calibration so far, or
    `FIRST_IDLE_FLOOR_MS`; None without a gate (no other evaluation can share the device)."""
    return (gate.idle_floor() or FIRST_IDLE_FLOOR_MS) if gate.path else None


def time_candidate(ev, accepted: Acceptance) -> None:
    """Paired rounds of the reference and the candidate (its processes in turn) until the CI is tight or the
    budget is spent; every timed output held to what the trials `accepted`. The record goes to
    `ev.result["timing"]`."""
    p = ev.p
    sample = Sample(ev.out_specs, ev.device)
    ledger = treecpu.Ledger()
    taken: dict[str, list] = {}  # this round's outputs, copied when each side's timed call ended ...
    intact: dict[str, bool] = {}  # ... and whether its inputs were still the judge's then
    left = {"reference": [], "candidate": []}
    k = max(1, int(p.processes or 1)) if ev.spawn_candidate is not None else 1
    procs = [ev.cand]  # the candidate's processes; more are started below, before the device is taken alone
    order = siblings.Schedule(k, ev.rng.randrange(1 << 30))

    def next_round(i: int) -> None:
        if order.pick(i) and i >= 0:  # another candidate process takes over: one untimed round first
            warm_up()
        fresh_state()
        ev.redraw()
        ev._poison()
        sample.draw()

    def warm_up() -> None:
        fresh_state()
        ev.redraw()
        ev._poison()
        sample.draw()
        for f in ((time_ref, time_cand) if ev.rng.random() < 0.5 else (time_cand, time_ref)):
            f()
        check_round(-1)

    def fresh_state() -> None:  # a stateful task: both sides from their constructed state (`Evaluation.fresh_state`)
        if ev.stateful:
            for side in (ev.ref, procs[order.current]):
                role = side.role
                ledger.window(role, side.pid, lambda: side.request({"cmd": "restore"}, phase="time"))

    def timed(side: SideProc, role: str) -> float:
        ms, leftover, reply = side.timed(RUN, clock)
        # the output as it was when the clock stopped, in the judge's memory before the process runs again
        taken[role] = sample.take(ev.out_arenas[role].tensors, list(reply.get("values", [])))
        intact[role] = ev._inputs_intact(role)
        left[role].append(leftover)
        return ms

    def time_ref() -> float:
        return timed(ev.ref, "reference")

    def time_cand() -> float:
        return timed(procs[order.current], "candidate")

    def time_null() -> tuple[float, float]:
        """Both sides get an empty request, in random order, so neither is the one touched last before the
        next round (the most recently run process starts warm): (the reference's, the candidate's). The
        candidate's is subtracted from its samples only where it is the smaller (`timing` — it could slow its own
        to inflate what is subtracted), and is the processes' footing (`reproduce.reproducible`). Each side's
        CPU time in it goes to the ledger: the candidate's beyond the reference's is billed."""
        cand = procs[order.current]
        order_ = [ev.ref, cand] if ev.rng.random() < 0.5 else [cand, ev.ref]
        got = {s.role: ledger.window(s.role, s.pid, lambda s=s: s.timed(NULL, clock)[0]) for s in order_}
        return got["reference"], got["candidate"]

    def interval(ratios: list[float], firsts: list[bool]) -> tuple[float, float, float]:  # as the record will be
        if k == 1:
            return timing.balanced_ci(ratios, firsts)
        return timing.spanning_ci([([x for x, w in zip(ratios, order.who) if w == j],
                                    [f for f, w in zip(firsts, order.who) if w == j]) for j in range(k)])

    def check_round(i: int) -> None:
        if not intact["candidate"] and intact["reference"]:  # (`Evaluation._check_mutation`)
            raise Reject("incorrect", ["input_mutation"], "during a timed call: the candidate modified its inputs")
        ref_out, cand_out = _as_output(ev, taken["reference"]), _as_output(ev, taken["candidate"])
        cmp = accepted.compare(ref_out, cand_out, on=ev.device)
        if not cmp.ok:
            reasons = ["stale_output"] if "value_mismatch" in cmp.reasons else cmp.reasons
            raise Reject("incorrect", reasons, "an output of a timed call was wrong (held to the rule the trials "
                         "accepted, at elements the judge chose in secret): " + cmp.message)
        if i >= 0 and ev.rng.random() < AUDIT_SHARE:
            ev._audit()
            if k > 1:
                siblings.check_stopped(procs)

    sibs: list[SideProc] = []
    if k > 1:  # built, first-called and checked as the first process was: beside other evaluations' checks (`gate`)
        sibs = siblings.start(ev, k, accepted)
        procs += sibs
    held = ev.gate.mode
    if held != EXCLUSIVE:
        ev.wait_for_device(ev.gate.exclusive)  # (the phase is `time`)
    try:
        clock = timing.RoundTripClock(ev.device, floor_ms=idle_floor(ev.gate))
        ev.gate.record_idle(clock.idle_ms)
        if k > 1:
            siblings.check_stopped(procs)
        for side in [ev.ref, *procs]:  # one empty request each before the ledger opens: a process's first one
            side.request(NULL, phase="time")  # pays one-off costs (lazy CUDA state) that no later one does
        host_before = treecpu.host_cpu_jiffies()  # what else the host ran meanwhile (`Timing.host_busy_cores`)
        run = timing.measure(
            time_ref, time_cand, time_null, next_round, check_round,
            cuda=ev.device.type == "cuda", budget_s=p.time_budget_s, target=p.target_ci,
            min_rounds=max(p.min_rounds, siblings.BLOCK * k if k > 1 else 1), warmup_rounds=3 * k,
            interval=interval, seed=ev.rng.randrange(1 << 30), billed=ledger.billed_ms)
        host_busy = treecpu.host_busy_cores(host_before, treecpu.host_cpu_jiffies())
    finally:
        if held == SHARED:
            ev.gate.share()  # the weights trial after timing shares the device again
        elif held is None:
            ev.gate.release()
    if sibs:
        siblings.end(ev, sibs)
    blocks = timing.split(run, order.who, k) if k > 1 else [run]
    med = lambda v: sorted(v)[len(v) // 2] if v else 0.0  # noqa: E731
    res = timing.combine(blocks)
    res.cand_overhead_ms = run.cand_overhead_ms  # (`combine` builds a new result without it)
    res = reproduce.reproducible(res, ev.device.type)
    res.hidden_work_ms = med(left["candidate"]) - med(left["reference"])
    rec = res.record()
    rec["note"] = timing.noise_note(res, ev.device.type) or timing.inconsistent(blocks)
    rec["audits"] = ev.audit.count + 1  # with the one after timing
    rec["busy_probes"] = clock.busy_probes
    rec["probe_idle_ms"] = clock.idle_ms
    rec["idle_wait_ms"] = round(clock.idle_wait_ms, 3)
    rec["host_busy_cores"] = host_busy
    rec.update(ledger.record(run.samples))
    ev.result["timing"] = rec
    ev.result["guards"] += ["frozen_peer", "judge_clock", "output_at_close", "cpu_ledger"]


def _as_output(ev, items: list):
    """A side's captured items in the reference's output structure."""
    return items[0] if ev.out_kind == "tensor" else tuple(items)
