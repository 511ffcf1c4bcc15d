"""`kernelcraft report DIR`: the HTML page of any directory kernelcraft wrote.

The directory's kind is read from the file each command writes first (`train.json`, `run.db`, `bench.json`,
`table.json` beside runs); a bench's page is rendered again from its `summary.json`. Given `DIR/report.html`,
its directory is meant.
Rationale: docs/design/cli.md#report
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from kernelcraft.cli.common import app, out, print_json, usage_error

def kind_of(run_dir: Path) -> str:
    """'train', 'run', 'bench' or 'learn'; a usage error for a directory kernelcraft did not write."""
    from kernelcraft.search.rundb import DB_NAME
    from kernelcraft.train import report as train_report

    if not run_dir.is_dir():
        usage_error(f"{run_dir}: no such directory" if not run_dir.exists() else f"{run_dir} is not a directory")
    if train_report.is_train_run(run_dir):
        return "train"
    if (run_dir / DB_NAME).is_file():
        return "run"
    if (run_dir / "bench.json").is_file():
        return "bench"
    if (run_dir / "table.json").is_file() and _learn_runs(run_dir):
        return "learn"
    if (run_dir / "tune_measurements.json").is_file():
        usage_error(f"{run_dir} holds a tune run's measurements but no judged candidate yet (no {DB_NAME}): re-run "
                    "its `kernelcraft tune` command to judge them")
    usage_error(f"{run_dir} is not a directory kernelcraft wrote: it holds no {DB_NAME} (optimize, tune), "
                "bench.json (bench) or train.json (train)")


def _learn_runs(run_dir: Path) -> list[Path]:
    from kernelcraft.train import report as train_report

    return sorted(p for p in run_dir.glob("*/seed-*") if train_report.is_train_run(p))


def _learn(run_dir: Path, output: Path | None) -> tuple[Path, dict]:
    from kernelcraft.train import report as train_report

    if output is not None:
        usage_error(f"{run_dir} is a `train learn` experiment, with a page per run: --output does not apply")
    pages = [train_report.write_train_report(p) for p in _learn_runs(run_dir)]
    return run_dir / "ablation.md", {"runs": [str(p) for p in pages]}


def _bench(run_dir: Path, output: Path | None) -> tuple[Path, dict]:
    from kernelcraft.bench.report import write_report

    path = run_dir / "summary.json"
    if not path.is_file():
        runs = sorted(p.parent for p in (run_dir / "runs").glob("*/run.db"))
        usage_error(f"{run_dir} holds a bench that has not finished (no summary.json yet): re-run its `kernelcraft "
                    f"bench` command with --out {run_dir} to finish it, which writes {run_dir / 'report.html'}"
                    + (f"; its optimize runs so far have reports of their own: kernelcraft report {runs[0]}"
                       + (f" (and {len(runs) - 1} more under {run_dir / 'runs'})" if len(runs) > 1 else "")
                       if runs else ""))
    try:
        summary = json.loads(path.read_text())
    except (ValueError, OSError) as e:
        usage_error(f"{path}: not a bench summary ({e})")
    written = write_report(summary, output or run_dir / "report.html")
    return written, {k: v for k, v in summary.items() if k != "items"}


def write(kind: str, run_dir: Path, output: Path | None) -> tuple[Path, dict]:
    """Write `run_dir`'s report (a `kind_of` kind) to `output` (default RUN_DIR/report.html): (path, summary)."""
    if kind == "train":
        from kernelcraft.train import report as train_report

        return train_report.write_train_report(run_dir, output), train_report.summary_json(run_dir)
    if kind == "run":
        from kernelcraft.search.report import summary_json, write_report

        return write_report(run_dir, output), summary_json(run_dir)
    if kind == "learn":
        return _learn(run_dir, output)
    return _bench(run_dir, output)


@app.command("report")
def report_cmd(
    run_dir: Path = typer.Argument(..., help="a directory kernelcraft wrote: an optimize or tune run, a bench, a "
                                   "training run or a `train learn` experiment"),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="HTML file (default RUN_DIR/report.html)"),
    as_json: bool = typer.Option(False, "--json", help="print {report, kind, summary} as JSON (last line)"),
):
    """Write a self-contained HTML report of a run: an optimize or tune run (its candidates), a bench (its
    suite's results), a training run (its curves; a `train learn` experiment: each of its runs)."""
    if run_dir.is_file() and run_dir.suffix == ".html":
        run_dir = run_dir.parent
    kind = kind_of(run_dir)
    if output is not None and output.is_dir():
        usage_error(f"--output {output} is a directory: give the HTML file to write")
    try:
        path, summary = write(kind, run_dir, output)
    except OSError as e:
        usage_error(f"cannot write the report {e.filename or output or run_dir / 'report.html'}: {e.strerror or e}")
    if as_json:
        print_json({"report": str(path), "kind": kind, "summary": summary})
    elif kind == "learn":
        for page in summary["runs"]:
            out.print(f"wrote {page}", highlight=False)
        out.print(f"the experiment's summary: {path}", highlight=False)
    else:
        out.print(f"wrote {path}", highlight=False)
