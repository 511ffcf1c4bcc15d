"""The static AST screen (kernelcraft.judge.caller.screen): rules on snippets, and what it says about every guard fixture.

Runs no worker and no candidate code: the whole module takes well under a second.
"""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

import test_guards as G
from kernelcraft.evaluate import evaluate
from kernelcraft.judge.caller.screen import screen


def reasons(src: str, mode: str = "open") -> list[str]:
    return screen(textwrap.dedent(src), mode).reasons


# -- every guard fixture: the `static:` key of its header ------------------------------------------------------
@pytest.mark.parametrize("path", G.all_guard_fixtures(), ids=lambda p: p.name)
def test_fixture_static_expectation(path: Path):
    spec = G.parse_header(path)
    s = screen(path.read_text(), spec.mode)
    found = [m for _, m in s.findings]
    if spec.static == "flagged":
        want = set(spec.expect.reasons)
        assert want & set(s.reasons), f"{path.name}: the screen should flag one of {sorted(want)}; found {found}"
    elif spec.static in ("dodges", "clean"):
        assert not s.findings, f"{path.name} ({spec.static}): the screen should find nothing, found {found}"


def test_screen_on_flagged_fixture_rejects_without_a_worker():
    """A screen finding is a verdict before any process starts (no runtime guards listed)."""
    spec = G.parse_header(G.HACKS / "timer_patch_at_import.py")
    v = evaluate(spec.task, spec.path, device="cpu", screen=True, timing=False)
    assert v.status == "rejected" and v.reasons == ["timer_tampering"] and v.guards == ["screen"], v


# -- rules -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("src,code", [
    ("import time\ntime.perf_counter = lambda: 0.0\n", "timer_tampering"),
    ("import time as t\nt.perf_counter_ns = lambda: 0\n", "timer_tampering"),
    ("from time import perf_counter\nimport time\ntime.monotonic += 0\n", "timer_tampering"),
    ("import torch\ntorch.cuda.Event.elapsed_time = lambda s, e: 0.0\n", "timer_tampering"),
    ("import torch\nsetattr(torch.cuda, 'synchronize', lambda: None)\n", "timer_tampering"),
    ("import timeit\ntimeit.default_timer = lambda: 0\n", "timer_tampering"),
    ("import torch\ntorch.nn.functional.linear = None\n", "global_state_tampering"),
    ("import torch.nn.functional as F\nF.linear = None\n", "global_state_tampering"),
    ("from torch.nn import functional as F\nF.gelu = None\n", "global_state_tampering"),
    ("import torch\ntorch.Tensor.__matmul__ = None\n", "global_state_tampering"),
    ("import torch\nsetattr(torch.Tensor, '__add__', None)\n", "global_state_tampering"),
    ("import torch\ndel torch.nn.functional.relu\n", "global_state_tampering"),
    ("import torch\na, torch.matmul = 1, None\n", "global_state_tampering"),
    ("import torch\ntorch.backends.cuda.matmul.allow_tf32 = True\n", "global_state_tampering"),
    ("import torch\ntorch.backends.cudnn.allow_tf32 = False\n", "global_state_tampering"),
    ("import torch\ntorch.backends.cudnn.enabled = False\n", "global_state_tampering"),
    ("import torch\ntorch.set_num_threads(1)\n", "global_state_tampering"),
    ("import torch\ntorch.set_float32_matmul_precision('medium')\n", "global_state_tampering"),
    ("import torch\ntorch.set_default_dtype(torch.float64)\n", "global_state_tampering"),
    ("import torch\ntorch.use_deterministic_algorithms(True)\n", "global_state_tampering"),
    ("import torch\ntorch.set_flush_denormal(True)\n", "global_state_tampering"),
    ("from torch import set_num_threads\nset_num_threads(1)\n", "global_state_tampering"),
    ("import threading\n", "thread_injection"),
    ("from threading import Thread\n", "thread_injection"),
    ("import _thread\n", "thread_injection"),
    ("from concurrent.futures import ThreadPoolExecutor\n", "thread_injection"),
    ("import multiprocessing as mp\n", "thread_injection"),
    ("import subprocess\n", "thread_injection"),
    ("import signal\n", "thread_injection"),
    ("import os\nos.fork()\n", "thread_injection"),
    ("import os\nos.system('true')\n", "thread_injection"),
    ("import os as o\no.posix_spawn\n", "thread_injection"),
    ("import kernelcraft\n", "forbidden_construct"),
    ("from kernelcraft.judge.tripwires.guards import ProcessState\n", "forbidden_construct"),
    ("import kernelcraft_reference\n", "forbidden_construct"),
    ("import gc\n", "forbidden_construct"),
    ("import sys\nf = sys._getframe(1)\n", "forbidden_construct"),
    ("import inspect\nf = inspect.currentframe().f_back.f_locals\n", "forbidden_construct"),
    ("x = __import__('os')\n", "forbidden_construct"),
    ("b = __builtins__\n", "forbidden_construct"),
])
def test_rule_flags(src: str, code: str):
    assert code in reasons(src), (src, reasons(src))


