"""The reward service: `kernelcraft serve`, an HTTP front for the pool (FastAPI + uvicorn, extra `serve`).

Every `/v1/*` route but `/v1/health` needs the bearer key; without a key it starts only with
`--insecure-no-auth` on a loopback address. Auth and the body limit run before anything reads the body.
Requests are validated strictly (unknown options are a 422; options that weaken the judge are not accepted).
Every accepted request ends in a verdict record; 4xx only for malformed, unauthenticated, oversized or unknown.
Rationale: docs/design/serve.md#service
"""
from __future__ import annotations

import asyncio
import collections
import hmac
import ipaddress
import json
import os
import time
from pydantic import BaseModel, ConfigDict, Field, create_model

from kernelcraft.candidate import Candidate
from kernelcraft.judge.caller import sandbox as sb
from kernelcraft.judge.caller.runner import describe_workers
from kernelcraft.protocol import WEAKENING, Protocol
from kernelcraft.serve.cluster import RayPool
from kernelcraft.serve.pool import Pool
from kernelcraft.task import load_task

from kernelcraft.version import __version__

DEFAULT_MAX_BODY = 8 << 20
DEFAULT_MAX_BATCH = 512
PUBLIC_PATHS = ("/v1/health",)


class ServiceConfigError(ValueError):
    """The service cannot start as configured (no API key, unsafe bind, missing extra)."""


def _request_options() -> type[BaseModel]:
    """Per-request options: the protocol's knobs (same names, bounds and defaults as everywhere, built from
    `Protocol` so they cannot drift) less those that only weaken the judge, plus where and how hard to look."""
    fields = {name: (f.annotation, f) for name, f in Protocol.model_fields.items() if name not in WEAKENING}
    return create_model("Options", __config__=ConfigDict(extra="forbid"), __doc__="Per-request evaluate() "
                        "options; anything else is a 422.",
                        device=(str | None, Field(None, pattern=r"^(cpu|cuda(:\d+)?)$")),
                        best_known_speedup=(float | None, Field(None, gt=0)), **fields)


Options = _request_options()


class EvaluateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    task: str = Field(..., min_length=1, description="KernelBench source text or a built-in task name")
    candidate: str = Field(..., min_length=1, description="candidate source text defining ModelNew")
    options: Options = Field(default_factory=Options)


class BatchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    items: list[EvaluateRequest] = Field(..., min_length=1)


def _resolve_task(text: str):
    if "\n" not in text and (text.strip().endswith(".py") or os.path.isabs(text.strip())):
        raise ValueError(f"task {text[:80]!r}: send the task's source text or a built-in name "
                         "(see `kernelcraft tasks`), not a path on the server")
    return load_task(text)


