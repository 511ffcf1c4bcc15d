"""Training data (`kernelcraft train data`): correct candidates with the prompts that produced them.

Sources: run databases (their `correct` candidates) and pairs files (a row only with this judge's `correct`
verdict, at its lowest speedup). Deduplicated by (task, normalised source), the fastest kept; split by task
(`task_key`: the reference's AST with its sizes blanked) through a seeded hash, so a task never crosses the
split as data grows. Writes OUT/data/{train,heldout}.jsonl and the dataset card.

Rationale: docs/design/train.md#data
"""
from __future__ import annotations

import ast
import gzip
import hashlib
import json
import time
from collections import Counter
from pathlib import Path

from kernelcraft.bench.sources import BenchError, resolve
from kernelcraft.candidate import normalized_hash
from kernelcraft.search.rundb import DB_NAME, RunDB
from kernelcraft.train.models import TrainError
from kernelcraft.train.prompting import (Described, completion_text, device_from_verdict, extract_code, messages,
                                         messages_from_stored)
from kernelcraft.version import __version__

TRAIN, HELDOUT = "train.jsonl", "heldout.jsonl"


def task_key(source: str) -> str:
    """A task's identity for the split: its reference code with the values of module-level constants
    (the problem sizes) blanked, as an AST (comments, formatting and sizes do not count)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return "text:" + hashlib.sha256(source.encode()).hexdigest()[:24]
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            try:
                ast.literal_eval(node.value)
            except ValueError:
                continue
            node.value = ast.Constant(None)
    return "task:" + hashlib.sha256(ast.dump(tree).encode()).hexdigest()[:24]


def is_heldout(key: str, fraction: float, seed: int = 0) -> bool:
    h = int.from_bytes(hashlib.sha256(f"{seed}\0{key}".encode()).digest()[:8], "big")
    return h / 2 ** 64 < fraction


def _example(*, task: str, source: str, code: str, speedup: float, prompt: list[dict], completion: str,
              origin: str, corpus: str) -> dict:
    return {"prompt": prompt, "completion": [{"role": "assistant", "content": completion}], "task": task,
            "task_key": task_key(source), "task_source": source, "candidate": code, "speedup": speedup,
            "origin": origin, "corpus": corpus, "norm_hash": normalized_hash(code)}


def from_run_db(run_dir: Path, min_speedup: float, stats: Counter, prompt_settings=None) -> list[dict]:
    db = RunDB(run_dir)
    try:
        task, source = db.get_meta("task"), db.get_meta("task_source")
        device = Described(db.get_meta("device") or "unknown device")
        rows = db.rows()
    finally:
        db.close()
    if not source:
        raise TrainError(f"{run_dir}: the run database records no task source")
    out = []
    for r in rows:
        stats["candidates"] += 1
        if not r.correct:
            continue
        stats["correct"] += 1
        if r.speedup < min_speedup:
            stats["below_min_speedup"] += 1
            continue
        prompt = messages_from_stored(r.prompt or "")
        reply_code, _ = extract_code(r.reply or "")
        if prompt and reply_code and normalized_hash(reply_code) == normalized_hash(r.source):
            completion = r.reply  # the model's own answer, as it was judged
            stats["with_reply"] += 1
        else:
            prompt = prompt or messages(source, [], device, prompt_settings)
            completion = completion_text(r.source, r.speedup, device.describe(), r.meta)
        out.append(_example(task=task or run_dir.name, source=source, code=r.source, speedup=r.speedup,
                            prompt=prompt, completion=completion, origin=f"{run_dir / DB_NAME}#{r.id}",
                            corpus=str(run_dir)))
    return out


def verdict_index(paths: list[Path]) -> dict[tuple[str, str], list[dict]]:
    """(task SHA-256, candidate SHA-256) -> the verdict records of bench output files."""
    index: dict[tuple[str, str], list[dict]] = {}
    for p in paths:
        try:  # `kernelcraft bench`'s verdicts.jsonl, or the same gzip-compressed (.gz), as kept beside a dataset
            lines = (gzip.decompress(p.read_bytes()).decode() if p.suffix == ".gz" else p.read_text()).splitlines()
        except (OSError, EOFError, UnicodeDecodeError) as e:
            raise TrainError(f"cannot read verdicts {p}: {e}") from None
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                raise TrainError(f"{p}:{n}: not a JSON line (expected `kernelcraft bench` verdicts.jsonl)") from None
            if rec.get("task_sha256") and rec.get("candidate_sha256") and "baseline" not in rec:
                index.setdefault((rec["task_sha256"], rec["candidate_sha256"]), []).append(rec)
    return index


def from_pairs(path: Path, verdict_paths: list[Path], min_speedup: float, stats: Counter,
               prompt_settings=None) -> list[dict]:
    try:
        src = resolve(str(path))
    except BenchError as e:
        raise TrainError(str(e)) from None
    if src.kind != "pairs":
        raise TrainError(f"{path}: not a pairs file (JSON lines with ref_code and custom_code)")
    index = verdict_index(verdict_paths)
    out = []
    for it in src.items:
        stats["rows"] += 1
        if it.error or it.task is None or it.candidate is None or it.candidate.strip() == "None":
            stats["unusable_or_no_candidate"] += 1
            continue
        recs = index.get((it.task.sha256, hashlib.sha256(it.candidate.encode()).hexdigest()), [])
        if not recs:
            stats["no_verdict"] += 1
            continue
        stats["with_verdict"] += 1
        statuses = {r.get("status") for r in recs}
        if statuses != {"correct"}:
            stats["conflicting_verdicts" if "correct" in statuses else "not_correct"] += 1
            continue
        stats["correct"] += 1
        speedup = min(r["speedup"] for r in recs)  # several verdicts agreeing: the lowest speedup
        if speedup < min_speedup:
            stats["below_min_speedup"] += 1
            continue
        device = device_from_verdict(recs[0])
        out.append(_example(task=it.name, source=it.task.source, code=it.candidate, speedup=speedup,
                            prompt=messages(it.task.source, [], device, prompt_settings),
                            completion=completion_text(it.candidate, speedup, device.describe()),
                            origin=f"{path}:{it.origin.rsplit(':', 1)[-1]}", corpus=str(path)))
    return out


def deduplicate(examples: list[dict]) -> tuple[list[dict], int]:
    best: dict[tuple[str, str], dict] = {}
    for e in examples:
        k = (e["task_key"], e["norm_hash"])
        if k not in best or e["speedup"] > best[k]["speedup"]:
            best[k] = e
    kept = sorted(best.values(), key=lambda e: (e["task_key"], -e["speedup"], e["origin"]))
    return kept, len(examples) - len(kept)


def _licence(path: Path) -> str:
    for name in ("LICENSE", "LICENSE.md", "LICENSE.txt", "COPYING"):
        f = path.parent / name
        if f.is_file():
            first = next((ln.strip() for ln in f.read_text(errors="replace").splitlines() if ln.strip()), "")
            return f"{first} ({f})"
    return "unknown (no LICENSE beside the file)"


def run_dirs(paths: list[Path]) -> list[Path]:
    found = []
    for p in paths:
        if (p / DB_NAME).is_file():
            found.append(p)
        elif p.is_dir():
            found += sorted(q.parent for q in p.rglob(DB_NAME))
        else:
            raise TrainError(f"data.run_dbs: {p} is not a directory")
    return found


def build_dataset(cfg) -> dict:
    """Read every source, deduplicate, split by task, write OUT/data/{train,heldout}.jsonl and the card."""
    d = cfg.data
    sources, examples = [], []
    for rd in run_dirs([cfg.path(p) for p in d.run_dbs]):
        stats: Counter = Counter()
        got = from_run_db(rd, d.min_speedup, stats, cfg.prompt)
        examples += got
        sources.append({"kind": "run_db", "path": str(rd), "examples": len(got), **stats,
                        "licence": "produced by this project's own runs"})
    for ps in d.pairs:
        stats = Counter()
        path = cfg.path(ps.path)
        got = from_pairs(path, [cfg.path(v) for v in ps.verdicts], d.min_speedup, stats, cfg.prompt)
        examples += got
        sources.append({"kind": "pairs", "name": ps.name or path.stem, "path": str(path),
                        "verdicts": [str(cfg.path(v)) for v in ps.verdicts], "examples": len(got), **stats,
                        "licence": _licence(path)})
    if not sources:
        raise TrainError("no data sources: give data.run_dbs and/or data.pairs in the config")
    kept, dropped = deduplicate(examples)
    split = {"train": [], "heldout": []}
    for e in kept:
        split["heldout" if is_heldout(e["task_key"], d.heldout_fraction, d.seed) else "train"].append(e)
    out = cfg.out_dir / "data"
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", split["train"]), ("heldout", split["heldout"])):
        tmp = out / f"{name}.jsonl.partial"
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
        tmp.replace(out / f"{name}.jsonl")
    card = {"created_at": time.time(), "kernelcraft": __version__, "sources": sources,
            "examples_read": len(examples), "duplicates_dropped": dropped,
            "splits": {k: {"examples": len(v), "tasks": len({e["task_key"] for e in v})} for k, v in split.items()},
            "settings": d.model_dump(), "licence": d.licence,
            "leak_check": not ({e["task_key"] for e in split["train"]} & {e["task_key"] for e in split["heldout"]})}
    (out / "card.json").write_text(json.dumps(card, indent=2) + "\n")
    (out / "card.md").write_text(render_card(card))
    return card


def render_card(card: dict) -> str:
    lines = ["# kernelcraft training data", "",
             f"Built {time.strftime('%Y-%m-%d %H:%M', time.gmtime(card['created_at']))} UTC by kernelcraft "
             f"{card['kernelcraft']}. Every example is a candidate our judge found `correct`, with the prompt "
             "that produced it (or the search's prompt without exemplars) and its answer.", "",
             "## Splits (by task: no task is on both sides)", "", "| split | examples | tasks |", "|---|---|---|"]
    lines += [f"| {k} | {v['examples']} | {v['tasks']} |" for k, v in card["splits"].items()]
    lines += ["", f"{card['examples_read']} examples read, {card['duplicates_dropped']} duplicates dropped "
              "(same task, same normalised source: the fastest kept).", "", "## Sources", ""]
    keys = ["rows", "unusable_or_no_candidate", "no_verdict", "with_verdict", "not_correct", "conflicting_verdicts",
            "candidates", "correct", "with_reply", "below_min_speedup", "examples"]
    for s in card["sources"]:
        lines.append(f"- **{s['kind']}** `{s['path']}` — " + ", ".join(f"{k.replace('_', ' ')}: {s[k]}"
                                                                      for k in keys if k in s))
        lines.append(f"  licence: {s['licence']}")
        if s.get("verdicts"):
            lines.append("  verdicts: " + ", ".join(f"`{v}`" for v in s["verdicts"]))
    if card.get("licence"):
        lines += ["", card["licence"]]
    return "\n".join(lines) + "\n"


def load_examples(path: Path) -> list[dict]:
    if not path.is_file():
        raise TrainError(f"{path} does not exist: run `kernelcraft train data CONFIG` first")
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
