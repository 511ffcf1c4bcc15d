"""A precompiled `torch/extension.h` for the host half (`main.cpp`) of `load_inline` builds.

Every `load_inline` build compiles a `main.cpp` that starts with `#include <torch/extension.h>` (pybind11,
Python.h, the whole C++ frontend): ~24 s of g++ on a 2-core host, 15 s on the H100's, for a file whose own
code is a few lines. With this header precompiled, g++ loads it instead of parsing it (BENCHMARKS.md,
"Cold build").

Design decisions
- Our own PCH, in the kernelcraft cache (`<cache>/pch/<key>/kc_torch.h` + `kc_torch.h.gch`), not torch's
  `load_inline(use_pch=True)`: that one writes into site-packages (read-only in the sandbox) and every
  call without it deletes the file, so concurrent builds would race.
- Used through `-include <dir>/kc_torch.h -Winvalid-pch` appended to `extra_cflags`, which torch passes to
  the host compile only (nvcc gets `extra_cuda_cflags`). `kc_torch.h` includes `torch/extension.h`, so
  main.cpp's own include of it is then a no-op (`#pragma once`). GCC checks the PCH itself (compiler
  build, macros, code-generation options) and, where it does not match, parses the header as usual: a
  stale or foreign PCH costs time, never a different binary. The build cache key does not change.
- The exact flags come from torch itself: its ninja writer (`_write_ninja_file_to_build_library`, private:
  any failure means no PCH) renders the build for these arguments into a scratch directory, and the PCH
  is compiled with main.cpp's command minus `-DTORCH_EXTENSION_NAME=...` (no torch header names it, so
  GCC accepts the PCH for any module name). The key is the hash of that command and the compiler's
  version line.
- Workers only *use* a PCH; they never make one (a 40-60 s header compile would land on one candidate's
  build clock). The trusted caller makes them: `evaluate` calls `warm` before a candidate that builds,
  which starts a detached `python -m kernelcraft.builder.pch DIR` per missing key, for the usual flag sets (none
  and `-O3`; CUDA or not, as the candidate) and returns at once; builds meanwhile compile without it.
  Automatic on hosts with >= 8 cores (`KERNELCRAFT_PCH=auto`, the default), where a core for a minute is
  cheap and builds are many; `KERNELCRAFT_PCH=1` warms anywhere, `0` turns PCHs off. A candidate with
  other `extra_cflags` gets no PCH unless its key was made (`make` does it synchronously).
- One maker per key (a non-blocking flock; losers return). The header is compiled to a temporary name
  and renamed, so no build ever sees half a `.gch`; a failed compile leaves a `failed` marker and is
  not retried for that key.
- Only where it cannot change what main.cpp means: GCC on Linux, and main.cpp starting with
  torch/extension.h (not `no_implicit_headers=True` from the candidate, whose code may then precede
  its includes). Off with `KERNELCRAFT_PCH=0`.
- Costs: ~0.8 GB of disk per key (so up to ~3 GB: two flag sets, CPU and CUDA builds) and one header
  compile per key in the background (55 s of one core on a 2-core host, load included).
- The cache is shared trust (see `sandbox`): whoever can write it can poison builds, the PCH included.
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
    """Start making the missing PCHs of the usual flag sets in the background (see the module docstring);
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
    text = HEADERS[header]  # the full header keeps its earlier key, so PCHs already made stay in use
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
        if not (d / HEADER).exists():  # made by an earlier version: the full header
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
