"""Sandboxing the worker process: rlimits always, bubblewrap (bwrap) where the OS allows it.

The runner calls `prepare(argv, env, work_dir=..., cache_dir=...) -> (argv, env)` right before it spawns a
worker, or `fork_settings(env) -> (env, rlimits)` for one forked by the `zygote` (rlimits and off modes
only: bwrap needs a sandbox made per worker, so with bwrap every worker is spawned). Modes (`KERNELCRAFT_SANDBOX`, or `mode=`):
`rlimits` (the library default), `auto` (bwrap if a probe run of it works, else rlimits; the default of
`kernelcraft serve`), `bwrap` (required: refuse to run without it), `off` (nothing; for debugging).

What every mode except `off` does
- Scrubs the worker's environment of secrets: the service's `KERNELCRAFT_API_KEY` and any variable whose
  name looks like a credential (`*TOKEN*`, `*SECRET*`, `*PASSWORD*`, `*API_KEY*`, `*ACCESS_KEY*`, `AWS_*`,
  `SSH_AUTH_SOCK`, ...). Candidate code can read its own environment; now it finds no keys there.
- Sets rlimits through a tiny exec shim (`python -I -S -c ...`, no imports beyond the stdlib, then
  `execv` of the real worker; not `preexec_fn`, which is unsafe in a threaded caller such as the pool):
  no core dumps (a segfaulting candidate cannot fill the disk with cores), at most `FSIZE` bytes per
  written file, `NOFILE` descriptors, and, on CPU-only workers when `KERNELCRAFT_SANDBOX_MEM_GB` is set,
  an address-space cap (never on GPU workers: the CUDA driver reserves terabytes of virtual memory).
  Soft = hard, so the candidate cannot raise them again. The shim also sets `PR_SET_PDEATHSIG`, so the
  worker dies if the thread that started it goes away (e.g. a Ray actor killed mid-evaluation). A worker
  forked by the zygote sets the same rlimits on itself before the job is read; it dies with its caller
  because the zygote kills its workers when the caller's end of their socket closes.

What bwrap adds
- A new network namespace: no network at all (only a loopback that is down); abstract Unix sockets of
  the host are unreachable too. New PID, IPC and UTS namespaces: the candidate cannot see or signal host
  processes, and everything it starts (including `setsid` daemons) dies with the worker.
- A read-only view of the whole filesystem, with writable binds of exactly the work directory and the
  kernelcraft cache directory (builds, Triton/Inductor caches, locks); private tmpfs on /tmp, /dev/shm
  and /run (so host sockets under /run, e.g. docker.sock, are hidden); credential files and directories
  in $HOME (~/.ssh, ~/.aws, ~/.netrc, ~/.ray, ...) masked. /dev is bound whole so GPUs stay usable.

What it does NOT protect (know these before exposing the service)
- Reads: the rest of the filesystem is readable (source trees, datasets, other users' world-readable
  files). Run the service as a dedicated user whose home holds nothing secret.
- The cache is writable by every candidate, so a malicious candidate can tamper with other candidates'
  cached builds or the lock files: a shared cache means shared trust. Give untrusted traffic its own
  cache directory if this matters.
- The GPU: all of /dev is visible, so a candidate can open GPUs other than the one it was given
  (`CUDA_VISIBLE_DEVICES` is advisory) and use GPU memory of its own until it is killed. Kernel and
  driver exploits, GPU side channels and Unix sockets bound outside /run and $HOME are out of scope.
- Resource exhaustion beyond the rlimits above: memory (use cgroups / the container's limit), CPU (the
  runner's wall-clock timeouts), number of processes (RLIMIT_NPROC is per user and would break the
  harness's own threads; the PID namespace at least reaps them).
- Without bwrap (rlimits mode): no network isolation and no write restriction at all.
"""
from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

MODES = ("rlimits", "auto", "bwrap", "off")
ENV_MODE = "KERNELCRAFT_SANDBOX"
FSIZE = 8 << 30  # bytes per written file
NOFILE = 8192
_SECRET_RE = re.compile(r"(TOKEN|SECRET|PASSW|API_KEY|APIKEY|ACCESS_KEY|PRIVATE_KEY|CREDENTIAL)", re.I)
_SECRET_NAMES = {"KERNELCRAFT_API_KEY", "SSH_AUTH_SOCK", "GOOGLE_APPLICATION_CREDENTIALS", "NETRC",
                 "DOCKER_HOST", "KUBECONFIG"}
_HOME_SECRETS = (".ssh", ".aws", ".azure", ".config/gcloud", ".docker", ".kube", ".netrc", ".git-credentials",
                 ".gnupg", ".pypirc", ".ray", ".cache/huggingface/token", ".huggingface", ".config/gh")

# The exec shim: set rlimits (soft = hard), ask for SIGKILL when the parent goes, exec the worker.
_SHIM = r"""
import json, os, resource, sys
lim = json.loads(sys.argv[1])
for name, value in lim.items():
    r = getattr(resource, name)
    soft, hard = resource.getrlimit(r)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(r, (value, value))
try:
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, SIGKILL
except Exception:
    pass
os.execv(sys.argv[3], sys.argv[3:])
"""


class SandboxError(RuntimeError):
    """The requested sandbox cannot be had on this machine (mode=bwrap without a working bwrap)."""