def create_app(pool, *, api_key: str | None, max_body_bytes: int = DEFAULT_MAX_BODY,
               max_batch: int = DEFAULT_MAX_BATCH):
    """The ASGI app over an existing pool (the caller owns and closes the pool)."""
    try:
        from fastapi import FastAPI, Request
        from fastapi.exceptions import RequestValidationError
        from fastapi.responses import JSONResponse
    except ImportError:
        raise ServiceConfigError("the service needs its extra: pip install 'kernelcraft[serve]'") from None


    counters = collections.Counter()
    app = FastAPI(title="kernelcraft reward service", version=__version__,
                  docs_url=None, redoc_url=None, openapi_url=None)

    def error(status: int, message: str, **extra) -> JSONResponse:
        counters[f"http_{status}"] += 1
        return JSONResponse({"detail": message, "message": message, **extra}, status_code=status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        errs = exc.errors()
        parts = []
        for e in errs[:10]:
            where = ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "body"
            what = "malformed JSON" if e.get("type") == "json_invalid" else e.get("msg", "invalid")
            parts.append(f"{where}: {what}")
        return error(422, "invalid request: " + "; ".join(parts),
                     errors=json.loads(json.dumps(errs[:10], default=str)))

    def submit_all(items: list[EvaluateRequest]):
        """Validate every item first (all-or-nothing), then queue them all; runs off the event loop."""
        prepared = []
        for i, it in enumerate(items):
            try:
                prepared.append((_resolve_task(it.task), Candidate(it.candidate, "<request>"),
                                 it.options.model_dump(exclude_unset=True)))
            except ValueError as e:  # TaskError is a ValueError
                raise _BadItem(i, str(e)) from None
        futures = []
        for i, (task, cand, opts) in enumerate(prepared):
            try:
                futures.append(pool.submit(task, cand, **opts))
            except (ValueError, TypeError) as e:
                for f in futures:
                    f.cancel()
                raise _BadItem(i, str(e)) from None
        return futures

    async def run(items: list[EvaluateRequest]) -> list[dict]:
        try:
            futures = await asyncio.to_thread(submit_all, items)
        except _BadItem as e:
            raise _HTTPError(400, f"item {e.index}: {e.message}" if len(items) > 1 else e.message) from None
        except RuntimeError as e:  # the pool is shutting down
            raise _HTTPError(503, str(e)) from None
        counters["evaluations"] += len(futures)
        verdicts = await asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
        return [v.to_json() for v in verdicts]

    @app.exception_handler(_HTTPError)
    async def _http_error(request: Request, exc: "_HTTPError"):
        return error(exc.status, exc.message)

    @app.get("/v1/health")
    async def health():
        return {"ok": True, "version": __version__}

    @app.get("/v1/stats")
    async def stats():
        s = pool.stats()
        s["service"] = {"evaluations": counters["evaluations"], "batches": counters["batches"],
                        "errors": {k: v for k, v in counters.items() if k.startswith("http_")},
                        "max_body_bytes": max_body_bytes, "max_batch": max_batch}
        s["sandbox"] = describe_workers()
        return s

    @app.post("/v1/evaluate")
    async def evaluate(req: EvaluateRequest):
        return (await run([req]))[0]

    @app.post("/v1/evaluate/batch")
    async def evaluate_batch(req: BatchRequest):
        if len(req.items) > max_batch:
            raise _HTTPError(413, f"batch of {len(req.items)} items: at most {max_batch} per request")
        counters["batches"] += 1
        return {"results": await run(req.items)}

    return _Guard(app, api_key=api_key, max_body_bytes=max_body_bytes, counters=counters)


class _BadItem(Exception):
    def __init__(self, index: int, message: str):
        self.index, self.message = index, message


class _HTTPError(Exception):
    def __init__(self, status: int, message: str):
        self.status, self.message = status, message


class _TooLarge(Exception):
    pass


class _Guard:
    """ASGI middleware: bearer auth on non-public routes, then a hard cap on the request body size."""

    def __init__(self, app, *, api_key: str | None, max_body_bytes: int, counters):
        self.app, self.max = app, max_body_bytes
        self.key = api_key.encode() if api_key else None
        self.counters = counters

    async def _reply(self, send, status: int, message: str, headers=()) -> None:
        self.counters[f"http_{status}"] += 1
        body = json.dumps({"detail": message, "message": message}).encode()
        await send({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        if self.key is not None and scope.get("path") not in PUBLIC_PATHS:
            auth = headers.get(b"authorization", b"")
            scheme, _, token = auth.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), self.key):
                return await self._reply(send, 401, "missing or wrong API key: send 'Authorization: Bearer <key>' "
                                         "with the server's KERNELCRAFT_API_KEY",
                                         [(b"www-authenticate", b"Bearer")])
        try:
            declared = int(headers.get(b"content-length", b"0") or 0)
        except ValueError:
            return await self._reply(send, 400, "bad Content-Length header")
        if declared > self.max:
            return await self._reply(send, 413, f"request body of {declared} bytes: the limit is {self.max}")
        seen, over, replied = 0, False, False

        async def limited_receive():
            nonlocal seen, over
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.max:
                    over = True
                    raise _TooLarge()
            return msg

        async def guarded_send(msg):  # once over the limit, whatever the app answers becomes a 413
            nonlocal replied
            if not over:
                return await send(msg)
            if not replied:
                replied = True
                await self._reply(send, 413, f"request body over the limit of {self.max} bytes")

        try:
            await self.app(scope, limited_receive, guarded_send)
        except _TooLarge:
            if not replied:
                replied = True
                await self._reply(send, 413, f"request body over the limit of {self.max} bytes")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def sandbox_hint(desc: dict) -> str:
    """What to do to get the bubblewrap sandbox when `auto` fell back to rlimits (empty when workers have it, or
    when rlimits or off was asked for)."""
    if desc.get("effective") != "rlimits" or desc.get("mode") != "auto":
        return ""
    import shutil

    what = ("bubblewrap gives each worker no network, a read-only filesystem except its work directory and the "
            "build cache, and its own PID namespace")
    if shutil.which("bwrap"):
        how = ("bwrap is installed but cannot create namespaces here: allow unprivileged user namespaces "
               "(sysctl kernel.unprivileged_userns_clone=1, or kernel.apparmor_restrict_unprivileged_userns=0 on "
               "Ubuntu 24.04; in a container, a seccomp profile that permits them)")
    else:
        how = ("install bubblewrap (apt install bubblewrap, dnf install bubblewrap, or your distribution's "
               "'bubblewrap' package: it provides bwrap)")
    return (f"workers are not sandboxed beyond rlimits: {what}; to get it, {how}, then restart (with --sandbox "
            "bwrap the service refuses to start without it). See kernelcraft/judge/caller/sandbox.py for what it does and does not protect.")


def serve(*, host: str = "127.0.0.1", port: int = 8000, devices=None, per_device: int | None = None,
          build_workers: int | None = None, cluster: str | None = None, cache_dir=None,
          max_body_bytes: int = DEFAULT_MAX_BODY, max_batch: int = DEFAULT_MAX_BATCH, sandbox: str | None = None,
          insecure_no_auth: bool = False, log_level: str = "info", api_key: str | None = None) -> None:
    """Start the pool and serve until interrupted (what `kernelcraft serve` calls)."""
    key = api_key if api_key is not None else os.environ.get("KERNELCRAFT_API_KEY", "")
    if not key:
        if not insecure_no_auth:
            raise ServiceConfigError("KERNELCRAFT_API_KEY is not set: the service runs submitted code, so it "
                                     "needs a key (or --insecure-no-auth, on a loopback address only)")
        if not _is_loopback(host):
            raise ServiceConfigError(f"--insecure-no-auth is only allowed on a loopback address, not {host!r}")
    try:
        import uvicorn
    except ImportError:
        raise ServiceConfigError("the service needs its extra: pip install 'kernelcraft[serve]'") from None
    mode = sb.mode_from_env(sandbox or os.environ.get(sb.ENV_MODE) or "auto")
    os.environ[sb.ENV_MODE] = mode  # the workers (and, locally started, Ray actors) inherit it
    if mode == "bwrap" and not sb.bwrap_path():
        raise ServiceConfigError("--sandbox bwrap: bubblewrap is not installed or cannot create namespaces here")
    if cluster:
        address = None if cluster in ("ray", "local") else cluster
        pool = RayPool(address, devices=devices, cache_dir=cache_dir, build_workers=build_workers,
                       per_gpu=per_device,
                       init_kwargs={"runtime_env": {"env_vars": {sb.ENV_MODE: mode}}} if address else None)
    else:
        pool = Pool(devices, per_device=per_device, build_workers=build_workers, cache_dir=cache_dir)
    app = create_app(pool, api_key=key or None, max_body_bytes=max_body_bytes, max_batch=max_batch)
    desc = describe_workers()
    print(f"kernelcraft serve: http://{host}:{port}  timing slots {pool.devices}, build slots "
          f"{pool.build_workers}, sandbox {desc['effective']} (network {desc['network']}, writes "
          f"{desc['writes']}){'' if key else '  [NO AUTH]'}", flush=True)
    hint = sandbox_hint(desc)
    if hint:
        print(f"kernelcraft serve: {hint}", flush=True)
    t0 = time.monotonic()
    try:
        uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_keep_alive=30)
    finally:
        pool.close(cancel=True, wait=False)
        print(f"kernelcraft serve: stopped after {time.monotonic() - t0:.0f} s", flush=True)
