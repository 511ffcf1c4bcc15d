"""Bench: a whole suite judged at once — `sources` (suites, KernelBench directories, pairs files),
`run` (the resumable run through the pool), `baselines` (torch.compile, CUDA graphs), `fallback` (a task whose
search fell back, scored at what holds), `metrics`
(fast_p, geomeans), `timeuse` (where the seconds went), `roofline` (how far each task is from the GPU's peaks)
and `report` (HTML).
Rationale: docs/design/bench.md
"""
