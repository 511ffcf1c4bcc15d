"""Candidates: source text defining `ModelNew`, in PyTorch, inline CUDA/C++ or Triton.

A candidate is its source text; its identity is the SHA-256 of that text (`normalized_hash`: equal for sources
that differ only in comments and formatting). Its structure is checked here, in the caller, before any process is
spawned (`structure_problem`). Invariant: nothing in this module executes candidate code.

Rationale: docs/design/core.md#candidate
"""
from __future__ import annotations

import ast
import hashlib
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Candidate:
    source: str
    origin: str = "<source>"

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()


def load_candidate(spec: "str | Path | Candidate") -> Candidate:
    """A Candidate from a Candidate, a file path or source text."""
    if isinstance(spec, Candidate):
        return spec
    if isinstance(spec, Path) or ("\n" not in spec and spec.endswith(".py")):
        path = Path(spec)
        if not path.is_file():
            raise FileNotFoundError(f"candidate file not found: {path}")
        return Candidate(path.read_text(), str(path))
    return Candidate(spec)


def needs_build(source: str) -> bool:
    """Does the candidate compile an extension at import (`load_inline`/`load`)? Such an import may take
    minutes of nvcc; any other import is quick."""
    return "load_inline" in source or "cpp_extension" in source


def preloads(source: str) -> list[str]:
    """Trusted libraries the candidate imports that the worker may import first, off the device lock: Triton, and
    inductor's compiler for a `torch.compile` call (its import is ~1-2 s of the construction otherwise)."""
    out = ["triton"] if any(line.lstrip().startswith(("import triton", "from triton"))
                            for line in source.splitlines()) else []
    if "torch.compile(" in source or "compile(" in source and "from torch import compile" in source:
        out.append("torch._inductor.compile_fx")
    return out


def autotunes(source: str) -> bool:
    """Whether the candidate may benchmark its own kernels on its first call: `torch.compile` (inductor autotunes
    reductions and some pointwise kernels at their first launch), Triton's autotuner, or cuDNN's benchmark mode
    (it times the convolution algorithms for each new shape). Its first call then has the device to itself
    (`worker.Evaluation.first_call`): picks made beside other evaluations' work are noise, and they are kept (the
    compile caches, cuDNN's per-shape choice). A candidate that hides it only tunes on a shared device."""
    return any(word in source for word in ("autotune", "torch.compile", "from torch import compile",
                                             "cudnn.benchmark"))


def first_call_hold(source: str) -> str | None:
    """How a candidate that `autotunes` makes its first call: `tuning`, sharing the device until the trusted
    libraries' first benchmark (inductor's, Triton's: hooked in its process, `judge/process/tuning.py`), then
    alone to the end of the call; `call`, alone from its start, where cuDNN's benchmark mode may tune (inside
    cuDNN, where no hook reaches); None where it may not autotune."""
    if not autotunes(source):
        return None
    return "call" if "cudnn.benchmark" in source else "tuning"


def structure_problem(source: str) -> tuple[str, str] | None:
    """(reason, message) if the source cannot be a candidate at all, else None."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        line = (e.text or "").rstrip()
        return "parse_error", f"SyntaxError: {e.msg} (line {e.lineno}){': ' + line.strip() if line else ''}"
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "ModelNew":
            return None
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "ModelNew" for t in targets):
                return None
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if any((a.asname or a.name) == "ModelNew" for a in node.names):
                return None
    return "no_modelnew", "the candidate defines no ModelNew (a class ModelNew(nn.Module) is required)"


def normalized_hash(source: str) -> str:
    """Hash of the AST dump: equal for sources that differ only in comments and formatting."""
    try:
        text = ast.unparse(ast.parse(source))
    except SyntaxError:
        text = source
    return hashlib.sha256(text.encode()).hexdigest()
