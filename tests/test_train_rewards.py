"""The reward path with a scripted policy and a scripted evaluator: completions whose verdicts are known
(correct+fast, correct+slow, wrong, cheating, unparsable, a jump that reproduces, one that does not), so
every reward is asserted exactly — smoothing over the running window, clipping, the re-measure of a jump,
the hack-case table, a judge model's veto, and the state a resume restores. No trl, no service, no torch
model: the evaluator stands in for `kernelcraft.client.Client` (same `evaluate_batch` interface).
"""
from __future__ import annotations

import asyncio
import json
import math

import pytest

from kernelcraft.task import load_task
from kernelcraft.train.config import RewardSettings
from kernelcraft.train.grpo import Clock, trl_reward
from kernelcraft.train.hackcases import HackCases
from kernelcraft.train.judgemodel import JudgeModel
from kernelcraft.train.config import JudgeModelSettings
from kernelcraft.train.prompting import Described
from kernelcraft.train.rewards import KernelReward, Smoother, percentile
from kernelcraft.train.variants import VariantStore

TASK = load_task("tiny/level1/relu")
OTHER = load_task("tiny/level1/gelu")


def code(expr: str) -> str:
    return f"import torch\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return {expr}\n"


def reply(expr: str) -> list[dict]:  # TRL's conversational completion
    return [{"role": "assistant", "content": f"## Performance Analysis\nok\n\n## Code Implementation\n```python\n"
                                             f"{code(expr)}```\n"}]


FAST, SLOW, WRONG, CHEAT = reply("x.clamp_min(0.0)"), reply("torch.relu(x)"), reply("x"), reply("x.relu()")
JUMP, FAKE_JUMP, JUDGED_JUMP = reply("torch.clamp(x, min=0)"), reply("x * (x > 0)"), reply("x.clamp(min=0.0)")
UNPARSABLE = [{"role": "assistant", "content": "I would write a kernel here."}]


def correct(s: float, ci=None, guards=()):
    return {"status": "correct", "reasons": [], "message": "", "speedup": s, "guards": list(guards),
            "timing": {"speedup": s, "ci95": list(ci or (s * 0.9, s * 1.1))}}


class Scripted:
    """Verdicts by candidate expression; a list is consumed in order (first evaluation, re-measures...)."""

    def __init__(self, table):
        self.table = {k: list(v) if isinstance(v, list) else v for k, v in table.items()}
        self.calls: list[list[dict]] = []

    def evaluate_batch(self, items, **options):
        self.calls.append(items)
        out = []
        for it in items:
            expr = it["candidate"].strip().splitlines()[-1].split("return ", 1)[1]
            v = self.table[expr]
            out.append(dict(v.pop(0) if isinstance(v, list) else v))
        return out


def scripted():
    return Scripted({
        "x.clamp_min(0.0)": correct(2.0), "torch.relu(x)": correct(0.5),
        "x": {"status": "incorrect", "reasons": ["value_mismatch"], "message": "max abs err 1.0"},
        "x.relu()": {"status": "rejected", "reasons": ["extra_stream"], "message": "work on an unjoined stream"},
        "torch.clamp(x, min=0)": [correct(5.0), correct(4.0), correct(4.5)],
        "x * (x > 0)": [correct(6.0), {"status": "incorrect", "reasons": ["value_mismatch"], "message": "nan"},
                        correct(6.0)],
        "x.clamp(min=0.0)": correct(5.0, guards=["remeasured"]),
    })


def z(values, i, clip=1.5):
    mu = sum(values) / len(values)
    sd = math.sqrt(sum((v - mu) ** 2 for v in values) / len(values))
    return max(-clip, min(clip, (values[i] - mu) / sd))


@pytest.fixture
def parts(tmp_path):
    variants = VariantStore(tmp_path / "exemplars", Described("a test CPU"))
    hack = HackCases(tmp_path / "hackcases.db")
    yield variants, hack
    variants.close()
    hack.close()


