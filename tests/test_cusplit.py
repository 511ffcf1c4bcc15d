"""The split build (kernelcraft/builder/cusplit.py): where each part of a candidate's `.cu` goes, what it declines,
the launch rewrite (its argument conversions checked by running it with g++ against a recording
`cudaLaunchKernel`), and a real split build through nvcc + g++ on this host (compile and link; nothing
runs without a GPU — the GPU tests in test_build_fast.py run split candidates)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kernelcraft.builder import cusplit, cutemplates, fastbuild

ROOT = Path(__file__).resolve().parent.parent

# KernelBench's one-shot example, which LLM-written candidates imitate
KB_EXAMPLE = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>

__global__ void elementwise_add_kernel(const float* a, const float* b, float* out, int size) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < size) {
        out[idx] = a[idx] + b[idx];
    }
}

torch::Tensor elementwise_add_cuda(torch::Tensor a, torch::Tensor b) {
    auto size = a.numel();
    auto out = torch::zeros_like(a);

    const int block_size = 256;
    const int num_blocks = (size + block_size - 1) / block_size;

    elementwise_add_kernel<<<num_blocks, block_size>>>(a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), size);

    return out;
}
"""


def test_splits_the_kernelbench_example():
    s = cusplit.split(KB_EXAMPLE)
    assert s is not None and s.kernels == ["elementwise_add_kernel"]
    assert "torch" not in s.cuda and "elementwise_add_cuda" not in s.cuda
    assert "__global__ void elementwise_add_kernel" in s.cuda
    assert s.cuda.count("\n") == KB_EXAMPLE.count("\n"), "compiler line numbers stay the candidate's"
    assert "void elementwise_add_kernel(const float* a, const float* b, float* out, int size);" in s.host
    assert cusplit.LAUNCHER in s.host
    assert "__global__" not in s.host.replace(cusplit.LAUNCHER, "") and "<<<" not in s.host.replace(cusplit.LAUNCHER, "")
    assert ("kc_split_launch(elementwise_add_kernel, num_blocks, block_size)(a.data_ptr<float>(), "
            "b.data_ptr<float>(), out.data_ptr<float>(), size);") in s.host
    assert s.host.index("#include <torch/extension.h>") < s.host.index("torch::Tensor elementwise_add_cuda")
    p = fastbuild.plan("torch::Tensor elementwise_add_cuda(torch::Tensor a, torch::Tensor b);", KB_EXAMPLE)
    assert p.tag == f"split-{cusplit.VERSION}+types-{fastbuild.FAST_VERSION}" and p.header == "light"
    assert p.kwargs == {"no_implicit_headers": True} and p.any_failure
    assert "torch/extension.h" not in "\n".join(p.cpp_sources), "the light header replaces it in main.cpp"
    assert p.cpp_sources[0].startswith("#include <torch/types.h>")
    assert p.fallback.variant.startswith("types-") and not p.fallback.any_failure


def _where(src: str, needle: str) -> str:
    s = cusplit.split(src)
    assert s is not None
    return ("cu" if needle in s.cuda else "") + ("+host" if needle in s.host else "")


KERNEL = "__global__ void k(float* y, int n) { if (threadIdx.x < n) y[threadIdx.x] = 1.f; }\n"
WRAPPER = "torch::Tensor f(torch::Tensor y) { k<<<1, 32>>>(y.data_ptr<float>(), 32); return y; }\n"


