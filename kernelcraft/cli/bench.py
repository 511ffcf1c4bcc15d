"""`kernelcraft bench`: a whole suite judged at once, with a progress bar, a results table and resume."""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from kernelcraft import devices
from kernelcraft.bench.metrics import OUTCOME_WORDS
from kernelcraft.bench.options import BenchOptions
from kernelcraft.bench.run import BenchError, Interrupted, default_out, resolve, run
from kernelcraft.bench.timeuse import one_line
from kernelcraft.cli import checks
from kernelcraft.cli.interrupt import EXIT_INTERRUPTED, Interrupts
from kernelcraft.cli.common import app, console, fits, out, print_json, print_table, table, usage_error, with_protocol
from kernelcraft.protocol import Protocol
from kernelcraft.task import LEVELS, TIERS


class _BenchProgress:
    """Renders bench events: a progress bar with ETA on stderr, one line per result. Thread-safe: with
    `--task-jobs` above 1 the optimize runs' events come from their own threads (one lock around it all)."""

    def __init__(self, quiet: bool = False):
        self.quiet = quiet
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=console,
                                 transient=True)
        self.bar = None
        self.faster = self.not_faster = self.bad = 0
        self.tag = False  # several tasks optimized at once: optimize lines name their task
        self._lock = threading.Lock()

    def __call__(self, kind: str, **d) -> None:
        with self._lock:
            self._render(kind, d)

    def _render(self, kind: str, d: dict) -> None:
        if kind == "start":
            for n in d["notes"]:
                console.print(f"[yellow]note[/yellow]: {escape(n)}")
            for b, why in d["skipped"].items():
                console.print(f"[yellow]baseline {b} skipped[/yellow]: {escape(why)}")
            bs = d["baseline_stats"]
            self.tag = d["optimize"] > 1 and d.get("task_jobs", 1) > 1
            runs = f"{d['optimize']} optimize run(s)" + (f", {d['task_jobs']} at a time" if self.tag else "")
            console.print(f"bench: {d['items']} item(s), {d['tasks']} task(s) on {escape(d['device'])} · baselines "
                          f"{', '.join(d['baselines']) or 'none'} ({bs['from_run'] + bs['cache_hits']} known) · "
                          + (f"resuming: {d['resumed']} done · " if d["resumed"] else "")
                          + f"{d['total']} evaluation(s) to run" + (f" ({runs})" if d["optimize"] else "")
                          + f" · out {escape(d['out'])}", highlight=False)
            self.progress.start()
            self.bar = self.progress.add_task("bench", total=max(d["total"], 1) if d["total"] else 0)
        elif kind == "result":
            item, o = d["what"] == "item", d.get("outcome")
            self.faster += item and o == "faster"
            self.not_faster += item and o == "not_faster"
            self.bad += item and o not in ("faster", "not_faster")
            if not self.quiet:
                console.print(f"  {escape(d['name'])}: {_result_line(d)}", highlight=False)
            self.progress.update(self.bar, advance=1,
                                 description=f"[green]{self.faster} faster[/green] · [yellow]{self.not_faster} not "
                                 f"faster[/yellow] · [red]{self.bad} incorrect or failed[/red]")
        elif kind == "optimize_start":
            console.print(f"  optimizing {escape(d['name'])} → {escape(d['run_dir'])}", highlight=False)
        elif kind == "optimize" and not self.quiet:
            e, x = d["event"], d["data"]
            who = f"{escape(d['name'])}: " if self.tag else ""
            if e == "verdict":
                ci = x.get("ci95") or [None, None]
                sp = f" {x['speedup']:.2f}x" if x.get("speedup") else ""
                sp += f" [95% CI {ci[0]:.2f}–{ci[1]:.2f}]" if sp and None not in ci else ""
                console.print(f"[dim]    {who}candidate #{x.get('id') or '-'} {escape(x['status'])}{sp}[/dim]",
                              highlight=False)
            elif e == "done":
                fb = (x.get("fallback") or {}).get("kind")
                console.print(f"[dim]    {who}optimize: {escape(x['status'])} after {x['candidates']} candidate(s)"
                              + ("; judging best.py afresh" if x.get("best_path") else
                                 f"; best.py is its fallback, {_FALLBACK_WORDS.get(fb, fb)}" if fb else "") + "[/dim]",
                              highlight=False)
        elif kind == "done":
            self.progress.stop()

    def stop(self) -> None:
        with self._lock:
            self.progress.stop()


