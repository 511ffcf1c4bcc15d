"""The `kernelcraft` command: a thin typer layer over the library API (see ../shared/CONTRACT.md).

Design decisions
- Every command is a call into the library plus printing. With `--json` the last line of stdout is the
  JSON record and nothing else goes to stdout after it; human output is rich tables/panels.
- Exit status 0 whenever a verdict was reached (whatever it says); 2 with a one-line message for usage
  errors: missing file, unknown task, bad option.
"""
from __future__ import annotations

import json
import signal
import sys
import threading
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="kernelcraft: trustworthy evaluation and automatic optimization of GPU code.")
console = Console(stderr=True)
out = Console()


def _usage_error(msg: str) -> None:
    # one line, never wrapped at the terminal width: scripts read it
    sys.stderr.write("error: " + " ".join(str(msg).split()) + "\n")
    raise typer.Exit(2)


def _print_json(record: dict) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def _verdict_panel(v) -> None:
    color = {"correct": "green", "incorrect": "red", "rejected": "magenta"}.get(v.status, "yellow")
    out.print(f"[bold]{v.task}[/bold]  candidate {v.candidate_sha256[:12]}  on {v.device}")
    out.print(f"status: [bold {color}]{v.status}[/bold {color}]"
              + (f"  reasons: {', '.join(v.reasons)}" if v.reasons else ""))
    if v.correctness:
        c = v.correctness
        out.print(f"correctness: {c.passed}/{c.trials} trials, max abs err {c.max_abs_err:.3g}, "
                  f"max rel err {c.max_rel_err:.3g} (atol {c.atol}, rtol {c.rtol})")
    if v.timing:
        t = v.timing
        out.print(f"timing: reference {t.ref_ms:.4f} ms, candidate {t.cand_ms:.4f} ms, "
                  f"speedup [bold]{t.speedup:.3f}x[/bold] (95% CI {t.ci95[0]:.3f}–{t.ci95[1]:.3f}, "
                  f"{t.samples} paired samples{'' if t.converged else ', CI target not reached'})")
    if v.message:
        out.print(v.message, markup=False, highlight=False)
    out.print(f"build {v.build_s:.1f} s, wall {v.wall_s:.1f} s")


@app.command("eval")
def eval_cmd(
    task: str = typer.Argument(..., help="task file, built-in name (see `kernelcraft tasks`)"),
    candidate: Path = typer.Argument(..., help="candidate file defining ModelNew"),
    device: Optional[str] = typer.Option(None, help="cpu, cuda or cuda:N (default: cuda if visible)"),
    trials: int = typer.Option(5, min=1, help="correctness trials, each with fresh random inputs"),
    atol: Optional[float] = typer.Option(None, help="absolute tolerance (default per dtype)"),
    rtol: Optional[float] = typer.Option(None, help="relative tolerance (default per dtype)"),
    mode: str = typer.Option("open", help="open | strict (strict: own kernel required)"),
    time_budget: float = typer.Option(3.0, help="seconds of timing before giving up on the CI target"),
    timeout: float = typer.Option(180.0, help="seconds allowed after the build (construction, checks, timing)"),
    no_timing: bool = typer.Option(False, "--no-timing", help="check correctness only"),
    as_json: bool = typer.Option(False, "--json", help="print the verdict record as JSON (last line)"),
):
    """Judge one candidate against a task: correctness, then a trustworthy speedup."""
    from kernelcraft.evaluate import evaluate
    from kernelcraft.task import TaskError

    if not candidate.is_file():
        _usage_error(f"candidate file not found: {candidate}")
    if mode not in ("open", "strict"):
        _usage_error(f"--mode must be open or strict, not {mode!r}")
    try:
        v = evaluate(task, candidate, device=device, trials=trials, atol=atol, rtol=rtol, mode=mode,
                     time_budget_s=time_budget, timeout_s=timeout, timing=not no_timing)
    except (TaskError, ValueError, FileNotFoundError) as e:
        _usage_error(str(e))
    if as_json:
        _print_json(v.to_json())
    else:
        _verdict_panel(v)


