"""The PPO agent: CuAsmRL's policy-gradient player of the schedule game, with masked actions.

A short torch PPO (clipped surrogate, GAE, entropy bonus). The policy's logits add a learned weight times each
move's advice (the measured gain where known, else the cost model's look-ahead gain); known-worse moves are
masked. Episodes start from the best measured configuration with an unexplored neighbour, one update per
episode; pretraining in the cost-model simulator is off by default.

Rationale: docs/design/tune.md#ppo
"""
from __future__ import annotations

import math
import random

from kernelcraft.search.recipes import tunable
from kernelcraft.tune.agents import Predictor, SearchResult, result_of
from kernelcraft.tune.env import BudgetExhausted, ScheduleGame
from kernelcraft.tune.measure import PredictedBackend


ADVICE = 4  # numbers per action appended to the game's observation


def _clip(x: float, lim: float = 2.0) -> float:
    return max(-lim, min(lim, x))


class PPO:
    """Actor-critic MLPs and the clipped PPO update over one batch of transitions."""

    def __init__(self, obs_dim: int, n_actions: int, *, hidden: int = 64, lr: float = 3e-3, gamma: float = 0.9,
                 lam: float = 0.9, clip: float = 0.2, epochs: int = 4, entropy: float = 0.01, seed: int = 0,
                 prior_weight: float = 10.0):
        import torch
        from torch import nn

        self.torch = torch
        self.gen = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        self.pi = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                                nn.Linear(hidden, n_actions))
        self.v = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, 1))
        self.beta = nn.Parameter(torch.tensor(prior_weight))
        self.opt = torch.optim.Adam(list(self.pi.parameters()) + list(self.v.parameters()) + [self.beta], lr=lr)
        self.obs_dim, self.n_actions = obs_dim, n_actions
        self.gamma, self.lam, self.clip, self.epochs, self.entropy = gamma, lam, clip, epochs, entropy

    def _dist(self, obs, mask):
        # the advice each action carries (last 4 numbers per action: predicted gain, best predicted gain within
        # the lookahead, measured?, measured gain): measured where known (a failure: -1), else the lookahead
        advice = obs[:, -ADVICE * self.n_actions:].reshape(obs.shape[0], self.n_actions, ADVICE)
        known = advice[..., 2] > 0
        prior = self.torch.where(known, self.torch.where(advice[..., 3] <= -1, advice[..., 3],
                                                         self.torch.maximum(advice[..., 3], advice[..., 1])),
                                 advice[..., 1])
        logits = (self.pi(obs) + self.beta * prior).masked_fill(~mask, -1e9)
        return self.torch.distributions.Categorical(logits=logits)

    def act(self, obs: list[float], mask: list[bool]) -> tuple[int, float, float]:
        t = self.torch
        with t.no_grad():
            o, m = t.tensor([obs], dtype=t.float32), t.tensor([mask])
            d = self._dist(o, m)
            probs = d.probs[0]
            a = int(t.multinomial(probs, 1, generator=self.gen)[0])
            return a, float(d.log_prob(t.tensor([a]))[0]), float(self.v(o)[0, 0])

    def update(self, batch: list[tuple]) -> None:
        """batch: (obs, mask, action, logp, value, reward, done) in play order."""
        if not batch:
            return
        t = self.torch
        threads = t.get_num_threads()
        t.set_num_threads(1)  # tiny matrices: one thread is ~50x faster than several fighting over them
        try:
            self._update(batch)
        finally:
            t.set_num_threads(threads)

    def _update(self, batch: list[tuple]) -> None:
        t = self.torch
        adv, ret, gae = [0.0] * len(batch), [0.0] * len(batch), 0.0
        for i in reversed(range(len(batch))):
            _, _, _, _, v, r, done = batch[i]
            nxt = 0.0 if done or i == len(batch) - 1 else batch[i + 1][4]
            gae = r + self.gamma * nxt - v + (0.0 if done else self.gamma * self.lam * gae)
            adv[i], ret[i] = gae, gae + v
        obs = t.tensor([b[0] for b in batch], dtype=t.float32)
        mask = t.tensor([b[1] for b in batch])
        acts = t.tensor([b[2] for b in batch])
        old = t.tensor([b[3] for b in batch])
        adv_t, ret_t = t.tensor(adv), t.tensor(ret)
        if len(batch) > 1:
            adv_t = (adv_t - adv_t.mean()) / (adv_t.std() + 1e-8)
        for _ in range(self.epochs):
            d = self._dist(obs, mask)
            ratio = (d.log_prob(acts) - old).exp()
            pg = -t.min(ratio * adv_t, ratio.clamp(1 - self.clip, 1 + self.clip) * adv_t).mean()
            vf = (self.v(obs).squeeze(-1) - ret_t).pow(2).mean()
            loss = pg + 0.5 * vf - self.entropy * d.entropy().mean()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()


