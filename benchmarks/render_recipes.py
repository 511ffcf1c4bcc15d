"""Render the `recipes` policy's first GPU candidates for a KernelBench-layout directory, offline (CPU only),
so a GPU machine can judge them with `kernelcraft bench DIR --candidates OUT/<slot>` without searching.

Usage: PYTHONPATH=$PWD python3 benchmarks/render_recipes.py DIR [DIR ...] --out OUT [--k 3] [--device-name "NVIDIA H100"]
       [--recipe channels_last+cudnn_benchmark ...]

For every task the policy sees a fresh run on a CUDA device and proposes its first k candidates, what
`kernelcraft optimize --policy recipes --budget k` would evaluate first: on a GPU the baselines form a round of
their own, and the rest comes from the next round as if both baselines had tied eager (offline nothing is
measured; a real run ranks by what they measured). Written:
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


def _ctx(task, device, k, history):
    from kernelcraft.search.exemplars import Exemplar, contrastive
    from kernelcraft.search.policies import Context

    rng = random.Random(0)
    items = [Exemplar(r.id, r.source, r.speedup, [], r.meta) for r in history]
    return Context(task=task, device=device, round=len(history) + 1, k=k, history=history, failures=[],
                   sample_exemplars=lambda: contrastive(items, rng, n=2, tau=1.0), rng=rng)


def _first_proposals(pol, task, device, k):
    """The policy's first k proposals: its first round, then, when that was the GPU's baselines alone, the next
    round with each of them recorded as measured at 1.0x."""
    from kernelcraft.search.rundb import Row

    props = pol.propose(_ctx(task, device, k, []))
    if 0 < len(props) < k:
        tied = [Row(id=i + 1, round=1, policy="recipes", source=p.source, sha256=None, state="done", status="correct",
                    speedup=1.0, ci_low=0.95, ci_high=1.05, meta=p.meta) for i, p in enumerate(props)]
        props += pol.propose(_ctx(task, device, k - len(props), tied))
    return props


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--k", type=int, default=3, help="how many first proposals (the optimize budget below 4)")
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
                ctx = _ctx(task, device, args.k, [])
                a = pol.analysis(ctx)
                row = {"task": f"{d.name}/{path.name}", "rules": a.rules, "error": a.error, "round": []}
                try:
                    props = _first_proposals(pol, task, device, args.k)
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
