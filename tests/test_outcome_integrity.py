"""The caller never takes a worker's word for `correct` alone: an honest `correct` carries every correctness
trial passed (and timing when timing was asked for). Anything less means the worker was tampered with from
inside (see the harness_patch_* hack fixtures for the in-worker half)."""
import pytest

from kernelcraft.evaluate import _assemble
from kernelcraft.judge.caller.runner import WorkerOutcome

BASE = {"task": "t", "candidate_sha256": "0" * 64, "device": "cpu", "mode": "open"}
TIMING = {"ref_ms": 2.0, "cand_ms": 1.0, "speedup": 2.0, "ci95": [1.9, 2.1], "samples": 30, "method": "cpu"}


def outcome(**result):
    return WorkerOutcome(result={"status": "correct", "reasons": [], "message": "", "guards": [], **result})


@pytest.mark.parametrize("result, why", [
    ({}, "no correctness record"),
    ({"correctness": {"trials": 5, "passed": 3}, "timing": TIMING}, "trials failed"),
    ({"correctness": {"trials": 1, "passed": 1}, "timing": TIMING}, "fewer trials than asked"),
    ({"correctness": {"trials": 5, "passed": 5}}, "no timing although timing was asked for"),
])
def test_correct_without_the_evidence_is_rejected(result, why):
    v = _assemble(BASE, outcome(**result), 60, 60, expect={"trials": 5, "timing": True})
    assert (v.status, v.reasons, v.speedup) == ("rejected", ["global_state_tampering"], None), why


def test_honest_correct_passes():
    v = _assemble(BASE, outcome(correctness={"trials": 5, "passed": 5}, timing=TIMING), 60, 60,
                  expect={"trials": 5, "timing": True})
    assert (v.status, v.speedup) == ("correct", 2.0)
    v = _assemble(BASE, outcome(correctness={"trials": 2, "passed": 2}), 60, 60, expect={"trials": 2, "timing": False})
    assert (v.status, v.speedup) == ("correct", None)
