"""One training run of the stand-in policy: SFT -> self-training -> GRPO, scored on held-out tasks as it goes.

An arm (`ARMS`) is which stages run and how prompts show exemplars; every arm spends the same judged-sample
budget (SFT data plus `budget`), held-out evaluations not counted. A held-out evaluation is an episode per
task (`eval_samples` samples, exemplars from that episode only), re-seeded each time and scored raw.

Rationale: docs/design/train.md#learn
"""
from __future__ import annotations

import json
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

from kernelcraft.search import exemplars as ex
from kernelcraft.task import Task
from kernelcraft.train.metrics import MetricsLog
from kernelcraft.train.pipeline import RUN_MARK
from kernelcraft.train.programs import Compiler, enumerate_programs, fmt
from kernelcraft.train.rewards import KernelReward
from kernelcraft.train.standin import StandIn, Vocab, prompt_words
from kernelcraft.version import __version__

# arm -> (stages after SFT, exemplar mode)
ARMS = {
    "sft": ((), "none"),
    "selftrain": (("selftrain", "selftrain"), "none"),
    "grpo": (("selftrain", "grpo"), "none"),
    "contrastive": (("selftrain", "grpo"), "contrastive"),
    "random": (("selftrain", "grpo"), "random"),
}


@dataclass
class RunSettings:
    sft_per_task: int = 4  # D / training tasks
    budget: int = 1024  # B: judged samples after the SFT data
    st_share: float = 0.25  # of B, the GRPO arms' self-training round
    prompts_per_step: int = 4
    group_size: int = 8
    exemplars: int = 2
    tau: float = 1.0
    bucket_width: float = 0.25
    sft_steps: int = 300
    st_steps: int = 100
    sft_lr: float = 3e-3
    rl_lr: float = 2e-3
    beta: float = 0.02
    temperature: float = 1.0
    eval_every: int = 4  # GRPO steps
    eval_samples: int = 8  # per held-out task
    max_words: int = 3
    hidden: int | None = None

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Setup:
    """What every run of an experiment shares."""
    compiler: Compiler
    train: list[Task]
    heldout: list[Task]
    vocab: Vocab
    programs: dict[str, list[frozenset]] = field(default_factory=dict)  # task sha -> valid programs (SFT data)


class Store:
    """Correct samples per task as exemplars: (program text, speedup), distinct programs, best kept."""

    def __init__(self):
        self.items: dict[str, dict[str, float]] = {}

    def add(self, task: Task, program: str, speedup: float) -> None:
        d = self.items.setdefault(task.sha256, {})
        d[program] = max(speedup, d.get(program, 0.0))

    def draw(self, task: Task, mode: str, rng: random.Random, s: RunSettings) -> list[tuple[str, float]]:
        if mode == "none" or s.exemplars == 0:
            return []
        d = self.items.get(task.sha256, {})
        items = [ex.Exemplar(i, p, v) for i, (p, v) in enumerate(sorted(d.items()))]
        opts = dict(n=s.exemplars) if mode == "random" else dict(n=s.exemplars, tau=s.tau,
                                                                  bucket_width=s.bucket_width)
        return [(e.source, e.speedup) for e in ex.select(items, rng, selector=mode, **opts)]


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(max(x, 1e-9)) for x in xs) / len(xs)) if xs else float("nan")


