"""Build: a content-addressed cache around `torch.utils.cpp_extension.load_inline`, and error trimming.

The worker installs `BuildCache.load_inline`/`load` before the candidate is imported. The key covers everything
that changes the binary (sources, flags, name, torch/CUDA/Python versions, ABI, arch list) and names the build
directory; one flock per key serialises builders of the same key across processes and hosts. Cold builds take
`fastbuild`'s path with a fallback to the plain build, so a valid candidate never becomes a compile error.
Compiler output is trimmed to its error lines.
Rationale: docs/design/builder.md#cache
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import sys
import time
from pathlib import Path

import torch
import torch.utils.cpp_extension as cpp_ext

from kernelcraft.builder import fastbuild, pch

_orig_load_inline = cpp_ext.load_inline
_orig_load = cpp_ext.load


class BuildError(RuntimeError):
    """An inline extension failed to compile; `.log` holds the trimmed compiler output."""

    def __init__(self, name: str, log: str):
        super().__init__(f"building extension {name!r} failed:\n{log}")
        self.log = log


class BuildCache:
    def __init__(self, root: Path, arch_list: str | None):
        self.root = Path(root)
        self.arch_list = arch_list
        self.build_s = 0.0
        self.builds = 0  # load_inline calls
        self.hits = 0  # of which found already built
        self.failure: BuildError | None = None
        self.call_counts: dict[str, int] = {}  # strict mode: calls into own extensions / Triton kernels
        self.count_calls = False

    # -- key and directory -------------------------------------------------------------------------
    def key(self, kind: str, payload: dict) -> str:
        env = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version_info[:2],
               "arch": self.arch_list, "abi": torch._C._GLIBCXX_USE_CXX11_ABI}
        blob = json.dumps({"kind": kind, "env": env, **payload}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:24]

    @contextlib.contextmanager
    def _locked_dir(self, key: str):
        d = self.root / key
        d.mkdir(parents=True, exist_ok=True)
        with open(self.root / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            stale = d / "lock"  # torch's FileBaton; only ever taken under our flock
            if stale.exists():
                stale.unlink()
            try:
                yield d
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _run(self, name: str, key: str, build):
        t0 = time.perf_counter()
        with self._locked_dir(key) as d:
            marker = d / ".built"
            hit = marker.exists()
            try:
                mod = build(str(d))
            except Exception as e:  # the compiler's complaint, trimmed
                err = BuildError(name, trim_compiler_output(str(e)))
                self.failure = err
                raise err from None
            finally:
                self.build_s += time.perf_counter() - t0
            marker.touch()
        self.builds += 1
        self.hits += hit
        return _CountingModule(mod, name, self.call_counts) if self.count_calls else mod

    # -- the replacements --------------------------------------------------------------------------
    def load_inline(self, name, cpp_sources, cuda_sources=None, functions=None, extra_cflags=None,
                    extra_cuda_cflags=None, extra_ldflags=None, extra_include_paths=None,
                    build_directory=None, verbose=False, **kwargs):
        payload = dict(name=name, cpp=cpp_sources, cuda=cuda_sources, functions=functions,
                       cflags=extra_cflags, cuda_cflags=extra_cuda_cflags, ldflags=extra_ldflags,
                       include=extra_include_paths, kwargs=kwargs)

        def attempt(d, cpp=cpp_sources, cuda=cuda_sources, verbose=verbose, extra=None, header="full"):
            # torch inserts into / appends to list arguments: every attempt gets its own copies
            return _orig_load_inline(
                name, _copy(cpp), cuda_sources=_copy(cuda), functions=functions,
                extra_cflags=list(extra_cflags or []) + self._pch_flags(d, extra_cflags, extra_include_paths,
                                                                         bool(cuda_sources), kwargs, header),
                extra_cuda_cflags=_copy(extra_cuda_cflags),
                extra_ldflags=_copy(extra_ldflags), extra_include_paths=_copy(extra_include_paths),
                build_directory=d, verbose=verbose, **{**kwargs, **(extra or {})})

        fast = fastbuild.plan(cpp_sources, cuda_sources, kwargs, extra_cflags, extra_cuda_cflags)
        if fast is None:
            return self._run(name, self.key("inline", payload), attempt)
        key = self.key("inline", {**payload, "fastbuild": fast.tag})
        return self._run(name, key, lambda d: fastbuild.build_with_fallback(
            d, name, fast, lambda d, p: attempt(d, p.cpp_sources, p.cuda_sources, False, p.kwargs, p.header),
            attempt))

    def _pch_flags(self, d, extra_cflags, extra_include_paths, with_cuda: bool, kwargs: dict,
                   header: str = "full") -> list[str]:
        """The precompiled-header flags of this build directory for main.cpp starting with `header`: chosen
        when first built and kept in `.pch` (`.pch-light`), so a later load passes torch the same flags
        (other flags would make it rebuild)."""
        rec = Path(d) / (".pch" if header == "full" else f".pch-{header}")
        if rec.exists():
            return json.loads(rec.read_text())
        if (Path(d) / ".built").exists():
            return []  # built without a PCH record: keep its flags
        if kwargs.get("with_cuda") is not None:
            with_cuda = bool(kwargs["with_cuda"])
        flags = pch.cflags(self.root.parent / "pch", extra_cflags, extra_include_paths, with_cuda, kwargs, header)
        rec.write_text(json.dumps(flags))
        return flags

    def load(self, name, sources, *args, build_directory=None, **kwargs):
        srcs = [sources] if isinstance(sources, (str, os.PathLike)) else list(sources)
        payload = dict(name=name, sources={str(s): Path(s).read_text(errors="replace") for s in srcs},
                       args=args, kwargs=kwargs)
        key = self.key("load", payload)
        return self._run(name, key, lambda d: _orig_load(name, sources, *args, build_directory=d, **kwargs))

    def install(self, count_calls: bool = False) -> None:
        cpp_ext.load_inline = self.load_inline
        cpp_ext.load = self.load
        if self.arch_list:
            os.environ["TORCH_CUDA_ARCH_LIST"] = self.arch_list
        self.count_calls = count_calls
        if count_calls:
            _count_triton_launches(self.call_counts)


def _copy(sources):
    return list(sources) if isinstance(sources, list) else sources


class _CountingModule:
    """Strict mode: a stand-in for an extension module that counts calls of its functions."""

    def __init__(self, mod, name: str, counts: dict):
        object.__setattr__(self, "_mod", mod)
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_counts", counts)

    def __getattr__(self, attr):
        value = getattr(self._mod, attr)
        if not callable(value) or attr.startswith("__"):
            return value
        key = f"ext:{self._name}.{attr}"
        counts = self._counts

        def counted(*args, **kwargs):
            out = value(*args, **kwargs)
            counts[key] = counts.get(key, 0) + 1  # only calls that returned: a raising call ran no kernel
            return out

        return counted


def _count_triton_launches(counts: dict) -> None:
    """Count launches of Triton kernels defined in the candidate (module `kernelcraft_candidate`)."""
    try:
        from triton.runtime.jit import JITFunction
    except Exception:
        return
    orig = JITFunction.run

    def run(self, *args, **kwargs):
        fn = getattr(self, "fn", None)
        if getattr(fn, "__module__", None) == "kernelcraft_candidate":
            key = f"triton:{fn.__name__}"
            counts[key] = counts.get(key, 0) + 1
        return orig(self, *args, **kwargs)

    JITFunction.run = run


_ERROR_RE = re.compile(r"(error|Error|ERROR|undefined reference|fatal|cannot|No such file)")
_NOISE_RE = re.compile(r"^(\[\d+/\d+\]|ninja: build stopped|FAILED: |c\+\+ |/usr/\S*nvcc |.*-DTORCH_EXTENSION)")


def trim_compiler_output(text: str, max_lines: int = 40, context: int = 2) -> str:
    """Keep the compiler's error lines (with a little context); drop command lines and warnings noise."""
    lines = [ln.rstrip() for ln in text.splitlines()]
    lines = [ln for ln in lines if ln and not _NOISE_RE.match(ln) and len(ln) < 2000]
    keep: list[int] = []
    for i, ln in enumerate(lines):
        if _ERROR_RE.search(ln) and "warning" not in ln.lower():
            keep.extend(range(max(0, i - context), min(len(lines), i + context + 1)))
    if not keep:
        return "\n".join(lines[-max_lines:])
    seen, out = set(), []
    for i in keep:
        if i not in seen:
            seen.add(i)
            out.append(lines[i])
    if len(out) > max_lines:
        out = out[:max_lines] + [f"... ({len(out) - max_lines} more lines)"]
    return "\n".join(out)
