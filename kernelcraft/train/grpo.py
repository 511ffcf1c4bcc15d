"""Stage 3 (`kernelcraft train grpo`): contrastive GRPO on TRL's GRPOTrainer, rewarded by the service.

Prompts are drawn on the fly from the exemplar database (one per group); the reward is `KernelReward.score`,
smoothed per task, so TRL's group scaling is off (`scale_rewards="none"`). The reward state is saved in each
checkpoint, and only a checkpoint holding it counts as complete; the budget (evaluations, wall seconds,
across resumes) stops training at a step boundary.

Rationale: docs/design/train.md#grpo
"""
from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path

from kernelcraft.task import Task
from kernelcraft.train.checkpoints import checkpoint_step, final_model, last_checkpoint
from kernelcraft.train.metrics import MetricsLog, trainer_callback
from kernelcraft.train.models import load_model, load_tokenizer, lora_config, require, save_merged
from kernelcraft.train.rewards import KernelReward, percentile

REWARD_STATE = "kernelcraft_reward_state.json"


class Clock:
    """Training wall time across resumes, and the timing of the step in progress."""

    def __init__(self, before_s: float = 0.0):
        self.before_s, self.t0 = before_s, time.monotonic()
        self.step_started = self.t0
        self.gen_tokens = 0
        self.gen_s = 0.0
        self.window_latencies: list[float] = []

    @property
    def wall_s(self) -> float:
        return self.before_s + time.monotonic() - self.t0


def trl_reward(reward: KernelReward, clock: Clock):
    """The async reward function TRL calls: one service batch per generation batch."""

    async def kernelcraft(prompts, completions, task, task_source, completion_ids=None, log_metric=None,
                          trainer_state=None, **_):
        clock.gen_s += time.monotonic() - clock.step_started
        clock.gen_tokens += sum(len(c) for c in completion_ids or [])
        tasks = [Task(name=n, source=s) for n, s in zip(task, task_source)]
        step = trainer_state.global_step + 1 if trainer_state is not None else 0
        n_lat = len(reward.latencies)
        outs = await asyncio.to_thread(reward.score, tasks, completions, step=step)
        clock.window_latencies += reward.latencies[n_lat:]
        if log_metric is not None:
            for k, v in reward.last_stats.items():
                log_metric(f"kernelcraft/{k}", float(v))
        return [o.reward for o in outs]

    return kernelcraft


def prompt_stream(tasks: list[Task], variants, seed: int):
    """A generator factory for `IterableDataset.from_generator`: endless fresh prompts."""

    def rows():
        rng = random.Random(seed)
        while True:
            task = rng.choice(tasks)
            msgs, shown = variants.prompt(task, rng)
            yield {"prompt": msgs, "task": task.name, "task_source": task.source, "exemplar_ids": json.dumps(shown)}

    return rows


def _callbacks(cfg, reward: KernelReward, clock: Clock, log: MetricsLog):
    from transformers import TrainerCallback

    def extra() -> dict:
        lat, clock.window_latencies = clock.window_latencies, []
        minutes = clock.wall_s / 60
        vals = {"kernelcraft/evaluations_per_min": reward.evaluations / minutes if minutes > 0 else 0.0,
                "kernelcraft/train_wall_s": clock.wall_s}
        if clock.gen_s > 0:  # not at the closing log, which follows the last step's own
            vals["kernelcraft/gen_tokens_per_s"] = clock.gen_tokens / clock.gen_s
        if lat:
            vals["kernelcraft/reward_latency_p50_s"] = percentile(lat, 50)
            vals["kernelcraft/reward_latency_p95_s"] = percentile(lat, 95)
        clock.gen_tokens, clock.gen_s = 0, 0.0
        return vals

    class _State(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            clock.step_started = time.monotonic()

        def on_step_end(self, args, state, control, **kw):
            b = cfg.budget
            if (b.evaluations and reward.evaluations >= b.evaluations) or (b.wall_s and clock.wall_s >= b.wall_s):
                control.should_training_stop = True
                control.should_save = True

        def on_save(self, args, state, control, **kw):
            ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if ckpt.is_dir():
                tmp = ckpt / (REWARD_STATE + ".partial")
                tmp.write_text(json.dumps({**reward.state_dict(), "train_wall_s": clock.wall_s}))
                tmp.replace(ckpt / REWARD_STATE)

    return [trainer_callback(log, "grpo", extra=extra), _State()]


def run_grpo(cfg, *, init_model: Path, tasks: list[Task], reward: KernelReward, variants, log: MetricsLog) -> Path:
    out = cfg.out_dir / "grpo"
    done = final_model(out)
    if done is not None:
        return done
    trl = require("trl")
    datasets = require("datasets")
    g = cfg.grpo
    resume = last_checkpoint(out, required=("trainer_state.json", REWARD_STATE))
    before = 0.0
    if resume is not None:
        state = json.loads((resume / REWARD_STATE).read_text())
        reward.load_state_dict(state)
        before = float(state.get("train_wall_s", 0.0))
        log.write("grpo", 0, {"resumed_from_step": checkpoint_step(resume)})
        print(f"kernelcraft train grpo: resuming from {resume}", flush=True)
    clock = Clock(before)
    tok = load_tokenizer(init_model)
    model = load_model(init_model, dtype=cfg.model.dtype)
    ds = datasets.IterableDataset.from_generator(prompt_stream(tasks, variants, cfg.seed + checkpoint_step(resume)))
    args = trl.GRPOConfig(
        output_dir=str(out), max_steps=g.steps, per_device_train_batch_size=g.prompts_per_step * g.group_size,
        num_generations=g.group_size, max_completion_length=g.max_completion_length, temperature=g.temperature,
        learning_rate=g.learning_rate, beta=g.beta, scale_rewards="none", shuffle_dataset=False,
        ignore_data_skip=True, logging_steps=g.logging_steps, save_strategy="steps", save_steps=g.save_steps,
        save_total_limit=g.save_total_limit, report_to=[], use_cpu=cfg.device == "cpu", bf16=cfg.device != "cpu",
        seed=cfg.seed, disable_tqdm=True, gradient_checkpointing=cfg.model.gradient_checkpointing,
        use_vllm=bool(g.vllm_server_url), vllm_mode="server", vllm_server_base_url=g.vllm_server_url)
    trainer = trl.GRPOTrainer(model=model, reward_funcs=[trl_reward(reward, clock)], args=args, train_dataset=ds,
                              processing_class=tok, peft_config=lora_config(cfg.model.lora),
                              callbacks=_callbacks(cfg, reward, clock, log))
    trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    summary = {"steps": trainer.state.global_step, "evaluations": reward.evaluations, "train_wall_s": clock.wall_s,
               "resumed_from": str(resume) if resume else None,
               "reward_latency_p50_s": percentile(reward.latencies, 50),
               "reward_latency_p95_s": percentile(reward.latencies, 95)}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return save_merged(trainer.model, tok, out / "model")
