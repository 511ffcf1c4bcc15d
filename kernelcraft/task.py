"""Tasks: KernelBench-format reference files, from a path, source text or the built-in suite.

A task is its source text: everything downstream works from the text. Inputs and constructor arguments always come
from the reference (`get_inputs`, `get_init_inputs`). Only the static structure is checked here (it parses and
defines `REQUIRED_NAMES`); running it is the judge's job, never the caller's. The CPU tier (`tiny`) is derived
from the GPU file's `# tiny:` comment.

Rationale: docs/design/core.md#task
"""
from __future__ import annotations

import ast
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

SUITE_DIR = Path(__file__).parent / "suite"
TIERS = ("gpu", "tiny")
LEVELS = ("level1", "level2", "level3")
REQUIRED_NAMES = ("Model", "get_inputs", "get_init_inputs")
_TINY_RE = re.compile(r"^#\s*tiny:\s*(.+)$", re.MULTILINE)


class TaskError(ValueError):
    """A task that cannot be used: missing file, syntax error, missing KernelBench names."""


@dataclass(frozen=True)
class Task:
    name: str  # "tiny/level1/matmul_square", a file path, or "<source>"
    source: str
    level: int | None = None
    tier: str | None = None

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()

    @property
    def stem(self) -> str:
        return self.name.rstrip("/").rsplit("/", 1)[-1].removesuffix(".py")


def validate_source(source: str, what: str = "task") -> ast.Module:
    """Parse a reference file and check it defines Model, get_inputs and get_init_inputs."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise TaskError(f"{what}: syntax error at line {e.lineno}: {e.msg}") from None
    defined = _top_level_names(tree)
    missing = [n for n in REQUIRED_NAMES if n not in defined]
    if missing:
        raise TaskError(f"{what}: not a KernelBench task, missing {', '.join(missing)}")
    return tree


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def tiny_overrides(source: str) -> dict[str, str]:
    """The `# tiny: a=1, b=2` directive as {name: python-literal-text}."""
    m = _TINY_RE.search(source)
    if not m:
        return {}
    out = {}
    for item in m.group(1).split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip().isidentifier():
            raise TaskError(f"bad tiny directive item {item.strip()!r}")
        ast.literal_eval(value.strip())  # must be a literal
        out[key.strip()] = value.strip()
    return out


def apply_overrides(source: str, overrides: dict[str, str]) -> str:
    """Rewrite module-level `NAME = ...` assignments with new literal values."""
    if not overrides:
        return source
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    found = set()
    # edit bottom-up so earlier line numbers stay valid
    for node in sorted(tree.body, key=lambda n: n.lineno, reverse=True):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id in overrides):
            name = node.targets[0].id
            found.add(name)
            first, last = node.lineno - 1, node.end_lineno - 1
            indent = lines[first][: len(lines[first]) - len(lines[first].lstrip())]
            lines[first: last + 1] = [f"{indent}{name} = {overrides[name]}\n"]
    missing = set(overrides) - found
    if missing:
        raise TaskError(f"tiny directive names constants the file does not assign: {sorted(missing)}")
    return "".join(lines)


def builtin_names(tier: str = "gpu", level: int | None = None) -> list[str]:
    if tier not in TIERS:
        raise TaskError(f"unknown tier {tier!r}; choose from {', '.join(TIERS)}")
    names = []
    for lv in LEVELS:
        if level is not None and lv != f"level{level}":
            continue
        for p in sorted((SUITE_DIR / lv).glob("*.py")):
            if p.name.startswith("_"):
                continue
            names.append(f"{tier}/{lv}/{p.stem}")
    return names


def _load_builtin(spec: str) -> Task:
    parts = spec.split("/")
    tier = "gpu"
    if parts[0] in TIERS:
        tier, parts = parts[0], parts[1:]
    if len(parts) != 2 or parts[0] not in LEVELS:
        raise TaskError(f"unknown task {spec!r}: not a file, and not a built-in name like "
                        "'tiny/level1/matmul_square' (see `kernelcraft tasks`)")
    path = SUITE_DIR / parts[0] / f"{parts[1]}.py"
    if not path.is_file():
        raise TaskError(f"unknown built-in task {spec!r} (see `kernelcraft tasks`)")
    source = path.read_text()
    if tier == "tiny":
        source = apply_overrides(source, tiny_overrides(source))
    validate_source(source, spec)
    return Task(name=f"{tier}/{parts[0]}/{parts[1]}", source=source,
                level=int(parts[0][-1]), tier=tier)


def load_task(spec: "str | Path | Task") -> Task:
    """A Task from a Task, a file path, a built-in name, or KernelBench source text."""
    if isinstance(spec, Task):
        return spec
    if isinstance(spec, Path) or (isinstance(spec, str) and "\n" not in spec and spec.endswith(".py")):
        path = Path(spec)
        if not path.is_file():
            raise TaskError(f"task file not found: {path}")
        source = path.read_text()
        validate_source(source, str(path))
        return Task(name=str(path), source=source, level=_level_hint(path))
    if "\n" in spec:
        validate_source(spec, "task source")
        return Task(name="<source>", source=spec)
    return _load_builtin(spec)


def _level_hint(path: Path) -> int | None:
    m = re.search(r"level[_ ]?([123])", str(path), re.IGNORECASE)
    return int(m.group(1)) if m else None
