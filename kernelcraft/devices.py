"""Devices: what kernelcraft knows about the machine it judges on, in one place.

Device strings are `cpu`, `cuda` or `cuda:N`; `resolve` gives the device a judge process uses and the physical GPU
to make visible to it (it always sees its GPU as `cuda:0`). A GPU asked for where none is visible is a
`ValueError`, never a silent CPU run. Defaults hang on the device *kind*; a timing is specific to its *identity*
(`timing_identity`). The build arch is explicit (`arch_for`). torch is imported only inside the functions that
query it.

Rationale: docs/design/core.md#devices
"""
from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path


def kind(device: str) -> str:
    """'cuda' for any CUDA device string, else 'cpu'."""
    return "cuda" if device.startswith("cuda") else "cpu"


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve(device: str | None) -> tuple[str, str | None]:
    """('cpu' | 'cuda:N', the CUDA_VISIBLE_DEVICES value for the worker); ValueError for a bad device."""
    device = device or default_device()
    if device == "cpu":
        return "cpu", None
    if device == "cuda" or device.startswith("cuda:"):
        import torch

        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} requested but no CUDA GPU is visible")
        try:
            index = int(device.split(":", 1)[1]) if ":" in device else torch.cuda.current_device()
        except ValueError:
            raise ValueError(f"unknown device {device!r}: use cpu, cuda or cuda:N") from None
        if not 0 <= index < torch.cuda.device_count():
            raise ValueError(f"device {device!r}: only {torch.cuda.device_count()} GPU(s) visible")
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        physical = visible.split(",")[index].strip() if visible else str(index)
        return f"cuda:{index}", physical
    raise ValueError(f"unknown device {device!r}: use cpu, cuda or cuda:N")


def resolve_many(spec: str | None) -> list[str]:
    """Several devices for one run (`bench`): `cuda:all` (every visible GPU), a comma list `cuda:0,cuda:2`, or
    one device as in `resolve`. Every GPU of the list must be the same product, so that one timing identity
    (`bench.json`'s pin, the baseline cache's key) holds for all of them; ValueError otherwise."""
    if spec == "cuda:all":
        gpus = visible_devices()
        if gpus == ["cpu"]:
            raise ValueError("device 'cuda:all' requested but no CUDA GPU is visible")
    else:
        parts = [p.strip() for p in (spec or "").split(",")] if spec else [None]
        if any(p == "" for p in parts):
            raise ValueError(f"bad device list {spec!r}: use cpu, cuda, cuda:N, cuda:N,cuda:M or cuda:all")
        gpus = [resolve(p)[0] for p in parts]
        if len(gpus) > 1 and "cpu" in gpus:
            raise ValueError(f"bad device list {spec!r}: a CPU cannot be mixed with GPUs")
    gpus = list(dict.fromkeys(gpus))
    names = {timing_identity(d) for d in gpus}
    if len(names) > 1:
        raise ValueError(f"devices {', '.join(gpus)} are different GPUs ({', '.join(sorted(names))}): timings of one "
                         "run must come from one kind of GPU; run one bench per kind")
    return gpus


def visible_devices() -> list[str]:
    """Every visible GPU (`cuda:N`), else `['cpu']`."""
    import torch

    if torch.cuda.is_available():
        return [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    return ["cpu"]


def arch_for(capability: tuple[int, int] | None) -> str | None:
    """The TORCH_CUDA_ARCH_LIST entry for a GPU of this compute capability (None: torch's default)."""
    if capability is None:
        return os.environ.get("KERNELCRAFT_CUDA_ARCH")
    major, minor = capability
    return os.environ.get("KERNELCRAFT_CUDA_ARCH") or f"{major}.{minor}{'a' if major == 9 else ''}"


def arch_of(device: str) -> str | None:
    """The build arch of a device string (None on a CPU)."""
    if kind(device) != "cuda":
        return None
    import torch

    index = int(device.split(":", 1)[1]) if ":" in device else 0
    return arch_for(torch.cuda.get_device_capability(index))


def default_jobs(device: str) -> int:
    """Evaluations at once on one device when the caller does not say. On a GPU the device lock covers each
    worker's device phase, so more jobs only overlap start-up (up to 4); on a CPU a compile beside a timed
    candidate would be timed too, so one below 8 cores."""
    cores = os.cpu_count() or 2
    return max(1, min(4, cores)) if kind(device) == "cuda" else (1 if cores < 8 else 2)


@dataclass
class DeviceInfo:
    kind: str  # "cuda" | "cpu"
    name: str
    sm_count: int | None = None
    memory_gib: float | None = None
    capability: str | None = None
    cores: int | None = None
    torch: str = ""
    cuda: str | None = None

    def describe(self) -> str:
        if self.kind == "cuda":
            return (f"{self.name}: {self.sm_count} SMs, {self.memory_gib:.1f} GiB memory, compute capability "
                    f"{self.capability}; PyTorch {self.torch}, CUDA {self.cuda}.")
        return (f"CPU: {self.name}, {self.cores} cores; PyTorch {self.torch}. No GPU: CUDA and Triton kernels "
                "cannot run here, so optimise at the PyTorch level (algorithm, memory layout, fewer ops).")


def device_info(device: str | None = None) -> DeviceInfo:
    """The device as the caller's own torch sees it (nothing of a candidate runs here)."""
    import torch

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and torch.cuda.is_available():
        idx = int(device.split(":", 1)[1]) if ":" in device else torch.cuda.current_device()
        p = torch.cuda.get_device_properties(idx)
        return DeviceInfo("cuda", p.name, p.multi_processor_count, p.total_memory / 2 ** 30,
                          f"{p.major}.{p.minor}", torch=torch.__version__, cuda=torch.version.cuda)
    return DeviceInfo("cpu", cpu_name(), cores=os.cpu_count(), torch=torch.__version__)


def timing_identity(device: str) -> str:
    """What a timing is specific to: the GPU's name, or the CPU model and core count."""
    info = device_info(device)
    if info.kind == "cuda":
        return f"cuda {info.name}"
    return f"cpu {info.name} x{info.cores}"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
