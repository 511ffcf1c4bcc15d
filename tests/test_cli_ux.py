"""The CLI as a script sees it: through a pipe (issue 21, the first items). Output is not wrapped into files,
the version is one line, and `tasks --check` exits non-zero when it flags a task."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"


def kc(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "kernelcraft.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_task_source_piped_to_a_file_is_python_verbatim():
    r = kc("tasks", "--show", "tiny/level1/diag_matmul")
    assert r.returncode == 0, r.stderr
    ast.parse(r.stdout)  # a wrapped comment or line would not parse
    from kernelcraft.task import load_task

    assert r.stdout.rstrip("\n") == load_task("tiny/level1/diag_matmul").source.rstrip("\n")


def test_tables_are_not_cut_at_80_columns_in_a_pipe():
    r = kc("tasks")
    assert r.returncode == 0, r.stderr
    assert "…" not in r.stdout, "a cell was truncated"
    assert any(len(line) > 80 for line in r.stdout.splitlines())


def test_version():
    r = kc("--version")
    from kernelcraft.version import __version__

    assert r.returncode == 0 and r.stdout.strip() == f"kernelcraft {__version__}"


def test_tasks_check_exit_code_says_whether_a_task_was_flagged(tmp_path):
    bad = kc("tasks", "--check", str(FIXTURES / "tasks" / "guard_degenerate_constant.py"), "--device", "cpu")
    assert bad.returncode == 1, (bad.stdout, bad.stderr)
    assert "DEGENERATE" in bad.stdout
    good = kc("tasks", "--check", str(FIXTURES / "tasks" / "tiny_elementwise.py"), "--device", "cpu")
    assert good.returncode == 0, (good.stdout, good.stderr)


def test_help_in_a_pipe_keeps_option_names_whole():
    for cmd in ("eval", "bench", "optimize"):
        r = kc(cmd, "--help")
        assert r.returncode == 0, r.stderr
        assert "…" not in r.stdout, (cmd, [ln for ln in r.stdout.splitlines() if "…" in ln][:3])
        assert "--time-budget" in r.stdout
