"""How any stage of the judge fails a candidate (or names the task's or the harness's fault): raise `Reject`.

A `Reject` carries a verdict's status, its reason codes (`kernelcraft.verdict.REASONS`) and a message; the judge
process turns the first one raised into the job's record (`process.jobs`), a side sends it as a `reject` reply that
the judge trusts only as bad news (`process.sideproc`).
"""
from __future__ import annotations


class Reject(Exception):
    """A verdict reached inside the judge: (status, reasons, message)."""

    def __init__(self, status: str, reasons: list[str], message: str):
        super().__init__(message)
        self.status, self.reasons, self.message = status, reasons, message
