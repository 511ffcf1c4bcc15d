"""The candidate's other processes (`Protocol.processes`): timed interleaved with the first, in blocks of rounds.

Each sibling is a full candidate (a fresh side, the same seed, the same arenas) that passes a correctness trial and
the weights check of its own before it is timed; the processes take turns in blocks of `BLOCK` rounds
(`Schedule`). No candidate process runs outside its own timed window: only the judge thaws. The record's interval
spans every process's.

Rationale: docs/design/judge-speed.md#siblings
"""
from __future__ import annotations

import random

import torch

from kernelcraft.judge.process import freeze
from kernelcraft.judge.correctness import weights
from kernelcraft.judge.correctness.acceptance import Acceptance
from kernelcraft.judge.reject import Reject
from kernelcraft.judge.process.sideproc import RUN, SideProc, end_candidate


def start(ev, k: int, accepted: Acceptance) -> list[SideProc]:
    """k - 1 more candidate processes beside `ev.cand`, each imported, constructed, lent the candidate's arenas
    checked once against the reference on a fresh draw and once with new weights (not in a re-measure, as for the
    first process). Registered with the audit as `candidate.N`."""
    sibs: list[SideProc] = []
    for j in range(1, k):
        side = ev.spawn_candidate()
        side.preempt = ev.step_aside_if_wanted  # built beside other evaluations' checks: steps aside for their timers
        sibs.append(side)
        ev.audit.watch(f"candidate.{j}", side.pid, side.init_pid)
        every = [ev.cand.pid] + [s.pid for s in sibs]
        for p in [ev.cand] + sibs:  # each process's own tripwires must not take its siblings for escapees (in a
            if p.namespace is None:  # namespace of its own it sees none of them, and these pids name nothing)
                p.request(dict(cmd="peers", pids=every), phase="time")
        side.request(ev.cand_import, phase="time")
        side.request(ev.construct_msg, phase="time")
        for arenas, cmd in ((ev.in_arenas, dict(cmd="inputs", values=ev.values)),
                            (ev.out_arenas, dict(cmd="outputs", kind=ev.out_kind))):
            desc, fds = arenas["candidate"].handle()
            side.request(dict(cmd, arena=desc), fds, phase="time")
        ev.first_call(side, "time")  # never judged (`worker.Evaluation.first_call`)
        ev.fresh_state((ev.ref, side), "time")  # a stateful task: both from their constructed state
        ev.redraw()
        ev._poison()
        replies = {"reference": ev.ref.request(RUN, phase="time"), "candidate": side.request(RUN, phase="time")}
        if ev.device.type == "cuda":
            torch.cuda.synchronize()
        ev._check_mutation(f"candidate process {j + 1} of {k}")
        ref_out, cand_out, _ = ev._trial_outputs(replies)
        ev.audit_checked_call(side, "time", compared=False)  # as after the first process's trials
        cmp = accepted.compare(ref_out, cand_out, on=ev.device)
        if not cmp.ok:
            raise Reject("incorrect", cmp.reasons, f"candidate process {j + 1} of {k} (a fresh process for "
                         f"timing) failed its correctness trial: {cmp.message}")
        ev.audit_checked_call(side, "time", compared=True)
        if not ev.job.get("remeasure"):  # as for the first process (`worker`); a re-measure keeps the first run's check
            weights.check_process(ev, side, f"candidate process {j + 1} of {k} (a fresh process for timing): ",
                                  accepted)
    return sibs


def check_stopped(procs: list[SideProc]) -> None:
    """Every candidate process and what it started read back as stopped (/proc), at the audit moments of timing:
    the seccomp filter refuses SIGCONT to the candidate, so one found running means a door this design missed."""
    for p in procs:
        running = [t for m in p.tree() for t in freeze.running_threads(m)]
        if running:
            raise Reject("rejected", ["thread_injection"], "a candidate process that the judge had frozen was "
                         f"running while another was timed (threads {', '.join(running[:4])})")


BLOCK = 5  # consecutive rounds of one candidate process before the next takes over


class Schedule:
    """Which candidate process each round times: blocks of BLOCK consecutive rounds, in shuffled cycles over the
    k processes (every process once per cycle, so they share the run's moments evenly; shuffled, so no process is
    always first after a pause). Round-by-round alternation is biased: a process that runs only every k-th
    round finds its data evicted from the caches by the others, while the reference runs every round (a
    channels-last CNN read 0.99x against 1.66x in one process on the 2-core host). Within a block the
    candidate process and the reference alternate as in a single-process run, and a switch to another process
    is preceded by one untimed round (`pick` returns True: the caller runs it), so every timed round starts
    equally warm.
    Warm-up rounds (negative) visit the processes in turn. `who` records the timed rounds' choices."""

    def __init__(self, k: int, seed: int, block: int = BLOCK):
        self.k, self.block, self.rng = k, block, random.Random(seed)
        self.cycle: list[int] = []
        self.who: list[int] = []
        self.current = 0

    def pick(self, i: int) -> bool:
        """Set `current` for round i; True when it is another process than the round before (a switch)."""
        before = self.current
        if i < 0:
            self.current = (-1 - i) % self.k
            return self.current != before
        if i % self.block == 0:
            if not self.cycle:
                self.cycle = list(range(self.k))
                self.rng.shuffle(self.cycle)
            self.current = self.cycle.pop()
        self.who.append(self.current)
        return self.current != before


def end(ev, sibs: list[SideProc]) -> None:
    """After timing: the siblings and what they started, killed and reaped; the first process is kept."""
    live = {ev.ref.pid, ev.forker_pid, ev.cand.pid, ev.cand.init_pid}  # (a namespace's init: killing it ends it)
    live |= {p for s in sibs for p in (s.pid, s.init_pid)}
    for j, side in enumerate(sibs, start=1):
        live -= {side.pid, side.init_pid}
        end_candidate(side, keep={p for p in live if p})
        ev.audit.forget(f"candidate.{j}")
