"""Bench sources: SOURCE (+ an optional candidates directory) -> items, one task + at most one candidate each.

A built-in suite or task, a directory of KernelBench files, a single task file, or a CUDA-L1 pairs file.
Nothing here runs code: files are only read and parsed. An unusable row or file becomes an item with `error`
(`input_error`), a task without a candidate one with `missing` (`no_candidate`); only a SOURCE that cannot be
read at all, or holds nothing, raises `BenchError`.
Rationale: docs/design/bench.md#sources
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from kernelcraft.task import (
    LEVELS,
    TIERS,
    Task,
    TaskError,
    builtin_names,
    load_task,
    validate_source,
)

NO_CODE = ("none", "null")  # CUDA-L1 writes the string "None" for a task without a kernel
RUN_FILE_RE = re.compile(r"^level_(\d+)_problem_(\d+)_sample_(\d+)_kernel\.py$")
_LEVEL_RE = re.compile(r"level[_ ]?(\d+)", re.IGNORECASE)
_ID_RE = re.compile(r"^(\d+)_")


class BenchError(ValueError):
    """A bad SOURCE, candidates directory or option: the caller's error (one line)."""


@dataclass
class Item:
    name: str
    task: Task | None
    candidate: str | None = None  # candidate source; None: no candidate (see `missing`) or optimize
    level: int | None = None
    task_id: int | None = None
    rel: str = ""  # path-like identity used to match candidate files ("level1/relu")
    origin: str = ""  # where it came from ("pairs.jsonl:12", a file path)
    candidate_path: str | None = None
    missing: str | None = None  # why there is no candidate (status no_candidate)
    error: str | None = None  # why the item cannot be used (status input_error)
    extra: dict = field(default_factory=dict)
    key: str = ""


@dataclass
class Source:
    spec: str
    name: str  # short, for the default output directory
    kind: str  # builtin | dir | file | pairs
    items: list[Item]
    notes: list[str] = field(default_factory=list)
    has_candidates: bool = False


def default_tier(device: str) -> str:
    return "gpu" if device.startswith("cuda") else "tiny"


def resolve(spec: str, *, device: str = "cpu", candidates: str | os.PathLike | None = None) -> Source:
    """SOURCE (+ optional candidates directory) -> items. Raises BenchError for an unusable SOURCE."""
    path = Path(spec)
    if path.is_dir():
        src = _from_dir(spec, path)
    elif path.is_file() and path.suffix == ".py":
        src = _from_task_files(spec, path.stem, "file", path.parent, [path])
    elif path.is_file():
        src = _from_pairs(spec, path)
    elif spec.endswith((".py", ".jsonl", ".json")) or os.sep in spec.strip("/") and not _builtin_like(spec):
        raise BenchError(f"SOURCE not found: {spec}")
    else:
        src = _from_builtin(spec, device)
    if candidates is not None:
        if src.kind == "pairs":
            raise BenchError("--candidates does not apply to a pairs file (its rows carry their candidates)")
        cdir = Path(candidates)
        if not cdir.is_dir():
            raise BenchError(f"--candidates: not a directory: {cdir}")
        src.items = _attach(src.items, cdir, src.notes)
        src.has_candidates = True
    if not src.items:
        raise BenchError(f"SOURCE {spec!r} holds no tasks")
    return src


def _builtin_like(spec: str) -> bool:
    parts = spec.strip("/").split("/")
    return parts[0] in TIERS or parts[0] in LEVELS


