"""What the commands check before anything runs, and what they clean up when a usage error stops them anyway.

Bad inputs are one-line usage errors (naming the file, or the closest built-in names) before a worker starts
or a directory is created. `no_leftovers` removes a directory this invocation created when a usage error ends
it, unless it holds a finished evaluation or a result (a file this module does not know is kept).
Rationale: docs/design/cli.md#checks
"""
from __future__ import annotations

import contextlib
import difflib
import json
import os
import shutil
import sqlite3
from pathlib import Path

import typer

from kernelcraft.cli.common import usage_error

# files a run writes before it has evaluated anything (the pins, the locks, the logs while empty)
_BOOKKEEPING = {"run.db", "run.lock", "bench.lock", "bench.json", "verdicts.jsonl", "baselines.jsonl",
                "run.db-journal", "run.db-wal", "run.db-shm"}


# ---- names ---------------------------------------------------------------------------------------------------

def builtin_task_names() -> list[str]:
    from kernelcraft.task import TIERS, builtin_names

    return [n for tier in TIERS for n in builtin_names(tier)]


def did_you_mean(given: str, names: list[str], n: int = 3, cutoff: float = 0.6) -> str:
    """'; did you mean a, b or c?' for the names closest to `given` ('' when none is close). A name given
    without its tier (`level1/reluu`) is compared with, and answered in, the same form; a bare task name
    (`reluu`) with each name's last part, answered with the whole names. The last part and what leads to it
    are compared apart, so a shared `tiny/level1/` does not make every task of the level close."""
    want = given.strip("/").split("/")
    depth = len(want)
    scored: dict[str, float] = {}
    for name in names:
        parts = name.split("/")
        if len(parts) < depth:
            continue
        tail = parts[-depth:]
        last = difflib.SequenceMatcher(None, want[-1], tail[-1]).ratio()
        lead = difflib.SequenceMatcher(None, "/".join(want[:-1]), "/".join(tail[:-1])).ratio() if depth > 1 else 1.0
        if last >= cutoff and lead >= cutoff:
            shown = name if depth == 1 else "/".join(tail)
            scored[shown] = max(scored.get(shown, 0.0), last + lead)
    found = sorted(scored, key=lambda k: -scored[k])[:n]
    if not found:
        return ""
    return "; did you mean " + (found[0] if len(found) == 1 else ", ".join(found[:-1]) + " or " + found[-1]) + "?"


# ---- files ---------------------------------------------------------------------------------------------------

def unreadable(what: str, path, e: Exception, expected: str = "Python source") -> str:
    """Why the file `path` (a `what`, which should hold `expected`) could not be read, in words that name it."""
    if isinstance(e, UnicodeDecodeError):
        return f"{what} {path} is not UTF-8 text ({e.reason} at byte {e.start}): is it {expected}?"
    if isinstance(e, IsADirectoryError):
        return f"{what} {path} is a directory, not a file"
    return f"cannot read the {what} {path}: {getattr(e, 'strerror', None) or e}"


def load_task(spec: str):
    """The task `spec` names (file or built-in name), or a usage error that says what is wrong with it."""
    from kernelcraft.task import TaskError, load_task as load

    try:
        return load(spec)
    except TaskError as e:
        hint = "" if str(spec).endswith(".py") else did_you_mean(str(spec), builtin_task_names())
        usage_error(str(e) + hint)
    except (UnicodeDecodeError, OSError) as e:
        usage_error(unreadable("task file", spec, e))


def readable_file(path: Path, what: str) -> None:
    """A usage error unless `path` is a file of UTF-8 text."""
    if not path.exists():
        usage_error(f"{what} file not found: {path}")
    try:
        path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError) as e:
        usage_error(unreadable(what, path, e))


# ---- devices, policies, numbers ------------------------------------------------------------------------------

