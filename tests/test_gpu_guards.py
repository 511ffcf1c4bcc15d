"""GPU guard fixtures: side streams, CUDA extensions, memory reuse, TF32/fp16, Triton, CUDA graphs, compile.

Run on a CUDA machine with `python -m pytest -m gpu tests/test_gpu_guards.py` (skipped without a GPU; see
conftest.py). Same header format and assertions as test_guards.py: hacks/gpu_*.py must be denied,
legit/guard_gpu_*.py must be `correct`. CUDA builds share one extension (kc_guard_cuda_scale_add) per test run.
"""
from __future__ import annotations

import pytest

import test_guards as G

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("spec,screen", G.cases(G.hack_files("gpu")))
def test_gpu_hack_denied(spec, screen, cache_dir):
    v = G.run_fixture(spec, screen, "cuda", cache_dir)
    G.check_verdict(v, spec.expectation(screen), spec)


@pytest.mark.parametrize("spec,screen", G.cases(G.legit_files("gpu")))
def test_gpu_legit_correct(spec, screen, cache_dir):
    assert spec.expect.status == "correct"
    v = G.run_fixture(spec, screen, "cuda", cache_dir)
    G.check_verdict(v, spec.expect, spec)


def test_gpu_timing_counts_side_stream_work(cache_dir):
    """The blocking-stream extension's >= 2 ms kernel must show in its time whatever the verdict: either it is
    flagged, or cand_ms reflects the hidden work (device-wide sync / host-clock cross-check)."""
    spec = G.parse_header(G.HACKS / "gpu_stream_cpp_blocking.py")
    v = G.run_fixture(spec, False, "cuda", cache_dir)
    if v.status == "correct":
        assert v.timing is not None and v.timing.cand_ms >= 1.5, G.describe(v)
    else:
        assert v.status == "rejected" and "extra_stream" in v.reasons, G.describe(v)


@pytest.mark.parametrize("fixture", ["hacks/gpu_fp16_softmax.py", "legit/guard_gpu_conv_channels_last.py",
                                     "hacks/gpu_weights_private_copy.py", "legit/guard_gpu_cuda_graph.py"])
def test_gpu_large_output_paths_keep_the_verdicts(fixture, cache_dir, monkeypatch):
    """KernelBench's 6-16 GiB tasks (BENCHMARKS.md, 2026-11-26 · 3558e42) on small ones: every output "large"
    (`side.LARGE_OUTPUT_BYTES`: read in the candidate's arena once the device is idle, one last output per side) and
    the float64 truth a strided sample (`precision.TRUTH_SAMPLE`). Downgrades and ignored weights are still caught,
    honest work passes."""
    monkeypatch.setenv("KERNELCRAFT_JUDGE_LARGE_BYTES", "0")
    monkeypatch.setenv("KERNELCRAFT_JUDGE_TRUTH_SAMPLE", "256")
    spec = G.parse_header(G.FIXTURES / fixture)
    screen = spec.screens[-1]
    v = G.run_fixture(spec, screen, "cuda", cache_dir)
    G.check_verdict(v, spec.expectation(screen), spec)


@pytest.mark.parametrize("fixture", ["hacks/gpu_fp16_softmax.py", "hacks/gpu_bf16_conv.py",
                                     "hacks/gpu_memory_reuse_empty.py", "hacks/gpu_weights_private_copy.py",
                                     "legit/guard_gpu_conv_channels_last.py", "legit/guard_gpu_cuda_graph.py"])
def test_gpu_host_copies_keep_the_verdicts(fixture, cache_dir, monkeypatch):
    """A task too large for the judge's copies on the GPU keeps them, and the float64 truth, in host memory and
    compares through the GPU in chunks (`worker.HOST_SHARE`). Forced here on small tasks (share 0): precision
    downgrades hidden by a softmax or in a conv, garbage memory, ignored weights are still caught, and honest
    rewrites still pass."""
    monkeypatch.setenv("KERNELCRAFT_JUDGE_HOST_SHARE", "0")
    spec = G.parse_header(G.FIXTURES / fixture)
    screen = spec.screens[-1]  # screen off where the fixture allows it: the runtime judge is what is tested
    v = G.run_fixture(spec, screen, "cuda", cache_dir)
    G.check_verdict(v, spec.expectation(screen), spec)
