"""What a bench run is asked to do (`BenchOptions`): its own module, so the run and the summary both use
it without importing each other. The judging rules are one `Protocol`; the rest is what to run and how."""
from __future__ import annotations

from dataclasses import dataclass, field

from kernelcraft.protocol import Protocol


@dataclass
class BenchOptions:
    device: str | None = None
    baselines: str | None = None  # "eager,inductor,cudagraph" (see baselines.parse)
    protocol: Protocol = field(default_factory=Protocol)  # candidates and baselines alike; pinned in bench.json
    jobs: int | None = None
    limit: int | None = None
    baselines_only: bool = False
    baseline_cache: bool = True
    cache_dir: str | None = None
    policy: str = "recipes"
    budget: int = 8
    task_jobs: int | None = None  # tasks optimized at once (default: one per device; docs/design/bench.md#run)
    optimize_options: dict = field(default_factory=dict)  # more optimize.Options fields
    report: bool = True
