"""Weights and module mode are inputs: a candidate computes from its parameters and buffers as they are at call
time, in the train/eval mode the protocol names.

Where the reference has weights the judge moves, the candidate must be a drop-in (a strict `load_state_dict` of the
reference's state_dict) or it is `incorrect` / `weights_mismatch`; a trial with new weights in both models must
pass (`weights_ignored` otherwise), in every candidate process. The judge's own draw never charges the candidate
(a reference made non-finite: skipped). A candidate that flips its own module mode is `rejected` / `mode_changed`.

Rationale: docs/design/judge-correctness.md#weights
"""
from __future__ import annotations

import math

import torch

from kernelcraft.judge.process.arena import Arena, TensorSpec, attach
from kernelcraft.judge.correctness.acceptance import Acceptance
from kernelcraft.judge.correctness.compare import as_tensor_list, chunks, resolve_tolerance, with_retries
from kernelcraft.judge.reject import Reject

MAX_LISTED = 8  # mismatching keys in the record
MAX_NAMED = 4  # ... and in the message
_MOVE = (0.3, 0.5)  # k: each element scaled by e^(+-k), normalised to mean 1
_SHIFT = (0.15, 0.3)  # a uniform signed tensor (all zeros) also moved as a whole by +-this, times its scale
_ADD = 0.05  # elementwise noise, uniform with this standard deviation (bounded: +-0.087), times the scale
CLEAR_MARGIN = 10.0  # the new weights should move the reference's output by this many times the trial's tolerance


# -- the sides ----------------------------------------------------------------------------------------------------
def _mode_of(model: torch.nn.Module) -> str:
    modes = {m.training for m in model.modules()}
    return "train" if modes == {True} else "eval" if modes == {False} else "mixed"


def apply_mode(side, msg: dict) -> dict:
    """Right after construction, on both sides: note the mode construction left, set the protocol's."""
    side.module_mode = msg.get("module_mode") or "train"
    model = side.model
    if not isinstance(model, torch.nn.Module):
        side.mode_modules = []
        return {"init_mode": None}
    init = _mode_of(model)
    model.train(side.module_mode == "train")
    side.mode_modules = list(model.named_modules())
    if side.role == "candidate":
        verify_mode(side, "after the judge set the module mode with ModelNew.train()")
    return {"init_mode": init}


def verify_mode(side, when: str) -> None:
    """Candidate only: the modules it had when the mode was set are still in that mode."""
    want = getattr(side, "module_mode", "train") == "train"
    for name, m in getattr(side, "mode_modules", ()):
        if m.training != want:
            what = f"module '{name}'" if name else "ModelNew"
            raise Reject("rejected", ["mode_changed"],
                         f"{when}: {what} is in {'train' if m.training else 'eval'} mode, the protocol's module "
                         f"mode is {side.module_mode} (a candidate must not change its own .training)")


def _stat_keys(model: torch.nn.Module) -> set[str]:
    norm = torch.nn.modules.batchnorm._NormBase
    return {f"{name}.{b}" if name else b for name, m in model.named_modules() if isinstance(m, norm)
            for b in ("running_mean", "running_var")}


def state(side, msg: dict, fds) -> dict:
    """The model's state_dict() as the judge needs it: key, shape, dtype, kind (param | stat | buffer) and, for
    an entry sharing storage with an earlier one (tied weights), `same_as` (its index). A model whose state
    cannot be listed (not a Module, a non-tensor entry, a `state_dict` that raises) is reported, not raised: for
    the candidate that is a state the reference's cannot load into (`weights_mismatch`)."""
    model = side.model
    if not isinstance(model, torch.nn.Module):
        return {"type": "ok", "entries": None, "problem": f"{type(model).__name__} is not a torch.nn.Module"}
    try:
        params = {k for k, _ in model.named_parameters(remove_duplicate=False)}
        stats = _stat_keys(model)
        sd = model.state_dict()
        items = list(sd.items())
    except Exception as e:  # noqa: BLE001 - the judge records it
        return {"type": "ok", "entries": None, "problem": f"state_dict() raised {type(e).__name__}: {e}"[:300]}
    entries, seen = [], {}
    for k, v in items:
        if not isinstance(v, torch.Tensor):
            return {"type": "ok", "entries": None, "problem": f"state_dict entry '{k}' is not a tensor"}
        e = {"key": str(k), "shape": [int(s) for s in v.shape], "dtype": str(v.dtype).removeprefix("torch."),
             "kind": "param" if k in params else "stat" if k in stats else "buffer"}
        if v.numel():
            tie = (v.data_ptr(), tuple(v.shape), tuple(v.stride()), v.dtype)
            if tie in seen:
                e["same_as"] = seen[tie]
            else:
                seen[tie] = len(entries)
        entries.append(e)
    return {"type": "ok", "entries": entries}


