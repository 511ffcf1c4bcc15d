"""`kernelcraft tune` on a CUDA GPU: the fast measurement path, the compiled features, the whole command
into a run database, and the `tuned` recipe judged. Run on a CUDA machine: `pytest -m gpu tests/test_tune_gpu.py`."""
from __future__ import annotations

import json
import math

import pytest

from kernelcraft.evaluate import evaluate
from kernelcraft.search.recipes import rewrite, tunable, tunetemplates
from kernelcraft.search.rundb import RunDB
from kernelcraft.task import load_task

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def gemm():
    task = load_task("tiny/level2/linear_gelu_scale")  # the tiny tier runs on a GPU too: fast to build and time
    return task, tunable.Match.from_json(rewrite.analyze(task.source).tunable[0])


def test_fast_path_measures_checks_and_reads_features(gemm, tmp_path):
    from kernelcraft.tune.measure import TritonBackend

    task, match = gemm
    b = TritonBackend(task, match, rounds=3, workdir=tmp_path)
    cfg = tunable.default_config(match.kernel, match.shape)
    f = b.features(cfg)
    assert f["regs"] > 0 and f["n_instr"] > 100 and f["sass_wgmma"] + f["sass_mma"] > 0, f  # tensor cores used
    m = b.measure(cfg)
    assert m.ok and m.speedup > 0 and m.ms > 0 and m.rounds == 3, m
    b.runner._kc_forward, good = (lambda self, x: good(self, x) * 1.01), b.runner._kc_forward
    b.cand.__class__.forward = b.runner._kc_forward
    bad = b.measure(cfg)
    assert not bad.ok and bad.reason == "incorrect", bad
    b.close()


def test_game_on_the_gpu_masks_and_rewards(gemm, tmp_path):
    from kernelcraft.tune.env import ScheduleGame
    from kernelcraft.tune.measure import TritonBackend

    task, match = gemm
    game = ScheduleGame(lambda k, s: TritonBackend(task, match, rounds=2, workdir=tmp_path), horizon=4)
    s = game.reset(match.kernel, match.shape, budget=3)
    a = game.action_mask().index(True)
    before = s.score
    s, r, done, info = game.step(a)
    assert info["measurement"].ok and math.isclose(r, math.log(info["measurement"].speedup / before), rel_tol=1e-9)
    assert s.measurements == 2


def test_tune_command_end_to_end(tmp_path, monkeypatch, cache_dir):
    from kernelcraft.tune.tuner import TuneOptions, tune

    monkeypatch.setenv("KERNELCRAFT_TUNED", str(tmp_path / "tuned.json"))
    res = tune("gpu/level1/rmsnorm", tmp_path / "run", TuneOptions(agent="random", budget=6, keep=2,
                                                                    store=str(tmp_path / "store"), workers=8))
    assert res.measurements == 6 and res.best_fast_speedup > 0
    db = RunDB(tmp_path / "run")
    try:
        rows = db.rows()
    finally:
        db.close()
    assert len(rows) == 2 and all(r.meta["recipe"] == ["tuned"] and r.status == "correct" for r in rows), \
        [(r.status, r.message[:200]) for r in rows]
    stored = [json.loads(line) for line in (tmp_path / "store" / "measurements.jsonl").read_text().splitlines()]
    assert len(stored) == 6 and all(r["features"] for r in stored)
    if res.run["best_path"]:  # a verified win is recorded for the `tuned` recipe
        assert json.loads((tmp_path / "tuned.json").read_text())["entries"][0]["kind"] == "rownorm"


def test_tuned_recipe_is_correct_on_gpu(cache_dir):
    from kernelcraft.search.policies import Context
    from kernelcraft.search.prompt import DeviceInfo
    from kernelcraft.search.recipes.policy import RecipesPolicy

    task = load_task("gpu/level2/gemm_bias_relu")
    a = rewrite.analyze(task.source)
    pol = RecipesPolicy(analysis=a)
    ctx = Context(task=task, device=DeviceInfo("cuda", "H100", 132, 79.0, "9.0"), round=1, k=1, history=[],
                  failures=[], sample_exemplars=lambda: [], rng=None)
    assert "tuned" in pol.tokens(ctx)
    src = pol.render(frozenset(["tuned"]), ctx)
    v = evaluate(task, src, device="cuda", time_budget_s=1.0)
    assert v.status == "correct", (v.reasons, v.message)
    assert v.speedup > 1.0  # tf32x3 Triton GEMM vs fp32 cuBLAS + two eager epilogue kernels (BENCHMARKS.md)


def test_candidate_source_matches_the_fast_path(gemm):
    task, match = gemm
    cfg = tunable.default_config(match.kernel, match.shape)
    v = evaluate(task, tunetemplates.candidate_source(task.source, match, cfg), device="cuda", time_budget_s=0.5)
    assert v.status == "correct", v.message


@pytest.mark.parametrize("name", ["gemm_bmm", "gemm_einsum_4d", "gemm_transposed_both", "gemm_triu", "gemm_tril",
                                  "gemm_split_k", "gemm_einsum_bt", "scan_cumsum_reverse", "scan_cumsum_exclusive",
                                  "scan_cumsum_masked", "scan_cumprod", "norm_group_affine", "norm_instance_3d",
                                  "norm_layer_long_row", "norm_channels_rms", "norm_channels_softmax"])
def test_the_template_variants_are_correct_on_gpu(name, cache_dir):
    """Each layout of the GEMM template (tests/test_tune_gemm_variants.py), each scan and grouped or long-row
    norm of the row template (tests/test_row_scans.py, tests/test_row_norms.py) at its default configuration and at the smallest blocks, judged like any
    candidate."""
    from pathlib import Path

    task = load_task(Path(__file__).parent / "fixtures" / "tasks" / f"{name}.py")
    (d,) = rewrite.analyze(task.source).tunable
    match = tunable.Match.from_json(d)
    for cfg in (tunable.default_config(match.kernel, match.shape), tunable.all_configs(match.kernel, match.shape)[0]):
        v = evaluate(task, tunetemplates.candidate_source(task.source, match, cfg), device="cuda", time_budget_s=0.3)
        assert v.status == "correct", (name, cfg, v.reasons, v.message)


@pytest.mark.parametrize("name", ["splice_linear_groupnorm", "splice_two_linears"])
def test_the_tuned_gemm_recipe_is_correct_on_gpu(name, cache_dir):
    """GEMM regions spliced into a larger forward (tests/test_gemm_splice.py), alone and replayed as a CUDA
    graph, judged like any candidate."""
    from pathlib import Path

    from kernelcraft.search.policies import Context
    from kernelcraft.search.prompt import DeviceInfo
    from kernelcraft.search.recipes.policy import RecipesPolicy

    task = load_task(Path(__file__).parent / "fixtures" / "tasks" / f"{name}.py")
    pol = RecipesPolicy(analysis=rewrite.analyze(task.source))
    ctx = Context(task=task, device=DeviceInfo("cuda", "H100", 132, 79.0, "9.0"), round=1, k=1, history=[],
                  failures=[], sample_exemplars=lambda: [], rng=None)
    assert "tuned_gemm" in pol.tokens(ctx)
    for recipe in (["tuned_gemm"], ["tuned_gemm", "cudagraph"]):
        v = evaluate(task, pol.render(frozenset(recipe), ctx), device="cuda", time_budget_s=0.3)
        assert v.status == "correct", (name, recipe, v.reasons, v.message)