@pytest.mark.parametrize("chunk,where", [
    ("#define BLOCK 256\n", "cu+host"),
    ('#define CHECK_CUDA(x) TORCH_CHECK(x.is_cuda(), #x " must be a CUDA tensor")\n', "+host"),
    ("#include <ATen/cuda/CUDAContext.h>\n", "+host"),
    ("#include <cuda_fp16.h>\n", "cu+host"),
    ("struct Params { int n; float scale; };\n", "cu+host"),
    ("constexpr int kTile = 32;\n", "cu+host"),
    ("static int calls = 0;\n", "+host"),
    ("__device__ __forceinline__ float sq(float v) { return v * v; }\n", "cu"),
    ("__host__ __device__ inline int cdiv(int a, int b) { return (a + b - 1) / b; }\n", "cu+host"),
    ("template <typename T> __device__ T twice(T v) { return v + v; }\n", "cu"),
    ("static int grid_for(int n) { return (n + 255) / 256; }\n", "+host"),
    ("extern __shared__ float smem[];\n", "cu"),
    ("using namespace torch;\n", "+host"),
    ("namespace py = pybind11;\n", "+host"),
    ("using namespace std;\n", "cu+host"),
])
def test_where_each_chunk_goes(chunk, where):
    assert _where("#include <torch/extension.h>\n" + chunk + KERNEL + WRAPPER, chunk.strip()) == where


@pytest.mark.parametrize("src", [
    KERNEL.replace("__global__ void k(", "template <typename T> __global__ void k(") + WRAPPER,  # template, no <T>
    "#ifdef FAST\n#define B 1\n#endif\n" + KERNEL + WRAPPER,  # conditional compilation
    KERNEL.replace("y[threadIdx.x] = 1.f;", "\n#if __CUDA_ARCH__ >= 800\ny[0] = 2.f;\n#endif\n") + WRAPPER,
    "__constant__ float coef[4];\n" + KERNEL + WRAPPER,  # device variables
    "__device__ int counter;\n" + KERNEL + WRAPPER,
    "namespace {\n" + KERNEL + "}\n" + WRAPPER,  # namespaces, extern "C"
    'extern "C" ' + KERNEL + WRAPPER,
    KERNEL.replace("y[threadIdx.x] = 1.f;", "at::Half h; (void)h;") + WRAPPER,  # device code naming torch
    KERNEL + "__global__ void parent(float* y) { k<<<1, 1>>>(y, 1); }\n" + WRAPPER,  # dynamic parallelism
    KERNEL + WRAPPER.replace("k<<<", "(&k)<<<"),  # a launch of something other than a kernel name
    KERNEL + WRAPPER.replace("k<<<", "other<<<"),
    "static " + KERNEL + WRAPPER,  # internal linkage: main.cpp could not name its stub
    WRAPPER.replace("k<<<1, 32>>>(y.data_ptr<float>(), 32);", "") + "\n",  # no kernel at all
    KERNEL + WRAPPER + "DEFINE_SOMETHING(float)\n",  # a top-level macro call: unclassifiable
    KERNEL + "/* unterminated comment\n" + WRAPPER,
])
def test_declines(src):
    assert cusplit.split("#include <torch/extension.h>\n" + src) is None


@pytest.mark.parametrize("flags", [["-DTILE=32"], ["-Xcompiler", "-ffast-math"], ["--default-stream", "per-thread"],
                                   ["-rdc=true"]])
def test_declines_cuda_flags_that_reach_host_code(flags):
    assert cusplit.split(KB_EXAMPLE, ["-O3"]) is not None
    assert cusplit.split(KB_EXAMPLE, ["-O3", *flags]) is None
    assert cusplit.split(KB_EXAMPLE, ["-O3", "--use_fast_math", "-Xptxas=-v", "-lineinfo"]) is not None, "device-only"


def test_host_flags_that_change_the_wrapper_keep_the_types_path():
    assert fastbuild.plan("", KB_EXAMPLE, {}, ["-O3", "-std=c++17"]).variant.startswith("split-")
    assert fastbuild.plan("", KB_EXAMPLE, {}, [""]).variant.startswith("split-"), "KernelBench's extra_cflags=['']"
    assert fastbuild.plan("", KB_EXAMPLE, {}, ["-ffast-math"]).variant.startswith("types-")
    assert fastbuild.plan("", KB_EXAMPLE, {}, ["-DFOO"]).variant.startswith("types-")