@pytest.mark.parametrize("src", [
    "import torch\ntorch.backends.cudnn.benchmark = True\n",
    "import torch\nimport torch._inductor.config\ntorch._inductor.config.coordinate_descent_tuning = True\n",
    "import torch\ntorch._dynamo.config.cache_size_limit = 64\n",
    "import time\nt0 = time.perf_counter()\nms = (time.perf_counter() - t0) * 1e3\n",
    "import torch\ntorch.cuda.synchronize()\ns = torch.cuda.Stream()\n",
    "import torch\nn = torch.get_num_threads()\np = torch.get_float32_matmul_precision()\n",
    "from time import perf_counter\nperf_counter = None  # rebinding a local name patches nothing\n",
    "import torch\nclass M(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
    "        self.linear = torch.nn.Linear(2, 2)\n        self.linear.weight.data.fill_(0)\n",
    "import os\npath = os.path.join('a', 'b')\nn = os.cpu_count()\n",
    "import torch\nwith torch.backends.cudnn.flags(enabled=True, benchmark=True):\n    pass\n",
    "import torch\nx = torch.ones(2)\nx.requires_grad = False\n",
])
def test_rule_allows(src: str):
    assert reasons(src) == [], (src, screen(src).findings)


def test_findings_carry_line_numbers():
    s = screen("import torch\n\n\ntorch.set_num_threads(1)\n")
    assert s.findings and "(line 4)" in s.findings[0][1]


# -- strict mode: own kernels and the reference ----------------------------------------------------------------
CUDA_EXT = '''
import torch
from torch.utils.cpp_extension import load_inline
src = r"""
__global__ void scale_kernel(float* x, int n) {}
__global__ __launch_bounds__(256) void other_kernel(float* x) {}
"""
ext = load_inline(name="e", cpp_sources="", cuda_sources=src, functions=["f"])
'''


def test_kernel_names_from_cuda_source():
    s = screen(CUDA_EXT)
    assert s.has_inline_ext
    assert s.kernel_names == ["scale_kernel", "other_kernel"]


def test_triton_kernels_found():
    s = screen("""
import triton
import triton.language as tl

@triton.autotune(configs=[], key=["n"])
@triton.jit
def add_kernel(x, n, BLOCK: tl.constexpr):
    pass

@triton.jit()
def mul_kernel(x):
    pass
""")
    assert s.has_triton and set(s.kernel_names) == {"add_kernel", "mul_kernel"}


STRICT_OK = CUDA_EXT + '''
def helper(x):
    return ext.f(x)

class ModelNew(torch.nn.Module):
    def forward(self, x):
        return helper(x)
'''


