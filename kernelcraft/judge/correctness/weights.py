"""Weights and module mode are inputs: a candidate computes from its parameters and buffers as they are at call
time, in the train/eval mode the protocol names.

Design decisions
- The judge checks this itself, after the correctness trials (`check`): the reference's side lists its
  `state_dict()` (keys, shapes, dtypes, and which entries are parameters or normalisation statistics), the
  candidate's side lists its own, and when keys and shapes match the judge draws new values with its secret
  RNG (seeded from `secrets`, like its inputs) and sends them as bytes through one arena per side; both sides
  `load_state_dict` them (strict), and one more trial compares the outputs. A candidate that copied its
  weights at construction, or assumed their initial values (an elementwise LayerNorm weight replaced by a
  per-channel one, right only while weight = 1 and bias = 0), fails that trial: `weights_ignored`. The
  reference's output on the same inputs with its old weights is computed first, so the message says which
  weights the candidate followed and the record says whether the new weights changed the reference's output
  at all (`changed_output`: a check without teeth is visible).
- Keys and shapes that do not match are a field of the verdict (`weights.matched = False`), not a rejection:
  a restructured module can be an honest rewrite, it is just not a drop-in for a user's trained
  `state_dict()`. `optimize` never writes such a candidate to best.py (`drop_in`). A candidate whose own
  `load_state_dict` fails is recorded the same way; its side restores its previous state.
- What is perturbed: every floating parameter, and the running statistics of normalisation layers
  (BatchNorm/InstanceNorm; the statistics a user's trained model carries). Other buffers (causal masks,
  index tables, constants) keep the reference's values: they are loaded too, but a candidate may compute
  the same constant instead of reading it (SDPA's `is_causal` for a `tril` buffer), and a perturbed mask is
  no longer a mask. Values are scaled by exp(0.2·N(0,1)) plus 0.1·rms·N(0,1) noise, elementwise: every
  element moves (an all-ones LayerNorm weight stops being uniform), signs of non-negative tensors are kept
  (variances stay variances), magnitudes stay near the trained ones (deep nets do not blow up), non-finite
  elements stay as they are. Parameters tied in the reference (one storage under two keys) get one value.
  If the new weights make the reference's output non-finite where it was finite, the check is skipped
  (noted) and the old weights are restored on both sides: the judge's own draw must never charge the
  candidate.
- Module mode (`Protocol.module_mode`, KernelBench's default `train`): both sides apply it right after
  construction with `model.train(mode)`, as a user would, so a candidate's `self.eval()` in `__init__` is
  overridden (and recorded: `module_mode.candidate_init`). The candidate's side then verifies, after the
  judge set it and after every checked call and audit, that the modules it had are still in that mode: a
  candidate that flips its own `.training` (an `eval()` in forward to skip dropout or batch statistics, a
  `train()` override that ignores its argument) is `rejected` / `mode_changed`. Modules it creates later are
  not its construction's and are not held to the mode (lazily built helpers would be false alarms).
- Side-side functions (`state`, `dump_state`, `load_state`, `apply_mode`, `verify_mode`) run in the side
  processes and are called by `side.Side`'s commands; `check` and `record_mode` run in the judge.
"""
from __future__ import annotations

import torch

from kernelcraft.judge.process.arena import Arena, TensorSpec, attach
from kernelcraft.judge.reject import Reject

