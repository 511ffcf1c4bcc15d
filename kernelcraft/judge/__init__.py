"""Judge: one candidate against one task, in a fresh worker process — check, time, guard, report.

The caller's side (`runner`, `zygote`, `sandbox`, `procs`, `screen`) starts and watches workers and never
runs candidate code; the worker's side (`worker`, `compare`, `timing`, `guards`, `tripwires`,
`kerneltrace`) runs beside it. `kernelcraft.evaluate` turns what a worker reports into a verdict.
"""
