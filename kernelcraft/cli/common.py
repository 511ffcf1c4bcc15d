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

from kernelcraft.protocol import Protocol, ProtocolError, describe_problems

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="kernelcraft: trustworthy evaluation and automatic optimization of GPU code.")


def _console(stderr: bool = False) -> Console:
    """A terminal gets rich's layout at its width; a pipe or a file gets lines that are never wrapped
    (rich would cut them at 80 columns: a task's source piped to a file stopped being Python)."""
    stream = sys.stderr if stderr else sys.stdout
    tty = hasattr(stream, "isatty") and stream.isatty()
    return Console(stderr=stderr) if tty else Console(stderr=stderr, width=400, soft_wrap=True)


console = _console(stderr=True)
out = _console()


def _version(value: bool) -> None:
    if value:
        from kernelcraft.version import __version__

        sys.stdout.write(f"kernelcraft {__version__}\n")
        raise typer.Exit(0)


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="print the version and exit")) -> None:
    """kernelcraft: trustworthy evaluation and automatic optimization of GPU code."""


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

# The protocol's options: parameter name (its flag, with dashes) -> (Protocol field, annotation, typer option).
# Defaults are None ("not given"): the model owns every default.
PROTOCOL_OPTIONS = {
    "trials": ("trials", Optional[int], typer.Option(None, min=1, help=_help("trials") + " (default 5)")),
    "atol": ("atol", Optional[float], typer.Option(None, help=_help("atol"))),
    "rtol": ("rtol", Optional[float], typer.Option(None, help=_help("rtol"))),
    "mode": ("mode", Optional[str], typer.Option(None, help="open | strict (strict: own kernel required; default "
                                                 "open)")),
    "time_budget": ("time_budget_s", Optional[float], typer.Option(None, help=_help("time_budget_s"))),
    "eval_time": ("time_budget_s", Optional[float], typer.Option(None, "--eval-time", hidden=True,
                                                                 help="old name of --time-budget")),
    "timeout": ("timeout_s", Optional[float], typer.Option(None, help=_help("timeout_s"))),
    "build_timeout": ("build_timeout_s", Optional[float], typer.Option(None, help=_help("build_timeout_s")
                                                                       + " (default 900)")),
    "remeasure_above": ("remeasure_above", Optional[float], typer.Option(None, help=_help("remeasure_above").replace(
        "(None: never)", "(0: never; default 3)"))),
    "target_ci": ("target_ci", Optional[float], typer.Option(None, help=_help("target_ci") + " (default 0.01)")),
    "min_rounds": ("min_rounds", Optional[int], typer.Option(None, min=1, help=_help("min_rounds") + " (default 10)")),
    "precision": ("precision", Optional[str], typer.Option(None, help=_help("precision") + " (default calibrated)")),
    "precision_factor": ("precision_factor", Optional[float], typer.Option(None, help=_help("precision_factor")
                                                                           + " (default 6)")),
    "partial_trials": ("partial_trials", Optional[int], typer.Option(None, min=0, help=_help("partial_trials")
                                                                     + " (default 2)")),
}
_FLAGS = {field: "--" + param.replace("_", "-") for param, (field, _, opt) in PROTOCOL_OPTIONS.items()
          if not opt.hidden}


def make_protocol(**given) -> Protocol:
    """The Protocol the protocol options describe (`given`: parameter name -> value or None for not given)."""
    if None not in (given.get("time_budget"), given.get("eval_time")) and given["time_budget"] != given["eval_time"]:
        usage_error("--time-budget and its old name --eval-time disagree: give one")
    fields = {PROTOCOL_OPTIONS[param][0]: value for param, value in given.items() if value is not None}
    if "remeasure_above" in fields:
        fields["remeasure_above"] = fields["remeasure_above"] or None  # 0: never
    try:
        return Protocol.make(**fields)
    except ProtocolError as e:
        usage_error(describe_problems(e.problems, lambda field: _FLAGS.get(field, field)))


def with_protocol(command):
    """Give a command the protocol options and call it with `protocol=` (a validated Protocol) instead.

    The options are appended to the command's own signature (typer reads `__signature__`), so each is
    declared once, here, for `eval`, `optimize` and `bench` alike; a bad value is a usage error before the
    command runs."""
    sig = inspect.signature(command)
    own = [p for name, p in sig.parameters.items() if name != "protocol"]
    added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=ann)
             for name, (_, ann, opt) in PROTOCOL_OPTIONS.items()]

    @functools.wraps(command)
    def wrapper(**kwargs):
        knobs = {name: kwargs.pop(name) for name in PROTOCOL_OPTIONS}
        return command(protocol=make_protocol(**knobs), **kwargs)

    wrapper.__signature__ = sig.replace(parameters=[p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own]
                                        + added)
    wrapper.__annotations__ = {k: v for k, v in command.__annotations__.items() if k != "protocol"}
    wrapper.__annotations__.update({name: ann for name, (_, ann, _) in PROTOCOL_OPTIONS.items()})
    return wrapper
