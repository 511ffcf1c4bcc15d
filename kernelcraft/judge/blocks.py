"""Timing blocks in fresh candidate processes (`Protocol.processes`): the candidate's process is replaced between
blocks, so the timing CI can span independent processes (`timing.combine`).

Design decisions
- A replacement is a full candidate: a fresh side from the judge's forker (`jobs` hands the Evaluation a
  factory), imported with the first import's message (its builds are cache hits), constructed with the same
  seed, lent the same arenas, and it must pass one correctness trial of its own before it is timed (a
  candidate honest only in the process the judge checked is a wrong answer, `v2_c7_later_process_differs`).
  Every timed output of every block is still compared and every input re-verified.
- The replaced process and what it started are killed and reaped before the next is forked
  (`sideproc.end_candidate`, as at the end of a job): its children (an honest torch.compile's worker pool) are
  re-parented to the judge, where an audit would otherwise find them as orphans the candidate detached.
"""
from __future__ import annotations

import torch

from kernelcraft.judge.compare import compare_outputs
from kernelcraft.judge.guards import Reject
from kernelcraft.judge.sideproc import end_candidate


def replace_candidate(ev, b: int, k: int, tol) -> None:
    """Between timing blocks: the candidate's process is replaced by a fresh one (from the forker), imported
    (a build-cache hit) and constructed like the first, on the same arenas, and it must pass one correctness
    trial of its own before it is timed. So the blocks see independent processes and the CI can span them."""
    old, ev.cand = ev.cand, None
    end_candidate(old, keep={ev.ref.pid, ev.forker_pid})
    ev.cand = ev.sides["candidate"] = ev.spawn_candidate()
    ev.audit.sides["candidate"] = ev.cand.pid
    ev.cand.request(ev.cand_import, phase="time")
    ev.cand.request(ev.construct_msg, phase="time")
    for arenas, cmd in ((ev.in_arenas, dict(cmd="inputs", values=ev.values)),
                        (ev.out_arenas, dict(cmd="outputs", kind=ev.out_kind))):
        desc, fds = arenas["candidate"].handle()
        ev.cand.request(dict(cmd, arena=desc), fds, phase="time")
    ev._write_inputs(ev._draw())
    ev._poison()
    replies = {s.role: s.request(dict(cmd="run", check=True), phase="time") for s in (ev.ref, ev.cand)}
    if ev.device.type == "cuda":
        torch.cuda.synchronize()
    ev._check_mutation(f"candidate process {b + 1} of {k}")
    ref_out, cand_out, _ = ev._trial_outputs(replies)
    cmp = compare_outputs(ref_out, cand_out, *tol)
    if not cmp.ok:
        raise Reject("incorrect", cmp.reasons, f"candidate process {b + 1} of {k} (a fresh process for "
                     f"timing) failed its correctness trial: {cmp.message}")
