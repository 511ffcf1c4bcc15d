"""The `kernelcraft` command: a thin typer layer over the library API (see ../shared/CONTRACT.md).

Design decisions
- Every command is a call into the library plus printing. With `--json` the last line of stdout is the
  JSON record and nothing else goes to stdout after it; human output is rich tables/panels.
- Exit status 0 whenever a verdict was reached (whatever it says); 2 with a one-line message for usage
  errors, click's own parse errors included (`common._Group`): missing or unreadable file, unknown task
  (with the closest names), bad option or value, a device that is not there, unreachable LLM endpoint; a
  usage error leaves no directory behind (`checks.no_leftovers`). `tasks --check` exits 1 when it flags a
  task (a check, not a verdict: scripts gate on it); 130 when interrupted (`interrupt.Interrupts`:
  acknowledged at once, finished results kept). The README's CLI section lists them.
- Output to a pipe or file is never wrapped or cut (`common._console`, `common.table`): what a script or a
  file receives is what was printed; a terminal gets rich's layout at its width, cells folded rather than
  cut. `--version` prints one line.
- One module per group of commands (`judge`: eval, tasks; `optimize`; `report`; `bench`; `tune`; `serve`;
  `train`), each registering on the one app of `common`, which also declares the protocol options; `checks`
  holds what they check before anything runs.
"""
import sys

# each registers its commands
from kernelcraft.cli import bench, judge, optimize, report, serve, train, tune  # noqa: F401
from kernelcraft.cli.common import app


def main() -> None:
    import warnings

    # torch warns on import when numpy is missing (numpy is not a dependency): not the user's business
    warnings.filterwarnings("ignore", message=r".*(NumPy|numpy).*", category=UserWarning)
    if not sys.stdout.isatty():  # --help into a pipe: option names whole, not cut at 80 columns
        try:
            import typer.rich_utils as rich_utils

            rich_utils.MAX_WIDTH = rich_utils.MAX_WIDTH or 200
        except (ImportError, AttributeError):
            pass
    app(prog_name="kernelcraft")


__all__ = ["app", "main"]
