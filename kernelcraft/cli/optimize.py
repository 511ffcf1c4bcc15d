"""`kernelcraft optimize`: the search, with live progress.

Nothing long happens without a word on stderr: what a resume picks up, every verdict as it lands, why the run
stopped, and Ctrl-C the moment it arrives (finished results stay in OUT/run.db, exit 130).
Rationale: docs/design/cli.md#optimize
"""
from __future__ import annotations

import threading

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kernelcraft.cli import checks
from kernelcraft.cli.common import (DEVICE, app, console, out, print_json, tier_notice, usage_error,
                                    with_protocol)
from kernelcraft.protocol import Protocol
from kernelcraft.cli.interrupt import EXIT_INTERRUPTED, Interrupts
from kernelcraft.search import fallback
from kernelcraft.search.optimize import Cancelled, Options, RunInUse, optimize
from kernelcraft.search.policies import PolicyError
from kernelcraft.task import TaskError


class _OptimizeProgress:
    """Renders `kernelcraft.search.optimize` events on stderr: one line per verdict, a live status line."""

    def __init__(self, budget, bar: float = 1.0):
        self.budget, self.best, self.ok, self.bad, self.threshold = budget, None, 0, 0, bar
        self.progress = Progress(TextColumn("[bold]optimize[/bold]"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.description}"), TimeElapsedColumn(), console=console,
                                 transient=True)
        self.bar = self.progress.add_task("", total=budget)
        self.running: dict = {}  # what is being evaluated now: key -> label
        self.done = 0

    def interrupted(self) -> str:
        running = list(self.running.values())  # a copy: evaluation threads change it
        n = len(running)
        return (f"stopping {n} running evaluation{'s' if n != 1 else ''}"
                + (f" ({', '.join(running)})" if n else "") + "; finished results are kept")

    def _status(self) -> str:
        best = f"best {self.best:.2f}x" if self.best else "best —"
        return f"{best} · [green]{self.ok} correct[/green] · [red]{self.bad} failed[/red]"

    def __call__(self, kind: str, **d) -> None:
        if kind == "start":
            self.progress.start()
            self.done = d.get("done", 0)
            head = (f"resuming: {d.get('done', 0)}/{self.budget} candidates done ({d.get('correct', 0)} correct)"
                    if d["resumed"] else "starting")
            console.print(f"{head}: {d['device']} · {d['jobs']} job(s)"
                          + (f" · re-queued {len(d['requeued'])} that were in flight" if d["requeued"] else ""),
                          highlight=False)
            self.progress.update(self.bar, completed=d["candidates"])
        elif kind in ("eval_start", "control_start", "confirm_start"):
            key = d.get("id") if kind == "eval_start" else (kind, d.get("id"))
            self.running[key] = {"eval_start": f"#{d.get('id')}", "control_start": "null control",
                                 "confirm_start": f"confirming #{d.get('id')}"}[kind]
        elif kind == "round":
            self.progress.update(self.bar, advance=d["new"])
            console.print(f"[dim]round {d['round']}: {d['new']} new candidate(s)"
                          + (f", {d['duplicates']} duplicate(s) skipped" if d["duplicates"] else "") + "[/dim]")
        elif kind == "verdict":
            self.running.pop(d["id"], None)
            tech = escape(", ".join(d["techniques"]) or "-")
            if d["status"] == "correct":
                self.ok += 1
                lo, hi = d["ci95"]
                faster = lo is not None and lo > self.threshold
                if faster and (self.best is None or d["speedup"] > self.best):
                    self.best = d["speedup"]
                verdict = ("[green]verified faster[/green]" if faster else
                           f"[yellow]not verified faster[/yellow] [dim](the CI reaches {self.threshold:.2f}x)[/dim]")
                console.print(f"  #{d['id']} correct {d['speedup']:.2f}x [dim][95% CI {lo:.2f}–{hi:.2f}][/dim] "
                              f"{verdict} · {tech}", highlight=False)
            else:
                self.bad += 1
                console.print(f"  #{d['id'] or '-'} [red]{d['status']}[/red] {tech}  [dim]{escape(d['message'])}[/dim]",
                              highlight=False)
        elif kind == "control":
            self.running.pop(("control_start", None), None)
            sp = f"{d['speedup']:.3f}x" if d.get("speedup") else d.get("status")
            biased = d.get("status") == "correct" and (d.get("ci95") or [0])[0] > 1.0
            if biased:
                self.threshold = max(self.threshold, d["speedup"])
            ci = d.get("ci95") or [None, None]
            below = d.get("status") == "correct" and ci[1] is not None and ci[1] < 1.0
            console.print(f"null control (the reference timed against itself): {sp}"
                          + (f" [95% CI {ci[0]:.3f}–{ci[1]:.3f}]" if ci[0] is not None else "")
                          + (f" — a timing bias (its CI lies above 1): a candidate is verified faster only when its CI's "
                             f"lower end is above {self.threshold:.3f}x" if biased else
                             " — warning: below 1 beyond its CI, this host's timings favour the reference, so "
                             "speedups here are understated; re-run when the host is quieter" if below else
                             f" — what timing noise alone reads here; a candidate is verified faster only when its "
                             f"CI's lower end is above {self.threshold:.2f}x" if d.get("status") == "correct" else ""),
                          markup=False, highlight=False)
        elif kind == "confirm":
            self.running.pop(("confirm_start", d.get("id")), None)
            sp = f"{d['speedup']:.2f}x" if d["speedup"] else d["status"]
            console.print(f"  confirmed #{d['id']} in a fresh worker: {sp}")
        elif kind == "done":
            self.progress.stop()
        self.progress.update(self.bar, description=self._status())