def _result_line(d: dict) -> str:
    """One result as it lands: an item's outcome in words (faster, correct but not faster, or its status and
    message), a baseline's status."""
    ci = d.get("ci95")
    sp = f" {d['speedup']:.3f}x" if d.get("speedup") else ""
    sp += f" [dim][95% CI {ci[0]:.2f}–{ci[1]:.2f}][/dim]" if sp and ci and None not in ci else ""
    sp += f" [dim]· {_roof_pct(d['roofline'])} of the roof[/dim]" if sp and d.get("roofline") else ""
    o = d.get("outcome") if d["what"] == "item" else None
    if o == "faster":
        return f"[green]faster[/green]{sp}"
    if o == "not_faster":
        return f"[yellow]correct, not faster[/yellow]{sp}" + (
            f" [dim](optimize's fallback: {escape(d['fallback'])})[/dim]" if d.get("fallback") else
            "" if d["status"] == "correct" else f": [dim]{escape(d['message'])}[/dim]")
    if d["status"] == "correct":
        return f"[green]correct[/green]{sp}"
    return f"[red]{escape(d['status'])}[/red] [dim]{escape(d['message'])}[/dim]"  # whole: its end matters


_FALLBACK_WORDS = {"reference": "the reference", "fallback_candidate": "a candidate no slower",
                   "baseline": "a baseline"}


def outcome_line(s: dict) -> str:
    """The bench's headline: what the scored tasks came to, each outcome counted once (`metrics.outcome`)."""
    o = s.get("outcomes") or {}
    kept = sum(r.get("outcome") == "not_faster" and r.get("status") == "no_candidate" for r in s.get("items") or [])
    fell = {k: n for k, n in (s.get("fallbacks") or {}).items() if n}
    notes = ([f"{sum(fell.values())} of them at optimize's fallback, none verified faster: "
              + ", ".join(f"{n} {_FALLBACK_WORDS.get(k, k)}" for k, n in fell.items())] if fell else []) + (
        [f"{kept} of them: optimize found none verified faster and had no fallback, scored as failures"]
        if kept else [])
    parts = [f"{o.get('faster', 0)} faster",
             f"{o.get('not_faster', 0)} correct, not faster" + (f" ({'; '.join(notes)})" if notes else ""),
             f"{o.get('incorrect', 0)} incorrect", f"{o.get('failed', 0)} failed"]
    parts += [f"{o[k]} {OUTCOME_WORDS[k]}" for k in ("rejected", "no_candidate") if o.get(k)]
    return f"{s['tasks']} task(s): " + " · ".join(parts)


def _roof_pct(v: float) -> str:
    return f"{100 * v:.0f}%" if v >= 0.1 else f"{100 * v:.2g}%"


def roofline_line(s: dict) -> str | None:
    """The roofline in a line (`bench.roofline`): the GPU's peaks, the tasks with a bound and which side bounds
    them, the median fraction of the roof of the reference, the best compile baseline and the candidate; or why
    there is none on a GPU (a CPU has no roofline to expect)."""
    r = s.get("roofline")
    if not r:
        return None
    if not r.get("product"):
        return r["note"] if str(s.get("device") or "").startswith("cuda") else None
    med = r["median_fraction"]
    parts = [f"{word} {_roof_pct(med[k])}" for k, word in (("reference", "reference"), ("compile", "best compile"),
                                                              ("candidate", "candidate")) if med.get(k) is not None]
    by, peak = r["bound_by"], r["tflops"]
    line = (f"roofline on the {r['product']} ({r['memory_tb_s']:g} TB/s, {peak['fp32']:g} fp32 / {peak['bf16']:g} bf16 "
            f"TFLOP/s): {r['tasks']} task(s) bounded, {by['memory']} by memory, {by['compute']} by compute"
            + (f" · median share of the roof: {', '.join(parts)}" if parts else ""))
    return line + (f" · {len(r['without'])} without one (summary.json: roofline.without)" if r.get("without") else "")


