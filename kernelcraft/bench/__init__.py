"""Bench: a whole suite judged at once — `sources` (suites, KernelBench directories, pairs files),
`run` (the resumable run through the pool), `baselines` (torch.compile, CUDA graphs), `metrics`
(fast_p, geomeans) and `report` (HTML)."""