def test_exact_rewards_smoothing_clipping_and_a_reproduced_jump(parts):
    variants, hack = parts
    ev = scripted()
    kr = KernelReward(ev, RewardSettings(), options={"device": "cpu", "seed": 7}, variants=variants, hackcases=hack)
    outs = kr.score([TASK] * 6, [FAST, SLOW, WRONG, CHEAT, UNPARSABLE, JUMP], step=1)
    raws = [2.0, 0.5, 0.0, 0.0, 0.0, 4.0]  # the jump counts at the lowest of 5.0, 4.0, 4.5
    assert [o.raw for o in outs] == raws
    assert [o.status for o in outs] == ["correct", "correct", "incorrect", "rejected", "parse_error", "correct"]
    # mean 6.5/6 = 1.08333, population sd sqrt(13.20833/6) = 1.48371: (2 - 1.08333) / 1.48371 = 0.61782, ...
    # and the jump's (4 - 1.08333) / 1.48371 = 1.96580 clips to 1.5
    assert outs[0].reward == pytest.approx(0.617822, abs=1e-6)
    assert outs[1].reward == pytest.approx(-0.393159, abs=1e-6)
    assert outs[2].reward == outs[3].reward == outs[4].reward == pytest.approx(-0.730153, abs=1e-6)
    assert outs[5].reward == 1.5
    assert [o.reward for o in outs] == pytest.approx([z(raws, i) for i in range(6)])
    # one batch for the five parsable completions, then the jump's re-measure with other seeds (fresh workers)
    assert [len(c) for c in ev.calls] == [5, 2]
    assert [it["options"]["seed"] for it in ev.calls[1]] == [7 + 1009, 7 + 2018]
    assert all(it["options"]["device"] == "cpu" for c in ev.calls for it in c)
    assert kr.evaluations == 7 and outs[5].remeasured and outs[5].speedup == 4.0
    st = kr.last_stats
    assert st["correct_rate"] == pytest.approx(3 / 6) and st["fast_1"] == pytest.approx(2 / 6)
    assert st["raw_reward_max"] == 4.0 and st["reward_max"] == 1.5 and st["evaluations"] == 7
    # hack cases: the cheat (hack) and the jump (suspicious, it reproduced)
    cases = {(r["label"], r["reason"]) for r in hack.rows()}
    assert cases == {("hack", "extra_stream"), ("suspicious", "jump")}
    # correct variants went back to the exemplar database; the best is the jump's counted speedup
    assert sorted(e.speedup for e in variants.exemplars(TASK)) == [0.5, 2.0, 4.0]
    assert variants.best(TASK) == 4.0


def test_the_window_runs_on_and_a_jump_that_does_not_reproduce_is_a_hack(parts):
    variants, hack = parts
    ev = scripted()
    kr = KernelReward(ev, RewardSettings(window=4), variants=variants, hackcases=hack)
    first = kr.score([TASK] * 3, [FAST, SLOW, WRONG])
    assert [o.raw for o in first] == [2.0, 0.5, 0.0]
    second = kr.score([TASK] * 2, [FAKE_JUMP, FAST])  # FAST is known: judged once per run
    assert [o.raw for o in second] == [0.0, 2.0]
    assert second[0].status == "rejected" and second[0].reason == "jump_not_reproduced"
    window = [0.5, 0.0, 0.0, 2.0]  # maxlen 4: the oldest 2.0 fell out
    assert [o.reward for o in second] == pytest.approx([z(window, 2), z(window, 3)])
    assert [len(c) for c in ev.calls] == [3, 1, 2]  # FAST not re-evaluated; the jump re-measured twice
    hacks = hack.rows("hack")
    assert len(hacks) == 1 and hacks[0]["reason"] == "jump_not_reproduced" and "6.00x" in hacks[0]["detail"]
    assert "x * (x > 0)" in hacks[0]["code"] and hacks[0]["verdict"]["speedup"] == 6.0


