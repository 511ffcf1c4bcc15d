"""Policies: what proposes the next candidates. One small interface, a registry of implementations.

`Policy.propose(context) -> list[Proposal]`; a proposal without usable code carries its reason (recorded as
`parse_error`), never an exception. Specs are strings (`recipes`, `openai:MODEL`, `hf:PATH`, registered
prefixes), implementations imported lazily. `PolicyError` stops a run (configuration problems). A policy
without `thread_safe = True` is never called from two threads at once. Optional hooks: `exhausted(context)`,
`preflight()`.
Rationale: docs/design/search.md#policies
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
