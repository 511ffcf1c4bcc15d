"""Render the `recipes` policy's first-round GPU candidates for a KernelBench-layout directory, offline (CPU only),
so a GPU machine can judge them with `kernelcraft bench DIR --candidates OUT/<slot>` without searching.

Usage: PYTHONPATH=$PWD python3 benchmarks/render_recipes.py DIR [DIR ...] --out OUT [--k 3] [--device-name "NVIDIA H100"]
       [--recipe channels_last+cudnn_benchmark ...]

For every task the policy sees a fresh run on a CUDA device (no history) and proposes its first round of k
candidates, exactly what `kernelcraft optimize --policy recipes --budget k` would evaluate first. Written:
`OUT/<level>/composite/<task stem>.py` (the composite recipe: every rendered rewrite + compile:default +
cudagraph, when the policy proposes one), `OUT/<level>/rewrites/<task stem>.py` (the largest rendered rewrite
set alone, eager: no compile, no graph) and `OUT/manifest.jsonl` (one line per task: the recipes of the round,
the applicable rules, analysis errors). Each `--recipe` (tokens joined by `+`) is also rendered as it is, for
every task where the policy would call it valid, into `OUT/<level>/<recipe>/<task stem>.py`: one recipe judged
across a suite (`bench DIR --candidates OUT/<level>/<recipe>`) says where its prior is wrong. Tasks whose analysis fails get no file (bench counts them as
`no_candidate`).
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path


def _ctx(task, device, k):
    from kernelcraft.search.policies import Context

    rng = random.Random(0)
    return Context(task=task, device=device, round=1, k=k, history=[], failures=[], sample_exemplars=lambda: [],
                   rng=rng)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--k", type=int, default=3, help="first-round size (the optimize budget when it is below 4)")
    ap.add_argument("--device-name", default="NVIDIA H100 80GB HBM3")
    ap.add_argument("--recipe", action="append", default=[], help="a recipe to render as it is (tokens joined by +)")
    args = ap.parse_args(argv)
    from kernelcraft.devices import DeviceInfo
    from kernelcraft.search.recipes.policy import RecipesPolicy
    from kernelcraft.task import load_task

    device = DeviceInfo("cuda", args.device_name, 132, 79.0, "9.0")
    pol = RecipesPolicy()
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "manifest.jsonl", "w") as manifest:
        for d in args.dirs:
            for path in sorted(d.glob("*.py")):
                task = load_task(path)
                ctx = _ctx(task, device, args.k)
                a = pol.analysis(ctx)
                row = {"task": f"{d.name}/{path.name}", "rules": a.rules, "error": a.error, "round": []}
                try:
                    props = pol.propose(ctx)
                except Exception as e:  # noqa: BLE001 - reported per task
                    row["error"] = f"{type(e).__name__}: {e}"
                    props = []
                for p in props:
                    row["round"].append(p.meta["recipe"])
                    if p.meta.get("operator") == "compose":
                        (args.out / d.name / "composite").mkdir(parents=True, exist_ok=True)
                        (args.out / d.name / "composite" / path.name).write_text(p.source)
                rewrites = max((frozenset(f"rewrite:{r}" for r in key.split("+")) for key in a.variants if key),
                               key=lambda s: (len(s), sorted(s)), default=None)
                if rewrites:
                    (args.out / d.name / "rewrites").mkdir(parents=True, exist_ok=True)
                    (args.out / d.name / "rewrites" / path.name).write_text(pol.render(rewrites, ctx))
                    row["rewrites"] = sorted(rewrites)
                usable = set(pol.tokens(ctx))
                for spec in args.recipe:
                    recipe = frozenset(spec.split("+"))
                    if not recipe <= usable or not pol.valid(recipe, ctx):
                        continue
                    try:
                        source = pol.render(recipe, ctx)
                    except ValueError:
                        continue
                    (args.out / d.name / spec).mkdir(parents=True, exist_ok=True)
                    (args.out / d.name / spec / path.name).write_text(source)
                    row.setdefault("recipes", []).append(spec)
                manifest.write(json.dumps(row) + "\n")
                manifest.flush()
                print(f"{row['task']}: {' | '.join('+'.join(r) for r in row['round']) or row['error']}", file=sys.stderr)
    n = {p.parent.name: 0 for p in args.out.glob("*/*/*.py")}
    for p in args.out.glob("*/*/*.py"):
        n[p.parent.name] += 1
    print(json.dumps({"out": str(args.out), "files": n}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