def _sync(side) -> None:
    if side.device.type == "cuda":
        torch.cuda.synchronize()


def dump_state(side, msg: dict, fds) -> dict:
    """Reference only: copy the current state into the judge's arena (kept mapped for `load_state`)."""
    side.state_views = attach(msg["arena"], fds)
    sd = side.model.state_dict()
    for k, buf in zip(msg["keys"], side.state_views):
        if buf is not None:
            buf.copy_(sd[k])
    _sync(side)
    return {"type": "ok"}


def load_state(side, msg: dict, fds) -> dict:
    """load_state_dict(strict=True) from the judge's arena (a new one in the message, or the dumped one). A
    failure is reported, not raised: the side restores its previous state and the judge records it."""
    if "arena" in msg:
        side.state_views = attach(msg["arena"], fds)
    sd = dict(zip(msg["keys"], side.state_views))
    model = side.model
    before = {k: v.detach().clone() for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}
    try:
        model.load_state_dict(sd, strict=True)
    except Exception as e:  # noqa: BLE001 - the judge records it
        try:
            model.load_state_dict(before, strict=False)
        except Exception:  # noqa: BLE001
            pass
        _sync(side)
        return {"type": "ok", "loaded": False, "error": f"{type(e).__name__}: {e}"[:500]}
    _sync(side)
    return {"type": "ok", "loaded": True}


# -- the judge ------------------------------------------------------------------------------------------------------
def record_mode(ev, replies: dict[str, dict]) -> None:
    """The module mode in the judge's record, with what each side's construction left (before it was set)."""
    ev.result["module_mode"] = {"mode": ev.p.module_mode,
                                "reference_init": replies["reference"].get("init_mode"),
                                "candidate_init": replies["candidate"].get("init_mode")}
    ev.result["guards"].append("module_mode")


def _entries(reply: dict) -> list[dict] | None:
    got = reply.get("entries")
    if not isinstance(got, list):
        return None
    out = []
    for e in got:
        if not (isinstance(e, dict) and isinstance(e.get("key"), str) and isinstance(e.get("shape"), list)
                and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in e["shape"])):
            return None
        out.append(e)
    return out


def match(ref: list[dict], cand: list[dict] | None, problem: str = "") -> list[str]:
    """What keeps the candidate's state from taking the reference's (strict): missing, unexpected and reshaped
    keys."""
    if cand is None:
        return ["the candidate's state_dict could not be read" + (f" ({problem})" if problem else "")]
    want = {e["key"]: tuple(e["shape"]) for e in ref}
    have = {e["key"]: tuple(e["shape"]) for e in cand}
    out = [f"missing {k}" for k in want if k not in have]
    out += [f"unexpected {k}" for k in have if k not in want]
    out += [f"{k}: shape {list(have[k])}, the reference's {list(want[k])}" for k in want
            if k in have and have[k] != want[k]]
    return out


def moves(e: dict) -> bool:
    """Does the judge give this reference entry new values? A floating parameter or normalisation statistic with
    elements, not the second key of a tied one."""
    dtype = getattr(torch, str(e.get("dtype", "")), None)
    return (e.get("kind") in ("param", "stat") and isinstance(dtype, torch.dtype) and dtype.is_floating_point
            and math.prod(e["shape"]) > 0 and "same_as" not in e)


def _contiguous(shape) -> tuple[int, ...]:
    stride, acc = [], 1
    for s in reversed(list(shape)):
        stride.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(stride))


# -- new values -------------------------------------------------------------------------------------------------------
def _module(key: str) -> str:
    return key.rsplit(".", 1)[0] if "." in key else ""


