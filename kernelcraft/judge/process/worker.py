"""The judge process: inputs, clock, comparison and verdict for one evaluation — and no candidate code.

Started by the runner, it forks the reference side and the `forker` before it reads a job or touches CUDA (its life
across jobs is `jobs`; `Evaluation` is one job's sequence). Inputs are drawn by the judge with a seed no side sees,
written into each side's arena and re-verified after every call; output arenas are poisoned before every call.
While one side runs the other is frozen; the clock is the judge's, and a side's report is trusted only as bad news.
The judge's own device memory is kept small (`HOST_SHARE`, large outputs read in place).

Rationale: docs/design/judge-process.md#worker
"""
from __future__ import annotations

import faulthandler
import os
import sys

faulthandler.enable()

from kernelcraft.judge.speed import timing  # noqa: E402,F401  (binds clocks before anything else)

import random  # noqa: E402
import secrets  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

from kernelcraft.judge.process import audit, failures, freeze, isolation, side as side_mod  # noqa: E402,E501
from kernelcraft.judge.speed import rounds
from kernelcraft.judge.speed.gate import EXCLUSIVE, DeviceGate
from kernelcraft.judge.correctness import trials, weights
from kernelcraft.judge.tripwires import calls as tripwires
from kernelcraft.judge.process.arena import Arena, TensorSpec, total_bytes  # noqa: E402
from kernelcraft.judge.correctness.compare import is_oom  # noqa: E402
from kernelcraft.judge.reject import Reject  # noqa: E402
from kernelcraft.judge.process import jobs  # noqa: E402
from kernelcraft.judge.process.jobs import Channel, Warm  # noqa: E402,F401  (Channel: the result channel's class)
from kernelcraft.judge.process.procs import CHANNEL_FD_VAR  # noqa: E402
from kernelcraft.judge.process.sideproc import RUN, SideProc  # noqa: E402
from kernelcraft.protocol import Protocol  # noqa: E402

HOST_SHARE = 1 / 3  # inputs + outputs above this share of the GPU: the judge's copies in host memory (`_place_copies`)
HOST_SHARE_VAR = "KERNELCRAFT_JUDGE_HOST_SHARE"  # overrides it (tests force host copies on small tasks with 0)
PREPARE_STEPS = ("cuda", "kernel_tracer", "build_cache", "preload", "process_state")  # `side.cmd_prepare`'s parts
SHARE_IO = 1 / 16  # inputs + outputs above this share of the GPU: the job keeps the device to itself (`alone_on_device`)
LOCK_GRACE_S = 10.0  # a side holding a file lock steps aside once it lets go, or after this long (`step_aside_if_wanted`)


