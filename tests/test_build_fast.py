"""The build fast path (kernelcraft/builder/fastbuild.py): which candidates take it, its own cache key, the
fallback to the plain build when the rewritten `.cu` does not compile, and unchanged compile errors.

CPU tests drive BuildCache with a stand-in for torch's load_inline (no compiler: each takes well under a
second), plus one real evaluation of a CUDA candidate on this torch (a CPU-only torch fails it before
nvcc, the fast path must report exactly the plain build's error). The real CUDA builds — fast path
correct, fallback correct, a broken kernel's trimmed error identical to the plain build's — are
`@pytest.mark.gpu` (each cold nvcc build takes ~30-60 s).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.utils.cpp_extension as cpp_ext

from kernelcraft.builder import cache as build, fastbuild
from kernelcraft.builder.cache import BuildCache, BuildError
from kernelcraft.evaluate import evaluate

FIXTURES = Path(__file__).parent / "fixtures"

CU = r"""#include <torch/extension.h>
#include <cuda_runtime.h>
__global__ void k(float* y) { y[threadIdx.x] = 1.f; }
torch::Tensor f(torch::Tensor x) { auto y = torch::empty_like(x); k<<<1, 32>>>(y.data_ptr<float>()); return y; }
"""


# -- the rewrite ------------------------------------------------------------------------------------
def test_rewrite_swaps_extension_h_for_types_h_line_for_line():
    out = fastbuild.rewrite_cuda_sources(CU)
    assert out is not None and len(out) == 1
    assert "torch/extension.h" not in out[0] and out[0].startswith("#include <torch/types.h>\n")
    assert out[0].count("\n") == CU.count("\n"), "compiler line numbers must stay the candidate's"
    assert out[0].splitlines()[1:] == CU.splitlines()[1:]
    for hdr in ('"torch/extension.h"', "<torch/torch.h>", "<torch/all.h>"):
        src = CU.replace("<torch/extension.h>", hdr)
        assert fastbuild.rewrite_cuda_sources([src, "// more"]) == [CU.replace("extension", "types"), "// more"]


@pytest.mark.parametrize("src", [
    None, "", [],
    CU.replace("#include <torch/extension.h>", "#include <torch/types.h>"),  # nothing heavy to drop
    CU + "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def(\"f\", &f); }",
    CU + "void g(pybind11::object o);",
    CU + "torch::Tensor g(torch::Tensor x) { return torch::nn::functional::relu(x); }",
    CU + "void g() { torch::cuda::synchronize(); }",
    CU + "PyObject* g();",
])
def test_rewrite_not_tried(src):
    assert fastbuild.rewrite_cuda_sources(src) is None


@pytest.fixture(autouse=True)
def _no_split_by_default(monkeypatch):
    monkeypatch.setenv("KERNELCRAFT_SPLIT", "0")


def test_rewrite_ignores_comments_and_honours_the_switch(monkeypatch):
    assert fastbuild.rewrite_cuda_sources(CU + "// unlike torch::nn::Linear, no pybind11 here\n") is not None
    monkeypatch.setenv("KERNELCRAFT_FASTBUILD", "0")
    assert fastbuild.rewrite_cuda_sources(CU) is None


BARE_CU = r"""#include <cstdint>
__global__ void scale_kernel(const float* x, float* y, float a, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];  // a torch::Tensor never gets here
}
void scale_launch(const float* x, float* y, float a, int64_t n, cudaStream_t s) {
    scale_kernel<<<(unsigned)((n + 255) / 256), 256, 0, s>>>(x, y, a, n);
}
"""
BARE_CPP = ("void scale_launch(const float* x, float* y, float a, int64_t n, cudaStream_t s);\n"
            "torch::Tensor f(torch::Tensor x);")


def test_plan_bare_for_a_cu_that_names_nothing_of_torch():
    p = fastbuild.plan(BARE_CPP, BARE_CU)
    assert p is not None and p.tag.startswith("bare-") and p.kwargs == {"no_implicit_headers": True}
    assert p.cpp_sources == ["#include <torch/extension.h>", BARE_CPP], "main.cpp as load_inline writes it"
    assert p.cuda_sources[1:] == ["#include <cuda.h>", "#include <cuda_runtime.h>", BARE_CU]
    assert "torch/" not in "\n".join(p.cuda_sources[1:])
    assert len(p.cuda_sources) == 4, "as many lines in front as load_inline puts there"
    assert fastbuild.plan(BARE_CPP, BARE_CU, {"no_implicit_headers": True}) is None
    p = fastbuild.plan(BARE_CPP, BARE_CU + "void g(at::Half* h);")
    assert p is None, "names ATen, includes nothing heavy: the plain build"
    assert fastbuild.plan("", CU).tag.startswith("types-")


# -- BuildCache with a stand-in for torch's load_inline ----------------------------------------------
class FakeTorchBuild:
    """Writes cuda.cu like load_inline; 'compiles' it unless the source has a marker the fast rewrite
    cannot satisfy (NEEDS_EXT) or a plain error (BROKEN); fails main.cpp on BAD_CPP."""

    def __init__(self):
        self.calls: list[dict] = []

    def __call__(self, name, cpp_sources, cuda_sources=None, build_directory=None, verbose=False, **kw):
        d = Path(build_directory)
        cuda = "\n".join([cuda_sources] if isinstance(cuda_sources, str) else cuda_sources or [])
        cpp = "\n".join([cpp_sources] if isinstance(cpp_sources, str) else cpp_sources)
        versions = cpp_ext.JIT_EXTENSION_VERSIONER.entries
        ldflags = kw.get("extra_ldflags")
        self.calls.append({"dir": d, "cuda": cuda, "verbose": verbose, "version": versions.get(name),
                           "ldflags": list(ldflags) if ldflags is not None else None})
        if ldflags is not None:
            ldflags.append("-ltorch")  # as torch's _prepare_ldflags does, in place
        versions[name] = ("hash", len(self.calls))  # torch records a version even for a failed build
        (d / "cuda.cu").write_text(cuda)
        bare = bool(kw.get("no_implicit_headers"))
        split = fastbuild._SPLIT_NOTE in cuda
        fast = bare or "torch/types.h" in cuda
        if bare:
            cpp = cpp.replace("#include <torch/extension.h>\n", "", 1)
        if "BROKEN" in cuda or ("NEEDS_EXT" in cuda and fast) or ("NEEDS_TYPES" in cuda and bare):
            what = "undefined_thing" if "BROKEN" in cuda else "ExpandingArray"
            raise RuntimeError(f"Error building extension '{name}': [1/3] /usr/local/cuda/bin/nvcc -c cuda.cu\n"
                               f"FAILED: [code=2] cuda.cuda.o\n/usr/local/cuda/bin/nvcc -c cuda.cu -o cuda.cuda.o\n"
                               f"{d}/cuda.cu(4): error: identifier \"{what}\" is undefined\n"
                               f"1 error detected in the compilation of \"{d}/cuda.cu\".\n"
                               f"ninja: build stopped: subcommand failed.\n")
        (d / "cuda.cuda.o").write_text("obj")
        if "BAD_CPP" in cpp or (split and "SPLIT_BAD_CPP" in cpp):
            raise RuntimeError(f"Error building extension '{name}': [2/3] c++ -c main.cpp\nFAILED: main.o\n"
                               f"c++ -c main.cpp -o main.o\n{d}/main.cpp:2:1: error: expected ';'\n")
        return {"variant": "split" if split else "bare" if bare else "fast" if fast else "plain",
                "calls": len(self.calls), "cpp": cpp}


@pytest.fixture
def fake(monkeypatch):
    f = FakeTorchBuild()
    monkeypatch.setattr(build, "_orig_load_inline", f)
    monkeypatch.setattr(cpp_ext.JIT_EXTENSION_VERSIONER, "entries", {})
    monkeypatch.delenv("KERNELCRAFT_FASTBUILD", raising=False)
    monkeypatch.setenv("KERNELCRAFT_SPLIT", "0")  # the types/bare paths; the split's chain is tested below
    return f


def load(cache_root: Path, cuda: str, cpp: str = "torch::Tensor f(torch::Tensor x);", **kw):
    return BuildCache(cache_root, "9.0a").load_inline("kc_fast_t", cpp, cuda_sources=cuda, functions=["f"],
                                                      **kw)


def test_fast_path_builds_once_with_its_own_key(fake, tmp_path, monkeypatch):
    mod = load(tmp_path, CU, verbose=True)
    assert mod["variant"] == "fast" and len(fake.calls) == 1
    fast_dir = fake.calls[0]["dir"]
    assert (fast_dir / ".variant").read_text().strip() == "types-1"
    assert fake.calls[0]["verbose"] is False, "the fast try's compiler output is captured, not printed"
    monkeypatch.setenv("KERNELCRAFT_FASTBUILD", "0")
    assert load(tmp_path, CU)["variant"] == "plain"
    plain_dir = fake.calls[1]["dir"]
    assert plain_dir != fast_dir, "the fast path must not share a key (and directory) with the plain build"
    assert not (plain_dir / ".variant").exists()


def test_plain_key_unchanged_where_no_rewrite_applies(fake, tmp_path, monkeypatch):
    light = CU.replace("<torch/extension.h>", "<torch/types.h>")
    load(tmp_path, light)
    monkeypatch.setenv("KERNELCRAFT_FASTBUILD", "0")
    load(tmp_path, light)
    assert fake.calls[0]["dir"] == fake.calls[1]["dir"], "no rewrite: the key of the plain build"


def test_fallback_when_the_rewrite_does_not_compile(fake, tmp_path):
    src = CU + "// NEEDS_EXT\n"
    ldflags = ["-L/somewhere"]
    mod = load(tmp_path, src, extra_ldflags=ldflags)
    assert [c["ldflags"] for c in fake.calls] == [["-L/somewhere"]] * 2, "each try gets the flags unchanged"
    assert ldflags == ["-L/somewhere"]
    assert mod["variant"] == "plain", "a valid candidate never becomes a compile error"
    assert [c["cuda"] == src for c in fake.calls] == [False, True]
    assert fake.calls[0]["dir"] == fake.calls[1]["dir"], "the retry reuses the directory (and main.o)"
    assert fake.calls[1]["version"] is None, "the versioner entry is restored: the module keeps its name"
    assert (fake.calls[0]["dir"] / ".variant").read_text().strip() == "plain"
    again = load(tmp_path, src, extra_ldflags=["-L/somewhere"])  # a hit goes straight to the variant built
    assert again["variant"] == "plain" and len(fake.calls) == 3 and fake.calls[2]["cuda"] == src


def test_bare_fast_path_and_its_fallback(fake, tmp_path):
    mod = load(tmp_path, BARE_CU, cpp=BARE_CPP)
    assert mod["variant"] == "bare" and len(fake.calls) == 1
    assert mod["cpp"] == BARE_CPP, "main.cpp gets extension.h once, as in the plain build"
    mod = load(tmp_path, BARE_CU + "// NEEDS_TYPES\n", cpp=BARE_CPP)
    assert mod["variant"] == "plain" and len(fake.calls) == 3
    assert (fake.calls[2]["dir"] / ".variant").read_text().strip() == "plain"


def test_broken_candidate_reports_the_plain_builds_error(fake, tmp_path, monkeypatch):
    src = CU.replace("k<<<", "undefined_thing = 1; k<<<").replace("\n", "\n// BROKEN\n", 1)
    cache = BuildCache(tmp_path / "a", "9.0a")
    with pytest.raises(BuildError) as fast_err:
        cache.load_inline("kc_fast_t", "torch::Tensor f(torch::Tensor x);", cuda_sources=src, functions=["f"])
    assert len(fake.calls) == 2 and fake.calls[1]["cuda"] == src, "the error comes from the plain build"
    assert cache.failure is not None and cache.failure.log == fast_err.value.log
    monkeypatch.setenv("KERNELCRAFT_FASTBUILD", "0")
    with pytest.raises(BuildError) as plain_err:
        load(tmp_path / "b", src)
    norm = lambda s: re.sub(r"/\S+/(?=cuda\.cu)", "", s)  # build directories differ
    assert norm(fast_err.value.log) == norm(plain_err.value.log)
    assert 'identifier "undefined_thing" is undefined' in fast_err.value.log
    assert not any(ln.startswith(("FAILED", "ninja:")) for ln in fast_err.value.log.splitlines()), "trimmed"


def test_failure_outside_nvcc_is_not_retried(fake, tmp_path):
    with pytest.raises(BuildError) as err:
        load(tmp_path, CU, cpp="BAD_CPP")
    assert len(fake.calls) == 1, "main.cpp is the same in both builds: a retry could only fail the same way"
    assert "expected ';'" in err.value.log


# -- the split's chain: split -> types -> plain ----------------------------------------------------------
SPLIT_V, TYPES_V = f"split-{fastbuild.cusplit.VERSION}", f"types-{fastbuild.FAST_VERSION}"


def test_split_builds_once_with_its_own_key(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELCRAFT_SPLIT", "1")
    mod = load(tmp_path, CU)
    assert mod["variant"] == "split" and len(fake.calls) == 1
    assert "kc_split_launch(k, 1, 32)" in mod["cpp"] and "torch/" not in fake.calls[0]["cuda"]
    assert (fake.calls[0]["dir"] / ".variant").read_text().strip() == SPLIT_V
    monkeypatch.setenv("KERNELCRAFT_SPLIT", "0")
    load(tmp_path, CU)
    assert fake.calls[1]["dir"] != fake.calls[0]["dir"], "split and types builds never share a directory"


def test_split_falls_back_on_any_failure_then_types_then_plain(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELCRAFT_SPLIT", "1")
    src = CU.replace("return y; }", "return y; /* SPLIT_BAD_CPP */ }")  # host code: main.cpp fails in the split
    mod = load(tmp_path, src)
    assert mod["variant"] == "fast" and len(fake.calls) == 2, "a main.cpp failure of the split falls back to types"
    assert fake.calls[0]["dir"] == fake.calls[1]["dir"] and fake.calls[1]["version"] is None
    assert (fake.calls[0]["dir"] / ".variant").read_text().strip() == TYPES_V
    assert load(tmp_path, src)["variant"] == "fast" and len(fake.calls) == 3, "a hit starts at the variant built"
    mod = load(tmp_path / "b", src + "// NEEDS_EXT\n")  # then types fails in nvcc: plain
    assert mod["variant"] == "plain" and len(fake.calls) == 6
    assert (fake.calls[-1]["dir"] / ".variant").read_text().strip() == "plain"


def test_split_broken_candidate_gets_the_plain_builds_error(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELCRAFT_SPLIT", "1")
    src = CU.replace("k<<<", "undefined_thing = 1; k<<<").replace("\n", "\n// BROKEN\n", 1)
    with pytest.raises(BuildError) as err:
        load(tmp_path, src)
    assert len(fake.calls) == 3 and fake.calls[2]["cuda"] == src, "split, types, then the plain build's error"
    assert 'identifier "undefined_thing" is undefined' in err.value.log


def test_nvcc_step_failed_reads_ninja_or_the_objects(tmp_path):
    assert fastbuild.nvcc_step_failed(str(tmp_path), "FAILED: [code=1] cuda.cuda.o \nerror")
    assert not fastbuild.nvcc_step_failed(str(tmp_path), "FAILED: main.o\nerror")
    (tmp_path / "cuda.cu").write_text("x")
    assert fastbuild.nvcc_step_failed(str(tmp_path), "CUDA_HOME environment variable is not set")
    (tmp_path / "cuda.cuda.o").write_text("o")
    assert not fastbuild.nvcc_step_failed(str(tmp_path), "undefined symbol: foo")


# -- real torch ----------------------------------------------------------------------------------------
@pytest.mark.skipif(torch.version.cuda is not None, reason="CPU-only torch: the CUDA build fails before nvcc")
@pytest.mark.parametrize("split", ["0", "1"])
def test_cuda_candidate_on_cpu_torch_same_error_either_way(cache_dir, monkeypatch, split):
    """No CUDA in torch: load_inline with cuda_sources fails (no CUDA_HOME); the fast path (the split, then
    types) falls back and the verdict is the plain build's compile_error, word for word."""
    monkeypatch.setenv("KERNELCRAFT_SPLIT", split)
    cand = FIXTURES / "legit" / "gpu_cuda_add_relu.py"
    task = FIXTURES / "tasks" / "tiny_elementwise.py"
    opts = {"timing": False, "trials": 1, "timeout_s": 60.0, "build_timeout_s": 120.0}
    fast = evaluate(task, cand, **opts)
    monkeypatch.setenv("KERNELCRAFT_FASTBUILD", "0")
    plain = evaluate(task, cand, **opts)
    assert (fast.status, fast.reasons) == ("compile_error", ["build_failed"]), fast.message
    assert (fast.status, fast.reasons, fast.message) == (plain.status, plain.reasons, plain.message)


