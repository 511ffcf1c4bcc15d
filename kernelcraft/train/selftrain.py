"""Stage 2 (`kernelcraft train selftrain`): the model learns from its own correct samples, for R rounds.

A round samples, judges through the reward (its checks, no smoothing) and writes `round-<r>/samples.jsonl`
before fine-tuning on the correct, deduplicated samples (`sft.fine_tune`). A round with no correct sample
passes its input model on unchanged. A finished round (`round-<r>/model`) is skipped on a rerun.

Rationale: docs/design/train.md#selftrain
"""
from __future__ import annotations

import json
import random
import shutil
import time
from pathlib import Path

from kernelcraft.candidate import normalized_hash
from kernelcraft.train.checkpoints import final_model
from kernelcraft.train.generate import generate_local, generate_server
from kernelcraft.train.metrics import MetricsLog
from kernelcraft.train.rewards import KernelReward
from kernelcraft.train.sft import fine_tune


def sample_round(cfg, model_dir: Path, tasks, variants, reward: KernelReward, rnd: int) -> dict:
    s = cfg.selftrain
    rng = random.Random(cfg.seed * 1000 + rnd)
    plan, prompts = [], []
    for task in tasks:
        for _ in range(s.samples_per_task):
            msgs, shown = variants.prompt(task, rng)
            plan.append((task, shown))
            prompts.append(msgs)
    t0 = time.monotonic()
    if s.generator is not None:
        print(f"kernelcraft train selftrain: round {rnd} samples from {s.generator.base_url} "
              f"({s.generator.model}); it should serve {model_dir}", flush=True)
        gens = generate_server(s.generator, prompts, temperature=s.temperature, max_new_tokens=s.max_new_tokens)
    else:
        gens = generate_local(model_dir, prompts, temperature=s.temperature, max_new_tokens=s.max_new_tokens,
                              batch=s.generation_batch, seed=rng.randrange(2 ** 31), device=cfg.device,
                              dtype=cfg.model.dtype)
    gen_s = time.monotonic() - t0
    completions = [text for text, _ in gens]
    outcomes = reward.judge([t for t, _ in plan], completions, step=rnd)
    rows = []
    for (task, shown), msgs, (text, ntok), o in zip(plan, prompts, gens, outcomes):
        rows.append({"task": task.name, "task_source": task.source, "prompt": msgs,
                     "completion": [{"role": "assistant", "content": text}], "tokens": ntok, "exemplar_ids": shown,
                     "status": o.status, "reason": o.reason, "speedup": o.speedup, "candidate": o.code})
    n = len(rows) or 1
    correct = [r for r in rows if r["status"] == "correct"]
    return {"rows": rows, "stats": {
        "samples": len(rows), "correct_rate": len(correct) / n,
        "fast_1": sum(1 for r in correct if (r["speedup"] or 0) > 1) / n,
        "parse_error_rate": sum(1 for r in rows if r["status"] == "parse_error") / n,
        "generation_tokens_per_s": sum(t for _, t in gens) / gen_s if gen_s > 0 else 0.0,
        "generation_s": gen_s, "evaluations_total": reward.evaluations}}


def kept_samples(rows: list[dict], min_speedup: float) -> list[dict]:
    best: dict[tuple[str, str], dict] = {}
    for r in rows:
        if r["status"] != "correct" or (r["speedup"] or 0) < min_speedup or not r["candidate"]:
            continue
        k = (r["task_source"], normalized_hash(r["candidate"]))
        if k not in best or r["speedup"] > best[k]["speedup"]:
            best[k] = r
    return list(best.values())


def run_selftrain(cfg, *, init_model: Path, tasks, variants, reward: KernelReward, log: MetricsLog) -> Path:
    """R rounds; returns the last round's model (or `init_model` with no rounds)."""
    model_in = Path(init_model)
    for rnd in range(1, cfg.selftrain.rounds + 1):
        rd = cfg.out_dir / "selftrain" / f"round-{rnd}"
        done = final_model(rd)
        if done is not None:
            model_in = done
            continue
        rd.mkdir(parents=True, exist_ok=True)
        samples = rd / "samples.jsonl"
        if not samples.is_file():
            res = sample_round(cfg, model_in, tasks, variants, reward, rnd)
            tmp = rd / "samples.jsonl.partial"
            tmp.write_text("".join(json.dumps(r) + "\n" for r in res["rows"]))
            tmp.replace(samples)
            kept = kept_samples(res["rows"], cfg.selftrain.min_speedup)
            log.write("selftrain_round", rnd, {**res["stats"], "kept": len(kept)}, round=rnd)
            print(f"kernelcraft train selftrain: round {rnd}: {res['stats']['samples']} samples, correct "
                  f"{res['stats']['correct_rate']:.0%}, kept {len(kept)}", flush=True)
        rows = [json.loads(ln) for ln in samples.read_text().splitlines() if ln.strip()]
        kept = kept_samples(rows, cfg.selftrain.min_speedup)
        if not kept:
            tmp = rd / "model.partial"
            shutil.copytree(model_in, tmp, dirs_exist_ok=True)
            tmp.rename(rd / "model")
            (rd / "NO_CORRECT_SAMPLES").write_text("no correct sample this round: the input model passes on\n")
        else:
            fine_tune(cfg, kept, init_model=model_in, stage_dir=rd, settings=cfg.selftrain.sft, log=log,
                      stage="selftrain", round=rnd)
        model_in = rd / "model"
    return model_in
