"""The Ray backend: the local scheduler's slots, backed by Ray actors on many GPUs and hosts.

The pool, its queueing and its verdicts are unchanged; actors only move the call to another process or host,
where the candidate still runs in its own fresh worker. Tasks, candidates and verdicts travel as values; only
the build cache benefits from a shared filesystem. `ray` is imported only when a backend is made.
Rationale: docs/design/serve.md#cluster
"""
from __future__ import annotations

import os
import socket
from typing import Callable

from kernelcraft.devices import arch_of
from kernelcraft.evaluate import evaluate, prebuild
from kernelcraft.serve.pool import Pool, gpu_slots
from kernelcraft.verdict import Verdict


class _Actor:
    """Runs in a Ray worker process: one call at a time, each in a fresh kernelcraft worker (forked by this
    process's zygote, or spawned)."""

    def __init__(self, cache_dir: str | None):
        self.cache_dir = cache_dir

    def info(self) -> dict:
        import torch  # in the actor process: the caller of RayPool need not import torch

        gpu = torch.cuda.is_available()
        return {"host": socket.gethostname(), "pid": os.getpid(),
                "gpu": torch.cuda.get_device_name(0) if gpu else None,
                "arch": arch_of("cuda:0") if gpu else None}

    def prebuild(self, cand, arch, opts) -> dict | None:
        v = prebuild(cand, arch=arch, cache_dir=self.cache_dir, timeout_s=opts["protocol"].build_timeout_s)
        return None if v is None else v.to_json()

    def evaluate(self, task, cand, device, opts) -> dict:
        return evaluate(task, cand, device=device, cache_dir=self.cache_dir, **opts).to_json()


def timing_actor_options(per_gpu: int) -> dict:
    """A GPU timing actor's Ray resources: 1/`per_gpu` of one GPU (Ray packs `per_gpu` of them on each), no CPU."""
    return {"num_gpus": 1 / per_gpu, "num_cpus": 0}


def build_actor_cpus(cluster_cpus: int, timing_cpus: int) -> int:
    """The CPUs a build actor reserves: one, unless the timing actors leave less than one for it (a 2-CPU host with
    two CPU timing slots), where it reserves none rather than wait for a CPU no actor will ever free."""
    return 1 if cluster_cpus - timing_cpus >= 1 else 0


def _ray():
    try:
        import ray
    except ImportError:
        raise ImportError("the Ray backend needs ray: pip install 'kernelcraft[ray]'") from None
    return ray


class RayBackend:
    """Slots backed by Ray actors. `address`: None/"local" starts a local Ray; "auto" or "ray://..."
    joins a cluster. `devices`: "cuda" (`per_gpu` timing actors per cluster GPU, each holding 1/`per_gpu` of it,
    the default when the cluster has GPUs; `per_gpu` defaults to the local pool's `gpu_slots` for the cluster's
    CPUs per GPU) or "cpu" (`cpu_timing` CPU actors). Actors on one GPU share it as a local pool's slots do (the
    device gate, `judge/speed/gate.py`)."""

    def __init__(self, address: str | None = None, *, devices: str | None = None, gpus: int | None = None,
                 cpu_timing: int = 2, cache_dir: str | os.PathLike | None = None, init_kwargs: dict | None = None,
                 per_gpu: int | None = None):
        ray = _ray()
        if not ray.is_initialized():
            kw = dict(init_kwargs or {})
            if address not in (None, "local", "ray"):
                kw["address"] = address
            ray.init(**{"include_dashboard": False, "log_to_driver": False, **kw})
        self.ray = ray
        self.cache_dir = str(cache_dir) if cache_dir else os.environ.get("KERNELCRAFT_CACHE")
        res = ray.cluster_resources()
        n_gpu = int(res.get("GPU", 0)) if gpus is None else gpus
        self.kind = devices or ("cuda" if n_gpu else "cpu")
        if self.kind not in ("cuda", "cpu"):
            raise ValueError(f"cluster devices must be cuda or cpu, not {self.kind!r}")
        if self.kind == "cuda" and n_gpu < 1:
            raise ValueError("devices='cuda' but the Ray cluster has no GPUs")
        if per_gpu is not None and per_gpu < 1:
            raise ValueError(f"per_gpu must be at least 1, not {per_gpu}")
        self.per_gpu = (per_gpu or gpu_slots(n_gpu, cores=int(res.get("CPU", 1)))) if self.kind == "cuda" else 1
        self.n_timing = n_gpu * self.per_gpu if self.kind == "cuda" else cpu_timing
        self.build_cpus = build_actor_cpus(int(res.get("CPU", 1)), self.n_timing if self.kind == "cpu" else 0)
        self.remote_cls = ray.remote(max_restarts=-1, max_task_retries=1)(_Actor)
        self._actors: dict[int, object] = {}
        self._arch: str | None = None
        self._arch_known = False

    # -- the pool's backend interface ----------------------------------------------------------------
    def devices(self) -> list[str]:
        return [self.kind] * self.n_timing

    def _actor(self, timing: bool):
        if timing:
            opts = timing_actor_options(self.per_gpu) if self.kind == "cuda" else {"num_cpus": 1}
        else:
            opts = {"num_cpus": self.build_cpus}
        return self.remote_cls.options(**opts).remote(self.cache_dir)

    def _call(self, actor, method: str, *args):
        return self.ray.get(getattr(actor, method).remote(*args))

    def build_slot(self, index: int) -> Callable:
        actor = self._actor(timing=False)
        def run(cand, arch, opts):
            rec = self._call(actor, "prebuild", cand, arch, opts)
            return None if rec is None else Verdict.model_validate(rec)

        run.actor = actor
        return run

    def timing_slot(self, device: str) -> Callable:
        actor = self._actor(timing=True)

        def run(task, cand, opts):
            return Verdict.model_validate(self._call(actor, "evaluate", task, cand, device, opts))

        run.actor = actor
        if not self._arch_known and self.kind == "cuda":
            self._arch, self._arch_known = self._call(actor, "info")["arch"], True
        return run

    def arch(self, device: str) -> str | None:
        return self._arch if device.startswith("cuda") else None

    def discard(self, run: Callable) -> None:
        try:
            self.ray.kill(run.actor, no_restart=True)
        except Exception:
            pass

    def close(self) -> None:
        pass  # actors go with their handles; the Ray runtime belongs to whoever started it


def RayPool(address: str | None = None, *, devices: str | None = None, gpus: int | None = None,
            cpu_timing: int = 2, build_workers: int | None = None, cache_dir=None,
            init_kwargs: dict | None = None, stall_s: float | None = None, per_gpu: int | None = None,
            **defaults) -> Pool:
    """A `Pool` whose slots are Ray actors (`per_gpu` per GPU: `RayBackend`). Build slots default to the
    cluster's CPU count minus what the timing actors take (at least 1)."""
    backend = RayBackend(address, devices=devices, gpus=gpus, cpu_timing=cpu_timing, cache_dir=cache_dir,
                         init_kwargs=init_kwargs, per_gpu=per_gpu)
    if build_workers is None:
        cpus = int(backend.ray.cluster_resources().get("CPU", 1))
        build_workers = max(1, cpus - (backend.n_timing if backend.kind == "cpu" else 0))
    return Pool(backend.devices(), per_device=1, backend=backend, build_workers=build_workers, cache_dir=cache_dir,
                stall_s=stall_s, **defaults)
