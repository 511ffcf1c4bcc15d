"""LLM policies: `openai:MODEL` (any OpenAI-compatible chat endpoint) and `hf:PATH` (local transformers).

Per proposal: a fresh exemplar draw, `prompt.build_prompt`, a completion, `reply.parse_reply`; the prompt,
reply and usage are kept. `openai` retries transient errors itself (bounded, with backoff), records a request
that still fails as `llm_error`, and raises `PolicyError` for configuration errors or a round where every
request failed; `preflight` checks the endpoint answers. `openai` is `thread_safe`, `hf` is not.
Rationale: docs/design/search.md#llm
"""
from __future__ import annotations

import asyncio
import os
import random
import time

from kernelcraft.search.policies import Context, PolicyError, Proposal
from kernelcraft.search.prompt import Prompt, build_prompt
from kernelcraft.search.reply import parse_reply


def _run_async(coro):
    """asyncio.run, also from inside a running loop (a notebook): then in a helper thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()


def _prompts(ctx: Context) -> list[tuple[Prompt, list]]:
    out = []
    for _ in range(ctx.k):
        shown = ctx.sample_exemplars()
        p = build_prompt(ctx.task.source, shown, ctx.failures, ctx.device, backend=ctx.backend,
                         tolerance=ctx.tolerance)
        out.append((p, [e.id for e in shown]))
    return out


def _proposal(prompt: Prompt, parents: list, reply: str | None, usage: dict, error: str | None = None) -> Proposal:
    meta = {"exemplars": parents, "model": usage.get("model")}
    if error is not None:
        return Proposal(None, parents=parents, meta=meta, prompt=prompt.text(), reply=reply, usage=usage,
                        reason="llm_error", error=error)
    parsed = parse_reply(reply)
    meta["sections"] = sorted(parsed.sections)
    if usage.get("finish_reason") == "length":
        meta["truncated_by_max_tokens"] = True
    if not parsed.ok:
        return Proposal(None, parents=parents, meta=meta, prompt=prompt.text(), reply=reply, usage=usage,
                        reason=parsed.reason, error=parsed.message)
    return Proposal(parsed.code, parents=parents, meta=meta, prompt=prompt.text(), reply=reply, usage=usage)


class OpenAIPolicy:
    name = "openai"
    thread_safe = True  # see docs/design/search.md#llm

    def __init__(self, model: str, *, base_url: str | None = None, api_key: str | None = None,
                 temperature: float = 0.7, max_tokens: int = 8192, concurrency: int | None = None,
                 max_retries: int = 4, backoff_s: float = 1.0, request_timeout_s: float = 600.0,
                 connect_retries: int = 2, connect_timeout_s: float = 5.0, **_):
        try:
            import openai  # noqa: F401
        except ImportError:
            raise PolicyError("the openai policy needs the openai package: pip install 'kernelcraft[llm]'") from None
        self.model = model
        self.base_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
        self.api_key = api_key or os.environ.get("OPENAI_API_KEY") or ("EMPTY" if self.base_url else None)
        if not self.api_key:
            raise PolicyError("no API key: set OPENAI_API_KEY (or pass --api-key), or point --base-url / "
                              "OPENAI_BASE_URL at a local OpenAI-compatible server")
        self.temperature, self.max_tokens = temperature, max_tokens
        self.concurrency, self.max_retries = concurrency, max_retries
        self.backoff_s, self.request_timeout_s = backoff_s, request_timeout_s
        self.connect_retries, self.connect_timeout_s = connect_retries, connect_timeout_s
        self.name = f"openai:{model}"

    @property
    def url(self) -> str:
        return (self.base_url or "https://api.openai.com/v1").rstrip("/") + "/chat/completions"

    def preflight(self) -> None:
        """Fail now, naming the URL, when nothing listens at the endpoint (docs/design/search.md#llm)."""
        import socket
        from urllib.parse import urlsplit

        if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY",
                                           "all_proxy")):
            return
        u = urlsplit(self.url)
        host, port = u.hostname or "", u.port or (443 if u.scheme == "https" else 80)
        t0 = time.monotonic()
        try:
            socket.create_connection((host, port), timeout=self.connect_timeout_s).close()
        except OSError as e:
            why = e.strerror or str(e) or type(e).__name__
            raise PolicyError(f"cannot reach the LLM endpoint {self.url}: {host}:{port}: {why} (after "
                              f"{time.monotonic() - t0:.1f} s). Is the server running? The endpoint comes from "
                              "--base-url or OPENAI_BASE_URL") from None

    def propose(self, ctx: Context) -> list[Proposal]:
        jobs = _prompts(ctx)
        jitter = random.Random(ctx.rng.random())
        results = _run_async(self._all(jobs, jitter))
        if results and all(r[2] is not None and r[1] is None for r in results):
            raise PolicyError(f"every request to {self.url} failed this round: {results[0][2]}")
        return [_proposal(p, parents, reply, usage, err) for (p, parents), (usage, reply, err) in zip(jobs, results)]

    async def _all(self, jobs, jitter):
        import openai

        client = openai.AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, max_retries=0,
                                    timeout=self.request_timeout_s)
        sem = asyncio.Semaphore(self.concurrency or len(jobs) or 1)
        try:
            return await asyncio.gather(*(self._one(client, sem, p, jitter) for p, _ in jobs))
        finally:
            await client.close()

    async def _one(self, client, sem, prompt: Prompt, jitter):
        import openai

        retryable = (openai.APIConnectionError, openai.APITimeoutError, openai.RateLimitError,
                     openai.InternalServerError)
        fatal = (openai.AuthenticationError, openai.PermissionDeniedError, openai.NotFoundError)
        usage = {"model": self.model, "attempts": 0}
        t0 = time.monotonic()
        async with sem:
            for attempt in range(self.max_retries + 1):
                usage["attempts"] = attempt + 1
                try:
                    resp = await client.chat.completions.create(
                        model=self.model, messages=prompt.messages(), temperature=self.temperature,
                        max_tokens=self.max_tokens)
                except fatal as e:
                    raise PolicyError(f"{self.url} refused the request: {e}") from None
                except retryable as e:
                    unreachable = isinstance(e, openai.APIConnectionError) and not isinstance(e, openai.APITimeoutError)
                    last = min(self.max_retries, self.connect_retries) if unreachable else self.max_retries
                    if attempt >= last:
                        usage["latency_s"] = round(time.monotonic() - t0, 3)
                        return usage, None, (f"{type(e).__name__} from {self.url} after {attempt + 1} attempts in "
                                             f"{usage['latency_s']:.1f} s: {e}")
                    await asyncio.sleep((0.5 if unreachable else self.backoff_s) * 2 ** attempt
                                        * (0.5 + jitter.random()))
                    continue
                except openai.APIStatusError as e:  # other 4xx (e.g. prompt too long): not retryable
                    usage["latency_s"] = round(time.monotonic() - t0, 3)
                    return usage, None, f"HTTP {e.status_code} from {self.url}: {e}"
                choice = resp.choices[0] if resp.choices else None
                u = resp.usage
                usage.update(prompt_tokens=getattr(u, "prompt_tokens", 0) or 0,
                             completion_tokens=getattr(u, "completion_tokens", 0) or 0,
                             finish_reason=getattr(choice, "finish_reason", None),
                             latency_s=round(time.monotonic() - t0, 3))
                return usage, (choice.message.content if choice and choice.message else "") or "", None
        return usage, None, "no attempt made"


