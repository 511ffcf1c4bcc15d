"""What a bench's tasks came to, counted apart and said in words: faster (correct, 95% CI above 1), correct but
not faster (an optimize run scored at its fallback among them), incorrect, rejected, failed; the CLI's headline,
table and legend, and the page's cards and legend, never read "0 correct" where every candidate was correct."""
from __future__ import annotations

import re
from pathlib import Path

from rich.console import Console

from kernelcraft.bench.metrics import OUTCOMES, metrics, outcome, summarise
from kernelcraft.bench.options import BenchOptions
from kernelcraft.bench.sources import Item, Source
from kernelcraft.cli import bench as cli_bench
from kernelcraft.cli.common import PIPE_WIDTH
from kernelcraft.task import load_task


def _correct(lo, hi, speedup=None):
    return {"status": "correct", "speedup": speedup or (lo * hi) ** 0.5, "timing": {"ci95": [lo, hi]}}


def _kept(opt_status, statuses=None, correct=0):
    """An optimize run whose fallback the bench did not take (strict mode): its `no_candidate` record."""
    return {"status": "no_candidate", "speedup": None, "message": "no fallback strict mode accepts, counted as a failure",
            "optimize": {"status": opt_status, "correct": correct, "statuses": statuses or {}}}


def _fell(kind="reference", speedup=1.0, ci=None, baseline=None, opt_status="no_improvement"):
    """An optimize run scored at its fallback, as `bench.fallback.record` writes it: the reference (1.0x, not
    judged), or a candidate or baseline judged afresh."""
    return {"status": "correct", "speedup": speedup, "reasons": [], "timing": {"ci95": ci} if ci else None,
            "message": "optimize found none verified faster: scored at its fallback",
            "fallback": {"kind": kind, "baseline": baseline, "candidate": 3 if kind == "fallback_candidate" else None,
                         "floor": 1.0, "run": "reference", "tried": []},
            "optimize": {"status": opt_status, "correct": 1, "statuses": {"correct": 1}}}


def test_each_record_comes_to_one_outcome():
    assert outcome(_correct(1.2, 3.0)) == "faster"
    assert outcome(_correct(0.9, 1.4)) == "not_faster"  # the CI reaches 1: not shown faster
    assert outcome(_correct(0.5, 0.8)) == "not_faster"
    assert outcome({"status": "correct", "speedup": 2.0, "timing": None}) == "not_faster"  # no interval, no claim
    assert outcome({"status": "incorrect"}) == "incorrect" and outcome({"status": "rejected"}) == "rejected"
    for st in ("compile_error", "runtime_error", "timeout"):
        assert outcome({"status": st}) == "failed"
    assert outcome(_kept("no_improvement", {"correct": 3}, correct=3)) == "not_faster"
    assert outcome(_kept("no_correct", {"incorrect": 1, "compile_error": 2})) == "incorrect"
    assert outcome(_kept("no_correct", {"rejected": 1, "timeout": 1})) == "rejected"
    assert outcome(_kept("no_correct", {"compile_error": 2, "parse_error": 1})) == "failed"
    assert outcome({"status": "no_candidate", "message": "no candidate file"}) == "no_candidate"
    assert outcome({"status": "input_error"}) is None and outcome({"status": "not_evaluated"}) is None
    # an optimize run's fallback is correct and not faster, whatever its interval (a baseline's may lie above 1)
    assert outcome(_fell()) == "not_faster" and outcome(_fell(opt_status="no_correct")) == "not_faster"
    assert outcome(_fell("baseline", 1.4, [1.3, 1.5], "inductor")) == "not_faster"


def _summary(records: dict[str, dict]) -> dict:
    """A bench summary over built-in tiny tasks, one record each (what `bench.run` hands `summarise`)."""
    items = []
    for i, name in enumerate(records):
        it = Item(name=name, task=load_task(name), level=int(name.split("/")[1][-1]), task_id=i + 1)
        it.key = f"k{i}"
        items.append(it)
    recs = {it.key: {"message": "", "reasons": [], "speedup": None, **records[it.name]} for it in items}
    return summarise(Source(spec="tiny", name="tiny", kind="builtin", items=items), items, recs, {}, ["eager"], {},
                     {"from_run": 0, "cache_hits": 0, "measured_now": 0}, Path("/nonexistent-bench"), "cpu",
                     BenchOptions(device="cpu", baselines="eager"), {}, 0, len(items), 1.0)


