"""A precompiled `torch/extension.h` for the host half (`main.cpp`) of `load_inline` builds.

PCHs live in `<cache>/pch/<key>/` (`kc_torch.h` + `.gch`), keyed by torch's own compile command and the
compiler's version; used through `-include ... -Winvalid-pch`, so a stale PCH costs time, never a different
binary. Workers only use them; `warm` (called by the trusted caller) starts detached makers, one per key.
GCC on Linux only. `KERNELCRAFT_PCH`: `auto` (>= 8 cores, the default), `1`, `0`.
Rationale: docs/design/builder.md#pch
"""
from __future__ import annotations

import fcntl
import hashlib
import inspect
import os
import re
import secrets
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

ENV_SWITCH = "KERNELCRAFT_PCH"
HEADER = "kc_torch.h"
_EXT_NAME = re.compile(r"\s-DTORCH_EXTENSION_NAME=\S+")


WARM_SETS = ([], ["-O3"])  # the extra_cflags candidates usually pass
# What main.cpp starts with: `full` is load_inline's own line; `light` is what a split build (cusplit) puts
# there instead, when the host code needs nothing else: the tensor API (as load_inline gives a .cu) plus what
# the generated binding needs (pybind11 with torch's casters, torch::wrap_pybind_function). Loading its PCH
# takes about half the time of the full one's.
HEADERS = {"full": "#include <torch/extension.h>\n",
           "light": "#include <torch/types.h>\n#include <torch/csrc/utils/pybind.h>\n#include <torch/csrc/Exceptions.h>\n"}


def usual(with_cuda: bool) -> list[tuple[list[str], str]]:
    """The (extra_cflags, header) pairs made ahead of time: the light header only for CUDA builds (split)."""
    return [(flags, h) for h in (("full", "light") if with_cuda else ("full",)) for flags in WARM_SETS]
_started: set[str] = set()  # keys this process already started making
_commands: dict[tuple, str | None] = {}  # build arguments -> header command (a torch render + `c++ --version`)


def _mode() -> str:
    v = os.environ.get(ENV_SWITCH, "auto").strip().lower()
    return "off" if v in ("0", "false", "no", "off") else "on" if v in ("1", "true", "yes", "on") else "auto"


def enabled() -> bool:
    return _mode() != "off"


def cflags(root: Path, extra_cflags, extra_include_paths, with_cuda: bool, kwargs: dict,
           header: str = "full") -> list[str]:
    """Flags that make main.cpp (starting with `HEADERS[header]`) use the precompiled header of these build
    arguments, or [] where there is none (not made yet, or not applicable)."""
    d = _key_dir(root, extra_cflags, extra_include_paths, with_cuda, kwargs, header)
    if d is None or not (d / f"{HEADER}.gch").exists():
        return []
    return ["-include", str(d / HEADER), "-Winvalid-pch"]


def make(root: Path, extra_cflags, extra_include_paths, with_cuda: bool, kwargs: dict | None = None,
         header: str = "full") -> Path | None:
    """Make the PCH of these build arguments now (if another process is making it, return at once);
    its directory if it exists afterwards."""
    d = _key_dir(root, extra_cflags, extra_include_paths, with_cuda, kwargs or {}, header, write=True)
    if d is None or not _make(d):
        return None
    return d


def warm(root: Path, with_cuda: bool) -> list[Path]:
    """Start making the missing PCHs of the usual flag sets in the background (see docs/design/builder.md#pch);
    returns the directories started. Never raises: a PCH is an optimisation."""
    mode = _mode()
    if mode == "off" or (mode == "auto" and (os.cpu_count() or 1) < 8):
        return []
    started = []
    for flags, header in usual(with_cuda):
        try:
            d = _key_dir(root, flags, [], with_cuda, {}, header, write=True)
            if d is None or d.name in _started or (d / f"{HEADER}.gch").exists() or (d / "failed").exists():
                continue
            _started.add(d.name)
            _spawn(d)
            started.append(d)
        except Exception:  # noqa: BLE001
            continue
    return started


