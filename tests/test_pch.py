"""The precompiled torch/extension.h for main.cpp (kernelcraft/builder/pch.py), on this CPU host with g++.

One PCH is made for the whole module (~1 min on 2 cores, ~0.8 GB under pytest's tmp): g++ really loads
it, a C++ `load_inline` build through the build cache uses it (also inside a sandboxed worker: the caller
and the worker agree on its key), a cache hit keeps the first build's flags, and a broken PCH costs
nothing but time. Warming starts one detached maker per missing key and none on small hosts.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernelcraft.builder import pch
from kernelcraft.builder.cache import BuildCache
from kernelcraft.evaluate import evaluate

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="GCC PCHs: Linux only")

FIXTURES = Path(__file__).parent / "fixtures"
CPP = "torch::Tensor twice(torch::Tensor x) { return x * 2; }"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A cache root whose pch/ holds the PCH of plain CPU builds (no extra flags)."""
    root = tmp_path_factory.mktemp("pchcache")
    d = pch.make(root / "pch", [], [], False)
    assert d is not None, "the header did not precompile"
    return root


def test_header_command_is_main_cpp_minus_the_module_name():
    cmd = pch._header_command([], [], False, {})
    assert cmd is not None and "-DTORCH_API_INCLUDE_EXTENSION_H" in cmd and "-x c++-header" in cmd
    assert "TORCH_EXTENSION_NAME" not in cmd  # so one PCH serves every module name
    assert pch._header_command(["-O3"], [], False, {}) != cmd  # another flag set, another key


def test_no_pch_where_none_was_made_or_it_could_change_main_cpp(tmp_path, base, monkeypatch):
    assert pch.cflags(tmp_path / "pch", [], [], False, {}) == []  # not made here
    assert pch.cflags(base / "pch", ["-O1"], [], False, {}) == []  # not made for these flags
    assert pch.cflags(base / "pch", [], [], False, {"no_implicit_headers": True}) == []
    monkeypatch.setenv("KERNELCRAFT_PCH", "0")
    assert pch.cflags(base / "pch", [], [], False, {}) == []


def test_gcc_loads_the_pch(base, tmp_path):
    flags = pch.cflags(base / "pch", [], [], False, {})
    assert flags[0] == "-include" and flags[2] == "-Winvalid-pch"
    gch = Path(flags[1] + ".gch")
    assert gch.stat().st_size > 10_000_000
    main = tmp_path / "main.cpp"
    main.write_text("#include <torch/extension.h>\n" + CPP + "\n")
    compile_cmd = (gch.parent / "command").read_text().split(" -x c++-header")[0]
    r = subprocess.run(f"{compile_cmd} -DTORCH_EXTENSION_NAME=kc_x {' '.join(flags)} -H -fsyntax-only {main}",
                       shell=True, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"! {gch}" in r.stderr, r.stderr[:2000]  # `-H` marks a used (valid) PCH with "!"


def test_build_cache_uses_it_and_a_hit_keeps_the_flags(base):
    mod = BuildCache(base / "ext", None).load_inline("kc_pch_twice", cpp_sources=CPP, functions=["twice"])
    x = torch.arange(5.0)
    assert torch.equal(mod.twice(x), 2 * x)
    (d,) = [p for p in (base / "ext").iterdir() if p.is_dir() and any(p.glob("kc_pch_twice*.so"))]
    flags = json.loads((d / ".pch").read_text())
    assert flags == pch.cflags(base / "pch", [], [], False, {}) and flags
    assert "kc_torch.h" in (d / "build.ninja").read_text()
    obj = d / "main.o"
    before = obj.stat().st_mtime_ns
    again = BuildCache(base / "ext", None)
    mod2 = again.load_inline("kc_pch_twice", cpp_sources=CPP, functions=["twice"])
    assert torch.equal(mod2.twice(x), 2 * x)
    assert again.hits == 1 and obj.stat().st_mtime_ns == before  # same flags: nothing recompiled


def test_a_broken_pch_costs_only_time(base, tmp_path, monkeypatch):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / pch.HEADER).write_text("#include <torch/extension.h>\n")
    (bad / f"{pch.HEADER}.gch").write_text("not a precompiled header")
    monkeypatch.setattr(pch, "cflags", lambda *a, **k: ["-include", str(bad / pch.HEADER), "-Winvalid-pch"])
    mod = BuildCache(tmp_path / "ext", None).load_inline("kc_pch_bad", cpp_sources=CPP, functions=["twice"])
    assert torch.equal(mod.twice(torch.ones(3)), torch.full((3,), 2.0))


