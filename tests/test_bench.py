"""`kernelcraft bench`: sources load (pairs JSONL, task directories, candidates in `<stem>.py` and KernelBench run
layouts), honest / wrong / cheating candidates give the right counts and fast_p, an interrupted bench resumes
without evaluating anything twice, baselines come from the cache on a rerun, bad inputs are one-line errors, and
`--task-jobs` optimizes tasks concurrently (logged in completion order; a failure or Ctrl-C stops the others).
CPU, tiny tasks, short timing budgets; the GPU test at the end runs the CUDA-graph baseline."""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kernelcraft.protocol import Protocol
from kernelcraft.bench.run import BenchError, BenchOptions, metrics, resolve, run
from kernelcraft.cli import app

FIX = Path(__file__).parent / "fixtures"
TASKS, LEGIT, FAULTS, HACKS = FIX / "tasks", FIX / "legit", FIX / "faults", FIX / "hacks"
FAST = ["--device", "cpu", "--trials", "2", "--eval-time", "0.3", "--remeasure-above", "0", "--jobs", "1"]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

# correct but far slower than `alpha * a + b`: 200 extra copies
SLOW = '''import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, alpha):
        super().__init__()
        self.alpha = alpha

    def forward(self, a, b):
        x = self.alpha * a + b
        for _ in range(200):
            x = x.clone()
        return x
'''


def _text(p: Path) -> str:
    return p.read_text()


def write_pairs(path: Path) -> Path:
    """6 scorable rows (honest fast, honest slow, wrong, two cheats, no candidate) and 2 broken ones."""
    rows = [
        {"level_id": 1, "task_id": 1, "ref_code": _text(TASKS / "diag_matmul_tall.py"),  # ~8x: far from the thresholds
         "custom_code": _text(LEGIT / "diag_matmul_rowscale.py"), "score_default": 9.9, "note": "kept"},
        {"level_id": 1, "task_id": 2, "ref_code": _text(TASKS / "tiny_elementwise.py"), "custom_code": SLOW},
        {"level_id": 1, "task_id": 3, "ref_code": _text(TASKS / "tiny_elementwise.py"),
         "custom_code": _text(FAULTS / "value_mismatch.py")},
        '{"level_id": 1, "task_id": 9, "ref_code": ',  # a torn line: not JSON
        {"level_id": 2, "task_id": 4, "ref_code": _text(TASKS / "guard_slow.py"),
         "custom_code": _text(HACKS / "timer_patch_at_import.py")},  # rejected by the screen
        {"level_id": 2, "task_id": 5, "ref_code": _text(TASKS / "guard_slow.py"),
         "custom_code": _text(HACKS / "lazy_tensor_subclass.py")},  # caught at run time
        {"level_id": 2, "task_id": 6, "ref_code": _text(TASKS / "guard_slow.py"), "custom_code": None},
        {"level_id": 3, "task_id": 8, "custom_code": "class ModelNew: pass\n"},  # no ref_code
    ]
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def kc(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="120", NO_COLOR="1")
    return subprocess.run([sys.executable, "-m", "kernelcraft.cli", *args], check=False, capture_output=True, text=True,
                          timeout=timeout, env=env)


def last_json(stdout: str) -> dict:
    return json.loads([ln for ln in stdout.splitlines() if ln.strip()][-1])


def read_lines(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()] if path.exists() else []


def opts(**kw) -> BenchOptions:
    knobs = {k: kw.pop(k) for k in list(kw) if k in Protocol.model_fields}
    protocol = Protocol.make(dict(trials=2, time_budget_s=0.3, remeasure_above=None), **knobs)
    return BenchOptions(**{"device": "cpu", "baselines": "eager", "jobs": 1, "protocol": protocol, **kw})


# ---- metrics --------------------------------------------------------------------------------------------

def test_metrics_definitions():
    rows = [{"correct": True, "speedup": 3.0, "speedup_vs_compile": 1.5},
            {"correct": True, "speedup": 0.5, "speedup_vs_compile": 0.25},
            {"correct": True, "speedup": 1.0, "speedup_vs_compile": 1.0},
            {"correct": False, "speedup": None, "speedup_vs_compile": None}]
    m = metrics(rows, vs_compile=True)
    assert (m["tasks"], m["correct"], m["correct_rate"]) == (4, 3, 0.75)
    # fast_p: correct AND speedup > p (strictly), over all tasks
    assert m["fast_p"] == {"0": 0.75, "0.5": 0.5, "0.8": 0.5, "1": 0.25, "1.5": 0.25, "2": 0.25}
    assert m["fast_p_vs_compile"] == {"0": 0.75, "0.5": 0.5, "0.8": 0.5, "1": 0.25, "1.5": 0.0, "2": 0.0}
    assert math.isclose(m["geomean_speedup"], (3.0 * 0.5 * 1.0 * 1.0) ** 0.25)  # the failure counts as 1.0
    assert math.isclose(m["geomean_speedup_correct"], (3.0 * 0.5 * 1.0) ** (1 / 3))
    assert m["median_speedup"] == 1.0 and m["median_speedup_correct"] == 1.0
    assert math.isclose(m["geomean_speedup_vs_compile"], (1.5 * 0.25) ** 0.25)
    empty = metrics([])
    assert empty["tasks"] == 0 and empty["fast_p"]["1"] is None and empty["geomean_speedup"] is None
    assert empty["geomean_speedup_ci95"] is None and empty["fast_p_range"]["1"] is None


def test_failures_the_reference_could_not_judge_are_counted_and_shown(monkeypatch):
    """A failure with `unverifiable_reference` (an ill-conditioned or random reference: the fixed tolerance judged) is
    still a failure in every rate, but counted apart, and the tables say "+N?" so a leaderboard reader can tell it
    from wrong code."""
    from rich.console import Console

    from kernelcraft.cli import bench as cli_bench

    rows = [{"correct": True, "speedup": 2.0, "reasons": []},
            {"correct": False, "speedup": None, "reasons": ["value_mismatch", "unverifiable_reference"]},
            {"correct": False, "speedup": None, "reasons": ["value_mismatch"]}]
    from kernelcraft.bench import metrics as bench_metrics
    from kernelcraft.judge.correctness import bounds

    assert bench_metrics.UNVERIFIABLE == bounds.UNVERIFIABLE  # one code (verdict.py), read by the bench and the judge
    m = metrics(rows)
    assert (m["tasks"], m["correct"], m["unverifiable"]) == (3, 1, 1)
    assert m["fast_p"]["0"] == 1 / 3 and math.isclose(m["geomean_speedup"], 2.0 ** (1 / 3))  # still a failure
    console = Console(record=True, width=200)
    monkeypatch.setattr(cli_bench, "out", console)
    cli_bench._bench_table({"baselines_only": True, "source": "s", "tasks": 3, "device": "cpu",
                            "baselines": {"summary": {"eager": {"tasks": 3}, "inductor": m}}})
    text = console.export_text()
    assert "1/3 (+1?)" in text and "unverifiable_reference" in text, text
    assert metrics(rows[:1] + rows[2:])["unverifiable"] == 0


