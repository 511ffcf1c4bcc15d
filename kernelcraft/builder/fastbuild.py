"""Fast path for cold `load_inline` builds: compile the candidate's `.cu` without `torch/extension.h`.

`plan` picks `bare` (a `.cu` naming nothing of torch), else `split` (`cusplit`) then `types` (extension.h
includes become torch/types.h); `build_with_fallback` tries them in order and ends with the plain build, so
the candidate sees either a working module or the plain build's error. The variant that built a directory is
recorded in `.variant`. Off with `KERNELCRAFT_FASTBUILD=0`; `KERNELCRAFT_SPLIT=0` / `notemplates`.
Rationale: docs/design/builder.md#fastbuild
"""
from __future__ import annotations

import inspect
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch.utils.cpp_extension as cpp_ext

from kernelcraft.builder import cusplit, pch

_TORCH_LOAD_INLINE = cpp_ext.load_inline  # imported by kernelcraft.builder.cache before it patches torch
FAST_VERSION = 1  # bump when the rewrite changes: it is part of the cache key
ENV_SWITCH = "KERNELCRAFT_FASTBUILD"
SPLIT_SWITCH = "KERNELCRAFT_SPLIT"  # 0: no split (cusplit), the other fast paths stay; notemplates: no kernel templates

_HEAVY_INCLUDE = re.compile(r'^([ \t]*#[ \t]*include[ \t]*)[<"]torch/(?:extension|torch|all)\.h[>"]',
                            re.MULTILINE)
# what torch/types.h does not declare and extension.h does (pybind11, Python, the C++ frontend)
_NEEDS_EXTENSION_H = re.compile(
    r"pybind11|PYBIND11_|\bpy::|Python\.h|\bPy(?:Object|[A-Z][A-Za-z]*_[A-Za-z])|\bTHP\w+|torch/python\.h"
    r"|TORCH_LIBRARY"
    r"|torch::(?:nn|optim|data|serialize|jit|cuda|python|fft|linalg|special|nested|sparse|hub|mps|xpu"
    r"|save|load|pickle_save|pickle_load|manual_seed)\b|torch::autograd::(?:Function|AutogradContext)")


# names torch (or pybind11): else a `.cu` of kernels and launchers on raw pointers, the wrapper in cpp_sources
_NAMES_TORCH = re.compile(cusplit.TORCH_NAMES + "|" + cusplit.TORCH_INCLUDE)
_NO_TYPES_H = "// kernelcraft fast build: no torch/types.h (this source names nothing of torch)"
_SPLIT_NOTE = "// kernelcraft split build: the kernels of the candidate's .cu; its host code is in main.cpp"


def enabled(switch: str = ENV_SWITCH) -> bool:
    return os.environ.get(switch, "1").strip().lower() not in ("0", "false", "no", "off")


@dataclass
class Plan:
    """A fast build: the arguments that differ from the candidate's, its variant name, whether any failure
    (not only nvcc's) falls back, and the fast build tried next if it does (then the plain build)."""

    variant: str
    cpp_sources: object
    cuda_sources: list[str]
    kwargs: dict = field(default_factory=dict)
    any_failure: bool = False
    fallback: Plan | None = None
    header: str = "full"  # what main.cpp starts with (`pch.HEADERS`), for its precompiled header

    @property
    def tag(self) -> str:
        """For the cache key: the variants tried, in order."""
        return self.variant + (f"+{self.fallback.tag}" if self.fallback else "")

    def chain(self) -> list[Plan]:
        return [self] + (self.fallback.chain() if self.fallback else [])


def plan(cpp_sources, cuda_sources, kwargs: dict | None = None, extra_cflags=None,
         extra_cuda_cflags=None) -> Plan | None:
    """The fast build for these `load_inline` arguments, or None where the plain build is the only one."""
    kwargs = kwargs or {}
    if not cuda_sources or not enabled() or kwargs.get("no_implicit_headers"):
        return None
    if not all(isinstance(s, (str, list)) for s in (cpp_sources, cuda_sources)):
        return None  # what load_inline takes (it inserts into lists); anything else fails there, in the plain build
    srcs = [cuda_sources] if isinstance(cuda_sources, str) else list(cuda_sources)
    cpps = [cpp_sources] if isinstance(cpp_sources, str) else list(cpp_sources)
    if not all(isinstance(s, str) for s in srcs + cpps):
        return None
    code = _strip_comments("\n".join(srcs))
    if not _NAMES_TORCH.search(code) and _supports_no_implicit_headers():
        # what load_inline adds, less torch/types.h: main.cpp is byte for byte the plain build's, and the
        # .cu has as many lines in front of the candidate's as in the plain build
        return Plan(f"bare-{FAST_VERSION}", ["#include <torch/extension.h>", *cpps],
                    [_NO_TYPES_H, "#include <cuda.h>", "#include <cuda_runtime.h>", *srcs],
                    {"no_implicit_headers": True})
    types = None
    if _HEAVY_INCLUDE.search("\n".join(srcs)) and not _NEEDS_EXTENSION_H.search(code):
        types = Plan(f"types-{FAST_VERSION}", cpp_sources, [_HEAVY_INCLUDE.sub(r"\1<torch/types.h>", s) for s in srcs])
    parts = (_split("\n".join(srcs), extra_cuda_cflags, split_templates())
             if enabled(SPLIT_SWITCH) and _host_flags_ok(extra_cflags) and _supports_no_implicit_headers() else None)
    if parts is not None:
        host = parts.host
        header = "full" if _NEEDS_EXTENSION_H.search(_strip_comments("\n".join([*cpps, host]))) else "light"
        if header == "light":  # as in `types`: the wrapper gets torch/types.h (first in the light header)
            host = _HEAVY_INCLUDE.sub(r"\1<torch/types.h>", host)
        return Plan(f"split-{cusplit.VERSION}", [pch.HEADERS[header].rstrip("\n"), *cpps, host],
                    [_SPLIT_NOTE, *cusplit.PRELUDE, parts.cuda],
                    {"no_implicit_headers": True}, any_failure=True, fallback=types, header=header)
    return types


