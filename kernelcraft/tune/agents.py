"""Who plays the schedule game, at equal measurement budgets: random search, exhaustive autotuning, a
cost-model ranking, a fixed shortlist (`tunable.shortlist`) and the PPO agent (`ppo.PPOAgent`).

Every agent plays the same game with the same budget of distinct measurements (the start configuration
counts) and returns its best *measured* configuration, never a prediction. A cost model enters as a
`Predictor` (configs -> predicted ms).

Rationale: docs/design/tune.md#agents
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable, Protocol

from kernelcraft.search.recipes import tunable
from kernelcraft.tune.env import BudgetExhausted, ScheduleGame

Predictor = Callable[[list[dict]], list[float]]


@dataclass
class SearchResult:
    agent: str
    best_config: dict
    best_score: float
    measurements: int
    trace: list[float] = field(default_factory=list)  # best score after each measurement
    history: list[dict] = field(default_factory=list)  # {"config", **measurement} in measurement order

    def to_json(self) -> dict:
        return dict(self.__dict__)


def result_of(game: ScheduleGame, agent: str) -> SearchResult:
    best, trace, hist = None, [], []
    for cfg, m in game.history:
        if m.ok and (best is None or m.speedup > best[1]):
            best = (cfg, m.speedup)
        trace.append(best[1] if best else 0.0)
        hist.append({"config": cfg, **m.to_json()})
    if best is None:
        raise RuntimeError("no configuration worked")
    return SearchResult(agent, dict(best[0]), best[1], len(game.history), trace, hist)


class Agent(Protocol):
    name: str

    def search(self, game: ScheduleGame, kernel: tunable.Kernel, shape: dict, budget: int | None,
               rng: random.Random, predictor: Predictor | None = None) -> SearchResult: ...


def _measure_in_order(game: ScheduleGame, configs: list[dict]) -> None:
    for cfg in configs:
        try:
            game.measure(cfg)
        except BudgetExhausted:
            return


class Exhaustive:
    """Measure every valid configuration (Triton's autotuning); `budget` is ignored."""
    name = "exhaustive"

    def search(self, game, kernel, shape, budget, rng, predictor=None) -> SearchResult:
        game.reset(kernel, shape, budget=None)
        _measure_in_order(game, game.space.configs())
        return result_of(game, self.name)


class RandomSearch:
    name = "random"

    def search(self, game, kernel, shape, budget, rng, predictor=None) -> SearchResult:
        game.reset(kernel, shape, budget=budget)
        configs = game.space.configs()
        rng.shuffle(configs)
        _measure_in_order(game, configs)
        return result_of(game, self.name)


class ModelRanked:
    """Measure in the order of predicted runtime, fastest first."""
    name = "model-ranked"

    def search(self, game, kernel, shape, budget, rng, predictor=None) -> SearchResult:
        if predictor is None:
            raise ValueError("model-ranked search needs a cost model (predictor)")
        game.reset(kernel, shape, budget=budget)
        configs = game.space.configs()
        pred = predictor(configs)
        order = sorted(range(len(configs)), key=lambda i: (pred[i], rng.random()))
        _measure_in_order(game, [configs[i] for i in order])
        return result_of(game, self.name)


class Shortlist:
    """Measure `tunable.shortlist` in its order: the configurations a hand-written autotuner would list.
    Needs no compiled features, so the tuner compiles these alone."""
    name = "shortlist"
    needs_features = False

    def search(self, game, kernel, shape, budget, rng, predictor=None) -> SearchResult:
        game.reset(kernel, shape, budget=budget)
        _measure_in_order(game, tunable.shortlist(kernel, shape))
        return result_of(game, self.name)


AGENTS = {"exhaustive": Exhaustive, "random": RandomSearch, "model-ranked": ModelRanked, "shortlist": Shortlist}

