"""Does contrastive RL learn here? The stand-in experiment: split, warm-up, arms x seeds, baselines, CIs.

`kernelcraft train learn --out runs/learn` runs it on the CPU tiny tier (the GPU tier with `--device cuda`).
Tasks are split within each level; every valid program is judged once into the verdict cache before any run,
so arms and seeds see the same measurements; the baselines (the `recipes` search, random programs) get the
same evaluations per held-out task. Output: OUT/summary.json, table.json, ablation.md, a run per arm and seed.

Rationale: docs/design/train.md#ablation
"""
from __future__ import annotations

import json
import math
import random
import statistics
import time
from pathlib import Path
from types import SimpleNamespace

from kernelcraft.search import exemplars as ex
from kernelcraft.task import Task, builtin_names, load_task
from kernelcraft.train.config import RewardSettings
from kernelcraft.train.judgecache import CachedJudge, LocalJudge
from kernelcraft.train.learn import ARMS, Run, RunSettings, Setup, geomean, program_table
from kernelcraft.train.programs import EAGER, Compiler, fmt
from kernelcraft.train.rewards import KernelReward
from kernelcraft.train.standin import Vocab

T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
JUDGE = {"trials": 2, "time_budget_s": 0.2, "min_rounds": 3, "timeout_s": 120}


def ci95(xs: list[float]) -> tuple[float, float]:
    """(mean, half-width of the 95% t-interval); half-width 0 for one value."""
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, 0.0
    return m, T95.get(len(xs) - 1, 1.96) * statistics.stdev(xs) / math.sqrt(len(xs))


def split(tasks: list[Task], fraction: float, seed: int) -> tuple[list[Task], list[Task]]:
    train, held = [], []
    for level in sorted({t.level or 0 for t in tasks}):
        group = sorted((t for t in tasks if (t.level or 0) == level), key=lambda t: t.name)
        random.Random(f"split:{seed}:{level}").shuffle(group)
        k = max(1, round(fraction * len(group))) if len(group) > 1 else 0
        held += group[:k]
        train += group[k:]
    return train, held


def resolve(spec: str) -> list[Task]:
    """`tiny`, `tiny/level1`, or a comma list of built-in names."""
    if "," not in spec and spec.split("/")[0] in ("tiny", "gpu") and spec.count("/") <= 1:
        tier, _, lv = spec.partition("/")
        return [load_task(n) for n in builtin_names(tier, int(lv[-1]) if lv else None)]
    return [load_task(n.strip()) for n in spec.split(",") if n.strip()]


def recipes_search(compiler: Compiler, reward: KernelReward, task: Task, n: int, seed: int) -> list[float]:
    """The recipes policy's own loop at one proposal per round for `n` evaluations: the best speedup after
    each (1.0 while nothing correct: the reference is kept)."""
    info = compiler.info(task)
    pol = compiler.recipes
    rows, best, out = [], 1.0, []
    for rnd in range(n):
        rng = random.Random(f"{seed}:{rnd}")
        items = [ex.Exemplar(r.id, r.source, r.speedup, [], r.meta) for r in rows if r.correct]
        ctx = SimpleNamespace(**vars(info.ctx), round=rnd, k=1, history=rows, failures=[], rng=rng, mode="open",
                              sample_exemplars=lambda items=items, rng=rng: ex.select(items, rng, n=2, tau=1.0,
                                                                                       bucket_width=0.1))
        props = pol.propose(ctx)
        if not props:
            out += [best] * (n - rnd)  # exhausted: the search stops, its best stands
            break
        p = props[0]
        o = reward.judge([task], [f"```python\n{p.source}```\n"])[0]
        ok = o.status == "correct"
        rows.append(SimpleNamespace(id=len(rows) + 1, source=p.source, meta=p.meta, state="done", correct=ok,
                                    speedup=o.speedup if ok else None, status=o.status,
                                    reasons=o.reason.split(",") if o.reason else []))
        best = max(best, o.speedup) if ok else best
        out.append(best)
    return out


def random_search(setup: Setup, reward: KernelReward, task: Task, n: int, seed: int) -> list[float]:
    rng = random.Random(f"random:{seed}:{task.name}")
    space = setup.programs[task.sha256]
    best, out = 1.0, []
    for _ in range(n):
        o = reward.judge([task], [setup.compiler.completion(fmt(rng.choice(space)), task)])[0]
        best = max(best, o.speedup) if o.status == "correct" else best
        out.append(best)
    return out