@app.command("tasks")
def tasks_cmd(
    tier: Optional[str] = typer.Option(None, help="gpu or tiny (default: both)"),
    level: Optional[int] = typer.Option(None, min=1, max=3),
    show_source: Optional[str] = typer.Option(None, "--show", help="print one task's source"),
    check: bool = typer.Option(False, "--check", help="run each reference and flag degenerate tasks "
                               "(constant, near-zero or input/weight-independent output)"),
    paths: list[str] = typer.Argument(None, help="with --check: task files or names (default: the listed built-ins)"),
    device: Optional[str] = typer.Option(None, help="with --check: cpu, cuda or cuda:N"),
    as_json: bool = typer.Option(False, "--json"),
):
    """List the built-in suites and tasks; with --check, flag degenerate ones."""
    from kernelcraft.task import TIERS, TaskError, builtin_names, load_task

    if check:
        _check_tasks(paths or [n for t in ([tier] if tier else ["tiny"]) for n in builtin_names(t, level)],
                     device, as_json)
        return
    if show_source:
        try:
            out.print(load_task(show_source).source, markup=False, highlight=False)
        except TaskError as e:
            _usage_error(str(e))
        return
    tiers = [tier] if tier else list(TIERS)
    if tier and tier not in TIERS:
        _usage_error(f"--tier must be one of {', '.join(TIERS)}")
    rows = []
    for t in tiers:
        for name in builtin_names(t, level):
            task = load_task(name)
            doc = _first_docstring(task.source)
            rows.append({"name": name, "tier": t, "level": task.level, "summary": doc})
    if as_json:
        _print_json({"tasks": rows})
        return
    table = Table(title="built-in tasks (suite/level/name)")
    for col in ("name", "level", "summary"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["name"], str(r["level"]), r["summary"])
    out.print(table)
    out.print(f"{len(rows)} tasks. Sizes: 'gpu' tier for GPUs, 'tiny' tier runs in seconds on a CPU.")


def _check_tasks(names: list[str], device: Optional[str], as_json: bool) -> None:
    from kernelcraft.evaluate import check_task
    from kernelcraft.task import TaskError

    results = []
    for name in names:
        try:
            results.append(check_task(name, device=device))
        except (TaskError, ValueError) as e:
            _usage_error(str(e))
        r = results[-1]
        if not as_json:
            mark = "[green]ok[/green]" if r["ok"] else "[red]DEGENERATE[/red]"
            out.print(f"{mark}  {r['task']}" + (f"  — {'; '.join(r['problems'])}" if r["problems"] else ""))
    if as_json:
        _print_json({"checked": len(results), "degenerate": [r for r in results if not r["ok"]],
                     "results": results})
    else:
        bad = sum(not r["ok"] for r in results)
        out.print(f"{len(results)} checked, {bad} degenerate")


def _first_docstring(source: str) -> str:
    import ast

    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name == "Model":
            return (ast.get_docstring(node) or "").strip().splitlines()[0] if ast.get_docstring(node) else ""
    return ""


# ---- optimize / report (issue 4) -----------------------------------------------------------------