class Evaluation:
    def __init__(self, job: dict, chan: Channel, sides: dict[str, SideProc], hardening: dict,
                 warm: Warm | None = None):
        self.job, self.chan, self.sides = job, chan, sides
        self.ref, self.cand = sides["reference"], sides["candidate"]
        self.warm = warm
        self.ready: Warm | None = None  # set once the reference is known good: what a next job may reuse
        self.forker_pid: int | None = None
        self.spawn_candidate = None  # a fresh candidate side (set by `jobs`); None: one process (`processes` = 1)
        self.phase = "start"
        self.gate = DeviceGate(job.get("lock_path"))  # shared for device phases, exclusive for timing (`gate`)
        self.exclusive_phases = job.get("lock_scope") == "device"  # the device alone from construction to timing
        for s in sides.values():
            s.preempt = self.step_aside_if_wanted
        self.lock_grace_until: float | None = None  # a step aside put off while the running side holds a file lock
        self.stateful = False  # the reference's forward changes plain-attribute state (set by `describe`)
        self.large_outputs = False  # outputs above side.LARGE_OUTPUT_BYTES on a GPU (set by `_place_copies`)
        self.device = torch.device("cuda:0" if job["device"].startswith("cuda") else "cpu")
        self.p = Protocol.make(job["protocol"])  # validated: a job's rules are a value, never a loose dict
        self.guarded = self.p.runtime_guards
        self.rng = random.Random(secrets.randbits(64))  # round order, audit moments: never the job's seed
        self.build_s = 0.0
        self.result: dict = {"guards": [], "env": {
            "torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0],
            "gpu": None, "isolation": {**isolation.describe(), **hardening},
            "reference": "warm" if warm else "fresh"}}

    def enter(self, phase: str, **data) -> None:
        self.phase = phase
        self.chan.send("phase", phase=phase, build_s=self.build_s, **data)

    # -- the sequence ------------------------------------------------------------------------------------
    def run(self) -> dict:
        job, p = self.job, self.p
        if self.device.type == "cuda":
            self.enter("start")
            torch.cuda.set_device(self.device)
            torch.cuda.init()
            self.result["env"]["gpu"] = torch.cuda.get_device_name(0)
        self.enter("reference")
        common = dict(device=str(self.device), cache_dir=job["cache_dir"], arch=job.get("arch"))
        if self.warm is not None:  # the same task's reference, kept from an earlier job: as constructed again
            self.task = self.warm.task
            self.ref.request({"cmd": "reset"}, phase="reference")
        else:
            try:
                self.task = side_mod.import_file(job["task_path"], "kernelcraft_task")
            except Exception as e:
                raise Reject("runtime_error", ["task_error"], "the reference task failed to import: "
                             + failures.describe_exception(e)) from None
            self.ref.request(dict(cmd="import", path=job["task_path"], **common), phase="reference")
        self.enter("prepare")  # the candidate's side: CUDA, strict mode's kernel tracer, trusted imports; off the lock
        strict = p.mode == "strict"
        self.cand_import = dict(cmd="import", path=job["candidate_path"], strict=strict, guarded=self.guarded,
                                preload=job.get("preload", ()), **common)
        got = self.cand.request(dict(self.cand_import, cmd="prepare"), phase="prepare")
        self.result["env"]["prepare_s"] = {k: float(v) for k, v in (got.get("steps_s") or {}).items()
                                           if k in PREPARE_STEPS and isinstance(v, (int, float))}
        if not job.get("needs_build", True):
            self._take_device()  # a quick import's module-level code runs on the device; nvcc's, off it
        if self.device.type == "cuda":  # the idle probe's speed, before any candidate code could keep the GPU busy
            self.idle_clock = timing.RoundTripClock(self.device)  # (`in_place`)
        self.enter("import")
        got = self.cand.request(self.cand_import, phase="import")
        self.build_s = float(got.get("build_s", 0.0))
        self.result["build_cache"] = got.get("build_cache", {"builds": 0, "hits": 0})
        if got.get("kernel_tracer"):
            self.result["env"]["kernel_tracer"] = str(got["kernel_tracer"])[:200]
        if self.gate.mode is None:  # nvcc at import ran off the device
            self._take_device()
        self.enter("init")
        self._construct()
        known = {s.role: s.pid for s in (self.ref, self.cand)}
        if self.forker_pid:
            known["forker"] = self.forker_pid  # the judge's other child: not an orphan the candidate left
        inits = {self.cand.pid: self.cand.init_pid} if self.cand.init_pid else {}  # its PID namespace's pid 1
        self.audit = audit.Audit(os.getpid(), known, inits)
        self.enter("check")
        accepted = trials.run_trials(self)  # the correctness trials, and the rule they hand on (correctness/acceptance.py)
        if not job.get("remeasure"):
            weights.require_drop_in(self)  # a state_dict that cannot take the reference's fails before timing
        self._audit()
        if p.timing:
            self.enter("time")
            rounds.time_candidate(self, accepted)  # the timed rounds (judge/speed/rounds.py)
        self.enter("check")
        if not job.get("remeasure"):  # a re-measure keeps the first run's weights verdict (`evaluate.remeasure_protocol`)
            weights.check(self, accepted)  # the same new weights into both models, one more trial; after
        self._audit()            # timing (which times the weights as constructed), in the candidate's first process
        self.cand.request({"cmd": "audit"})
        self.result["guards"].append("audits")
        return self.result

    def _take_device(self) -> None:
        """The device for the job's device phases: shared with other evaluations' checks, or (`lock_scope="device"`)
        alone. Given back by `jobs.serve` (`hand_over_lock`), or at exit."""
        self.enter("wait_device")
        if self.exclusive_phases:
            self.gate.exclusive()
        else:
            self.gate.share()

    def wait_for_device(self, take) -> None:
        """`take` (a gate call that may block) as phase `wait_device`, on no clock; then back to the phase it
        interrupted."""
        phase = self.phase
        self.enter("wait_device")
        take()
        self.enter(phase)

    def step_aside_if_wanted(self, running: SideProc | None) -> None:
        """A timer waits for the device (`gate.wanted`): `running` (the side whose request is in flight, or None
        between requests) frozen, this judge's own device work finished, the device given back until the timer is
        done, then `running` thawed. Never while this evaluation holds the device alone. A side that holds a file lock
        (a compile cache's) runs on until it lets go, for at most `LOCK_GRACE_S`: frozen with it, it would stall the
        timer if the timer's own side waits for that lock (the timer has not taken the device yet, so no clock runs
        meanwhile)."""
        if not self.gate.wanted():
            self.lock_grace_until = None
            return
        if running is not None and freeze.holds_lock(running.tree()):
            now = time.monotonic()
            if self.lock_grace_until is None:
                self.lock_grace_until = now + LOCK_GRACE_S
            if now < self.lock_grace_until:
                return  # asked again at the next poll
        self.lock_grace_until = None
        if running is not None:
            running.freeze()
        if self.device.type == "cuda" and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        self.wait_for_device(self.gate.step_aside)
        if running is not None:
            running.thaw()

    def alone_on_device(self) -> None:
        """The rest of the job with the device to itself: a task too large to share it (`SHARE_IO`), or one whose
        large outputs are read in place once the device is idle (`in_place`). The idle probe is calibrated afresh
        once others' queued work has drained."""
        if self.gate.mode == EXCLUSIVE or self.gate.path is None:
            return
        self.wait_for_device(self.gate.exclusive)
        if self.device.type == "cuda":
            self.idle_clock = timing.RoundTripClock(self.device, floor_ms=rounds.idle_floor(self.gate))

    def fresh_state(self, sides, phase: str) -> None:
        """A stateful task (an RNN's hidden state): `sides` back to their constructed plain-attribute state, untimed,
        where they are not called in step — before every timed round (the reference runs every round, each candidate
        process only in its blocks), a sibling's own trial, the weights trial after timing. Nothing otherwise."""
        if self.stateful:
            for side in sides:
                side.request({"cmd": "restore"}, phase=phase)

    def hand_over_lock(self):
        """The end of this job: its device gate (or None), detached from this evaluation, for the caller to give
        back once the job's device memory is (`jobs.serve`); a warm judge lives on."""
        gate, self.gate = self.gate, DeviceGate(None)
        for s in self.sides.values():
            s.preempt = None
        return gate if gate.path else None

    def _construct(self) -> None:
        try:
            init = list(self.task.get_init_inputs())
        except Exception as e:
            raise Reject("runtime_error", ["task_error"], "the task's get_init_inputs() failed: "
                         + failures.describe_exception(e)) from None
        self.construct_msg = msg = dict(cmd="construct", init=init, seed=self.p.seed,
                                        module_mode=self.p.module_mode)
        warm = self.warm
        sides = (self.cand,) if warm else (self.ref, self.cand)  # a warm reference is constructed already
        replies = {s.role: s.request(msg, phase="init") for s in sides}
        self.ref_construct = replies["reference"] = warm.ref_construct if warm else replies["reference"]
        weights.record_mode(self, replies)
        if self.device.type == "cuda":  # the sides' construction finished before the judge's first draw
            torch.cuda.synchronize()
        torch.manual_seed(secrets.randbits(63))  # the judge's inputs: a seed no side can know
        if warm:
            self.in_specs, values = warm.in_specs, warm.values
        first = self._draw()
        if not warm:
            self.in_specs = [TensorSpec.of(t) if isinstance(t, torch.Tensor) else None for t in first]
            values = [None if isinstance(t, torch.Tensor) else t for t in first]
        self.values = values
        self.in_arenas = {"reference": warm.in_arena} if warm else {}
        for s in sides:
            a = Arena(self.in_specs, self.device)
            desc, fds = a.handle()
            self.in_arenas[s.role] = a
            s.request(dict(cmd="inputs", arena=desc, values=values), fds)
        self._write_inputs(first)
        if warm:
            self.out_kind, self.out_specs, self.stateful = warm.out_kind, warm.out_specs, warm.stateful
            self.tf32_convolutions = warm.tf32_convolutions
        else:
            d = self.ref.request({"cmd": "describe"}, phase="init")
            self.stateful = bool(d.get("stateful"))
            self.tf32_convolutions = d.get("tf32_convolutions") is True
            self.out_kind = d["kind"]
            self.out_specs = [TensorSpec(tuple(i["shape"]), _contiguous(i["shape"]), i["dtype"])
                              if "shape" in i else None for i in d["items"]]
        self.ref.ran = True  # later out-of-memory is the judge's or a neighbour's (`SideProc.check`)
        self.out_arenas = {"reference": warm.out_arena} if warm else {}
        for s in sides:
            a = Arena(self.out_specs, self.device)
            desc, fds = a.handle()
            self.out_arenas[s.role] = a
            s.request(dict(cmd="outputs", arena=desc, kind=self.out_kind), fds)
        self._place_copies()
        self.ready = Warm(self.task, self.in_specs, values, self.in_arenas["reference"], self.out_specs,
                          self.out_kind, self.out_arenas["reference"], self.ref_construct, self.stateful,
                          self.tf32_convolutions)
        self.result["guards"] += ["separate_processes", "secret_inputs", "inputs_verified", "outputs_poisoned"]
        reply = self.first_call(self.cand, "init")  # after `ready`: a candidate's crash keeps the judge warm
        self.first_out = self._output("candidate", list(reply.get("values", [])), copy=True) \
            if trials.keeps_answers(self) else None  # the first trial names a repeat of it `stale_output`

    def first_call(self, side: SideProc, phase: str) -> dict:
        """A candidate process's first forward, on the inputs in its arena, is not judged: the reference's never is
        (it is `describe`). On the CPU a freshly forked side's first element-wise `exp` or `tanh` came out at ~12-bit
        accuracy on one of its two intra-op threads (only that call: the same inputs again were exact), which failed
        honest written-out softmaxes as `precision_downgrade` in ~1 of 40 evaluations. A stateful task's candidate
        goes back to its constructed plain-attribute and RNG state after it, as the reference does after `describe`;
        any other keeps what its first call left (a lazily built cache, a captured graph), as it would for a user.
        Outputs are poisoned before every judged call, and the call tells the candidate nothing: the trials draw
        fresh inputs. A candidate that may autotune there (`candidate.autotunes`) has the device to itself for the
        call, as for timing: its kernels' picks are made on a quiet device (`candidate.first_call_hold`): from the
        start of the call (`call`: cuDNN's benchmark mode, which tunes out of sight), or from the first benchmark
        the trusted libraries run (`tuning`: inductor, Triton; the compile before it shares the device). Then the
        side shuts the compile-worker pools the call left (`Side.cmd_settle`). Returns the side's reply (its output
        is in the side's arena)."""
        hold = self.job.get("first_call_hold")  # None, "call" or "tuning"
        shared = self.gate.path is not None and self.gate.mode != EXCLUSIVE
        took: list[str] = []

        def take(how: str) -> None:  # only while sharing: a step aside returns to sharing before it ends
            self.wait_for_device(self.gate.exclusive)
            took.append(how)

        if hold == "call" and shared:
            take("alone")
        env = self.result["env"]
        if self.gate.path is not None and self.gate.mode == EXCLUSIVE and not took and not env.get("first_call"):
            env["first_call"] = "alone"  # the whole job holds the device alone (a timing sibling's: the first call's)
        msg = dict(RUN, keep_state=True) if self.stateful else dict(RUN)
        ask = None
        if hold == "tuning" and shared:
            msg["tuning"] = True
            ask = lambda: take("tuning")  # noqa: E731
        try:
            reply = side.request(msg, phase=phase, on_ask=ask)
            if self.device.type == "cuda":
                torch.cuda.synchronize()
        finally:
            if took:
                self.gate.share()  # a downgrade: back beside the other evaluations' checks
                env["first_call"] = took[0]
        side.request({"cmd": "settle"}, phase=phase)  # idle compile workers gone before the first trial: CPU work only
        return reply

    # -- inputs and outputs ------------------------------------------------------------------------------
    def _place_copies(self) -> None:
        """A task whose inputs and outputs take more than `HOST_SHARE` of the GPU: the judge's own copies of
        outputs (each trial's, the weights trial's) and the float64 truth go to host memory from the start, and
        comparisons stream them through the GPU in chunks (docs/design/judge-process.md#worker)."""
        self.large_outputs = self.device.type == "cuda" and total_bytes(self.out_specs) > side_mod.large_bytes()
        if self.device.type != "cuda" or getattr(self, "copy_device", None) is not None:
            return
        share = float(os.environ.get(HOST_SHARE_VAR) or HOST_SHARE)  # 0 forces it (the GPU tests do)
        io = total_bytes(list(self.in_specs) + list(self.out_specs))
        total = torch.cuda.get_device_properties(self.device).total_memory
        if self.large_outputs or io > SHARE_IO * total:
            self.alone_on_device()
        if io > share * total:
            self.copy_device = torch.device("cpu")

    def _draw(self) -> list:
        """A fresh draw from the task's get_inputs(), on the device, with the judge's secret RNG state."""
        try:
            with torch.device(self.device):
                inputs = self.task.get_inputs()
        except Exception as e:
            if is_oom(e):  # the judge's own memory (it holds both sides' arenas): never the task's or the candidate's
                raise Reject("runtime_error", ["harness_error"], "the judge ran out of device memory drawing the "
                             "task's inputs: " + failures.describe_exception(e)) from None
            raise Reject("runtime_error", ["task_error"], "the task's get_inputs() failed: "
                         + failures.describe_exception(e)) from None
        if not isinstance(inputs, (list, tuple)):
            raise Reject("runtime_error", ["task_error"], "the task's get_inputs() must return a list")
        out = [x.to(self.device) if isinstance(x, torch.Tensor) else x for x in inputs]
        specs = getattr(self, "in_specs", None)
        if specs is not None and [TensorSpec.of(t) if isinstance(t, torch.Tensor) else None for t in out] != specs:
            raise Reject("runtime_error", ["task_error"], "the task's get_inputs() returned different shapes, "
                         "strides or dtypes on another call")
        return out

    def redraw(self) -> None:
        """Fresh inputs into both arenas; the last draw is dropped first: a 16 GiB input does not fit twice beside
        four arenas on an 80 GB H100 (docs/design/judge-process.md#worker)."""
        self.current = None
        self._write_inputs(self._draw())

    def _write_inputs(self, inputs: list) -> None:
        self.current = inputs
        for a in self.in_arenas.values():
            for buf, x in zip(a.tensors, inputs):
                if buf is not None:
                    buf.copy_(x)
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def _inputs_intact(self, role: str) -> bool:
        return all(buf is None or tripwires.same_values(buf, x)
                   for buf, x in zip(self.in_arenas[role].tensors, self.current))

    def _check_mutation(self, when: str) -> None:
        """The candidate wrote to its inputs: flagged unless the reference wrote to its own too (an in-place
        reference makes mutation part of the task)."""
        if not self._inputs_intact("candidate") and self._inputs_intact("reference"):
            raise Reject("incorrect", ["input_mutation"], f"{when}: the candidate modified its inputs")

    def _poison(self) -> None:
        for a in self.out_arenas.values():
            a.base.fill_(255)  # all bits set: NaN in every float format, -1 in ints
        if self.device.type == "cuda":  # the fill runs in the judge's context: nothing orders it before a side's
            torch.cuda.synchronize()    # copy, so a late fill could overwrite an honest output with poison

    def _output(self, role: str, values: list, copy: bool):
        to = getattr(self, "copy_device", None)  # the CPU once a copy on the device ran out of memory
        items = [(t.clone() if to is None else t.to(to, copy=True)) if copy and t is not None else t if t is not None
                 else v for t, v in zip(self.out_arenas[role].tensors, values + [None] * len(self.out_specs))]
        return items[0] if self.out_kind == "tensor" else tuple(items)

    def in_place(self) -> bool:
        """A large output on the GPU is read in the candidate's arena, not copied (docs/design/judge-process.md#worker):
        once the device is idle (no work the candidate left running can write it), the frozen candidate cannot change it
        before the judge has compared. True when so (the device is then idle)."""
        if not self.large_outputs or getattr(self, "copy_device", None) is not None:
            return False
        try:
            self.idle_clock.settle()
        except timing.DeviceBusy as e:
            raise Reject("rejected", ["extra_stream"], f"correctness trial: {e} (work left running after a reply)") \
                from None
        return True

    def _trial_outputs(self, replies: dict) -> tuple:
        """Both sides' outputs: the candidate's as a private copy, the reference's in its arena
        (docs/design/judge-process.md#worker); an out-of-memory of the judge's own copies moves them, the
        reference's included (and every later one), to host memory instead of failing anyone. (ref, cand, moved)."""
        # the reference's output in its arena unless copies go to the host (docs/design/judge-process.md#worker)
        def both():
            moved = getattr(self, "copy_device", None) is not None
            return (self._output("reference", replies["reference"].get("values", []), copy=moved),
                    self._output("candidate", list(replies["candidate"].get("values", [])),
                                 copy=moved or not self.in_place()))

        try:
            return (*both(), False)
        except Exception as e:  # noqa: BLE001 - only the judge's OOM is retried
            if not is_oom(e) or getattr(self, "copy_device", None) is not None:
                raise
            torch.cuda.empty_cache()
            self.copy_device = torch.device("cpu")
            return (*both(), True)

    def audit_checked_call(self, side: SideProc, phase: str, compared: bool) -> None:
        """The candidate process `side`'s in-process tripwires (names for attempted cheats) after one of its checked
        calls, once its output is the judge's: right after the copy (`compared` False), or, for a large output read
        in place (`in_place`), only once it has been compared (`compared` True). Each call does it exactly once."""
        if self.guarded and compared == self.large_outputs:
            side.request({"cmd": "audit", "snapshot": True}, phase=phase)

    def _audit(self) -> None:
        found = self.audit.problems()
        if found:
            self.audit.kill_strays()
            code = "peer_tampering" if any("reference" in f for f in found) else "thread_injection"
            raise Reject("rejected", [code], "; ".join(found[:3]))


def _contiguous(shape) -> tuple[int, ...]:
    stride, acc = [], 1
    for s in reversed(list(shape)):
        stride.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(stride))


def main(chan_fd: int | None = None) -> None:
    """The judge process's entry (forked by the zygote, or `python -m kernelcraft.judge.process.worker`): see `jobs.serve`."""
    jobs.serve(chan_fd if chan_fd is not None else int(os.environ[CHANNEL_FD_VAR]), Evaluation)


if __name__ == "__main__":
    main()