def module_scales(values: list[torch.Tensor], entries: list[dict]) -> dict[str, float]:
    """Per module (a key's prefix), the RMS of its moving tensors that are not all zero: the scale at which one of
    its all-zero tensors is moved (PyTorch's default initialisation gives a Linear's or a convolution's bias its
    weight's RMS, a norm layer's bias its weight's 1)."""
    acc: dict[str, list[float]] = {}
    for t, e in zip(values, entries):
        if not moves(e):
            continue
        x = t.detach().double()
        x = x[torch.isfinite(x)]
        ss = float(x.square().sum())
        if ss > 0:
            a = acc.setdefault(_module(e["key"]), [0.0, 0])
            a[0] += ss
            a[1] += x.numel()
    return {m: math.sqrt(ss / n) for m, (ss, n) in acc.items()}


def _signed(like: torch.Tensor, bounds: tuple[float, float]) -> torch.Tensor:
    """Elementwise +-k, k uniform within `bounds` (random signs): a move bounded away from zero."""
    k = bounds[0] + (bounds[1] - bounds[0]) * torch.rand_like(like)
    return torch.where(torch.rand_like(like) < 0.5, k, -k)


def _perturb(t: torch.Tensor, hint: float) -> torch.Tensor:
    """New values for one tensor (docs/design/judge-correctness.md#weights): every element scaled by a factor
    e^(+-k) / E[cosh k] (mean 1, each at least ~20% from 1) plus bounded noise; a non-uniform tensor keeps its RMS,
    a uniform signed one (all zeros, a zero gate) also moves as a whole by +-k times its scale; a non-negative one
    stays non-negative."""
    x = t.double() if t.dtype == torch.float64 else t.float()
    finite = torch.isfinite(x)
    vals = x[finite]
    if not vals.numel():
        return t
    rms = float(vals.square().mean().sqrt())
    scale = rms or hint
    nonneg = rms > 0 and bool((vals >= 0).all())
    uniform = bool(vals.max() == vals.min())
    a, b = _MOVE
    mean_factor = (math.sinh(b) - math.sinh(a)) / (b - a)  # E[cosh k]: the factors average to 1
    noise = _ADD * math.sqrt(3) * (2 * torch.rand_like(x) - 1)  # uniform, standard deviation _ADD, bounded
    new = x * torch.exp(_signed(x, _MOVE)) / mean_factor + scale * noise
    if nonneg:
        new = new.abs()  # a variance stays a variance
    if rms > 0 and vals.numel() > 1:
        now = float(new[finite].square().mean().sqrt())
        new = new * (rms / now) if now > 0 else new  # the gain kept: deep networks neither blow up nor vanish
    if uniform and not nonneg:
        new = new + scale * float(_signed(torch.zeros(()), _SHIFT))  # off a constant guess (a zero bias, a zero gate)
    return torch.where(finite, new, x).to(t.dtype)


def perturbed(values: list[torch.Tensor], entries: list[dict]) -> tuple[list[torch.Tensor], int]:
    """New values for parameters and normalisation statistics (the judge's RNG;
    docs/design/judge-correctness.md#weights); other entries unchanged, a tied entry the value of the one it is
    tied to. (values, how many were given new values)."""
    hints = module_scales(values, entries)
    out, n = [], 0
    for i, (t, e) in enumerate(zip(values, entries)):
        j = e.get("same_as")
        if isinstance(j, int) and 0 <= j < i and out[j].shape == t.shape and out[j].dtype == t.dtype:
            out.append(out[j])
        elif moves(e) and t.is_floating_point() and t.numel():
            out.append(_perturb(t, hints.get(_module(e["key"]), 1.0)))
            n += 1
        else:
            out.append(t)
    return out, n


def excess(old, new, accepted: Acceptance, on: torch.device | None = None) -> float | None:
    """How far `new` is from `old` in units of the elementwise bound the trials accepted (`acceptance`: atol times
    `old`'s RMS, or max(1, RMS) under the fixed rule, plus rtol): the largest ratio over the finite elements of the
    floating outputs, None where none is floating. Above 1, a candidate that still returned `old` would fail the
    comparison by that factor."""
    worst = None
    for a, b, bound in zip(as_tensor_list(old) or [], as_tensor_list(new) or [], accepted.bounds):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.is_floating_point()
                and a.shape == b.shape and a.numel()):
            continue
        at, rt = resolve_tolerance(a.dtype, bound.atol, bound.rtol)
        rel = bound.relative()
        x = with_retries(lambda chunk, dev, a=a, b=b: _excess_one(a, b, at, rt, chunk, dev, rel), on or a.device)
        worst = x if worst is None else max(worst, x)
    return worst