def _spawn(d: Path) -> None:
    """A detached maker: it outlives this process (a build server or CLI may exit first)."""
    subprocess.Popen([sys.executable, "-m", "kernelcraft.builder.pch", str(d)], cwd=d, start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _key_dir(root, extra_cflags, extra_include_paths, with_cuda: bool, kwargs: dict, header: str = "full",
             write: bool = False):
    if not enabled() or not sys.platform.startswith("linux") or kwargs.get("no_implicit_headers"):
        return None
    memo = (tuple(map(str, extra_cflags or [])), tuple(map(str, extra_include_paths or [])), bool(with_cuda),
            bool(kwargs.get("is_standalone", False)))
    if memo not in _commands:
        try:
            _commands[memo] = _header_command(extra_cflags, extra_include_paths, with_cuda, kwargs)
        except Exception:  # noqa: BLE001 - torch's private ninja writer changed, no compiler, ...: no PCH
            _commands[memo] = None
    cmd = _commands[memo]
    if cmd is None:
        return None
    text = HEADERS[header]  # the full header's key is the command's hash alone; the light one's adds its text
    d = Path(root) / hashlib.sha256((cmd if header == "full" else f"{cmd}\n{text}").encode()).hexdigest()[:24]
    if write and not (d / "command").exists():
        d.mkdir(parents=True, exist_ok=True)
        for name, content in ((HEADER, text), ("command", cmd + "\n")):  # the header first: `command` = ready
            tmp = d / f"{name}.{os.getpid()}.{secrets.token_hex(4)}"  # pids repeat across PID namespaces
            tmp.write_text(content)
            os.replace(tmp, d / name)
    return d


def _header_command(extra_cflags, extra_include_paths, with_cuda: bool, kwargs: dict) -> str | None:
    """The compile command of the header (`{HEADER}` in the cwd → `{HEADER}.gch.tmp`) plus the compiler's
    version, or None for a compiler that is not GCC."""
    import torch.utils.cpp_extension as cpp_ext

    writer = cpp_ext._write_ninja_file_to_build_library
    with tempfile.TemporaryDirectory(prefix="kc-pch-") as tmp:
        src = os.path.join(tmp, "main.cpp")
        Path(src).write_text("")
        args = dict(path=os.path.join(tmp, "build.ninja"), name="kc_pch_probe", sources=[src],
                    extra_cflags=[str(f) for f in extra_cflags or []], extra_cuda_cflags=[],
                    extra_sycl_cflags=[], extra_ldflags=[],
                    extra_include_paths=[str(p) for p in extra_include_paths or []], with_cuda=with_cuda,
                    with_sycl=False, is_standalone=bool(kwargs.get("is_standalone", False)))
        params = inspect.signature(writer).parameters
        writer(**{k: v for k, v in args.items() if k in params})
        ninja = Path(args["path"]).read_text()
    var = dict(re.findall(r"^(\w+) = ?(.*)$", ninja, re.MULTILINE))
    cxx = var.get("cxx", "c++")
    version = subprocess.run(shlex.split(cxx) + ["--version"], capture_output=True, text=True, timeout=30).stdout
    if not re.search(r"\bg(cc|\+\+)\b|GCC|Free Software Foundation", version):
        return None  # clang and others: a .gch means something else there
    flags = _EXT_NAME.sub("", " " + var.get("cflags", "")).strip()
    return (f"{cxx} {flags} {var.get('post_cflags', '')} -x c++-header {HEADER} -o {HEADER}.gch.tmp"
            f"  # {version.splitlines()[0] if version else ''}")


def _make(d: Path) -> bool:
    """Compile the header in `d` (its `command`) unless another process is doing it or it failed before."""
    if (d / f"{HEADER}.gch").exists():
        return True
    if (d / "failed").exists() or not (d / "command").exists():
        return False
    with open(d / "lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # being made by another process
        if (d / f"{HEADER}.gch").exists():
            return True
        if not (d / HEADER).exists():  # a key directory without its header file: the full header
            (d / HEADER).write_text(HEADERS["full"])
        cmd = (d / "command").read_text().split("  # ")[0]
        try:
            r = subprocess.run(cmd, shell=True, cwd=d, capture_output=True, text=True, timeout=900)
        except subprocess.TimeoutExpired:
            (d / "failed").write_text("timed out after 900 s\n")
            return False
        if r.returncode != 0:
            (d / "failed").write_text(r.stdout[-4000:] + r.stderr[-4000:])
            return False
        os.replace(d / f"{HEADER}.gch.tmp", d / f"{HEADER}.gch")
        return True


if __name__ == "__main__":  # python -m kernelcraft.builder.pch DIR: what `warm` starts
    sys.exit(0 if _make(Path(sys.argv[1])) else 1)
