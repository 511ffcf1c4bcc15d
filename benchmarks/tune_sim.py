"""Agents and the cost model, compared offline on the H100 tables of `benchmarks/tune_gpu.py`.

  python benchmarks/tune_sim.py TABLE.jsonl[.gz] [--seeds 5] [--budget-share 0.25] [--out sim.json]
  python benchmarks/tune_sim.py benchmarks/tune_h100_table.jsonl.gz --seeds 10   # the H100 table of BENCHMARKS.md
  python benchmarks/tune_sim.py benchmarks/tune_h100_table.jsonl.gz --costmodel-only   # the cost model's scores

Design decisions
- Every agent plays the same recorded game (`measure.TableBackend` over one shape's table: each
  configuration was measured once on the H100), so budgets are equal by construction and the
  comparison costs no device time. Exhaustive autotuning's best is the table's best; an agent's result
  is the table's measurement of the best configuration it measured.
- Leave one shape out: the cost model an agent uses for a shape is trained on the other shapes of
  the same template family only, as it would be for a shape never tuned before. Compiled features of
  the held-out shape are used (they cost a compile, not a measurement).
- Budget: `--budget-share` of the shape's valid configurations (25% by default, the tuning target's
  measurement budget), rounded up. Random search is averaged over 200 draws; the other agents over `--seeds`
  seeds.
- The cost model is scored in two settings, both leaving the shape out of training
  (`costmodel.holdout`): with no measurement of the shape (the GEMM study's setting), and calibrated on
  the one measurement the game always makes first, the shape's default configuration (scored on its
  other configurations). The agents get the uncalibrated predictions: they use only ratios of
  predictions, which a common factor does not change.
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kernelcraft.search.recipes import tunable  # noqa: E402
from kernelcraft.tune import costmodel  # noqa: E402
from kernelcraft.tune.agents import ModelRanked, RandomSearch  # noqa: E402
from kernelcraft.tune.env import ScheduleGame  # noqa: E402
from kernelcraft.tune.measure import TableBackend  # noqa: E402
from kernelcraft.tune.ppo import PPOAgent  # noqa: E402


def load(path: str) -> dict:
    shapes = {}
    text = gzip.decompress(Path(path).read_bytes()).decode() if path.endswith(".gz") else Path(path).read_text()
    for line in text.splitlines():
        r = json.loads(line)
        s = shapes.setdefault(r["shape"], {"kernel": tunable.Kernel.from_json(r["kernel"]), "size": r["size"], "rows": []})
        s["rows"].append(r)
    return {k: v for k, v in shapes.items() if any(r.get("ok") for r in v["rows"])}


def frac_at(trace: list[float], n: int, best: float) -> float:
    return (trace[min(n, len(trace)) - 1] if trace else 0.0) / best


def run(args) -> dict:
    shapes = load(args.table)
    out = {"table": args.table, "budget_share": args.budget_share, "seeds": args.seeds, "costmodel": {}, "shapes": {}}
    recs_all = costmodel.records_of([r for s in shapes.values() for r in s["rows"]])
    for kind in ("gemm", "rownorm"):
        names = [n for n, s in shapes.items() if s["kernel"].kind == kind]
        if len(names) >= 2:
            h = costmodel.holdout(recs_all, kind)
            out["costmodel"][kind] = h
            for label, s in (("no measurement of the shape", h), ("calibrated on its measured default", h["calibrated"])):
                if s:
                    print(f"cost model {kind}, {label}: {s['shapes']} shapes, {s['n']} configurations, R2 {s['r2']:.3f} "
                          f"(log {s['r2_log']:.3f}), mean error {s['mape']:.1%}, within-shape Spearman (median) "
                          f"{s['spearman_within_median']:.3f}", flush=True)
            if args.costmodel_ablation:
                for drift, cal in ((False, False), (True, False), (False, True)):
                    a = costmodel.holdout(recs_all, kind, calibrate=cal, drift=drift)
                    out["costmodel"][f"{kind} drift={drift} fitted_anchor_weight={cal}"] = a
                    for label, s in (("no measurement", a), ("calibrated", a["calibrated"])):
                        print(f"  ablation {kind} drift correction {'on' if drift else 'off'}, anchor weight "
                              f"{'fitted' if cal else '1'}, {label}: R2 {s['r2']:.3f} (log {s['r2_log']:.3f}), "
                              f"mean error {s['mape']:.1%}, Spearman {s['spearman_within_median']:.3f}", flush=True)
        if args.costmodel_only:
            continue
        for name in names:
            t0 = time.time()
            s = shapes[name]
            kernel, size = s["kernel"], s["size"]
            train = [r for r in recs_all if r["kernel"].kind == kind and r["group"] != name]
            configs = tunable.all_configs(kernel, size)
            table = TableBackend(kernel, size, s["rows"])
            exhaustive_cfg, best = table.best()
            n_valid = len(configs)
            budget = math.ceil(args.budget_share * n_valid)
            res = {"kind": kind, "size": size, "configs": n_valid, "budget": budget, "exhaustive_best": best,
                   "exhaustive_config": exhaustive_cfg,
                   "eager_ms": statistics.median(r["ref_ms"] for r in s["rows"] if r.get("ok")),
                   "default_frac": table.measure(tunable.default_config(kernel, size)).speedup / best
                   if table.measure(tunable.default_config(kernel, size)).ok else 0.0, "agents": {}}
            predictor = None
            if len({r["group"] for r in train}) >= 1 and len(train) >= 10:
                model = costmodel.CostModel(kind).fit(train)
                feats = [table.features(c) for c in configs]
                pred = dict(zip((tunable.config_key(c) for c in configs), model.predict(kernel, size, configs, feats)))
                predictor = lambda cs, pred=pred: [pred[tunable.config_key(c)] for c in cs]  # noqa: E731

            def play(agent, seed, pred=None, full=False):
                game = ScheduleGame(lambda k, sh: table, horizon=agent.horizon if hasattr(agent, "horizon") else 64)
                r = agent.search(game, kernel, size, n_valid if full else budget, random.Random(seed), predictor=pred)
                to95 = next((i + 1 for i, v in enumerate(r.trace) if v >= 0.95 * best), None)
                return frac_at(r.trace, budget, best), to95

            runs = {"random": [play(RandomSearch(), 1000 + i) for i in range(200)]}
            if predictor is not None:
                runs["model-ranked"] = [play(ModelRanked(), i, predictor) for i in range(args.seeds)]
                runs["ppo"] = [play(PPOAgent(seed=i, pretrain_episodes=args.pretrain), i, predictor)
                               for i in range(args.seeds)]
                for n in args.ablate_pretrain:
                    runs[f"ppo-pretrain{n}"] = [play(PPOAgent(seed=i, pretrain_episodes=n), i, predictor)
                                                for i in range(args.seeds)]
            runs["ppo-no-model"] = [play(PPOAgent(seed=i), i, None) for i in range(args.seeds)]
            for a, rs in runs.items():
                fr = [f for f, _ in rs]
                hit = [t for _, t in rs if t is not None]
                res["agents"][a] = {"mean_frac": statistics.mean(fr), "min_frac": min(fr), "runs": len(fr),
                                    "reached_95": len(hit) / len(rs),
                                    "median_measurements_to_95": statistics.median(hit) if hit else None}
            out["shapes"][name] = res
            print(f"{name:32s} N={n_valid:3d} B={budget:3d} default {res['default_frac']:.3f} "
                  + " ".join(f"{a} {v['mean_frac']:.3f}" for a, v in res["agents"].items())
                  + f"  ({time.time() - t0:.1f}s)", flush=True)
    summary = {}
    for kind in ("gemm", "rownorm", "all"):
        rows = [r for r in out["shapes"].values() if kind == "all" or r["kind"] == kind]
        if not rows:
            continue
        agents = sorted({a for r in rows for a in r["agents"]})
        summary[kind] = {a: statistics.median(r["agents"][a]["mean_frac"] for r in rows if a in r["agents"])
                         for a in agents}
        summary[kind]["shapes"] = len(rows)
        summary[kind]["default"] = statistics.median(r["default_frac"] for r in rows)
    out["summary"] = summary
    if summary:
        print(json.dumps(summary, indent=1))
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("table")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--budget-share", type=float, default=0.25)
    ap.add_argument("--pretrain", type=int, default=0, help="PPO pretraining episodes in the cost-model simulator")
    ap.add_argument("--ablate-pretrain", type=int, nargs="*", default=[], help="also PPO with these pretraining episodes")
    ap.add_argument("--costmodel-only", action="store_true", help="score the cost model only (no agents)")
    ap.add_argument("--costmodel-ablation", action="store_true",
                    help="also score the cost model without drift correction and/or with anchor weight 1")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    out = run(args)
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
