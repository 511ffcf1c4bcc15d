"""The Ray backend: a local Ray cluster started by the test gives the same verdicts as the local pool, and a
timing actor killed mid-evaluation (what a node death looks like to the driver) is restarted and the
candidate retried, so it still gets its real verdict. Skipped without ray (`pip install kernelcraft[ray]`).
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from kernelcraft.serve.cluster import RayPool  # noqa: E402
from kernelcraft.serve.pool import Pool  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures"
TINY = FIXTURES / "tasks" / "tiny_elementwise.py"
QUICK = dict(timing=False, trials=2, timeout_s=30.0)
CANDS = ["legit/torch_elementwise.py", "faults/segfault_forward.py", "faults/value_mismatch.py",
         "faults/no_modelnew.py", "faults/exception_forward.py"]

SLOW = '''
import time
import torch.nn as nn

class ModelNew(nn.Module):
    def __init__(self, alpha):
        super().__init__()
        self.alpha = alpha

    def forward(self, a, b):
        time.sleep(1.5)
        return self.alpha * a + b
'''


@pytest.fixture(scope="module")
def local_ray(cache_dir):
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def _key(v):
    c = v.correctness
    return (v.task, v.candidate_sha256, v.status, tuple(v.reasons), v.mode, c.passed if c else None,
            c.trials if c else None)


def test_ray_pool_gives_the_same_verdicts_as_the_local_pool(local_ray, cache_dir):
    pairs = [(TINY, FIXTURES / c) for c in CANDS]
    with Pool("cpu", per_device=2, build_workers=1, **QUICK) as pool:
        local = pool.map(pairs)
    rpool = RayPool(devices="cpu", cpu_timing=2, cache_dir=cache_dir, **QUICK)
    try:
        assert rpool.devices == ["cpu", "cpu"] and rpool.build_workers == 1
        remote = rpool.map(pairs)
        stats = rpool.stats()
    finally:
        rpool.close()
    assert [_key(v) for v in remote] == [_key(v) for v in local]
    assert [v.status for v in remote] == ["correct", "runtime_error", "incorrect", "compile_error",
                                          "runtime_error"]
    assert stats["completed"] == len(CANDS) and stats["harness_errors"] == 0


def test_a_killed_actor_is_restarted_and_its_candidate_retried(local_ray, cache_dir):
    rpool = RayPool(devices="cpu", cpu_timing=1, cache_dir=cache_dir, **QUICK)
    try:
        slot = next(s for s in rpool._slots if s.role == "time")
        pid = ray.get(slot.run.actor.info.remote())["pid"]
        fut = rpool.submit(TINY, SLOW)
        deadline = time.monotonic() + 60
        while rpool.stats()["timing"] < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(3.0)  # inside the evaluation (worker started, trials sleeping)
        os.kill(pid, signal.SIGKILL)
        v = fut.result(timeout=180)
        assert v.status == "correct", f"{v.status}/{v.reasons}: {v.message}"
        new_pid = ray.get(slot.run.actor.info.remote())["pid"]
        assert new_pid != pid, "the actor was restarted"
        assert rpool.stats()["harness_errors"] == 0
    finally:
        rpool.close()


def test_gpu_timing_actors_share_a_gpu_by_fractions():
    """`per_gpu` timing actors per GPU, each asking Ray for 1/per_gpu of one: Ray packs them onto one GPU (whose
    device gate lets their checks share it and their timings take turns)."""
    from kernelcraft.serve.cluster import timing_actor_options

    assert timing_actor_options(1) == {"num_gpus": 1.0, "num_cpus": 0}
    opts = timing_actor_options(3)
    assert opts["num_cpus"] == 0 and 3 * opts["num_gpus"] <= 1.0 and 4 * opts["num_gpus"] > 1.0


def test_ray_backend_makes_per_gpu_slots_on_a_cluster_with_gpus(local_ray):
    """A cluster that declares GPUs: `per_gpu` timing slots per GPU, the default by its CPUs per GPU."""
    from kernelcraft.serve.cluster import RayBackend

    b = RayBackend(devices="cuda", gpus=2, per_gpu=3)
    assert b.devices() == ["cuda"] * 6 and b.per_gpu == 3
    with pytest.raises(ValueError, match="per_gpu"):
        RayBackend(devices="cuda", gpus=1, per_gpu=0)
    cpu = RayBackend(devices="cpu", cpu_timing=2, per_gpu=5)
    assert cpu.devices() == ["cpu", "cpu"]


def test_build_actors_never_wait_for_cpus_the_timing_actors_hold():
    """On a 2-CPU host two CPU timing actors hold both CPUs: a build actor that reserved one would never start."""
    from kernelcraft.serve.cluster import build_actor_cpus

    assert build_actor_cpus(8, 2) == 1 and build_actor_cpus(3, 2) == 1
    assert build_actor_cpus(2, 2) == 0 and build_actor_cpus(1, 2) == 0
    assert build_actor_cpus(16, 0) == 1  # GPU timing actors take no CPU
