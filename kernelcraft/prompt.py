"""The optimisation prompt: reference, device, scored exemplars, recent failures, rules and protocol.

Design decisions
- The words live in template files under `kernelcraft/prompts/` (`string.Template`, `$name`
  placeholders): editing the prompt never means editing code. Substituted values are inserted
  verbatim, so code containing `$` is safe.
- The device is described from the caller's own torch queries (name, SM count, memory, capability);
  nothing of a candidate runs here.
- Exemplars are shown best first with their measured speedups, so the model can contrast them (the
  "Performance Analysis" section asks why the faster ones are faster). Failures carry the harness's
  message (compiler errors, mismatch details) trimmed to a length a model can use.
- `build_prompt` is pure: same inputs, same text (tests compare prompts; replays reproduce them).
"""
from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path
from string import Template

from kernelcraft.exemplars import Exemplar

PROMPTS_DIR = Path(__file__).parent / "prompts"
MAX_MESSAGE_CHARS = 1500
MAX_SOURCE_CHARS = 12000

BACKENDS = {
    "any": "any — CUDA via `torch.utils.cpp_extension.load_inline`, Triton, or PyTorch-level rewrites; "
           "whatever is fastest and correct.",
    "cuda": "custom CUDA C++ kernels compiled with `torch.utils.cpp_extension.load_inline`; at least one "
            "kernel of your own must run in `forward`.",
    "triton": "Triton kernels (`@triton.jit`); at least one kernel of your own must run in `forward`.",
    "pytorch": "PyTorch operations only (no custom kernels): algorithmic and memory-layout rewrites.",
}


def template(name: str) -> Template:
    return Template((PROMPTS_DIR / name).read_text())


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
    import torch

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and torch.cuda.is_available():
        idx = int(device.split(":", 1)[1]) if ":" in device else torch.cuda.current_device()
        p = torch.cuda.get_device_properties(idx)
        return DeviceInfo("cuda", p.name, p.multi_processor_count, p.total_memory / 2 ** 30,
                          f"{p.major}.{p.minor}", torch=torch.__version__, cuda=torch.version.cuda)
    return DeviceInfo("cpu", _cpu_name(), cores=os.cpu_count(), torch=torch.__version__)


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@dataclass
class Failure:
    id: int
    status: str
    reasons: list[str]
    message: str


@dataclass
class Prompt:
    system: str
    user: str

    def messages(self) -> list[dict]:
        return [{"role": "system", "content": self.system}, {"role": "user", "content": self.user}]

    def text(self) -> str:
        """Both messages as one string (what the run database stores)."""
        return f"[system]\n{self.system}\n[user]\n{self.user}"


def _trim(text: str, limit: int) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit // 2] + "\n[...]\n" + text[-limit // 2:]


def render_exemplars(exemplars: list[Exemplar]) -> str:
    if not exemplars:
        return template("no_exemplars.md").substitute().strip()
    best = max(e.speedup for e in exemplars)
    parts = []
    for rank, e in enumerate(sorted(exemplars, key=lambda e: -e.speedup), 1):
        label = "the fastest shown" if e.speedup == best else f"{best / e.speedup:.2f}x slower than the fastest shown"
        parts.append(template("exemplar.md").substitute(
            rank=rank, speedup=f"{e.speedup:.2f}x", label=label,
            techniques=", ".join(e.techniques) or "unknown", source=_trim(e.source, MAX_SOURCE_CHARS).rstrip()))
    return "\n".join(p.strip() + "\n" for p in parts).strip()


def render_failures(failures: list[Failure]) -> str:
    if not failures:
        return template("no_failures.md").substitute().strip()
    return "\n".join(template("failure.md").substitute(
        id=f.id, status=f.status, reasons=", ".join(f.reasons) or "-",
        message=_trim(f.message or "(no message)", MAX_MESSAGE_CHARS)).strip() + "\n" for f in failures).strip()


def build_prompt(reference: str, exemplars: list[Exemplar], failures: list[Failure], device: DeviceInfo, *,
                 backend: str = "any", tolerance: str = "1e-4 for float32") -> Prompt:
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}: use {', '.join(BACKENDS)}")
    user = template("optimize_user.md").substitute(
        reference=reference.strip(), device=device.describe(), exemplars=render_exemplars(exemplars),
        failures=render_failures(failures), backend=BACKENDS[backend], tolerance=tolerance)
    return Prompt(system=template("optimize_system.md").substitute().strip(), user=user.strip() + "\n")