class PPOAgent:
    """Plays the game with PPO (docs/design/tune.md#ppo). One agent object keeps its policy across searches of
    the same kernel family (transfer); `sims` are extra (game, kernel, shape, predictor) to pretrain on."""
    name = "ppo"

    def __init__(self, *, horizon: int = 16, pretrain_episodes: int = 0, max_steps_factor: int = 8,
                 hidden: int = 64, seed: int = 0, lookahead: int = 2, sims=()):
        self.horizon, self.pretrain_episodes, self.max_steps_factor = horizon, pretrain_episodes, max_steps_factor
        self.lookahead, self._look_memo = lookahead, {}
        self.hidden, self.seed, self.sims = hidden, seed, list(sims)
        self.ppo: PPO | None = None
        self.kind: str | None = None

    # -- observations ------------------------------------------------------------------------------
    @staticmethod
    def _predicted(predictor: Predictor | None, configs: list[dict]) -> dict[str, float]:
        if predictor is None:
            return {}
        return {tunable.config_key(c): p for c, p in zip(configs, predictor(configs))}

    def _look(self, game: ScheduleGame, pred: dict[str, float], config: dict) -> float:
        """The lowest predicted runtime within `lookahead` moves of `config` (itself included): a move into a
        valley of the landscape still points at the peak behind it."""
        key = tunable.config_key(config)
        memo = self._look_memo.setdefault(id(game.space), {})
        if key not in memo:
            best, frontier, seen = pred.get(key, math.inf), [config], {key}
            for _ in range(self.lookahead):
                nxt = []
                for c in frontier:
                    for a in range(game.space.n_actions):
                        n = game.space.apply(c, a)
                        k = tunable.config_key(n) if n is not None else None
                        if k is not None and k not in seen:
                            seen.add(k)
                            nxt.append(n)
                            best = min(best, pred.get(k, math.inf))
                frontier = nxt
            memo[key] = best
        return memo[key]

    def _obs(self, game: ScheduleGame, pred: dict[str, float]) -> tuple[list[float], list[bool]]:
        mask, neigh, s = list(game.action_mask()), game.neighbours(), game.state
        p_cur = pred.get(tunable.config_key(s.config))
        extra = []
        for i, (ok, n) in enumerate(zip(mask, neigh)):
            key = tunable.config_key(n) if ok else None
            m = game.measured.get(key) if ok else None
            if ok and m is not None and (not m.ok or m.speedup <= s.score):
                mask[i] = ok = False  # a known-worse configuration teaches nothing: the agent does not go back there
            if not ok:
                extra += [0.0, 0.0, 0.0, 0.0]
                continue
            pg = _clip(math.log(p_cur / pred[key])) if p_cur and pred.get(key) else 0.0
            look = _clip(math.log(p_cur / self._look(game, pred, n))) if p_cur and pred.get(key) else 0.0
            kg = (_clip(math.log(m.speedup / s.score)) if m.ok else -1.0) if m is not None else 0.0
            extra += [pg, look, float(m is not None), kg]
        return game.observation() + extra, mask

    def _ensure(self, game: ScheduleGame, pred) -> None:
        kind = game.state.kernel.kind
        if self.ppo is None or self.kind != kind:
            obs, _ = self._obs(game, pred)
            self.ppo = PPO(len(obs), game.space.n_actions, hidden=self.hidden, seed=self.seed)
            self.kind = kind

    # -- playing -----------------------------------------------------------------------------------
    def _episode(self, game: ScheduleGame, pred: dict, start: dict | None) -> list[tuple]:
        if start is not None:
            game.move_to(start)
        game.state.steps = 0
        batch = []
        for _ in range(self.horizon):
            obs, mask = self._obs(game, pred)
            if not any(mask):
                break
            a, logp, v = self.ppo.act(obs, mask)
            try:
                _, r, done, _ = game.step(a)
            except BudgetExhausted:
                break
            batch.append((obs, mask, a, logp, v, r, done))
            if done:
                break
        if batch:
            b = batch[-1]
            batch[-1] = b[:6] + (True,)
        return batch

    def _start(self, game: ScheduleGame, pred: dict) -> dict | None:
        """Where the next episode starts: the best measured configuration that still has a move worth making
        (its neighbourhood not yet explored)."""
        ranked = sorted((m.speedup, i) for i, (_, m) in enumerate(game.history) if m.ok)
        for _, i in reversed(ranked):
            cfg = game.history[i][0]
            game.move_to(cfg)
            if any(self._obs(game, pred)[1]):
                return cfg
        return None

    def pretrain(self, game: ScheduleGame, kernel: tunable.Kernel, shape: dict, predictor: Predictor | None,
                 episodes: int, rng: random.Random) -> None:
        """Play `episodes` episodes of `game` (any backend), updating the policy after each."""
        state = game.reset(kernel, shape)
        pred = self._predicted(predictor, game.space.configs())
        self._ensure(game, pred)
        configs = [c for c in game.space.configs()]
        for _ in range(episodes):
            game.reset(kernel, shape, start=rng.choice(configs) if rng.random() < 0.5 else None)
            self.ppo.update(self._episode(game, pred, None))
        del state

    def search(self, game: ScheduleGame, kernel: tunable.Kernel, shape: dict, budget: int | None,
               rng: random.Random, predictor: Predictor | None = None) -> SearchResult:
        if predictor is not None and self.pretrain_episodes:
            real = game.backend_for(kernel, shape)  # its compiled features only: no measurement is spent here
            sim = ScheduleGame(lambda k, s: PredictedBackend(k, s, predictor, features=real.features),
                               horizon=self.horizon)
            self.pretrain(sim, kernel, shape, predictor, self.pretrain_episodes, rng)
            for g, k, s, p in self.sims:
                self.pretrain(g, k, s, p, self.pretrain_episodes, rng)
        game.reset(kernel, shape, budget=budget)
        pred = self._predicted(predictor, game.space.configs())
        self._ensure(game, pred)
        limit = self.max_steps_factor * (budget or len(game.space.configs()))
        steps = 0
        while steps < limit and (budget is None or len(game.measured) < budget):
            start = self._start(game, pred)
            if start is None:
                break  # every working configuration's neighbourhood is explored
            batch = self._episode(game, pred, start)
            if not batch:
                break
            steps += len(batch)
            self.ppo.update(batch)
        return result_of(game, self.name)
