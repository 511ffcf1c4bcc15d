"""The `kernelcraft` command: a thin typer layer over the library API (see ../shared/CONTRACT.md).

Design decisions
- Every command is a call into the library plus printing. With `--json` the last line of stdout is the
  JSON record and nothing else goes to stdout after it; human output is rich tables/panels.
- Exit status 0 whenever a verdict was reached (whatever it says); 2 with a one-line message for usage
  errors: missing file, unknown task, bad option.
- One module per group of commands (`judge`: eval, tasks; `optimize`: optimize, report; `bench`;
  `serve`), each registering on the one app of `common`, which also declares the protocol options.
"""
from kernelcraft.cli import bench, judge, optimize, serve, train, tune  # noqa: F401  (each registers its commands)
from kernelcraft.cli.common import app


def main() -> None:
    app()


__all__ = ["app", "main"]
