"""The optimisation prompt: reference, device, scored exemplars, recent failures, rules and protocol.

The words live in `kernelcraft/search/prompts/` (`string.Template`; values inserted verbatim). Nothing of a
candidate runs here. `build_prompt` is pure: same inputs, same text.
Rationale: docs/design/search.md#prompt
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from string import Template

from kernelcraft.devices import DeviceInfo, device_info  # noqa: F401  (prompts describe the device)
from kernelcraft.search.exemplars import Exemplar

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