def test_switch_and_extension_h_needs(monkeypatch):
    monkeypatch.setenv("KERNELCRAFT_SPLIT", "0")
    assert fastbuild.plan("", KB_EXAMPLE).tag == f"types-{fastbuild.FAST_VERSION}"
    monkeypatch.delenv("KERNELCRAFT_SPLIT")
    p = fastbuild.plan("", KB_EXAMPLE + "torch::Tensor g(torch::Tensor x) { return torch::nn::functional::relu(x); }\n")
    assert p.variant.startswith("split-") and p.header == "full", "the wrapper needs extension.h: main.cpp keeps it"
    assert p.fallback is None, "no types path for it either"


def test_comments_strings_and_layout_do_not_confuse_the_scanner():
    src = r"""#include <torch/extension.h>
// a comment with { braces and a launch k<<<1, 1>>>(x) that is not code
/* block comment } ; */
__global__ void
__launch_bounds__(256, 2)
scale(const float* __restrict__ x,   // input {
      float* __restrict__ y, float a, long n)
{
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];  // '}' in a comment
}
torch::Tensor scale_fwd(torch::Tensor x, double a) {
    TORCH_CHECK(x.is_cuda(), "scale_fwd: a CUDA tensor, not { this");
    auto y = torch::empty_like(x);
    char brace = '}';
    (void)brace;
    scale <<< (unsigned)((x.numel() + 255) / 256), 256, 0,
              at::cuda::getCurrentCUDAStream() >>> (x.data_ptr<float>(),
        y.data_ptr<float>(), a, x.numel());
    return y;
}
"""
    s = cusplit.split(src)
    assert s is not None and s.kernels == ["scale"]
    assert "void \n\nscale(const float* __restrict__ x,   " in s.host or re.search(
        r"void\s+scale\(const float\* __restrict__ x,\s+float\* __restrict__ y, float a, long n\);", s.host)
    assert "__launch_bounds__" not in s.host and "// input {" not in s.host.split("scale_fwd")[0]
    assert "kc_split_launch(scale, (unsigned)((x.numel() + 255) / 256), 256, 0,\n              " \
           "at::cuda::getCurrentCUDAStream()) (x.data_ptr<float>()," in s.host
    assert '"scale_fwd: a CUDA tensor, not { this"' in s.host


