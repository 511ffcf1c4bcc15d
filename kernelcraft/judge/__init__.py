"""Judge: one candidate against one task — correctness, then speed — in processes that keep the candidate's code
away from the clock, the inputs and the verdict.

Where things are decided (one subpackage a room):
- **correctness** (`correctness/`): `trials.run_trials` draws fresh inputs, compares both sides' outputs and
  calibrates against float64 (`precision`, `bounds`, `fp64`); it returns an `acceptance.Acceptance`, the rule every
  later output is held to (timed rounds, a further candidate process, the weights trial, `weights`).
- **speed** (`speed/`): `rounds.time_candidate` times both sides on the judge's clock (`timing`), checks each timed
  output by the `Acceptance`, bills CPU time used outside the clock (`treecpu`) and widens the interval by the
  calibrated between-run part (`reproduce`).
- **the processes** (`process/`): the judge process (`worker`: one job's sequence; `jobs`: its life), the two sides
  (`side`, driven through `sideproc`, forked by `forker`), the wire and arenas between them, `isolation`, `freeze`
  and `audit`.
- **the caller** (`caller/`): the static screen, starting and watching judge processes (`runner`, `zygote`,
  `warm`, `sandbox`, `gpushare`); it never runs candidate code.
- **tripwires** (`tripwires/`): checks the candidate's own process runs on itself; trusted only as bad news.
A stage fails a candidate by raising `reject.Reject`; `kernelcraft.evaluate` turns a job's record into a verdict.

Rationale: docs/design/judge-caller.md, judge-process.md, judge-correctness.md, judge-speed.md, judge-tripwires.md
"""
