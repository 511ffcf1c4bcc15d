"""`kernelcraft tune`: the schedule game, a learned cost model and the agents that play it.

Design decisions
- CuAsmRL's assembly game on Hopper: there is no public SASS assembler for sm_90, so the schedule
  that can be mutated and re-compiled is a Triton template's tiling and pipelining configuration
  (`search/recipes/tunable.py`, `tunetemplates.py`, below this layer so the offline `tuned` recipe can
  render kernels too). `env` is the game (reset/step, masked actions, measured rewards), `features`
  what the compiler made of a configuration, `measure` how a configuration is timed, `costmodel` the
  learned runtime predictor, `agents` and `ppo` who plays, `tuner` the `kernelcraft tune` command's
  library side. The README's "kernelcraft tune" section says what a SASS backend would need.
- Nothing here is imported by the package's public API: torch, triton and lightgbm (extra `tune`) are
  imported where they are used.
"""