def test_evaluate_worker_finds_the_callers_pch(base):
    v = evaluate(FIXTURES / "tasks" / "tiny_elementwise.py", FIXTURES / "legit" / "cpp_inline_elementwise.py",
                 device="cpu", trials=1, timing=False, cache_dir=base, build_timeout_s=600.0)
    assert v.status == "correct", v.message
    (d,) = [p for p in (base / "ext").iterdir() if p.is_dir() and any(p.glob("kc_test_scale_add_cpu*.so"))]
    assert json.loads((d / ".pch").read_text()) == pch.cflags(base / "pch", [], [], False, {})


def test_warm_starts_one_maker_per_missing_key(tmp_path, base, monkeypatch):
    started = []
    monkeypatch.setattr(pch, "_spawn", started.append)
    monkeypatch.setattr(pch, "_started", set())
    monkeypatch.setattr(pch.os, "cpu_count", lambda: 2)
    monkeypatch.setenv("KERNELCRAFT_PCH", "auto")
    assert pch.warm(tmp_path / "pch", with_cuda=False) == [] and not started  # a small host: nothing
    monkeypatch.setattr(pch.os, "cpu_count", lambda: 16)
    dirs = pch.warm(base / "pch", with_cuda=False)
    assert len(dirs) == len(pch.WARM_SETS) - 1  # the no-flags key exists already
    assert started == dirs
    assert all((d / "command").exists() for d in dirs)
    assert pch.warm(base / "pch", with_cuda=False) == []  # started once per process


def test_a_failed_make_is_not_retried(tmp_path):
    d = tmp_path / "k"
    d.mkdir()
    (d / "command").write_text("false  # no compiler\n")
    r = subprocess.run([sys.executable, "-m", "kernelcraft.builder.pch", str(d)], capture_output=True, timeout=60)
    assert r.returncode == 1 and (d / "failed").exists()
    (d / "command").write_text("touch kc_torch.h.gch.tmp  # would succeed now\n")
    assert pch._make(d) is False and not (d / f"{pch.HEADER}.gch").exists()


def test_light_header_for_split_builds(tmp_path):
    """The light header (what a split build's main.cpp starts with) has its own key, is what g++ loads for
    such a main.cpp, and is made ahead only for CUDA builds."""
    assert pch.usual(False) == [(f, "full") for f in pch.WARM_SETS]
    assert sorted({h for _, h in pch.usual(True)}) == ["full", "light"]
    full = pch._key_dir(tmp_path, [], [], False, {}, "full")
    light = pch._key_dir(tmp_path, [], [], False, {}, "light")
    assert full != light and full.parent == light.parent
    d = pch.make(tmp_path, [], [], False, header="light")
    assert d == light and (d / "kc_torch.h").read_text() == pch.HEADERS["light"]
    flags = pch.cflags(tmp_path, [], [], False, {}, "light")
    assert flags[1] == str(d / "kc_torch.h") and pch.cflags(tmp_path, [], [], False, {}) == []
    main = tmp_path / "main.cpp"
    main.write_text(pch.HEADERS["light"] + CPP + "\nPYBIND11_MODULE(kc_x, m) {\n"
                    'm.def("twice", torch::wrap_pybind_function(twice), "twice");\n}\n')
    compile_cmd = (d / "command").read_text().split(" -x c++-header")[0]
    r = subprocess.run(f"{compile_cmd} -DTORCH_EXTENSION_NAME=kc_x {' '.join(flags)} -H -fsyntax-only {main}",
                       shell=True, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"! {d / 'kc_torch.h.gch'}" in r.stderr, r.stderr[:2000]
    assert "torch/extension.h" not in r.stderr, "the binding compiles without the full header"