def test_metrics_intervals_from_the_per_task_cis():
    """The leaderboard row's error bars: fast_p as the range the per-task CIs allow, the geomean's CI from each
    task's log-speedup spread (failures: 1.0, no spread)."""
    rows = [{"correct": True, "speedup": 3.0, "speedup_vs_compile": 1.5, "ci95": [2.5, 3.6]},
            {"correct": True, "speedup": 1.05, "speedup_vs_compile": 0.525, "ci95": [0.9, 1.2]},  # straddles 1
            {"correct": True, "speedup": 0.5, "speedup_vs_compile": 0.25, "ci95": None},  # no interval: its point
            {"correct": False, "speedup": None, "speedup_vs_compile": None, "ci95": None}]
    m = metrics(rows, vs_compile=True)
    assert m["fast_p"]["1"] == 0.5 and m["fast_p_range"]["1"] == [0.25, 0.5]
    assert m["fast_p_range"]["0"] == [0.75, 0.75] and m["fast_p_range"]["2"] == [0.25, 0.25]
    lo, hi = m["geomean_speedup_ci95"]
    assert lo < m["geomean_speedup"] < hi
    sig = [(math.log(3.6) - math.log(2.5)) / 3.919928, (math.log(1.2) - math.log(0.9)) / 3.919928]
    half = 1.959964 * math.sqrt(sum(x * x for x in sig)) / 4
    assert math.isclose(math.log(hi / m["geomean_speedup"]), half, rel_tol=1e-6)
    assert m["fast_p_vs_compile_range"]["1"] == [0.25, 0.25]  # 1.5 [1.25-1.8]; 0.525 [0.45-0.6]
    exact = metrics([{"correct": True, "speedup": 2.0, "ci95": [2.0, 2.0]}])
    assert exact["geomean_speedup_ci95"] == [2.0, 2.0]


# ---- sources --------------------------------------------------------------------------------------------

def test_builtin_sources_and_tier_default():
    from kernelcraft.task import builtin_names

    assert [i.name for i in resolve("tiny/level1", device="cpu").items] == builtin_names("tiny", 1)
    assert [i.name for i in resolve("level2", device="cpu").items] == builtin_names("tiny", 2)  # tiny on a CPU
    assert [i.name for i in resolve("level2", device="cuda").items] == builtin_names("gpu", 2)
    assert len(resolve("gpu", device="cpu").items) == len(builtin_names("gpu"))
    one = resolve("tiny/level1/relu", device="cpu")
    assert [(i.name, i.level) for i in one.items] == [("tiny/level1/relu", 1)]
    for bad in ("tiny/level9", "nope", "gpu/level1/no_such_task"):
        with pytest.raises(BenchError):
            resolve(bad, device="cpu")
    with pytest.raises(BenchError, match="not found"):
        resolve("no/such/dir", device="cpu")


def _kernelbench_dir(root: Path) -> Path:
    (root / "level1").mkdir(parents=True)
    (root / "level2").mkdir()
    shutil.copy(TASKS / "tiny_elementwise.py", root / "level1" / "1_tiny_elementwise.py")
    shutil.copy(TASKS / "tiny_diag_matmul.py", root / "level1" / "2_tiny_diag_matmul.py")
    shutil.copy(TASKS / "guard_slow.py", root / "level2" / "1_guard_slow.py")
    (root / "level2" / "2_broken.py").write_text("import torch\n\nclass Model:\n    pass\n")  # no get_inputs
    (root / "level1" / "__init__.py").write_text("")
    return root


def test_pairs_source_rows(tmp_path):
    src = resolve(str(write_pairs(tmp_path / "pairs.jsonl")), device="cpu")
    assert src.kind == "pairs"
    names = [i.name for i in src.items]
    assert names == ["level1/task1", "level1/task2", "level1/task3", "line4", "level2/task4", "level2/task5",
                     "level2/task6", "level3/task8"]
    by = {i.name: i for i in src.items}
    assert "not valid JSON" in by["line4"].error and "no ref_code" in by["level3/task8"].error
    assert by["level2/task6"].missing and "null" in by["level2/task6"].missing
    assert by["level1/task1"].extra == {"level_id": 1, "task_id": 1, "score_default": 9.9, "note": "kept"}
    assert (by["level2/task5"].level, by["level2/task5"].task_id) == (2, 5)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"ref_code": "x = 1\n", "custom_code": "y"}) + "\n"
                   + json.dumps({"ref_code": _text(TASKS / "tiny_elementwise.py"), "custom_code": 3}) + "\n"
                   + json.dumps({"ref_code": _text(TASKS / "tiny_elementwise.py"), "custom_code": "z",
                                 "level_id": "one"}) + "\n" + "[1, 2]\n")
    errs = [i.error for i in resolve(str(bad), device="cpu").items]
    assert "not a KernelBench task" in errs[0] and "custom_code must be" in errs[1]
    assert "level_id must be an integer" in errs[2] and "expected a JSON object" in errs[3]


def test_pairs_without_a_kernel_are_no_candidate(tmp_path, cache_dir):
    """CUDA-L1 writes "None" for a task without a kernel: that, "null", empty and whitespace-only custom_code are
    `no_candidate` (nothing is judged), not `compile_error`."""
    ref = _text(TASKS / "tiny_elementwise.py")
    codes = ["None", "null", "", "  \n\t", " None\n", "NULL", None]
    pairs = tmp_path / "nokernel.jsonl"
    pairs.write_text("".join(json.dumps({"task_id": i, "ref_code": ref, "custom_code": c}) + "\n"
                             for i, c in enumerate(codes)))
    src = resolve(str(pairs), device="cpu")
    assert [i.candidate for i in src.items] == [None] * len(codes)
    assert all(i.missing and "no candidate" in i.missing for i in src.items)
    assert "'None'" in src.items[0].missing and "empty" in src.items[2].missing and "null" in src.items[6].missing
    summary = run(src, tmp_path / "out", opts(baselines="eager"))
    recs = read_lines(tmp_path / "out" / "verdicts.jsonl")
    assert sorted(r["status"] for r in recs) == ["no_candidate"]  # the rows share one task: one record
    assert summary["correct"] == 0


def test_directory_and_candidate_layouts(tmp_path):
    kb = _kernelbench_dir(tmp_path / "KernelBench")
    src = resolve(str(kb), device="cpu")
    assert [(i.name, i.level, i.task_id) for i in src.items] == [
        ("level1/1_tiny_elementwise", 1, 1), ("level1/2_tiny_diag_matmul", 1, 2), ("level2/1_guard_slow", 2, 1),
        ("level2/2_broken", 2, 2)]
    assert src.items[3].error and "missing get_inputs" in src.items[3].error
    assert not src.has_candidates  # no candidates: the bench would optimize each task

    stems = tmp_path / "stems"
    (stems / "level1").mkdir(parents=True)
    shutil.copy(LEGIT / "torch_elementwise.py", stems / "1_tiny_elementwise.py")  # <stem>.py
    shutil.copy(LEGIT / "diag_matmul_rowscale.py", stems / "level1" / "2_tiny_diag_matmul.py")  # mirrored path
    shutil.copy(LEGIT / "matmul_mm.py", stems / "unrelated.py")
    src = resolve(str(kb), device="cpu", candidates=stems)
    by = {i.name: i for i in src.items}
    assert by["level1/1_tiny_elementwise"].candidate == _text(LEGIT / "torch_elementwise.py")
    assert by["level1/2_tiny_diag_matmul"].candidate == _text(LEGIT / "diag_matmul_rowscale.py")
    assert by["level2/1_guard_slow"].candidate is None and "no candidate" in by["level2/1_guard_slow"].missing
    assert any("unrelated.py" in n for n in src.notes)

    builtin = resolve("tiny/level1/relu", device="cpu", candidates=stems)  # built-in names match by stem too
    assert builtin.items[0].missing