class _OptimizeProgress:
    """Renders `kernelcraft.optimize` events on stderr: one line per verdict, a live status line."""

    def __init__(self, budget):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.budget, self.best, self.ok, self.bad, self.threshold = budget, None, 0, 0, 1.0
        self.progress = Progress(TextColumn("[bold]optimize[/bold]"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.description}"), TimeElapsedColumn(), console=console,
                                 transient=True)
        self.bar = self.progress.add_task("", total=budget)

    def _status(self) -> str:
        best = f"best {self.best:.2f}x" if self.best else "best —"
        return f"{best} · [green]{self.ok} correct[/green] · [red]{self.bad} failed[/red]"

    def __call__(self, kind: str, **d) -> None:
        from rich.markup import escape

        if kind == "start":
            self.progress.start()
            console.print(f"{'resuming' if d['resumed'] else 'starting'}: {d['device']} · {d['jobs']} job(s)"
                          + (f" · re-queued {len(d['requeued'])} in-flight" if d["requeued"] else ""))
            self.progress.update(self.bar, completed=d["candidates"])
        elif kind == "round":
            self.progress.update(self.bar, advance=d["new"])
            console.print(f"[dim]round {d['round']}: {d['new']} new candidate(s)"
                          + (f", {d['duplicates']} duplicate(s) skipped" if d["duplicates"] else "") + "[/dim]")
        elif kind == "verdict":
            tech = escape(", ".join(d["techniques"]) or "-")
            if d["status"] == "correct":
                self.ok += 1
                lo, hi = d["ci95"]
                faster = lo is not None and lo > self.threshold
                if faster and (self.best is None or d["speedup"] > self.best):
                    self.best = d["speedup"]
                console.print(f"  #{d['id']} [green]correct[/green] {d['speedup']:.2f}x "
                              f"[dim][{lo:.2f}–{hi:.2f}][/dim] {'' if faster else '[dim](not verified faster)[/dim] '}"
                              f"{tech}", highlight=False)
            else:
                self.bad += 1
                console.print(f"  #{d['id'] or '-'} [red]{d['status']}[/red] {tech}  [dim]{escape(d['message'])}[/dim]",
                              highlight=False)
        elif kind == "control":
            sp = f"{d['speedup']:.3f}x" if d.get("speedup") else d.get("status")
            biased = d.get("status") == "correct" and (d.get("ci95") or [0])[0] > 1.0
            if biased:
                self.threshold = max(self.threshold, d["speedup"])
            console.print(f"null control (the reference timed against itself): {sp}"
                          + (" — a timing bias: candidates must beat this" if biased else ""))
        elif kind == "confirm":
            sp = f"{d['speedup']:.2f}x" if d["speedup"] else d["status"]
            console.print(f"  confirmed #{d['id']} in a fresh worker: {sp}")
        elif kind == "done":
            self.progress.stop()
        self.progress.update(self.bar, description=self._status())


