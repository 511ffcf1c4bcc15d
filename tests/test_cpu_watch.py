"""tests/cpu_watch.py reports the CPU used beside a test only for tests that failed: a passing run prints nothing."""
from __future__ import annotations

from types import SimpleNamespace

from cpu_watch import CpuWatch


class _Reporter:
    def __init__(self):
        self.lines: list[str] = []

    def section(self, title):
        self.lines.append(f"== {title}")

    def write_line(self, line):
        self.lines.append(line)


def _watch(failed: set[str]) -> CpuWatch:
    w = CpuWatch()
    busy = [(3.0, 4242, "python busy_loop.py")]
    w.seen = [("tests/test_a.py::test_slow_neighbour", 3.0, 0.0, busy),
              ("tests/test_b.py::test_failed_under_load", 2.0, 1.5, busy)]
    for nodeid in failed:
        w.pytest_runtest_logreport(SimpleNamespace(nodeid=nodeid, failed=True))
    return w


def test_only_failed_tests_are_reported():
    tr = _Reporter()
    _watch({"tests/test_b.py::test_failed_under_load"}).pytest_terminal_summary(tr)
    text = "\n".join(tr.lines)
    assert "test_failed_under_load: older processes 2.0 s, host steal 1.5 s" in text, text
    assert "pid 4242" in text and "busy_loop.py" in text
    assert "test_slow_neighbour" not in text  # it passed: its neighbours' CPU is nobody's business


def test_a_run_where_every_test_passed_says_nothing():
    tr = _Reporter()
    _watch(set()).pytest_terminal_summary(tr)
    assert tr.lines == []