def _bench_table(s: dict) -> None:
    if s.get("baselines_only"):
        t = table(f"baselines — {s['source']} ({s['tasks']} tasks, {s['device']})",
                  [(c, "left" if c == "baseline" else "right")
                   for c in ("baseline", "correct", "geomean vs eager", "median vs eager", "fast_1", "fast_2")])
        for name, m in s["baselines"]["summary"].items():
            if name == "eager":
                continue
            fp = m["fast_p"] or {}
            t.add_row(name, f"{m['correct']}/{m['tasks']}" + _unverifiable(m), _fx(m["geomean_speedup_correct"]),
                      _fx(m["median_speedup_correct"]), _fpct(fp.get("1")), _fpct(fp.get("2")))
        print_table(t, out)
        if any(m.get("unverifiable") for m in s["baselines"]["summary"].values()):
            out.print("[dim](+N?): N failures whose reference could not judge them (unverifiable_reference: it draws "
                      "random numbers or is ill-conditioned in fp32)[/dim]")
        return
    out.print(outcome_line(s), highlight=False, markup=False)
    t = _scores_table(s, " ")
    if out.is_terminal and not fits(t):
        t = _scores_table(s, "\n")  # a narrow terminal: each geomean's interval on a line of its own
    print_table(t, out)
    by_time = [(lv, m.get("geomean_speedup_vs_compile_by_time")) for lv, m in [("all", s), *s["by_level"].items()]]
    if by_time[0][1]:
        out.print("against compile by the programs' own times (not through each one's eager reference, which moves "
                  "between processes on launch-bound tasks): geomean " + " · ".join(
                      f"{'L' + str(lv) if str(lv).isdigit() else lv} {_fx(g)}" for lv, g in by_time if g),
                  highlight=False)
    out.print("[dim]faster: correct with the speedup's 95% CI above 1x · failed: build error, runtime error or "
              "timeout · correct: the judged candidate (given, or optimize's best.py) is correct; a search that found "
              "none faster is scored at its fallback, as correct and not faster: the reference itself (1.0x), or a "
              "candidate or baseline judged afresh no slower than it with confidence (strict mode takes no "
              "reference: a failure at 1.0x)[/dim]", highlight=False)
    out.print("[dim]fP (fast_p): share of all tasks that are correct with speedup > P, the point estimate (f1 can "
              "count a task whose CI reaches below 1) · geomean/median: all tasks, failures as 1.0, "
              "[CI from the per-task CIs] · geo ok: correct tasks only · /compile: against each task's best "
              "correct torch.compile baseline · (+N?): N failures whose reference could not judge them "
              "(unverifiable_reference)[/dim]", highlight=False)
    st = ", ".join(f"{k} {v}" for k, v in sorted(s["statuses"].items(), key=lambda kv: -kv[1]))
    out.print(f"statuses: {st}" + (f" · [red]{s['input_errors']} input error(s) not scored[/red]"
                                    if s["input_errors"] else ""), highlight=False)


def _scores_table(s: dict, before_ci: str):
    keys = list(s["fast_p"])
    t = table(f"bench — {s['source']} ({s['device']})",
              [(c, "left" if c == "scope" else "right")
               for c in ["scope", "tasks", "correct"] + [f"f{k}" for k in keys] + ["geomean", "median", "geo ok"]])
    rows = [("all", s, "")] + ([("all/compile", s, "_vs_compile")] if s.get("fast_p_vs_compile") else [])
    for lv, m in s["by_level"].items():
        label = f"L{lv}" if str(lv).isdigit() else str(lv)  # a directory's tasks may have no level: "unknown"
        rows.append((label, m, ""))
        if m.get("fast_p_vs_compile"):
            rows.append((f"{label}/compile", m, "_vs_compile"))
    for label, m, sfx in rows:
        fp = m[f"fast_p{sfx}"]
        ci = m.get(f"geomean_speedup{sfx}_ci95")
        geo = _fx(m[f"geomean_speedup{sfx}"]) + (f"{before_ci}[{_fx(ci[0])}–{_fx(ci[1])}]" if ci and ci[0] != ci[1]
                                                else "")
        t.add_row(label, str(m["tasks"]), str(m["correct"]) + _unverifiable(m), *[_fpct(fp[k]) for k in keys],
                  geo, _fx(m[f"median_speedup{sfx}"]), _fx(m[f"geomean_speedup{sfx}_correct"]))
    return t


def _unverifiable(m: dict) -> str:
    """" (+N?)" where N failures came from a reference that could not judge them (`unverifiable_reference`)."""
    return f" (+{m['unverifiable']}?)" if m.get("unverifiable") else ""


def _fx(v) -> str:
    return "—" if v is None else f"{v:.2f}x"


def _fpct(v) -> str:
    return "—" if v is None else f"{100 * v:.0f}%"


def _suite_names() -> list[str]:
    """Every built-in SOURCE: the suites, their levels and their tasks."""
    return ([*TIERS, *LEVELS] + [f"{t}/{lv}" for t in TIERS for lv in LEVELS] + checks.builtin_task_names())


