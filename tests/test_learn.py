"""The stand-in policy: its program language, its model's updates, the verdict cache, the experiment's
statistics — and a small experiment on the real CPU judge's recorded verdicts that must show GRPO raising the
held-out reward above where GRPO started (slow: the real judge still gives that table).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernelcraft.task import load_task
from kernelcraft.train.ablation import ci95, split
from kernelcraft.train.judgecache import CachedJudge, key_of
from kernelcraft.train.programs import Compiler, enumerate_programs, vocabulary

pytest.importorskip("transformers")

FIXTURES = Path(__file__).parent / "fixtures"


def test_programs_compile_through_the_recipes_machinery():
    c = Compiler("cpu")
    task = load_task("tiny/level1/diag_matmul")
    info = c.info(task)
    assert "rule:diag_matmul" in info.features and "rewrite:diag_matmul" in info.words
    assert "channels_last" not in info.words  # no convolution here
    src, why = c.compile("rewrite:diag_matmul compile:default", task)
    assert why == "" and "class ModelNew(Model)" in src and "torch.compile" in src
    assert "class ModelNew(Model)" in c.compile("eager", task)[0] and "torch.compile" not in c.compile("eager", task)[0]
    for bad, reason in [("", "empty"), ("triton", "unknown"), ("compile:default compile:default", "repeated"),
                        ("eager compile:default", "of its own"),
                        ("channels_last", "does not apply"), ("rewrite:reduce_linear", "does not apply"),
                        ("compile:default compile:max-autotune-no-cudagraphs", "conflicting")]:
        got, msg = c.compile(bad, task)
        assert got is None and reason in msg, (bad, msg)
    assert c.completion("triton", task).startswith("invalid program")
    assert c.completion("rewrite:diag_matmul", task).startswith("```python\n")
    progs = enumerate_programs(c, task)
    assert frozenset({"rewrite:diag_matmul"}) in progs and all(c.parse(" ".join(p), task)[0] for p in progs)
    assert len(progs) == 6 and frozenset({"eager"}) in progs  # eager, rewrite, 2 compile modes, rewrite + each
    # the GPU language has the GPU words; skip removes words from the language
    assert {"cudagraph", "triton", "tuned", "compile:reduce-overhead"} <= set(vocabulary("cuda"))
    assert "compile:max-autotune-no-cudagraphs" not in Compiler("cpu", skip=("compile:max-autotune-no-cudagraphs",)).vocab


def _standin(seed=0):
    from kernelcraft.train.standin import StandIn, Vocab

    vocab = Vocab.build([["op:a"], ["op:b"]], ["w1", "w2", "w3"])
    return StandIn(vocab, seed=seed, max_words=2)


def test_sft_learns_a_feature_to_program_mapping():
    from kernelcraft.train.standin import prompt_words

    pol = _standin()
    pa, pb = prompt_words(["op:a"], []), prompt_words(["op:b"], [("w3", 2.0)])
    assert pb[-4:] == ["<ex>", "w3", "s:+0.75", "<prog>"]
    losses = pol.sft([(pa, "w1"), (pb, "w2 w3")], steps=150, lr=3e-3)
    assert losses[-1] < 0.1 < losses[0]
    assert pol.sample([pa, pb], temperature=0.05) == ["w1", "w2 w3"]


def test_grpo_update_moves_probability_to_the_rewarded_program():
    pol = _standin(seed=1)
    p = ["<task>", "op:a", "<prog>"]
    pol.sft([(p, w) for w in ["w1", "w2", "w3"] * 4], steps=60, lr=3e-3)  # roughly uniform to start
    pol.start_rl()

    def share(n=200):
        return sum(s == "w2" for s in pol.sample([p] * n)) / n

    before = share()
    for _ in range(25):
        progs = pol.sample([p] * 8)
        r = [1.0 if g == "w2" else 0.0 for g in progs]
        mu = sum(r) / len(r)
        pol.grpo_step([p] * 8, progs, [x - mu for x in r], lr=3e-3, beta=0.02)
    assert share() > max(0.8, before + 0.3), before


class _Scripted:
    def __init__(self):
        self.calls = []

    def evaluate_batch(self, items):
        self.calls.append(len(items))
        return [{"status": "correct", "speedup": float(len(it["candidate"]))} for it in items]


def test_cached_judge_judges_each_pair_once_and_persists(tmp_path):
    inner = _Scripted()
    path = tmp_path / "v.jsonl"
    cj = CachedJudge(inner, path)
    items = [{"task": "T", "candidate": "x = 1", "options": {"trials": 2}},
             {"task": "T", "candidate": "x  =  1  # same AST", "options": {"trials": 2}},
             {"task": "T", "candidate": "y = 2", "options": {"trials": 2}}]
    got = cj.evaluate_batch(items)
    assert inner.calls == [2] and got[0] == got[1] and cj.hits == 1 and cj.misses == 2
    assert key_of(items[0]) != key_of({**items[0], "options": {"trials": 3}})
    with open(path, "a") as f:
        f.write('{"key": "torn')  # a kill mid-line
    again = CachedJudge(inner, path)
    assert again.evaluate_batch(items) == got and inner.calls == [2]
    assert len([json.loads(x) for x in path.read_text().splitlines()[:2]]) == 2


def test_split_is_by_task_and_per_level_and_ci():
    tasks = [load_task(n) for n in ["tiny/level1/diag_matmul", "tiny/level1/relu", "tiny/level1/gelu",
                                    "tiny/level2/gemm_bias_relu", "tiny/level2/conv2d_relu_bias"]]
    train, held = split(tasks, 1 / 3, 0)
    assert not {t.name for t in train} & {t.name for t in held}
    assert {t.level for t in held} == {1, 2} and len(train) + len(held) == len(tasks)
    assert split(tasks, 1 / 3, 0) == (train, held)
    m, h = ci95([1.0, 2.0, 3.0])
    assert m == 2.0 and h == pytest.approx(4.303 * 1.0 / 3 ** 0.5)
    assert ci95([5.0]) == (5.0, 0.0)


def test_report_draws_the_held_out_curve(tmp_path):
    from kernelcraft.train.metrics import MetricsLog
    from kernelcraft.train.pipeline import RUN_MARK
    from kernelcraft.train.report import render

    (tmp_path / RUN_MARK).write_text(json.dumps({"kernelcraft": "x", "stage": "learn",
                                                 "config": {"model": {"path": "stand-in"}}}))
    log = MetricsLog(tmp_path, tensorboard=False)
    for step, r in [(0, 0.8), (4, 1.1), (8, 1.3)]:
        log.write("heldout", step, {"reward_mean": r, "geomean_speedup": r, "best_geomean": r + 0.2})
    html = render(tmp_path)
    assert "Held-out reward" in html and "Held-out geomean speedup" in html and "step 8: 1.3" in html


CI_TASKS = ",".join(f"tiny/level1/{n}" for n in ["relu", "gelu", "softmax", "cumsum", "scale_add", "sum_reduction",
                                                  "diag_matmul", "rmsnorm", "layernorm"])


CI_SETTINGS = dict(budget=384, sft_steps=120, st_steps=40, eval_every=3, eval_samples=6)
RECORDED_TABLE = FIXTURES / "verdicts" / "ci_learning_table.jsonl"  # the real CPU judge's verdicts on CI_TASKS


def test_grpo_raises_the_held_out_reward_on_the_recorded_judge(tmp_path):
    """Contrastive RL learns here, CI-sized: nine tiny tasks, the stand-in trained SFT -> self-training -> GRPO on six,
    and the held-out geomean speedup per sample at the end of GRPO above where GRPO started, mean of two seeds. The
    rewards are the real CPU judge's verdicts on every (task, program), recorded once (timing noise frozen as the
    verdict cache freezes it), so the outcome is the trainer's alone: with a table judged afresh the start point moved
    0.80-0.98 between runs. BENCHMARKS.md has the full run: the geomean rose in every seed."""
    import shutil

    from kernelcraft.train.ablation import experiment
    from kernelcraft.train.learn import RunSettings

    cache = tmp_path / "verdicts.jsonl"
    shutil.copy(RECORDED_TABLE, cache)
    summary = experiment(tmp_path / "learn", tasks=CI_TASKS, seeds=2, arms=["grpo"], settings=RunSettings(**CI_SETTINGS),
                         cache=cache, say=lambda m: None)
    assert summary["cache"]["misses"] == 0, (
        "the recorded table lacks programs the trainer asked for: re-record it (see "
        "test_the_real_judge_gives_the_recorded_table)")
    row = summary["arms"]["grpo"]["geomean_speedup"]
    assert row["final"][0] > row["start"][0], (row, summary["arms"]["grpo"]["reward_mean"])
    res = json.loads((tmp_path / "learn" / "grpo" / "seed-0" / "result.json").read_text())
    assert res["curve"][0]["step"] == 0 and len(res["curve"]) >= 3
    assert (tmp_path / "learn" / "ablation.md").read_text().startswith("| arm |")


def table_statuses(path) -> dict[str, str]:
    return {key: v["status"] for key, v in CachedJudge(None, path).verdicts.items()}


@pytest.mark.slow
def test_the_real_judge_gives_the_recorded_table(tmp_path, cache_dir):
    """The learning test's table is what the real CPU judge says today: the experiment's warm-up judges every
    (task, program) of CI_TASKS once (not once per run), with the recorded keys and statuses (speedups are timing
    noise). When the tasks, programs or judge options change, the keys do: copy this run's table over the fixture."""
    from kernelcraft.train.ablation import experiment
    from kernelcraft.train.learn import RunSettings

    summary = experiment(tmp_path / "learn", tasks=CI_TASKS, seeds=1, arms=["grpo"], jobs=2,
                         settings=RunSettings(**CI_SETTINGS), say=lambda m: None)
    assert summary["cache"]["misses"] <= summary["space"]["programs"] + 10  # the table once, not per run
    fresh = tmp_path / "learn" / "verdicts.jsonl"
    assert table_statuses(fresh) == table_statuses(RECORDED_TABLE), f"re-record: cp {fresh} {RECORDED_TABLE}"


