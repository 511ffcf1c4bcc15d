"""kernelcraft: trustworthy evaluation and automatic optimization of GPU code for PyTorch modules.

The pipeline, one stage a package: task → candidate → build → judge (correctness, speed, tripwires) → verdict
→ search → train. `evaluate()` is the entry point for a single judgement; this module re-exports the public API.

Rationale: docs/design/core.md
"""
from kernelcraft.version import __version__  # noqa: F401

from kernelcraft.candidate import Candidate, load_candidate  # noqa: E402
from kernelcraft.task import Task, TaskError, builtin_names, load_task  # noqa: E402
from kernelcraft.verdict import REASONS, Verdict  # noqa: E402

# Bound here, after the submodule import, so `kernelcraft.evaluate` stays the function (importing the
# submodule `kernelcraft.evaluate` later does not rebind the package attribute). Light: no torch import.
from kernelcraft.evaluate import evaluate  # noqa: E402


__all__ = ["Candidate", "REASONS", "Task", "TaskError", "Verdict", "builtin_names", "evaluate",
           "load_candidate", "load_task"]
