"""The `kernelcraft` command: a thin typer layer over the library API (contract: docs/contract.md).

Every command is a call into the library plus printing. Exit status: 0 when a verdict was reached, 2 for a
usage error (one line on stderr, no directory left behind), 1 when `tasks --check` flags a task, 130 when
interrupted. With `--json` the last line of stdout is the JSON record; output to a pipe or file is never
wrapped or cut. One module per group of commands, each registering on the app of `common`.
Rationale: docs/design/cli.md#cli
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