def _excess_one(a: torch.Tensor, b: torch.Tensor, at: float, rt: float, chunk: int, dev: torch.device,
                relative=None) -> float:
    sq = torch.zeros((), dtype=torch.float64, device=dev)
    n = torch.zeros((), dtype=torch.int64, device=dev)
    for (x,) in chunks([a], chunk, dev):
        f = torch.isfinite(x)
        sq += torch.where(f, x, 0.0).square().sum()
        n += f.sum()
    rms = math.sqrt(float(sq) / int(n)) if int(n) else 0.0
    scale = max(1.0, rms) if relative is None else max(rms, relative.floor, 1e-30)
    worst = torch.zeros((), dtype=torch.float64, device=dev)
    for x, y in chunks([a, b], chunk, dev):
        both = torch.isfinite(x) & torch.isfinite(y)
        ratio = (y - x).abs_().div_((x.abs() * rt + at * scale).clamp_min_(1e-300))
        worst = torch.maximum(worst, torch.where(both, ratio, 0.0).max())
    return min(float(worst), 1e12)


# -- the check ----------------------------------------------------------------------------------------------------
def _record(ev) -> dict:
    rec = ev.result.get("weights")
    if rec is None:
        rec = ev.result["weights"] = {"checked": False, "matched": None, "tensors": 0, "perturbed": 0,
                                      "changed_output": None, "output_change": None, "processes": 0,
                                      "mismatch": [], "note": ""}
    return rec


def _reference_state(ev, rec: dict, phase: str) -> list[dict] | None:
    """The reference's state_dict entries (listed once per evaluation), or None, noted, where it has none."""
    if not hasattr(ev, "weight_entries"):
        got = ev.ref.request({"cmd": "state"}, phase=phase)
        ref = _entries(got)
        ev.weight_entries = ref or None
        if not ref:
            rec["note"] = got.get("problem") or ("the reference has no parameters or buffers" if ref == [] else
                                                 "the reference's state_dict could not be listed")
    if ev.weight_entries:
        rec["tensors"] = len(ev.weight_entries)
    return ev.weight_entries


_DROP_IN = ("a drop-in must load the reference's state_dict (ModelNew.load_state_dict(Model.state_dict(), "
            "strict=True)): the reference's parameter and buffer names and shapes, derived tensors kept out of it "
            "(plain attributes, or register_buffer(..., persistent=False))")


def _drop_in(ev, side, ref: list[dict], rec: dict, phase: str, who: str) -> bool:
    """True when `side`'s state_dict has the reference's keys and shapes. Else `weights_mismatch` where the
    reference has values to move; only recorded (`matched` False) where it has nothing but constant buffers."""
    got = side.request({"cmd": "state"}, phase=phase)
    mismatch = match(ref, _entries(got), str(got.get("problem") or ""))
    if not mismatch:
        return True
    rec.update(matched=False, mismatch=mismatch[:MAX_LISTED])
    if any(moves(e) for e in ref):
        named = ", ".join(mismatch[:MAX_NAMED]) + (f" (and {len(mismatch) - MAX_NAMED} more)"
                                                   if len(mismatch) > MAX_NAMED else "")
        raise Reject("incorrect", ["weights_mismatch"],
                     f"{who}ModelNew's state_dict cannot take the reference's: {named}; {_DROP_IN}")
    rec["note"] = (f"{len(mismatch)} difference(s) between the candidate's state_dict and the reference's, which "
                   "holds only constant buffers: not a drop-in for it, and no weights to check")
    return False


def require_drop_in(ev) -> None:
    """After the correctness trials, before timing, in the candidate's first process: its state_dict must take the
    reference's (`weights_mismatch` otherwise: a candidate that cannot load new weights is not timed)."""
    rec = _record(ev)
    ref = _reference_state(ev, rec, "check")
    if ref is not None:
        _drop_in(ev, ev.cand, ref, rec, "check", "")


