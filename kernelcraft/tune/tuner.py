"""`kernelcraft tune TASK`: find the task's tunable kernel, play the schedule game on the GPU, keep every
measurement, and judge the best configurations into the run database like any candidate.

The task must be one template instance, else `TuneError`. Every configuration is compiled first (the
`shortlist` agent's own only: it reads no features); the budget counts measurements only. Measurements go to
the store, whose cost model is retrained after each run. The `keep` best configurations are judged by
`search.optimize` with the full protocol; the configuration it reports as best is recorded in the
tuned-configuration store. `keep` 0 judges nothing and records the fast path's best, labelled as such.

Rationale: docs/design/tune.md#tuner
"""
from __future__ import annotations

import json
import math
import os
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from kernelcraft.protocol import Protocol
from kernelcraft.search.optimize import Options, optimize
from kernelcraft.search.policies import Proposal
from kernelcraft.search.recipes import rewrite, tunable, tunetemplates
from kernelcraft.task import Task, load_task
from kernelcraft.tune import costmodel, features
from kernelcraft.tune.agents import AGENTS
from kernelcraft.tune.env import ScheduleGame
from kernelcraft.tune.measure import TritonBackend
from kernelcraft.tune.ppo import PPOAgent


class TuneError(ValueError):
    """The task cannot be tuned as asked (no tunable kernel, no GPU, bad option)."""


@dataclass
class TuneOptions:
    device: str = "cuda"
    agent: str = "ppo"
    budget: int | None = None  # measurements; None: `budget_share` of the valid configurations
    budget_share: float = 0.25
    keep: int = 2
    seed: int = 0
    rounds: int = 5
    store: str | None = None
    workers: int | None = None
    confirm: int = 1
    protocol: Protocol = field(default_factory=Protocol)


@dataclass
class TuneResult:
    task: str
    kernel: str
    shape: dict
    agent: str
    configs: int
    budget: int
    measurements: int
    best_config: dict
    best_fast_speedup: float
    cost_model: str | None
    run: dict | None  # the judged run; None when --keep 0 judged nothing
    tuned_store: str | None
    wall_s: float

    def to_json(self) -> dict:
        return asdict(self)


def default_store() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kernelcraft" / "tune"


def find_match(task: Task) -> tunable.Match:
    a = rewrite.analyze(task.source)
    if not a.tunable:
        why = f" (analysis: {a.error})" if a.error else ""
        raise TuneError(f"{task.name}: no tunable kernel found — `kernelcraft tune` covers a GEMM with an elementwise "
                        f"epilogue and softmax/log-softmax/LayerNorm/RMSNorm/L2/L1 over the last dimension{why}")
    return tunable.Match.from_json(a.tunable[0])


class _TunedProposals:
    """The policy `optimize` runs: the tuned candidates, each proposed once."""
    name = "tuned"
    thread_safe = True

    def __init__(self, proposals: list[Proposal]):
        self.proposals = proposals

    def propose(self, ctx) -> list[Proposal]:
        seen = {json.dumps(r.meta.get("tuned"), sort_keys=True) for r in ctx.history if r.meta}
        return [p for p in self.proposals if json.dumps(p.meta["tuned"], sort_keys=True) not in seen][:ctx.k]


def _load_model(store: Path, kind: str):
    path = store / f"costmodel-{kind}.json"
    if not path.exists():
        return None
    try:
        return costmodel.CostModel.load(path)
    except costmodel.CostModelError:
        return None


def _retrain(store: Path, kind: str) -> str | None:
    path = store / "measurements.jsonl"
    try:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        recs = [r for r in costmodel.records_of(rows) if r["kernel"].kind == kind]
        costmodel.CostModel(kind).fit(recs).save(store / f"costmodel-{kind}.json")
        return f"retrained on {len(recs)} measurements"
    except (OSError, ValueError, costmodel.CostModelError) as e:
        return f"not retrained: {e}"