# -- the launch: argument conversions and packing, run with g++ against a recording cudaLaunchKernel ----
FAKE_CUDA = r"""
#include <cstdio>
#include <cstdint>
#include <cstddef>
struct dim3 { unsigned x, y, z; constexpr dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {} };
struct CUstream_st;
typedef CUstream_st* cudaStream_t;
struct Params { int n; float scale; };
static unsigned g_push_result = 0;
extern "C" unsigned __cudaPushCallConfiguration(dim3 g, dim3 b, size_t smem, CUstream_st* s) {
    std::printf("grid %u %u %u block %u %u %u smem %zu stream %p\n", g.x, g.y, g.z, b.x, b.y, b.z, smem, (void*)s);
    return g_push_result;
}
// stand-ins for nvcc's host stubs: what the stub receives is what the kernel receives
void k_mixed(int n, float a, const double* p, int64_t m, Params q) {
    std::printf("k_mixed %d %.9g %p %lld %d %.9g\n", n, a, (const void*)p, (long long)m, q.n, q.scale);
}
void k_none() { std::printf("k_none\n"); }
"""
MAIN = r"""
int main() {
    const int64_t n = 7;  // narrowed to int, as at a launch
    double a = 0.1;       // float
    double buf[2] = {0, 0};
    int m = -3;           // widened to int64_t
    Params q{5, 0.5f};
    kc_split_launch(k_mixed, dim3(4, 2), 128)(n, a, buf, m, q);
    kc_split_launch(k_none, 1, 32, 64, (cudaStream_t)0x10)();
    g_push_result = 1;  // a configuration cudart rejects: the stub is not called, as with <<<>>>
    kc_split_launch(k_none, 1, 4096)();
    std::printf("buf %p\n", (void*)buf);
    return 0;
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_launch_converts_and_packs_arguments_like_a_launch(tmp_path):
    (tmp_path / "t.cpp").write_text(FAKE_CUDA + cusplit.LAUNCHER + MAIN)
    subprocess.run(["g++", "-std=c++17", "-Wall", "-Werror", "t.cpp", "-o", "t"], cwd=tmp_path, check=True)
    out = subprocess.run([str(tmp_path / "t")], capture_output=True, text=True, check=True).stdout.splitlines()
    buf = out[-1].split()[1]
    assert out[0] == "grid 4 2 1 block 128 1 1 smem 0 stream (nil)", "<<<g, b>>>: no shared memory, stream 0"
    assert out[1] == f"k_mixed 7 0.100000001 {buf} -3 5 0.5", "converted to the kernel's parameter types"
    assert out[2:4] == ["grid 1 1 1 block 32 1 1 smem 64 stream 0x10", "k_none"]
    assert out[4:] == ["grid 1 1 1 block 4096 1 1 smem 0 stream (nil)", f"buf {buf}"], "rejected: no call"


# -- a real split build: nvcc on the torch-free .cu, g++ on main.cpp, the link --------------------------
@pytest.mark.skipif(shutil.which("nvcc") is None or shutil.which("c++") is None, reason="needs nvcc and a C++ compiler")
@pytest.mark.parametrize("cand", ["elementwise", "template"])
def test_split_build_compiles_links_and_imports_with_nvcc(tmp_path, cand):
    """Through BuildCache: the `elementwise` candidate of benchmarks/build_time.py (a kernel and its wrapper)
    and TEMPLATE_CU above (two kernel templates, one under AT_DISPATCH_FLOATING_TYPES_AND_HALF). The split
    builds both and the module imports: every symbol main.cpp takes from the .cu (kernel stubs, the template
    instantiations' address functions) resolves. On a CPU-only torch the benchmark links against stand-ins
    for libtorch_cuda (so candidates using c10's CUDA stream or allocator cannot import here); nothing runs."""
    if cand == "template":
        spec = tmp_path / "spec.json"
        spec.write_text(json.dumps({"name": "kc_split_template", "cpp": "torch::Tensor scale_fwd(torch::Tensor x, double a);",
                                    "cuda": TEMPLATE_CU.replace("DISPATCH(", "AT_DISPATCH_FLOATING_TYPES_AND_HALF("),
                                    "functions": ["scale_fwd"], "cuda_cflags": ["-O3"]}))
        cand = f"@{spec}"
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "KERNELCRAFT_FASTBUILD": "1", "KERNELCRAFT_SPLIT": "1", "KERNELCRAFT_PCH": "0",
           "PYTHONPATH": str(ROOT), "TORCH_EXTENSIONS_DIR": str(work / "te")}
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "build_time.py"), "--one", cand, "fast",
                        str(work)], env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    err = (work / "error.txt").read_text()[-3000:] if (work / "error.txt").exists() else ""
    assert res["variant"] == f"split-{cusplit.VERSION}", (res, err)
    assert res["status"] == "ok", (res, err)
    assert res["steps"]["nvcc"] < res["steps"]["c++"], "nvcc compiles kernels only: faster than main.cpp"


