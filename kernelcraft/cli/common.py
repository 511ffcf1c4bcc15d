"""What every command shares: the app, the two consoles, usage errors, JSON output, and the protocol's
options — declared once here, so `eval`, `optimize` and `bench` spell, document and validate them alike.

Design decisions
- Protocol options default to None ("not given"): the `Protocol` model owns every default (per device
  kind), so no command restates one. Their help text is the model's field description.
- One name per knob in every command; an older spelling stays as a hidden alias (`--eval-time` for
  `--time-budget`), so scripts written against it keep working.
- A bad value is a usage error (exit 2, one line naming the option), never a verdict.
"""
from __future__ import annotations

import functools
import inspect
import json
import sys
from typing import Optional

import typer
from rich.console import Console

from kernelcraft.protocol import Protocol, ProtocolError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="kernelcraft: trustworthy evaluation and automatic optimization of GPU code.")
console = Console(stderr=True)
out = Console()


def usage_error(msg: str) -> None:
    # one line, never wrapped at the terminal width: scripts read it
    sys.stderr.write("error: " + " ".join(str(msg).split()) + "\n")
    raise typer.Exit(2)


def print_json(record: dict) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def _help(field: str) -> str:
    return Protocol.model_fields[field].description or ""


DEVICE = typer.Option(None, help="cpu, cuda or cuda:N (default: cuda if visible)")
MODE = typer.Option(None, help="open | strict (strict: own kernel required; default open)")
TRIALS = typer.Option(None, min=1, help=_help("trials") + " (default 5)")
ATOL = typer.Option(None, help=_help("atol"))
RTOL = typer.Option(None, help=_help("rtol"))
TIME_BUDGET = typer.Option(None, "--time-budget", help=_help("time_budget_s"))
EVAL_TIME = typer.Option(None, "--eval-time", hidden=True, help="old name of --time-budget")
TIMEOUT = typer.Option(None, help=_help("timeout_s"))
BUILD_TIMEOUT = typer.Option(None, help=_help("build_timeout_s") + " (default 900)")
REMEASURE_ABOVE = typer.Option(None, help=_help("remeasure_above").replace("(None: never)", "(0: never; default 3)"))
TARGET_CI = typer.Option(None, help=_help("target_ci") + " (default 0.01)")
MIN_ROUNDS = typer.Option(None, min=1, help=_help("min_rounds") + " (default 10)")


def make_protocol(*, mode: Optional[str] = None, trials: Optional[int] = None, atol: Optional[float] = None,
                  rtol: Optional[float] = None, time_budget: Optional[float] = None,
                  eval_time: Optional[float] = None, timeout: Optional[float] = None,
                  build_timeout: Optional[float] = None, remeasure_above: Optional[float] = None,
                  target_ci: Optional[float] = None, min_rounds: Optional[int] = None, **extra) -> Protocol:
    """The Protocol the protocol options describe (what was not given keeps the model's default)."""
    if time_budget is not None and eval_time is not None and time_budget != eval_time:
        usage_error("--time-budget and its old name --eval-time disagree: give one")
    given = dict(mode=mode, trials=trials, atol=atol, rtol=rtol, time_budget_s=time_budget if time_budget is not None
                 else eval_time, timeout_s=timeout, build_timeout_s=build_timeout, target_ci=target_ci,
                 min_rounds=min_rounds, **extra)
    given = {k: v for k, v in given.items() if v is not None}
    if remeasure_above is not None:
        given["remeasure_above"] = remeasure_above or None  # 0: never
    try:
        return Protocol.make(**given)
    except ProtocolError as e:
        names = {"time_budget_s": "--time-budget", "timeout_s": "--timeout", "build_timeout_s": "--build-timeout"}
        msg = str(e)
        for field, flag in names.items():
            msg = msg.replace(f"{field}:", f"{flag}:")
        for field in ("mode", "trials", "atol", "rtol", "remeasure_above", "target_ci", "min_rounds"):
            msg = msg.replace(f"{field}:", f"--{field.replace('_', '-')}:")
        usage_error(msg)


PROTOCOL_OPTIONS = {  # parameter name -> (annotation, typer option): the same in every command that judges
    "trials": (Optional[int], TRIALS), "atol": (Optional[float], ATOL), "rtol": (Optional[float], RTOL),
    "mode": (Optional[str], MODE), "time_budget": (Optional[float], TIME_BUDGET),
    "eval_time": (Optional[float], EVAL_TIME), "timeout": (Optional[float], TIMEOUT),
    "build_timeout": (Optional[float], BUILD_TIMEOUT), "remeasure_above": (Optional[float], REMEASURE_ABOVE),
    "target_ci": (Optional[float], TARGET_CI), "min_rounds": (Optional[int], MIN_ROUNDS),
}


def with_protocol(command):
    """Give a command the protocol options and call it with `protocol=` (a validated Protocol) instead.

    The options are appended to the command's own signature (typer reads `__signature__`), so each is
    declared once, here, for `eval`, `optimize` and `bench` alike; a bad value is a usage error before the
    command runs."""
    sig = inspect.signature(command)
    own = [p for name, p in sig.parameters.items() if name != "protocol"]
    added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=ann)
             for name, (ann, opt) in PROTOCOL_OPTIONS.items()]

    @functools.wraps(command)
    def wrapper(**kwargs):
        knobs = {name: kwargs.pop(name) for name in PROTOCOL_OPTIONS}
        return command(protocol=make_protocol(**knobs), **kwargs)

    wrapper.__signature__ = sig.replace(parameters=[p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own]
                                        + added)
    wrapper.__annotations__ = {k: v for k, v in command.__annotations__.items() if k != "protocol"}
    wrapper.__annotations__.update({name: ann for name, (ann, _) in PROTOCOL_OPTIONS.items()})
    return wrapper