@app.command("optimize")
@with_protocol
def optimize_cmd(
    task: str = typer.Argument(..., help="task file or built-in name (see `kernelcraft tasks`)"),
    policy: str = typer.Option("recipes", help="recipes (offline) | openai:MODEL | hf:PATH"),
    budget: int = typer.Option(16, min=1, help="candidates in the run (counted across resumes)"),
    time_limit: Optional[float] = typer.Option(None, help="stop proposing after this many seconds"),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="run directory (default runs/<task>); "
                                           "re-running with the same --out resumes"),
    device: Optional[str] = DEVICE,
    k: int = typer.Option(4, "-k", "--proposals", min=1, help="proposals per round"),
    jobs: Optional[int] = typer.Option(None, min=1, help="evaluations in parallel (default: 1 on small CPUs)"),
    patience: int = typer.Option(3, min=0, help="stop after this many rounds without improvement (0: never)"),
    exemplars: int = typer.Option(2, min=1, help="exemplars shown per proposal"),
    tau: float = typer.Option(1.0, help="temperature of the contrastive bucket draw"),
    selector: str = typer.Option("contrastive", help="contrastive | random"),
    seed: int = typer.Option(0, help="seed of the search's random choices"),
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
    temperature: float = typer.Option(0.7, min=0, help="LLM sampling temperature"),
    max_tokens: int = typer.Option(8192, min=1, help="LLM max tokens per reply"),
    as_json: bool = typer.Option(False, "--json", help="print the run summary as JSON (last line)"),
    protocol: Protocol = None,
):
    """Search for a faster ModelNew: propose, verify, repeat; writes OUT/best.py: a verified win, else a labelled
    fallback (the reference itself, or a correct candidate no slower than it with confidence)."""
    checks.choice(selector, "--selector", ("contrastive", "random"))
    checks.choice(backend, "--backend", ("any", "cuda", "triton", "pytorch"))
    checks.positive(time_limit, "--time-limit", " seconds")
    checks.positive(tau, "--tau")
    checks.positive(min_speedup, "--min-speedup")
    t = checks.load_task(task)
    checks.device(device)
    tier_notice(task, t, device)
    out_dir = out_dir or Path("runs") / t.stem
    policy_options = dict(base_url=base_url, api_key=api_key, temperature=temperature, max_tokens=max_tokens,
                          concurrency=k, skip=skip or ())
    opts = Options(policy=policy, budget=budget, time_limit_s=time_limit, k=k, jobs=jobs, patience=patience or None,
                   exemplars=exemplars, tau=tau, selector=selector, seed=seed, device=device, protocol=protocol,
                   confirm=confirm, min_speedup=min_speedup,
                   null_control=null_control,
                   allow_precision_change=allow_precision_change, backend=backend, policy_options=policy_options)
    progress, cancel = _OptimizeProgress(budget, min_speedup), threading.Event()
    with checks.no_leftovers(out_dir):
        checks.out_dir(out_dir)
        proposer = checks.policy(policy, **policy_options)  # built once, before the run: a bad one is a usage error
        try:
            with Interrupts(cancel, progress.interrupted, console):
                res = optimize(t, out_dir, opts, policy=proposer, on_event=progress, cancel=cancel)
        except (TaskError, ValueError, PolicyError, RunInUse) as e:
            progress.progress.stop()
            usage_error(str(e))
        except (KeyboardInterrupt, Cancelled):
            progress.progress.stop()
            console.print(f"stopped: {_kept(out_dir)}; re-run the same command to resume", highlight=False)
            raise typer.Exit(EXIT_INTERRUPTED) from None
    if as_json:
        print_json(res.to_json())
        return
    color = {"improved": "green", "no_improvement": "yellow"}.get(res.status, "red")
    out.print(f"[bold]{escape(res.task)}[/bold]: [bold {color}]{res.status}[/bold {color}] after {res.candidates} of "
              f"{res.budget} candidates: {_counts(Path(res.run_dir), res)}", highlight=False)
    out.print(f"stopped: {res.stopped} — {escape(res.stopped_detail)}" if res.stopped_detail else
              f"stopped: {res.stopped}", highlight=False)
    if res.best_path:
        lo, hi = res.best_ci95
        out.print(f"best: [bold]{res.best_speedup:.2f}x[/bold] (95% CI {lo:.2f}–{hi:.2f}"
                  f"{', confirmed in a fresh worker' if res.confirmed else ''}) — {', '.join(res.best_techniques)}")
        if res.best_note:
            out.print(f"  {escape(res.best_note)}", highlight=False)
        out.print(f"wrote {res.best_path}")
    elif res.fallback:
        out.print(f"no candidate was verified faster than the reference: {escape(fallback.describe(res.fallback))}",
                  highlight=False)
        out.print(f"wrote {escape(res.fallback['path'])} (a fallback, labelled so in its header)", highlight=False)
    else:
        out.print("no candidate was verified faster than the reference")
    out.print(f"report: kernelcraft report {res.run_dir}")
    out.print(f"[dim]verified faster: correct, and the lower end of the speedup's 95% CI above the bar, here "
              f"{res.bar:.2f}x (--min-speedup, raised to the null control's speedup when the control's CI lies wholly above 1; "
              "the null control is the reference timed against itself) · confirmed: re-timed in a fresh worker with "
              "new inputs, another seed and twice the timing budget, and still verified faster"
              + (f" · fallback: what best.py holds when none is verified faster, {escape(fallback.RULE)}"
                 if res.fallback else "") + "[/dim]", highlight=False)


