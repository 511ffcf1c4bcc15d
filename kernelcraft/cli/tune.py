"""`kernelcraft tune`: the schedule game on a task's Triton template, its best configurations judged."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer

from kernelcraft import devices
from kernelcraft.cli import checks
from kernelcraft.cli.common import app, console, out, print_json, usage_error, with_protocol
from kernelcraft.protocol import Protocol
from kernelcraft.search.optimize import RunInUse
from kernelcraft.task import TaskError



def _progress(kind: str, **d) -> None:
    if kind == "match":
        console.print(f"kernel {d['kernel']} at {d['shape']}: {d['configs']} valid configurations, "
                      f"budget {d['budget']} measurements")
    elif kind == "compile":
        console.print(f"[dim]compiling {d['configs']} configurations "
                      f"({'compiled features; ' if d.get('features', True) else ''}no measurement)[/dim]")
    elif kind == "search":
        console.print(f"playing: {d['agent']}" + (" with the cost model" if d["cost_model"] else " (no cost model yet)"))
    elif kind == "measured":
        console.print(f"{d['measurements']} measurements; best {d['best']:.3f}x over the reference in the fast path: "
                      f"{d['config']} (cost model {d['retrained']})")
    elif kind == "judge_verdict":
        sp = f"{d['speedup']:.3f}x" if d.get("speedup") else d.get("status")
        console.print(f"  judged #{d['id']}: {sp}")
    elif kind == "judge_confirm":
        sp = f"{d['speedup']:.3f}x" if d.get("speedup") else d.get("status")
        console.print(f"  confirmed #{d['id']} in a fresh worker: {sp}")


@app.command("tune")
@with_protocol
def tune_cmd(
    task: str = typer.Argument(..., help="task file or built-in name: a GEMM + elementwise epilogue, or a row "
                               "softmax/norm over the last dimension"),
    agent: str = typer.Option("ppo", help="ppo | random | model-ranked | exhaustive | shortlist"),
    budget: Optional[int] = typer.Option(None, min=1, help="measurements (default: --budget-share of the space)"),
    budget_share: float = typer.Option(0.25, help="default budget as a share of the valid configurations, in (0, 1]"),
    keep: int = typer.Option(2, min=0, help="best configurations judged by the full evaluator (0: none; the fast "
                                            "path's best is recorded, labelled as not judged)"),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="run directory (default runs/tune-<task>)"),
    device: str = typer.Option("cuda", help="CUDA device to tune on (cuda or cuda:N; tune needs a GPU)"),
    store: Optional[Path] = typer.Option(None, help="measurements and cost models (default ~/.cache/kernelcraft/tune)"),
    rounds: int = typer.Option(5, min=1, help="paired timing rounds per measurement"),
    workers: Optional[int] = typer.Option(None, min=1, help="compile processes (default: cores - 1)"),
    seed: int = typer.Option(0, help="seed of the agent"),
    confirm: int = typer.Option(1, min=0, help="leaders re-timed in a fresh worker before one is called best"),
    as_json: bool = typer.Option(False, "--json", help="print the result as JSON (last line)"),
    protocol: Protocol = None,
):
    """Tune a Triton template for TASK (schedule game + cost model), then judge the best configurations."""
    from kernelcraft.tune.tuner import TuneError, TuneOptions, tune

    if not 0 < budget_share <= 1:
        usage_error(f"--budget-share must be in (0, 1], not {budget_share:g}")
    _check_device(device, task)
    t = checks.load_task(task)
    opts = TuneOptions(device=device, agent=agent, budget=budget, budget_share=budget_share, keep=keep, seed=seed,
                       rounds=rounds, store=str(store) if store else None, workers=workers, confirm=confirm,
                       protocol=protocol)
    out_dir = out_dir or Path("runs") / f"tune-{t.stem}"
    with checks.no_leftovers(out_dir):
        checks.out_dir(out_dir)
        try:
            res = tune(t, out_dir, opts, on_event=_progress)
        except (TuneError, TaskError, RunInUse) as e:
            usage_error(str(e))
    if as_json:
        print_json(res.to_json())
        return
    run = res.run
    if run is None:
        out.print(f"[bold]{res.task}[/bold]: {res.measurements}/{res.configs} configurations measured by {res.agent}; "
                  f"best {res.best_fast_speedup:.3f}x in the fast path, not judged (--keep 0)")
    else:
        out.print(f"[bold]{res.task}[/bold]: {res.measurements}/{res.configs} configurations measured by {res.agent}; "
                  f"judged: [bold]{run['status']}[/bold]"
                  + (f", best {run['best_speedup']:.2f}x ({run['best_path']})" if run.get("best_path") else ""))
    if res.tuned_store:
        out.print(f"tuned configuration recorded in {res.tuned_store}")


def _check_device(device: str, task: str) -> None:
    """Tune measures Triton kernels on a CUDA GPU: a CPU, or a GPU that is not there, is a usage error that says
    where tune runs (Triton's CPU interpreter, TRITON_INTERPRET=1, runs the plumbing's tests only)."""
    on_a_cpu = f"on a CPU, `kernelcraft optimize {task} --device cpu` searches at the PyTorch level instead"
    if devices.kind(device) != "cuda":
        if os.environ.get("TRITON_INTERPRET") == "1":
            return
        usage_error(f"--device {device}: kernelcraft tune measures Triton kernels on a CUDA GPU (--device cuda or "
                    f"cuda:N on a GPU host); {on_a_cpu}")
    try:
        devices.resolve(device)
    except ValueError as e:
        usage_error(f"{e}: kernelcraft tune measures Triton kernels on a CUDA GPU, so run it on a GPU host "
                    f"(--device cuda or cuda:N); {on_a_cpu}")
