"""Sandboxing the judge process: rlimits always, bubblewrap (bwrap) where the OS allows it.

`prepare` (a spawned process) or `fork_settings` (one forked by the zygote) applies the mode (`KERNELCRAFT_SANDBOX`
or `mode=`: `rlimits`, the library default; `auto`; `bwrap`; `off`). Every mode but `off` scrubs credentials from
the environment and sets rlimits (soft = hard); bwrap adds no network, a read-only filesystem but the work and
cache directories, and new PID/IPC/UTS namespaces. Not protected: reads of the rest of the filesystem, the shared
cache, other GPUs, resources beyond the rlimits.

Rationale: docs/design/judge-caller.md#sandbox
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
