"""The training run's configuration: one YAML file, validated by pydantic before anything runs.

Every section forbids unknown keys; relative paths start at the config file's directory; `service.options`
are `Protocol` knobs plus `device`, checked with `Protocol.make`, never a knob in `protocol.WEAKENING`;
secrets come from environment variables the config names (`api_key_env`), never from the file.

Rationale: docs/design/train.md#config
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from kernelcraft.protocol import WEAKENING, Protocol, ProtocolError


class ConfigError(ValueError):
    """The config file cannot be used (missing, not YAML, invalid values): one message naming the keys."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LoraSettings(_Section):
    r: int = Field(16, ge=1)
    alpha: int = Field(32, ge=1)
    dropout: float = Field(0.05, ge=0, lt=1)
    target_modules: str | list[str] = "all-linear"


class ModelSettings(_Section):
    path: str = Field(..., description="a local model directory (save_pretrained layout); nothing is downloaded")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    lora: LoraSettings | None = None
    gradient_checkpointing: bool = False


class PairsSource(_Section):
    path: str = Field(..., description="a pairs file (CUDA-L1 release format: JSON lines with ref_code, custom_code)")
    verdicts: list[str] = Field(default_factory=list, description="verdicts.jsonl files from `kernelcraft bench` "
                                "of this pairs file: a row enters only with a `correct` verdict")
    name: str | None = None


class DataSettings(_Section):
    run_dbs: list[str] = Field(default_factory=list, description="run directories (searched for run.db)")
    pairs: list[PairsSource] = Field(default_factory=list)
    heldout_fraction: float = Field(0.1, ge=0, lt=1)
    min_speedup: float = Field(0.0, ge=0, description="keep correct examples with at least this speedup")
    seed: int = 0
    licence: str = Field("", description="what the dataset card says about licences, beside each source's")


class ServiceSettings(_Section):
    url: str = "http://127.0.0.1:8000"
    api_key_env: str = "KERNELCRAFT_API_KEY"
    options: dict = Field(default_factory=dict, description="per-request options: Protocol knobs and device")
    timeout_s: float = Field(3600.0, gt=0)
    max_batch: int = Field(64, ge=1, le=512, description="items per batch request")

    @field_validator("options")
    @classmethod
    def _protocol_knobs(cls, v: dict) -> dict:
        v = dict(v)
        device = v.pop("device", None)
        if device is not None and not (device == "cpu" or device == "cuda" or
                                       (device.startswith("cuda:") and device[5:].isdigit())):
            raise ValueError(f"device must be cpu, cuda or cuda:N, not {device!r}")
        weak = sorted(set(v) & set(WEAKENING))
        if weak:
            raise ValueError(f"{', '.join(weak)}: only weakens the judge and is never accepted by the service")
        try:
            Protocol.make(**v)
        except ProtocolError as e:
            raise ValueError(str(e)) from None
        return {**v, **({"device": device} if device else {})}

    def api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) or None


class SFTSettings(_Section):
    epochs: float = Field(1.0, gt=0)
    max_steps: int | None = Field(None, ge=1)
    learning_rate: float = Field(2e-5, gt=0)
    lr_scheduler: str = "linear"
    batch_size: int = Field(1, ge=1)
    grad_accum: int = Field(1, ge=1)
    max_length: int = Field(8192, ge=16)
    save_steps: int = Field(100, ge=1)
    save_total_limit: int = Field(2, ge=1)
    logging_steps: int = Field(10, ge=1)


class GeneratorSettings(_Section):
    """An OpenAI-compatible server (vLLM) to sample from instead of transformers' generate."""
    base_url: str
    model: str
    api_key_env: str = "OPENAI_API_KEY"
    concurrency: int = Field(16, ge=1)


class SelfTrainSettings(_Section):
    rounds: int = Field(1, ge=0)
    samples_per_task: int = Field(4, ge=1)
    temperature: float = Field(0.8, ge=0, description="0: greedy")
    max_new_tokens: int = Field(2048, ge=1)
    generation_batch: int = Field(4, ge=1)
    min_speedup: float = Field(0.0, ge=0, description="keep correct samples with at least this speedup")
    sft: SFTSettings = Field(default_factory=SFTSettings)
    generator: GeneratorSettings | None = None
    tasks: list[str] | None = Field(None, description="built-in names or task files (default: the train split's)")


class RewardSettings(_Section):
    fail: float = Field(0.0, description="raw reward of a candidate that is not correct")
    cheat: float = Field(0.0, description="raw reward of a rejected candidate (and of one that fails a check)")
    unparsable: float = Field(0.0, description="raw reward of a completion without a usable ModelNew")
    conservative: bool = Field(False, description="score a correct candidate by its speedup's 95% CI low end")
    window: int = Field(64, ge=2, description="running window of raw rewards per task for (r - mu) / sigma")
    clip: float = Field(1.5, gt=0, description="smoothed rewards are clipped to +-clip")
    jump_above: float | None = Field(3.0, gt=0, description="a speedup above this is re-measured before it counts")
    jump_vs_best: float | None = Field(2.0, gt=1, description="... and so is one above this times the task's best")
    remeasure: int = Field(2, ge=1, description="fresh-worker evaluations of a jump")
    max_spread: float = Field(2.0, gt=1, description="re-measured speedups further apart than this: rejected")