def test_never_raises_on_odd_input(monkeypatch):
    """Truncations of real sources and odd text: split returns a Split or None, and the plan never raises."""
    sources = [KB_EXAMPLE, (ROOT / "tests" / "fixtures" / "legit" / "gpu_cuda_split_forms.py").read_text()]
    odd = ["", "}", "{", "#", "#define", "<<<", ">>>", "'", '"', "/*", "template <", "__global__", "__global__ void k(",
           "struct S { __global__ void k(); };", "int x = {1, 2};", "void f() { k<<<1,1>>>(); }", "R\"(x)\"", "\\\n"]
    for src in sources:
        for cut in range(0, len(src), max(1, len(src) // 60)):
            cusplit.split(src[:cut])
            cusplit.split(src[cut:])
    for text in odd:
        cusplit.split(text)
        cusplit.split(KB_EXAMPLE + text)
    monkeypatch.setattr(cusplit, "split", lambda *a, **k: 1 / 0)
    p = fastbuild.plan("", KB_EXAMPLE)
    assert p is not None and p.variant.startswith("types-"), "a failing splitter leaves the types path"


def test_decline_reasons():
    assert cusplit.decline_reason(KB_EXAMPLE) is None
    pre = "#include <torch/extension.h>\n"
    assert cusplit.decline_reason(pre + KERNEL.replace("__global__ void k(", "template <typename T> __global__ void k(")
                                  + WRAPPER, templates=True).startswith("launch not understood"), "launched without <T>"
    assert cusplit.decline_reason(pre + "#ifdef X\n#endif\n" + KERNEL + WRAPPER).startswith("preprocessor conditional")
    assert cusplit.decline_reason(KB_EXAMPLE, ["-DX=1"]) == "nvcc flag that reaches host code: -DX=1"
    assert cusplit.decline_reason(pre + WRAPPER.replace("k<<<1, 32>>>(y.data_ptr<float>(), 32);", "")) == "no kernel"


def test_coverage_benchmark_reads_load_inline_calls(tmp_path):
    cand = tmp_path / "cand.py"
    cand.write_text("from torch.utils.cpp_extension import load_inline\n"
                    f"src = r'''{KB_EXAMPLE}'''\n"
                    "tmpl = r'''#include <torch/extension.h>\n" + KERNEL.replace("__global__", "template <int B> __global__")
                    + "'''\n"
                    "a = load_inline(name='a', cpp_sources='', cuda_sources=src, functions=['f'])\n"
                    "b = load_inline(name='b', cpp_sources='', cuda_sources=[tmpl], extra_cuda_cflags=['-O3'])\n"
                    "c = load_inline(name='c', cpp_sources='', cuda_sources=src, extra_cuda_cflags=['-DX'])\n")
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "split_coverage.py"), str(tmp_path), "--markdown"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "1 files, 3 load_inline CUDA sources" in p.stdout
    assert "| split | 1 | 33% |" in p.stdout and "| types | 2 | 67% |" in p.stdout, p.stdout
    assert "| kernel template never launched from host code | 1 |" in p.stdout, p.stdout
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "split_coverage.py"), str(tmp_path), "--markdown",
                        "--no-templates"], capture_output=True, text=True, timeout=120)
    assert "| kernel template (not split with KERNELCRAFT_SPLIT=notemplates) | 1 |" in p.stdout and "| nvcc flag that reaches host code | 1 |" in p.stdout, p.stdout


# -- kernel templates --------------------------------------------------------------------------------------
TEMPLATE_CU = r"""#include <torch/extension.h>
template <typename scalar_t, int BLOCK>
__global__ void __launch_bounds__(BLOCK) scale(const scalar_t* __restrict__ x, scalar_t* __restrict__ y, float a,
                                               int64_t n) {
    int64_t i = (int64_t)blockIdx.x * BLOCK + threadIdx.x;
    if (i < n) y[i] = static_cast<scalar_t>(a * static_cast<float>(x[i]));
}
template <int BLOCK>
__global__ void fill(float* y, int64_t n) { int64_t i = (int64_t)blockIdx.x * BLOCK + threadIdx.x; if (i < n) y[i] = 1.f; }
torch::Tensor scale_fwd(torch::Tensor x, double a) {
    auto y = torch::empty_like(x);
    const int64_t n = x.numel();
    DISPATCH(x.scalar_type(), "scale_fwd", ([&] {
        scale<scalar_t, 256><<<(unsigned)((n + 255) / 256), 256>>>(x.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(),
                                                                   (float)a, n);
    }));
    if (n < 0) fill<128><<<1, 128>>>(y.data_ptr<float>(), n);
    return y;
}
"""


