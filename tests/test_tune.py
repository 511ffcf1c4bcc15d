"""The schedule game's API and masking, and the agents at equal budgets, on a CPU stand-in for the GPU
(`Synthetic`: a made-up but structured runtime landscape over a real template's knob space)."""
from __future__ import annotations

import math
import random
import zlib

import pytest

from kernelcraft.search.recipes import tunable
from kernelcraft.tune.agents import AGENTS, Exhaustive, ModelRanked, RandomSearch
from kernelcraft.tune.env import BudgetExhausted, KnobSpace, ScheduleGame
from kernelcraft.tune.measure import Measurement, PredictedBackend, TableBackend

GEMM = tunable.Kernel("gemm", "float32", epilogue="acc = acc + v0\nout = acc", vectors=1, b_trans=True)
SHAPE = {"M": 2048, "N": 2048, "K": 1024}
BEST = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3}


def synthetic_ms(cfg: dict) -> float:
    """Smooth in each knob's index, optimum at BEST, plus a deterministic ripple."""
    k = tunable.knobs("gemm")
    d = sum((k[n].index(cfg[n]) - k[n].index(BEST[n])) ** 2 for n in k)
    return 1.0 + 0.15 * d + 0.01 * (hash(tunable.config_key(cfg)) % 7)


class Synthetic:
    """A CPU stand-in for `TritonBackend`: counts its calls, fails a chosen set of configurations."""

    def __init__(self, kernel, shape, failing=()):
        self.kernel, self.shape, self.calls = kernel, shape, 0
        self.failing = {tunable.config_key(c) for c in failing}

    def measure(self, cfg):
        self.calls += 1
        if tunable.config_key(cfg) in self.failing:
            return Measurement(False, reason="compile_error", error="synthetic failure")
        ms = synthetic_ms(cfg)
        return Measurement(True, ms=ms, ref_ms=2.0, speedup=2.0 / ms)

    def features(self, cfg):
        return {"regs": 128.0, "smem_kb": 64.0, "occupancy": 0.25, "n_instr": 1000.0}


def game_with(backend, **kw) -> ScheduleGame:
    return ScheduleGame(lambda k, s: backend, **kw)


def test_knob_space_and_masks():
    configs = tunable.all_configs(GEMM, SHAPE)
    assert configs and all(tunable.valid(GEMM, SHAPE, c) for c in configs)
    assert tunable.valid(GEMM, SHAPE, tunable.default_config(GEMM, SHAPE))
    huge = dict(BEST, BLOCK_M=256, BLOCK_N=256, BLOCK_K=128, num_stages=4)
    assert "shared memory" in tunable.why_invalid(GEMM, SHAPE, huge)
    assert "not one of" in tunable.why_invalid(GEMM, SHAPE, dict(BEST, BLOCK_M=96))
    assert "larger than the problem" in tunable.why_invalid(GEMM, {"M": 16, "N": 2048, "K": 1024},
                                                            dict(BEST, GROUP_M=1))
    with pytest.raises(tunable.TunableError):
        tunable.Kernel("conv", "float32")
    with pytest.raises(tunable.TunableError):
        tunable.check_shape("gemm", {"M": 1, "N": 2})
    space = KnobSpace(GEMM, SHAPE)
    top = dict(BEST, BLOCK_M=256)
    assert space.apply(top, space.names.index("BLOCK_M") * 2 + 1) is None  # past the last value
    st = space.names.index("num_stages") * 2
    assert space.apply(BEST, st)["num_stages"] == 2  # one step down
    assert space.apply(BEST, st + 1) is None  # 4 stages of 128x64 + 64x128 fp32 tiles: 256 KB of shared memory


def test_reset_step_reward_and_done():
    game = game_with(Synthetic(GEMM, SHAPE), horizon=3)
    s = game.reset(GEMM, SHAPE)
    assert s.config == tunable.default_config(GEMM, SHAPE) and s.measurements == 1 and s.steps == 0
    assert len(game.observation()) == len(game.observation(s))
    a = next(i for i, ok in enumerate(game.action_mask()) if ok)
    before = s.score
    s, r, done, info = game.step(a)
    assert math.isclose(r, math.log(info["measurement"].speedup / before)) and s.steps == 1 and not done
    assert s.config == info["config"] and info["new_measurement"]
    game.step(a ^ 1)  # back where it came from: a recorded measurement, no new one
    _, _, done, info = game.step(a)
    assert done and not info["new_measurement"] and s.measurements == 2


