"""What every command shares: the app, the two consoles, usage errors, JSON output, and the protocol's
options — declared once here, so `eval`, `optimize` and `bench` spell, document and validate them alike.

Protocol options default to None: the `Protocol` model owns every default. Every usage error, click's parse
errors included (`_Group`), is `error: <what>` on one line of stderr and exit 2. Tables never wrap or cut a
cell in a pipe or a file.
Rationale: docs/design/cli.md#common
"""
from __future__ import annotations

import functools
import inspect
import json
import sys
from typing import Optional

import typer
from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from typer.core import TyperGroup

from kernelcraft.protocol import Protocol, ProtocolError, describe_problems

class _Group(TyperGroup):
    """The app's group: an unknown option that another command has is answered with that command, and click's
    parse errors are one-line usage errors like every other (docs/design/cli.md#common)."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except Exception as e:  # click's exceptions (typer >= 0.2x vendors click: matched by name)
            names = {c.__name__ for c in type(e).__mro__}
            if "ClickException" in names:
                _parse_error(e)
                sys.exit(e.exit_code)
            if "Abort" in names:
                sys.stderr.write("aborted\n")
                sys.exit(1)
            raise
        # without standalone mode click returns the command's value, or the code of the Exit that ended it;
        # no command returns a value
        sys.exit(rv if isinstance(rv, int) and not isinstance(rv, bool) else 0)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except Exception as e:  # click's NoSuchOption (typer >= 0.2x vendors click: matched by name)
            if type(e).__name__ != "NoSuchOption" or getattr(e, "ctx", None) is None:
                raise
            sub, name = e.ctx.command, e.option_name
            owners = [n for n, cmd in sorted(self.commands.items()) if cmd is not sub and not cmd.hidden
                      and any(getattr(p, "param_type_name", "") == "option" and name in p.opts for p in cmd.params)]
            if sub is self or not owners:
                raise
            cmds = [f"`kernelcraft {o} {name}`" for o in owners]
            where = cmds[0] if len(cmds) == 1 else ", ".join(cmds[:-1]) + " and " + cmds[-1]
            raise type(e)(name, message=f"No such option for `{sub.name}`: {name} (it is an option of {where})",
                          ctx=e.ctx) from None


app = typer.Typer(cls=_Group, add_completion=False, no_args_is_help=True,
                  help="kernelcraft: trustworthy evaluation and automatic optimization of GPU code.")


def _parse_error(e) -> None:
    """click's error `e` as a usage error: one line, naming the command's help."""
    if type(e).__name__ == "NoArgsIsHelpError":  # a bare group: its help is the answer (typer printed it already)
        text = e.format_message()
        if text.strip():
            sys.stderr.write(text.rstrip("\n") + "\n")
        return
    msg = " ".join(str(e.format_message()).split())
    ctx = getattr(e, "ctx", None)
    if ctx is not None and type(e).__name__ != "FileError":
        msg = msg.rstrip(".") + f"; see `{ctx.command_path} --help`"
    sys.stderr.write("error: " + msg + "\n")


PIPE_WIDTH = 10_000  # "never wrap": wider than any line kernelcraft prints


def _console(stderr: bool = False) -> Console:
    """A terminal gets rich's layout at its width; a pipe or a file gets lines that are never wrapped
    (rich would cut them at 80 columns: a task's source piped to a file stopped being Python)."""
    stream = sys.stderr if stderr else sys.stdout
    tty = hasattr(stream, "isatty") and stream.isatty()
    return Console(stderr=stderr) if tty else Console(stderr=stderr, width=PIPE_WIDTH, soft_wrap=True)


console = _console(stderr=True)
out = _console()


def table(title: str, columns: list[tuple[str, str]], to: Console | None = None) -> Table:
    """A table for `to` (default: `out`), columns given as (header, justify): in a terminal it fits the width,
    a cell too wide folding onto more lines (never cut with …); in a pipe or a file no cell and no title is
    wrapped or cut. A table of numbers is printed with `print_table`."""
    tty = (to or out).is_terminal
    t = Table(title=title, min_width=None if tty else cell_len(title))
    for header, justify in columns:
        t.add_column(header, justify=justify, overflow="fold", no_wrap=not tty)  # a pipe is wide: nothing to fold
    return t


def fits(t: Table, to: Console | None = None) -> bool:
    """Whether `t` fits `to`'s width as it is, no cell folded."""
    c = to or out
    return Measurement.get(c, c.options.update(width=PIPE_WIDTH), t).maximum <= c.width


def print_table(t: Table, to: Console | None = None) -> None:
    """Print a table of numbers `t`; in a terminal too narrow for it, the box and then the padding go before any
    cell is folded (rich shrinks every column alike, folding numbers digit by digit)."""
    c = to or out
    if c.is_terminal:
        for padding in ((0, 1), (0, 0)):
            if fits(t, c):
                break
            t.box, t.show_edge, t.pad_edge, t.padding = box.SIMPLE_HEAD, False, False, padding
    c.print(t)


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


def tier_notice(spec: str, task, device: str | None) -> None:
    """Say on stderr, before anything runs, that a built-in task about to run on a CPU is the GPU-sized one
    (a tier-less `level1/x` is the GPU tier: a minute or more per evaluation on a CPU), and how to pick the
    CPU tier."""
    if getattr(task, "tier", None) != "gpu":
        return
    from kernelcraft import devices

    try:
        dev = devices.resolve(device)[0]
    except ValueError:
        return  # the command reports the bad device itself
    if devices.kind(dev) != "cpu":
        return
    import ast

    from kernelcraft.task import tiny_overrides

    tiny = "tiny/" + task.name.split("/", 1)[1]
    shrunk = tiny_overrides(task.source)
    big = {n.targets[0].id: ast.get_source_segment(task.source, n.value) for n in ast.parse(task.source).body
           if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)
           and n.targets[0].id in shrunk}
    sizes = ", ".join(f"{k}={v}" for k, v in big.items())
    asked = "" if spec.startswith("gpu/") else f" ({spec} without a tier is the GPU tier)"
    console.print(f"[yellow]note[/yellow]: running the GPU-sized task {task.name} on a CPU{asked}"
                  + (f", {sizes}" if sizes else "") + ": one evaluation can take minutes here. The CPU tier "
                  f"is [bold]{tiny}[/bold].", highlight=False)


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
    "module_mode": ("module_mode", Optional[str], typer.Option(None, help="train | eval: " + _help("module_mode"))),
    "time_budget": ("time_budget_s", Optional[float], typer.Option(None, help=_help("time_budget_s"))),
    "eval_time": ("time_budget_s", Optional[float], typer.Option(None, "--eval-time", hidden=True,
                                                                 help="alias of --time-budget")),
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
    "processes": ("processes", Optional[int], typer.Option(None, min=1, max=8, help=_help("processes"))),
}
_FLAGS = {field: "--" + param.replace("_", "-") for param, (field, _, opt) in PROTOCOL_OPTIONS.items()
          if not opt.hidden}


def make_protocol(**given) -> Protocol:
    """The Protocol the protocol options describe (`given`: parameter name -> value or None for not given)."""
    if None not in (given.get("time_budget"), given.get("eval_time")) and given["time_budget"] != given["eval_time"]:
        usage_error("--time-budget and its alias --eval-time disagree: give one")
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