class Run:
    def __init__(self, setup: Setup, reward: KernelReward, arm: str, seed: int, s: RunSettings, out: Path):
        if arm not in ARMS:
            raise ValueError(f"unknown arm {arm!r}: use {', '.join(ARMS)}")
        self.setup, self.reward, self.arm, self.seed, self.s, self.out = setup, reward, arm, seed, s, out
        self.stages, self.mode = ARMS[arm]
        self.policy = StandIn(setup.vocab, seed=seed, max_words=s.max_words, hidden=s.hidden)
        self.rng = random.Random(f"run:{arm}:{seed}")
        self.store = Store()
        self.samples = 0  # judged training samples: the budget
        self.log = MetricsLog(out, tensorboard=False)
        self.curve: list[dict] = []

    # -- pieces --------------------------------------------------------------------------------------
    def _prompt(self, task: Task, store: Store, rng: random.Random) -> list[str]:
        info = self.setup.compiler.info(task)
        return prompt_words(info.features, store.draw(task, self.mode, rng, self.s))

    def _judge(self, tasks: list[Task], programs: list[str], *, smooth: bool, step: int = 0):
        comps = [self.setup.compiler.completion(p, t) for p, t in zip(programs, tasks)]
        return (self.reward.score if smooth else self.reward.judge)(tasks, comps, step=step)

    def _sft_data(self, n_per_task: int) -> list[tuple[list[str], str]]:
        tasks, progs = [], []
        for t in self.setup.train:
            space = self.setup.programs[t.sha256]
            for _ in range(n_per_task):
                tasks.append(t)
                progs.append(fmt(self.rng.choice(space)))
        outs = self._judge(tasks, progs, smooth=False)
        self.samples += len(progs)
        data = []
        for t, p, o in zip(tasks, progs, outs):  # each prompt shows earlier variants only, as in training
            if o.status == "correct":
                data.append((self._prompt(t, self.store, self.rng), p))
                self.store.add(t, p, o.speedup)
        return data

    def _selftrain_round(self, n: int, rnd: int) -> None:
        per = max(1, n // len(self.setup.train))
        tasks = [t for t in self.setup.train for _ in range(per)]
        prompts = [self._prompt(t, self.store, self.rng) for t in tasks]
        progs = self.policy.sample(prompts, temperature=self.s.temperature)
        outs = self._judge(tasks, progs, smooth=False, step=rnd)
        self.samples += len(progs)
        kept = [(pr, p) for pr, p, o in zip(prompts, progs, outs) if o.status == "correct"]
        for t, p, o in zip(tasks, progs, outs):
            if o.status == "correct":
                self.store.add(t, p, o.speedup)
        uniq = list(dict.fromkeys((tuple(pr), p) for pr, p in kept))  # deduplicated, as the pipeline keeps them
        losses = self.policy.sft([(list(pr), p) for pr, p in uniq], steps=self.s.st_steps, lr=self.s.sft_lr,
                                 seed=self.seed + rnd) if uniq else []
        self.log.write("selftrain_round", rnd, {"samples": len(progs), "correct_rate": len(kept) / len(progs),
                                                "fast_1": sum(1 for o in outs if (o.speedup or 0) > 1) / len(progs),
                                                "kept": len(kept)}, round=rnd)
        if losses:
            self.log.write("selftrain", len(losses), {"loss": sum(losses[-10:]) / len(losses[-10:])}, round=rnd)

    def evaluate(self, step: int) -> dict:
        """The held-out episode: `eval_samples` samples per held-out task, each prompt showing exemplars from
        this episode's correct samples only; re-seeded, scored raw (docs/design/train.md#learn)."""
        saved = self.policy.gen.get_state()
        self.policy.gen.manual_seed(10_000 + self.seed)
        rng = random.Random(f"eval:{self.seed}")
        store = Store()
        raws, speeds, correct = [], [], 0
        said: dict[str, int] = {}
        best = {t.sha256: 1.0 for t in self.setup.heldout}
        for _ in range(self.s.eval_samples):
            tasks = self.setup.heldout
            progs = self.policy.sample([self._prompt(t, store, rng) for t in tasks], temperature=self.s.temperature)
            for t, p, o in zip(tasks, progs, self._judge(tasks, progs, smooth=False)):
                said[p] = said.get(p, 0) + 1
                raws.append(o.raw)
                speeds.append(o.speedup if o.status == "correct" else 1.0)
                if o.status == "correct":
                    correct += 1
                    store.add(t, p, o.speedup)
                    best[t.sha256] = max(best[t.sha256], o.speedup)
        self.policy.gen.set_state(saved)
        rec = {"reward_mean": sum(raws) / len(raws), "correct_rate": correct / len(raws),
               "geomean_speedup": geomean(speeds), "best_geomean": geomean(list(best.values())),
               "samples_used": self.samples}
        self.curve.append({"step": step, **rec})
        self.said = dict(sorted(said.items(), key=lambda kv: -kv[1]))  # what the policy wrote, most often first
        self.log.write("heldout", step, rec)
        return rec

    def _grpo(self, n: int) -> None:
        s = self.s
        steps = max(1, n // (s.prompts_per_step * s.group_size))
        self.policy.start_rl()
        self.evaluate(0)
        for step in range(1, steps + 1):
            t0 = time.monotonic()
            tasks, prompts = [], []
            for t in self.rng.sample(self.setup.train, min(s.prompts_per_step, len(self.setup.train))):
                pr = self._prompt(t, self.store, self.rng)
                tasks += [t] * s.group_size
                prompts += [pr] * s.group_size
            progs = self.policy.sample(prompts, temperature=s.temperature)
            outs = self._judge(tasks, progs, smooth=True, step=step)
            self.samples += len(progs)
            adv = []
            for g in range(0, len(outs), s.group_size):
                grp = [o.reward for o in outs[g:g + s.group_size]]
                mu = sum(grp) / len(grp)
                adv += [r - mu for r in grp]
            for t, p, o in zip(tasks, progs, outs):
                if o.status == "correct":
                    self.store.add(t, p, o.speedup)
            upd = self.policy.grpo_step(prompts, progs, adv, lr=s.rl_lr, beta=s.beta)
            self.log.write("grpo", step, {**upd, **{f"kernelcraft/{k}": v for k, v in self.reward.last_stats.items()},
                                          "kernelcraft/step_s": time.monotonic() - t0})
            if step % s.eval_every == 0 or step == steps:
                self.evaluate(step)

    # -- the run -------------------------------------------------------------------------------------
    def go(self) -> dict:
        s = self.s
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / RUN_MARK).write_text(json.dumps({
            "kernelcraft": __version__, "stage": "learn", "at": time.time(),
            "config": {"model": {"path": f"stand-in policy (Qwen2 tiny, from scratch), arm {self.arm}"},
                       "arm": self.arm, "seed": self.seed, "settings": s.to_json()}}, indent=2) + "\n")
        t0 = time.monotonic()
        n_sft = s.sft_per_task + (s.budget // len(self.setup.train) if not self.stages else 0)
        data = self._sft_data(n_sft)
        losses = self.policy.sft(data, steps=s.sft_steps, lr=s.sft_lr, seed=self.seed)
        for i in range(10, len(losses) + 1, 10):
            self.log.write("sft", i, {"loss": sum(losses[i - 10:i]) / 10})
        rest = s.budget if self.stages else 0
        st_n = int(rest * s.st_share) if "grpo" in self.stages else rest // max(1, self.stages.count("selftrain"))
        rnd = 0
        for stage in self.stages:
            if stage == "selftrain":
                rnd += 1
                self._selftrain_round(st_n, rnd)
            else:
                self._grpo(rest - st_n)
        if "grpo" not in self.stages:
            self.evaluate(0)
        result = {"arm": self.arm, "seed": self.seed, "samples": self.samples, "wall_s": time.monotonic() - t0,
                  "start": self.curve[0], "final": self.curve[-1], "curve": self.curve, "final_programs": self.said}
        (self.out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
        self.policy.save(self.out / "model")
        self.log.close()
        return result


def program_table(compiler: Compiler, tasks: list[Task], max_words: int) -> dict[str, list[frozenset]]:
    return {t.sha256: enumerate_programs(compiler, t, max_words) for t in tasks}