@app.command("optimize")
def optimize_cmd(
    task: str = typer.Argument(..., help="task file or built-in name (see `kernelcraft tasks`)"),
    policy: str = typer.Option("recipes", help="recipes (offline) | openai:MODEL | hf:PATH"),
    budget: int = typer.Option(16, min=1, help="candidates in the run (counted across resumes)"),
    time_limit: Optional[float] = typer.Option(None, help="stop proposing after this many seconds"),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="run directory (default runs/<task>); "
                                           "re-running with the same --out resumes"),
    device: Optional[str] = typer.Option(None, help="cpu, cuda or cuda:N (default: cuda if visible)"),
    k: int = typer.Option(4, "-k", "--proposals", min=1, help="proposals per round"),
    jobs: Optional[int] = typer.Option(None, min=1, help="evaluations in parallel (default: 1 on small CPUs)"),
    patience: int = typer.Option(3, min=0, help="stop after this many rounds without improvement (0: never)"),
    exemplars: int = typer.Option(2, min=1, help="exemplars shown per proposal"),
    tau: float = typer.Option(1.0, help="temperature of the contrastive bucket draw"),
    selector: str = typer.Option("contrastive", help="contrastive | random"),
    seed: int = typer.Option(0, help="seed of the search's random choices"),
    trials: int = typer.Option(5, min=1, help="correctness trials per candidate"),
    atol: Optional[float] = typer.Option(None, help="absolute tolerance (default per dtype)"),
    rtol: Optional[float] = typer.Option(None, help="relative tolerance (default per dtype)"),
    mode: str = typer.Option("open", help="open | strict (strict: own kernel required)"),
    eval_time: Optional[float] = typer.Option(None, help="timing budget per candidate, s (default 1 cpu / 2 gpu)"),
    confirm: int = typer.Option(2, min=0, help="leaders re-timed in a fresh worker before one is called best"),
    min_speedup: float = typer.Option(1.0, help="a win needs its 95% CI above this (and above the null control)"),
    null_control: bool = typer.Option(True, "--null-control/--no-null-control",
                                      help="time the reference against itself first; its speedup raises the bar"),
    allow_precision_change: bool = typer.Option(False, "--allow-precision-change",
                                                help="let recipes use bf16 autocast (pass --atol/--rtol to match)"),
    skip: Optional[str] = typer.Option(None, help="recipes never to use, comma-separated tokens or prefixes "
                                       "(e.g. compile, cudagraph, rewrite:inplace)"),
    backend: str = typer.Option("any", help="what LLM policies are asked to write: any | cuda | triton | pytorch"),
    base_url: Optional[str] = typer.Option(None, help="OpenAI-compatible endpoint (default $OPENAI_BASE_URL)"),
    api_key: Optional[str] = typer.Option(None, help="API key (default $OPENAI_API_KEY)"),
    temperature: float = typer.Option(0.7, help="LLM sampling temperature"),
    max_tokens: int = typer.Option(8192, help="LLM max tokens per reply"),
    as_json: bool = typer.Option(False, "--json", help="print the run summary as JSON (last line)"),
):
    """Search for a faster ModelNew: propose, verify, repeat; writes OUT/best.py for a verified win."""
    from kernelcraft.optimize import Options, RunInUse, optimize
    from kernelcraft.policies import PolicyError
    from kernelcraft.task import TaskError, load_task

    if mode not in ("open", "strict"):
        _usage_error(f"--mode must be open or strict, not {mode!r}")
    if selector not in ("contrastive", "random"):
        _usage_error(f"--selector must be contrastive or random, not {selector!r}")
    try:
        t = load_task(task)
    except TaskError as e:
        _usage_error(str(e))
    out_dir = out_dir or Path("runs") / t.stem
    opts = Options(policy=policy, budget=budget, time_limit_s=time_limit, k=k, jobs=jobs, patience=patience or None,
                   exemplars=exemplars, tau=tau, selector=selector, seed=seed, device=device, trials=trials,
                   atol=atol, rtol=rtol, mode=mode, eval_time_s=eval_time, confirm=confirm, min_speedup=min_speedup,
                   null_control=null_control,
                   allow_precision_change=allow_precision_change, backend=backend,
                   policy_options=dict(base_url=base_url, api_key=api_key, temperature=temperature,
                                       max_tokens=max_tokens, concurrency=k, skip=skip or ()))
    try:
        res = optimize(t, out_dir, opts, on_event=_OptimizeProgress(budget))
    except (TaskError, ValueError, PolicyError, RunInUse) as e:
        _usage_error(str(e))
    except KeyboardInterrupt:
        console.print(f"[yellow]interrupted[/yellow]: re-run the same command to resume from {out_dir}")
        raise typer.Exit(130)
    if as_json:
        _print_json(res.to_json())
        return
    color = {"improved": "green", "no_improvement": "yellow"}.get(res.status, "red")
    out.print(f"[bold]{res.task}[/bold]: [bold {color}]{res.status}[/bold {color}] after {res.candidates} candidates "
              f"({res.correct} correct, {res.failed} failed, {res.parse_errors} parse errors; stopped: {res.stopped})")
    if res.best_path:
        lo, hi = res.best_ci95
        out.print(f"best: [bold]{res.best_speedup:.2f}x[/bold] (95% CI {lo:.2f}–{hi:.2f}"
                  f"{', confirmed in a fresh worker' if res.confirmed else ''}) — {', '.join(res.best_techniques)}")
        out.print(f"wrote {res.best_path}")
    else:
        out.print("no candidate was verified faster than the reference: no best.py written")
    out.print(f"report: kernelcraft report {res.run_dir}")


# ---- bench (issue 5) -----------------------------------------------------------------------------

