"""The learnable stand-in policy: a small causal LM trained from scratch that writes programs, not CUDA.

A Qwen2-style transformer (the `tiny` preset's shapes) over a closed word vocabulary. Prompt:
`<task> features [<ex> program speed-word]* <prog>`; completion: program words `<end>`. Sampling is
restricted to program words and `<end>`. The SFT and GRPO updates are plain torch with TRL's objectives
(completion-token cross-entropy; one on-policy step with a k3 KL term, advantage = smoothed reward − group
mean).

Rationale: docs/design/train.md#standin
"""
from __future__ import annotations

import copy
import json
import math
from pathlib import Path

from kernelcraft.train.models import PRESETS, require

SPECIAL = ["<pad>", "<unk>", "<task>", "<ex>", "<prog>", "<end>"]
SPEED_BINS = [round(i * 0.25, 2) for i in range(-8, 13)]  # ln speedup -2.0 .. +3.0


def speed_word(speedup: float) -> str:
    x = math.log(max(float(speedup), 1e-6))
    b = min(SPEED_BINS, key=lambda v: abs(v - x))
    return f"s:{b:+.2f}"


class Vocab:
    def __init__(self, words: list[str], program_words: list[str] = ()):
        self.program_words = set(program_words)
        self.words = list(dict.fromkeys(SPECIAL + list(words) + list(program_words)))
        self.index = {w: i for i, w in enumerate(self.words)}

    @classmethod
    def build(cls, feature_lists: list[list[str]], program_words: list[str]) -> "Vocab":
        feats = sorted({w for f in feature_lists for w in f})
        return cls(feats + [speed_word(math.exp(b)) for b in SPEED_BINS], program_words)

    def encode(self, words: list[str]) -> list[int]:
        unk = self.index["<unk>"]
        return [self.index.get(w, unk) for w in words]

    def decode(self, ids: list[int]) -> str:
        return " ".join(self.words[i] for i in ids)

    def __len__(self) -> int:
        return len(self.words)


def prompt_words(features: list[str], exemplars: list[tuple[str, float]]) -> list[str]:
    """`exemplars`: (program text, measured speedup), best first."""
    out = ["<task>"] + list(features)
    for prog, speed in exemplars:
        out += ["<ex>"] + prog.split() + [speed_word(speed)]
    return out + ["<prog>"]