def split_templates() -> bool:
    """Split kernel templates too (see cusplit), unless `KERNELCRAFT_SPLIT=notemplates`."""
    return os.environ.get(SPLIT_SWITCH, "").strip().lower() != "notemplates"


def _split(source: str, extra_cuda_cflags, templates: bool = False):
    """cusplit.split, never raising: whatever the source, a bug in the splitter must not become the
    candidate's build failure (the plain build decides that)."""
    try:
        return cusplit.split(source, extra_cuda_cflags, templates)
    except Exception:  # noqa: BLE001
        return None


_BENIGN_HOST_FLAG = re.compile(r"|-O[0-3s]?|-g\d?|-w|-W[\w=-]*|-std=(?:c|gnu)\+\+\d\w*|-fPIC|-pthread|-march=native")
# (the empty flag too: KernelBench's example passes extra_cflags=[""])


def _host_flags_ok(extra_cflags) -> bool:
    """The split compiles the wrapper with main.cpp's flags: only where they cannot change what it computes."""
    return all(_BENIGN_HOST_FLAG.fullmatch(str(f).strip()) for f in extra_cflags or [])


def rewrite_cuda_sources(cuda_sources) -> list[str] | None:
    """The `cuda_sources` of the fast build (None: no fast build)."""
    p = plan("", cuda_sources)
    return None if p is None else p.cuda_sources


def _supports_no_implicit_headers() -> bool:
    try:
        return "no_implicit_headers" in inspect.signature(_TORCH_LOAD_INLINE).parameters
    except (TypeError, ValueError):
        return False


def _strip_comments(text: str) -> str:
    return re.sub(r"//[^\n]*|/\*.*?\*/", " ", text, flags=re.DOTALL)


def nvcc_step_failed(build_dir: str, message: str = "") -> bool:
    """After a failed build: did nvcc fail on the `.cu`? Ninja's `FAILED:` lines say; without them
    (output not captured), whether no object newer than the source exists."""
    failed = re.findall(r"^FAILED: (?:\[code=\d+\] )?(\S+)", message, re.MULTILINE)
    if failed:
        return any(f.endswith(".cuda.o") for f in failed)
    d = Path(build_dir)
    cu = d / "cuda.cu"
    if not cu.exists():
        return False
    objs = list(d.glob("*.cuda.o"))
    return not any(o.stat().st_mtime >= cu.stat().st_mtime for o in objs)


class Versioner:
    """Restores torch's per-name version entry after a failed fast attempt, so the plain retry builds
    `name`, not `name_v1` (and finds a cached `name.so` again in a later process)."""

    _missing = object()

    def __init__(self, name: str):
        self.name = name
        entries = getattr(getattr(cpp_ext, "JIT_EXTENSION_VERSIONER", None), "entries", None)
        self.entries = entries if isinstance(entries, dict) else None
        self.saved = self.entries.get(name, self._missing) if self.entries is not None else None

    def restore(self) -> None:
        if self.entries is None:
            return
        if self.saved is self._missing:
            self.entries.pop(self.name, None)
        else:
            self.entries[self.name] = self.saved


def build_with_fallback(build_dir: str, name: str, plan: Plan, attempt, plain):
    """Try the plan's builds in order (`attempt(build_dir, plan)`), then `plain(build_dir)`. A build falls
    back on an nvcc failure, or on any failure where its plan says so; the variant that built the directory
    (or whose failure is final) is recorded in `build_dir/.variant`, and a later load starts there."""
    variant = Path(build_dir) / ".variant"
    steps = [(p.variant, p.any_failure, lambda d, p=p: attempt(d, p)) for p in plan.chain()]
    steps.append(("plain", False, plain))
    done = variant.read_text().strip() if variant.exists() else ""
    names = [s[0] for s in steps]
    start = names.index(done) if done in names else 0
    for i, (tag, any_failure, build) in enumerate(steps[start:], start):
        versions = Versioner(name)
        try:
            mod = build(build_dir)
        except Exception as e:
            if i + 1 < len(steps) and (any_failure or nvcc_step_failed(build_dir, str(e))):
                versions.restore()
                variant.write_text(f"{steps[i + 1][0]}\n")
                continue
            variant.write_text(f"{tag}\n")  # the failure is the next build's too: the candidate's error
            raise
        variant.write_text(f"{tag}\n")
        return mod
    raise AssertionError("unreachable: the plain build either returns or raises")