def tune(task, out, options: TuneOptions | None = None, *, on_event: Callable[..., None] | None = None) -> TuneResult:
    """Tune `task`'s kernel on `options.device` and judge the result into `out` (module docstring)."""
    t0 = time.monotonic()
    opts = options or TuneOptions()
    emit = on_event or (lambda kind, **d: None)
    task = load_task(task)
    match = find_match(task)
    kernel, shape = match.kernel, match.shape
    if not opts.device.startswith("cuda") and os.environ.get("TRITON_INTERPRET") != "1":
        raise TuneError("kernelcraft tune measures Triton kernels on a CUDA device (--device cuda)")
    if opts.protocol.mode == "strict":
        raise TuneError("tuned candidates subclass the reference Model (its parameters), which strict mode forbids")
    if opts.agent not in ("ppo", *AGENTS):
        raise TuneError(f"unknown agent {opts.agent!r}: ppo, {', '.join(AGENTS)}")
    if opts.keep < 0 or not 0 < opts.budget_share <= 1:
        raise TuneError("--keep must be 0 or more and --budget-share in (0, 1]")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    store = Path(opts.store) if opts.store else default_store()
    store.mkdir(parents=True, exist_ok=True)
    featureless = not getattr(AGENTS.get(opts.agent), "needs_features", True)
    configs = tunable.shortlist(kernel, shape) if featureless else tunable.all_configs(kernel, shape)
    default_budget = len(configs) if featureless else math.ceil(opts.budget_share * len(configs))
    budget = min(len(configs), opts.budget or default_budget)
    emit("match", kernel=kernel.key(), shape=shape, configs=len(configs), budget=budget)

    backend = TritonBackend(task, match, device=opts.device, rounds=opts.rounds, seed=opts.protocol.seed,
                            atol=opts.protocol.atol, rtol=opts.protocol.rtol, workdir=out / "work")
    if backend.interpreted:  # Triton's CPU interpreter (tests of the plumbing) compiles nothing
        compiled = [{"ok": False, "error": "interpreted"}] * len(configs)
    else:
        emit("compile", configs=len(configs), features=not featureless)
        compiled = features.compile_many(kernel, shape, configs, workers=opts.workers, workdir=out / "work")
        backend.known.update(zip((tunable.config_key(c) for c in configs), compiled))
    model = _load_model(store, kernel.kind) if opts.agent in ("ppo", "model-ranked") else None
    predictor = None
    if model is not None:
        feats = [f if f.get("ok") else None for f in compiled]
        pred = dict(zip((tunable.config_key(c) for c in configs), model.predict(kernel, shape, configs, feats)))
        predictor = lambda cs: [pred[tunable.config_key(c)] for c in cs]  # noqa: E731
    elif opts.agent == "model-ranked":
        raise TuneError(f"no cost model for {kernel.kind} in {store} (or lightgbm missing): tune with another "
                        "agent first, or pip install 'kernelcraft[tune]'")

    game = ScheduleGame(lambda k, s: backend)
    emit("search", agent=opts.agent, budget=budget, cost_model=model is not None)
    agent = PPOAgent(seed=opts.seed) if opts.agent == "ppo" else AGENTS[opts.agent]()
    result = agent.search(game, kernel, shape, budget, random.Random(opts.seed), predictor=predictor)
    gpu = _gpu_name(opts.device)
    with open(store / "measurements.jsonl", "a") as f:
        for h in result.history:
            cfg = h["config"]
            f.write(json.dumps({"shape": task.name, "kernel": kernel.to_json(), "size": shape, "config": cfg,
                                "features": backend.known.get(tunable.config_key(cfg)), "gpu": gpu,
                                **{k: v for k, v in h.items() if k != "config"}}) + "\n")
    (out / "tune_measurements.json").write_text(json.dumps(result.to_json(), indent=1) + "\n")
    retrained = _retrain(store, kernel.kind)
    emit("measured", measurements=result.measurements, best=result.best_score, config=result.best_config,
         retrained=retrained)
    backend.close()

    ranked = sorted((h for h in result.history if h.get("ok")), key=lambda h: -h["speedup"])
    if opts.keep == 0:  # the fast path's best, unjudged: the recipe that uses it is judged like any candidate
        best = ranked[0]
        run, tuned_path = None, str(tunable.record_tuned(
            kernel, shape, best["config"], ms=best["ms"], gpu=gpu,
            source=f"{task.name} (fast path: {best['speedup']:.3f}x, not judged)"))
    else:
        run, tuned_path = _judge(task, match, out, ranked, opts, gpu, emit)
    res = TuneResult(task=task.name, kernel=kernel.key(), shape=shape, agent=opts.agent, configs=len(configs),
                     budget=budget, measurements=result.measurements, best_config=result.best_config,
                     best_fast_speedup=result.best_score, cost_model=retrained if model is None else "used; " + retrained,
                     run=run, tuned_store=tuned_path, wall_s=round(time.monotonic() - t0, 2))
    (out / "tune.json").write_text(json.dumps(res.to_json(), indent=1) + "\n")
    return res


def _judge(task, match, out, ranked: list[dict], opts: TuneOptions, gpu: str, emit) -> tuple[dict, str | None]:
    """Judge the `opts.keep` best distinct configurations of `ranked` into `out` with the full protocol; (the
    run, the tuned store's path when its confirmed best was recorded there)."""
    kernel, shape = match.kernel, match.shape
    keep, seen = [], set()
    for h in ranked:
        key = tunable.config_key(h["config"])
        if key not in seen:
            seen.add(key)
            keep.append(h)
        if len(keep) >= opts.keep:
            break
    proposals = [Proposal(tunetemplates.candidate_source(task.source, match, h["config"],
                                                         note=f"{opts.agent}: {h['speedup']:.3f}x in the fast path"),
                          meta={"recipe": ["tuned"], "tuned": h["config"], "kernel": kernel.key(), "agent": opts.agent,
                                "fast_speedup": h["speedup"]})
                 for h in keep]
    run = optimize(task, out, Options(policy="tuned", budget=len(proposals), k=len(proposals), device=opts.device,
                                      protocol=opts.protocol, confirm=opts.confirm, patience=None),
                   policy=_TunedProposals(proposals), on_event=lambda kind, **d: emit("judge_" + kind, **d))
    tuned_path = None
    if run.best_candidate is not None:
        from kernelcraft.search.rundb import RunDB

        db = RunDB(out)
        try:
            row = db.get(run.best_candidate)
        finally:
            db.close()
        ms = next((h["ms"] for h in keep if h["config"] == row.meta.get("tuned")), None)
        tuned_path = str(tunable.record_tuned(kernel, shape, row.meta["tuned"], ms=ms, gpu=gpu, source=task.name))
    return run.to_json(), tuned_path


def _gpu_name(device: str) -> str:
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return device