class _BenchProgress:
    """Renders bench events: a progress bar with ETA on stderr, one line per result. Thread-safe: with
    `--task-jobs` above 1 the optimize runs' events come from their own threads (one lock around it all)."""

    def __init__(self, quiet: bool = False):
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                   TimeRemainingColumn)

        self.quiet = quiet
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=console,
                                 transient=True)
        self.bar = None
        self.ok = self.bad = 0
        self.tag = False  # several tasks optimized at once: optimize lines name their task
        self._lock = threading.Lock()

    def __call__(self, kind: str, **d) -> None:
        with self._lock:
            self._render(kind, d)

    def _render(self, kind: str, d: dict) -> None:
        from rich.markup import escape

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
            if d["status"] == "correct":
                self.ok += d["what"] == "item"
                line = f"[green]correct[/green] {d['speedup']:.3f}x" if d["speedup"] else "[green]correct[/green]"
            else:
                self.bad += d["what"] == "item"
                line = f"[red]{escape(d['status'])}[/red] [dim]{escape(d['message'][:120])}[/dim]"
            if not self.quiet:
                console.print(f"  {escape(d['name'])}: {line}", highlight=False)
            self.progress.update(self.bar, advance=1,
                                 description=f"[green]{self.ok} correct[/green] · [red]{self.bad} failed[/red]")
        elif kind == "optimize_start":
            console.print(f"  optimizing {escape(d['name'])} → {escape(d['run_dir'])}", highlight=False)
        elif kind == "optimize" and not self.quiet:
            e, x = d["event"], d["data"]
            who = f"{escape(d['name'])}: " if self.tag else ""
            if e == "verdict":
                sp = f" {x['speedup']:.2f}x" if x.get("speedup") else ""
                console.print(f"[dim]    {who}candidate #{x.get('id') or '-'} {escape(x['status'])}{sp}[/dim]",
                              highlight=False)
            elif e == "done":
                console.print(f"[dim]    {who}optimize: {escape(x['status'])} after {x['candidates']} candidate(s)"
                              + ("; judging best.py afresh" if x.get("best_path") else "") + "[/dim]",
                              highlight=False)
        elif kind == "done":
            self.progress.stop()

    def stop(self) -> None:
        with self._lock:
            self.progress.stop()


def _bench_table(s: dict) -> None:
    if s.get("baselines_only"):
        t = Table(title=f"baselines — {s['source']} ({s['tasks']} tasks, {s['device']})")
        for c in ("baseline", "correct", "geomean vs eager", "median vs eager", "fast_1", "fast_2"):
            t.add_column(c, justify="left" if c == "baseline" else "right")
        for name, m in s["baselines"]["summary"].items():
            if name == "eager":
                continue
            fp = m["fast_p"] or {}
            t.add_row(name, f"{m['correct']}/{m['tasks']}", _fx(m["geomean_speedup_correct"]),
                      _fx(m["median_speedup_correct"]), _fpct(fp.get("1")), _fpct(fp.get("2")))
        out.print(t)
        return
    keys = list(s["fast_p"])
    t = Table(title=f"bench — {s['source']} ({s['device']})")
    for c in ["scope", "tasks", "ok"] + [f"f{k}" for k in keys] + ["geomean", "median", "geo ok"]:
        t.add_column(c, justify="left" if c == "scope" else "right")
    rows = [("all", s, "")] + ([("all/compile", s, "_vs_compile")] if s.get("fast_p_vs_compile") else [])
    for lv, m in s["by_level"].items():
        rows.append((f"L{lv}", m, ""))
        if m.get("fast_p_vs_compile"):
            rows.append((f"L{lv}/compile", m, "_vs_compile"))
    for label, m, sfx in rows:
        fp = m[f"fast_p{sfx}"]
        t.add_row(label, str(m["tasks"]), str(m["correct"]), *[_fpct(fp[k]) for k in keys],
                  _fx(m[f"geomean_speedup{sfx}"]), _fx(m[f"median_speedup{sfx}"]), _fx(m[f"geomean_speedup{sfx}_correct"]))
    out.print(t)
    out.print("[dim]fP: correct and speedup > P, over all tasks · geomean/median: all tasks, failures as 1.0 · "
              "geo ok: correct tasks only · /compile: against each task's best correct torch.compile baseline[/dim]")
    st = ", ".join(f"{k} {v}" for k, v in sorted(s["statuses"].items(), key=lambda kv: -kv[1]))
    out.print(f"statuses: {st}" + (f" · [red]{s['input_errors']} input error(s) not scored[/red]"
                                    if s["input_errors"] else ""), highlight=False)


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _fx(v) -> str:
    return "—" if v is None else f"{v:.2f}x"


