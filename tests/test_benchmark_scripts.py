"""The diagnostic benchmark scripts run on a CPU (their numbers belong in BENCHMARKS.md, not here)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_worker_phases_reports_each_harness_step(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "worker_phases.py"), "--task",
                        "tiny/level2/elementwise_chain", "--device", "cpu", "--reps", "1", "--time-budget", "0.2"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env={**os.environ, "KERNELCRAFT_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout
    assert "rep 0: correct" in out, out
    for step in ("Evaluation._check", "Evaluation._time", "SideProc.timed", "isolation.freeze", "worker.compare_outputs"):
        assert step in out, (step, out)