def test_kernelbench_run_layout_bench(tmp_path, cache_dir):
    kb = _kernelbench_dir(tmp_path / "KernelBench")
    runs = tmp_path / "runs" / "my_run"
    runs.mkdir(parents=True)
    shutil.copy(LEGIT / "torch_elementwise.py", runs / "level_1_problem_1_sample_0_kernel.py")
    shutil.copy(FAULTS / "value_mismatch.py", runs / "level_1_problem_1_sample_1_kernel.py")
    shutil.copy(LEGIT / "diag_matmul_rowscale.py", runs / "level_1_problem_2_sample_0_kernel.py")
    shutil.copy(LEGIT / "torch_elementwise.py", runs / "level_3_problem_7_sample_0_kernel.py")
    src = resolve(str(kb), device="cpu", candidates=runs)
    assert [i.name for i in src.items] == ["level1/1_tiny_elementwise@sample0", "level1/1_tiny_elementwise@sample1",
                                           "level1/2_tiny_diag_matmul", "level2/1_guard_slow", "level2/2_broken"]
    assert any("level_3_problem_7" in n for n in src.notes)
    s = run(src, tmp_path / "out", opts())
    st = {r["item"]: (r["status"], r["reasons"]) for r in s["items"]}
    assert st == {"level1/1_tiny_elementwise@sample0": ("correct", []),
                  "level1/1_tiny_elementwise@sample1": ("incorrect", ["value_mismatch"]),
                  "level1/2_tiny_diag_matmul": ("correct", []),
                  "level2/1_guard_slow": ("no_candidate", ["no_candidate"])}
    assert (s["tasks"], s["correct"], s["input_errors"]) == (4, 2, 1)
    assert s["by_level"]["1"]["tasks"] == 3 and s["by_level"]["2"]["correct"] == 0


# ---- the bench end to end -------------------------------------------------------------------------------

def test_pairs_bench_counts_and_fast_p(tmp_path, cache_dir):
    pairs = write_pairs(tmp_path / "pairs.jsonl")
    out = tmp_path / "out"
    r = kc("bench", str(pairs), *FAST, "--baselines", "eager,cudagraph", "--baselines-only",
           "--out", str(tmp_path / "unused"), "--json")  # (cudagraph is skipped on a CPU, not an error)
    assert r.returncode == 0, r.stderr[-3000:]
    assert last_json(r.stdout)["baselines"]["skipped"] == {"cudagraph": "needs a CUDA device (CUDA-graph replay)"}
    r = kc("bench", str(pairs), *FAST, "--baselines", "eager", "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    s = last_json(r.stdout)
    assert {"tasks", "correct", "fast_p", "geomean_speedup", "median_speedup", "by_level"} <= set(s)
    assert "items" not in s  # per-task rows live in OUT/summary.json
    assert (s["tasks"], s["correct"], s["input_errors"], s["items_total"]) == (6, 2, 2, 8)
    assert s["statuses"] == {"correct": 2, "incorrect": 2, "rejected": 1, "no_candidate": 1}
    assert {"value_mismatch", "timer_tampering", "lazy_output", "no_candidate"} <= set(s["reasons"])
    assert s["by_level"]["1"]["tasks"] == 3 and s["by_level"]["1"]["correct"] == 2
    assert s["by_level"]["2"]["tasks"] == 3 and s["by_level"]["2"]["correct"] == 0
    assert s["fast_p_vs_compile"] is None  # no compile baseline asked for

    lines = read_lines(out / "verdicts.jsonl")
    assert len(lines) == 8 and len({ln["key"] for ln in lines}) == 8
    by = {ln["item"]: ln for ln in lines}
    fast, slow = by["level1/task1"]["speedup"], by["level1/task2"]["speedup"]
    assert fast > 1.5 and slow < 0.5  # ~2.4x and ~0.2x on the 2-core host; 2 was too close to the fast one under load
    # fast_p counts correct items above each threshold over all six scored tasks (the two correct ones measured above)
    assert s["fast_p"] == pytest.approx({k: sum(x > p for x in (fast, slow)) / 6
                                         for k, p in zip(("0", "0.5", "0.8", "1", "1.5", "2"), (0, .5, .8, 1, 1.5, 2))})
    assert s["geomean_speedup"] == pytest.approx((fast * slow) ** (1 / 6))
    assert s["geomean_speedup_correct"] == pytest.approx((fast * slow) ** 0.5)
    assert by["level1/task1"]["extra"] == {"level_id": 1, "task_id": 1, "score_default": 9.9, "note": "kept"}
    assert by["level2/task4"]["status"] == "rejected" and by["level2/task5"]["reasons"] == ["lazy_output"]
    assert by["line4"]["status"] == "input_error" and by["level3/task8"]["status"] == "input_error"
    for ln in lines:
        if ln["status"] != "correct":
            assert ln["speedup"] is None

    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["items"]) == 6
    html = (out / "report.html").read_text()
    assert html.startswith("<!DOCTYPE html>") and "<script" not in html and html.count("<svg") == 2
    assert "id='fastp'" in html and "level2/task5" in html and "not valid JSON" in html
    if CHROMIUM:
        dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                              f"--user-data-dir={tmp_path / 'chrome'}", "--dump-dom", (out / "report.html").as_uri()],
                             check=False, capture_output=True, text=True, timeout=120)
        assert dom.returncode == 0, dom.stderr[-2000:]
        assert 'id="fastp"' in dom.stdout and 'id="items"' in dom.stdout and "<svg" in dom.stdout

    r = kc("bench", str(pairs), *FAST, "--baselines", "eager", "--out", str(out))  # human output; all resumed
    assert r.returncode == 0, r.stderr[-3000:]
    assert "f1" in r.stdout and "report.html" in r.stdout and "level 1" not in r.stdout


def test_interrupt_then_resume(tmp_path, cache_dir):
    rows = [(TASKS / "tiny_elementwise.py", LEGIT / "torch_elementwise.py"),
            (TASKS / "tiny_elementwise.py", FAULTS / "value_mismatch.py"),
            (TASKS / "tiny_diag_matmul.py", LEGIT / "diag_matmul_rowscale.py"),
            (TASKS / "tiny_elementwise.py", None)]
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"task_id": i, "ref_code": _text(t), "custom_code": _text(c) if c else SLOW})
                             + "\n" for i, (t, c) in enumerate(rows)))
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "kernelcraft.cli", "bench", str(pairs), *FAST, "--baselines", "eager", "--out",
           str(out), "--json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not read_lines(out / "verdicts.jsonl"):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)  # Ctrl-C after the first verdict landed
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert "re-run" in err and "Traceback" not in err
    before = read_lines(out / "verdicts.jsonl")
    assert 1 <= len(before) < 4, before

    again = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    s = last_json(again.stdout)
    after = read_lines(out / "verdicts.jsonl")
    keys = [ln["key"] for ln in after]
    assert len(keys) == 4 and len(set(keys)) == 4  # nothing evaluated twice, nothing lost
    assert after[: len(before)] == before
    assert (s["resumed"], s["evaluated"]) == (len(before), 4 - len(before))
    assert (s["tasks"], s["correct"]) == (4, 3)