def test_summary_counts_outcomes_overall_and_by_level():
    s = _summary({"tiny/level1/relu": _correct(1.5, 2.5), "tiny/level1/gelu": _correct(0.8, 1.1),
                  "tiny/level2/matmul_sum": {"status": "incorrect"}, "tiny/level1/softmax": {"status": "timeout"},
                  "tiny/level2/elementwise_chain": _kept("no_improvement", {"correct": 2}, correct=2)})
    assert s["outcomes"] == {"faster": 1, "not_faster": 2, "incorrect": 1, "rejected": 0, "failed": 1,
                             "no_candidate": 0}
    assert s["by_level"]["1"]["outcomes"]["faster"] == 1 and s["by_level"]["2"]["outcomes"]["not_faster"] == 1
    assert sum(s["outcomes"].values()) == s["tasks"] == 5
    assert [r["outcome"] for r in s["items"]] == ["faster", "not_faster", "incorrect", "failed", "not_faster"]
    assert list(s["outcomes"]) == list(OUTCOMES)
    assert metrics([{"correct": True, "speedup": 2.0}])  # baselines' rows carry no outcome: not counted
    assert "outcomes" not in metrics([{"correct": True, "speedup": 2.0}])


def _printed(s: dict, monkeypatch, width: int = PIPE_WIDTH, terminal: bool = False) -> str:
    console = Console(record=True, width=width, force_terminal=terminal, soft_wrap=not terminal)
    monkeypatch.setattr(cli_bench, "out", console)
    cli_bench._bench_table(s)
    return console.export_text()


def test_a_fallback_is_scored_as_correct_at_its_speedup():
    """A task whose search verified nothing faster is a correct item at its fallback's speedup: the reference's
    1.0x, or a baseline's measured number; counted apart in `fallbacks`, never a failure."""
    s = _summary({"tiny/level1/relu": _fell(), "tiny/level1/gelu": _fell("baseline", 1.4, [1.3, 1.5], "inductor"),
                  "tiny/level1/softmax": _correct(1.5, 2.5), "tiny/level2/matmul_sum": {"status": "incorrect"}})
    assert s["correct"] == 3 and s["outcomes"]["not_faster"] == 2 and s["outcomes"]["incorrect"] == 1
    assert s["fallbacks"] == {"reference": 1, "fallback_candidate": 0, "baseline": 1}
    rows = {r["item"]: r for r in s["items"]}
    assert rows["tiny/level1/relu"]["speedup"] == 1.0 and rows["tiny/level1/relu"]["fallback"] == "reference"
    assert rows["tiny/level1/gelu"]["fallback"] == "inductor" and rows["tiny/level1/gelu"]["ci95"] == [1.3, 1.5]
    assert rows["tiny/level1/softmax"]["fallback"] is None
    assert s["fast_p"]["0"] == 0.75 and s["fast_p"]["1"] == 0.5  # the reference is not above 1x; the baseline is
    sp = [1.0, 1.4, (1.5 * 2.5) ** 0.5, 1.0]  # the failure at 1.0 too
    assert abs(s["geomean_speedup"] - (sp[0] * sp[1] * sp[2] * sp[3]) ** 0.25) < 1e-9
    assert abs(s["geomean_speedup_correct"] - (sp[0] * sp[1] * sp[2]) ** (1 / 3)) < 1e-9


def test_all_correct_none_faster_is_not_headlined_as_nothing_correct(monkeypatch):
    s = _summary({"tiny/level1/relu": _fell(), "tiny/level1/gelu": _fell(opt_status="no_correct")})
    assert s["correct"] == 2  # scored at the fallback: the reference, correct by definition
    text = _printed(s, monkeypatch)
    head = text.splitlines()[0]
    assert head == ("2 task(s): 0 faster · 2 correct, not faster (2 of them at optimize's fallback, none verified "
                    "faster: 2 the reference) · 0 incorrect · 0 failed"), head
    assert "0 correct" not in head
    legend = [ln for ln in text.splitlines() if ln.startswith("faster: ")]
    assert len(legend) == 1 and "95% CI above 1x" in legend[0] and "scored at its fallback" in legend[0]  # whole
    # without a fallback (strict mode): the run's correct candidates still read as correct, not faster
    kept = _summary({"tiny/level1/relu": _kept("no_improvement", {"correct": 1}, correct=1)})
    assert kept["correct"] == 0  # no candidate was delivered, the reference stays: a failure at 1.0
    assert _printed(kept, monkeypatch).splitlines()[0] == (
        "1 task(s): 0 faster · 1 correct, not faster (1 of them: optimize found none verified faster and had no "
        "fallback, scored as failures) · 0 incorrect · 0 failed")
    fp = [ln for ln in text.splitlines() if ln.startswith("fP (fast_p): ")]
    assert len(fp) == 1 and "point estimate" in fp[0] and len(fp[0]) > 200  # never wrapped in a pipe
    assert "…" not in text
    table = [ln for ln in text.splitlines() if ln.startswith("┃ scope")]
    assert table and "correct" in table[0]
    # the same table in a terminal of 60 columns: every line fits, nothing is cut
    narrow = _printed(s, monkeypatch, width=60, terminal=True)
    assert max(len(ln) for ln in narrow.splitlines()) <= 60 and "…" not in narrow


