"""Run rendered candidates against their references on the CPU at reduced sizes, before a GPU judges them.

Usage: PYTHONPATH=$PWD python3 benchmarks/check_renders.py RENDERS TASKS [--shrink 64] [--skip WORD ...]
       [--timeout 120] [--json OUT]

RENDERS holds candidates named like their tasks (`render_recipes.py`'s `OUT/<level>/<slot>`); TASKS is the task
directory. Each candidate runs in a subprocess of its own, under Triton's interpreter (`TRITON_INTERPRET=1`: the
generated kernels run on the CPU), with every integer module global of the task at or above 64 divided by
`--shrink` (at least 16; so are such tuples). Reference and candidate are built from one seed and loaded with the
same state, in train mode; on two draws each call runs under the same RNG seed (dropout draws alike).

Per file: `match` with the largest error relative to the output's largest magnitude, `MISMATCH` (beyond 1e-3),
`error` (the candidate failed where the reference ran), `unchecked` (the reference itself fails at the reduced
sizes: a shape the division broke) or `timeout`. Not a judge: a launcher that hands small shapes to PyTorch is
checked only on that path, and a file whose name contains a `--skip` word is not run. Exit 1 on any MISMATCH or
error.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import types
from pathlib import Path

TOLERANCE = 1e-3  # relative to the reference output's largest magnitude
DRAWS = 2


def _shrunk(value, by: int):
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value >= 64:
        return max(16, value // by)
    if isinstance(value, tuple) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return tuple(_shrunk(v, by) for v in value)
    return value


def check_one(candidate: Path, task: Path, shrink: int) -> dict:
    """One candidate against its task, in this process: the row the table prints."""
    import torch

    torch.set_num_threads(1)
    ns = types.ModuleType("kc_check").__dict__
    exec(compile(task.read_text(), str(task), "exec"), ns)
    for k, v in list(ns.items()):
        if not k.startswith("_"):
            ns[k] = _shrunk(v, shrink)
    reference = ns["Model"]
    try:
        init = ns["get_init_inputs"]()
        torch.manual_seed(0)
        ref = reference(*init).train()
        draws = []
        for d in range(DRAWS):
            torch.manual_seed(1 + d)
            draws.append(ns["get_inputs"]())
        want = []
        for xs in draws:
            torch.manual_seed(99)
            with torch.no_grad():
                want.append(_flat(ref(*_copies(xs))))
    except Exception as e:  # noqa: BLE001 - the task itself at reduced sizes
        return {"status": "unchecked", "why": f"{type(e).__name__}: {str(e)[:200]}"}
    try:
        exec(compile(candidate.read_text(), str(candidate), "exec"), ns)  # its Model is the reference's own source
        torch.manual_seed(0)
        new = ns["ModelNew"](*init).train()
        new.load_state_dict(ref.state_dict())
        worst = 0.0
        for xs, outs in zip(draws, want):
            torch.manual_seed(99)
            with torch.no_grad():
                got = _flat(new(*_copies(xs)))
            if [tuple(g.shape) for g in got] != [tuple(w.shape) for w in outs]:
                return {"status": "MISMATCH", "why": f"shapes {[tuple(g.shape) for g in got]}, "
                                                     f"expected {[tuple(w.shape) for w in outs]}"}
            for g, w in zip(got, outs):
                scale = max(float(w.double().abs().max()) if w.numel() else 0.0, 1e-6)
                worst = max(worst, float((g.double() - w.double()).abs().max()) / scale if w.numel() else 0.0)
    except Exception as e:  # noqa: BLE001 - the candidate's failure is the finding
        return {"status": "error", "why": f"{type(e).__name__}: {str(e)[:200]}"}
    return {"status": "match" if worst <= TOLERANCE else "MISMATCH", "rel_err": worst}


def _copies(xs):
    return [x.clone() if hasattr(x, "clone") else x for x in xs]


def _flat(out) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("renders", type=Path)
    ap.add_argument("tasks", type=Path)
    ap.add_argument("--shrink", type=int, default=64)
    ap.add_argument("--skip", action="append", default=[], help="skip files whose name contains this")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per candidate")
    ap.add_argument("--json", type=Path, help="write the rows here")
    ap.add_argument("--one", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(check_one(args.one[0], args.one[1], args.shrink)))
        return 0
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    rows = []
    for cand in sorted(args.renders.glob("*.py")):
        task = args.tasks / cand.name
        if any(w in cand.name for w in args.skip):
            row = {"status": "skipped"}
        elif not task.exists():
            row = {"status": "unchecked", "why": f"no task {task}"}
        else:
            try:
                r = subprocess.run([sys.executable, __file__, str(args.renders), str(args.tasks), "--one", str(cand),
                                    str(task), "--shrink", str(args.shrink)],
                                   capture_output=True, text=True, timeout=args.timeout, env=env)
                last = r.stdout.strip().splitlines()[-1:] or [""]
                row = json.loads(last[0]) if r.returncode == 0 and last[0].startswith("{") else \
                    {"status": "error", "why": r.stderr.strip()[-300:]}
            except subprocess.TimeoutExpired:
                row = {"status": "timeout"}
        row["file"] = cand.name
        rows.append(row)
        err = f"rel {row['rel_err']:.2e}" if "rel_err" in row else row.get("why", "")
        print(f"{cand.name:70s} {row['status']:10s} {err}", flush=True)
    counts = {s: sum(r["status"] == s for r in rows) for s in sorted({r["status"] for r in rows})}
    print(json.dumps(counts))
    if args.json:
        args.json.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return 1 if counts.get("MISMATCH") or counts.get("error") else 0


if __name__ == "__main__":
    sys.exit(main())
