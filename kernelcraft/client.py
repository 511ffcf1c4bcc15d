"""A small client for the reward service (`kernelcraft serve`), standard library only.

Importing it loads neither torch nor ray. Verdicts come back as plain dicts, the verdict record of
docs/contract.md exactly as the service sent it; an HTTP error raises `ServiceError`, while a candidate that
crashes, hangs or cheats is a verdict, never an error. URL and key default to `KERNELCRAFT_URL` (else
http://127.0.0.1:8000) and `KERNELCRAFT_API_KEY`.

Rationale: docs/design/core.md#client
"""
from __future__ import annotations

import asyncio
import json
import os
import urllib.error
import urllib.request


class ServiceError(RuntimeError):
    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.status, self.message = status, message


class Client:
    def __init__(self, url: str | None = None, api_key: str | None = None, timeout: float = 3600.0):
        self.url = (url or os.environ.get("KERNELCRAFT_URL") or "http://127.0.0.1:8000").rstrip("/")
        self.api_key = api_key if api_key is not None else os.environ.get("KERNELCRAFT_API_KEY")
        self.timeout = timeout

    def _request(self, method: str, path: str, body: dict | None = None) -> dict:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.api_key:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                msg = json.loads(raw).get("message") or raw.decode(errors="replace")
            except ValueError:
                msg = raw.decode(errors="replace")[:500]
            raise ServiceError(e.code, msg) from None

    # -- endpoints -----------------------------------------------------------------------------------
    def health(self) -> dict:
        return self._request("GET", "/v1/health")

    def stats(self) -> dict:
        return self._request("GET", "/v1/stats")

    def evaluate(self, task: str, candidate: str, **options) -> dict:
        """One verdict record. `task`: source text or a built-in name; `candidate`: source text."""
        return self._request("POST", "/v1/evaluate", {"task": task, "candidate": candidate, "options": options})

    def evaluate_batch(self, items, **options) -> list[dict]:
        """Verdict records in input order. `items`: (task, candidate) pairs, (task, candidate, options)
        triples, or request dicts; `options` apply to every item (an item's own options win)."""
        body = []
        for it in items:
            if isinstance(it, dict):
                body.append({**it, "options": {**options, **it.get("options", {})}})
            else:
                task, cand, *rest = it
                body.append({"task": task, "candidate": cand, "options": {**options, **(rest[0] if rest else {})}})
        return self._request("POST", "/v1/evaluate/batch", {"items": body})["results"]

    async def aevaluate(self, task: str, candidate: str, **options) -> dict:
        return await asyncio.to_thread(self.evaluate, task, candidate, **options)

    async def aevaluate_batch(self, items, **options) -> list[dict]:
        return await asyncio.to_thread(self.evaluate_batch, list(items), **options)
