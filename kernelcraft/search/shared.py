"""Verdicts measured before a run, for exactly the texts it proposes (a bench's baselines): when one may stand in
for a new evaluation.

Only for the same text, the same protocol as the run's first evaluations (the clocks `timeout_s` and
`build_timeout_s` aside), the same device kind, and not a timeout; it is stored marked `shared`.
Confirmations and the bench's judgement of best.py are always measured afresh.
Rationale: docs/design/search.md#shared
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