class HFPolicy:
    name = "hf"

    def __init__(self, path: str, *, temperature: float = 0.7, max_tokens: int = 4096, llm_device: str | None = None,
                 **_):
        try:
            import transformers  # noqa: F401
        except ImportError:
            raise PolicyError("the hf policy needs transformers: pip install 'kernelcraft[hf]'") from None
        if not os.path.isdir(path):
            raise PolicyError(f"hf:{path}: not a directory with a saved model (config.json, weights, tokenizer)")
        self.path, self.temperature, self.max_tokens = path, temperature, max_tokens
        self.llm_device = llm_device
        self.name = f"hf:{path}"
        self._model = self._tok = None

    def _load(self):
        if self._model is None:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer

            dev = self.llm_device or ("cuda" if torch.cuda.is_available() else "cpu")
            self._tok = AutoTokenizer.from_pretrained(self.path)
            self._model = AutoModelForCausalLM.from_pretrained(self.path, torch_dtype="auto").to(dev).eval()
        return self._model, self._tok

    def _encode(self, prompt: Prompt):
        model, tok = self._load()
        if getattr(tok, "chat_template", None):
            ids = tok.apply_chat_template(prompt.messages(), add_generation_prompt=True, return_tensors="pt")
        else:
            ids = tok(f"{prompt.system}\n\n{prompt.user}\n\n", return_tensors="pt").input_ids
        return ids.to(model.device)

    def propose(self, ctx: Context) -> list[Proposal]:
        import torch

        model, tok = self._load()
        out = []
        for prompt, parents in _prompts(ctx):
            t0 = time.monotonic()
            ids = self._encode(prompt)
            torch.manual_seed(ctx.rng.randrange(2 ** 31))
            with torch.no_grad():
                gen = model.generate(ids, do_sample=self.temperature > 0, temperature=self.temperature or None,
                                     max_new_tokens=self.max_tokens, pad_token_id=tok.pad_token_id or tok.eos_token_id)
            new = gen[0, ids.shape[1]:]
            reply = tok.decode(new, skip_special_tokens=True)
            finished = tok.eos_token_id is not None and int(tok.eos_token_id) in new.tolist()
            usage = {"model": self.path, "prompt_tokens": int(ids.shape[1]), "completion_tokens": int(new.numel()),
                     "finish_reason": "stop" if finished else "length", "latency_s": round(time.monotonic() - t0, 3)}
            out.append(_proposal(prompt, parents, reply, usage))
        return out
