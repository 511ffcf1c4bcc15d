"""Policies: what proposes the next candidates. One small interface, a registry of implementations.

Design decisions
- `Policy.propose(context) -> list[Proposal]`: a proposal is candidate source plus its provenance
  (parents, the recipe or prompt/reply, token usage). A proposal without usable code carries the
  reason instead and is recorded as `parse_error`; the loop never sees exceptions for bad replies.
- The context gives a policy everything the loop knows and nothing it could break: the task source,
  the device description, the full history (read-only rows), recent failures, and `sample_exemplars()`,
  a fresh contrastive draw on every call (each LLM request, each recipe mutation gets its own pair).
- Specs are strings, as on the command line: `recipes`, `openai:MODEL`, `hf:PATH`. Implementations are
  imported lazily, so `openai`/`transformers` are needed only by users who pick those policies;
  `register_policy` lets a plugin add its own prefix.
- `PolicyError` is for configuration problems (no API key, unknown model, missing package): the run
  stops with that message. Transient failures (timeouts, 5xx) are the policy's to retry.
- A policy that may be called from several threads at once (one object shared by concurrent optimize runs
  in `kernelcraft bench`) says so with a class attribute `thread_safe = True`; callers serialise
  `propose` for any other (plugins included), so a policy never has to be thread-safe to be correct.
- Two optional hooks, so a run says what happened in the user's terms: `exhausted(context) -> str` explains
  why `propose` returned nothing (the run stops as `exhausted`: "every valid combination of these 3 recipes
  was tried"), and `preflight()` checks what the policy depends on (an endpoint answers) before the run
  spends anything, raising `PolicyError` at once with what it tried.
"""
from __future__ import annotations

import importlib
import random
from dataclasses import dataclass, field
from typing import Callable, Protocol

from kernelcraft.search.exemplars import Exemplar
from kernelcraft.search.prompt import DeviceInfo, Failure
from kernelcraft.task import Task


class PolicyError(RuntimeError):
    """A policy cannot work as configured (missing package, credentials, model)."""


@dataclass
class Proposal:
    source: str | None
    parents: list[int] = field(default_factory=list)
    meta: dict = field(default_factory=dict)
    prompt: str | None = None
    reply: str | None = None
    usage: dict | None = None
    reason: str | None = None  # set with `error` when there is no source
    error: str | None = None


@dataclass
class Context:
    task: Task
    device: DeviceInfo
    round: int
    k: int
    history: list  # rundb.Row, oldest first
    failures: list[Failure]
    sample_exemplars: Callable[[], list[Exemplar]]
    rng: random.Random
    allow_precision_change: bool = False
    backend: str = "any"
    mode: str = "open"
    tolerance: str = "1e-4 for float32"


class Policy(Protocol):
    name: str

    def propose(self, ctx: Context) -> list[Proposal]: ...


BUILTIN_POLICIES = {
    "recipes": ("kernelcraft.search.recipes.policy", "RecipesPolicy"),
    "openai": ("kernelcraft.search.llm", "OpenAIPolicy"),
    "hf": ("kernelcraft.search.llm", "HFPolicy"),
}
_REGISTRY: dict[str, Callable[..., Policy]] = {}


def register_policy(prefix: str, factory: Callable[..., Policy]) -> None:
    """Make `prefix[:ARG]` a policy spec; `factory(arg, **options)` builds it."""
    _REGISTRY[prefix] = factory


def policy_names() -> list[str]:
    return sorted(set(BUILTIN_POLICIES) | set(_REGISTRY))


def make_policy(spec: str, **options) -> Policy:
    """Build a policy from a spec like `recipes`, `openai:gpt-4o` or `hf:/models/qwen`."""
    prefix, _, arg = spec.partition(":")
    if prefix in _REGISTRY:
        return _REGISTRY[prefix](arg or None, **options)
    if prefix not in BUILTIN_POLICIES:
        raise PolicyError(f"unknown policy {spec!r}: use recipes, openai:MODEL or hf:PATH")
    module, cls = BUILTIN_POLICIES[prefix]
    factory = getattr(importlib.import_module(module), cls)
    if prefix in ("openai", "hf") and not arg:
        raise PolicyError(f"policy {prefix!r} needs an argument: {prefix}:{'MODEL' if prefix == 'openai' else 'PATH'}")
    if prefix == "recipes" and arg:
        raise PolicyError("the recipes policy takes no argument")
    return factory(arg, **options) if arg else factory(**options)
