"""`kernelcraft tune`: the schedule game, a learned cost model and the agents that play it.

The schedule is a Triton template's tiling and pipelining configuration (templates in
`search/recipes/tunable.py`, `tunetemplates.py`). `env` is the game, `features` what the compiler made of a
configuration, `measure` how a configuration is timed, `costmodel` the runtime predictor, `agents` and `ppo`
who plays, `tuner` the command's library side. torch, triton and lightgbm (extra `tune`) are imported where
they are used. Usage: docs/tune.md.

Rationale: docs/design/tune.md#__init__
"""
