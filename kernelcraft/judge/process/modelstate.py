"""A model's state in a side: what the judge must restore, and what the weights check and the module mode read and
set.

State is the state_dict, each module's `training` flag, the CPU and CUDA RNG states, and every tensor, None and
Python scalar in a module's own attributes (not lists or dicts). `Snapshot` is the whole constructed state (a warm
reference's `reset`); `plain_state` is the cheap part a stateful task changes, restored between timed rounds.

The side's half of the weights check (judge/correctness/weights.py): `state` lists the state_dict, `dump_state` and
`load_state` move it through the judge's arenas (a failed load is reported, the previous state kept); `apply_mode`
sets the protocol's module mode after construction and `verify_mode` rejects a candidate whose modules left it
(`mode_changed`).

Rationale: docs/design/judge-process.md#modelstate
"""
from __future__ import annotations

import torch

from kernelcraft.judge.process.arena import attach
from kernelcraft.judge.reject import Reject
from kernelcraft.judge.tripwires import calls as tripwires


SCALARS = (bool, int, float, str)
_MODULE_OWN = frozenset(vars(torch.nn.Module()))  # nn.Module's own attributes (hooks, flags): never a forward's state


def plain_state(model) -> list:
    """What a forward may carry in plain module attributes, tensors cloned: [(module index, name, value)] for tensors,
    None and Python scalars (docs/design/judge-process.md#modelstate)."""
    if not isinstance(model, torch.nn.Module):
        return []
    return [(i, name, v.detach().clone() if isinstance(v, torch.Tensor) else v)
            for i, m in enumerate(model.modules()) for name, v in vars(m).items()
            if name not in _MODULE_OWN and (isinstance(v, (torch.Tensor, *SCALARS)) or v is None)]


def set_plain_state(model, attrs: list) -> None:
    """The values of `plain_state` back, each where the model keeps that attribute now: a forward that moved its
    state to the input's device once and remembers so in a flag (CUDA-L1's level3/task34 caches `_device_cache`)
    must not get it back on the CPU, where its constructor made it."""
    if not isinstance(model, torch.nn.Module):
        return
    mods = list(model.modules())
    for i, name, v in attrs:
        now = getattr(mods[i], name, None)
        if v is None or isinstance(v, SCALARS):
            setattr(mods[i], name, v)
        elif isinstance(now, torch.Tensor) and now.shape == v.shape:
            setattr(mods[i], name, v.to(device=now.device, dtype=now.dtype, copy=True))
        else:
            setattr(mods[i], name, v.clone())


def changed(before: list, after: list) -> bool:
    """Did a call change the plain-attribute state (`plain_state` before and after)?"""
    if [a[:2] for a in before] != [b[:2] for b in after]:
        return True
    return not all(_same(a[2], b[2]) for a, b in zip(before, after))


def _same(a, b) -> bool:
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return type(a) is type(b) and (a == b or a != a and b != b)  # a NaN float is the same NaN
    return a.device == b.device and tripwires.same_values(a, b)


def rng_state(device: torch.device) -> tuple:
    return torch.get_rng_state(), (torch.cuda.get_rng_state() if device.type == "cuda" else None)


def set_rng_state(state: tuple) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1])


class Snapshot:
    """A model's whole state, taken once (right after construction) and restored any number of times."""

    def __init__(self, model, device: torch.device):
        self.rng = rng_state(device)
        self.state = self.modes = None
        self.attrs: list = []
        if isinstance(model, torch.nn.Module):
            self.state = {k: v.detach().clone() for k, v in model.state_dict(keep_vars=False).items()}
            self.modes = [m.training for m in model.modules()]
            self.attrs = plain_state(model)

    def restore(self, model, rng: bool = True) -> None:
        """Everything back; `rng=False` leaves the RNG streams as they are (see `side.cmd_describe`)."""
        if isinstance(model, torch.nn.Module):
            with torch.no_grad():
                model.load_state_dict(self.state, strict=True)
            for m, mode in zip(model.modules(), self.modes):
                m.training = mode
            set_plain_state(model, self.attrs)
        if rng:
            set_rng_state(self.rng)


# -- the side's half of the weights check and the module mode ----------------------------------------------------------
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
