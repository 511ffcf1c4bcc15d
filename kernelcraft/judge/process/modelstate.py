"""A model's state as the judge must restore it: weights, buffers, module modes, RNG streams, and tensors kept in
plain attributes.

State is the state_dict, each module's `training` flag, the CPU and CUDA RNG states, and every tensor, None and
Python scalar in a module's own attributes (not lists or dicts). `Snapshot` is the whole constructed state (a warm
reference's `reset`); `plain_state` is the cheap part a stateful task changes, restored between timed rounds.

Rationale: docs/design/judge-process.md#modelstate
"""
from __future__ import annotations

import torch

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
