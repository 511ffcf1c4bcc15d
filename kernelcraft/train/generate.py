"""Sampling for self-training: completions per prompt from the current model, or from a server.

transformers' `generate` (seeded by the run's seed and the round; temperature 0 is greedy) or an
OpenAI-compatible server (`selftrain.generator`, which must serve the round's input model). Returns
(text, completion tokens) per prompt, in order.

Rationale: docs/design/train.md#generate
"""
from __future__ import annotations

import asyncio
import os
from pathlib import Path

from kernelcraft.train.models import TrainError, load_model, load_tokenizer, require


def generate_local(model_dir: str | Path, prompts: list[list[dict]], *, temperature: float, max_new_tokens: int,
                   batch: int, seed: int, device: str | None = None, dtype: str = "auto") -> list[tuple[str, int]]:
    torch = require("torch")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    tok = load_tokenizer(model_dir)
    model = load_model(model_dir, dtype=dtype, device=device).eval()
    torch.manual_seed(seed)
    out: list[tuple[str, int]] = []
    for i in range(0, len(prompts), batch):
        texts = [tok.apply_chat_template(p, add_generation_prompt=True, tokenize=False) for p in prompts[i:i + batch]]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
        with torch.no_grad():
            gen = model.generate(**enc, do_sample=temperature > 0, temperature=temperature if temperature > 0 else None,
                                 top_p=None, top_k=None, max_new_tokens=max_new_tokens, pad_token_id=tok.pad_token_id)
        for row in gen[:, enc["input_ids"].shape[1]:]:
            ids = row.tolist()
            if tok.eos_token_id in ids:
                ids = ids[:ids.index(tok.eos_token_id) + 1]
            ids = [t for t in ids if t != tok.pad_token_id]
            out.append((tok.decode(ids, skip_special_tokens=True), len(ids)))
    del model
    return out


def generate_server(settings, prompts: list[list[dict]], *, temperature: float,
                    max_new_tokens: int) -> list[tuple[str, int]]:
    try:
        import openai
    except ImportError:
        raise TrainError("selftrain.generator needs the openai package: pip install 'kernelcraft[llm]'") from None
    key = os.environ.get(settings.api_key_env) or "EMPTY"

    async def all_():
        client = openai.AsyncOpenAI(base_url=settings.base_url, api_key=key)
        sem = asyncio.Semaphore(settings.concurrency)

        async def one(msgs):
            async with sem:
                r = await client.chat.completions.create(model=settings.model, messages=msgs, temperature=temperature,
                                                         max_tokens=max_new_tokens)
            text = (r.choices[0].message.content if r.choices else "") or ""
            return text, int(getattr(r.usage, "completion_tokens", 0) or 0)

        try:
            return await asyncio.gather(*(one(p) for p in prompts))
        finally:
            await client.close()

    try:
        return asyncio.run(all_())
    except openai.OpenAIError as e:
        raise TrainError(f"selftrain.generator at {settings.base_url}: {e}") from None