MAX_LISTED = 8  # mismatching keys named in the record
_SCALE_SIGMA = 0.2  # multiplicative noise: exp(0.2 N(0,1))
_ADD_SIGMA = 0.1  # additive noise, times the tensor's RMS (1 for an all-zero tensor)


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
    an entry sharing storage with an earlier one (tied weights), `same_as` (its index)."""
    model = side.model
    if not isinstance(model, torch.nn.Module):
        return {"type": "ok", "entries": None, "problem": f"{type(model).__name__} is not a torch.nn.Module"}
    params = {k for k, _ in model.named_parameters(remove_duplicate=False)}
    stats = _stat_keys(model)
    entries, seen = [], {}
    for k, v in model.state_dict().items():
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
    ev.result["module_mode"] = {"mode": ev.p.get("module_mode", "train"),
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


def match(ref: list[dict], cand: list[dict] | None) -> list[str]:
    """What keeps the candidate's state from taking the reference's: missing, unexpected and reshaped keys."""
    if cand is None:
        return ["the candidate's state_dict could not be read"]
    want = {e["key"]: tuple(e["shape"]) for e in ref}
    have = {e["key"]: tuple(e["shape"]) for e in cand}
    out = [f"missing {k}" for k in want if k not in have]
    out += [f"unexpected {k}" for k in have if k not in want]
    out += [f"{k}: shape {list(have[k])}, the reference's {list(want[k])}" for k in want
            if k in have and have[k] != want[k]]
    return out


def _contiguous(shape) -> tuple[int, ...]:
    stride, acc = [], 1
    for s in reversed(list(shape)):
        stride.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(stride))


def _perturb(t: torch.Tensor) -> torch.Tensor:
    x = t.double() if t.dtype == torch.float64 else t.float()
    finite = torch.isfinite(x)
    vals = x[finite]
    rms = float(vals.square().mean().sqrt()) if vals.numel() else 0.0
    new = x * torch.exp(_SCALE_SIGMA * torch.randn_like(x)) + _ADD_SIGMA * (rms or 1.0) * torch.randn_like(x)
    if rms > 0 and bool((vals >= 0).all()):
        new = new.abs()
    return torch.where(finite, new, x).to(t.dtype)


def perturbed(values: list[torch.Tensor], entries: list[dict]) -> tuple[list[torch.Tensor], int]:
    """New values for parameters and normalisation statistics (the judge's RNG); other entries unchanged."""
    out, n = [], 0
    for i, (t, e) in enumerate(zip(values, entries)):
        j = e.get("same_as")
        if isinstance(j, int) and 0 <= j < i and out[j].shape == t.shape and out[j].dtype == t.dtype:
            out.append(out[j])
        elif e.get("kind") in ("param", "stat") and t.is_floating_point() and t.numel():
            out.append(_perturb(t))
            n += 1
        else:
            out.append(t)
    return out, n


def _newly_nonfinite(old, new) -> bool:
    pairs = [(old, new)] if isinstance(old, torch.Tensor) else list(zip(old, new))
    return any(isinstance(a, torch.Tensor) and a.is_floating_point() and a.shape == b.shape
               and bool((torch.isfinite(a) & ~torch.isfinite(b)).any()) for a, b in pairs)


def check(ev, accepted) -> None:
    """After the correctness trials (`ev`: the judge's `worker.Evaluation`): the same new weights into both
    models, one more trial. Records `weights` in the result; raises `weights_ignored` when the candidate's
    outputs do not follow them."""
    rec = {"checked": False, "matched": None, "tensors": 0, "perturbed": 0, "changed_output": None,
           "mismatch": [], "note": ""}
    ev.result["weights"] = rec
    got = ev.ref.request({"cmd": "state"}, phase="check")
    ref = _entries(got)
    if not ref:
        rec["note"] = got.get("problem") or ("the reference has no parameters or buffers" if ref == [] else
                                             "the reference's state_dict could not be listed")
        return
    rec["tensors"] = len(ref)
    mismatch = match(ref, _entries(ev.cand.request({"cmd": "state"}, phase="check")))
    if mismatch:
        rec.update(matched=False, mismatch=mismatch[:MAX_LISTED],
                   note=f"{len(mismatch)} difference(s) between the candidate's state_dict and the reference's: "
                        "not a drop-in for the reference's weights, so the weights were not checked")
        return
    ev.fresh_state((ev.ref, ev.cand), "check")  # a stateful task: after timing the sides' states differ
    keys = [e["key"] for e in ref]
    specs = [TensorSpec(tuple(e["shape"]), _contiguous(e["shape"]), str(e.get("dtype", "float32"))) for e in ref]
    arenas = {s.role: Arena(specs, ev.device) for s in (ev.ref, ev.cand)}
    desc, fds = arenas["reference"].handle()
    ev.ref.request(dict(cmd="dump_state", arena=desc, keys=keys), fds, phase="check")
    original = [t.clone() for t in arenas["reference"].tensors]
    new, rec["perturbed"] = perturbed(original, ref)

    # the reference's output with its own weights, on a fresh draw the candidate never runs on before the trial
    ev.redraw()
    ev._poison()
    r0 = ev._output("reference", ev.ref.request(dict(cmd="run", keep_state=True),  # not a paired call:
                                                phase="check").get("values", []), copy=True)  # state kept
    loaded = _load(ev, arenas, keys, new, rec)
    if loaded == "reference":
        _load(ev, arenas, keys, original, {})  # both back on the old weights
    if loaded != "ok":
        return
    rec["matched"] = True
    ev._write_inputs(ev.current)  # the same draw again: a reference that works in place changed its copy
    ev._poison()
    order = [ev.ref, ev.cand] if ev.rng.random() < 0.5 else [ev.cand, ev.ref]
    replies = {}
    for s in order:
        replies[s.role] = s.request({"cmd": "run"}, phase="check")
        if ev.device.type == "cuda":
            torch.cuda.synchronize()
    copy = not ev.in_place()  # a large output is read in its arena once the device is idle (judge/process/worker.py)
    r1 = ev._output("reference", replies["reference"].get("values", []), copy=copy)
    c1 = ev._output("candidate", list(replies["candidate"].get("values", [])), copy=copy)
    ev._check_mutation("the weights trial")
    p = ev.p
    if _newly_nonfinite(r0, r1):
        rec["note"] = "the new weights made the reference's output non-finite; the old weights were restored"
        _load(ev, arenas, keys, original, {})
        return
    rec["checked"] = True
    # the rule the trials accepted (`acceptance`: calibrated outputs relative to their scale, widened to the
    # reference's own error, e.g. cuDNN's TF32 convolutions), never the bare fixed bound: on the H100 an honest
    # channels-last conv was a false `weights_ignored` at 1.9e-4 > 1e-4 after new weights
    rec["changed_output"] = not accepted.compare(r0, r1, on=ev.device).ok
    ev.result["guards"].append("weights_as_inputs")
    cmp = accepted.compare(r1, c1, on=ev.device)
    if cmp.ok:
        return
    if not rec["changed_output"]:  # the new weights changed nothing: this is a plain wrong answer
        raise Reject("incorrect", cmp.reasons, f"trial {p['trials'] + 1} (after new weights): {cmp.message}")
    follows_old = accepted.compare(r0, c1, on=ev.device).ok
    why = ("its outputs are those of the weights it was constructed with (a copy taken at construction?)"
           if follows_old else "its outputs were right only for the weights it was constructed with")
    raise Reject("incorrect", ["weights_ignored"], "after both models loaded the same new weights "
                 f"(load_state_dict), {why}: {cmp.message}")


def _load(ev, arenas: dict[str, Arena], keys: list[str], values: list[torch.Tensor], rec: dict) -> str:
    """Both sides load `values`, the candidate first: "ok", or the side that could not ("candidate": the
    reference keeps its weights; "reference": the caller puts the candidate back on the old ones)."""
    for role in ("candidate", "reference"):
        for buf, v in zip(arenas[role].tensors, values):
            buf.copy_(v)
    if ev.device.type == "cuda":
        torch.cuda.synchronize()
    desc, fds = arenas["candidate"].handle()
    got = ev.cand.request(dict(cmd="load_state", arena=desc, keys=keys), fds, phase="check")
    if not got.get("loaded"):
        rec.update(matched=False, note="the candidate's load_state_dict failed: " + str(got.get("error", ""))[:300])
        return "candidate"
    got = ev.ref.request(dict(cmd="load_state", keys=keys), phase="check")
    if not got.get("loaded"):
        rec["note"] = "the reference's load_state_dict failed: " + str(got.get("error", ""))[:300]
        return "reference"
    return "ok"