def experiment(out: str | Path, *, tasks: str = "tiny", device: str = "cpu", seeds: int = 3, arms=None,
               heldout_fraction: float = 1 / 3, split_seed: int = 0, skip=("compile:max-autotune-no-cudagraphs",),
               jobs: int = 1, judge: dict | None = None, settings: RunSettings | None = None,
               cache: str | Path | None = None, say=print) -> dict:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    s = settings or RunSettings()
    arms = list(arms or ARMS)
    t_start = time.monotonic()
    compiler = Compiler("cuda" if device.startswith("cuda") else "cpu", skip=skip)
    all_tasks, dropped = [], []
    for t in resolve(tasks):
        try:
            compiler.info(t)
            all_tasks.append(t)
        except ValueError as e:
            dropped.append(f"{t.name}: {e}")
    train, held = split(all_tasks, heldout_fraction, split_seed)
    if not train or not held:
        raise ValueError(f"{len(all_tasks)} usable task(s): too few to split into train and held-out")
    vocab = Vocab.build([compiler.info(t).features for t in train], compiler.vocab)
    setup = Setup(compiler=compiler, train=train, heldout=held, vocab=vocab,
                  programs=program_table(compiler, all_tasks, s.max_words))
    empty = [t.name for t in all_tasks if not setup.programs[t.sha256]]
    if empty:
        raise ValueError(f"tasks with no valid program: {', '.join(empty)}")
    opts = {"device": device, **(judge or JUDGE)}
    cj = CachedJudge(LocalJudge(jobs), cache or out / "verdicts.jsonl")
    rs = RewardSettings(jump_above=None, jump_vs_best=None)  # the judge re-measures jumps itself (remeasure_above)

    def reward() -> KernelReward:
        return KernelReward(cj, rs, options=opts, max_batch=4 * max(1, jobs))

    # warm-up: the whole table, judged once
    t0 = time.monotonic()
    table: dict[str, dict[str, dict]] = {}
    r0 = reward()
    for i, t in enumerate(all_tasks, 1):
        progs = [fmt(p) for p in setup.programs[t.sha256]]
        outs = r0.judge([t] * len(progs), [compiler.completion(p, t) for p in progs])
        table[t.name] = {p: {"status": o.status, "speedup": o.speedup} for p, o in zip(progs, outs)}
        say(f"warm {i}/{len(all_tasks)} {t.name}: {len(progs)} programs, best "
            f"{max([o.speedup or 0 for o in outs] + [0]):.2f}x ({time.monotonic() - t0:.0f} s)")
    warm_s = time.monotonic() - t0
    eager = [v["speedup"] for t in all_tasks for p, v in table[t.name].items() if p == EAGER and v["speedup"]]
    oracle = {t.name: max([1.0] + [v["speedup"] for v in table[t.name].values() if v["status"] == "correct"])
              for t in held}

    results: dict[str, list[dict]] = {}
    for arm in arms:
        for seed in range(seeds):
            res = Run(setup, reward(), arm, seed, s, out / arm / f"seed-{seed}").go()
            results.setdefault(arm, []).append(res)
            say(f"{arm} seed {seed}: held-out reward {res['start']['reward_mean']:.3f} -> "
                f"{res['final']['reward_mean']:.3f}, best-of-{s.eval_samples} geomean "
                f"{res['final']['best_geomean']:.3f} ({res['samples']} samples, {res['wall_s']:.0f} s)")
    base = {"recipes": [], "random": []}
    rb = reward()
    for seed in range(seeds):
        rec = [recipes_search(compiler, rb, t, s.eval_samples, seed) for t in held]
        rnd = [random_search(setup, rb, t, s.eval_samples, seed) for t in held]
        base["recipes"].append(geomean([r[-1] for r in rec]))
        base["random"].append(geomean([r[-1] for r in rnd]))
    summary = {
        "tasks": {"train": [t.name for t in train], "heldout": [t.name for t in held], "dropped": dropped},
        "space": {"words": compiler.vocab, "programs": sum(len(v) for v in setup.programs.values()),
                  "vocab": len(vocab)},
        "judge": opts, "settings": s.to_json(), "seeds": seeds, "warm_s": warm_s,
        "cache": {"hits": cj.hits, "misses": cj.misses},
        "oracle_best_geomean": geomean(list(oracle.values())),
        # the reference judged against itself: the spread of one frozen measurement of no change at all
        "noise_floor": {"eager_geomean": geomean(eager), "eager_min": min(eager, default=None),
                        "eager_max": max(eager, default=None), "tasks": len(eager)},
        "arms": {}, "baselines": {k: {"per_seed": v, "mean_ci95": ci95(v)} for k, v in base.items()},
        "wall_s": time.monotonic() - t_start,
    }
    summary["arms"] = arm_rows(results)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "table.json").write_text(json.dumps(table, indent=2) + "\n")
    (out / "ablation.md").write_text(markdown(summary) + "\n" + curve_table(out, [a for a in arms if "grpo" in ARMS[a][0]]))
    return summary


