"""kernelcraft: trustworthy evaluation and automatic optimization of GPU code for PyTorch modules.

The pipeline, one module a stage: task → candidate → build → (worker: check, time, guards) → verdict
→ search → train. `evaluate()` is the entry point for a single judgement.
"""
__version__ = "0.1.0"

from kernelcraft.candidate import Candidate, load_candidate  # noqa: E402
from kernelcraft.task import Task, TaskError, builtin_names, load_task  # noqa: E402
from kernelcraft.verdict import REASONS, Verdict  # noqa: E402


def evaluate(*args, **kwargs) -> "Verdict":
    """See `kernelcraft.evaluate.evaluate` (imported lazily: importing kernelcraft stays light)."""
    from kernelcraft.evaluate import evaluate as _evaluate

    return _evaluate(*args, **kwargs)


__all__ = ["Candidate", "REASONS", "Task", "TaskError", "Verdict", "builtin_names", "evaluate",
           "load_candidate", "load_task"]