def test_baseline_cache_and_vs_compile(tmp_path, cache_dir):
    tasks, cands = tmp_path / "tasks", tmp_path / "cands"
    tasks.mkdir()
    cands.mkdir()
    shutil.copy(TASKS / "tiny_elementwise.py", tasks / "tiny_elementwise.py")
    shutil.copy(LEGIT / "torch_elementwise.py", cands / "tiny_elementwise.py")
    def src():
        return resolve(str(tasks), device="cpu", candidates=cands)

    first = run(src(), tmp_path / "a", opts(baselines="eager,inductor", baseline_cache=False))
    b = first["baselines"]
    assert (b["measured_now"], b["cache_hits"], b["from_run"]) == (1, 0, 0)
    row = first["items"][0]
    ind = row["baselines"]["inductor"]
    assert ind["status"] == "correct", ind
    assert row["best_compile"] == "inductor"
    assert row["speedup_vs_compile"] == pytest.approx(row["speedup"] / ind["speedup"])
    assert first["fast_p_vs_compile"] is not None and first["by_level"]["unknown"]["tasks"] == 1
    spent = first["time_use"]  # where the seconds went: the candidate's evaluation and the baseline's
    assert spent["evaluations"] == 2 and set(spent["by_kind"]) == {"candidate", "inductor"}
    assert spent["device_s"] > 0 and spent["tasks"] == 1

    other_out = run(src(), tmp_path / "b", opts(baselines="eager,inductor"))  # the shared cache
    assert (other_out["baselines"]["measured_now"], other_out["baselines"]["cache_hits"]) == (0, 1)
    assert other_out["items"][0]["baselines"]["inductor"] == ind
    assert set(other_out["time_use"]["by_kind"]) == {"candidate"}  # the cached baseline was measured elsewhere
    same_out = run(src(), tmp_path / "a", opts(baselines="eager,inductor"))  # this run's own record
    assert (same_out["baselines"]["measured_now"], same_out["baselines"]["from_run"]) == (0, 1)
    assert (same_out["resumed"], same_out["evaluated"]) == (1, 0)
    assert same_out["time_use"] == spent  # a resumed directory reports its total, not this invocation's nothing


def test_optimize_when_no_candidates(tmp_path, cache_dir):
    src = resolve("tiny/level1/diag_matmul", device="cpu")
    events = []
    s = run(src, tmp_path / "out", opts(budget=2, optimize_options={"confirm": 0, "null_control": False}),
            on_event=lambda kind, **d: events.append(kind))
    assert s["candidates"] == "optimize" and s["tasks"] == 1
    rec = read_lines(tmp_path / "out" / "verdicts.jsonl")[0]
    assert rec["optimize"]["candidates"] == 2 and Path(rec["optimize"]["run_dir"]).is_dir()
    if rec["optimize"]["status"] == "improved":  # best.py judged afresh, like any candidate
        assert rec["status"] == "correct" and rec["candidate_path"].endswith("best.py") and "fallback" not in rec
    else:  # scored at the run's fallback: correct, not faster, never a failure
        assert rec["status"] == "correct" and rec["fallback"]["kind"] in ("reference", "fallback_candidate")
        assert s["outcomes"]["not_faster"] == 1 and s["correct"] == 1
    assert "optimize_start" in events and events[-1] == "done"
    assert s["time_use"]["by_kind"]["search"]["evaluations"] >= 1  # the run's own evaluations, from its run.db


def test_a_task_whose_search_verified_nothing_faster_is_scored_at_the_reference(tmp_path, monkeypatch, cache_dir):
    """A search whose one candidate is correct but slower: its best.py is the reference (the fallback), and the
    bench scores the task as correct, not faster, at 1.0x (not judged: the reference is 1.0x by definition)."""
    from kernelcraft.bench import run as bench
    from kernelcraft.search.policies import Proposal

    slower = ("import torch\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n    def forward(self, A, B):\n"
              "        torch.diag(A) @ B\n        return torch.diag(A) @ B\n")

    class Once:
        name, sources = "scripted", [slower]

        def propose(self, ctx):
            out, self.sources = [Proposal(x) for x in self.sources], []
            return out

    monkeypatch.setattr(bench, "make_policy", lambda spec, **kw: Once())
    events = []
    s = run(resolve("tiny/level1/diag_matmul", device="cpu"), tmp_path / "out",
            opts(budget=1, optimize_options={"confirm": 0, "null_control": False}),
            on_event=lambda kind, **d: events.append((kind, d)))
    rec = read_lines(tmp_path / "out" / "verdicts.jsonl")[0]
    assert rec["optimize"]["status"] == "no_improvement" and rec["optimize"]["best_kind"] == "reference", rec
    assert (rec["status"], rec["speedup"], rec["timing"], rec["reasons"]) == ("correct", 1.0, None, [])
    assert rec["fallback"]["kind"] == "reference" and rec["candidate_path"].endswith("best.py")
    assert "scored at its fallback, the reference itself" in rec["message"]
    assert s["outcomes"]["not_faster"] == 1 and s["correct"] == 1 and s["fast_p"]["0"] == 1.0
    assert s["fast_p"]["1"] == 0.0 and s["geomean_speedup"] == 1.0 and s["fallbacks"]["reference"] == 1
    assert s["items"][0]["fallback"] == "reference"
    assert s["time_use"]["by_kind"].get("candidate") is None  # the reference was not judged: no evaluation
    result = [d for k, d in events if k == "result"][0]
    assert result["outcome"] == "not_faster" and result["fallback"] == "reference"


def test_the_bench_fallback_takes_a_baseline_only_if_it_holds_when_judged_afresh():
    """`bench.fallback.record`: a baseline the run did not evaluate itself, its 95% CI at or above the floor, is
    judged afresh and stands if that verdict qualifies too; else the reference (1.0x, not judged); strict mode
    takes no reference (None: the caller records `no_candidate`)."""
    from kernelcraft.bench import fallback
    from kernelcraft.bench.sources import Item
    from kernelcraft.search.optimize import Result
    from kernelcraft.task import load_task

    it = Item(name="tiny/level1/relu", task=load_task("tiny/level1/relu"))
    res = Result(task=it.name, status="no_improvement", best_path=None, best_speedup=None, candidates=2,
                 run_dir="/nonexistent", best_kind="reference",
                 fallback={"kind": "reference", "path": "/nonexistent/best.py", "speedup": 1.0, "ci95": None,
                           "candidate": None, "confirmed": False, "techniques": [], "floor": 1.0})

    def verdict(sp, lo, hi, status="correct", baseline=None, sha=None):
        return {"status": status, "speedup": sp if status == "correct" else None, "timing": {"ci95": [lo, hi]},
                "reasons": [], "baseline": baseline, "candidate_sha256": sha}

    known = {"s-ind": verdict(1.4, 1.3, 1.5, baseline="inductor", sha="s-ind"),
             "s-max": verdict(1.2, 0.9, 1.5, baseline="inductor-max-autotune", sha="s-max")}  # reaches below 1
    judged = []

    def judge(fresh):
        def f(source, baseline=None):
            judged.append(baseline)
            return fresh
        return f

    kw = dict(dev="cpu", mode="open", env={})
    rec = fallback.record(it, res, set(), known, judge(verdict(1.35, 1.2, 1.5)), "why", **kw)
    assert judged == ["inductor"] and rec["fallback"]["kind"] == "baseline" and rec["speedup"] == 1.35
    assert rec["fallback"]["baseline"] == "inductor" and "scored at the inductor baseline" in rec["message"]
    judged.clear()
    rec = fallback.record(it, res, set(), known, judge(verdict(1.1, 0.95, 1.3)), "why", **kw)  # did not hold
    assert judged == ["inductor"] and rec["fallback"]["kind"] == "reference" and rec["speedup"] == 1.0
    assert rec["fallback"]["tried"][0]["baseline"] == "inductor" and rec["status"] == "correct"
    judged.clear()
    rec = fallback.record(it, res, {"s-ind"}, known, judge(verdict(1.35, 1.2, 1.5)), "why", **kw)  # the run's own
    assert judged == [] and rec["fallback"]["kind"] == "reference"
    assert fallback.record(it, res, {"s-ind"}, known, judge(None), "why", **{**kw, "mode": "strict"}) is None


