"""The schedule game: CuAsmRL's assembly game, played on a kernel's tiling and pipelining configuration.

    game = ScheduleGame(make_backend)                # make_backend(kernel, shape) -> measure.Backend
    state = game.reset(kernel, shape, budget=40)     # measures the starting configuration
    mask = game.action_mask()                        # which actions lead to a configuration worth trying
    state, reward, done, info = game.step(action)    # change one knob by one step, measured

Reward = log(speedup_new / speedup_old); a failed configuration gives `fail_reward`, keeps the state and is
masked from then on. A masked action is refused (ValueError). Each distinct configuration is measured once
per game; `budget` caps distinct measurements (`BudgetExhausted`). The game knows only a `Space` and a
measurement backend.

Rationale: docs/design/tune.md#env
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Protocol

from kernelcraft.search.recipes import tunable
from kernelcraft.tune.features import SASS_CLASSES
from kernelcraft.tune.measure import Backend, Measurement

FEATURE_SCALE = {"regs": 255.0, "spill_bytes": 1024.0, "smem_kb": 228.0, "threads": 1024.0, "blocks_per_sm": 32.0,
                 "occupancy": 1.0}


class BudgetExhausted(RuntimeError):
    """The game's measurement budget is spent."""


class Space(Protocol):
    n_actions: int

    def start(self) -> dict: ...

    def apply(self, config: dict, action: int) -> dict | None: ...

    def describe(self, action: int) -> str: ...

    def encode(self, config: dict) -> list[float]: ...

    def configs(self) -> list[dict]: ...