def check(ev, accepted: Acceptance) -> None:
    """After timing, in the candidate's first process (`ev`: the judge's `worker.Evaluation`): the drop-in rule
    again, then the same new weights into both models and one more trial. Records `weights`; raises
    `weights_mismatch` or `weights_ignored`. The reference keeps the new weights (a warm one is reset)."""
    rec = _record(ev)
    ref = _reference_state(ev, rec, "check")
    if ref is None or not _drop_in(ev, ev.cand, ref, rec, "check", ""):
        return
    ev.fresh_state((ev.ref, ev.cand), "check")  # a stateful task: after timing the sides' states differ
    if _trial(ev, ev.cand, ref, rec, "check", "", accepted):
        ev.result["guards"].append("weights_as_inputs")


def check_process(ev, side, who: str, accepted: Acceptance) -> None:
    """Another candidate process (`siblings.start`), before it is timed: the same drop-in rule and trial as the
    first process's, then both models back on their construction weights (the reference is timed with every
    process, and the first process still has its own). Counted in `weights.processes`."""
    rec = _record(ev)
    ref = _reference_state(ev, rec, "time")
    if ref is None or not _drop_in(ev, side, ref, rec, "time", who):
        return
    ev.fresh_state((ev.ref, side), "time")
    trial: dict = {}  # the record is the first process's (after timing); a failure here is the verdict's
    try:
        if _trial(ev, side, ref, trial, "time", who, accepted, restore=True):
            rec["processes"] += 1
    except Reject:
        rec.update(trial)
        raise


def _trial(ev, side, ref: list[dict], rec: dict, phase: str, who: str, accepted: Acceptance,
           restore: bool = False) -> bool:
    """The trial with new weights for candidate process `side`; True when it ran and passed, False when the judge's
    own draw or the reference could not be used (noted; both models back on the old weights). Raises
    `weights_mismatch` (the candidate's load_state_dict failed) or `weights_ignored`."""
    keys = [e["key"] for e in ref]
    specs = [TensorSpec(tuple(e["shape"]), _contiguous(e["shape"]), str(e.get("dtype", "float32"))) for e in ref]
    arenas = {"reference": Arena(specs, ev.device), "candidate": Arena(specs, ev.device)}
    desc, fds = arenas["reference"].handle()
    ev.ref.request(dict(cmd="dump_state", arena=desc, keys=keys), fds, phase=phase)
    original = [t.clone() for t in arenas["reference"].tensors]
    new, rec["perturbed"] = perturbed(original, ref)

    # the reference's output with its own weights, on a fresh draw the candidate never runs on before the trial
    ev.redraw()
    ev._poison()
    r0 = ev._output("reference", ev.ref.request({"cmd": "run", "keep_state": True},  # not a paired call:
                                                phase=phase).get("values", []), copy=True)  # state kept
    failed, error = _load(ev, side, arenas, keys, new, phase)
    if failed == "candidate":
        rec["matched"] = False
        raise Reject("incorrect", ["weights_mismatch"], f"{who}ModelNew.load_state_dict(the reference's state_dict, "
                     f"strict=True) failed: {error[:300]}; {_DROP_IN}")
    if failed == "reference":  # its side kept the old weights; the candidate goes back to them too
        _restore(ev, side, arenas, keys, original, phase, who, reference=False)
        rec["note"] = "the reference's load_state_dict failed: " + error[:300]
        return False
    rec["matched"] = True
    ev._write_inputs(ev.current)  # the same draw again: a reference that works in place changed its copy
    ev._poison()
    order = [ev.ref, side] if ev.rng.random() < 0.5 else [side, ev.ref]
    replies = {}
    for s in order:
        replies[s.role] = s.request({"cmd": "run"}, phase=phase)  # (`sideproc.RUN`)
        if ev.device.type == "cuda":
            torch.cuda.synchronize()
    copy = not ev.in_place()  # a large output is read in its arena once the device is idle (judge/process/worker.py)
    r1 = ev._output("reference", replies["reference"].get("values", []), copy=copy)
    c1 = ev._output("candidate", list(replies["candidate"].get("values", [])), copy=copy)
    ev._check_mutation(f"{who}the weights trial")
    p = ev.p
    if _newly_nonfinite(r0, r1):
        rec["note"] = "the new weights made the reference's output non-finite; the old weights were restored"
        _restore(ev, side, arenas, keys, original, phase, who)
        return False
    rec["checked"] = True
    # the rule the trials accepted (`acceptance`: calibrated outputs relative to their scale, widened to the
    # reference's own error, e.g. cuDNN's TF32 convolutions), never the bare fixed bound, which on an H100 reads an
    # honest channels-last conv as `weights_ignored` (1.9e-4 > 1e-4 after new weights)
    rec["changed_output"] = not accepted.compare(r0, r1, on=ev.device).ok
    moved = excess(r0, r1, accepted, on=ev.device)
    rec["output_change"] = None if moved is None else float(f"{moved:.3g}")
    if not rec["changed_output"]:
        rec["note"] = ("the new weights did not change the reference's output beyond the trial's tolerance: this "
                       "trial cannot tell a candidate that ignores its weights")
    elif moved is not None and moved < CLEAR_MARGIN:
        rec["note"] = (f"the new weights moved the reference's output by only {moved:.3g}x the trial's tolerance "
                       f"(a clear margin is {CLEAR_MARGIN:g}x): a candidate that ignores its weights fails by no more")
    cmp = accepted.compare(r1, c1, on=ev.device)
    if not cmp.ok:
        if not rec["changed_output"]:  # the new weights changed nothing: this is a plain wrong answer
            raise Reject("incorrect", cmp.reasons, f"{who}trial {p.trials + 1} (after new weights): {cmp.message}")
        follows_old = accepted.compare(r0, c1, on=ev.device).ok
        why = ("its outputs are those of the weights it was constructed with (a copy taken at construction?)"
               if follows_old else "its outputs were right only for the weights it was constructed with")
        raise Reject("incorrect", ["weights_ignored"], f"{who}after both models loaded the same new weights "
                     f"(load_state_dict), {why}: {cmp.message}")
    if restore:
        _restore(ev, side, arenas, keys, original, phase, who)
    return True