def test_a_mixed_bench_names_only_the_outcomes_it_has(monkeypatch):
    s = _summary({"tiny/level1/relu": _correct(1.5, 2.5), "tiny/level1/gelu": {"status": "rejected"},
                  "tiny/level1/softmax": {"status": "no_candidate", "message": "no candidate file"}})
    head = _printed(s, monkeypatch).splitlines()[0]
    assert head == "3 task(s): 1 faster · 0 correct, not faster · 0 incorrect · 0 failed · 1 rejected · 1 without a " \
                   "candidate", head


def test_the_bench_page_names_outcomes_and_explains_fast_p():
    from kernelcraft.bench.report import render

    s = _summary({"tiny/level1/relu": _fell(), "tiny/level1/gelu": _correct(1.3, 2.0)})
    html = render(s)
    cards = html[html.index("id='summary'"):html.index("</div></div>", html.index("id='summary'"))]
    assert re.search(r"correct, not faster<b><span class='warn' id='outcome-not_faster'>1</span>", cards), cards
    assert "id='outcome-faster'>1<" in cards and "id='outcome-failed'>0<" in cards
    assert "(0%)" not in cards and ">correct<b>" not in cards  # no "correct 0 (0%)" headline
    assert "id='outcome-rejected'" not in cards  # none rejected: no card for it
    # each card says what its number means (a tooltip), and a legend under the cards says it on the page
    assert "title='correct, and the speedup&#x27;s 95% CI lies above 1x'" in cards
    assert "<dl id='outcomes'" in html and "scored, as correct, at its fallback" in html
    assert "id='fallbacks'>1<" in cards  # tasks scored at a fallback, counted apart
    legend = html[html.index("id='fastp-legend'"):]
    assert "fast_p: the share of all scored tasks" in legend and "point estimate" in legend
    assert re.search(r"<th class='num' title='correct with a speedup above 1x[^']*'>fast<sub>1</sub>", html)
    tasks = html[html.index("<table id='items'>"):]
    assert "· correct, not faster" in tasks and "· fallback: reference" in tasks


def test_against_compile_by_the_programs_own_times(monkeypatch):
    """A launch-bound reference read 20 ms beside the candidate and 10 ms beside inductor's baseline, both programs
    4 ms: the paired speedups say 2x over compile, the programs' own times 1x. A kept reference is eager's time
    (the median of the task's reference readings); a failure counts 1.0 as in every geomean."""
    from kernelcraft.bench.metrics import vs_compile_by_time

    t = lambda ref, cand: {"ref_ms": ref, "cand_ms": cand}  # noqa: E731
    net = {"status": "correct", "speedup": 5.0, "reasons": [], "timing": {**t(20.0, 4.0), "ci95": [4.5, 5.5]}}
    inductor = {"status": "correct", "speedup": 2.5, "timing": t(10.0, 4.0)}
    assert vs_compile_by_time(net, {"inductor": inductor}, "inductor") == 1.0
    assert vs_compile_by_time(net, {}, "eager") == 5.0  # no compile baseline correct: eager's own 20 ms
    kept = {**_fell(), "timing": t(3.0, 3.0)}
    fast = {"status": "correct", "speedup": 1.5, "timing": t(3.2, 2.0)}
    assert vs_compile_by_time(kept, {"inductor": fast}, "inductor") == 2.0 / 3.2  # eager: the median of 3.0, 3.2
    assert vs_compile_by_time({**net, "timing": {}}, {"inductor": inductor}, "inductor") is None

    items = []
    for i, name in enumerate(["tiny/level1/relu", "tiny/level1/gelu"]):
        it = Item(name=name, task=load_task(name), level=1, task_id=i + 1)
        it.key = f"k{i}"
        items.append(it)
    recs = {"k0": net, "k1": {"status": "incorrect", "reasons": [], "speedup": None, "message": ""}}
    base = {(items[0].task.sha256, "inductor"): inductor}
    s = summarise(Source(spec="tiny", name="tiny", kind="builtin", items=items), items, recs, base,
                  ["eager", "inductor"], {}, {"from_run": 0, "cache_hits": 0, "measured_now": 0},
                  Path("/nonexistent-bench"), "cpu", BenchOptions(device="cpu", baselines="eager,inductor"), {}, 0,
                  2, 1.0)
    rows = {r["item"]: r for r in s["items"]}
    assert rows["tiny/level1/relu"]["speedup_vs_compile"] == 2.0
    assert rows["tiny/level1/relu"]["speedup_vs_compile_by_time"] == 1.0
    assert rows["tiny/level1/gelu"]["speedup_vs_compile_by_time"] is None
    assert s["geomean_speedup_vs_compile_by_time"] == s["by_level"]["1"]["geomean_speedup_vs_compile_by_time"] == 1.0
    assert abs(s["geomean_speedup_vs_compile"] - 2.0 ** 0.5) < 1e-12  # the paired ratio, the failure at 1.0
    text = _printed(s, monkeypatch)
    assert "against compile by the programs' own times" in text and "all 1.00x · L1 1.00x" in text
