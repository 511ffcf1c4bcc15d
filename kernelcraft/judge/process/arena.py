"""Arenas: memory the judge owns and lends to one side, where inputs and outputs cross as bytes.

One arena per side and direction (a memfd on a CPU, a private CUDA memory pool shared by IPC on a GPU), laid out
from `TensorSpec`s at `ALIGN`-byte offsets so both processes build identical views. Invariant: the judge never calls
a method of an object the candidate made; it reads its own views, copied into private tensors.

Rationale: docs/design/judge-process.md#arena
"""
from __future__ import annotations

import math
import mmap
import os
from dataclasses import dataclass

import torch

ALIGN = 256


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str  # str(torch.dtype) without the "torch." prefix

    @classmethod
    def of(cls, t: torch.Tensor) -> "TensorSpec":
        return cls(tuple(t.shape), tuple(t.stride()), str(t.dtype).removeprefix("torch."))

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        if any(s == 0 for s in self.shape):
            return 0
        span = 1 + sum((s - 1) * abs(st) for s, st in zip(self.shape, self.stride))
        return span * torch.empty(0, dtype=self.torch_dtype).element_size()

    def describe(self) -> str:
        return f"{self.dtype}{list(self.shape)}"


def total_bytes(specs) -> int:
    """The bytes the tensors of `specs` take (None entries none)."""
    return sum(s.nbytes for s in specs if s is not None)


def layout(specs: list[TensorSpec | None]) -> tuple[list[int], int]:
    """Offsets of each tensor (None entries take no space) and the arena size."""
    offsets, pos = [], 0
    for s in specs:
        offsets.append(pos)
        if s is not None:
            pos += -(-max(s.nbytes, 1) // ALIGN) * ALIGN
    return offsets, max(pos, ALIGN)


def views(base: torch.Tensor, specs: list[TensorSpec | None]) -> list[torch.Tensor | None]:
    """Tensors over `base` (a flat uint8 tensor) per `layout`."""
    offsets, _ = layout(specs)
    out = []
    for s, off in zip(specs, offsets):
        if s is None:
            out.append(None)
            continue
        n = s.nbytes
        flat = base[off:off + n].view(s.torch_dtype) if n else torch.empty(0, dtype=s.torch_dtype, device=base.device)
        out.append(flat.as_strided(s.shape, s.stride))
    return out


class Arena:
    """The judge's end: allocate, describe for one side, and view."""

    def __init__(self, specs: list[TensorSpec | None], device: torch.device):
        self.specs = specs
        _, self.nbytes = layout(specs)
        self.device = device
        self.fd = None
        if device.type == "cuda":
            pool = torch.cuda.MemPool() if hasattr(torch.cuda, "MemPool") else None
            if pool is not None:
                with torch.cuda.use_mem_pool(pool):
                    self.base = torch.empty(self.nbytes, dtype=torch.uint8, device=device)
                self._pool = pool  # kept alive with the arena
            else:  # an allocation of its own: round up past the caching allocator's shared segments
                self.base = torch.empty(max(self.nbytes, 32 << 20), dtype=torch.uint8, device=device)
        else:
            self.fd = os.memfd_create("kernelcraft-arena", 0)
            os.ftruncate(self.fd, self.nbytes)
            self._map = mmap.mmap(self.fd, self.nbytes)
            self.base = torch.frombuffer(self._map, dtype=torch.uint8)
        self.tensors = views(self.base, specs)

    def handle(self) -> tuple[dict, list[int]]:
        """(picklable description, file descriptors to pass) for the side that will map this arena."""
        if self.device.type == "cuda":
            from torch.multiprocessing.reductions import reduce_tensor

            fn, args = reduce_tensor(self.base)
            return {"kind": "cuda", "rebuild": (fn, args), "specs": self.specs}, []
        return {"kind": "cpu", "nbytes": self.nbytes, "specs": self.specs}, [self.fd]


def attach(desc: dict, fds: list[int]) -> list[torch.Tensor | None]:
    """The side's end: map an arena described by `Arena.handle` and return its tensor views."""
    if desc["kind"] == "cuda":
        fn, args = desc["rebuild"]
        base = fn(*args)
    else:
        mm = mmap.mmap(fds[0], desc["nbytes"])
        os.close(fds[0])
        base = torch.frombuffer(mm, dtype=torch.uint8)
    return views(base, desc["specs"])