def _fpct(v) -> str:
    return "—" if v is None else f"{100 * v:.0f}%"


@app.command("bench")
def bench_cmd(
    source: str = typer.Argument(..., help="built-in suite (gpu, tiny, gpu/level1, level2, ...), a directory of "
                                 "KernelBench task files, or a pairs JSONL (ref_code, custom_code per line)"),
    device: Optional[str] = typer.Option(None, help="cpu, cuda or cuda:N (default: cuda if visible)"),
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
    trials: int = typer.Option(5, min=1, help="correctness trials per evaluation"),
    eval_time: Optional[float] = typer.Option(None, help="timing budget per evaluation, s (default 1 cpu / 2 gpu)"),
    timeout: float = typer.Option(180.0, help="seconds allowed per evaluation after the build"),
    atol: Optional[float] = typer.Option(None, help="absolute tolerance (default per dtype)"),
    rtol: Optional[float] = typer.Option(None, help="relative tolerance (default per dtype)"),
    mode: str = typer.Option("open", help="open | strict (strict: own kernel required)"),
    remeasure_above: float = typer.Option(3.0, help="speedups above this are re-measured in fresh workers (0: never)"),
    jobs: Optional[int] = typer.Option(None, min=1, help="evaluations at once per device (default: 1 on small CPUs "
                                       "and per GPU)"),
    task_jobs: Optional[int] = typer.Option(None, "--task-jobs", min=1,
                                            help="tasks optimized at once when no candidates are given (default 1; "
                                            "more pays when proposals wait on an LLM endpoint, not with recipes)"),
    limit: Optional[int] = typer.Option(None, min=1, help="only the first N items"),
    baselines_only: bool = typer.Option(False, "--baselines-only", help="measure the baselines only (no candidates, "
                                        "no optimize)"),
    baseline_cache: bool = typer.Option(True, "--baseline-cache/--no-baseline-cache",
                                        help="reuse baseline measurements cached for this task/device/torch/protocol"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no line per result (progress bar and summary only)"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as JSON (last line)"),
):
    """Bench a suite: verdicts for every task, fast_p and speedups against eager and torch.compile baselines."""
    from kernelcraft.bench import BenchError, BenchOptions, Interrupted, default_out, resolve, run
    from kernelcraft.evaluate import _resolve_device

    if mode not in ("open", "strict"):
        _usage_error(f"--mode must be open or strict, not {mode!r}")
    try:
        dev, _ = _resolve_device(device)
        src = resolve(source, device=dev, candidates=candidates)
    except (BenchError, ValueError) as e:
        _usage_error(str(e))
    opts = BenchOptions(device=dev, baselines=baselines, trials=trials, eval_time_s=eval_time, timeout_s=timeout,
                        mode=mode, atol=atol, rtol=rtol, remeasure_above=remeasure_above or None, jobs=jobs,
                        limit=limit, baselines_only=baselines_only, baseline_cache=baseline_cache, policy=policy,
                        budget=budget, task_jobs=task_jobs,
                        optimize_options={"time_limit_s": time_limit} if time_limit else {})
    out_dir = out_dir or default_out(src)
    progress = _BenchProgress(quiet)
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)  # `timeout 500 kernelcraft bench` stops like Ctrl-C
    try:
        summary = run(src, out_dir, opts, on_event=progress)
    except BenchError as e:
        progress.stop()
        _usage_error(str(e))
    except (Interrupted, KeyboardInterrupt) as e:
        progress.stop()
        kept = (f"{e.done} finished verdict(s) kept in {out_dir}/verdicts.jsonl"
                + (f", {e.baselines} new baseline verdict(s) in baselines.jsonl" if e.baselines else "")
                if isinstance(e, Interrupted) else f"finished verdicts kept in {out_dir}")
        console.print(f"[yellow]interrupted[/yellow]: {kept}; re-run the same command to resume")
        raise typer.Exit(130) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    if as_json:
        _print_json({k: v for k, v in summary.items() if k != "items"})
        return
    _bench_table(summary)
    for n in summary["notes"]:
        out.print(f"note: {n}", highlight=False, markup=False)
    out.print(f"verdicts: {summary['verdicts']}" + (f" · report: {summary['report']}" if summary.get("report") else ""),
              highlight=False)


