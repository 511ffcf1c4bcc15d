"""Verdicts measured before a run, for exactly the texts it proposes (a bench's baselines): when one may stand in
for a new evaluation.

Design decisions
- The recipes policy's first round proposes `compile:default` and `cudagraph`, the very texts a bench has just
  judged as its baselines. Measuring them twice changes nothing but the wall time (issue 20), so a run may be
  handed such verdicts (`optimize.Options.known_verdicts`, candidate sha256 -> verdict record).
- One stands in only when it is what the run would have measured: the same text (its sha256), the same protocol
  as the run's first evaluations (seed and timing budget included; the run clocks `timeout_s` and
  `build_timeout_s` may differ, since compile baselines get a longer one), the same device kind (the GPU's name,
  or a CPU for a CPU), and not a timeout (the moment's, not the candidate's). Anything else is measured.
- It is stored as given, marked `shared`; confirmations of leaders and the bench's judgement of best.py are
  always measured afresh, so no reported number rests on it alone.
"""
from __future__ import annotations

from kernelcraft.candidate import Candidate

CLOCKS = ("timeout_s", "build_timeout_s")


def shared_verdict(known: dict, source: str, protocol_key: dict, info) -> dict | None:
    """The verdict in `known` for `source` if it may stand in for a first evaluation under `protocol_key` on the
    device `info` (`devices.DeviceInfo`), marked `shared`; else None."""
    v = known.get(Candidate(source).sha256) if known else None  # the verdicts' own candidate_sha256
    if not v or v.get("status") == "timeout":
        return None
    gpu = (v.get("env") or {}).get("gpu")
    if (info.kind == "cuda") != str(v.get("device", "")).startswith("cuda") or (info.kind == "cuda" and gpu != info.name):
        return None
    got = v.get("protocol") or {}
    if {k: x for k, x in got.items() if k not in CLOCKS} != {k: x for k, x in protocol_key.items() if k not in CLOCKS}:
        return None
    return {**v, "shared": "measured before this run (a bench baseline of the same text)"}