def test_cli_time_limit_reaches_the_optimize_settings(tmp_path, cache_dir):
    out = tmp_path / "out"
    base = ["bench", "tiny/level1/diag_matmul", "--device", "cpu", "--baselines", "eager", "--baselines-only",
            "--budget", "3", "--out", str(out)]
    r = kc(*base, "--time-limit", "7")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((out / "bench.json").read_text())["optimize"] == {"policy": "recipes", "budget": 3,
                                                                      "time_limit_s": 7.0}
    assert kc(*base, "--time-limit", "0").returncode == 2  # below the minimum: a usage error


def test_bad_inputs_are_one_line_errors(tmp_path, cache_dir):
    pairs = write_pairs(tmp_path / "pairs.jsonl")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text("this is not json\nnor this\n")
    cases = [
        (["bench", str(tmp_path / "nope.jsonl")], "not found"),
        (["bench", "tiny/level9"], "unknown SOURCE"),
        (["bench", str(pairs), "--baselines", "eager,bogus"], "unknown baseline"),
        (["bench", str(pairs), "--candidates", str(tmp_path)], "does not apply"),
        (["bench", str(empty)], "no pairs"),
        (["bench", str(garbage)], "not a pairs file"),
        (["bench", str(pairs), "--device", "tpu"], "unknown device"),
        (["bench", "tiny/level1", "--candidates", str(tmp_path / "missing")], "not a directory"),
    ]
    runner = CliRunner()
    for args, needle in cases:
        r = runner.invoke(app, args + ["--out", str(tmp_path / "o"), "--device", "cpu"] if "--device" not in args
                          else args + ["--out", str(tmp_path / "o")])
        assert r.exit_code == 2, (args, r.output)
        err = (r.stderr if hasattr(r, "stderr") else r.output).strip()
        assert needle in err and len(err.splitlines()) == 1 and "Traceback" not in err, (args, err)
    # the same --out with another measurement protocol is refused (no evaluations: eager only, baselines only)
    base = ["bench", str(pairs), "--device", "cpu", "--baselines", "eager", "--baselines-only", "--out",
            str(tmp_path / "p")]
    assert runner.invoke(app, base + ["--trials", "2"]).exit_code == 0
    r = runner.invoke(app, base + ["--trials", "3"])
    assert r.exit_code == 2 and "other settings" in r.stderr


# ---- optimizing several tasks at once (--task-jobs) ------------------------------------------------------

QUICK_OPT = {"confirm": 0, "null_control": False, "policy_options": {"skip": "compile"}}


def _own_rules_only(run_dir: Path, task) -> list[str]:
    """The rewrite tokens a run proposed, checked against its own task's rewrites (not another task's)."""
    from kernelcraft.search.recipes import rewrite
    from kernelcraft.search.rundb import RunDB

    db = RunDB(run_dir)
    try:
        toks = [t for r in db.rows() for t in (r.meta or {}).get("recipe", []) if t.startswith("rewrite:")]
    finally:
        db.close()
    own = {f"rewrite:{r}" for r in rewrite.analyze(task.source).rules}
    assert toks and set(toks) <= own, (run_dir.name, toks, own)
    return toks


def test_task_jobs_optimizes_every_task_and_resumes_with_another_setting(tmp_path, cache_dir):
    from kernelcraft.task import load_task

    tasks = tmp_path / "tasks"
    tasks.mkdir()
    for name in ("tiny/level1/diag_matmul", "tiny/level2/matmul_sum"):  # each has its own big-win rewrite
        (tasks / f"{name.rsplit('/', 1)[1]}.py").write_text(load_task(name).source)
    out, events = tmp_path / "out", []
    s = run(resolve(str(tasks), device="cpu"), out, opts(budget=1, task_jobs=2, optimize_options=QUICK_OPT),
            on_event=lambda kind, **d: events.append((kind, d)))
    recs = read_lines(out / "verdicts.jsonl")
    assert sorted(r["item"] for r in recs) == ["diag_matmul", "matmul_sum"] and s["evaluated"] == 2
    assert s["task_jobs"] == 2 and s["tasks"] == 2 and events[0][1]["task_jobs"] == 2
    assert {r["status"] for r in recs} <= {"correct", "no_candidate", "incorrect", "rejected"}
    for r in recs:  # one shared recipes policy: each run proposed its own task's rewrite
        assert r["optimize"]["candidates"] == 1
        _own_rules_only(Path(r["optimize"]["run_dir"]), load_task(tasks / f"{r['item']}.py"))
    # the same bench one task at a time: the same keys (nothing left to do), and --task-jobs is not pinned
    again = run(resolve(str(tasks), device="cpu"), out, opts(budget=1, task_jobs=1, optimize_options=QUICK_OPT))
    assert (again["resumed"], again["evaluated"], again["task_jobs"]) == (2, 0, 1)
    assert read_lines(out / "verdicts.jsonl") == recs
    assert "task_jobs" not in json.loads((out / "bench.json").read_text())["optimize"]


def _fake_optimize(calls: list, delay: dict, fail: str | None = None):
    """A stand-in for bench._optimize_item: records overlapping calls and the thread each runs in."""
    import threading

    from kernelcraft.search.optimize import Cancelled

    lock, active = threading.Lock(), [0]

    def fake(it, out, o, dev, eval_opts, pool, env, emit, policy, stop, known=None):
        with lock:
            active[0] += 1
            calls.append(("start", it.name, active[0], threading.current_thread() is threading.main_thread()))
        try:
            if it.name == fail:
                time.sleep(delay.get(it.name, 0.0))
                raise BenchError(f"optimize {it.name}: boom")
            if delay.get(it.name) == "until_stopped":
                assert stop.wait(20), "never stopped"
                raise Cancelled(it.name)
            time.sleep(delay.get(it.name, 0.3))
            return {"status": "no_candidate", "reasons": ["no_candidate"], "speedup": None, "message": "fake",
                    "timing": None}
        finally:
            with lock:
                active[0] -= 1
                calls.append(("end", it.name, active[0], stop.is_set()))
    return fake