def _counts(run_dir: Path, res) -> str:
    """The run's candidates in words, each counted once: correct (verified faster or not), incorrect, rejected,
    failed (build error, runtime error, timeout), parse errors."""
    from kernelcraft.search.rundb import RunDB

    with RunDB(run_dir) as db:
        done = db.rows("WHERE state = 'done'")
    correct = sum(r.correct for r in done)
    status = [r.status for r in done if not r.correct]
    incorrect, rejected, parse = (status.count(k) for k in ("incorrect", "rejected", "parse_error"))
    parts = [f"{correct} correct ({res.verified_faster} verified faster, {correct - res.verified_faster} not faster)",
             f"{incorrect} incorrect"] + ([f"{rejected} rejected"] if rejected else []) + [
             f"{len(status) - incorrect - rejected - parse} failed (build, runtime, timeout)", f"{parse} parse error(s)"]
    return ", ".join(parts)


def _kept(out_dir: Path) -> str:
    """What an interrupted run left in its database, in words."""
    from kernelcraft.search.rundb import DB_NAME, RunDB

    if not (out_dir / DB_NAME).is_file():
        return "nothing was evaluated yet"
    with RunDB(out_dir) as db:
        rows = db.rows()
    done = [r for r in rows if r.state == "done"]
    return (f"{len(done)} finished candidate(s) kept in {out_dir / DB_NAME} ({sum(r.correct for r in done)} correct"
            f"{f', {len(rows) - len(done)} queued or interrupted' if len(rows) > len(done) else ''})")
