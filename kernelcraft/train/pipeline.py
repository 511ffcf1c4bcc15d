"""The pipeline: data -> SFT -> self-training -> contrastive GRPO, each stage resumable, one run directory.

Each stage takes its input model from the run directory (the latest finished earlier stage's, else
`model.path`); `train.json` marks the directory as a training run. The reward service is checked with an
authenticated request before anything loads.

Rationale: docs/design/train.md#pipeline
"""
from __future__ import annotations

import json
import time
import urllib.error
from contextlib import contextmanager
from pathlib import Path

from kernelcraft.client import Client, ServiceError
from kernelcraft.train.checkpoints import final_model
from kernelcraft.train.data import HELDOUT, TRAIN, build_dataset, load_examples
from kernelcraft.train.hackcases import HackCases
from kernelcraft.train.metrics import MetricsLog
from kernelcraft.train.models import TrainError, check_model_dir
from kernelcraft.train.prompting import target_device
from kernelcraft.train.rewards import KernelReward
from kernelcraft.train.variants import VariantStore, resolve_tasks
from kernelcraft.version import __version__

STAGES = ("data", "sft", "selftrain", "grpo")
RUN_MARK = "train.json"


def _mark(cfg, stage: str) -> None:
    out = cfg.out_dir
    out.mkdir(parents=True, exist_ok=True)
    (out / RUN_MARK).write_text(json.dumps({"kernelcraft": __version__, "stage": stage, "at": time.time(),
                                            "config": cfg.model_dump(mode="json")}, indent=2) + "\n")


def input_model(cfg, stage: str) -> Path:
    out = cfg.out_dir
    candidates = []
    if stage in ("selftrain", "grpo"):
        candidates.append(final_model(out / "sft"))
    if stage == "grpo":
        rounds = sorted((out / "selftrain").glob("round-*"), key=lambda p: int(p.name.split("-")[1]))
        candidates += [final_model(r) for r in rounds]
    found = [c for c in candidates if c is not None]
    return found[-1] if found else check_model_dir(cfg.path(cfg.model.path))


def connect(cfg) -> Client:
    client = Client(cfg.service.url, cfg.service.api_key(), timeout=cfg.service.timeout_s)
    try:
        client.stats()  # needs the key, unlike /v1/health
    except ServiceError as e:
        raise TrainError(f"the reward service at {client.url} refused: {e.message}") from None
    except (urllib.error.URLError, OSError) as e:
        raise TrainError(f"the reward service at {client.url} is not reachable ({e}): start it with "
                         f"`kernelcraft serve` and set {cfg.service.api_key_env}") from None
    return client


@contextmanager
def resources(cfg, stage: str, *, client=None, judge_model=None):
    """The shared pieces of a judged stage: reward, exemplar store, hack cases, metrics."""
    from kernelcraft.train.judgemodel import JudgeModel

    g = cfg.grpo
    variants = VariantStore(cfg.out_dir / "exemplars", target_device(cfg), cfg.prompt, n=g.exemplars, tau=g.tau,
                            bucket_width=g.bucket_width, selector=g.selector)
    hack = HackCases(cfg.out_dir / "hackcases.db")
    log = MetricsLog(cfg.out_dir)
    if judge_model is None and g.judge_model is not None and stage == "grpo":
        judge_model = JudgeModel(g.judge_model)
    reward = KernelReward(client if client is not None else connect(cfg), g.reward, options=cfg.service.options,
                          variants=variants, hackcases=hack, judge_model=judge_model, stage=stage,
                          max_batch=cfg.service.max_batch)
    try:
        yield reward, variants, log
    finally:
        variants.close()
        hack.close()
        log.close()


def run_data(cfg) -> dict:
    _mark(cfg, "data")
    return build_dataset(cfg)


def run_sft_stage(cfg) -> Path:
    from kernelcraft.train.sft import fine_tune

    _mark(cfg, "sft")
    log = MetricsLog(cfg.out_dir)
    try:
        return fine_tune(cfg, load_examples(cfg.out_dir / "data" / TRAIN), init_model=input_model(cfg, "sft"),
                         stage_dir=cfg.out_dir / "sft", settings=cfg.sft, log=log)
    finally:
        log.close()


def _tasks_and_seed(cfg, names, variants):
    examples = load_examples(cfg.out_dir / "data" / TRAIN)
    tasks = resolve_tasks(names, examples, cfg)
    if not tasks:
        raise TrainError("no tasks to train on: the train split is empty and the config names none")
    for t in tasks:
        variants.seed(t, examples)
    return tasks


def run_selftrain_stage(cfg, *, client=None) -> Path:
    from kernelcraft.train.selftrain import run_selftrain

    _mark(cfg, "selftrain")
    with resources(cfg, "selftrain", client=client) as (reward, variants, log):
        tasks = _tasks_and_seed(cfg, cfg.selftrain.tasks, variants)
        return run_selftrain(cfg, init_model=input_model(cfg, "selftrain"), tasks=tasks, variants=variants,
                             reward=reward, log=log)


def run_grpo_stage(cfg, *, client=None, judge_model=None) -> Path:
    from kernelcraft.train.grpo import run_grpo

    _mark(cfg, "grpo")
    with resources(cfg, "grpo", client=client, judge_model=judge_model) as (reward, variants, log):
        tasks = _tasks_and_seed(cfg, cfg.grpo.tasks, variants)
        return run_grpo(cfg, init_model=input_model(cfg, "grpo"), tasks=tasks, reward=reward, variants=variants,
                        log=log)


def run_all(cfg, *, client=None) -> dict:
    """Every stage in order; each one skips what a previous invocation finished."""
    data = cfg.out_dir / "data"
    if not (data / TRAIN).is_file() or not (data / HELDOUT).is_file():
        run_data(cfg)
    client = client or connect(cfg)
    return {"sft": str(run_sft_stage(cfg)), "selftrain": str(run_selftrain_stage(cfg, client=client)),
            "grpo": str(run_grpo_stage(cfg, client=client))}