@app.command("bench")
@with_protocol
def bench_cmd(
    source: str = typer.Argument(..., help="built-in suite (gpu, tiny, gpu/level1, level2, ...), a directory of "
                                 "KernelBench task files, or a pairs JSONL (ref_code, custom_code per line)"),
    device: Optional[str] = typer.Option(None, help="cpu, cuda, cuda:N, several GPUs of one kind (cuda:0,cuda:1) "
                                         "or cuda:all (default: cuda if visible)"),
    baselines: str = typer.Option("eager,inductor,cudagraph",
                                  help="comma-separated: eager, inductor, inductor-max-autotune, cudagraph (GPU), all, "
                                  "none"),
    candidates: Optional[Path] = typer.Option(None, help="directory of candidates: <task stem>.py, or KernelBench's "
                                              "run layout level_<L>_problem_<ID>_sample_<S>_kernel.py (default for "
                                              "suites and directories: optimize each task)"),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="output directory (default runs/bench-<source>); "
                                           "re-running with the same --out resumes"),
    policy: str = typer.Option("recipes", help="optimize policy when no candidates are given"),
    budget: int = typer.Option(8, min=1, help="optimize budget (candidates per task) when no candidates are given"),
    time_limit: Optional[float] = typer.Option(None, min=1, help="optimize: stop proposing for a task after this many "
                                               "seconds (its best is still confirmed and judged)"),
    jobs: Optional[int] = typer.Option(None, min=1, help="evaluations at once per device (default: 1 on a CPU "
                                       "below 8 cores, else 2; per GPU 2-4 by cores, up to 12 with spawned workers)"),
    task_jobs: Optional[int] = typer.Option(None, "--task-jobs", min=1,
                                            help="tasks optimized at once when no candidates are given (default 1 "
                                            "per GPU of --device; more pays when proposals wait on an LLM endpoint, not with recipes)"),
    limit: Optional[int] = typer.Option(None, min=1, help="only the first N items"),
    baselines_only: bool = typer.Option(False, "--baselines-only", help="measure the baselines only (no candidates, "
                                        "no optimize)"),
    baseline_cache: bool = typer.Option(True, "--baseline-cache/--no-baseline-cache",
                                        help="reuse baseline measurements cached for this task/device/torch/protocol"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no line per result (progress bar and summary only)"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as JSON (last line)"),
    protocol: Protocol = None,
):
    """Bench a suite: verdicts for every task, fast_p and speedups against eager and torch.compile baselines."""
    try:
        dev = devices.resolve_many(device)[0]
    except ValueError as e:
        usage_error(f"--device: {e}")
    try:
        src = resolve(source, device=dev, candidates=candidates)
    except BenchError as e:
        usage_error(str(e) + ("" if Path(source).exists() else checks.did_you_mean(source, _suite_names())))
    except (UnicodeDecodeError, OSError) as e:
        usage_error(f"cannot read SOURCE {source}: {e}")
    if not (src.has_candidates or src.kind == "pairs" or baselines_only):
        checks.policy(policy, build=False)  # each task is optimized: a bad policy is refused before any runs
    opts = BenchOptions(device=device or dev, baselines=baselines, protocol=protocol, jobs=jobs,
                        limit=limit, baselines_only=baselines_only, baseline_cache=baseline_cache, policy=policy,
                        budget=budget, task_jobs=task_jobs,
                        optimize_options={"time_limit_s": time_limit} if time_limit else {})
    out_dir = out_dir or default_out(src)
    progress, cancel = _BenchProgress(quiet), threading.Event()
    try:  # Ctrl-C or SIGTERM (`timeout 500 kernelcraft bench`): acknowledged at once, finished verdicts kept
        with checks.no_leftovers(out_dir):
            checks.out_dir(out_dir)
            try:
                with Interrupts(cancel, lambda: "stopping the running evaluations; finished verdicts are kept",
                                console):
                    summary = run(src, out_dir, opts, on_event=progress, cancel=cancel)
            except BenchError as e:
                progress.stop()
                usage_error(str(e))
    except (Interrupted, KeyboardInterrupt) as e:
        progress.stop()
        kept = (f"{e.done} finished verdict(s) kept in {out_dir}/verdicts.jsonl"
                + (f", {e.baselines} new baseline verdict(s) in baselines.jsonl" if e.baselines else "")
                if isinstance(e, Interrupted) else f"finished verdicts kept in {out_dir}")
        console.print(f"[yellow]interrupted[/yellow]: {kept}; re-run the same command to resume")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    if as_json:
        print_json({k: v for k, v in summary.items() if k != "items"})
        return
    _bench_table(summary)
    roof = roofline_line(summary)
    if roof:
        out.print(roof, highlight=False, markup=False)
    out.print(one_line(summary["time_use"]), highlight=False, markup=False)
    for n in summary["notes"]:
        out.print(f"note: {n}", highlight=False, markup=False)
    out.print(f"verdicts: {summary['verdicts']}" + (f" · report: {summary['report']}" if summary.get("report") else ""),
              highlight=False)


