"""The build cache: a CPU `load_inline` C++ candidate is correct; its second evaluation reuses the build;
a stale torch `lock` file left in the build directory (a builder killed mid-build) does not hang the next one.

The candidate is tests/fixtures/legit/cpp_inline_elementwise.py (this file owns it: a cold C++ build with
torch/extension.h takes ~30-40 s on 2 cores). Builds live under <cache>/ext/<key>/ (see kernelcraft/builder/cache.py).
"""
from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from kernelcraft.evaluate import evaluate

FIXTURES = Path(__file__).parent / "fixtures"
TASK = FIXTURES / "tasks" / "tiny_elementwise.py"
CAND = FIXTURES / "legit" / "cpp_inline_elementwise.py"
EXT_NAME = "kc_test_scale_add_cpu"  # the `name=` the fixture passes to load_inline

OPTS = dict(time_budget_s=0.5, trials=2, timeout_s=60.0, remeasure_above=None)


def build_dirs(cache: Path) -> list[Path]:
    """Build directories (<cache>/ext/<key>/) of the fixture's extension."""
    ext = cache / "ext"
    if not ext.is_dir():
        return []
    return sorted(d for d in ext.iterdir() if d.is_dir() and any(d.glob(f"{EXT_NAME}*.so")))


@pytest.fixture(scope="module")
def cold_and_warm(cache_dir):
    """Evaluate the C++ candidate twice, the first time with no build of it in the cache."""
    for d in build_dirs(cache_dir):  # an earlier test of this run may have built it: start cold
        shutil.rmtree(d)
    first = evaluate(TASK, CAND, **OPTS)
    second = evaluate(TASK, CAND, **OPTS)
    return first, second


def test_cpp_inline_candidate_is_correct(cold_and_warm):
    first, second = cold_and_warm
    for v in (first, second):
        assert v.status == "correct", f"{v.status}/{v.reasons}: {v.message}"
        assert v.reasons == [] and v.speedup is not None and v.speedup > 0
        assert v.correctness.passed == v.correctness.trials == OPTS["trials"]
        assert v.timing is not None and v.timing.ci95[0] <= v.timing.speedup <= v.timing.ci95[1]


def test_second_evaluation_reuses_the_build(cold_and_warm, cache_dir):
    first, second = cold_and_warm
    assert first.build_s > 1.0, f"the cold build took {first.build_s:.2f} s: was anything compiled?"
    assert second.build_s < first.build_s / 3, (first.build_s, second.build_s)
    dirs = build_dirs(cache_dir)
    assert len(dirs) == 1, f"one key, one build directory: {dirs}"
    assert (dirs[0] / ".built").exists()


def test_stale_torch_lock_does_not_hang(cold_and_warm, cache_dir):
    """torch's FileBaton waits forever on a `lock` file whose owner died; the harness must clear it."""
    first, _ = cold_and_warm
    (d,) = build_dirs(cache_dir)
    stale = d / "lock"
    stale.write_text("")  # what a builder killed between try_acquire() and release() leaves behind
    t0 = time.monotonic()
    v = evaluate(TASK, CAND, **{**OPTS, "build_timeout_s": 120.0})
    waited = time.monotonic() - t0
    assert v.status == "correct", f"{v.status}/{v.reasons}: {v.message[:2000]}"
    assert waited < 60, waited
    assert v.build_s < first.build_s / 3, "a stale lock must not force (or wait for) a rebuild"
    assert not stale.exists(), "the stale lock should be gone after a successful load"


def test_different_source_gets_a_different_build_dir(cold_and_warm, cache_dir, tmp_path):
    """Same extension name, other flags: a different key, so never the cached binary of the first.

    Only the directory is checked (no second cold compile): the build is stopped by a bad flag at once.
    """
    src = CAND.read_text().replace("verbose=False)", "verbose=False, extra_cflags=['-kc-test-no-such-flag'])")
    assert src != CAND.read_text()
    before = set((cache_dir / "ext").iterdir())
    v = evaluate(TASK, src, **OPTS)
    assert (v.status, v.reasons) == ("compile_error", ["build_failed"]), v.message
    assert "kc-test-no-such-flag" in v.message, v.message
    new_dirs = [d for d in set((cache_dir / "ext").iterdir()) - before if d.is_dir()]
    assert len(new_dirs) == 1 and new_dirs[0] not in build_dirs(cache_dir)
