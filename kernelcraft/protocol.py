"""The judging protocol: every knob that can change a verdict, in one frozen pydantic model.

One name, one default, one validation per knob; every entry point takes a `Protocol` and none restates a default.
Fields left None take the device kind's default (`DEVICE_DEFAULTS`, filled in by `resolved`), and the resolved
protocol is recorded in every verdict. Execution settings (jobs, caches, what a search does) are not knobs: they
must never change a verdict. `WEAKENING` knobs are never accepted from a remote caller.

Rationale: docs/design/core.md#protocol
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

DEVICE_DEFAULTS: dict[str, dict[str, float]] = {
    "cpu": {"time_budget_s": 1.0, "timeout_s": 180.0, "processes": 3},
    "cuda": {"time_budget_s": 2.0, "timeout_s": 300.0, "processes": 1},
}
WEAKENING = ("screen", "runtime_guards")  # never accepted from a remote caller


class ProtocolError(ValueError):
    """A knob with a bad value or an unknown name (a ValueError: the caller's bug, never a verdict).
    `problems` holds (field, what is wrong) pairs, for callers that name fields their own way (the CLI)."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        super().__init__(describe_problems(problems))


class Protocol(BaseModel):
    """How a candidate is judged. Fields left None take the device kind's default (`resolved`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["open", "strict"] = Field("open", description="strict: the candidate must run a kernel of "
                                            "its own and may not call the reference")
    trials: int = Field(5, ge=1, le=100, description="correctness trials, each on fresh random inputs")
    atol: float | None = Field(None, ge=0, description="absolute tolerance (default per output dtype)")
    rtol: float | None = Field(None, ge=0, description="relative tolerance (default per output dtype)")
    seed: int = Field(42, description="seed of the weights both models are constructed with (inputs are drawn from a seed "
                      "no process but the judge knows); re-measurements derive their own")
    precision: Literal["calibrated", "fixed"] = Field(
        "calibrated", description="calibrated: the candidate's error vs a float64 evaluation of the reference must "
        "be within precision_factor x the reference's own (judge/correctness/precision.py); fixed: atol/rtol only "
        "(KernelBench-style)")
    precision_factor: float = Field(6.0, ge=1, le=1e6, description="calibrated rule: how many times the "
                                    "reference's own RMS error vs float64 a candidate's may be")
    partial_trials: int = Field(2, ge=0, le=10, description="extra trials whose inputs differ from the previous "
                                "trial's in a few elements only, at the same addresses (partial-key caches)")
    timing: bool = Field(True, description="time the candidate after it passes (False: correctness only)")
    module_mode: Literal["train", "eval"] = Field("train", description="the models' module mode for checking and "
                                                  "timing, set by model.train()/eval() after construction "
                                                  "(KernelBench's default: train)")
    time_budget_s: float | None = Field(None, gt=0, le=600, description="seconds of paired timing before "
                                        "giving up on the CI target (more than 0; default 1 cpu / 2 gpu)")
    target_ci: float = Field(0.01, ge=0, le=1, description="stop timing once the speedup's 95% CI half-width "
                             "is below this fraction (or below half the between-run part, judge/speed/timing.py; 0: "
                             "time for the whole budget)")
    min_rounds: int = Field(10, ge=1, le=100_000, description="paired timing rounds at least")
    processes: int | None = Field(None, ge=1, le=8, description="candidate processes timed interleaved in blocks "
                                  "of rounds, each with a correctness trial of its own; the CI spans every process's "
                                  "interval, so it covers between-process variation (1: one process, within-run "
                                  "CI only; default 3 cpu / 1 gpu; docs/protocol.md)")
    input_sets: int = Field(8, ge=2, le=64, description="kept in the record for its "
                            "compatibility; changes nothing: every trial and timed round draws fresh inputs")
    input_pool_bytes: int = Field(1 << 30, ge=1 << 20, description="kept in the record for "
                                  "its compatibility; changes nothing")
    timeout_s: float | None = Field(None, gt=0, le=7200, description="seconds allowed after the build: "
                                    "construction, checks and timing (default 180 cpu / 300 gpu)")
    build_timeout_s: float = Field(900.0, gt=0, le=7200, description="seconds allowed for start-up, imports "
                                   "and compiling inline extensions")
    remeasure_above: float | None = Field(3.0, gt=0, description="speedups above this are re-measured in "
                                          "fresh workers (None: never)")
    screen: bool = Field(True, description="static screen for forbidden constructs (off only to measure it)")
    runtime_guards: bool = Field(True, description="process-state guards in the worker (off only to measure "
                                 "their cost)")

    @classmethod
    def make(cls, base: "Protocol | dict | None" = None, **overrides) -> "Protocol":
        """`base` (a Protocol, a dict of fields, or the defaults) with `overrides` applied, None included
        (`remeasure_above=None`: never; `time_budget_s=None`: the device's default). Bad values and unknown
        names raise `ProtocolError` naming them."""
        fields = (base.model_dump() if isinstance(base, Protocol) else dict(base or {}))
        fields.update(overrides)
        try:
            return cls(**fields)
        except ValidationError as e:
            raise ProtocolError(_explain(e)) from None

    def with_(self, **changes) -> "Protocol":
        """A copy with `changes` (validated)."""
        return Protocol.make(self, **changes)

    def resolved(self, device: str) -> "Protocol":
        """Every None that has a device default filled in for `device` ('cpu', 'cuda', 'cuda:N', ...)."""
        kind = "cuda" if device.startswith("cuda") else "cpu"
        fill = {k: v for k, v in DEVICE_DEFAULTS[kind].items() if getattr(self, k) is None}
        return self.model_copy(update=fill) if fill else self

    def key(self) -> dict:
        """The JSON form that pins a measurement (bench.json, the baseline cache, a run database)."""
        return self.model_dump(mode="json")


def _explain(e: ValidationError) -> list[tuple[str, str]]:
    problems = []
    for err in e.errors():
        where = ".".join(str(x) for x in err.get("loc", ())) or "protocol"
        what = ("unknown option" if err.get("type") == "extra_forbidden"
                else f"{err.get('msg', 'invalid')} (got {err.get('input')!r})")
        problems.append((where, what))
    return problems


def describe_problems(problems: list[tuple[str, str]], name=lambda field: field) -> str:
    """One line for a ProtocolError's problems, each field shown as `name(field)`."""
    return "invalid protocol: " + "; ".join(f"{name(where)}: {what}" for where, what in problems)