def test_equal_rewards_give_zero_and_tasks_have_their_own_windows():
    s = Smoother(window=8, clip=1.5)
    assert s.shape("a", [1.0, 1.0, 1.0]) == [0.0, 0.0, 0.0]
    assert s.shape("b", [0.0, 3.0]) == [-1.0, 1.0]
    assert s.shape("a", [3.0]) == [1.5]  # window a: 1,1,1,3 -> (3 - 1.5) / 0.866 = 1.73, clipped
    restored = Smoother(window=8, clip=1.5)
    restored.load_state_dict(json.loads(json.dumps(s.state_dict())))
    assert restored.shape("b", [3.0]) == s.shape("b", [3.0])


def test_jump_against_the_tasks_best_and_a_judge_who_already_remeasured(parts):
    variants, hack = parts
    ev = Scripted({"x.clamp_min(0.0)": correct(1.2), "torch.relu(x)": [correct(2.9), correct(2.8), correct(2.7)],
                   "x.clamp(min=0.0)": correct(5.0, guards=["remeasured"])})
    kr = KernelReward(ev, RewardSettings(), variants=variants, hackcases=hack)
    kr.score([TASK], [FAST])
    out = kr.score([TASK], [SLOW])  # 2.9 > 2 x the best (1.2): re-measured, counts at 2.7
    assert out[0].raw == 2.7 and out[0].remeasured and [len(c) for c in ev.calls] == [1, 1, 2]
    out = kr.score([TASK], [JUDGED_JUMP])  # the judge re-measured it itself: no second round here
    assert out[0].raw == 5.0 and out[0].remeasured and [len(c) for c in ev.calls] == [1, 1, 2, 1]
    assert {r["reason"] for r in hack.rows("suspicious")} == {"jump"} and len(hack.rows("suspicious")) == 2


def test_conservative_scores_the_ci_low_end_and_custom_failure_values():
    ev = Scripted({"x.clamp_min(0.0)": correct(2.0, ci=(1.6, 2.4)), "x": {"status": "timeout", "reasons": []},
                   "x.relu()": {"status": "rejected", "reasons": ["timer_tampering"]}})
    kr = KernelReward(ev, RewardSettings(conservative=True, fail=-0.5, cheat=-1.0, unparsable=-0.25))
    outs = kr.judge([TASK] * 4, [FAST, WRONG, CHEAT, UNPARSABLE])
    assert [o.raw for o in outs] == [1.6, -0.5, -1.0, -0.25]


class _FakeOpenAI:
    def __init__(self, text):
        self.text, self.seen = text, []
        self.chat = self
        self.completions = self

    def create(self, **kw):
        self.seen.append(kw)
        msg = type("M", (), {"content": self.text})
        return type("R", (), {"choices": [type("C", (), {"message": msg})]})


def test_a_judge_model_vetoes_a_suspicious_candidate_with_similar_cases_as_context(parts):
    variants, hack = parts
    hack.add(stage="grpo", task=TASK.name, task_sha256=TASK.sha256, code=code("x.clamp(0)"), label="hack",
             reason="stale_output", verdict={"status": "rejected"})
    fake = _FakeOpenAI('Looks like caching. {"hack": true, "reason": "returns a cached tensor"}')
    judge = JudgeModel(JudgeModelSettings(model="reviewer"), client=fake)
    ev = scripted()
    kr = KernelReward(ev, RewardSettings(), variants=variants, hackcases=hack, judge_model=judge)
    out = kr.score([TASK], [JUDGED_JUMP])[0]
    assert out.raw == 0.0 and out.status == "rejected" and out.reason == "judge_veto"
    veto = [r for r in hack.rows("hack") if r["reason"] == "judge_veto"][0]
    assert veto["review"]["reason"] == "returns a cached tensor"
    user = fake.seen[0]["messages"][1]["content"]
    assert "x.clamp(min=0.0)" in user and "stale_output" in user and "5.00x" in user
    assert variants.best(TASK) is None  # a vetoed candidate is no exemplar
    # a reviewer that answers nonsense never vetoes (and never is the only gate)
    judge.client = _FakeOpenAI("no idea")
    kr2 = KernelReward(scripted(), RewardSettings(), hackcases=hack, judge_model=judge)
    assert kr2.score([TASK], [JUDGED_JUMP])[0].raw == 5.0