def _from_builtin(spec: str, device: str) -> Source:
    parts = [p for p in spec.strip("/").split("/") if p]
    tier = parts[0] if parts and parts[0] in TIERS else None
    rest = parts[1:] if tier else parts
    tier = tier or default_tier(device)
    if len(rest) == 0 or (len(rest) == 1 and rest[0] in LEVELS):
        level = int(rest[0][-1]) if rest else None
        names = builtin_names(tier, level)
    elif len(rest) == 2 and rest[0] in LEVELS:
        names = [f"{tier}/{rest[0]}/{rest[1]}"]
    else:
        raise BenchError(f"unknown SOURCE {spec!r}: not a file or directory, and not a built-in suite "
                         "(gpu, tiny, gpu/level1, tiny/level2, level3, or one task like tiny/level1/relu)")
    items = []
    for n in names:
        try:
            t = load_task(n)
        except TaskError as e:
            raise BenchError(str(e)) from None
        items.append(Item(name=t.name, task=t, level=t.level, rel=t.name.split("/", 1)[1], origin=t.name))
    return Source(spec, spec.strip("/").replace("/", "-"), "builtin", items)


def _from_dir(spec: str, root: Path) -> Source:
    files = sorted(p for p in root.rglob("*.py")
                   if not any(part.startswith((".", "_")) for part in p.relative_to(root).parts))
    return _from_task_files(spec, root.resolve().name or "tasks", "dir", root, files)


def _from_task_files(spec: str, name: str, kind: str, root: Path, files: list[Path]) -> Source:
    items, seen = [], set()
    for p in files:
        rel = p.relative_to(root).with_suffix("").as_posix()
        hint = f"{root.resolve().name}/{rel}"
        m = _LEVEL_RE.search(hint)
        level = int(m.group(1)) if m else None
        m = _ID_RE.match(p.stem)
        task_id = int(m.group(1)) if m else None
        item = Item(name=rel, task=None, level=level, task_id=task_id, rel=rel, origin=str(p))
        try:
            text = p.read_text()
            validate_source(text, str(p))
            item.task = Task(name=rel, source=text, level=level)
        except (TaskError, OSError, UnicodeDecodeError) as e:
            item.error = f"{p}: {e}" if not str(e).startswith(str(p)) else str(e)
        if rel in seen:
            continue
        seen.add(rel)
        items.append(item)
    return Source(spec, name, kind, items)


def _int_field(obj: dict, key: str) -> int | None:
    v = obj.get(key)
    if v is None:
        return None
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str) and v.strip().isdigit():
        return int(v.strip())
    raise ValueError(f"{key} must be an integer, not {v!r}")


def _from_pairs(spec: str, path: Path) -> Source:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise BenchError(f"cannot read {path}: {e}") from None
    rows: list[tuple[int, object, str | None]] = []  # (line, object, parse error)
    if text.lstrip().startswith("["):
        try:
            rows = [(i + 1, o, None) for i, o in enumerate(json.loads(text))]
        except ValueError as e:
            raise BenchError(f"{path}: not a JSON array of pairs nor JSON lines: {e}") from None
    else:
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append((n, json.loads(line), None))
            except ValueError as e:
                rows.append((n, None, f"not valid JSON ({e})"))
    if not rows:
        raise BenchError(f"{path}: no pairs in the file")
    if all(err for _, _, err in rows):
        raise BenchError(f"{path}: not a pairs file (JSON lines with ref_code and custom_code): "
                         f"line {rows[0][0]}: {rows[0][2]}")
    items, names = [], set()
    for n, obj, err in rows:
        origin = f"{path.name}:{n}"
        item = Item(name=f"line{n}", task=None, origin=origin)
        if err is None and not isinstance(obj, dict):
            err = f"expected a JSON object, got {type(obj).__name__}"
        if err is None:
            item.extra = {k: v for k, v in obj.items() if k not in ("ref_code", "custom_code")}
            try:
                item.level, item.task_id = _int_field(obj, "level_id"), _int_field(obj, "task_id")
            except ValueError as e:
                err = str(e)
        if err is None:
            ref, cand = obj.get("ref_code"), obj.get("custom_code")
            if not isinstance(ref, str) or not ref.strip():
                err = "no ref_code (the reference task source)" if ref is None or isinstance(ref, str) \
                    else f"ref_code must be a string, not {type(ref).__name__}"
            elif cand is not None and not isinstance(cand, str):
                err = f"custom_code must be a string or null, not {type(cand).__name__}"
            else:
                try:
                    validate_source(ref, "ref_code")
                except TaskError as e:
                    err = str(e)
        if item.level is not None and item.task_id is not None:
            item.name = f"level{item.level}/task{item.task_id}"
        elif item.task_id is not None:
            item.name = f"task{item.task_id}"
        if item.name in names:
            item.name = f"{item.name}#line{n}"
        names.add(item.name)
        if err is not None:
            item.error = f"{origin}: {err}"
        else:
            item.task = Task(name=item.name, source=obj["ref_code"], level=item.level)
            cand = obj.get("custom_code")
            if cand is None or not cand.strip() or cand.strip().lower() in NO_CODE:
                what = "null" if cand is None else repr(cand.strip()) if cand.strip() else "empty"
                item.missing = f"{origin}: custom_code is {what}: no candidate"
            else:
                item.candidate = cand
        items.append(item)
    return Source(spec, path.stem, "pairs", items, has_candidates=True)


