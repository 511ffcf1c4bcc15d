"""Partial-change trials: inputs that agree with the previous trial's except on a few elements (issue 16, 8).

Design decisions
- Fresh draws every trial catch a cache keyed on the inputs' values, but not one keyed on an address plus a
  few values: such a key never repeats under fresh draws, so the cache never hits and the candidate looks
  honest, while a user's next call with mostly equal inputs (a static buffer, padding in the same places) gets
  a stale answer. After the fresh trials the judge runs `Protocol.partial_trials` more, each writing into the
  same arenas (the same addresses) the previous trial's inputs with a random subset of elements of every
  tensor input replaced by the values of a fresh draw at those positions (so every value is one
  `get_inputs()` can produce). The subset is chosen with the judge's secret RNG.
- Shares, in order: about 1% of each tensor's elements (at least one), then a single element. A cache keyed
  on k fixed or sampled elements of an n-element input hits with probability (1 - m/n)^k: about 99% for a
  few keys under the 1% trial, and ~1 - k/n for any key of k << n elements under the one-element trial.
  The output must follow the change like any trial's; an output equal to the previous trial's is named
  `stale_output`. Integer and bool inputs are mixed the same way (values from the fresh draw stay valid).
- Mixing two valid draws can break a task's cross-element constraint (a positive-definite matrix, sorted
  offsets). Partial trials run the reference first; if it fails or its output is non-finite everywhere, the
  trial is skipped (recorded), never charged to the candidate.
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