def test_task_jobs_runs_optimizations_concurrently_and_logs_in_completion_order(tmp_path, monkeypatch, cache_dir):
    import threading

    import kernelcraft.bench.run as bench

    src = lambda: resolve("tiny/level1", device="cpu")  # noqa: E731
    names = [it.name for it in src().items[:3]]
    for jobs, expect_peak in ((2, 2), (1, 1)):
        calls, events = [], []
        # the first task is the slowest: with 2 at a time the second and third finish (and are logged) first
        monkeypatch.setattr(bench, "_optimize_item", _fake_optimize(calls, {names[0]: 1.2, names[1]: 0.2,
                                                                            names[2]: 0.2}))
        out = tmp_path / f"out{jobs}"
        s = run(src(), out, opts(limit=3, task_jobs=jobs),
                on_event=lambda kind, **d: events.append((kind, d, threading.current_thread() is threading.main_thread())))
        starts = [c for c in calls if c[0] == "start"]
        assert max(c[2] for c in starts) == expect_peak, calls
        assert [c[1] for c in starts] == names if jobs == 1 else sorted(c[1] for c in starts) == sorted(names)
        logged = [r["item"] for r in read_lines(out / "verdicts.jsonl")]
        ends = [c[1] for c in calls if c[0] == "end"]
        assert logged == ends  # completion order
        assert (logged == names) == (jobs == 1), logged
        assert all(c[3] == (jobs == 1) for c in starts)  # worker threads only when concurrent
        assert all(main for kind, _, main in events if kind == "result")  # results come from the caller's thread
        assert s["evaluated"] == 3 and s["task_jobs"] == jobs


def test_task_jobs_a_failed_task_stops_the_others_and_propagates(tmp_path, monkeypatch, cache_dir):
    import kernelcraft.bench.run as bench

    names = [it.name for it in resolve("tiny/level1", device="cpu").items[:4]]
    a, b, c, d = names
    calls = []
    # a fails after c finished; b and d run until they are told to stop; c's record is kept
    monkeypatch.setattr(bench, "_optimize_item", _fake_optimize(calls, {a: 1.0, b: "until_stopped", c: 0.1,
                                                                        d: "until_stopped"}, fail=a))
    t0 = time.monotonic()
    with pytest.raises(BenchError, match="boom"):
        run(resolve("tiny/level1", device="cpu"), tmp_path / "out", opts(limit=4, task_jobs=3))
    assert time.monotonic() - t0 < 15
    ends = {c[1]: c for c in calls if c[0] == "end"}
    assert ends.keys() == {a, b, c, d}  # every started run had ended when the error reached the caller
    assert ends[b][3] and ends[d][3]  # ... because it was told to stop
    assert [r["item"] for r in read_lines(tmp_path / "out" / "verdicts.jsonl")] == [c]


INTERRUPT_SCRIPT = r"""
import sys, threading
import kernelcraft.bench.run as bench
from kernelcraft.search.optimize import Cancelled

lock = threading.Lock()

def say(*words):
    with lock:  # one write per line: a line is never split by another writer of this pipe
        sys.stdout.write(" ".join(words) + "\n")
        sys.stdout.flush()

def fake(it, out, o, dev, eval_opts, pool, env, emit, policy, stop, known=None):
    say("started", it.name)
    say("stopped" if stop.wait(30) else "never-stopped", it.name)
    raise Cancelled(it.name)

bench._optimize_item = fake
from kernelcraft.cli import main
sys.argv = ["kernelcraft", "bench", "tiny/level1", "--limit", "3", "--task-jobs", "2", "--device", "cpu",
            "--baselines", "eager", "--out", sys.argv[1]]
main()
"""


def test_task_jobs_ctrl_c_stops_the_running_optimizations(tmp_path, cache_dir):
    script = tmp_path / "interrupt.py"
    script.write_text(INTERRUPT_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "out")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, COLUMNS="120", NO_COLOR="1"))
    started = []
    while len(started) < 2:
        line = proc.stdout.readline()
        assert line, proc.communicate()[1][-3000:]
        started += [line.split()[1]] if line.startswith("started") else []
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=60)  # exits: the two runs stop, the third never starts
    assert proc.returncode == 130, err[-3000:]
    assert "re-run" in err and "Traceback" not in err
    stopped = [ln.split()[1:2] for ln in rest.splitlines() if ln.startswith("stopped")]
    assert sorted(sum(stopped, [])) == sorted(started), rest[-3000:]
    assert "started" not in rest and not read_lines(tmp_path / "out" / "verdicts.jsonl")


def test_cancelled_optimize_drops_the_killed_evaluation_and_resumes(tmp_path, cache_dir):
    """What bench does to a concurrent optimize run on Ctrl-C: cancel, then kill its worker mid-evaluation."""
    import threading

    from kernelcraft.judge.caller import runner
    from kernelcraft.search.optimize import Cancelled, Options, optimize
    from kernelcraft.search.rundb import RunDB

    o = Options(device="cpu", budget=1, jobs=1, protocol=Protocol(trials=2, time_budget_s=0.3), **QUICK_OPT)
    cancel, done = threading.Event(), threading.Event()

    def interrupt():
        while not runner._LIVE and not done.is_set():
            time.sleep(0.01)
        cancel.set()
        runner.kill_live_workers()

    t = threading.Thread(target=interrupt)
    t.start()
    try:
        with pytest.raises(Cancelled):
            optimize("tiny/level1/diag_matmul", tmp_path / "run", o, cancel=cancel)
    finally:
        done.set()
        t.join()
    db = RunDB(tmp_path / "run")
    try:  # the crash the kill caused is not recorded: the candidate is still in flight
        assert [(r.state, r.status) for r in db.rows()] == [("in_flight", None)]
    finally:
        db.close()
    res = optimize("tiny/level1/diag_matmul", tmp_path / "run", o)  # the resume evaluates it
    assert res.candidates == 1 and res.stopped == "budget" and res.failed == 0


def test_cli_task_jobs_option(tmp_path, cache_dir):
    base = ["bench", "tiny/level1/diag_matmul", "--device", "cpu", "--baselines", "eager", "--baselines-only",
            "--json"]
    runner = CliRunner()
    r = runner.invoke(app, base + ["--task-jobs", "2", "--out", str(tmp_path / "a")])
    assert r.exit_code == 0 and last_json(r.stdout)["task_jobs"] == 2, r.output
    r = runner.invoke(app, base + ["--out", str(tmp_path / "b")])  # the default on a CPU
    assert r.exit_code == 0 and last_json(r.stdout)["task_jobs"] == 1, r.output
    bad = runner.invoke(app, base + ["--task-jobs", "0", "--out", str(tmp_path / "c")])
    assert bad.exit_code == 2 and "--task-jobs" in bad.output and not (tmp_path / "c").exists()
    with pytest.raises(BenchError, match="task_jobs"):
        run(resolve("tiny/level1/diag_matmul", device="cpu"), tmp_path / "d", opts(task_jobs=0))


