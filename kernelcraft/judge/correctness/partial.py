"""Partial-change trials: inputs that agree with the previous trial's except on a few elements.

After the fresh trials, `Protocol.partial_trials` more trials rewrite the previous inputs in the same arenas with a
secret random subset of elements (`SHARES`: ~1%, then one element) taken from a fresh draw, to catch a cache keyed
on an address plus a few values. A trial the reference fails on the mixed inputs is skipped, never charged to the
candidate.

Rationale: docs/design/judge-correctness.md#partial
"""
from __future__ import annotations

import torch

SHARES = (0.01, 0.0)  # 0.0: a single element


def shares(count: int) -> list[float]:
    """The share of elements each of `count` partial trials changes (cycling through SHARES)."""
    return [SHARES[i % len(SHARES)] for i in range(count)]


def mix(prev: list, fresh: list, share: float, seed: int) -> tuple[list, int]:
    """`prev` with about `share` of every tensor's elements (at least one) taken from `fresh`; (inputs, the number
    of elements changed). Non-tensor inputs are kept from `prev`."""
    gen = torch.Generator().manual_seed(seed)
    out, changed = [], 0
    for a, b in zip(prev, fresh):
        if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or a.numel() == 0:
            out.append(a)
            continue
        n = a.numel()
        m = min(n, max(1, round(share * n)))
        flat_idx = torch.randint(0, n, (m,), generator=gen)
        idx = tuple(i.to(a.device) for i in torch.unravel_index(flat_idx, a.shape)) if a.dim() else ()
        new = a.clone()
        if a.dim():
            new[idx] = b[idx]
        else:
            new.copy_(b)
        changed += int((new[idx] != a[idx]).sum()) if a.dim() else int(not torch.equal(new, a))
        out.append(new)
    return out, changed
