"""The tasks of a KernelBench-layout directory that the tunable templates cover, and their tuned candidates.

Usage:
  PYTHONPATH=$PWD python3 benchmarks/template_tasks.py select DIR [DIR ...] --out SEL [--regions] [--markdown]
      copy each task whose whole forward one template matches (`recipes/tunematch.py`, chosen by rule: nothing
      here names a task) to SEL/<level dir>/, and print what matched (template, shape, layout); with
      --regions, each task with a GEMM region in a larger forward instead (`recipes/gemmsplice.py`)
  PYTHONPATH=$PWD python3 benchmarks/template_tasks.py render SEL --out CANDS [--gpu NAME]
      write each selected task's candidate as the `recipes` policy renders it on GPU product NAME: `tuned`
      (the whole forward one kernel) where it applies, else `tuned_gemm` (each GEMM region one kernel), with
      the configurations `tunable.lookup_config` finds; as CANDS/<task stem>.py, the layout of
      `kernelcraft bench SEL/<level> --candidates CANDS`

The match runs as the `recipes` analysis does (`rewrite.analyze`: a subprocess, the model on `meta`).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from kernelcraft.search.recipes import rewrite, tunable


def _tasks(dirs: list[Path]):
    for d in dirs:
        for p in sorted(d.glob("*.py"), key=lambda p: (len(p.name.split("_")[0]), p.name)):
            yield d.name, p


def _analysis(path: Path) -> rewrite.Analysis | None:
    try:
        return rewrite.analyze(path.read_text())
    except Exception as e:  # a task the analysis cannot trace is simply not covered
        print(f"{path.name}: not analysed ({type(e).__name__}: {str(e)[:80]})", file=sys.stderr)
        return None


def _match(path: Path) -> tunable.Match | None:
    a = _analysis(path)
    return tunable.Match.from_json(a.tunable[0]) if a is not None and a.tunable else None


def _regions(path: Path) -> list[dict]:
    """The GEMM regions `tuned_gemm` splices into the task's forward (no rules applied), [] if none or if the
    whole forward is one template (the `tuned` recipe's)."""
    a = _analysis(path)
    if a is None or a.tunable:
        return []
    return ((a.variant([]) or {}).get("gemm") or {}).get("regions") or []


def select(dirs: list[Path], out: Path, markdown: bool, regions: bool = False) -> list[dict]:
    rows = []
    for level, path in _tasks(dirs):
        if regions:
            found = _regions(path)
            if not found:
                continue
            row = {"template": f"{len(found)} GEMM region(s)", "shape": [(r.get("match") or {}).get("shape") for r in found]}
        else:
            m = _match(path)
            if m is None:
                continue
            row = {"template": tunable.describe(m), "shape": m.shape}
        (out / level).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, out / level / path.name)
        rows.append({"level": level, "task": path.stem, **row})
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


def render(sel: Path, out: Path, gpu: str) -> int:
    import random

    from kernelcraft.devices import DeviceInfo
    from kernelcraft.search.policies import Context
    from kernelcraft.search.recipes.policy import RecipesPolicy
    from kernelcraft.task import load_task

    out.mkdir(parents=True, exist_ok=True)
    device = DeviceInfo("cuda", gpu, tunable.SMS, None, "9.0")
    n = 0
    for _, path in _tasks(sorted(p for p in sel.iterdir() if p.is_dir())):
        task = load_task(path)
        policy = RecipesPolicy()
        ctx = Context(task=task, device=device, round=1, k=1, history=[], failures=[], sample_exemplars=lambda: [],
                      rng=random.Random(0))
        tokens = policy.tokens(ctx)
        recipe = next((t for t in ("tuned", "tuned_gemm") if t in tokens), None)
        if recipe is None:
            continue
        source, note = policy.render_noted(frozenset([recipe]), ctx)
        (out / path.name).write_text(source)
        print(f"{path.stem}: {recipe}" + (f" — {note}" if note else ""))
        n += 1
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("select")
    s.add_argument("dirs", nargs="+", type=Path)
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--markdown", action="store_true")
    s.add_argument("--regions", action="store_true", help="tasks with a GEMM region in a larger forward instead")
    r = sub.add_parser("render")
    r.add_argument("sel", type=Path)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--gpu", default="NVIDIA H200", help="the GPU product the configurations are looked up for")
    a = ap.parse_args(argv)
    for d in (a.dirs if a.cmd == "select" else [a.sel]):
        if not d.is_dir():
            ap.error(f"not a directory: {d}")
    if a.cmd == "select":
        select(a.dirs, a.out, a.markdown, a.regions)
    else:
        render(a.sel, a.out, a.gpu)
    return 0


if __name__ == "__main__":
    sys.exit(main())