def test_device_lists_resolve_to_one_kind_of_gpu(monkeypatch):
    from kernelcraft import devices

    assert devices.resolve_many("cpu") == ["cpu"]
    assert devices.resolve_many(None) == [devices.resolve(None)[0]]
    for bad, why in (("cuda:0,,cuda:1", "bad device list"), ("cpu,cpu,", "bad device list")):
        with pytest.raises(ValueError, match=why):
            devices.resolve_many(bad)
    # a machine with three GPUs, two of one product: a mixed list is refused, duplicates collapse
    names = {"cuda:0": "cuda H100", "cuda:1": "cuda H100", "cuda:2": "cuda A100"}
    monkeypatch.setattr(devices, "resolve", lambda d: (d if d in names or d == "cpu" else "cuda:0", "x"))
    monkeypatch.setattr(devices, "timing_identity", lambda d: names.get(d, "cpu"))
    monkeypatch.setattr(devices, "visible_devices", lambda: list(names))
    assert devices.resolve_many("cuda:0,cuda:1,cuda:0") == ["cuda:0", "cuda:1"]
    with pytest.raises(ValueError, match="different GPUs"):
        devices.resolve_many("cuda:0,cuda:2")
    with pytest.raises(ValueError, match="different GPUs"):
        devices.resolve_many("cuda:all")
    with pytest.raises(ValueError, match="CPU cannot be mixed"):
        devices.resolve_many("cpu,cuda:1")
    monkeypatch.setattr(devices, "visible_devices", lambda: ["cpu"])
    with pytest.raises(ValueError, match="no CUDA GPU"):
        devices.resolve_many("cuda:all")
    r = CliRunner().invoke(app, ["bench", "tiny/level1", "--device", "cuda:0,,cuda:1", "--out", "/nonexistent/x"])
    assert r.exit_code == 2 and "bad device list" in r.output


def test_optimize_runs_are_leased_the_least_busy_gpu():
    import threading

    from kernelcraft.bench.taskpool import DeviceLease

    lease, got, inside, release = DeviceLease(["cuda:0", "cuda:1"]), [], threading.Barrier(3), threading.Event()

    def one():
        def work(d):
            got.append(d)
            inside.wait(5)
            release.wait(5)
            return d
        lease.run(work)

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    inside.wait(5)  # both runs hold a device: one each
    assert sorted(got) == ["cuda:0", "cuda:1"] and lease.busy == {"cuda:0": 1, "cuda:1": 1}
    release.set()
    for t in threads:
        t.join(5)
    assert lease.busy == {"cuda:0": 0, "cuda:1": 0}
    with pytest.raises(RuntimeError):  # a failed run hands its device back
        lease.run(lambda d: (_ for _ in ()).throw(RuntimeError(d)))
    assert lease.busy == {"cuda:0": 0, "cuda:1": 0}


# ---- GPU --------------------------------------------------------------------------------------------------