def test_strict_reachability():
    assert reasons(STRICT_OK, "strict") == []
    assert reasons(STRICT_OK, "open") == []
    unreachable = CUDA_EXT + "class ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x * 2\n"
    assert reasons(unreachable, "strict") == ["no_custom_kernel"]
    assert reasons(unreachable, "open") == []
    calls_model = STRICT_OK + "\nclass Model(torch.nn.Module):\n    pass\n\n" \
        "class ModelNew2(Model):\n    pass\nModelNew = ModelNew2\n"
    assert "reference_call" in reasons(calls_model, "strict")
    plain = "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
    assert reasons(plain, "strict") == ["no_custom_kernel"]


def test_strict_triton_reachable():
    src = """
import torch
import triton

@triton.jit
def k(x):
    pass

class ModelNew(torch.nn.Module):
    def forward(self, x):
        k[(1,)](x)
        return x
"""
    assert reasons(src, "strict") == []


def test_kernel_names_whatever_the_declaration_style():
    # a legitimate strict-mode kernel must be recognised when it runs: a wrong name here means a false
    # `no_custom_kernel` (the H100 throughput run found `__launch_bounds__` after `void` read as the name)
    from kernelcraft.judge.caller.screen import cuda_kernel_names

    src = r'''
__global__ void __launch_bounds__(BLOCK) chain_vec4(const float4* __restrict__ x, float4* y, int64_t n4) {}
__global__ void __launch_bounds__(256, 2) lb_two(float* x) {}
template <int B> __global__ void templated(float* x) {}
extern "C" __global__ void c_linkage(float* x);
extern "C" __global__ void c_linkage(float* x) {}
static __global__ __launch_bounds__(MAX(128, 64)) void nested_bounds(float* x) {}
__global__
void split_lines(
    float* x) {}
'''
    assert cuda_kernel_names(src) == ["chain_vec4", "lb_two", "templated", "c_linkage", "nested_bounds",
                                      "split_lines"]


# -- a screen that reads values: no change is not tampering; real changes stay rejected ---------------
@pytest.mark.parametrize("src", [
    "import torch\ntorch.backends.cudnn.deterministic = False\n",
    "import torch\ntorch.backends.cudnn.allow_tf32 = True\n",
    "import torch\ntorch.backends.cudnn.enabled = True\n",
    "import torch\ntorch.backends.cuda.matmul.allow_tf32 = False\n",
    "import torch.backends.cudnn as cudnn\ncudnn.benchmark, cudnn.deterministic = True, False\n",
    "import torch\ntorch.set_float32_matmul_precision('highest')\n",
    "import torch\ntorch.use_deterministic_algorithms(False)\n",
    "import torch\nclass M:\n    def forward(self, x):\n        torch.backends.cudnn.allow_tf32 = True\n"
    "        return x\n",
])
def test_assigning_a_flag_its_default_is_allowed(src: str):
    assert reasons(src) == [], (src, screen(src).findings)


@pytest.mark.parametrize("src", [
    "import torch\ntorch.backends.cudnn.deterministic = True\n",  # CUDA-L1 level1/task81's line
    "import torch\ntorch.backends.cudnn.benchmark = True\ntorch.backends.cudnn.deterministic = True\n",
    "import torch.backends.cudnn as cudnn\ncudnn.deterministic = True\n",
])
def test_cudnn_algorithm_choice_is_the_candidates_own(src: str):
    """Three processes: cuDNN's algorithm switches reach only the candidate's process, and neither changes precision."""
    assert reasons(src) == [], (src, screen(src).findings)
    assert "global_state_tampering" in reasons(src + "torch.backends.cudnn.allow_tf32 = False\n"
                                               "torch.backends.cuda.matmul.allow_tf32 = True\n")