class JudgeModelSettings(_Section):
    """An OpenAI-compatible model that reviews suspicious candidates and may veto their reward."""
    model: str
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    similar: int = Field(3, ge=0, description="most similar stored hack cases shown as context")
    max_tokens: int = Field(512, ge=16)
    temperature: float = Field(0.0, ge=0)


class GRPOSettings(_Section):
    steps: int = Field(100, ge=1)
    prompts_per_step: int = Field(2, ge=1)
    group_size: int = Field(4, ge=2, description="completions per prompt (TRL's num_generations)")
    max_completion_length: int = Field(2048, ge=1)
    temperature: float = Field(1.0, gt=0)
    learning_rate: float = Field(1e-6, gt=0)
    beta: float = Field(0.04, ge=0, description="KL coefficient")
    exemplars: int = Field(2, ge=0, description="earlier variants shown per prompt")
    tau: float = Field(1.0, gt=0, description="temperature of the contrastive bucket draw")
    bucket_width: float = Field(0.1, gt=0)
    selector: Literal["contrastive", "random"] = "contrastive"
    reward: RewardSettings = Field(default_factory=RewardSettings)
    judge_model: JudgeModelSettings | None = None
    save_steps: int = Field(10, ge=1)
    save_total_limit: int = Field(2, ge=1)
    logging_steps: int = Field(1, ge=1)
    vllm_server_url: str | None = Field(None, description="generate through TRL's vLLM server mode")
    tasks: list[str] | None = Field(None, description="built-in names or task files (default: the train split's)")


class BudgetSettings(_Section):
    evaluations: int | None = Field(None, ge=1, description="stop GRPO after the service judged this many")
    wall_s: float | None = Field(None, gt=0, description="stop GRPO after this many seconds (across resumes)")


class PromptSettings(_Section):
    backend: Literal["any", "cuda", "triton", "pytorch"] = "any"
    device_description: str | None = Field(None, description="the target device as prompts describe it "
                                           "(default: described from the service's device, on this machine)")
    tolerance: str = "1e-4 for float32"


class TrainConfig(_Section):
    out: str = Field(..., description="the run directory: data, checkpoints, models, metrics, databases")
    seed: int = 0
    device: str | None = Field(None, description="where the trainer runs: cpu or cuda (default: cuda if visible)")
    model: ModelSettings
    data: DataSettings = Field(default_factory=DataSettings)
    service: ServiceSettings = Field(default_factory=ServiceSettings)
    prompt: PromptSettings = Field(default_factory=PromptSettings)
    sft: SFTSettings = Field(default_factory=SFTSettings)
    selftrain: SelfTrainSettings = Field(default_factory=SelfTrainSettings)
    grpo: GRPOSettings = Field(default_factory=GRPOSettings)
    budget: BudgetSettings = Field(default_factory=BudgetSettings)
    base_dir: str = Field(".", exclude=True, description="where relative paths start (the config's directory)")

    @model_validator(mode="after")
    def _check(self):
        if self.device not in (None, "cpu") and not str(self.device).startswith("cuda"):
            raise ValueError(f"device must be cpu or cuda, not {self.device!r}")
        return self

    def path(self, p: str) -> Path:
        """`p` with `~` and `$VARS` expanded, relative to the config's directory; an unset variable is an error."""
        expanded = os.path.expandvars(os.path.expanduser(p))
        unset = re.search(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", expanded)
        if unset:
            raise ConfigError(f"{p}: the environment variable {unset.group(1)} is not set")
        q = Path(expanded)
        return q if q.is_absolute() else Path(self.base_dir) / q

    @property
    def out_dir(self) -> Path:
        return self.path(self.out)


def load_config(path: str | Path, **overrides) -> TrainConfig:
    """Read and validate a YAML config; `overrides` replace top-level keys (e.g. out=...)."""
    yaml = _yaml()
    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config not found: {p}") from None
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"{p}: not a readable YAML file: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{p}: expected a mapping of settings at the top level")
    raw.update({k: v for k, v in overrides.items() if v is not None})
    return parse_config(raw, base_dir=p.resolve().parent, where=str(p))


def parse_config(raw: dict, *, base_dir: str | Path = ".", where: str = "config") -> TrainConfig:
    try:
        return TrainConfig.model_validate({**raw, "base_dir": str(base_dir)})
    except ValidationError as e:
        parts = []
        for err in e.errors()[:10]:
            loc = ".".join(str(x) for x in err.get("loc", ()))
            msg = err.get("msg", "invalid").removeprefix("Value error, ")
            parts.append(f"{loc or 'top level'}: {msg}")
        raise ConfigError(f"{where}: " + "; ".join(parts)) from None


def _yaml():
    try:
        import yaml
    except ImportError:
        raise ConfigError("reading a config needs PyYAML: pip install 'kernelcraft[train]'") from None
    return yaml