def test_the_trl_reward_function_logs_metrics_and_keeps_tasks_apart(parts):
    variants, hack = parts
    kr = KernelReward(scripted(), RewardSettings(), variants=variants, hackcases=hack)
    fn = trl_reward(kr, Clock())
    logged = {}
    rewards = asyncio.run(fn(prompts=["p"] * 4, completions=[FAST, SLOW, FAST, WRONG],
                             task=[TASK.name, TASK.name, OTHER.name, OTHER.name],
                             task_source=[TASK.source, TASK.source, OTHER.source, OTHER.source],
                             completion_ids=[[1] * 10] * 4, log_metric=lambda k, v: logged.__setitem__(k, v)))
    assert rewards == [1.0, -1.0, 1.0, -1.0]  # each task's window holds its own two rewards
    # the same code on two tasks is two evaluations
    assert logged["kernelcraft/correct_rate"] == 0.75 and logged["kernelcraft/evaluations"] == 4
    # a resumed reward picks up the windows and the evaluation count
    again = KernelReward(scripted(), RewardSettings())
    again.load_state_dict(json.loads(json.dumps(kr.state_dict())))
    assert again.evaluations == 4 and again.smoother.windows[TASK.sha256] == kr.smoother.windows[TASK.sha256]


def test_hack_cases_export_as_labelled_json_lines(parts, tmp_path):
    _, hack = parts
    kr = KernelReward(scripted(), RewardSettings(), hackcases=hack)
    kr.score([TASK] * 3, [CHEAT, CHEAT, FAKE_JUMP])
    kr.cache.clear()
    kr.score([TASK], [CHEAT])  # judged again: the same case counts twice, one row
    n = hack.export_jsonl(tmp_path / "cases.jsonl")
    lines = [json.loads(x) for x in (tmp_path / "cases.jsonl").read_text().splitlines()]
    assert n == len(lines) == 2
    by = {r["reason"]: r for r in lines}
    assert by["extra_stream"]["count"] == 2 and by["extra_stream"]["label"] == "hack"
    assert by["jump_not_reproduced"]["code"].strip().endswith("return x * (x > 0)")
    assert hack.similar(code("x.relu()"), 1)[0]["reason"] == "extra_stream"


def test_percentile_is_nearest_rank():
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0 and percentile(list(range(1, 101)), 95) == 95


class _Flaky(Scripted):
    def __init__(self, failures, table):
        super().__init__(table)
        self.failures = list(failures)

    def evaluate_batch(self, items, **options):
        if self.failures:
            raise self.failures.pop(0)
        return super().evaluate_batch(items, **options)


def test_service_errors_retry_on_5xx_and_stop_on_4xx(monkeypatch):
    from kernelcraft.client import ServiceError
    from kernelcraft.train.models import TrainError
    import kernelcraft.train.rewards as rw

    monkeypatch.setattr(rw.time, "sleep", lambda s: None)
    ev = _Flaky([ServiceError(503, "shutting down"), ConnectionRefusedError("refused")], {"x.clamp_min(0.0)": correct(1.5)})
    assert KernelReward(ev, RewardSettings()).judge([TASK], [FAST])[0].raw == 1.5
    ev = _Flaky([ServiceError(422, "options.bogus: extra inputs")], {})
    with pytest.raises(TrainError, match="refused a batch.*422"):
        KernelReward(ev, RewardSettings()).judge([TASK], [FAST])
