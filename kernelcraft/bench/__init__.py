"""Bench: a whole suite judged at once — `sources` (suites, KernelBench directories, pairs files),
`run` (the resumable run through the pool), `baselines` (torch.compile, CUDA graphs), `metrics`
(fast_p, geomeans), `timeuse` (where the seconds went) and `report` (HTML).
Rationale: docs/design/bench.md
"""
