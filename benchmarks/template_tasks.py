"""The tasks of a KernelBench-layout directory that one tunable template covers, and their tuned candidates.

Usage:
  PYTHONPATH=$PWD python3 benchmarks/template_tasks.py select DIR [DIR ...] --out SEL [--markdown]
      copy each task whose whole forward one template matches (`recipes/tunematch.py`, chosen by rule: nothing
      here names a task) to SEL/<level dir>/, and print what matched (template, shape, layout)
  PYTHONPATH=$PWD python3 benchmarks/template_tasks.py render SEL --out CANDS [--gpu NAME]
      write each selected task's `tuned` candidate (`tunetemplates.candidate_source` at the configuration
      `tunable.lookup_config` finds for GPU product NAME) as CANDS/<task stem>.py, the layout of
      `kernelcraft bench SEL/<level> --candidates CANDS`

The match runs as the `recipes` analysis does (`rewrite.analyze`: a subprocess, the model on `meta`).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from kernelcraft.search.recipes import rewrite, tunable, tunetemplates

LAYOUT = {"a_trans": False, "b_trans": False, "batched": False, "tri": "", "tri_diag": 0, "split_k": 1}


def _tasks(dirs: list[Path]):
    for d in dirs:
        for p in sorted(d.glob("*.py"), key=lambda p: (len(p.name.split("_")[0]), p.name)):
            yield d.name, p


def _match(path: Path) -> tunable.Match | None:
    try:
        found = rewrite.analyze(path.read_text()).tunable
    except Exception as e:  # a task the analysis cannot trace is simply not covered
        print(f"{path.name}: not analysed ({type(e).__name__}: {str(e)[:80]})", file=sys.stderr)
        return None
    return tunable.Match.from_json(found[0]) if found else None


def describe(m: tunable.Match) -> str:
    k = m.kernel
    if k.kind == "rownorm":
        return f"rownorm {k.op}"
    layout = ", ".join(f"{f}={getattr(k, f)}" for f, default in LAYOUT.items() if getattr(k, f) != default)
    return f"gemm{' + epilogue' if k.epilogue != 'out = acc' else ''}" + (f" ({layout})" if layout else "")


def select(dirs: list[Path], out: Path, markdown: bool) -> list[dict]:
    rows = []
    for level, path in _tasks(dirs):
        m = _match(path)
        if m is None:
            continue
        (out / level).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, out / level / path.name)
        rows.append({"level": level, "task": path.stem, "template": describe(m), "shape": m.shape})
    (out / "selected.json").write_text(json.dumps(rows, indent=1) + "\n")
    if markdown:
        print("| level | task | template | shape |\n|---|---|---|---|")
        for r in rows:
            print(f"| {r['level']} | {r['task']} | {r['template']} | {r['shape']} |")
    else:
        for r in rows:
            print(f"{r['level']}/{r['task']}: {r['template']} {r['shape']}")
    print(f"{len(rows)} task(s) covered", file=sys.stderr)
    return rows


def render(sel: Path, out: Path, gpu: str | None) -> int:
    out.mkdir(parents=True, exist_ok=True)
    n = 0
    for _, path in _tasks(sorted(p for p in sel.iterdir() if p.is_dir())):
        m = _match(path)
        if m is None:
            continue
        config, origin = tunable.lookup_config(m.kernel, m.shape, gpu=gpu)
        (out / path.name).write_text(tunetemplates.candidate_source(path.read_text(), m, config, note=origin))
        print(f"{path.stem}: {tunable.config_key(config)} ({origin})")
        n += 1
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("select")
    s.add_argument("dirs", nargs="+", type=Path)
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--markdown", action="store_true")
    r = sub.add_parser("render")
    r.add_argument("sel", type=Path)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--gpu", default=None)
    a = ap.parse_args(argv)
    for d in (a.dirs if a.cmd == "select" else [a.sel]):
        if not d.is_dir():
            ap.error(f"not a directory: {d}")
    if a.cmd == "select":
        select(a.dirs, a.out, a.markdown)
    else:
        render(a.sel, a.out, a.gpu)
    return 0


if __name__ == "__main__":
    sys.exit(main())
