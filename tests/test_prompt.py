"""The prompt: reference, device, exemplars with their scores (best first), failures, rules, protocol."""
from __future__ import annotations

from kernelcraft.search.exemplars import Exemplar
from kernelcraft.search.prompt import PROMPTS_DIR, DeviceInfo, Failure, build_prompt, device_info
from kernelcraft.task import load_task

GPU = DeviceInfo("cuda", "NVIDIA H100 80GB HBM3", sm_count=132, memory_gib=79.1, capability="9.0",
                 torch="2.13.0", cuda="12.8")


def exemplars():
    return [Exemplar(3, "class ModelNew:\n    SLOW = 1  # $slow marker\n", 1.25, ["torch.compile (default)"]),
            Exemplar(7, "class ModelNew:\n    FAST = 1\n", 6.5, ["algebraic rewrite"])]


def test_prompt_contains_everything_in_order():
    task = load_task("tiny/level1/diag_matmul")
    fails = [Failure(9, "compile_error", ["build_failed"], "error: identifier \"foo\" is undefined\n" + "x" * 5000)]
    p = build_prompt(task.source, exemplars(), fails, GPU, backend="cuda", tolerance="1e-4 for float32")
    u = p.user
    assert "torch.diag(A) @ B" in u  # the reference
    assert "NVIDIA H100 80GB HBM3: 132 SMs, 79.1 GiB memory, compute capability 9.0" in u
    # exemplars with their scores, the faster first, and their techniques
    assert "speedup 6.50x (the fastest shown)" in u
    assert "speedup 1.25x (5.20x slower than the fastest shown)" in u
    assert u.index("FAST = 1") < u.index("SLOW = 1")
    assert "$slow marker" in u  # `$` in code is inserted verbatim
    assert "algebraic rewrite" in u and "torch.compile (default)" in u
    # failures with their messages, trimmed
    assert "Attempt #9 — compile_error (build_failed)" in u and 'identifier "foo" is undefined' in u
    assert "[...]" in u and len(u) < 12000
    # rules and protocol
    for needle in ("Performance Analysis", "Algorithm Design", "Code Implementation", "No caching",
                   "Do not change or hard-code the problem sizes", "load_inline", "1e-4 for float32",
                   "defines `class ModelNew`"):
        assert needle in u, needle
    assert p.system and p.messages()[0]["role"] == "system" and p.messages()[1]["content"] == u
    assert "[system]" in p.text() and "[user]" in p.text()


def test_prompt_without_history_and_on_cpu():
    task = load_task("tiny/level1/diag_matmul")
    cpu = device_info("cpu")
    assert cpu.kind == "cpu" and cpu.cores
    p = build_prompt(task.source, [], [], cpu)
    assert "None yet" in p.user and "speedup 1.00" in p.user
    assert "Recent failures\n\nNone." in p.user
    assert "No GPU" in p.user
    assert build_prompt(task.source, [], [], cpu).user == p.user  # pure: same inputs, same text


def test_templates_are_files():
    names = {p.name for p in PROMPTS_DIR.iterdir()}
    assert {"optimize_system.md", "optimize_user.md", "exemplar.md", "failure.md"} <= names
    assert "$exemplars" in (PROMPTS_DIR / "optimize_user.md").read_text()
