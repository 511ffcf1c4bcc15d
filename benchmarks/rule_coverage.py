"""On how many tasks of a KernelBench-layout directory each `recipes` rewrite rule applies (static: no GPU, no timing).

Usage: PYTHONPATH=$PWD python3 benchmarks/rule_coverage.py [DIR ...] [--json out.json] [--markdown]
       (default DIR: level1 level2 level3 of $KERNELCRAFT_DATASETS/kernelbench)

Each task is traced exactly as the `recipes` policy's analysis does it (`search/recipes/rewrite.py`: the model
and its inputs built on the `meta` device, `torch.fx.symbolic_trace`, shapes from `ShapeProp`), and
`rewrite.applicable_rules` says which rules change its graph (alone, or after the applicable rules before them
in `RULE_ORDER`). Nothing is rendered or run on real data; a task that does not trace is counted as such.
Prints per level: tasks, traced, and for each rule the number of tasks (and their IDs).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_DATASETS = os.environ.get("KERNELCRAFT_DATASETS")
DEFAULT = [Path(_DATASETS) / "kernelbench" / f"level{i}" for i in (1, 2, 3)] if _DATASETS else []


def _timeout(signum, frame):
    raise TimeoutError("analysis took longer than 120 s")


def analyse(path: Path) -> dict:
    from kernelcraft.search.recipes import rewrite

    try:
        signal.signal(signal.SIGALRM, _timeout)
        signal.alarm(120)
        mod = rewrite._load_reference(path.read_text())
        model, inputs = rewrite._build(mod)
        try:
            gm = rewrite._trace(model, inputs)
        except Exception as e:  # noqa: BLE001 - an untraceable reference gets wrappers only
            return {"traced": False, "rules": [], "error": f"{type(e).__name__}: {str(e)[:120]}"}
        return {"traced": True, "rules": rewrite.applicable_rules(model, inputs, base=gm)}
    except Exception as e:  # noqa: BLE001 - reported per task
        return {"traced": False, "rules": [], "error": f"{type(e).__name__}: {str(e)[:120]}"}
    finally:
        signal.alarm(0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="*", type=Path, default=DEFAULT)
    ap.add_argument("--json", type=Path, help="write every task's rules here")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = ap.parse_args(argv)
    if not args.dirs:
        ap.error("name the KernelBench level directories, or set KERNELCRAFT_DATASETS")
    import torch

    from kernelcraft.search.recipes.rewrite import RULE_ORDER
    torch.set_num_threads(1)
    rows = {}
    for d in args.dirs:
        if not d.is_dir():
            print(f"not a directory: {d}", file=sys.stderr)
            return 2
        for path in sorted(d.glob("*.py"), key=lambda p: (int(re.match(r"\d+", p.name).group()) if re.match(r"\d+", p.name) else 0, p.name)):
            rows[f"{d.name}/{path.name}"] = analyse(path)
            print(f"{d.name}/{path.name}: {','.join(rows[f'{d.name}/{path.name}']['rules']) or '-'}", file=sys.stderr)
    levels = sorted({k.split("/")[0] for k in rows})
    table = {}
    for lv in levels:
        mine = {k: v for k, v in rows.items() if k.startswith(lv + "/")}
        per_rule = {r: sorted((re.match(r"\d+", k.split("/")[1]) or [k])[0] for k, v in mine.items() if r in v["rules"])
                    for r in RULE_ORDER}
        table[lv] = {"tasks": len(mine), "traced": sum(v["traced"] for v in mine.values()),
                     "any_rewrite": sum(bool(v["rules"]) for v in mine.values()), "rules": per_rule}
    if args.json:
        args.json.write_text(json.dumps({"tasks": rows, "levels": table}, indent=1))
    if args.markdown:
        print("| rule | " + " | ".join(levels) + " | total |")
        print("|---|" + "---|" * (len(levels) + 1))
        for r in RULE_ORDER:
            counts = [len(table[lv]["rules"][r]) for lv in levels]
            print(f"| `{r}` | " + " | ".join(map(str, counts)) + f" | {sum(counts)} |")
        print("| any rewrite | " + " | ".join(str(table[lv]["any_rewrite"]) for lv in levels)
              + f" | {sum(table[lv]['any_rewrite'] for lv in levels)} |")
        print("| traced / tasks | " + " | ".join(f"{table[lv]['traced']}/{table[lv]['tasks']}" for lv in levels) + " | |")
    else:
        for lv in levels:
            t = table[lv]
            print(f"{lv}: {t['tasks']} tasks, {t['traced']} traced, {t['any_rewrite']} with a rewrite")
            for r in RULE_ORDER:
                if t["rules"][r]:
                    print(f"  {r:16s} {len(t['rules'][r]):3d}  ids {' '.join(t['rules'][r])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