@pytest.mark.parametrize("src", [
    "import torch\ntorch.backends.cudnn.fastest = True\n",
    "import torch\ntorch.backends.cudnn.workspace_limit = 768 * 1024 * 1024\n",
    "import torch\ntorch.backends.cudnn.workspace_limit_in_bytes = 1 << 30\n",
    "import torch\ntorch.backends.kernelcraft_no_such_flag = 1\n",
])
def test_assigning_an_attribute_torch_does_not_define_is_allowed(src: str):
    assert reasons(src) == [], (src, screen(src).findings)


@pytest.mark.parametrize("src", [
    "import torch\nif hasattr(torch.backends.cuda.matmul, 'kc_no_such_flag'):\n"
    "    torch.backends.cuda.matmul.allow_tf32 = True\n    torch.set_num_threads(1)\n",
    "import torch\nif not hasattr(torch.backends.cudnn, 'allow_tf32'):\n    pass\nelse:\n    pass\n"
    "if not hasattr(torch, 'set_num_threads'):\n    torch.set_num_threads(1)\n",
    "import torch\nif hasattr(torch.backends.cudnn, 'kc_nope') and torch.cuda.is_available():\n"
    "    torch.backends.cudnn.allow_tf32 = False\n",
    "import torch\nif hasattr(torch, 'set_num_threads'):\n    pass\nelse:\n    torch.set_num_threads(1)\n",
])
def test_code_under_a_false_hasattr_is_dead(src: str):
    assert reasons(src) == [], (src, screen(src).findings)


@pytest.mark.parametrize("src", [
    "import torch\ntorch.backends.cuda.matmul.allow_tf32 = True\n",  # a real change
    "import torch\ntorch.backends.cudnn.allow_tf32 = 0\n",  # not the default's type: not read as the default
    "import torch\nflag = True\ntorch.backends.cudnn.allow_tf32 = flag\n",  # a value the screen cannot read
    "import torch\ntorch.backends.cudnn.allow_tf32 += True\n",
    "import torch\ntorch.set_float32_matmul_precision('high')\n",
    "import torch\ntorch.use_deterministic_algorithms(False, warn_only=True)\n",
    "import torch\ntorch.nn.functional.relu = None\n",  # defined: patching
    "import torch\ntorch.Tensor.kc_new_method = None\n",  # a class: not exempt
    "import torch\ntorch.nn.functional.__kc__ = None\n",  # a dunder: not exempt
    # the live branch of a hasattr that is true here, and hasattr on something not torch
    "import torch\nif hasattr(torch.backends.cuda.matmul, 'allow_tf32'):\n"
    "    torch.backends.cuda.matmul.allow_tf32 = True\n",
    "import torch\nimport os\nif hasattr(os, 'kc_nope'):\n    torch.set_num_threads(1)\n",
    "import torch\nif hasattr(torch, 'set_num_threads'):\n    torch.set_num_threads(1)\n",
    "import torch\ndef hasattr(a, b):\n    return True\nif hasattr(torch, 'kc_nope'):\n    torch.set_num_threads(1)\n",
])
def test_real_changes_stay_rejected(src: str):
    assert "global_state_tampering" in reasons(src), (src, screen(src).findings)


def test_flag_defaults_are_torchs():
    """FLAG_DEFAULTS and CALL_DEFAULTS hold what a fresh interpreter's torch reports (not this process's, which
    other tests may have changed)."""
    import subprocess
    import sys

    from kernelcraft.judge.caller.screen import CALL_DEFAULTS, FLAG_DEFAULTS

    exprs = {p: p for p in FLAG_DEFAULTS}
    exprs.update({f"{fn}()": getter + "()" for fn, (_, getter) in CALL_DEFAULTS.items()})
    code = "import json, torch, torch.backends.cuda, torch.backends.cudnn, torch.backends.mkldnn\n" \
           "print(json.dumps({k: eval(v) for k, v in %r.items()}))" % exprs
    got = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                    timeout=120).stdout.strip().splitlines()[-1])
    want = dict(FLAG_DEFAULTS)
    want.update({f"{fn}()": d for fn, (d, _) in CALL_DEFAULTS.items()})
    assert got == want
