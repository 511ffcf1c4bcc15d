"""The stand-in policy's output language: programs over the `recipes` transformations, compiled to candidates.

A program is a line of transformation words, e.g. `rewrite:fold_scalars compile:default`; compiled, it is
the `ModelNew` the offline `recipes` policy would render for that recipe (`RecipesPolicy.valid`, `.render`).
The vocabulary is every recipe token the device kind can use, less precision changes, plus `eager` (the null
program). An invalid program (a word that does not apply, is repeated, conflicts or is unknown; the empty
program) compiles to nothing. The policy is conditioned on `features`, never on the valid-program table.

Rationale: docs/design/train.md#programs
"""
from __future__ import annotations

import itertools
import math
import random
import threading
from dataclasses import dataclass
from types import SimpleNamespace

from kernelcraft.devices import DeviceInfo
from kernelcraft.search.recipes import policy as recipes
from kernelcraft.search.recipes import render as recipe_render
from kernelcraft.task import Task

END = "<end>"
EAGER = "eager"  # the null program: the reference's forward unchanged (a program of its own)


def vocabulary(kind: str) -> list[str]:
    """Every program word the device kind can use (what the policy may write), in a fixed order."""
    return [EAGER] + [t for t in recipes.PRIORS[kind] if t not in recipes.PRECISION]


@dataclass
class TaskInfo:
    """A task with what the learner may see of it (`features`) and what compiles its programs (`ctx`)."""
    task: Task
    ctx: SimpleNamespace
    features: list[str]
    words: list[str]  # the program words valid for this task alone (used only to enumerate the table)


class Compiler:
    """Programs -> candidate sources through the recipes policy (one analysis per task, cached)."""

    def __init__(self, kind: str = "cpu", skip=(), gpu: str = ""):
        """`skip`: words or word prefixes left out of the language (the recipes policy's own `skip`); `gpu`: the
        GPU product the programs are compiled for (its tuned configurations; "": the nearest of any product)."""
        self.kind = kind
        self.device = DeviceInfo(kind=kind, name=gpu)
        self.recipes = recipes.RecipesPolicy(skip=skip)
        self.vocab = [w for w in vocabulary(kind)
                      if not any(w == k or w.startswith(k.rstrip(":") + ":") for k in self.recipes.skip)]
        self._infos: dict[str, TaskInfo] = {}
        self._done: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()

    def info(self, task: Task) -> TaskInfo:
        with self._lock:
            if task.sha256 in self._infos:
                return self._infos[task.sha256]
        ctx = SimpleNamespace(task=task, device=self.device, allow_precision_change=False)
        a = self.recipes.analysis(ctx)
        if not a.traced:
            raise ValueError(f"{task.name}: the recipes analysis could not trace it ({a.error})")
        words = ([EAGER] if EAGER in self.vocab else []) + [t for t in self.recipes.tokens(ctx) if t in self.vocab]
        info = TaskInfo(task=task, ctx=ctx, features=features(task, a), words=words)
        with self._lock:
            return self._infos.setdefault(task.sha256, info)

    def parse(self, text: str, task: Task) -> tuple[frozenset | None, str]:
        """(recipe, "") for a valid program, (None, why) otherwise."""
        words = text.replace(END, " ").split()
        if not words:
            return None, "empty program"
        unknown = [w for w in words if w not in self.vocab]
        if unknown:
            return None, f"unknown word {unknown[0]!r}"
        if len(set(words)) != len(words):
            return None, "a word repeated"
        recipe = frozenset(words)
        if EAGER in recipe:
            return (recipe, "") if len(words) == 1 else (None, f"{EAGER} is a program of its own")
        info = self.info(task)
        if not set(recipe) <= set(info.words):
            return None, f"{sorted(recipe - set(info.words))[0]} does not apply to this task"
        if not self.recipes.valid(recipe, info.ctx):
            return None, "conflicting words"
        return recipe, ""

    def compile(self, text: str, task: Task) -> tuple[str | None, str]:
        """(candidate source, "") or (None, why): what the judge is given for a program."""
        recipe, why = self.parse(text, task)
        if recipe is None:
            return None, why
        try:
            if EAGER in recipe:
                return recipe_render.render(task.source, []), ""
            return self.recipes.render(recipe, self.info(task).ctx), ""
        except ValueError as e:
            return None, f"does not render: {e}"

    def completion(self, text: str, task: Task) -> str:
        """The completion the reward parses: the compiled candidate in a python block, or the bare program
        (no code: `reward.unparsable`). Remembered per (task, program): training asks again and again."""
        key = (task.sha256, text)
        if key not in self._done:
            src, _ = self.compile(text, task)
            self._done[key] = f"```python\n{src}```\n" if src is not None else f"invalid program: {text}"
        return self._done[key]


def fmt(recipe) -> str:
    """The canonical text of a recipe (words in vocabulary order is not needed: sorted)."""
    return " ".join(sorted(recipe))


def _bin(x: float) -> int:
    return int(math.floor(math.log2(max(1.0, float(x)))))


def features(task: Task, analysis) -> list[str]:
    f = analysis.features or {}
    out = [f"level:{task.level}"] if task.level is not None else []
    out += [f"op:{o}" for o in f.get("ops") or []]
    out += ["conv"] if f.get("conv") else []
    out += [f"params:{min(_bin(f.get('n_params') or 0) // 4, 8)}", f"nops:{min(_bin(f.get('n_ops') or 0), 6)}"]
    out += [f"rule:{r}" for r in analysis.rules]
    return out


def enumerate_programs(compiler: Compiler, task: Task, max_words: int = 3) -> list[frozenset]:
    """Every valid program of up to `max_words` words for `task` (the table the experiment warms)."""
    info = compiler.info(task)
    out = [frozenset([EAGER])] if EAGER in info.words else []
    for n in range(1, max_words + 1):
        for combo in itertools.combinations([w for w in info.words if w != EAGER], n):
            r = frozenset(combo)
            if compiler.recipes.valid(r, info.ctx):
                out.append(r)
    return out


def random_program(compiler: Compiler, task: Task, rng: random.Random, max_words: int = 3) -> frozenset | None:
    """A uniformly drawn valid program (SFT data: correct programs, whatever their speed)."""
    progs = enumerate_programs(compiler, task, max_words)
    return rng.choice(progs) if progs else None
