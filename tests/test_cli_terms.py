"""The words the CLI and the run page print are explained where they are printed: what "verified faster",
"confirmed" and the null control mean, and what a wide interval means; `optimize`'s summary counts each outcome
of its candidates once (correct faster or not, incorrect, rejected, failed, parse errors)."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from rich.console import Console
from typer.testing import CliRunner

from kernelcraft.cli import app
from kernelcraft.cli import judge as cli_judge
from kernelcraft.cli import optimize as cli_optimize
from kernelcraft.cli.common import PIPE_WIDTH
from kernelcraft.search.optimize import Result
from kernelcraft.search.report import load_run, render
from kernelcraft.search.rundb import RunDB
from kernelcraft.task import load_task

TASK = load_task("tiny/level1/diag_matmul")


def _recording(monkeypatch, module, name="console") -> Console:
    c = Console(record=True, width=PIPE_WIDTH, soft_wrap=True)
    monkeypatch.setattr(module, name, c)
    return c


def test_optimize_lines_say_what_verified_and_the_null_control_mean(monkeypatch):
    shown = _recording(monkeypatch, cli_optimize)
    p = cli_optimize._OptimizeProgress(4, bar=1.0)
    p("control", status="correct", speedup=0.97, ci95=[0.83, 1.56])
    p("verdict", id=1, status="correct", speedup=12.4, ci95=[7.5, 95.7], techniques=["rewrite"], message="")
    p("verdict", id=2, status="correct", speedup=1.01, ci95=[0.73, 1.67], techniques=["compile"], message="")
    p("verdict", id=3, status="incorrect", speedup=None, ci95=[None, None], techniques=[], message="value_mismatch")
    p("control", status="correct", speedup=1.2, ci95=[1.1, 1.3])  # a bias its interval lies above: the bar moves
    p("done")
    lines = shown.export_text().splitlines()
    assert lines[0] == ("null control (the reference timed against itself): 0.970x [95% CI 0.830–1.560] — what timing "
                        "noise alone reads here; a candidate is verified faster only when its CI's lower end is above "
                        "1.00x"), lines[0]
    assert lines[1] == "  #1 correct 12.40x [95% CI 7.50–95.70] verified faster · rewrite", lines[1]
    assert lines[2] == "  #2 correct 1.01x [95% CI 0.73–1.67] not verified faster (the CI reaches 1.00x) · compile"
    assert lines[3].startswith("  #3 incorrect")
    assert "a timing bias (its CI lies above 1)" in lines[4] and "above 1.200x" in lines[4], lines[4]
    below = cli_optimize._OptimizeProgress(4)
    below("control", status="correct", speedup=0.6, ci95=[0.5, 0.7])
    below("done")
    last = shown.export_text()
    assert "warning: below 1 beyond its CI" in last and "re-run when the host is quieter" in last, last


def test_a_min_speedup_is_the_bar_the_lines_judge_by(monkeypatch):
    shown = _recording(monkeypatch, cli_optimize)
    p = cli_optimize._OptimizeProgress(2, bar=1.5)
    p("verdict", id=1, status="correct", speedup=1.6, ci95=[1.2, 2.0], techniques=[], message="")
    p("done")
    assert "not verified faster (the CI reaches 1.50x)" in shown.export_text()


def _finished_run(out: Path, statuses: list[tuple[str, float | None, list | None]]) -> None:
    db = RunDB(out)
    db.set_meta("task", TASK.name)
    db.set_meta("task_source", TASK.source)
    for i, (status, speedup, ci) in enumerate(statuses):
        cid, _ = db.add_candidate(f"class ModelNew:\n    X = {i}\n", policy="recipes", round=1)
        db.claim(cid)
        db.finish(cid, {"status": status, "speedup": speedup, "reasons": [] if status == "correct" else [status],
                        "message": f"{status} message", "timing": {"speedup": speedup, "ci95": ci} if speedup else None})
    db.add_parse_error(policy="openai:m", round=2, reply="prose", message="no code block", reason="no_code_block")
    db.close()


def test_optimize_summary_counts_each_outcome_apart(tmp_path, monkeypatch):
    out = tmp_path / "run"

    def fake(task, out_dir, opts, **kw):
        _finished_run(out_dir, [("correct", 3.0, [2.5, 3.5]), ("correct", 1.02, [0.9, 1.1]),
                                ("correct", 0.8, [0.7, 0.9]), ("incorrect", None, None), ("rejected", None, None),
                                ("compile_error", None, None), ("timeout", None, None)])
        return Result(task=task.name, status="no_improvement", best_path=None, best_speedup=None, candidates=8,
                      run_dir=str(out_dir), correct=3, verified_faster=1, failed=4, parse_errors=1, stopped="budget",
                      stopped_detail="the budget of 8 candidates is used", budget=8)

    monkeypatch.setattr(cli_optimize, "optimize", fake)
    r = CliRunner().invoke(app, ["optimize", "tiny/level1/diag_matmul", "--device", "cpu", "--out", str(out),
                                 "--budget", "8"], prog_name="kernelcraft")
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[0] == ("tiny/level1/diag_matmul: no_improvement after 8 of 8 candidates: 3 correct (1 verified faster, "
                        "2 not faster), 1 incorrect, 1 rejected, 2 failed (build, runtime, timeout), 1 parse error(s)"), \
        lines[0]
    legend = [ln for ln in lines if ln.startswith("verified faster: ")]
    assert len(legend) == 1, lines  # one line through a pipe, never wrapped
    assert "here 1.00x" in legend[0] and "null control is the reference timed against itself" in legend[0]
    assert "confirmed: re-timed in a fresh worker" in legend[0]


def _verdict(correct: bool, lo: float, hi: float):
    return SimpleNamespace(status="correct" if correct else "incorrect",
                           timing=SimpleNamespace(ci95=(lo, hi), note="host too noisy: the 95% CI spans x7 (more than "
                                                  "x1.5); the speedup does not resolve the candidate here — re-run on "
                                                  "a quieter host or with a larger --time-budget"))


def test_a_wide_interval_above_one_is_a_note(monkeypatch):
    shown = _recording(monkeypatch, cli_judge)
    cli_judge._noise_note(_verdict(True, 6.9, 48.5))
    text = shown.export_text()
    assert text.startswith("note: the speedup's 95% CI 6.9–48.5 lies wholly above 1x: the candidate is faster"), text
    assert "warning" not in text and "re-run on a quieter host" in text
    shown = _recording(monkeypatch, cli_judge)
    cli_judge._noise_note(_verdict(True, 0.5, 4.0))  # it straddles 1: the verdict is open, the warning stands
    assert shown.export_text().startswith("warning: host too noisy")


def test_the_run_page_explains_its_terms_where_the_numbers_are(tmp_path):
    _finished_run(tmp_path, [("correct", 3.0, [2.5, 3.5]), ("incorrect", None, None), ("timeout", None, None)])
    db = RunDB(tmp_path)
    db.set_meta("null_control", {"status": "correct", "speedup": 0.98, "ci95": [0.9, 1.1]})
    db.close()
    html = render(load_run(tmp_path))
    cards = html[html.index("id='summary'"):html.index("</div></div>", html.index("id='summary'"))]
    for word, tip in [("verified faster", "lower end above the bar"), ("null control", "the reference timed against "
                                                                                     "itself"),
                      ("incorrect", "outputs outside tolerance"), ("failed", "build error, runtime error or timeout")]:
        assert f"{tip}" in cards and f"'>{word}<b>" in cards, (word, cards)
    terms = html[html.index("<dl id='terms'>"):]
    assert "<b>null control</b>" in terms and "<b>verified (faster)</b>" in terms and "<b>incorrect</b>" in terms
    assert "When its 95% CI lies wholly above 1, the bar is raised to its speedup" in terms
