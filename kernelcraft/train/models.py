"""Models for training: a local HF directory loaded for a stage, or a random model built from a config.

Nothing is downloaded: a model is a local `save_pretrained` directory. `build_random_model` writes one
(presets `tiny`, `0.5b`) with a byte-level BPE tokenizer trained offline, speaking ChatML. A stage's result is
saved merged (LoRA folded in) and whole (`save_merged`), so every stage hands the next a plain directory.
transformers, peft and tokenizers are imported inside functions (`require`).

Rationale: docs/design/train.md#models
"""
from __future__ import annotations

import importlib
from pathlib import Path

from kernelcraft.search.prompt import PROMPTS_DIR
from kernelcraft.task import SUITE_DIR


class TrainError(RuntimeError):
    """Training cannot proceed as configured (a missing extra, a bad model directory, bad data)."""


def require(module: str):
    """Import `module` or raise TrainError telling which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise TrainError(f"training needs {module.split('.')[0]} ({e}): pip install 'kernelcraft[train]'") from None


CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# Qwen2-style shapes. `0.5b`: 24 layers of hidden 1024 (GQA 16/4 heads, SwiGLU 5632) = ~0.49B parameters
# with this tokenizer's small vocabulary (Qwen2.5-0.5B's own shapes put 136M of its 494M in a 152k vocabulary).
PRESETS = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=8192, tie_word_embeddings=True),
    "0.5b": dict(hidden_size=1024, intermediate_size=5632, num_hidden_layers=24, num_attention_heads=16,
                 num_key_value_heads=4, max_position_embeddings=32768, tie_word_embeddings=False,
                 rope_theta=1_000_000.0),
}


def tokenizer_corpus(extra: list[str] = ()) -> list[str]:
    """What the offline tokenizer learns from: the suite's tasks, the prompt templates, and `extra`."""
    texts = [p.read_text() for p in sorted(SUITE_DIR.rglob("*.py"))]
    texts += [p.read_text() for p in sorted(PROMPTS_DIR.glob("*.md"))]
    texts += [p.read_text() for p in sorted((Path(__file__).parent / "prompts").glob("*.md"))]
    return texts + list(extra)


def build_tokenizer(vocab_size: int = 4096, extra: list[str] = ()):
    """A byte-level BPE tokenizer trained here (no download) with a ChatML chat template."""
    tk = require("tokenizers")
    transformers = require("transformers")
    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                     initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(tokenizer_corpus(extra), trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                                pad_token="<|endoftext|>", padding_side="left")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_random_model(out_dir: str | Path, preset: str = "tiny", *, vocab_size: int = 4096, seed: int = 0,
                       extra_corpus: list[str] = (), **overrides) -> Path:
    """Write a random-weight causal LM (Qwen2 architecture) and its offline tokenizer to `out_dir`."""
    if preset not in PRESETS:
        raise TrainError(f"unknown model preset {preset!r}: use {', '.join(PRESETS)}")
    torch = require("torch")
    transformers = require("transformers")
    tok = build_tokenizer(vocab_size, list(extra_corpus))
    cfg = transformers.Qwen2Config(vocab_size=len(tok), eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                                   bos_token_id=None, **{**PRESETS[preset], **overrides})
    torch.manual_seed(seed)
    model = transformers.Qwen2ForCausalLM(cfg)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def parameter_count(model) -> int:
    return sum(p.numel() for p in model.parameters())


def check_model_dir(path: str | Path) -> Path:
    p = Path(path)
    if not (p / "config.json").is_file():
        raise TrainError(f"model {p}: not a local model directory (no config.json); nothing is downloaded — "
                         "point model.path at a save_pretrained directory (or `kernelcraft train init-model`)")
    return p


def load_tokenizer(path: str | Path):
    transformers = require("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(check_model_dir(path)))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    if not getattr(tok, "chat_template", None):
        tok.chat_template = CHAT_TEMPLATE
    return tok


def load_model(path: str | Path, *, dtype: str = "auto", device: str | None = None):
    torch = require("torch")
    transformers = require("transformers")
    torch_dtype = "auto" if dtype == "auto" else getattr(torch, dtype)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(check_model_dir(path)), dtype=torch_dtype)
    if device:
        model = model.to(device)
    return model


def lora_config(lora) -> object | None:
    """peft's LoraConfig from the run config's `model.lora` section (None: full fine-tuning)."""
    if lora is None:
        return None
    peft = require("peft")
    return peft.LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                           target_modules=lora.target_modules, task_type="CAUSAL_LM")


def save_merged(model, tokenizer, out_dir: str | Path) -> Path:
    """Save a stage's result as a plain model directory (LoRA adapters merged into the weights)."""
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    out = Path(out_dir)
    tmp = out.with_name(out.name + ".partial")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if out.exists():
        import shutil

        shutil.rmtree(out)
    tmp.rename(out)  # the directory appears whole or not at all: a stage is done once it exists
    return out