# -- real CUDA builds (GPU machine) ----------------------------------------------------------------------
GPU_TASK = FIXTURES / "tasks" / "gpu_add_relu.py"
GPU_CAND = FIXTURES / "legit" / "gpu_cuda_add_relu.py"
GPU_OPTS = {"device": "cuda", "trials": 2, "timing": False, "timeout_s": 180.0, "build_timeout_s": 900.0}


def _variant(cache: Path, ext_name: str) -> str:
    (d,) = [d for d in (cache / "ext").iterdir() if d.is_dir() and any(d.glob(f"{ext_name}*.so"))]
    return (d / ".variant").read_text().strip()


@pytest.mark.gpu
@pytest.mark.slow  # cold nvcc builds of several variants: 17-100 s on the H100
def test_gpu_fast_path_and_fallback_are_correct(tmp_path):
    src = GPU_CAND.read_text().replace("kc_test_cuda_add_relu", "kc_fast_gpu_ok")
    v = evaluate(GPU_TASK, src, cache_dir=tmp_path, **GPU_OPTS)
    assert v.status == "correct", f"{v.status}/{v.reasons}: {v.message[:2000]}"
    assert _variant(tmp_path, "kc_fast_gpu_ok").startswith("types-")
    # compiles only with torch/extension.h (torch::ExpandingArray comes with torch/nn): falls back, still correct
    src = src.replace("kc_fast_gpu_ok", "kc_fast_gpu_fb").replace(
        "    auto ac = a.contiguous();",
        "    torch::ExpandingArray<2> unused(3); (void)unused;\n    auto ac = a.contiguous();")
    v = evaluate(GPU_TASK, src, cache_dir=tmp_path, **GPU_OPTS)
    assert v.status == "correct", f"{v.status}/{v.reasons}: {v.message[:2000]}"
    assert _variant(tmp_path, "kc_fast_gpu_fb") == "plain"


