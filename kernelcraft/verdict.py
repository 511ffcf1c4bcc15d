"""The verdict record: what one evaluation concluded, in the shape docs/contract.md promises.

Invariants: contract fields are never renamed (extra detail goes in new optional fields); `speedup` is None for
every status but `correct` (the model's validator enforces it); the resolved protocol travels in the verdict.
Reason codes are listed once, in `REASONS`.

Rationale: docs/design/core.md#verdict
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

from kernelcraft.protocol import Protocol

Status = Literal["correct", "incorrect", "compile_error", "runtime_error", "timeout", "rejected"]

UNVERIFIABLE = "unverifiable_reference"  # the second reason of a fixed-rule failure the reference could not judge

# Reason codes: the contract's, plus a few more specific ones (marked *).
REASONS = {
    "parse_error": "the candidate is not valid Python",
    "no_modelnew": "the candidate defines no ModelNew",
    "signature_mismatch": "ModelNew's constructor or forward does not take the reference's arguments",
    "build_failed": "an inline extension failed to compile",
    "exception": "the candidate raised a Python exception",
    "out_of_memory": "* the candidate ran out of device memory",
    "cuda_error": "* a CUDA error (illegal address, launch failure, ...) in the candidate",
    "crashed": "the worker process died (segfault, abort, os._exit) before reporting",
    "timeout": "the evaluation ran past its time limit and was killed",
    "shape_mismatch": "an output has the wrong shape, or a different number of outputs",
    "dtype_mismatch": "an output has the wrong dtype",
    "device_mismatch": "* an output is on the wrong device",
    "value_mismatch": "outputs differ beyond tolerance",
    "precision_downgrade": "* within the fixed tolerance, but less accurate against a float64 evaluation of the "
                           "reference than precision_factor x the reference's own error (fp16/bf16/TF32 work the "
                           "reference does not do)",
    UNVERIFIABLE: "* with value_mismatch: the reference differs from its own float64 evaluation too much to "
                  "calibrate a precision rule (it draws random numbers, or is ill-conditioned in fp32), so the "
                  "fixed tolerance judged; an honest rewrite may fail here",
    "nan_or_inf": "NaN or Inf where the reference has none",
    "non_tensor_output": "an output is not a plain torch.Tensor",
    "lazy_output": "an output is a tensor subclass or has no real storage",
    "input_mutation": "the candidate wrote to its inputs",
    "stale_output": "an output did not follow new inputs (cached or reused answer)",
    "extra_stream": "device work outlived forward (unjoined side stream)",
    "thread_injection": "the candidate left threads or processes running",
    "timer_tampering": "the candidate patched clocks or timing functions",
    "global_state_tampering": "the candidate changed process-wide torch or Python state",
    "reference_call": "the candidate calls the reference Model",
    "no_custom_kernel": "strict mode: no kernel of the candidate's own ran",
    "peer_tampering": "* the candidate reached another process of the judge (re-scheduled the reference, ...)",
    "forbidden_construct": "the candidate uses a construct the harness forbids",
    "suspicious_speedup": "the speedup did not reproduce in a fresh worker",
    "harness_error": "* kernelcraft itself failed (a bug: please report it)",
    "task_error": "* the reference task itself failed (import, get_inputs or forward)",
    "weights_ignored": "* outputs did not follow weights loaded with load_state_dict (weights copied or assumed "
                       "at construction)",
    "weights_mismatch": "* the candidate's state_dict cannot take the reference's (keys or shapes differ, or its "
                        "load_state_dict failed) where the reference has weights: not a drop-in, and its outputs "
                        "cannot be checked with other weights",
    "mode_changed": "* the candidate changed its own train/eval mode (the protocol's module_mode)",
    "no_candidate": "* bench: the task has no candidate (none given, or a strict-mode optimize run found none verified "
                    "faster and no fallback strict mode accepts)",
    "input_error": "* bench: an input row or file could not be used (bad JSON, no ref_code, not a KernelBench task)",
}


class Correctness(BaseModel):
    trials: int = 0
    passed: int = 0
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    atol: float | None = None
    rtol: float | None = None
    rule: str | None = Field(None, description="what judged the values: 'calibrated' (against a float64 evaluation "
                             "of the reference, judge/correctness/precision.py), 'fixed' (atol/rtol) or 'exact' (integer/bool)")
    rule_note: str | None = Field(None, description="why an output fell back to the fixed rule, if one did")
    precision_factor: float | None = None
    err_ratio: float | None = Field(None, description="calibrated: share of the allowed error the candidate used "
                                    "(worst output; <= 1 passes)")
    ref_err: float | None = Field(None, description="calibrated: the reference's RMS error vs float64, relative to "
                                  "the output's RMS")
    cand_err: float | None = Field(None, description="calibrated: the candidate's RMS error vs float64, relative")
    ref_max_err: float | None = None
    cand_max_err: float | None = None
    envelope_err: float | None = Field(None, description="calibrated, GPU: the reference's RMS error vs float64 with "
                                       "its convolutions in TF32 (cuDNN's default), relative; the bound uses it where "
                                       "it exceeds ref_err (judge/correctness/fp64.py)")
    bf16_envelope_err: float | None = Field(None, description="calibrated, GPU, where envelope_err exceeds 0.25%: "
                                            "the same with bf16 convolutions; the RMS bound stays 2/3 of the way "
                                            "(log scale) from the TF32 envelope to it (judge/correctness/bounds.py)")
    partial_trials: int | None = Field(None, description="trials on the previous inputs with a few elements changed "
                                       "(same addresses) that passed")
    partial_skipped: int | None = Field(None, description="partial trials skipped: the reference failed on the "
                                        "mixed inputs")


class Timing(BaseModel):
    ref_ms: float
    cand_ms: float
    speedup: float
    ci95: tuple[float, float]
    samples: int
    method: str
    ref_spread_ms: tuple[float, float] | None = Field(None, description="25th and 75th percentile")
    cand_spread_ms: tuple[float, float] | None = None
    converged: bool = False
    host_ref_ms: float | None = None
    host_cand_ms: float | None = None
    spot_checks: int = 0
    overhead_ms: float | None = Field(None, description="median round trip of an empty request answered by the "
                                      "reference's process (judge clock), subtracted from the reference's samples, "
                                      "and from the candidate's unless its own (cand_overhead_ms) is smaller")
    hidden_work_ms: float | None = Field(None, description="GPU: median device time the candidate left running "
                                         "after answering, less the reference's (billed to the candidate)")
    clock: str | None = Field(None, description="whose clock took the samples: 'judge' (a process that runs no "
                                                "candidate code)")
    audits: int | None = Field(None, description="isolation audits run during timing (random moments and the end)")
    busy_probes: int | None = Field(None, description="GPU: idle probes after a call that found the device still "
                                    "busy (work a side left behind, or another process's)")
    probe_idle_ms: float | None = Field(None, description="GPU: latency of the judge's idle probe on an idle device")
    idle_wait_ms: float | None = Field(None, description="GPU: how long the clock waited, before it calibrated, for work "
                                       "other evaluations sharing the device had left queued")
    processes: int | None = Field(None, description="candidate processes timed interleaved in blocks of rounds (protocol.processes)")
    process_speedups: list[float] | None = Field(None, description="each candidate process's median speedup: the "
                                                 "between-process spread the CI covers")
    within_ci95: tuple[float, float] | None = Field(None, description="this run's own CI (all rounds pooled), "
                                                    "before it was widened to span every process's interval and "
                                                    "the between-run deviation (ci95 is where a re-run's estimate "
                                                    "falls 95% of the time)")
    between_run_sd: float | None = Field(None, description="the calibrated between-run standard deviation of the "
                                         "log speedup at these times and the sides' spreads over their rounds "
                                         "(judge/speed/reproduce.py BETWEEN_RUN)")
    cand_overhead_ms: float | None = Field(None, description="median round trip of an empty request answered by "
                                           "the candidate's process: subtracted from its samples where smaller "
                                           "than overhead_ms (never where larger: a candidate cannot inflate it), "
                                           "and evidence of the processes' footing")
    untimed_cpu_ms: dict[str, float] | None = Field(None, description="CPU time each side's process tree used in "
                                                    "its requests outside the clock during timing (the null round "
                                                    "trip, a stateful task's restore), read from the kernel by the "
                                                    "judge (judge/speed/treecpu.py)")
    untimed_windows: dict[str, int] | None = Field(None, description="how many such requests each side answered")
    billed_ms: float | None = Field(None, description="ms added to every candidate sample: its untimed CPU time "
                                    "beyond the reference's (and a small allowance), spread over the timed rounds")
    untimed_cpu_top: dict[str, float] | None = Field(None, description="the candidate's processes that used the most "
                                                     "untimed CPU time, by name (`comm`; its own process marked "
                                                     "'(side)'), in ms: what billed_ms was billed for")
    host_busy_cores: float | None = Field(None, description="the host's busy CPU cores on average over the timed "
                                          "rounds (/proc/stat: every process, the timed sides included): other work "
                                          "on the host slows a side whose calls are launch-bound")
    note: str | None = Field(None, description="'host too noisy: ...' when the CI cannot resolve the speedup "
                             "(judge/speed/timing.py noise_note), or candidate processes that disagree; the CLI warns")


class Weights(BaseModel):
    """The weights check (judge/correctness/weights.py): both models loaded the same new weights, one more trial."""
    checked: bool = Field(False, description="the trial with new weights ran")
    matched: bool | None = Field(None, description="the candidate's state_dict keys and shapes are the reference's "
                                 "and it loaded them (False: not a drop-in for the reference's weights; never "
                                 "`correct` where the reference has parameters or normalisation statistics)")
    tensors: int = Field(0, description="entries in the reference's state_dict")
    perturbed: int = Field(0, description="entries given new values (parameters, normalisation statistics)")
    changed_output: bool | None = Field(None, description="the new weights changed the reference's output")
    output_change: float | None = Field(None, description="how far the new weights moved the reference's output, "
                                        "in units of the trial's tolerance (largest element): a candidate that "
                                        "ignores its weights fails by this factor; below 10 the note says so")
    processes: int = Field(0, description="candidate processes beyond the first (timing's, protocol.processes) "
                           "that passed the same trial with new weights before they were timed")
    mismatch: list[str] = Field(default_factory=list, description="keys that kept the states from matching")
    note: str = ""


class ModuleMode(BaseModel):
    """The module mode both models were checked and timed in, and the mode each one's construction left."""
    mode: str
    reference_init: str | None = None
    candidate_init: str | None = None


