"""The optimisation loop end to end on CPU: recipes find the diag-matmul rewrite (>= 5x) and a verified
conv speedup; best.py is a verified-faster candidate, else the run's labelled fallback (the reference itself, or
a correct candidate no slower than it with confidence); the CLI's --json contract."""
from __future__ import annotations

import json
import fcntl

import pytest
from typer.testing import CliRunner

from kernelcraft.cli import app
from kernelcraft.protocol import Protocol
from kernelcraft.search import fallback
from kernelcraft.search.optimize import Options, RunInUse, optimize
from kernelcraft.search.report import write_report
from kernelcraft.search.policies import Proposal
from kernelcraft.search.rundb import RunDB
from kernelcraft.task import load_task

from conftest import FIXTURES, run_story

DIAG = FIXTURES / "tasks" / "diag_matmul_1024.py"
DIAG_TALL = FIXTURES / "tasks" / "diag_matmul_tall.py"  # ~8x: where a test needs a confirmed win, not a speed
NO_COMPILE = {"skip": ["compile"]}  # torch.compile on 2 CPU cores costs minutes; covered on the GPU


@pytest.fixture(scope="module")
def diag_run(tmp_path_factory, cache_dir):
    out = tmp_path_factory.mktemp("diag-run")
    events = []
    res = optimize(DIAG_TALL, out, Options(device="cpu", budget=4, confirm=1, policy_options=NO_COMPILE),
                   on_event=lambda kind, **d: events.append((kind, d)))
    return out, res, events


def test_recipes_find_the_diag_rewrite(diag_run):
    out, res, events = diag_run
    assert res.status == "improved", f"{res}\n{run_story(out)}"
    # ~8x (5-12x): the candidate's speed differs between its processes on the 2-core host, and the confirmed
    # interval spans them (interleaved processes, the CPU default); at N = M = 1024 it read 3.4-5.5x, too near 3
    assert res.best_speedup >= 3.0, res
    assert res.confirmed and res.best_ci95[0] > 1.0
    best = (out / "best.py").read_text()
    assert "unsqueeze" in best and "class ModelNew(Model)" in best
    db = RunDB(out)
    row = db.get(res.best_candidate)
    assert row.source == best and row.status == "correct" and row.faster_than(res.bar)  # byte-identical to what was verified
    assert db.confirmations()[row.id]["status"] == "correct"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["best_speedup"] == res.best_speedup and summary["status"] == "improved"
    kinds = [k for k, _ in events]
    assert kinds[0] == "start" and kinds[-1] == "done" and "verdict" in kinds and "confirm" in kinds
    assert res.stopped == "exhausted"  # without compile, the rewrite is the only recipe on this task


