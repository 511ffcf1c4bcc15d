"""The quick selection (`python -m pytest -q -m quick`, listed in conftest.QUICK) names tests that exist, and every
test file has a test in it, so a quick run touches every area."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from conftest import QUICK

TESTS = Path(__file__).parent


def _test_functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.name.startswith("test_")}


def test_every_test_file_has_a_quick_entry():
    files = {p.name for p in TESTS.glob("test_*.py")}
    assert sorted(files - set(QUICK)) == [], "add a cheap test of each new file to conftest.QUICK"
    assert sum(bool(tests) for tests in QUICK.values()) >= len(QUICK) - 5  # a few files are costly throughout
    assert sorted(set(QUICK) - files) == [], "conftest.QUICK names a file that is not there"


def test_every_quick_name_is_a_test():
    for name, tests in QUICK.items():
        defined = _test_functions(TESTS / name)
        missing = [t for t in tests if t.split("[", 1)[0] not in defined]
        assert not missing, (name, missing)


def test_every_quick_parametrization_is_collected():
    """A `name[id]` entry names an id pytest gives that test (a renamed id would quietly select nothing)."""
    files = sorted(name for name, tests in QUICK.items() if any("[" in t for t in tests))
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "quick", "-p", "no:cacheprovider",
                        *(str(TESTS / f) for f in files)], cwd=TESTS.parent, capture_output=True, text=True,
                       timeout=300)
    ids = {line.strip().removeprefix("tests/") for line in r.stdout.splitlines() if "::" in line}
    assert ids, r.stdout[-2000:] + r.stderr[-2000:]
    for name in files:
        for t in QUICK[name]:
            assert f"{name}::{t}" in ids if "[" in t else any(i.startswith(f"{name}::{t}") for i in ids), (name, t)