def arm_rows(results: dict[str, list[dict]]) -> dict:
    """Per arm, over seeds: each held-out number at the end and at GRPO's start (mean, 95% half-width), and
    GRPO's gain (end − start, per seed: read against the seeds' spread)."""
    rows = {}
    for arm, rs_ in results.items():
        row = {"samples": [r["samples"] for r in rs_]}
        for key in ("reward_mean", "geomean_speedup", "best_geomean", "correct_rate"):
            fin = [r["final"][key] for r in rs_]
            st = [r["start"][key] for r in rs_]
            gain = [f - s0 for f, s0 in zip(fin, st)]
            row[key] = {"final": ci95(fin), "start": ci95(st), "gain": ci95(gain), "final_per_seed": fin,
                        "start_per_seed": st}
        rows[arm] = row
    return rows


def load_results(out: str | Path) -> dict[str, list[dict]]:
    """The runs' `result.json` files of an experiment directory, per arm, in seed order."""
    out = Path(out)
    return {arm: [json.loads(p.read_text()) for p in sorted((out / arm).glob("seed-*/result.json"))]
            for arm in ARMS if (out / arm).is_dir()}


def curve_table(out: str | Path, arms=("grpo", "contrastive", "random")) -> str:
    """Held-out mean reward / geomean speedup per sample over GRPO steps, mean over seeds, from the runs'
    `result.json` (a table for the docs; `kernelcraft report OUT/ARM/seed-S` draws one run's)."""
    out = Path(out)
    cols, rows = [], {}
    for arm in arms:
        runs = [json.loads(p.read_text()) for p in sorted((out / arm).glob("seed-*/result.json"))]
        if not runs:
            continue
        cols.append(arm)
        for point in zip(*(r["curve"] for r in runs)):
            step = point[0]["step"]
            rows.setdefault(step, {})[arm] = (statistics.fmean(p["reward_mean"] for p in point),
                                              statistics.fmean(p["geomean_speedup"] for p in point))
    head = "| GRPO step | " + " | ".join(f"{a}: reward / geomean" for a in cols) + " |"
    lines = [head, "|---" * (len(cols) + 1) + "|"]
    for step in sorted(rows):
        lines.append(f"| {step} | " + " | ".join(f"{rows[step][a][0]:.3f} / {rows[step][a][1]:.3f}"
                                                  if a in rows[step] else "—" for a in cols) + " |")
    return "\n".join(lines) + "\n"


def markdown(summary: dict) -> str:
    n = summary["settings"]["eval_samples"]
    lines = ["| arm | samples | held-out mean reward at GRPO start | at end | GRPO gain (end − start) | "
             f"geomean speedup / sample: start | end | best-of-{n} geomean | correct |",
             "|---|---|---|---|---|---|---|---|---|"]
    f = lambda m: f"{m[0]:.3f} ± {m[1]:.3f}"  # noqa: E731
    for arm, row in summary["arms"].items():
        rl = "grpo" in ARMS[arm][0]
        r, g = row["reward_mean"], row["geomean_speedup"]
        lines.append(f"| {arm} | {row['samples'][0]} | {f(r['start']) if rl else '—'} | {f(r['final'])} | "
                     f"{f(r['gain']) if rl else '—'} | {f(g['start']) if rl else '—'} | {f(g['final'])} | "
                     f"{f(row['best_geomean']['final'])} | {f(row['correct_rate']['final'])} |")
    for k, v in summary["baselines"].items():
        lines.append(f"| {k} search | — | — | — | — | — | — | {f(v['mean_ci95'])} | — |")
    lines.append(f"| oracle (best program in the table) | — | — | — | — | — | — | "
                 f"{summary['oracle_best_geomean']:.3f} | — |")
    nf = summary.get("noise_floor") or {}
    if nf.get("tasks"):
        lines.append(f"\nNoise floor: the unchanged reference (`eager`) measured {nf['eager_min']:.2f}-"
                     f"{nf['eager_max']:.2f}x over {nf['tasks']} tasks (geomean {nf['eager_geomean']:.2f}x).")
    return "\n".join(lines) + "\n"
