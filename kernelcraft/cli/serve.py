"""`kernelcraft serve`: the HTTP reward service (extra `serve`)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from kernelcraft.cli import checks
from kernelcraft.cli.common import app, usage_error
from kernelcraft.judge.caller.sandbox import SandboxError
from kernelcraft.serve.service import ServiceConfigError, serve


LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")  # uvicorn's


@app.command("serve")
def serve_cmd(
    host: str = typer.Option("127.0.0.1", help="address to bind (loopback unless told otherwise)"),
    port: int = typer.Option(8000, min=0, max=65535),
    jobs: Optional[int] = typer.Option(None, min=1, help="evaluations at once per device, as in optimize and bench "
                                       "(default: 2 on cpu; 2-4 per GPU by cores); with --cluster, actors per GPU"),
    workers: Optional[int] = typer.Option(None, "--workers", min=1, hidden=True, help="alias of --jobs"),
    build_workers: Optional[int] = typer.Option(None, min=1, help="CPU build slots (default: one per core)"),
    device: Optional[str] = typer.Option(None, help="cpu or cuda (default: all visible GPUs, else cpu)"),
    cluster: Optional[str] = typer.Option(None, help="run slots as Ray actors: 'ray' (local) or a Ray address"),
    cache_dir: Optional[Path] = typer.Option(None, help="build cache (default $KERNELCRAFT_CACHE, "
                                             "else ~/.cache/kernelcraft)"),
    max_body_mb: float = typer.Option(8.0, help="largest request body accepted, MiB (413 above)"),
    max_batch: int = typer.Option(512, min=1, help="most items in one batch request"),
    sandbox: Optional[str] = typer.Option(None, help="auto | bwrap | rlimits | off (default $KERNELCRAFT_SANDBOX, "
                                          "else auto: bwrap where it works)"),
    insecure_no_auth: bool = typer.Option(False, "--insecure-no-auth", help="serve without an API key (loopback only)"),
    log_level: str = typer.Option("info", help="uvicorn log level: " + " | ".join(LOG_LEVELS)),
):
    """Serve evaluations over HTTP for RL trainers (needs KERNELCRAFT_API_KEY and the `serve` extra)."""
    if device not in (None, "cpu", "cuda"):
        usage_error(f"--device must be cpu or cuda, not {device!r}")
    if device == "cuda":
        checks.device(device)
    checks.positive(max_body_mb, "--max-body-mb", " MiB")
    checks.choice(log_level, "--log-level", LOG_LEVELS)
    try:
        serve(host=host, port=port, devices=device, per_device=jobs or workers, build_workers=build_workers, cluster=cluster,
              cache_dir=cache_dir, max_body_bytes=int(max_body_mb * (1 << 20)), max_batch=max_batch, sandbox=sandbox,
              insecure_no_auth=insecure_no_auth, log_level=log_level)
    except (ServiceConfigError, SandboxError, ValueError, ImportError) as e:
        usage_error(str(e))