def test_rerun_is_a_noop_and_json_is_the_last_line(diag_run, cache_dir):
    out, res, _ = diag_run
    r = CliRunner().invoke(app, ["optimize", str(DIAG_TALL), "--device", "cpu", "--budget", "4", "--confirm", "1",
                                 "--skip", "compile", "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    rec = json.loads(r.stdout.strip().splitlines()[-1])
    for key in ("task", "status", "best_path", "best_speedup", "candidates", "run_dir"):
        assert key in rec
    assert rec["candidates"] == res.candidates and rec["best_speedup"] == res.best_speedup
    assert rec["best_path"].endswith("best.py") and rec["status"] == "improved"


def test_verified_speedup_on_a_tiny_conv_task(tmp_path, cache_dir):
    """The channels-last rewrite is found, correct and timed. Whether it is faster depends on the host: on the
    2-core CI host it is ~1.0-1.1x at ~0.5 ms calls under a ~0.2 ms round trip (its within-run interval's low end
    read 0.98-0.99 in 5 runs in a row one afternoon, above 1 in the runs around them), which a re-run does not
    reproduce to +-10% (the reproducibility interval, judge/speed/timing.py), so the run may honestly end without a
    verified win; when it claims one, it is a confirmed drop-in. (A speed claim is a benchmark's, not this test's.)"""
    res = optimize("tiny/level3/small_cnn", tmp_path, Options(device="cpu", budget=4, confirm=1, protocol=Protocol(time_budget_s=2.0),
                                                              policy_options=NO_COMPILE))
    rows = [r for r in RunDB(tmp_path).rows() if r.correct and "channels_last" in r.source]
    assert rows, [(r.status, r.source[:200]) for r in RunDB(tmp_path).rows()]
    best_cl = max(rows, key=lambda r: r.speedup)
    t = best_cl.verdict["timing"]
    assert 0 < t["within_ci95"][0] <= t["within_ci95"][1] and best_cl.speedup > 0.5, t  # timed, not slower by far
    if res.status != "improved":  # its fallback, labelled: never passed off as a verified win
        assert res.best_path is None and res.best_kind in ("fallback_candidate", "reference")
        assert (tmp_path / "best.py").read_text().startswith("# kernelcraft optimize fallback")
        return
    assert res.best_speedup > 1.0 and res.best_ci95[0] > 1.0 and res.confirmed
    assert any("channels_last" in t for t in res.best_techniques), res.best_techniques
    task = tmp_path / "small_cnn_task.py"
    task.write_text(load_task("tiny/level3/small_cnn").source)  # the tiny tier's source, as the run judged it
    assert_drop_in(task, tmp_path / "best.py")


class _Scripted:
    """A policy that proposes given sources once (a stand-in for a model)."""
    name = "scripted"

    def __init__(self, sources):
        self.sources = list(sources)

    def propose(self, ctx):
        out, self.sources = [Proposal(s, meta={"note": "scripted"}) for s in self.sources[:ctx.k]], self.sources[ctx.k:]
        return out


SAME = ("import torch\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n"
        "    def forward(self, A, B):\n        return torch.diag(A) @ B\n")
SLOWER = SAME.replace("return torch.diag(A) @ B", "torch.diag(A) @ B\n        return torch.diag(A) @ B")
BROKEN = SAME.replace("return torch.diag(A) @ B", "raise RuntimeError('boom')")


def test_without_a_verified_win_best_py_is_the_reference_labelled(tmp_path, cache_dir):
    """Candidates correct but no faster (the same code, a slower one) and a broken one: no verified win, so best.py
    is the run's fallback, the reference itself, labelled as such in its header, the summary, the CLI and the
    report; it loads the reference's weights, and `kernelcraft eval` judges it correct."""
    res = optimize(DIAG, tmp_path, Options(device="cpu", budget=3, confirm=1),
                   policy=_Scripted([SAME, SLOWER, BROKEN]))
    assert res.status == "no_improvement", res
    assert res.best_path is None and res.best_speedup is None and res.best_candidate is None  # no verified win
    assert (res.correct, res.failed, res.candidates) == (2, 1, 3)
    rows = RunDB(tmp_path).rows()
    assert [r.status for r in rows] == ["correct", "correct", "runtime_error"]
    assert "boom" in rows[2].message
    control = RunDB(tmp_path).get_meta("null_control")
    assert control["status"] == "correct" and res.null_control_speedup == control["speedup"]
    # the fallback: the reference, unless a candidate's 95% CI lies wholly at or above 1 and was confirmed so
    same = RunDB(tmp_path).rows()[:2]
    assert res.best_kind == res.fallback["kind"], res
    if res.best_kind == "reference":
        assert res.fallback["speedup"] == 1.0 and res.fallback["ci95"] is None and res.fallback["candidate"] is None
    else:  # SAME is the reference's code: on a noisy host its confirmed CI may lie at or above 1 by chance
        conf = RunDB(tmp_path).confirmations()[res.fallback["candidate"]]
        assert conf["status"] == "correct" and conf["ci_low"] >= 1.0 and res.fallback["confirmed"], conf
        assert res.fallback["candidate"] in [r.id for r in same]
    best = (tmp_path / "best.py").read_text()
    assert best.startswith("# kernelcraft optimize fallback: no candidate was verified faster than the reference.")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["best_kind"] == res.best_kind and summary["fallback"]["path"] == str(tmp_path / "best.py")
    html = write_report(tmp_path).read_text()
    assert "<b>Fallback</b>: no candidate was verified faster" in html and "id='fallback-card'" in html
    # the reference itself as a standalone drop-in: judged correct by `kernelcraft eval`
    ref = tmp_path / "ref_best.py"
    ref.write_text(fallback.program(fallback.Fallback("reference", 1.0), load_task(DIAG), status=res.status,
                                    bar=res.bar, mode="open"))
    assert "get_inputs" not in ref.read_text() and "class ModelNew(Model):" in ref.read_text()
    r = CliRunner().invoke(app, ["eval", str(DIAG), str(ref), "--device", "cpu", "--json", "--trials", "2",
                                 "--time-budget", "0.3", "--processes", "1"])
    assert r.exit_code == 0, r.output
    v = json.loads(r.stdout.strip().splitlines()[-1])
    assert v["status"] == "correct", v
    # the CLI's closing lines say what best.py holds (the stored run, re-run: a no-op that prints it again)
    r = CliRunner().invoke(app, ["optimize", str(DIAG), "--device", "cpu", "--budget", "3", "--confirm", "1",
                                 "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    said = " ".join(r.stdout.split())
    assert "no candidate was verified faster than the reference: best.py is " in said, said
    assert f"wrote {tmp_path / 'best.py'} (a fallback, labelled so in its header)" in said
    assert "fallback: what best.py holds when none is verified faster" in said


def test_the_fallback_rule(tmp_path, monkeypatch):
    """Without a verified win, best.py holds the correct drop-in candidate with the highest 95% CI lower end at or
    above 1 (its confirmation's, where the run confirms), else the reference. A candidate whose CI reaches below 1
    is not known to be no slower than the reference: the reference wins. A verified win is unchanged."""
    from kernelcraft.search import optimize as opt

    a, b, c = SAME.replace("@ B", "@ B + 0"), SAME.replace("@ B", "@ B * 1"), SAME.replace("@ B", "@ B - 0")
    search = {a: (1.20, [1.05, 1.35]), b: (1.30, [0.98, 1.7]), c: (1.10, [1.08, 1.12])}
    confirm = {a: (1.15, [1.02, 1.30]), b: (1.3, [1.0, 1.6]), c: (1.05, [0.97, 1.13])}
    calls = []

    def fake(self, source, seed, budget):
        calls.append((source, seed))
        sp, ci = (confirm if seed == self.protocol.seed + 1000 else search)[source]
        return {"status": "correct", "speedup": sp, "timing": {"speedup": sp, "ci95": ci}}

    monkeypatch.setattr(opt._Run, "_evaluate", fake)
    # --min-speedup 1.5: none verified faster. a's and c's search CIs lie at or above 1 (b's reaches below it):
    # c (lower end 1.08) is confirmed first, reads [0.97, 1.13], does not qualify; a is confirmed and holds
    res = optimize(DIAG, tmp_path / "a", Options(device="cpu", budget=3, k=3, confirm=2, null_control=False,
                                                  min_speedup=1.5), policy=_Scripted([a, b, c]))
    assert res.status == "no_improvement" and res.best_path is None and res.best_kind == "fallback_candidate", res
    ids = {r.source: r.id for r in RunDB(tmp_path / "a").rows()}
    assert [s for s, seed in calls if seed != calls[0][1]] == [c, a]
    assert res.fallback == {"kind": "fallback_candidate", "path": str(tmp_path / "a" / "best.py"), "speedup": 1.15,
                            "ci95": [1.02, 1.30], "candidate": ids[a], "confirmed": True,
                            "techniques": res.fallback["techniques"], "floor": 1.0}
    best = (tmp_path / "a" / "best.py").read_text()
    assert best.startswith("# kernelcraft optimize fallback") and f"candidate #{ids[a]}" in best
    assert best.endswith(a)  # the candidate unchanged below its header
    # --confirm 0: the search's numbers; c's lower end (1.08) is the highest at or above 1
    res = optimize(DIAG, tmp_path / "b", Options(device="cpu", budget=3, k=3, confirm=0, null_control=False,
                                                  min_speedup=1.5), policy=_Scripted([a, b, c]))
    assert res.best_kind == "fallback_candidate" and res.fallback["speedup"] == 1.10 and not res.fallback["confirmed"]
    # only CIs that reach below 1: the reference wins
    res = optimize(DIAG, tmp_path / "c", Options(device="cpu", budget=1, k=1, confirm=1, null_control=False,
                                                  min_speedup=1.5), policy=_Scripted([b]))
    assert res.best_kind == "reference" and res.fallback["speedup"] == 1.0
    assert "class ModelNew(Model):" in (tmp_path / "c" / "best.py").read_text()
    # a verified win: best.py is the candidate, byte for byte, and no fallback is recorded
    res = optimize(DIAG, tmp_path / "d", Options(device="cpu", budget=1, k=1, confirm=1, null_control=False),
                   policy=_Scripted([a]))
    assert res.status == "improved" and res.best_kind == "candidate" and res.fallback is None
    assert (tmp_path / "d" / "best.py").read_text() == a and res.best_path == str(tmp_path / "d" / "best.py")


def test_null_control_raises_the_bar_only_for_a_real_bias(tmp_path, monkeypatch):
    """A harness that favours candidates (the reference timed against itself comes out 1.3x, CI above 1)
    must not turn a 1.2x candidate into a win; a noisy control (CI around 1) changes nothing."""
    from kernelcraft.search import optimize as opt

    def fake(self, source, seed, budget):
        if "null control" in source:
            return {"status": "correct", "speedup": self.fake_control[0],
                    "timing": {"speedup": self.fake_control[0], "ci95": self.fake_control[1]}}
        return {"status": "correct", "speedup": 1.2, "timing": {"speedup": 1.2, "ci95": [1.15, 1.25]}}

    monkeypatch.setattr(opt._Run, "_evaluate", fake)
    for control, status in (((1.3, [1.25, 1.35]), "no_improvement"), ((1.3, [0.9, 2.0]), "improved")):
        monkeypatch.setattr(opt._Run, "fake_control", control, raising=False)
        out = tmp_path / str(control[1][0])
        res = optimize("tiny/level1/diag_matmul", out, Options(device="cpu", budget=1, confirm=1),
                       policy=_Scripted([SAME.replace("@ B", "@ B + 0")]))
        assert res.status == status, res
        assert res.bar == (1.3 if status == "no_improvement" else 1.0)


def test_run_dir_guards(tmp_path, cache_dir):
    (tmp_path / "run.lock").touch()
    with open(tmp_path / "run.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(RunInUse):
            optimize("tiny/level1/diag_matmul", tmp_path, Options(device="cpu", budget=1), policy=_Scripted([]))
    optimize("tiny/level1/diag_matmul", tmp_path, Options(device="cpu", budget=1), policy=_Scripted([]))
    with pytest.raises(ValueError, match="another task"):
        optimize("tiny/level1/relu", tmp_path, Options(device="cpu", budget=1), policy=_Scripted([]))
    r = CliRunner().invoke(app, ["optimize", "tiny/level1/relu", "--device", "cpu", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "holds a run of" in r.output
    r = CliRunner().invoke(app, ["optimize", "tiny/level1/nope", "--device", "cpu", "--out", str(tmp_path / "x")])
    assert r.exit_code == 2
    r = CliRunner().invoke(app, ["optimize", "tiny/level1/relu", "--policy", "bogus", "--out", str(tmp_path / "y")])
    assert r.exit_code == 2 and "unknown policy" in " ".join(r.output.split())


# -- best.py is a drop-in for a user's trained model ---------------------------------------------------------------
SLOW_LINEAR = '''import torch
import torch.nn as nn


class Model(nn.Module):
    """relu(Linear(x)), computed sixteen times over (a slow reference with weights)."""

    def __init__(self, d_in, d_out):
        super().__init__()
        self.fc = nn.Linear(d_in, d_out)

    def forward(self, x):
        out = None
        for _ in range(16):
            out = torch.relu(self.fc(x))
        return out


D_IN = 128
D_OUT = 96


def get_inputs():
    return [torch.randn(1024, D_IN)]  # calls of ~2 ms: the drop-in's ~6x holds its lower bound above 1 on a loaded 2-core host (8 rounds read 3x, CI 1.05)


def get_init_inputs():
    return [D_IN, D_OUT]
'''
FAST_RENAMED = '''import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.linear = nn.Linear(d_in, d_out)

    def forward(self, x):
        return torch.relu(self.linear(x))
'''
FAST_DROP_IN = '''import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.fc = nn.Linear(d_in, d_out)

    def forward(self, x):
        torch.relu(self.fc(x))  # twice: slower than the renamed one, still far faster than the reference
        return torch.relu(self.fc(x))
'''


def _load_module(path, name):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def assert_drop_in(task_path, best_path) -> None:
    """A trained reference's state_dict() loads (strict) into best.py's ModelNew, which then gives its outputs."""
    import torch

    task = _load_module(task_path, "kc_test_task")
    best = _load_module(best_path, "kc_test_best")
    torch.manual_seed(1)
    ref = task.Model(*task.get_init_inputs())
    opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    for _ in range(3):  # "trained": weights (and any running statistics) far from their initial values
        opt.zero_grad()
        out = ref(*task.get_inputs())
        (out if isinstance(out, torch.Tensor) else out[0]).square().mean().backward()
        opt.step()
    ref.eval()
    new = best.ModelNew(*task.get_init_inputs())
    new.load_state_dict(ref.state_dict())
    new.eval()
    inputs = task.get_inputs()
    with torch.no_grad():
        want, got = ref(*inputs), new(*inputs)
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-5), (got - want).abs().max()


def test_best_py_loads_the_references_state_dict(tmp_path, cache_dir):
    task = tmp_path / "slow_linear.py"
    task.write_text(SLOW_LINEAR)
    out = tmp_path / "run"
    res = optimize(task, out, Options(device="cpu", budget=2, confirm=1, null_control=False),
                   policy=_Scripted([FAST_RENAMED, FAST_DROP_IN]))
    db = RunDB(out)
    renamed = next(r for r in db.rows() if r.source == FAST_RENAMED)
    assert not renamed.correct and renamed.verdict["reasons"] == ["weights_mismatch"]  # no drop-in: not correct
    assert renamed.verdict["weights"]["matched"] is False
    assert res.status == "improved", f"{res}\n{run_story(out)}"
    assert (out / "best.py").read_text() == FAST_DROP_IN
    assert db.get(res.best_candidate).verdict["weights"]["checked"]
    assert_drop_in(task, out / "best.py")


def test_a_verdict_measured_before_is_taken_only_under_the_same_rules(tmp_path, monkeypatch):
    """`known_verdicts` (a bench's baselines of the same texts): a first evaluation under this run's protocol, on
    this device kind, is taken as it is (marked `shared`) instead of measured again; one under other rules (another
    timing budget), a timeout or one from another device is measured. Confirmations are always measured."""
    import hashlib

    from kernelcraft.protocol import Protocol
    from kernelcraft.search import optimize as opt

    calls = []

    def fake(self, source, seed, budget):
        calls.append((source, seed, budget))
        return {"status": "correct", "speedup": 1.1, "timing": {"speedup": 1.1, "ci95": [1.05, 1.15]}}

    monkeypatch.setattr(opt._Run, "_evaluate", fake)
    a, b = SAME.replace("@ B", "@ B + 0"), SAME.replace("@ B", "@ B * 1")
    c, d = SAME.replace("@ B", "@ B - 0"), SAME.replace("@ B", "@ B / 1")
    proto = Protocol(trials=2, time_budget_s=0.3)
    rules = proto.resolved("cpu").key()
    sha = lambda s: hashlib.sha256(s.encode()).hexdigest()  # noqa: E731
    measured = {"status": "correct", "speedup": 1.5, "device": "cpu", "env": {"gpu": None},
                "timing": {"speedup": 1.5, "ci95": [1.4, 1.6]}, "protocol": {**rules, "timeout_s": 600.0}}
    known = {sha(a): measured, sha(b): {**measured, "protocol": {**rules, "time_budget_s": 2.0}},
             sha(c): {**measured, "status": "timeout"},
             sha(d): {**measured, "device": "cuda:0 NVIDIA H100 80GB HBM3", "env": {"gpu": "NVIDIA H100 80GB HBM3"}}}
    res = optimize(DIAG, tmp_path, Options(device="cpu", budget=4, k=4, confirm=1, null_control=False,
                                           protocol=proto, known_verdicts=known), policy=_Scripted([a, b, c, d]))
    first = [x for x in calls if x[1] == rules["seed"] and x[2] == rules["time_budget_s"]]
    assert sorted(x[0] for x in first) == sorted([b, c, d])  # only a was taken
    rows = RunDB(tmp_path).rows()
    assert rows[0].speedup == 1.5 and "shared" in json.loads(RunDB(tmp_path).conn.execute(
        "SELECT verdict FROM candidates WHERE id = ?", (rows[0].id,)).fetchone()[0])
    assert len(calls) > len(first)  # the leader's confirmation was measured, not taken
    assert "known_verdicts" not in RunDB(tmp_path).get_meta("options")
    assert res.candidates == 4


def test_a_leader_whose_interval_lies_below_a_confirmed_one_is_not_confirmed(tmp_path, monkeypatch):
    """Confirmations sized to what the statistics need: with `confirm=2`, the second leader is re-measured only
    when its own interval reaches the first leader's confirmed number (it could still be the best)."""
    from kernelcraft.search import optimize as opt

    a, b, c = SAME.replace("@ B", "@ B + 0"), SAME.replace("@ B", "@ B * 1"), SAME.replace("@ B", "@ B - 0")
    search = {a: (3.0, [2.8, 3.2]), b: (2.0, [1.9, 2.1]), c: (2.9, [2.5, 3.3])}
    calls = []

    def fake(self, source, seed, budget):
        calls.append((source, seed))
        sp, ci = search[source]
        return {"status": "correct", "speedup": sp, "timing": {"speedup": sp, "ci95": ci}}

    monkeypatch.setattr(opt._Run, "_evaluate", fake)
    res = optimize(DIAG, tmp_path / "overlap", Options(device="cpu", budget=3, k=3, confirm=2, null_control=False),
                   policy=_Scripted([a, b, c]))
    confirmed = [src for src, seed in calls if seed != calls[0][1]]
    assert confirmed == [a, c]  # b's interval (1.9-2.1) lies below a's confirmed 3.0: not re-measured
    assert res.confirmed and res.best_speedup == 3.0

    calls.clear()
    res = optimize(DIAG, tmp_path / "apart", Options(device="cpu", budget=2, k=2, confirm=2, null_control=False),
                   policy=_Scripted([a, b]))
    assert [src for src, seed in calls if seed != calls[0][1]] == [a]
    assert res.confirmed and res.best_speedup == 3.0


def test_the_best_confirmed_leader_is_picked_by_both_its_measurements(tmp_path, monkeypatch):
    """Two leaders of one program's worth (a launch-bound reference moves the numbers run to run): a read 5.8 then
    4.1 on confirmation, b 3.9 then 5.6. Picking by the confirmations alone takes b, whose second reading is the
    high one of two noisy re-measurements; both measurements together pick a (4.9 against 4.7), reported at its
    confirmation."""
    from kernelcraft.search import optimize as opt

    a, b = SAME.replace("@ B", "@ B + 0"), SAME.replace("@ B", "@ B * 1")
    search = {a: (5.8, [5.1, 6.2]), b: (3.9, [3.1, 4.6])}
    confirm = {a: (4.1, [3.9, 4.3]), b: (5.6, [5.4, 6.4])}

    def fake(self, source, seed, budget):
        sp, ci = (confirm if seed == self.protocol.seed + 1000 else search)[source]
        return {"status": "correct", "speedup": sp, "timing": {"speedup": sp, "ci95": ci}}

    monkeypatch.setattr(opt._Run, "_evaluate", fake)
    res = optimize(DIAG, tmp_path, Options(device="cpu", budget=2, k=2, confirm=2, null_control=False),
                   policy=_Scripted([a, b]))
    confs = RunDB(tmp_path).confirmations()
    assert len(confs) == 2  # b's interval reaches a's confirmed 4.1: both re-measured
    assert res.confirmed and (res.best_speedup, res.best_ci95) == (4.1, [3.9, 4.3])
    assert (tmp_path / "best.py").read_text() == a