def _newly_nonfinite(old, new) -> bool:
    pairs = [(old, new)] if isinstance(old, torch.Tensor) else list(zip(old, new))
    return any(isinstance(a, torch.Tensor) and a.is_floating_point() and a.shape == b.shape
               and bool((torch.isfinite(a) & ~torch.isfinite(b)).any()) for a, b in pairs)


def _load(ev, side, arenas: dict[str, Arena], keys: list[str], values: list[torch.Tensor], phase: str,
          reference: bool = True) -> tuple[str, str]:
    """Both models (the candidate's process `side` only, without `reference`) load `values`, the candidate first:
    ("", "") or the side that could not and its error (a side that fails keeps its previous weights)."""
    for role in ("candidate", "reference"):
        for buf, v in zip(arenas[role].tensors, values):
            buf.copy_(v)
    if ev.device.type == "cuda":
        torch.cuda.synchronize()
    desc, fds = arenas["candidate"].handle()
    got = side.request(dict(cmd="load_state", arena=desc, keys=keys), fds, phase=phase)
    if not got.get("loaded"):
        return "candidate", str(got.get("error", ""))
    if not reference:
        return "", ""
    got = ev.ref.request(dict(cmd="load_state", keys=keys), phase=phase)
    if not got.get("loaded"):
        return "reference", str(got.get("error", ""))
    return "", ""


def _restore(ev, side, arenas, keys, original, phase: str, who: str, reference: bool = True) -> None:
    """Both models (or the candidate's only) back on the weights they were constructed with; a candidate that
    cannot load them fails."""
    failed, error = _load(ev, side, arenas, keys, original, phase, reference)
    if failed == "candidate":
        raise Reject("incorrect", ["weights_mismatch"], f"{who}ModelNew.load_state_dict of the weights it was "
                     f"built with failed after it had loaded others: {error[:300]}; {_DROP_IN}")
    if failed == "reference":
        raise Reject("runtime_error", ["task_error"], "the reference's load_state_dict of its own construction "
                     f"weights failed: {error[:300]}")