def test_masked_actions_are_refused_and_failures_are_masked():
    backend = Synthetic(GEMM, SHAPE)
    game = game_with(backend)
    start = tunable.default_config(GEMM, SHAPE)
    game.reset(GEMM, SHAPE)
    space = game.space
    up_stages = space.names.index("num_stages") * 2 + 1
    for a, ok in enumerate(game.action_mask()):
        target = space.apply(start, a)
        assert ok == (target is not None and tunable.valid(GEMM, SHAPE, target))
    bad = next(a for a, ok in enumerate(game.action_mask()) if ok)
    backend.failing.add(tunable.config_key(space.apply(start, bad)))
    s, r, _, info = game.step(bad)
    assert r == game.fail_reward and s.config == start and not info["measurement"].ok
    assert not game.action_mask()[bad]  # known to fail: masked from now on
    with pytest.raises(ValueError, match="masked"):
        game.step(bad)
    edge = dict(start, num_stages=tunable.knobs("gemm")["num_stages"][-1])
    game.reset(GEMM, SHAPE, start=edge)
    assert not game.action_mask()[up_stages]


def test_failing_start_falls_back_to_a_working_configuration():
    start = tunable.default_config(GEMM, SHAPE)
    game = game_with(Synthetic(GEMM, SHAPE, failing=[start]))
    s = game.reset(GEMM, SHAPE)
    assert s.config != start and s.measurements == 2


def test_budget_counts_distinct_measurements():
    backend = Synthetic(GEMM, SHAPE)
    game = game_with(backend)
    game.reset(GEMM, SHAPE, budget=2)
    cfgs = tunable.all_configs(GEMM, SHAPE)
    game.measure(cfgs[0])
    game.measure(cfgs[0])  # free
    with pytest.raises(BudgetExhausted):
        game.measure(cfgs[1])
    assert backend.calls == 2 and len(game.measured) == 2


@pytest.mark.parametrize("name", sorted(AGENTS) + ["ppo"])
def test_agents_spend_at_most_the_budget(name):
    backend = Synthetic(GEMM, SHAPE)
    if name == "ppo":
        from kernelcraft.tune.ppo import PPOAgent
        agent = PPOAgent(seed=0, horizon=8, pretrain_episodes=0)
    else:
        agent = AGENTS[name]()
    pred = (lambda cs: [synthetic_ms(c) for c in cs]) if name == "model-ranked" else None
    res = agent.search(game_with(backend), GEMM, SHAPE, 12, random.Random(0), predictor=pred)
    n = len(tunable.all_configs(GEMM, SHAPE))
    want = {"exhaustive": n, "shortlist": min(12, len(tunable.shortlist(GEMM, SHAPE)))}.get(name, 12)
    assert res.measurements == want == backend.calls
    assert res.trace == sorted(res.trace) and res.best_score == res.trace[-1]


def test_exhaustive_finds_the_table_best_and_a_perfect_model_needs_one_measurement():
    rows = [{"config": c, **Synthetic(GEMM, SHAPE).measure(c).to_json()} for c in tunable.all_configs(GEMM, SHAPE)]
    table = TableBackend(GEMM, SHAPE, rows)
    best_cfg, best = table.best()
    assert best_cfg == BEST
    assert Exhaustive().search(game_with(table), GEMM, SHAPE, None, random.Random(0)).best_score == best
    r = ModelRanked().search(game_with(table), GEMM, SHAPE, 2, random.Random(0),
                             predictor=lambda cs: [synthetic_ms(c) for c in cs])
    assert r.best_config == BEST and r.measurements == 2  # the start, then the predicted best
    assert RandomSearch().search(game_with(table), GEMM, SHAPE, 2, random.Random(0)).best_score <= best
    with pytest.raises(ValueError, match="cost model"):
        ModelRanked().search(game_with(table), GEMM, SHAPE, 2, random.Random(0))


def test_ppo_with_a_model_beats_random_search_on_the_stand_in():
    from kernelcraft.tune.ppo import PPOAgent

    rows = [{"config": c, **Synthetic(GEMM, SHAPE).measure(c).to_json()} for c in tunable.all_configs(GEMM, SHAPE)]
    table = TableBackend(GEMM, SHAPE, rows)
    _, best = table.best()
    noisy = lambda cs: [synthetic_ms(c) * (1 + 0.1 * ((zlib.crc32(str(c).encode()) % 5) - 2) / 2) for c in cs]  # noqa: E731
    budget = 10
    # Six seeds, each with 3 pretraining episodes in the cost-model simulator: the agent's sampling follows the
    # machine's float rounding, so one seed's result moves between CPUs; the mean over six does not move much.
    ppo = [PPOAgent(seed=s, horizon=8, pretrain_episodes=3).search(game_with(table), GEMM, SHAPE, budget,
                                                                   random.Random(s), predictor=noisy).best_score
           for s in range(6)]
    rnd = [RandomSearch().search(game_with(table), GEMM, SHAPE, budget, random.Random(s)).best_score for s in range(20)]
    assert sum(ppo) / len(ppo) / best >= 0.9 and sum(ppo) / len(ppo) > sum(rnd) / len(rnd)


def test_predicted_backend_is_a_simulator():
    sim = PredictedBackend(GEMM, SHAPE, lambda cs: [synthetic_ms(c) for c in cs], ref_ms=2.0)
    m = sim.measure(BEST)
    assert m.ok and m.speedup == 2.0 / synthetic_ms(BEST)
    assert sim.measure(dict(BEST, BLOCK_M=96)).reason == "invalid"