@app.command("report")
def report_cmd(
    run_dir: Path = typer.Argument(..., help="a run directory written by `kernelcraft optimize`"),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="HTML file (default RUN_DIR/report.html)"),
    as_json: bool = typer.Option(False, "--json", help="print {report, summary} as JSON (last line)"),
):
    """Write a self-contained HTML report of an optimisation run."""
    from kernelcraft.report import summary_json, write_report

    try:
        path = write_report(run_dir, output)
    except FileNotFoundError as e:
        _usage_error(str(e))
    if as_json:
        _print_json({"report": str(path), "summary": summary_json(run_dir)})
    else:
        out.print(f"wrote {path}")


# ---- serve (issue 6) -----------------------------------------------------------------------------

@app.command("serve")
def serve_cmd(
    host: str = typer.Option("127.0.0.1", help="address to bind (loopback unless told otherwise)"),
    port: int = typer.Option(8000, min=0, max=65535),
    workers: Optional[int] = typer.Option(None, min=1, help="timing slots per device (default: 2 on cpu; on GPUs "
                                          "1, or 2 when the worker can hold the GPU from init to timing)"),
    build_workers: Optional[int] = typer.Option(None, min=1, help="CPU build slots (default: one per core)"),
    device: Optional[str] = typer.Option(None, help="cpu or cuda (default: all visible GPUs, else cpu)"),
    cluster: Optional[str] = typer.Option(None, help="run slots as Ray actors: 'ray' (local) or a Ray address"),
    cache_dir: Optional[Path] = typer.Option(None, help="build cache (default $KERNELCRAFT_CACHE, "
                                             "else ~/.cache/kernelcraft)"),
    max_body_mb: float = typer.Option(8.0, help="largest request body accepted, MiB (413 above)"),
    max_batch: int = typer.Option(512, min=1, help="most items in one batch request"),
    sandbox: Optional[str] = typer.Option(None, help="auto | bwrap | rlimits | off (default $KERNELCRAFT_SANDBOX, "
                                          "else auto: bwrap where it works)"),
    insecure_no_auth: bool = typer.Option(False, "--insecure-no-auth", help="serve without an API key (loopback only)"),
    log_level: str = typer.Option("info", help="uvicorn log level"),
):
    """Serve evaluations over HTTP for RL trainers (needs KERNELCRAFT_API_KEY and the `serve` extra)."""
    from kernelcraft.sandbox import SandboxError
    from kernelcraft.service import ServiceConfigError, serve

    if device not in (None, "cpu", "cuda"):
        _usage_error(f"--device must be cpu or cuda, not {device!r}")
    try:
        serve(host=host, port=port, devices=device, per_device=workers, build_workers=build_workers, cluster=cluster,
              cache_dir=cache_dir, max_body_bytes=int(max_body_mb * (1 << 20)), max_batch=max_batch, sandbox=sandbox,
              insecure_no_auth=insecure_no_auth, log_level=log_level)
    except (ServiceConfigError, SandboxError, ValueError, ImportError) as e:
        _usage_error(str(e))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