def _attach(items: list[Item], cdir: Path, notes: list[str]) -> list[Item]:
    files = sorted(p for p in cdir.rglob("*.py")
                   if not any(part.startswith((".", "_")) for part in p.relative_to(cdir).parts))
    runs = [(p, RUN_FILE_RE.match(p.name)) for p in files]
    runs = [(p, m) for p, m in runs if m]
    used: set[Path] = set()
    out: list[Item] = []
    if runs:  # KernelBench's run layout: level_<L>_problem_<ID>_sample_<S>_kernel.py
        by_problem: dict[tuple[int, int], list[tuple[int, Path]]] = {}
        for p, m in runs:
            by_problem.setdefault((int(m.group(1)), int(m.group(2))), []).append((int(m.group(3)), p))
        levels = {lv for lv, _ in by_problem}
        for it in items:
            lv = it.level if it.level is not None else (next(iter(levels)) if len(levels) == 1 else None)
            samples = sorted(by_problem.get((lv, it.task_id), [])) if it.task_id is not None else []
            if it.task is None or not samples:
                out.append(_no_file(it, cdir, "level_<L>_problem_<ID>_sample_<S>_kernel.py") if it.task else it)
                continue
            for s, p in samples:
                one = replace(it, name=it.name if len(samples) == 1 else f"{it.name}@sample{s}", extra=dict(it.extra))
                _read_candidate(one, p)
                used.add(p)
                out.append(one)
    else:  # <relative path>.py or <stem>.py
        by_rel = {p.relative_to(cdir).with_suffix("").as_posix(): p for p in files}
        by_stem: dict[str, list[Path]] = {}
        for p in files:
            by_stem.setdefault(p.stem, []).append(p)
        for it in items:
            if it.task is None:
                out.append(it)
                continue
            stem = it.rel.rsplit("/", 1)[-1]
            p = by_rel.get(it.rel) or (by_stem[stem][0] if len(by_stem.get(stem, [])) == 1 else None)
            if p is None:
                out.append(_no_file(it, cdir, f"{it.rel}.py or {stem}.py"))
                continue
            _read_candidate(it, p)
            used.add(p)
            out.append(it)
    unused = [p for p in files if p not in used]
    if unused:
        notes.append(f"{len(unused)} file(s) in {cdir} match no task: "
                     + ", ".join(str(p.relative_to(cdir)) for p in unused[:8]) + (" ..." if len(unused) > 8 else ""))
    return out


def _no_file(it: Item, cdir: Path, expected: str) -> Item:
    it.missing = f"no candidate for this task in {cdir} (looked for {expected})"
    return it


def _read_candidate(it: Item, p: Path) -> None:
    try:
        it.candidate = p.read_text()
        it.candidate_path = str(p)
    except (OSError, UnicodeDecodeError) as e:
        it.candidate = None
        it.missing = f"cannot read candidate {p}: {e}"