def test_learn_cli_usage_errors(tmp_path):
    import subprocess
    import sys

    def kc(*args):
        return subprocess.run([sys.executable, "-m", "kernelcraft.cli", *args], capture_output=True, text=True,
                              timeout=300)

    r = kc("train", "learn", "--out", str(tmp_path / "x"), "--arms", "grpo,bogus")
    assert r.returncode == 2 and "bogus" in r.stderr and "contrastive" in r.stderr
    r = kc("train", "learn", "--out", str(tmp_path / "x"), "--tasks", "tiny/level1/nope_task")
    assert r.returncode == 2 and "nope_task" in r.stderr


def test_arm_rows_give_grpo_gain_per_seed_and_the_table(tmp_path):
    from kernelcraft.train.ablation import arm_rows, curve_table, markdown

    def res(seed, start, end):
        pt = lambda step, r: {"step": step, "reward_mean": r, "geomean_speedup": r, "best_geomean": r,  # noqa: E731
                              "correct_rate": 1.0}
        return {"seed": seed, "samples": 100, "start": pt(0, start), "final": pt(8, end),
                "curve": [pt(0, start), pt(8, end)]}

    results = {"sft": [res(0, 0.8, 0.8), res(1, 0.9, 0.9)], "contrastive": [res(0, 0.7, 1.0), res(1, 0.8, 1.0)]}
    rows = arm_rows(results)
    assert rows["contrastive"]["reward_mean"]["gain"][0] == pytest.approx(0.25)
    assert rows["contrastive"]["reward_mean"]["start_per_seed"] == [0.7, 0.8]
    md = markdown({"settings": {"eval_samples": 8}, "arms": rows, "baselines": {"recipes": {"mean_ci95": [1.2, 0.0]}},
                   "oracle_best_geomean": 1.3})
    assert "| contrastive | 100 | 0.750 ± " in md and "| sft | 100 | — |" in md and "recipes search" in md
    for arm, rs in results.items():
        for r in rs:
            d = tmp_path / arm / f"seed-{r['seed']}"
            d.mkdir(parents=True)
            (d / "result.json").write_text(json.dumps(r))
    assert "| 8 | 1.000 / 1.000 |" in curve_table(tmp_path, ["contrastive"])