class KnobSpace:
    """A Triton template's knobs: action 2k moves knob k one value down, 2k+1 one value up."""

    def __init__(self, kernel: tunable.Kernel, shape: dict):
        self.kernel, self.shape = kernel, tunable.check_shape(kernel.kind, shape)
        self.knobs = tunable.knobs(kernel.kind)
        self.names = list(self.knobs)
        self.n_actions = 2 * len(self.names)

    def start(self) -> dict:
        return tunable.default_config(self.kernel, self.shape)

    def apply(self, config: dict, action: int) -> dict | None:
        if not 0 <= action < self.n_actions:
            raise ValueError(f"action {action} is not in range({self.n_actions})")
        name = self.names[action // 2]
        values = self.knobs[name]
        i = values.index(config[name]) + (1 if action % 2 else -1)
        if not 0 <= i < len(values):
            return None
        new = dict(config, **{name: values[i]})
        return new if tunable.valid(self.kernel, self.shape, new) else None

    def describe(self, action: int) -> str:
        return f"{self.names[action // 2]} {'+' if action % 2 else '-'}1"

    def encode(self, config: dict) -> list[float]:
        out = []
        for name in self.names:
            vals = self.knobs[name]
            out += [1.0 if config[name] == v else 0.0 for v in vals]
        return out

    def configs(self) -> list[dict]:
        return tunable.all_configs(self.kernel, self.shape)


@dataclass
class State:
    kernel: tunable.Kernel
    shape: dict
    config: dict
    score: float
    features: dict | None = None
    best_config: dict = field(default_factory=dict)
    best_score: float = 0.0
    start_score: float = 0.0
    steps: int = 0
    measurements: int = 0


class ScheduleGame:
    """See the module docstring. `make_backend(kernel, shape)` gives the measurement backend (cached per
    kernel and shape); `make_space(kernel, shape)` the action space (KnobSpace by default)."""

    def __init__(self, make_backend: Callable[[tunable.Kernel, dict], Backend], *,
                 make_space: Callable[[tunable.Kernel, dict], Space] = KnobSpace, horizon: int = 64,
                 fail_reward: float = -1.0, with_features: bool = True):
        self.make_backend, self.make_space = make_backend, make_space
        self.horizon, self.fail_reward, self.with_features = horizon, fail_reward, with_features
        self._backends: dict = {}
        self.state: State | None = None

    # -- measuring ---------------------------------------------------------------------------------
    def measure(self, config: dict) -> Measurement:
        """The measurement of `config` (recorded once per game; a new one counts against the budget)."""
        if not hasattr(self, "backend"):
            raise RuntimeError("call reset(kernel, shape) first")
        key = tunable.config_key(config)
        if key in self.measured:
            return self.measured[key]
        if self.budget is not None and len(self.measured) >= self.budget:
            raise BudgetExhausted(f"{self.budget} measurements spent")
        m = self.backend.measure(config)
        self.measured[key] = m
        self.history.append((dict(config), m))
        if not m.ok:
            self.failed.add(key)
        elif self.state is not None and m.speedup > self.state.best_score:
            self.state.best_config, self.state.best_score = dict(config), m.speedup
        if self.state is not None:
            self.state.measurements = len(self.measured)
        return m

    def features(self, config: dict) -> dict | None:
        key = tunable.config_key(config)
        if key not in self._features:
            self._features[key] = self.backend.features(config) if self.with_features else None
        return self._features[key]

    # -- the game ----------------------------------------------------------------------------------
    def backend_for(self, kernel: tunable.Kernel, shape: dict) -> Backend:
        """The measurement backend of `kernel` at `shape` (made once per game object)."""
        shape = tunable.check_shape(kernel.kind, shape)
        bkey = (kernel.key(), tuple(sorted(shape.items())))
        if bkey not in self._backends:
            self._backends[bkey] = self.make_backend(kernel, shape)
        return self._backends[bkey]

    def reset(self, kernel: tunable.Kernel, shape: dict, *, start: dict | None = None,
              budget: int | None = None) -> State:
        """A new game on `kernel` at `shape`: measures the start configuration (the template's default,
        or `start`); if it fails, the nearest configurations that work (each a measurement)."""
        shape = tunable.check_shape(kernel.kind, shape)
        self.backend = self.backend_for(kernel, shape)
        self.space = self.make_space(kernel, shape)
        self.budget = budget
        self.measured: dict[str, Measurement] = {}
        self.history: list[tuple[dict, Measurement]] = []
        self.failed: set[str] = set()
        self._features: dict[str, dict | None] = {}
        self._neighbours: dict[str, list] = {}
        self.state = None
        first = start or self.space.start()
        order = [first] + sorted((c for c in self.space.configs() if c != first),
                                 key=lambda c: sum(c[k] != first[k] for k in first))
        for cfg in order:
            m = self.measure(cfg)
            if m.ok:
                break
        else:
            raise RuntimeError(f"no configuration of {kernel.key()} at {shape} works")
        self.state = State(kernel, shape, dict(cfg), m.speedup, self.features(cfg), dict(cfg), m.speedup, m.speedup,
                           0, len(self.measured))
        return self.state

    def move_to(self, config: dict) -> State:
        """Continue from an already-measured, working configuration (an agent restarting an episode from its
        best so far); costs no measurement."""
        m = self.measured.get(tunable.config_key(config))
        if m is None or not m.ok:
            raise ValueError("move_to needs a configuration measured as working in this game")
        self.state.config, self.state.score = dict(config), m.speedup
        self.state.features = self.features(config)
        return self.state

    def neighbours(self) -> list[dict | None]:
        """The configuration each action leads to (None where the space has none)."""
        key = tunable.config_key(self.state.config)
        if key not in self._neighbours:
            self._neighbours[key] = [self.space.apply(self.state.config, a) for a in range(self.space.n_actions)]
        return self._neighbours[key]

    def action_mask(self) -> list[bool]:
        return [n is not None and tunable.config_key(n) not in self.failed for n in self.neighbours()]

    def done(self) -> bool:
        s = self.state
        spent = self.budget is not None and s.measurements >= self.budget
        return s.steps >= self.horizon or spent or not any(self.action_mask())

    def step(self, action: int) -> tuple[State, float, bool, dict]:
        if self.state is None:
            raise RuntimeError("call reset(kernel, shape) first")
        if not self.action_mask()[action]:
            raise ValueError(f"action {action} ({self.space.describe(action)}) is masked")
        new = self.space.apply(self.state.config, action)
        fresh = tunable.config_key(new) not in self.measured
        m = self.measure(new)
        self.state.steps += 1
        info = {"config": new, "measurement": m, "new_measurement": fresh, "action": self.space.describe(action)}
        if not m.ok:
            reward = self.fail_reward
        else:
            reward = math.log(m.speedup / self.state.score)
            self.state.config, self.state.score = dict(new), m.speedup
            self.state.features = self.features(new)
        return self.state, reward, self.done(), info

    # -- what an agent sees ------------------------------------------------------------------------
    def observation(self, state: State | None = None) -> list[float]:
        """Configuration (one-hot per knob), shape (log2 sizes), compiled features (scaled), and where the
        episode stands (log score over start and best, steps and measurements used)."""
        s = state or self.state
        out = self.space.encode(s.config)
        out += [math.log2(v) / 16 for v in s.shape.values()]
        f = s.features or {}
        for k in ("regs", "spill_bytes", "smem_kb", "threads", "blocks_per_sm", "occupancy"):
            out.append(min(1.0, float(f.get(k, 0.0)) / FEATURE_SCALE[k]))
        out.append(math.log2(max(1.0, float(f.get("n_instr", 1.0)))) / 16)
        out += [float(f.get(f"sass_{c}", 0.0)) for c in SASS_CLASSES]
        out += [math.log(s.score / s.start_score), math.log(s.best_score / s.start_score), s.steps / self.horizon,
                (s.measurements / self.budget) if self.budget else 0.0]
        return out
