"""Prompts and completions as training text: chat messages in, the candidate's code out.

Prompts are the search's (`search.prompt.build_prompt`), so a trained model is asked what `optimize` asks;
completions are parsed by the search's reply parser (`search.reply.parse_reply`). A template completion
(`train/prompts/completion.md`) states only what was measured and what the code does.

Rationale: docs/design/train.md#prompting
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from string import Template

from kernelcraft.search.exemplars import Exemplar
from kernelcraft.search.prompt import build_prompt
from kernelcraft.search.reply import parse_reply
from kernelcraft.search.techniques import techniques

TEMPLATES = Path(__file__).parent / "prompts"


@dataclass(frozen=True)
class Described:
    """A device known only by its description (what `build_prompt` needs of a DeviceInfo)."""
    text: str

    def describe(self) -> str:
        return self.text


def template(name: str) -> Template:
    return Template((TEMPLATES / name).read_text())


def target_device(cfg) -> Described:
    """The device prompts describe: the config's words, else the service's device as this machine sees it."""
    if cfg.prompt.device_description:
        return Described(cfg.prompt.device_description)
    from kernelcraft.devices import device_info

    dev = cfg.service.options.get("device") or "cpu"
    return Described(device_info(dev).describe())


def device_from_verdict(verdict: dict) -> Described:
    """The device a verdict was measured on, in words (for examples from pairs files)."""
    env = verdict.get("env") or {}
    gpu = env.get("gpu")
    where = gpu or ("CPU" if str(verdict.get("device", "cpu")).startswith("cpu") else verdict.get("device"))
    cuda = f", CUDA {env['cuda']}." if env.get("cuda") else "."
    return Described(f"{where}; PyTorch {env.get('torch', '?')}{cuda}")


def messages(reference: str, exemplars: list[Exemplar], device, cfg_prompt=None) -> list[dict]:
    kw = {} if cfg_prompt is None else {"backend": cfg_prompt.backend, "tolerance": cfg_prompt.tolerance}
    return build_prompt(reference, exemplars, [], device, **kw).messages()


def messages_from_stored(text: str) -> list[dict] | None:
    """A prompt as the run database stores it (`Prompt.text()`: "[system]\\n...\\n[user]\\n...") -> messages."""
    if not text or not text.startswith("[system]\n") or "\n[user]\n" not in text:
        return None
    system, user = text[len("[system]\n"):].split("\n[user]\n", 1)
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def completion_text(code: str, speedup: float, device_words: str, meta: dict | None = None) -> str:
    """The three-section answer for a candidate that has no reply of its own."""
    tech = ", ".join(techniques(code, meta))
    return template("completion.md").substitute(techniques=tech[:1].upper() + tech[1:], speedup=f"{speedup:.2f}x",
                                                device=device_words.rstrip("."), code=code.strip("\n")).strip() + "\n"


def completion_content(completion) -> str:
    """The text of a completion: a string, or TRL's conversational form (a list of messages)."""
    if isinstance(completion, list):
        return "".join(m.get("content") or "" for m in completion if isinstance(m, dict))
    return completion if isinstance(completion, str) else ""


def extract_code(completion) -> tuple[str | None, str]:
    """(candidate source or None, the parser's reason when None)."""
    parsed = parse_reply(completion_content(completion))
    return (parsed.code, "") if parsed.ok else (None, parsed.reason or "parse_error")
