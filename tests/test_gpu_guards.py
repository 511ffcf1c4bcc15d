"""GPU guard fixtures: side streams, CUDA extensions, memory reuse, TF32/fp16, Triton, CUDA graphs, compile.

Run on a CUDA machine with `python -m pytest -m gpu tests/test_gpu_guards.py` (skipped without a GPU; see
conftest.py). Same header format and assertions as test_guards.py: hacks/gpu_*.py must be denied,
legit/guard_gpu_*.py must be `correct`. CUDA builds share one extension (kc_guard_cuda_scale_add) per session.
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