class Env(BaseModel):
    kernelcraft: str
    torch: str
    cuda: str | None = None
    gpu: str | None = None
    python: str | None = None
    kernel_tracer: str | None = None  # strict mode on a GPU: how kernels were seen ("cupti" or the fallback)
    worker_start: str | None = None  # "fork" (from the zygote) or "spawn"
    prepare_s: dict[str, float] | None = None  # the candidate process's `prepare` phase by part (as that process saw it)
    isolation: dict | None = None  # how the candidate's process was fenced off (judge.process.isolation.describe)
    reference: str | None = None  # "fresh" (imported and constructed for this candidate) or "warm" (judge.caller.warm)
    first_call: str | None = None  # "alone": the candidate's first call had the device to itself (cuDNN's benchmark
    # mode, or the whole job held the device alone); "tuning": from its first benchmark to its end (inductor, Triton)


class Verdict(BaseModel):
    task: str
    candidate_sha256: str
    device: str
    status: Status
    reasons: list[str] = Field(default_factory=list)
    message: str = ""
    correctness: Correctness | None = None
    timing: Timing | None = None
    speedup: float | None = None
    build_s: float = 0.0
    wall_s: float = 0.0
    env: Env | None = None
    mode: Literal["open", "strict"] = "open"
    guards: list[str] = Field(default_factory=list, description="runtime guards that ran")
    phases_s: dict[str, float] = Field(default_factory=dict, description="seconds per worker phase (spawn = "
                                       "fork or interpreter start and the two sides' forks, and on a GPU start = the "
                                       "judge's CUDA context; reference, prepare (the candidate's side: its CUDA "
                                       "context, strict mode's kernel tracer, trusted libraries it imports), "
                                       "import (the candidate's module and its builds), "
                                       "wait_device, init, check, time); empty without a worker")
    protocol: Protocol | None = Field(None, description="the resolved protocol this verdict was reached under "
                                      "(kernelcraft.protocol); None only for records made without judging")
    weights: Weights | None = Field(None, description="weights as inputs: the trial after both models loaded the "
                                    "same new weights (None: not reached)")
    module_mode: ModuleMode | None = Field(None, description="train/eval mode of both models (None: not reached)")

    @model_validator(mode="after")
    def _speedup_only_when_correct(self):
        if self.status != "correct":
            self.speedup = None
        elif self.speedup is None and self.timing is not None:
            self.speedup = self.timing.speedup
        return self

    @property
    def ok(self) -> bool:
        return self.status == "correct"

    def to_json(self) -> dict:
        return self.model_dump(mode="json")
