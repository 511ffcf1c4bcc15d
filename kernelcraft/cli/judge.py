"""`kernelcraft eval` (one verdict) and `kernelcraft tasks` (the built-in suite, degenerate-task checks)."""
from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Optional

import typer

from kernelcraft.cli import checks
from kernelcraft.cli.common import (DEVICE, app, console, out, print_json, table, tier_notice, usage_error,
                                    with_protocol)
from kernelcraft.evaluate import check_task, evaluate
from kernelcraft.protocol import Protocol
from kernelcraft.task import TIERS, TaskError, builtin_names, load_task


def _verdict_panel(v) -> None:
    color = {"correct": "green", "incorrect": "red", "rejected": "magenta"}.get(v.status, "yellow")
    out.print(f"[bold]{v.task}[/bold]  candidate {v.candidate_sha256[:12]}  on {v.device}")
    out.print(f"status: [bold {color}]{v.status}[/bold {color}]"
              + (f"  reasons: {', '.join(v.reasons)}" if v.reasons else ""))
    if v.correctness:
        c = v.correctness
        out.print(f"correctness: {c.passed}/{c.trials} trials, max abs err {c.max_abs_err:.3g}, "
                  f"max rel err {c.max_rel_err:.3g} (atol {c.atol}, rtol {c.rtol})")
        if c.rule == "calibrated" and c.err_ratio is not None:
            out.print(f"precision: calibrated against float64, error {c.cand_err:.3g} vs the reference's "
                      f"{c.ref_err:.3g} (used {c.err_ratio:.2f} of the allowed {c.precision_factor:g}x)")
        if c.rule_note:
            out.print(f"precision: {c.rule_note}")
    if v.timing:
        t = v.timing
        out.print(f"timing: reference {t.ref_ms:.4f} ms, candidate {t.cand_ms:.4f} ms, "
                  f"speedup [bold]{t.speedup:.3f}x[/bold] (95% CI {t.ci95[0]:.3f}–{t.ci95[1]:.3f}, where a re-run "
                  f"would read it{_within(t)}; {t.samples} paired samples{'' if t.converged else ', CI target not reached'})")
    if v.message:
        out.print(v.message, markup=False, highlight=False)
    out.print(f"build {v.build_s:.1f} s, wall {v.wall_s:.1f} s")


def _within(t) -> str:
    """This run's own interval, when the reported one was widened beyond it (judge/speed/reproduce.py)."""
    if not t.within_ci95 or tuple(t.within_ci95) == tuple(t.ci95):
        return ""
    return f"; this run's rounds alone {t.within_ci95[0]:.3f}–{t.within_ci95[1]:.3f}"


@app.command("eval")
@with_protocol
def eval_cmd(
    task: str = typer.Argument(..., help="task file, built-in name (see `kernelcraft tasks`)"),
    candidate: Path = typer.Argument(..., help="candidate file defining ModelNew"),
    device: Optional[str] = DEVICE,
    no_timing: bool = typer.Option(False, "--no-timing", help="check correctness only"),
    as_json: bool = typer.Option(False, "--json", help="print the verdict record as JSON (last line)"),
    protocol: Protocol = None,
):
    """Judge one candidate against a task: correctness, then a trustworthy speedup."""
    t = checks.load_task(task)
    checks.readable_file(candidate, "candidate")
    checks.device(device)
    try:
        tier_notice(task, t, device)
        v = evaluate(task, candidate, protocol=protocol.with_(timing=False) if no_timing else protocol, device=device)
    except (TaskError, ValueError, FileNotFoundError) as e:
        usage_error(str(e))
    if as_json:
        print_json(v.to_json())
    else:
        _verdict_panel(v)
    if v.timing and v.timing.note:
        _noise_note(v)


def _noise_note(v) -> None:
    """The judge's wide-interval note: a warning where the interval leaves the verdict open (it straddles 1x); a
    note where it lies wholly on one side of 1x, whose answer (faster or slower) stands and whose size does not."""
    note, (lo, hi) = v.timing.note, v.timing.ci95
    if v.status != "correct" or not lo or lo <= 1.0 <= hi:
        console.print(f"warning: {note}", style="yellow", markup=False, highlight=False)
        return
    advice = note.split("; ", 1)[1] if note.startswith("host too noisy: ") and "; " in note else note
    side, word = ("above", "faster") if lo > 1.0 else ("below", "slower")
    console.print(f"note: the speedup's 95% CI {lo:.3g}–{hi:.3g} lies wholly {side} 1x: the candidate is {word} "
                  f"beyond the timing noise, but the interval is wide (x{hi / lo:.2f}), so how much is uncertain here; "
                  f"for a tighter number: {advice}", markup=False, highlight=False)


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
    if tier and tier not in TIERS:
        usage_error(f"--tier must be one of {', '.join(TIERS)}, not {tier!r}")
    if check:
        names = paths or [n for t in ([tier] if tier else ["tiny"]) for n in builtin_names(t, level)]
        for name in names:  # every name checked before the first reference runs
            checks.load_task(name)
        checks.device(device)
        _check_tasks(names, device, as_json)
        return
    if show_source:
        source = checks.load_task(show_source).source
        sys.stdout.write(source if source.endswith("\n") else source + "\n")  # verbatim: it is a Python file
        return
    tiers = [tier] if tier else list(TIERS)
    rows = []
    for t in tiers:
        for name in builtin_names(t, level):
            task = load_task(name)
            doc = _first_docstring(task.source)
            rows.append({"name": name, "tier": t, "level": task.level, "summary": doc})
    if as_json:
        print_json({"tasks": rows})
        return
    t = table("built-in tasks (suite/level/name)", [("name", "left"), ("level", "right"), ("summary", "left")])
    for r in rows:
        t.add_row(r["name"], str(r["level"]), r["summary"])
    out.print(t)  # words wrap: a narrow terminal folds the summaries
    out.print(f"{len(rows)} tasks. Sizes: 'gpu' tier for GPUs, 'tiny' tier runs in seconds on a CPU.")


def _check_tasks(names: list[str], device: Optional[str], as_json: bool) -> None:
    results = []
    for name in names:
        try:
            results.append(check_task(name, device=device))
        except (TaskError, ValueError) as e:
            usage_error(str(e))
        r = results[-1]
        if not as_json:
            mark = "[green]ok[/green]" if r["ok"] else "[red]DEGENERATE[/red]"
            out.print(f"{mark}  {r['task']}" + (f"  — {'; '.join(r['problems'])}" if r["problems"] else ""))
    if as_json:
        print_json({"checked": len(results), "degenerate": [r for r in results if not r["ok"]],
                     "results": results})
    else:
        out.print(f"{len(results)} checked, {sum(not r['ok'] for r in results)} degenerate")
    if any(not r["ok"] for r in results):
        raise typer.Exit(1)  # scripts can tell a flagged task from a clean run


def _first_docstring(source: str) -> str:
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name == "Model":
            return (ast.get_docstring(node) or "").strip().splitlines()[0] if ast.get_docstring(node) else ""
    return ""


