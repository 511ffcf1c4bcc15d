"""A kernelcraft reward for TRL's GRPOTrainer: `async def reward(prompts, completions, **kw) -> list[float]`.

Start the service on the evaluation machine, then train anywhere that can reach it:

    export KERNELCRAFT_API_KEY=$(openssl rand -hex 24)
    kernelcraft serve --host 0.0.0.0 --port 8000          # on the GPU box (needs kernelcraft[serve])
    export KERNELCRAFT_URL=http://gpu-box:8000            # on the trainer (same KERNELCRAFT_API_KEY)
    python examples/trl_reward.py --selftest              # one call against the service, no trl needed

The dataset gives each prompt its task in a `task` column (a built-in name such as "level1/relu", or
KernelBench source text); TRL passes dataset columns to reward functions as keyword arguments. The
completion's last ```python block is the candidate.

Reward shaping (GRPO only uses differences within a group, so the scale matters less than the order):
- no code block / not a candidate (parse error, no ModelNew): 0.0; cheating (`rejected`): 0.0
- compiles but crashes, times out or is wrong: 0.1 (a small nudge towards code that builds)
- correct: 0.3 + 0.7 * (1 + tanh(log(s) / log(cap))) / 2, with s the speedup clipped to [1/cap, cap].
  So a correct but 2x slower kernel still beats any wrong one, parity gives 0.65, and the reward
  saturates smoothly towards 1.0 as s approaches `cap` (default 10x): no unbounded outliers for a
  lucky measurement to dominate a group with. With `conservative=True` (default) s is the lower end of
  the speedup's 95% confidence interval, so noise never earns reward.
Verdicts are cached by (task, candidate) within the process: GRPO groups often repeat completions.

This module does not import trl (or torch) at the top: it imports with the standard library and
kernelcraft's client only.
"""
from __future__ import annotations

import hashlib
import math
import os
import re

from kernelcraft.client import Client, ServiceError

CODE_RE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)
PARTIAL = {"incorrect": 0.1, "runtime_error": 0.1, "timeout": 0.1, "compile_error": 0.0, "rejected": 0.0}


def extract_code(completion) -> str | None:
    """The candidate source in a completion (a string or TRL's list of chat messages)."""
    if isinstance(completion, list):  # conversational: [{"role": "assistant", "content": ...}]
        completion = "\n".join(m.get("content", "") for m in completion if isinstance(m, dict))
    if not isinstance(completion, str):
        return None
    blocks = CODE_RE.findall(completion)
    code = blocks[-1] if blocks else (completion if "class ModelNew" in completion else None)
    return code if code and "ModelNew" in code else None


def shape(verdict: dict | None, *, cap: float = 10.0, conservative: bool = True) -> float:
    """A verdict record → reward in [0, 1]."""
    if not verdict:
        return 0.0
    status = verdict.get("status")
    if status != "correct":
        return PARTIAL.get(status, 0.0)
    s = verdict.get("speedup")
    timing = verdict.get("timing") or {}
    if conservative and timing.get("ci95"):
        s = min(s or math.inf, timing["ci95"][0])
    if not s or not math.isfinite(s) or s <= 0:
        return 0.3  # correct, timing unavailable (e.g. timing=False)
    s = min(max(s, 1.0 / cap), cap)
    return 0.3 + 0.7 * (1.0 + math.tanh(math.log(s) / math.log(cap))) / 2.0


def make_reward(url: str | None = None, api_key: str | None = None, *, options: dict | None = None,
                cap: float = 10.0, conservative: bool = True, default_task: str | None = None,
                cache_size: int = 50_000):
    """An async TRL reward function bound to one service. `options` go to every evaluation
    (e.g. {"mode": "strict", "trials": 5}); strict mode is the right default for RL."""
    client = Client(url, api_key)
    opts = {"mode": "strict", **(options or {})}
    cache: dict[str, dict] = {}

    async def reward(prompts, completions, **kw) -> list[float]:
        tasks = kw.get("task") or [default_task] * len(completions)
        if isinstance(tasks, str):
            tasks = [tasks] * len(completions)
        items, where, keys = [], [], []
        rewards: list[float] = [0.0] * len(completions)
        for i, (completion, task) in enumerate(zip(completions, tasks)):
            code = extract_code(completion)
            if code is None or not task:
                continue  # no candidate: reward 0
            key = hashlib.sha256(f"{task}\0{code}".encode()).hexdigest()
            if key in cache:
                rewards[i] = shape(cache[key], cap=cap, conservative=conservative)
                continue
            items.append({"task": task, "candidate": code, "options": opts})
            where.append(i)
            keys.append(key)
        if items:
            try:
                verdicts = await client.aevaluate_batch(items)
            except ServiceError as e:  # a bad request is our bug, not the policy's: fail loudly
                raise RuntimeError(f"kernelcraft service refused the batch: {e}") from None
            for i, key, v in zip(where, keys, verdicts):
                if len(cache) < cache_size:
                    cache[key] = v
                rewards[i] = shape(v, cap=cap, conservative=conservative)
        return rewards

    reward.__name__ = "kernelcraft_speedup"  # TRL logs rewards under the function's name
    return reward


# Configured from the environment (KERNELCRAFT_URL, KERNELCRAFT_API_KEY), built lazily on first call.
_default = None


async def reward(prompts, completions, **kw) -> list[float]:
    """The reward TRL calls: GRPOTrainer(..., reward_funcs=[reward])."""
    global _default
    if _default is None:
        _default = make_reward(options={"mode": os.environ.get("KERNELCRAFT_MODE", "strict")})
    return await _default(prompts, completions, **kw)


def main() -> None:
    import argparse
    import asyncio

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--selftest", action="store_true", help="score two completions against the service")
    ap.add_argument("--task", default="tiny/level1/relu")
    ap.add_argument("--device", default=None, help="cpu | cuda (default: the server's)")
    ap.add_argument("--model", help="with trl installed: a causal LM to train with GRPO (a sketch)")
    args = ap.parse_args()
    if args.selftest:
        good = ("Here is a faster ReLU:\n```python\nimport torch\nimport torch.nn as nn\n\n"
                "class ModelNew(nn.Module):\n    def forward(self, x):\n        return x.clamp_min(0.0)\n```")
        bad = good.replace("clamp_min(0.0)", "abs()")
        fn = make_reward(options={"mode": "open", **({"device": args.device} if args.device else {})})
        print(asyncio.run(fn(["p", "p", "p"], [good, bad, "no code"], task=[args.task] * 3)))
        return
    if args.model:  # how the pieces fit; adjust the dataset and config to your run
        from datasets import Dataset
        from trl import GRPOConfig, GRPOTrainer

        from kernelcraft.task import builtin_names, load_task

        rows = [{"prompt": "Write a faster ModelNew (inline CUDA) for this PyTorch module:\n\n"
                           + load_task(n).source, "task": n} for n in builtin_names("gpu", 1)]
        trainer = GRPOTrainer(model=args.model, reward_funcs=[reward], train_dataset=Dataset.from_list(rows),
                              args=GRPOConfig(output_dir="grpo-kernelcraft", num_generations=8,
                                              max_completion_length=4096))
        trainer.train()


if __name__ == "__main__":
    main()