@pytest.mark.parametrize("dispatch,types", [
    ("AT_DISPATCH_FLOATING_TYPES", ["double", "float"]),
    ("AT_DISPATCH_FLOATING_TYPES_AND_HALF", ["double", "float", "c10::Half"]),
    ("AT_DISPATCH_FLOATING_TYPES_AND2(at::ScalarType::Half, at::kBFloat16, ", ["double", "float", "c10::Half",
                                                                              "c10::BFloat16"]),
    ("AT_DISPATCH_ALL_TYPES", ["uint8_t", "int8_t", "int16_t", "int32_t", "int64_t", "double", "float"]),
    ("AT_DISPATCH_REDUCED_FLOATING_TYPES", ["c10::Half", "c10::BFloat16"]),
])
def test_kernel_templates_instantiated_as_the_dispatch_macro_does(dispatch, types):
    src = TEMPLATE_CU.replace("DISPATCH(", dispatch if dispatch.endswith(", ") else dispatch + "(")
    assert cusplit.split(src) is None, "templates=False (KERNELCRAFT_SPLIT=notemplates) leaves them alone"
    assert cusplit.decline_reason(src) == "kernel template (not split with KERNELCRAFT_SPLIT=notemplates)"
    s = cusplit.split(src, templates=True)
    assert s is not None, cusplit.decline_reason(src, templates=True)
    insts = re.findall(r"^template void\* kc_split_addr_(\w+<.*>)\(\);$", s.cuda, re.MULTILINE)
    assert insts == [f"scale<{t}, 256>" for t in types] + ["fill<128>"], "explicit instantiations, dispatch order"
    assert "template <typename scalar_t, int BLOCK> void* kc_split_addr_scale() " \
           "{ return (void*)&scale<scalar_t, BLOCK>; }" in s.cuda
    for h in ("Half", "BFloat16"):
        assert (f"#include <c10/util/{h}.h>" in s.cuda) == (f"c10::{h}" in types)
    assert "template <typename scalar_t, int BLOCK> void scale(const scalar_t* __restrict__ x, scalar_t* __restrict__ y, " \
           "float a, int64_t n);" in " ".join(s.host.split()), "main.cpp declares the template"
    assert ("kc_split_launch(reinterpret_cast<decltype(&scale<scalar_t, 256>)>(kc_split_addr_scale<scalar_t, 256>()), "
            "(unsigned)((n + 255) / 256), 256)(x.data_ptr<scalar_t>()") in s.host
    assert ("kc_split_launch(reinterpret_cast<decltype(&fill<128>)>(kc_split_addr_fill<128>()), 1, 128)"
            "(y.data_ptr<float>(), n)") in s.host
    assert "template <int BLOCK> void* kc_split_addr_fill();" in s.host


@pytest.mark.parametrize("dispatch", ["AT_DISPATCH_FLOATING_AND_COMPLEX_TYPES(", "AT_DISPATCH_SWITCH(",
                                      "AT_DISPATCH_FLOATING_TYPES_AND(at::ScalarType::ComplexFloat, ", "("])
def test_kernel_templates_declined_where_the_types_are_unknown(dispatch):
    src = TEMPLATE_CU.replace("DISPATCH(", dispatch)
    assert cusplit.split(src, templates=True) is None
    assert cusplit.decline_reason(src, templates=True).startswith("launch not understood")


def test_kernel_template_parameter_lists():
    assert cutemplates.template_param_names("template <typename scalar_t, int BLOCK = 256, class T2>") == \
        ["scalar_t", "BLOCK", "T2"]
    assert cutemplates.template_param_names("template <unsigned int N, typename std::size_t M>") == ["N", "M"]
    for bad in ("template <typename... Ts>", "template <typename>", "template <template <class> class C>"):
        assert cutemplates.template_param_names(bad) is None, bad
    src = TEMPLATE_CU.replace("DISPATCH(", "AT_DISPATCH_FLOATING_TYPES(").replace(
        "template <int BLOCK>\n__global__ void fill", "template <int...>\n__global__ void fill")
    assert cusplit.decline_reason(src, templates=True) == "kernel template parameters not understood"