@pytest.mark.gpu
@pytest.mark.slow  # cold nvcc builds of several variants: 17-100 s on the H100
def test_gpu_broken_kernel_same_trimmed_error(tmp_path, monkeypatch):
    src = GPU_CAND.read_text().replace("kc_test_cuda_add_relu", "kc_fast_gpu_broken").replace(
        "out[i] = v > 0.0f ? v : 0.0f;", "out[i] = v > 0.0f ? v : zero_value;")
    fast = evaluate(GPU_TASK, src, cache_dir=tmp_path / "fast", **GPU_OPTS)
    monkeypatch.setenv("KERNELCRAFT_FASTBUILD", "0")
    plain = evaluate(GPU_TASK, src, cache_dir=tmp_path / "plain", **GPU_OPTS)
    assert (fast.status, fast.reasons) == ("compile_error", ["build_failed"]), fast.message
    assert 'identifier "zero_value" is undefined' in fast.message
    norm = lambda s: re.sub(r"/\S+/(?=cuda\.cu)", "", s)
    assert norm(fast.message) == norm(plain.message)


SPLIT_CAND = FIXTURES / "legit" / "gpu_cuda_split_forms.py"


@pytest.mark.gpu
def test_gpu_split_builds_are_correct(tmp_path, monkeypatch):
    """The split (kernels through nvcc without torch, the wrapper in main.cpp, launches through
    cudaLaunchKernel): every launch form of the fixture, and the plain fixture, correct."""
    monkeypatch.setenv("KERNELCRAFT_SPLIT", "1")
    for cand, ext in ((GPU_CAND, "kc_test_cuda_add_relu"), (SPLIT_CAND, "kc_test_cuda_split_forms")):
        v = evaluate(GPU_TASK, cand, cache_dir=tmp_path, **GPU_OPTS)
        assert v.status == "correct", f"{cand.name}: {v.status}/{v.reasons}: {v.message[:2000]}"
        assert _variant(tmp_path, ext) == SPLIT_V