@pytest.mark.gpu
def test_bench_gpu_with_cudagraph_baseline(tmp_path, cache_dir):
    tasks, cands = tmp_path / "tasks" / "level1", tmp_path / "cands"
    tasks.mkdir(parents=True)
    cands.mkdir()
    shutil.copy(TASKS / "tiny_diag_matmul.py", tasks / "1_tiny_diag_matmul.py")
    shutil.copy(TASKS / "tiny_elementwise.py", tasks / "2_tiny_elementwise.py")
    shutil.copy(LEGIT / "diag_matmul_rowscale.py", cands / "1_tiny_diag_matmul.py")
    shutil.copy(LEGIT / "torch_elementwise.py", cands / "2_tiny_elementwise.py")
    r = kc("bench", str(tmp_path / "tasks"), "--candidates", str(cands), "--device", "cuda:all",
           "--baselines", "eager,inductor,cudagraph", "--eval-time", "1", "--trials", "3", "--remeasure-above", "0",
           "--out", str(tmp_path / "out"), "--json", timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    s = last_json(r.stdout)
    import torch

    assert s["devices"] == [f"cuda:{i}" for i in range(torch.cuda.device_count())]  # every GPU served the bench
    assert s["baselines"]["names"] == ["eager", "inductor", "cudagraph"] and not s["baselines"]["skipped"]
    assert s["tasks"] == 2 and s["correct"] == 2, s["statuses"]
    assert s["device"].startswith("cuda ")
    items = json.loads((tmp_path / "out" / "summary.json").read_text())["items"]
    for row in items:
        assert row["baselines"]["cudagraph"]["status"] == "correct", row
        assert row["baselines"]["inductor"]["status"] == "correct", row
        assert row["speedup_vs_compile"] is not None
    assert s["fast_p_vs_compile"] is not None
    assert s["baselines"]["summary"]["cudagraph"]["correct"] == 2


# ---- the bench report's page: whole labels, and a baselines-only page that says what it is ---------

def _summary(baselines_only: bool, n: int = 14) -> dict:
    names = [f"tiny/level{1 + i % 3}/{'fused_' * (i % 4)}task_{i}" for i in range(n)]
    items = [{"item": nm, "level": 1 + i % 3, "task_id": i, "status": "not_evaluated" if baselines_only else
              ("correct" if i % 2 else "incorrect"), "reasons": [], "correct": bool(i % 2) and not baselines_only,
              "speedup": None if baselines_only or not i % 2 else 1.5, "speedup_vs_compile": None, "ci95": None,
              "baselines": {"inductor": {"status": "correct" if i % 5 else "runtime_error",
                                         "speedup": 1.2 if i % 5 else None}}, "message": ""}
             for i, nm in enumerate(names)]
    s = {"source": "tiny", "device": "cpu test x2", "tasks": n, "items": items, "baselines_only": baselines_only,
         "baselines": {"names": ["eager", "inductor"], "summary": {}, "skipped": {}},
         "candidates": "none" if baselines_only else "optimize", "policy": None if baselines_only else "recipes",
         "budget": None if baselines_only else 8, "protocol": {"trials": 5, "time_budget_s": 1.0, "mode": "open"},
         "wall_s": 12.0}
    if not baselines_only:
        s.update(correct=n // 2, correct_rate=0.5, fast_p={"1": 0.5}, geomean_speedup=1.2, by_level={})
    return s


def test_baselines_only_report_says_so():
    from kernelcraft.bench.report import render

    html = render(_summary(True))
    header = html[html.index("id='header'"):html.index("</div>", html.index("id='header'"))]
    assert "baselines only" in header and "optimize" not in header and "policy" not in header and "budget 8" not in header
    table = html[html.index("id='items'"):html.index("</table>", html.index("id='items'"))]
    assert "not_evaluated" not in table and "1.20x" in table and "runtime_error" in table
    scored = render(_summary(False))
    assert "candidates: <b>optimize</b> (policy recipes, budget 8" in scored


TIME_USE = {"evaluations": 30, "tasks": 14, "device_s": 95.0, "device_s_per_task": 6.8, "median_device_s": 2.9,
            "off_device_s": 310.0, "wait_s": 4.0, "phases_s": {"spawn": 250.0, "time": 80.0},
            "by_kind": {}, "by_level": {}}


def test_bench_report_header_after_a_resume_shows_the_directorys_time():
    """A resume of a finished bench takes a fraction of a second: the header said "0 s" for a bench of minutes.
    It shows every invocation's evaluations (`timeuse`), and this invocation's wall time as such."""
    from kernelcraft.bench.report import render

    def header(**kw):
        html = render({**_summary(False), "time_use": TIME_USE, **kw})
        return html[html.index("id='header'"):html.index("</div>", html.index("id='header'"))]

    resumed = header(resumed=14, wall_s=0.03)
    assert "30 evaluations took 7 min (95 s of it on the device) over every invocation" in resumed, resumed
    assert "this invocation 0.0 s (resumed 14 item(s) already judged)" in resumed, resumed
    assert not re.search(r"· 0 s$", resumed)
    fresh = header(resumed=0, wall_s=420.0)
    assert "30 evaluations took 7 min" in fresh and "7 min wall" in fresh and "this invocation" not in fresh, fresh


def _cells(html: str, table_id: str) -> list[list[tuple[str, str]]]:
    """A table's rows as (tag + class, text) cells."""
    body = html[html.index(f"<table id='{table_id}'>"):html.index("</table>", html.index(f"<table id='{table_id}'>"))]
    rows = []
    for tr in re.findall(r"<tr>(.*?)</tr>", body):
        rows.append([(f"{tag}{' num' if 'num' in (cls or '') else ''}", re.sub(r"<[^>]+>", "", text))
                     for tag, cls, text in re.findall(r"<(th|td)(?: class='([^']*)')?[^>]*>(.*?)</\1>", tr)])
    return rows


def test_bench_report_tables_align_numbers_and_their_headers():
    from kernelcraft.bench.report import render

    s = _summary(False)
    s["baselines"]["summary"] = {"eager": {"tasks": 14, "note": "the reference itself: 1.0x by definition"},
                                 "inductor": {"tasks": 14, "correct": 11, "geomean_speedup_correct": 1.2,
                                              "median_speedup_correct": 1.1, "fast_p": {"1": 0.6, "2": 0.1}}}
    html = render({**s, "time_use": {**TIME_USE, "by_kind": {"candidate": TIME_USE}}})
    number = re.compile(r"^[\d.,%x—–\[\] ()+?]+$")
    for table_id in ("baselines", "fastp", "items", "time"):
        rows = _cells(html, table_id)
        head, body = rows[0], [r for r in rows[1:] if len(r) == len(rows[0])]
        assert body, table_id
        for col, (tag, text) in enumerate(head):
            texts = [r[col][1].strip() for r in body if r[col][1].strip()]
            numeric = bool(texts) and all(number.match(t) for t in texts)
            if numeric:  # a column of numbers: every cell and its header right-aligned
                assert tag == "th num", (table_id, text)
                assert all(r[col][0] == "td num" for r in body), (table_id, text, [r[col] for r in body])
    assert "th.num{text-align:right}" in html


def test_a_long_message_is_cut_after_a_whole_word_and_says_so():
    from kernelcraft.bench.metrics import first_line

    msg = "optimize found 3 correct candidate(s) but none verified faster than the reference " * 4 + "END"
    short = first_line(msg, limit=120)
    assert len(short) <= 120 and short.endswith("…") and msg.startswith(short[:-1])
    assert short[:-1].split()[-1] in msg.split()  # a whole word before the mark, never "no bes"
    assert first_line("whole line\nsecond") == "whole line"


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed")
def test_bench_report_task_labels_whole_and_apart_in_chromium(tmp_path):
    from chromium import assert_labels_whole_and_apart, boxes

    from kernelcraft.bench.report import write_report

    for only in (False, True):
        page = write_report(_summary(only, n=40), tmp_path / f"report-{only}.html")
        found = boxes(page, "#bars text.xlabel", tmp_path)
        assert sorted(f["text"] for f in found) == sorted(r["item"] for r in _summary(only, n=40)["items"])
        assert_labels_whole_and_apart(found, "per-task")


def test_baseline_verdicts_that_ran_out_of_memory_are_not_cached():
    """How much device memory was free depends on the other jobs on the GPU: such a verdict is re-judged on the
    next run, not replayed from the cache (an 80 GB H100 replayed a crowded run's out-of-memory verdicts)."""
    from kernelcraft.bench.baselines import cacheable

    assert cacheable({"status": "correct", "reasons": []})
    assert cacheable({"status": "incorrect", "reasons": ["value_mismatch"], "message": "max error 3"})
    assert not cacheable({"status": "runtime_error", "reasons": ["out_of_memory"], "message": "out of memory"})
    assert not cacheable({"status": "runtime_error", "reasons": ["task_error"],
                          "message": "the reference failed: out of memory during describe: OutOfMemoryError"})
    assert not cacheable({"status": "runtime_error", "reasons": ["harness_error"], "message": "x"})
    assert not cacheable({"status": "timeout", "reasons": ["timeout"]})


def test_the_optimize_run_of_a_task_gets_its_baselines_by_text():
    """The recipes policy's first round proposes the bench's baseline texts again: the run is handed this task's
    baseline verdicts (by candidate sha256), never another task's or one that ran out of memory."""
    from kernelcraft.bench.records import measured_texts as _measured_texts

    ok = {"candidate_sha256": "c1", "status": "correct", "reasons": []}
    oom = {"candidate_sha256": "c2", "status": "runtime_error", "reasons": ["out_of_memory"], "message": "oom"}
    other = {"candidate_sha256": "c3", "status": "correct", "reasons": []}
    base = {("t1", "inductor"): ok, ("t1", "cudagraph"): oom, ("t2", "inductor"): other}
    assert _measured_texts(base, "t1") == {"c1": ok}
    assert _measured_texts(base, "t3") == {}


def test_task_runs_never_hold_up_the_interpreters_exit_after_ctrl_c():
    """`run_tasks` on Ctrl-C raises at once and leaves the running optimizations to the caller (it kills their
    workers). They must not keep the process alive: a ThreadPoolExecutor's threads are joined at exit, and a
    Ctrl-C landing while `as_completed` held its futures' locks left one waiting on a lock forever (`kernelcraft
    bench` hung after "re-run the same command to resume", 2 CPU-suite runs in 4). A run still busy after the
    interrupt is a daemon thread; the failure path still hands over what finished and re-raises."""
    import threading

    from kernelcraft.bench.taskpool import run_tasks
    from kernelcraft.search.optimize import Cancelled

    stuck, stop, got = threading.Event(), threading.Event(), []

    def run_one(key):
        if key == "slow":
            stuck.wait(30)
        return {"key": key}

    def interrupted(key, result):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_tasks(["fast", "slow", "never"], 2, stop, run_one, interrupted)
    assert stop.is_set()
    busy = [t for t in threading.enumerate() if t.name.startswith("kc-bench-optimize") and t.is_alive()]
    assert busy and all(t.daemon for t in busy), [(t.name, t.daemon) for t in busy]
    stuck.set()

    def failing(key):
        if key == "bad":
            raise RuntimeError("task failed")
        return {"key": key}

    with pytest.raises(RuntimeError, match="task failed"):
        run_tasks(["ok", "bad"], 2, threading.Event(), failing, lambda k, r: got.append(k) or 1)
    assert got == ["ok"] or got == [], got  # handed over if it finished, never after the error
    n = run_tasks(["a", "b", "c"], 2, threading.Event(), lambda k: {"k": k}, lambda k, r: 1)
    assert n == 3
    stop2 = threading.Event()
    stop2.set()
    with pytest.raises(Cancelled):
        run_tasks(["x", "y"], 2, stop2, lambda k: {"k": k}, lambda k, r: 1)
