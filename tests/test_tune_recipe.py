"""The tunable templates on a CPU: which references match, the rendered kernels' correctness (Triton's
interpreter), the tuned-configuration store, the `tuned` recipe's plumbing in the offline policy, and
`kernelcraft tune` end to end with the interpreter standing in for the GPU."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kernelcraft.search.policies import Context
from kernelcraft.search.prompt import DeviceInfo
from kernelcraft.search.recipes import rewrite, tunable, tunetemplates
from kernelcraft.search.recipes.policy import RecipesPolicy
from kernelcraft.task import load_task

sys.path.insert(0, str(Path(__file__).resolve().parent))
import template_match  # noqa: E402
import triton_interpreter  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
GPU = DeviceInfo("cuda", "NVIDIA H100", 132, 79.0, "9.0")
CPU = DeviceInfo("cpu", "test cpu", cores=2)



@pytest.mark.parametrize("name, kind, detail", [
    ("tiny/level2/gemm_bias_relu", "gemm", "tl.maximum"),
    ("tiny/level2/linear_swish_scale", "gemm", "tl.sigmoid"),
    ("tiny/level1/matmul_square", "gemm", "out = acc"),
    ("tiny/level1/softmax", "rownorm", "softmax"),
    ("tiny/level1/log_softmax", "rownorm", "log_softmax"),
    ("tiny/level1/layernorm", "rownorm", "layernorm"),
    ("tiny/level1/rmsnorm", "rownorm", "rmsnorm"),
    ("tiny/level1/l2_normalize", "rownorm", "l2norm"),
    ("tiny/level2/conv2d_relu_bias", None, None),
    ("tiny/level1/matrix_vector", None, None),  # N = 1: not a GEMM tile's work
    ("tiny/level2/linear_layernorm", None, None),  # a GEMM then a row op: not one template
])
def test_which_references_match(name, kind, detail):
    ms = template_match.matches(load_task(name).source)
    if kind is None:
        assert ms == []
        return
    (m,) = ms
    assert m.kernel.kind == kind and detail in (m.kernel.epilogue if kind == "gemm" else m.kernel.op)
    if name.endswith("square"):
        assert m.bindings["a"] == "A" and m.bindings["b"] == "B" and not m.kernel.b_trans  # argument names, as written


def test_the_analysis_carries_the_match():
    a = rewrite.analyze(load_task("tiny/level2/gemm_bias_relu").source)
    (d,) = a.tunable
    m = tunable.Match.from_json(d)
    assert m.shape == {"M": 32, "N": 128, "K": 128} and m.bindings["vectors"] == ["self.linear.bias", "self.bias"]
    assert m.kernel.b_trans and m.kernel.vectors == 2


def test_rendered_candidates_are_correct_in_the_interpreter(tmp_path):
    pytest.importorskip("triton")
    names = ["tiny/level2/gemm_bias_relu", "tiny/level2/linear_gelu_scale", "tiny/level1/matmul_square",
             "tiny/level1/softmax", "tiny/level1/layernorm", "tiny/level1/rmsnorm", "tiny/level1/l2_normalize"]
    cases = []
    for name in names:
        t = load_task(name)
        (m,) = template_match.matches(t.source)
        cfgs = tunable.all_configs(m.kernel, m.shape)
        for cfg in (cfgs[0], cfgs[-1]):  # the smallest blocks (loops, masks) and the largest
            p = tmp_path / f"c{len(cases)}.py"
            p.write_text(tunetemplates.candidate_source(t.source, m, cfg))
            cases.append((t.source, str(p)))
    assert triton_interpreter.wrong_candidates(cases, tmp_path, timeout=300) == []


def test_candidate_refuses_an_invalid_configuration():
    t = load_task("tiny/level1/softmax")
    (m,) = template_match.matches(t.source)
    with pytest.raises(tunable.TunableError, match="not valid"):
        tunetemplates.candidate_source(t.source, m, {"BLOCK_N": 300, "num_warps": 4, "num_stages": 1})


def test_store_lookup_exact_nearest_default(tmp_path, monkeypatch):
    monkeypatch.setenv(tunable.TUNED_ENV, str(tmp_path / "tuned.json"))
    k = tunable.Kernel("rownorm", "float32", op="softmax")
    shape = {"rows": 4096, "cols": 16384}
    cfg, origin = tunable.lookup_config(k, shape, paths=[tmp_path / "tuned.json"])
    assert origin == "default" and cfg == tunable.default_config(k, shape)
    mine = {"BLOCK_N": 2048, "num_warps": 8, "num_stages": 2}
    tunable.record_tuned(k, shape, mine, ms=0.4, gpu="H100", source="t")
    tunable.record_tuned(k, shape, mine, ms=0.3, gpu="H100", source="t")  # replaces, never duplicates
    assert len(json.loads((tmp_path / "tuned.json").read_text())["entries"]) == 1
    assert tunable.lookup_config(k, shape) == (mine, "tuned.json: exact (H100, {'rows': 4096, 'cols': 16384})")
    near, origin = tunable.lookup_config(k, {"rows": 2048, "cols": 16384})
    assert near == mine and "nearest" in origin
    small = {"rows": 8, "cols": 1024}  # the stored BLOCK_N is larger than this row: not valid here
    assert tunable.lookup_config(k, small, paths=[tmp_path / "tuned.json"])[1] == "default"


def test_the_builtin_store_is_valid():
    data = json.loads(tunable.BUILTIN_STORE.read_text())
    assert data["entries"]
    for e in data["entries"]:
        kind = e["kind"]
        shape = tunable.check_shape(kind, e["shape"])
        assert set(e["config"]) == set(tunable.knobs(kind)) and e["gpu"].startswith(("NVIDIA H100", "NVIDIA H200")), e
        assert all(v in tunable.knobs(kind)[n] for n, v in e["config"].items()) and shape


def _ctx(task, device):
    return Context(task=task, device=device, round=1, k=4, history=[], failures=[], sample_exemplars=lambda: [],
                   rng=None)


def test_tuned_recipe_plumbing(tmp_path, monkeypatch):
    monkeypatch.setenv(tunable.TUNED_ENV, str(tmp_path / "tuned.json"))
    task = load_task("tiny/level2/linear_gelu_scale")
    a = rewrite.analyze(task.source)
    pol = RecipesPolicy(analysis=a)
    assert "tuned" in pol.tokens(_ctx(task, GPU)) and "tuned" not in pol.tokens(_ctx(task, CPU))
    assert pol.valid(frozenset(["tuned"]), _ctx(task, GPU))
    assert not pol.valid(frozenset(["tuned", "cudagraph"]), _ctx(task, GPU))
    m = tunable.Match.from_json(a.tunable[0])
    mine = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 1, "num_warps": 8, "num_stages": 2}
    tunable.record_tuned(m.kernel, m.shape, mine, ms=0.1, gpu=GPU.name, source=task.name)
    src = pol.render(frozenset(["tuned"]), _ctx(task, GPU))
    assert "_KC_CONFIG = {'BLOCK_M': 64, 'BLOCK_N': 64, 'BLOCK_K': 64, 'GROUP_M': 1, 'num_warps': 8, 'num_stages': 2}" in src
    assert "exact" in src and "class ModelNew(Model)" in src
    from kernelcraft.judge.caller.screen import screen
    assert screen(src, "open").findings == []
    conv = load_task("tiny/level2/conv2d_relu_bias")
    assert "tuned" not in RecipesPolicy(analysis=rewrite.analyze(conv.source)).tokens(_ctx(conv, GPU))


def test_tune_refuses_what_it_cannot_tune(tmp_path):
    from kernelcraft.tune.tuner import TuneError, TuneOptions, tune

    with pytest.raises(TuneError, match="no tunable kernel"):
        tune("tiny/level2/conv2d_relu_bias", tmp_path, TuneOptions())
    with pytest.raises(TuneError, match="CUDA"):
        tune("tiny/level1/softmax", tmp_path, TuneOptions(device="cpu"))
    with pytest.raises(TuneError, match="unknown agent"):
        tune("tiny/level1/softmax", tmp_path, TuneOptions(agent="genetic"))


def test_tune_cli_usage_errors(tmp_path):
    r = subprocess.run([sys.executable, "-m", "kernelcraft.cli", "tune", "tiny/level2/conv2d_relu_bias", "--out",
                        str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr  # one line, as every usage error
    import torch  # without a GPU the device is refused first; with one, the task
    assert ("no tunable kernel" if torch.cuda.is_available() else "no CUDA GPU is visible") in r.stderr, r.stderr
    assert not any(tmp_path.iterdir())  # nothing left behind


def _tune_in_the_interpreter(tmp_path, options: str, *, task: str) -> dict:
    """`kernelcraft.tune.tuner.tune(task, tmp_path/run, <options>)` with the interpreter as the device (STORE:
    tmp_path/store; the tuned store and the cache under tmp_path); its result."""
    proc = triton_interpreter.run(f"""
        import json
        from kernelcraft.tune.tuner import TuneOptions, tune
        STORE = {str(tmp_path / 'store')!r}
        print(json.dumps(tune({task!r}, {str(tmp_path / 'run')!r}, {options}).to_json()))
    """, KERNELCRAFT_TUNED=str(tmp_path / "tuned.json"), KERNELCRAFT_CACHE=str(tmp_path / "cache"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_tune_end_to_end_with_the_interpreter_standing_in(tmp_path):
    """Game, store, cost-model retraining and the judge's run database, with Triton's CPU interpreter as the
    device: the numbers mean nothing, the plumbing is all there."""
    pytest.importorskip("triton")
    res = _tune_in_the_interpreter(tmp_path, 'TuneOptions(device="cpu", agent="ppo", budget=3, keep=2, rounds=2, '
                                   'store=STORE, confirm=0)', task="tiny/level1/rmsnorm")
    assert res["measurements"] == 3 and res["run"]["candidates"] == 2
    from kernelcraft.search.rundb import RunDB

    db = RunDB(tmp_path / "run")
    try:
        rows = db.rows()
    finally:
        db.close()
    assert [r.status for r in rows] == ["correct", "correct"], [r.message for r in rows]
    assert all(r.meta["recipe"] == ["tuned"] and r.meta["agent"] == "ppo" for r in rows)
    stored = (tmp_path / "store" / "measurements.jsonl").read_text().splitlines()
    assert len(stored) == 3 and json.loads(stored[0])["shape"] == "tiny/level1/rmsnorm"


def test_tune_shortlist_without_judging_records_the_fast_path_best(tmp_path):
    """`--agent shortlist --keep 0`: the shortlist measured in order (the default first), nothing judged, the
    best measured configuration recorded and labelled as not judged; with the interpreter as the device."""
    pytest.importorskip("triton")
    res = _tune_in_the_interpreter(tmp_path, 'TuneOptions(device="cpu", agent="shortlist", budget=3, keep=0, '
                                   'rounds=2, store=STORE)', task="tiny/level1/matmul_square")
    assert res["measurements"] == 3 and res["run"] is None and res["agent"] == "shortlist"
    (entry,) = json.loads((tmp_path / "tuned.json").read_text())["entries"]
    m = tunable.Match.from_json(rewrite.analyze(load_task("tiny/level1/matmul_square").source).tunable[0])
    measured = [json.loads(line)["config"] for line in (tmp_path / "store" / "measurements.jsonl").read_text().splitlines()]
    assert measured == tunable.shortlist(m.kernel, m.shape)[:3]
    assert entry["config"] in measured and "not judged" in entry["source"]
    assert not (tmp_path / "run" / "run.db").exists()


def test_the_tuned_recipe_is_among_the_first_three_proposals():
    """At a budget of 3 a GPU task that one template covers gets the two baselines, then its tuned kernel."""
    import random

    from test_recipes import BASELINES_MEASURED

    task = load_task("tiny/level1/matmul_square")
    pol = RecipesPolicy(analysis=rewrite.analyze(task.source))

    def propose(history, k):
        return pol.propose(Context(task=task, device=GPU, round=len(history) + 1, k=k, history=history, failures=[],
                                   sample_exemplars=lambda: [], rng=random.Random(0)))

    assert [p.meta["recipe"] for p in propose([], 3)] == [["compile:default"], ["cudagraph"]]
    proposals = propose(BASELINES_MEASURED, 1)
    assert [p.meta["recipe"] for p in proposals] == [["tuned"]]
    note = proposals[0].meta["note"]  # what `optimize` prints beside a tuned best: which template, and why this config
    assert note.startswith("template: GEMM (float32, tf32x3") and "MxNxK" in note and "configuration BLOCK_K=" in note
