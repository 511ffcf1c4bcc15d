"""`kernelcraft train`: data, sft, selftrain, grpo, run (all stages), init-model, hack-cases (extra `train`).

Every stage takes the run's YAML config (`kernelcraft/train/config.py`) and resumes what a previous
invocation left: re-running the command after a kill continues it. A bad config or a missing extra is a
usage error (exit 2); the training libraries are imported only when a stage runs.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from kernelcraft.cli import checks
from kernelcraft.cli.common import app, console, out, print_json, usage_error
from kernelcraft.train.config import ConfigError, load_config
from kernelcraft.train.models import TrainError

train_app = typer.Typer(no_args_is_help=True, add_completion=False,
                        help="Train an LLM on the kernelcraft reward: SFT -> self-training -> contrastive GRPO.")
app.add_typer(train_app, name="train")

CONFIG = typer.Argument(..., help="the run's YAML config (docs/train.md)")
OUT = typer.Option(None, "--out", help="run directory (overrides the config's `out`)")


def _load(config: Path, out_dir: Optional[Path]):
    try:
        return load_config(config, out=str(out_dir.resolve()) if out_dir else None)
    except ConfigError as e:
        usage_error(str(e))
    except UnicodeDecodeError as e:
        usage_error(checks.unreadable("config", config, e, expected="a YAML config"))


def _run(fn, *args, out_dir: Path, **kw):
    """`fn(*args, **kw)`, writing into `out_dir`: a usage error leaves nothing there if it was new
    (`checks.no_leftovers`)."""
    with checks.no_leftovers(out_dir):
        try:
            return fn(*args, **kw)
        except (TrainError, ConfigError, ValueError) as e:
            usage_error(str(e))
        except OSError as e:
            usage_error(f"{e.filename}: {e.strerror}" if e.filename and e.strerror else str(e))
        except KeyboardInterrupt:
            console.print("[yellow]interrupted[/yellow]: run the same command again to resume")
            raise typer.Exit(130)


@train_app.command("data")
def data_cmd(config: Path = CONFIG, out_dir: Optional[Path] = OUT,
             as_json: bool = typer.Option(False, "--json", help="print the dataset card as JSON (last line)")):
    """Build the dataset: correct candidates from run databases and judged pairs files, split by task."""
    from kernelcraft.train.pipeline import run_data

    cfg = _load(config, out_dir)
    card = _run(run_data, cfg, out_dir=cfg.out_dir)
    if as_json:
        print_json(card)
        return
    s = card["splits"]
    out.print(f"train {s['train']['examples']} examples ({s['train']['tasks']} tasks), held-out "
              f"{s['heldout']['examples']} ({s['heldout']['tasks']} tasks); {card['duplicates_dropped']} duplicates "
              f"dropped. Card: {cfg.out_dir / 'data' / 'card.md'}")
    for src in card["sources"]:
        out.print(f"  {src['kind']} {src['path']}: {src['examples']} examples", highlight=False)


@train_app.command("sft")
def sft_cmd(config: Path = CONFIG, out_dir: Optional[Path] = OUT):
    """Stage 1: supervised fine-tuning on the train split (TRL SFTTrainer; LoRA with model.lora)."""
    from kernelcraft.train.pipeline import run_sft_stage

    cfg = _load(config, out_dir)
    out.print(f"sft model: {_run(run_sft_stage, cfg, out_dir=cfg.out_dir)}")


@train_app.command("selftrain")
def selftrain_cmd(config: Path = CONFIG, out_dir: Optional[Path] = OUT):
    """Stage 2: sample k per task, judge through the reward service, fine-tune on the correct ones; R rounds."""
    from kernelcraft.train.pipeline import run_selftrain_stage

    cfg = _load(config, out_dir)
    out.print(f"self-trained model: {_run(run_selftrain_stage, cfg, out_dir=cfg.out_dir)}")


@train_app.command("grpo")
def grpo_cmd(config: Path = CONFIG, out_dir: Optional[Path] = OUT):
    """Stage 3: contrastive GRPO (TRL GRPOTrainer) rewarded by the reward service."""
    from kernelcraft.train.pipeline import run_grpo_stage

    cfg = _load(config, out_dir)
    out.print(f"GRPO model: {_run(run_grpo_stage, cfg, out_dir=cfg.out_dir)}")


@train_app.command("run")
def run_cmd(config: Path = CONFIG, out_dir: Optional[Path] = OUT,
            as_json: bool = typer.Option(False, "--json", help="print the stages' models as JSON (last line)")):
    """Every stage in order (data, sft, selftrain, grpo), each resuming what an earlier run left."""
    from kernelcraft.train.pipeline import run_all

    cfg = _load(config, out_dir)
    res = _run(run_all, cfg, out_dir=cfg.out_dir)
    if as_json:
        print_json(res)
    else:
        for k, v in res.items():
            out.print(f"{k}: {v}")


@train_app.command("init-model")
def init_model_cmd(path: Path = typer.Argument(..., help="directory to write the model and tokenizer to"),
                   preset: str = typer.Option("tiny", help="tiny (hidden 64, tests) | 0.5b (~0.5B parameters)"),
                   seed: int = typer.Option(0)):
    """Write a random-weight causal LM from a config, with a tokenizer trained offline (no download)."""
    from kernelcraft.train.models import build_random_model

    out.print(f"wrote {_run(build_random_model, path, preset, seed=seed, out_dir=path)}")


@train_app.command("hack-cases")
def hack_cases_cmd(run_dir: Path = typer.Argument(..., help="a training run directory"),
                   export: Optional[Path] = typer.Option(None, help="write every case as JSON lines here"),
                   label: Optional[str] = typer.Option(None, help="hack | suspicious")):
    """The hack-case table: rejected and suspicious candidates with code, verdict and reason."""
    from kernelcraft.train.hackcases import LABELS, HackCases

    db = run_dir / "hackcases.db"
    if not db.is_file():
        usage_error(f"{run_dir} has no hack-case table (hackcases.db)")
    if label is not None and label not in LABELS:
        usage_error(f"--label must be one of {', '.join(LABELS)}")
    hc = HackCases(db)
    try:
        if export:
            out.print(f"wrote {hc.export_jsonl(export, label)} cases to {export}")
            return
        for r in hc.rows(label):
            out.print(f"#{r['id']} {r['label']} {r['reason']} x{r['count']} [{r['stage']}] {r['task']}: "
                      f"{r['detail'][:120]}", highlight=False, markup=False)
    finally:
        hc.close()


@train_app.command("learn")
def learn_cmd(out_dir: Path = typer.Option(Path("runs/learn"), "--out", help="experiment directory"),
              tasks: str = typer.Option("tiny", help="tiny, tiny/level1, gpu, ... or a comma list of built-in names"),
              device: str = typer.Option("cpu", help="where the judge runs"),
              seeds: int = typer.Option(3, min=1), arms: str = typer.Option(",".join(["sft", "selftrain", "grpo",
                                                                                     "contrastive", "random"])),
              budget: int = typer.Option(1024, min=32, help="judged samples per run after the SFT data"),
              heldout_fraction: float = typer.Option(1 / 3, min=0.05, max=0.9),
              split_seed: int = typer.Option(0),
              skip: str = typer.Option("compile:max-autotune-no-cudagraphs", help="program words left out"),
              eval_samples: int = typer.Option(8, min=1, help="samples per held-out task per evaluation"),
              jobs: int = typer.Option(1, min=1, help="judge workers at once during the warm-up"),
              trials: int = typer.Option(2, min=1), time_budget: float = typer.Option(0.2, min=0.01),
              as_json: bool = typer.Option(False, "--json", help="print the summary as JSON (last line)")):
    """Show that the training method learns: a stand-in policy (a small model from scratch writing programs
    over the recipes transformations), arms x seeds on held-out tasks, against the recipes search."""
    from kernelcraft.train.ablation import JUDGE, experiment
    from kernelcraft.train.learn import ARMS, RunSettings

    checks.device(device)
    names = [a.strip() for a in arms.split(",") if a.strip()]
    bad = [a for a in names if a not in ARMS]
    if bad or not names:
        usage_error(f"--arms: unknown {', '.join(bad) or '(none)'}; use {', '.join(ARMS)}")
    settings = RunSettings(budget=budget, eval_samples=eval_samples)
    judge = {**JUDGE, "trials": trials, "time_budget_s": time_budget}
    say = (lambda m: console.print(m, highlight=False, markup=False)) if as_json else \
        (lambda m: out.print(m, highlight=False, markup=False))
    summary = _run(experiment, out_dir, out_dir=out_dir, tasks=tasks, device=device, seeds=seeds, arms=names,
                   heldout_fraction=heldout_fraction, split_seed=split_seed,
                   skip=tuple(s for s in skip.split(",") if s), jobs=jobs, judge=judge, settings=settings, say=say)
    if as_json:
        print_json(summary)
    else:
        out.print((out_dir / "ablation.md").read_text(), highlight=False, markup=False)