@pytest.mark.gpu
@pytest.mark.slow  # cold nvcc builds of several variants: 17-100 s on the H100
def test_gpu_split_launch_error_as_in_a_types_build(tmp_path, monkeypatch):
    """An invalid launch configuration (4096 threads a block) fails the same way, with the same CUDA error,
    through the split's launch as through <<<>>> in the .cu."""
    src = GPU_CAND.read_text().replace("kc_test_cuda_add_relu", "kc_split_badcfg").replace(
        "const int threads = 256;", "const int threads = 4096;")
    verdicts = {}
    for split in ("1", "0"):
        monkeypatch.setenv("KERNELCRAFT_SPLIT", split)
        verdicts[split] = evaluate(GPU_TASK, src, cache_dir=tmp_path / split, **GPU_OPTS)
    assert _variant(tmp_path / "1", "kc_split_badcfg") == SPLIT_V
    assert _variant(tmp_path / "0", "kc_split_badcfg") == TYPES_V
    s, t = verdicts["1"], verdicts["0"]
    assert (s.status, s.reasons) == (t.status, t.reasons) and s.status != "correct", (s, t)
    first = lambda v: v.message.splitlines()[0]  # the CUDA error, named as the runtime names it
    assert first(s) == first(t) and "CUDA error" in first(s), (s.message, t.message)


TEMPLATE_CAND = FIXTURES / "legit" / "gpu_cuda_template_dispatch.py"


@pytest.mark.gpu
@pytest.mark.slow  # cold nvcc builds of several variants: 17-100 s on the H100
def test_gpu_split_kernel_template_is_correct(tmp_path, monkeypatch):
    """Kernel templates (split by default): a kernel template launched under AT_DISPATCH_FLOATING_TYPES_AND_HALF (the
    .cu instantiates it for double, float and Half; main.cpp launches it through the address functions)."""
    monkeypatch.setenv("KERNELCRAFT_SPLIT", "1")
    v = evaluate(GPU_TASK, TEMPLATE_CAND, cache_dir=tmp_path, **GPU_OPTS)
    assert v.status == "correct", f"{v.status}/{v.reasons}: {v.message[:2000]}"
    assert _variant(tmp_path, "kc_test_cuda_template_dispatch") == SPLIT_V