class StandIn:
    """The model, its vocabulary, sampling, and the SFT and GRPO updates."""

    def __init__(self, vocab: Vocab, *, seed: int = 0, max_words: int = 3, hidden: int | None = None):
        torch = require("torch")
        transformers = require("transformers")
        self.torch, self.vocab, self.max_words = torch, vocab, max_words
        shape = dict(PRESETS["tiny"], max_position_embeddings=256)
        if hidden:
            shape.update(hidden_size=hidden, intermediate_size=2 * hidden)
        cfg = transformers.Qwen2Config(vocab_size=len(vocab), pad_token_id=0, bos_token_id=None,
                                       eos_token_id=vocab.index["<end>"], **shape)
        torch.manual_seed(seed)
        self.model = transformers.Qwen2ForCausalLM(cfg)
        self.gen = torch.Generator().manual_seed(seed)
        self.not_program = torch.tensor([i for i, w in enumerate(vocab.words) if w not in vocab.program_words
                                         and w != "<end>"], dtype=torch.long)
        self.ref = None
        self.opt = None

    # -- batches -------------------------------------------------------------------------------------
    def _batch(self, prompts: list[list[int]], completions: list[list[int]]):
        """Left-padded prompt+completion ids, attention mask, and a mask of the completion tokens."""
        torch = self.torch
        seqs = [p + c for p, c in zip(prompts, completions)]
        n = max(len(s) for s in seqs)
        ids = torch.zeros(len(seqs), n, dtype=torch.long)
        att = torch.zeros(len(seqs), n, dtype=torch.long)
        comp = torch.zeros(len(seqs), n, dtype=torch.bool)
        for i, (p, c) in enumerate(zip(prompts, completions)):
            off = n - len(p) - len(c)
            ids[i, off:] = torch.tensor(p + c)
            att[i, off:] = 1
            comp[i, off + len(p):] = True
        return ids, att, comp

    def _token_logps(self, model, ids, att):
        torch = self.torch
        pos = (att.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=ids, attention_mask=att, position_ids=pos).logits[:, :-1]
        logp = torch.log_softmax(logits.float(), -1)
        return logp.gather(-1, ids[:, 1:, None]).squeeze(-1)  # log p of token t+1 given the prefix

    # -- sampling ------------------------------------------------------------------------------------
    def sample(self, prompts: list[list[str]], *, temperature: float = 1.0) -> list[str]:
        """One program per prompt (text without `<end>`; an unfinished one as far as it got)."""
        torch = self.torch
        enc = [self.vocab.encode(p) for p in prompts]
        end = self.vocab.index["<end>"]
        done = [False] * len(enc)
        outs: list[list[int]] = [[] for _ in enc]
        self.model.eval()
        with torch.no_grad():
            for _ in range(self.max_words + 1):
                ids, att, _ = self._batch(enc, outs)
                pos = (att.cumsum(-1) - 1).clamp(min=0)
                logits = self.model(input_ids=ids, attention_mask=att, position_ids=pos).logits[:, -1].float()
                logits[:, self.not_program] = -1e9  # the grammar: program words and <end> only
                probs = torch.softmax(logits / max(temperature, 1e-4), -1)
                nxt = torch.multinomial(probs, 1, generator=self.gen).squeeze(-1).tolist()
                for i, t in enumerate(nxt):
                    if not done[i]:
                        outs[i].append(t)
                        done[i] = t == end
                if all(done):
                    break
        return [self.vocab.decode([t for t in o if t != end]) for o in outs]

    # -- updates -------------------------------------------------------------------------------------
    def _optimizer(self, lr: float):
        if self.opt is None or self.opt.param_groups[0]["lr"] != lr:
            self.opt = self.torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=0.0)
        return self.opt

    def sft(self, examples: list[tuple[list[str], str]], *, steps: int, lr: float, batch: int = 16,
            seed: int = 0) -> list[float]:
        """Cross-entropy on the completion (program words + `<end>`) for `steps` batches drawn in shuffled
        passes over the examples (a fixed number of updates whatever the data's size); the loss per step."""
        import random

        torch = self.torch
        rng = random.Random(seed)
        data = [(self.vocab.encode(p), self.vocab.encode(c.split() + ["<end>"])) for p, c in examples]
        opt = self._optimizer(lr)
        losses, order = [], []
        self.model.train()
        for _ in range(steps if data else 0):
            if len(order) < min(batch, len(data)):
                order += rng.sample(range(len(data)), len(data))
            chunk = [data[i] for i in order[:batch]]
            del order[:batch]
            ids, att, comp = self._batch([p for p, _ in chunk], [c for _, c in chunk])
            logp = self._token_logps(self.model, ids, att)
            mask = comp[:, 1:]
            loss = -(logp * mask).sum() / mask.sum()
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            opt.step()
            losses.append(float(loss.detach()))
        return losses

    def start_rl(self) -> None:
        """Freeze the current model as GRPO's KL reference."""
        self.ref = copy.deepcopy(self.model).eval()
        for p in self.ref.parameters():
            p.requires_grad_(False)

    def grpo_step(self, prompts: list[list[str]], programs: list[str], advantages: list[float], *, lr: float,
                  beta: float) -> dict:
        torch = self.torch
        end = ["<end>"]
        enc_p = [self.vocab.encode(p) for p in prompts]
        enc_c = [self.vocab.encode((c.split() + end)[:self.max_words + 1]) for c in programs]
        ids, att, comp = self._batch(enc_p, enc_c)
        mask = comp[:, 1:].float()
        self.model.train()
        logp = self._token_logps(self.model, ids, att)
        adv = torch.tensor(advantages, dtype=torch.float32)[:, None]
        pg = -(adv * logp)
        kl = torch.zeros_like(logp)
        if beta > 0 and self.ref is not None:
            with torch.no_grad():
                ref = self._token_logps(self.ref, ids, att)
            kl = torch.exp(ref - logp) - (ref - logp) - 1
        loss = ((pg + beta * kl) * mask).sum() / mask.sum()
        opt = self._optimizer(lr)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        opt.step()
        return {"loss": float(loss.detach()), "kl": float((kl.detach() * mask).sum() / mask.sum())}

    # -- persistence ---------------------------------------------------------------------------------
    def save(self, out_dir: str | Path) -> Path:
        out = Path(out_dir)
        self.model.save_pretrained(out)
        (out / "vocab.json").write_text(json.dumps({"words": self.vocab.words,
                                                    "program_words": sorted(self.vocab.program_words)}))
        return out
