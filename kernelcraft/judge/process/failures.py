"""How an exception in a side becomes a verdict: its class (compile error, out of memory, CUDA error, exception) and
a message that names the lines of the module's own file.

The only place that maps exception types and texts to reasons; messages are trimmed to `_MAX_MSG` characters.

Rationale: docs/design/judge-process.md#failures
"""
from __future__ import annotations

import traceback

import torch

from kernelcraft.builder.cache import BuildCache
from kernelcraft.judge.reject import Reject

_MAX_MSG = 4000


def _trim(text: str) -> str:
    return text if len(text) <= _MAX_MSG else text[: _MAX_MSG // 2] + "\n...\n" + text[-_MAX_MSG // 2:]


def describe_exception(exc: BaseException, path: str | None = None) -> str:
    """The exception and the frames in the module's own file (where the author can act)."""
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if path and f.filename == path]
    lines = [f"{type(exc).__name__}: {exc}"]
    for f in own[-4:]:
        lines.append(f"  candidate line {f.lineno}, in {f.name}: {(f.line or '').strip()}")
    return _trim("\n".join(lines))


def classify(exc: BaseException, phase: str, path: str, build: BuildCache | None) -> Reject:
    if isinstance(exc, Reject):
        return exc
    if build is not None and build.failure is not None and phase == "import":
        return Reject("compile_error", ["build_failed"], _trim(build.failure.log))
    if isinstance(exc, SyntaxError) and phase == "import":
        return Reject("compile_error", ["parse_error"], f"SyntaxError: {exc.msg} (line {exc.lineno})")
    text = f"{type(exc).__name__}: {exc}"
    msg = describe_exception(exc, path)
    if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in text:
        return Reject("runtime_error", ["out_of_memory"], f"out of memory during {phase}: {msg}")
    if "CUDA error" in text or "cudaError" in text or type(exc).__name__ == "AcceleratorError":
        return Reject("runtime_error", ["cuda_error"], f"CUDA error during {phase}: {msg}")
    return Reject("runtime_error", ["exception"], f"exception during {phase}: {msg}")