def mode_from_env(mode: str | None = None) -> str:
    mode = (mode or os.environ.get(ENV_MODE) or "rlimits").strip().lower()
    if mode not in MODES:
        raise SandboxError(f"{ENV_MODE}={mode!r}: use one of {', '.join(MODES)}")
    return mode


def scrub_env(env: dict) -> dict:
    """The environment without credentials."""
    return {k: v for k, v in env.items() if k not in _SECRET_NAMES and not _SECRET_RE.search(k)
            and not k.startswith("AWS_")}


def rlimits(env: dict) -> dict[str, int]:
    lim = {"RLIMIT_CORE": 0, "RLIMIT_FSIZE": FSIZE, "RLIMIT_NOFILE": NOFILE}
    mem_gb = os.environ.get("KERNELCRAFT_SANDBOX_MEM_GB")
    if mem_gb and env.get("CUDA_VISIBLE_DEVICES", None) == "":
        lim["RLIMIT_AS"] = int(float(mem_gb) * (1 << 30))
    return lim


@functools.lru_cache(maxsize=1)
def bwrap_path() -> str | None:
    """bwrap's path if it is installed *and* can build the namespaces we need here, else None."""
    path = shutil.which("bwrap")
    if not path:
        return None
    probe = [path, *_bwrap_flags(Path("/"), [])[:-1], "--", "/bin/true"]
    try:
        ok = subprocess.run(probe, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return path if ok else None


def _bwrap_flags(work_dir: Path, writable: list[Path]) -> list[str]:
    flags = ["--die-with-parent", "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
             "--ro-bind", "/", "/", "--dev-bind", "/dev", "/dev", "--tmpfs", "/dev/shm", "--proc", "/proc",
             "--tmpfs", "/tmp", "--tmpfs", "/run"]
    home = Path(os.path.expanduser("~"))
    for rel in _HOME_SECRETS:
        p = home / rel
        if p.is_dir():
            flags += ["--tmpfs", str(p)]
        elif p.exists():
            flags += ["--ro-bind", "/dev/null", str(p)]
    # the interpreter and the packages it imports stay visible even where they live under /tmp or /run
    # (a virtual environment there): read-only, after the tmpfs mounts that would hide them
    for p in _interpreter_paths():
        if p.is_relative_to("/tmp") or p.is_relative_to("/run"):
            flags += ["--ro-bind", str(p), str(p)]
    for p in writable:  # after the tmpfs mounts, so a cache under /tmp stays reachable
        flags += ["--bind", str(p), str(p)]
    return flags + ["--chdir", str(work_dir), "--"]


def _interpreter_paths() -> list[Path]:
    paths = {Path(sys.prefix), Path(sys.base_prefix), Path(sys.exec_prefix),
             Path(__file__).resolve().parents[2]}  # the directory holding kernelcraft/
    paths.update(Path(p) for p in sys.path if p and Path(p).is_dir())
    return sorted(p.resolve() for p in paths if p.exists())


def prepare(argv: list[str], env: dict, *, work_dir, cache_dir, mode: str | None = None) -> tuple[list, dict]:
    """The command line and environment to start a worker with, sandboxed per `mode`."""
    mode = mode_from_env(mode)
    if mode == "off":
        return list(argv), dict(env)
    env = scrub_env(env)
    shim = [sys.executable, "-I", "-S", "-c", _SHIM, json.dumps(rlimits(env)), "--", *argv]
    if mode == "rlimits":
        return shim, env
    bwrap = bwrap_path()
    if bwrap is None:
        if mode == "bwrap":
            raise SandboxError("KERNELCRAFT_SANDBOX=bwrap but bubblewrap is not installed or cannot create "
                               "namespaces here (unprivileged user namespaces disabled?)")
        return shim, env
    work_dir, cache_dir = Path(work_dir).resolve(), Path(cache_dir).resolve()
    writable = [cache_dir] + ([] if _inside(work_dir, cache_dir) else [work_dir])
    env.setdefault("CUDA_CACHE_PATH", str(cache_dir / "nv"))  # the CUDA JIT cache: ~ is read-only
    return [bwrap, *_bwrap_flags(work_dir, writable), *shim], env


def fork_settings(env: dict, mode: str | None = None) -> tuple[dict, dict] | None:
    """For a worker forked from the zygote (`zygote`): its environment and the rlimits it sets on itself,
    as `prepare` would give a spawned one; None where each worker needs a sandbox of its own (bwrap)."""
    mode = mode_from_env(mode)
    if mode == "off":
        return dict(env), {}
    if mode in ("auto", "bwrap") and bwrap_path() or mode == "bwrap":
        return None  # spawned through `prepare` (which refuses mode=bwrap without bwrap)
    return scrub_env(env), rlimits(env)


def _inside(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
        return True
    except ValueError:
        return False


def describe(mode: str | None = None) -> dict:
    """What the sandbox does here (for logs and bug reports; `runner.describe_workers` adds how workers start)."""
    mode = mode_from_env(mode)
    effective = "bwrap" if mode in ("auto", "bwrap") and bwrap_path() else ("off" if mode == "off" else "rlimits")
    return {"mode": mode, "effective": effective, "bwrap": bwrap_path(),
            "network": "blocked" if effective == "bwrap" else "open",
            "writes": "work dir + cache only" if effective == "bwrap" else "unrestricted",
            "rlimits": None if effective == "off" else rlimits({}), "env_scrubbed": effective != "off"}