def device(spec: str | None, flag: str = "--device") -> str:
    """The device `spec` resolves to ('cpu' | 'cuda:N'), or a usage error (a GPU asked for where none is visible)."""
    from kernelcraft import devices

    try:
        return devices.resolve(spec)[0]
    except ValueError as e:
        if spec and devices.kind(spec) == "cuda" and devices.visible_devices() == ["cpu"]:
            usage_error(f"{flag} {spec}: no CUDA GPU is visible on this host; use --device cpu here, or run on a "
                        "GPU host")
        usage_error(f"{flag}: {e}")


def policy(spec: str, build: bool = True, **options):
    """The policy `spec` names, built, or a usage error. With `build` False only what is cheap to find is
    checked (the run builds the policy): `hf:PATH` loads a model, so its directory is checked instead."""
    from kernelcraft.search.policies import PolicyError, make_policy, policy_names

    prefix, _, arg = spec.partition(":")
    if not build and prefix == "hf" and arg:
        if not Path(arg).is_dir():
            usage_error(f"{spec}: not a directory with a saved model (config.json, weights, tokenizer)")
        return None
    if not build and prefix in policy_names() and prefix not in ("recipes", "openai", "hf"):
        return None  # a registered policy: its factory may be costly
    try:
        return make_policy(spec, **options)
    except PolicyError as e:
        usage_error(str(e))


def positive(value: float | None, flag: str, unit: str = "") -> None:
    """A usage error unless `value` (when given) is above zero."""
    if value is not None and not value > 0:
        usage_error(f"{flag} must be more than 0{unit}, not {value:g}")


def choice(value: str, flag: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        usage_error(f"{flag} must be {', '.join(allowed[:-1])} or {allowed[-1]}, not {value!r}")


# ---- output directories --------------------------------------------------------------------------------------

def out_dir(path: Path, flag: str = "--out") -> Path:
    """Create the output directory `path` (or accept an existing one), or a usage error naming why it cannot be."""
    if path.exists() and not path.is_dir():
        usage_error(f"{flag} {path}: exists and is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        usage_error(f"{flag} {path}: cannot create the directory: {e.strerror or e}")
    if not os.access(path, os.W_OK | os.X_OK):
        usage_error(f"{flag} {path}: the directory is not writable")
    return path


def _first_missing(path: Path) -> Path | None:
    """The outermost directory of `path` that does not exist yet (None: `path` exists)."""
    path = Path(os.path.abspath(path))
    if path.exists():
        return None
    while not path.parent.exists() and path.parent != path:
        path = path.parent
    return path


def _run_db_has_work(db: Path) -> bool:
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    except sqlite3.Error:
        return True
    try:
        done = conn.execute("SELECT count(*) FROM candidates WHERE verdict IS NOT NULL").fetchone()[0]
        confirmed = conn.execute("SELECT count(*) FROM confirmations").fetchone()[0]
        control = conn.execute("SELECT count(*) FROM meta WHERE key = 'null_control'").fetchone()[0]
        return bool(done or confirmed or control)
    except sqlite3.Error:
        return True  # not a schema this module knows: keep it
    finally:
        conn.close()


def _log_has_work(log: Path) -> bool:
    """A bench log with a record that cost an evaluation here (bench-only records and copies from the shared
    baseline cache cost nothing)."""
    for line in log.read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and not rec.get("cached") and rec.get("status") not in ("input_error", "no_candidate"):
            return True
    return False


def _worth_keeping(d: Path) -> bool:
    for p in d.rglob("*"):
        if p.is_dir():
            continue
        if p.name not in _BOOKKEEPING:
            return True
        if p.name == "run.db" and _run_db_has_work(p):
            return True
        if p.suffix == ".jsonl" and _log_has_work(p):
            return True
    return False


@contextlib.contextmanager
def no_leftovers(path: Path):
    """Remove `path` (and the parents this invocation created for it) when a usage error ends the block and
    nothing in it is worth keeping (docs/design/cli.md#checks)."""
    top = _first_missing(path)
    try:
        yield
    except typer.Exit as e:
        if e.exit_code == 2 and top is not None and top.is_dir() and not _worth_keeping(top):
            shutil.rmtree(top, ignore_errors=True)
        raise
