"""The CLI as a user and a script see it, through a pipe and through a pseudo-terminal.

- Output is never wrapped or cut in a pipe and fits a terminal; `--json` is one clean line either way; the version
  is one line; `tasks --check` exits non-zero when it flags a task.
- Long steps say what is happening (a GPU-sized task on a CPU, a resume's progress, an unreachable LLM endpoint);
  Ctrl-C is acknowledged at once and exits 130 keeping what finished; `--budget 8` stopping at 5 says why, counts
  each outcome once and explains its terms on one whole line.
- Every usage error, click's parse errors included, is one `error:` line with exit 2 and leaves no directory
  behind; an option of another command names that command; values that make no sense are refused before anything
  runs; an unknown task name suggests the closest.
- A bench's lines and tables are whole through a pipe and fit a terminal, its headline counts each outcome once,
  its legends are whole lines in a pipe, and its page after a resume tells the directory's time.
"""
from __future__ import annotations

import ast
import json
import os
import pty
import re
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
CAND = FIXTURES / "legit" / "diag_matmul_rowscale.py"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def kc(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "kernelcraft.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def kc_pty(*args, columns=60, stdout_tty=True, timeout=120) -> tuple[int, str, str]:
    """Run the CLI with stderr (and stdout, unless `stdout_tty` is False: then a pipe) on a pseudo-terminal of
    `columns` columns. Returns (exit code, what the terminal showed, stdout if piped)."""
    master, slave = pty.openpty()
    env = dict(os.environ, COLUMNS=str(columns), LINES="40", TERM="xterm-256color")
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen([sys.executable, "-m", "kernelcraft.cli", *args], stdin=slave, stderr=slave,
                            stdout=slave if stdout_tty else subprocess.PIPE, env=env)
    os.close(slave)
    shown, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the other side closed
                break
            if not chunk:
                break
            shown += chunk
        elif proc.poll() is not None:
            break
    os.close(master)
    piped = proc.stdout.read().decode() if proc.stdout else ""
    return proc.wait(timeout=30), shown.decode(errors="replace").replace("\r\n", "\n"), piped


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


# ---- through a pseudo-terminal -----------------------------------------------------------------------------

def test_in_a_terminal_tables_fit_its_width():
    rc, shown, _ = kc_pty("tasks", "--tier", "tiny", columns=60)
    assert rc == 0, shown
    lines = [ANSI.sub("", ln) for ln in shown.splitlines() if ln.strip()]
    assert max(len(ln) for ln in lines) <= 60, max(lines, key=len)  # rich lays the table out for the terminal
    assert "┏" in shown and ANSI.search(shown)  # a terminal gets rich's table, with colour
    assert "tiny/level1/avgpool2d" in shown
    assert "…" not in ANSI.sub("", shown)  # a cell too wide folds onto more lines, it is never cut
    piped = kc("tasks", "--tier", "tiny")
    assert max(len(ln) for ln in piped.stdout.splitlines()) > 60  # and the same table is whole in a pipe


def test_json_is_one_clean_line_in_a_terminal_and_in_a_pipe(cache_dir):
    rc, shown, _ = kc_pty("tasks", "--tier", "tiny", "--level", "1", "--json", columns=40)
    assert rc == 0, shown
    assert not ANSI.search(shown) and len(shown.strip().splitlines()) == 1
    assert json.loads(shown)["tasks"][0]["name"].startswith("tiny/level1/")
    # eval: the record alone on stdout (a pipe), while stderr is a terminal
    rc, shown, piped = kc_pty("eval", "tiny/level1/diag_matmul", str(CAND), "--device", "cpu", "--no-timing",
                              "--json", stdout_tty=False, columns=60)
    assert rc == 0, shown
    lines = piped.strip().splitlines()
    assert len(lines) == 1 and not ANSI.search(piped)
    assert json.loads(lines[0])["status"] == "correct"
    assert "Warning" not in shown and "NumPy" not in shown


def test_version_in_a_terminal():
    rc, shown, _ = kc_pty("--version")
    from kernelcraft.version import __version__

    assert rc == 0 and ANSI.sub("", shown).strip() == f"kernelcraft {__version__}"


# ---- no long silences --------------------------------------------------------------------------------------

def test_a_tierless_name_on_a_cpu_says_it_is_gpu_sized_before_running(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "kernelcraft.cli", "eval", "level1/diag_matmul", str(CAND),
                             "--device", "cpu", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    first = proc.stderr.readline()  # the first thing said, before the (long) evaluation
    took = time.monotonic() - t0
    proc.kill()
    proc.communicate()
    assert "GPU-sized" in first and "tiny/level1/diag_matmul" in first and "N=4096" in first, first
    assert took < 30
    quiet = kc("eval", "tiny/level1/diag_matmul", str(CAND), "--device", "cpu", "--no-timing")
    assert quiet.returncode == 0 and "GPU-sized" not in quiet.stderr


def test_an_option_of_another_command_names_that_command():
    r = kc("eval", "tiny/level1/diag_matmul", str(CAND), "--budget", "8")
    assert r.returncode == 2
    assert "--time-budget" not in r.stderr, r.stderr  # not "did you mean --time-budget": a different knob
    assert "kernelcraft optimize --budget" in r.stderr
    r = kc("eval", "tiny/level1/diag_matmul", str(CAND), "--trial", "3")  # a real typo keeps its suggestion
    assert r.returncode == 2 and "--trials" in r.stderr


def test_an_unreachable_llm_endpoint_is_reported_at_once_with_its_url(tmp_path):
    pytest.importorskip("openai")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    t0 = time.monotonic()
    r = kc("optimize", "tiny/level1/diag_matmul", "--device", "cpu", "--policy", "openai:m", "--base-url", url,
           "--budget", "2", "--out", str(tmp_path / "run"), timeout=120)
    took = time.monotonic() - t0
    assert r.returncode == 2, r.stderr
    assert f"{url}/chat/completions" in r.stderr and "cannot reach" in r.stderr, r.stderr
    assert took < 20, took  # before the null control ran (a client that retried would take ~20 s)
    assert "null control" not in r.stderr
    assert not (tmp_path / "run").exists()  # nothing was evaluated: no run directory is left behind


OPT = ["optimize", "tiny/level1/diag_matmul", "--device", "cpu", "--trials", "2", "--no-null-control",
       "--confirm", "0", "--remeasure-above", "0", "--patience", "0"]


@pytest.mark.slow  # ~90 s on 2 cores: two searches, each evaluation timed for its whole 4 s budget
def test_ctrl_c_is_acknowledged_at_once_and_keeps_what_finished(tmp_path, cache_dir):
    out = tmp_path / "run"
    # every evaluation times for its full 4 s budget (a CI target of 0 is never met): Ctrl-C lands mid-evaluation
    cmd = [sys.executable, "-m", "kernelcraft.cli", *OPT, "--budget", "6", "--out", str(out),
           "--time-budget", "4", "--target-ci", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        assert line, (seen, proc.communicate())
        seen.append(line)
        if re.match(r"\s+#1 ", line):  # the first verdict landed; #2 is being timed now
            break
    time.sleep(1.0)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    ack = proc.stderr.readline()
    ack_s = time.monotonic() - t0
    rest, err = proc.communicate(timeout=60)
    exit_s = time.monotonic() - t0
    assert "interrupted: stopping 1 running evaluation (#2)" in ack, (ack, err)
    assert ack_s < 1.5, ack_s
    assert proc.returncode == 130, err
    assert exit_s < 3.5, exit_s  # well before #2's 4 s of timing would have ended
    assert "Traceback" not in err and "re-run the same command to resume" in err
    assert "1 finished candidate(s) kept" in err

    from kernelcraft.search.rundb import RunDB

    db = RunDB(out)
    rows = db.rows()
    db.close()
    assert [r.state for r in rows][0] == "done" and rows[0].evals_done == 1
    assert all(r.evals_done == 0 for r in rows[1:])  # the killed evaluation was dropped, not recorded as a crash

    again = kc(*OPT, "--budget", "2", "--out", str(out), "--time-budget", "4", "--target-ci", "0", timeout=300)
    assert again.returncode == 0, again.stderr
    assert "resuming: 1/2 candidates done (1 correct)" in again.stderr
    assert "re-queued" in again.stderr


def test_a_run_that_stops_early_says_why(tmp_path, cache_dir):
    r = kc(*OPT, "--budget", "8", "--out", str(tmp_path / "run"), "--time-budget", "0.3", "--skip", "compile",
           timeout=300)
    assert r.returncode == 0, r.stderr
    assert "after 1 of 8 candidates" in r.stdout, r.stdout
    # each outcome counted once, in words (how many were verified faster is the timing's business, not this test's)
    assert re.search(r"after 1 of 8 candidates: 1 correct \(\d verified faster, \d not faster\), 0 incorrect, 0 failed "
                     r"\(build, runtime, timeout\), 0 parse error\(s\)$", r.stdout.splitlines()[0]), r.stdout
    assert "stopped: exhausted — the recipes policy tried every valid combination (1) of the 1 recipe(s)" in r.stdout
    assert "rewrite:diag_matmul" in r.stdout
    legend = [ln for ln in r.stdout.splitlines() if ln.startswith("verified faster: ")]  # the terms, one whole line
    assert len(legend) == 1 and legend[0].endswith("and still verified faster") and len(legend[0]) > 200, r.stdout
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("  #1 correct ")]
    assert len(lines) == 1 and re.search(r"\[95% CI [\d.]+–[\d.]+\] (verified faster|not verified faster \(the CI "
                                         r"reaches 1\.00x\)) · ", lines[0]), r.stderr
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["stopped"] == "exhausted" and "every valid combination" in s["stopped_detail"]


# ---- usage errors: one shape, whoever finds them ---------------------------------------------------------------

def one_line_usage_error(r) -> str:
    """A CliRunner result or a finished process: exit 2, one `error: ...` line on stderr, nothing on stdout."""
    code = r.exit_code if hasattr(r, "exit_code") else r.returncode
    err = r.stderr.strip()
    assert code == 2, (code, r.stdout, err)
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    assert "Traceback" not in err and "╭" not in err and not r.stdout.strip(), (err, r.stdout)
    return err


def invoke(*args: str):
    from typer.testing import CliRunner

    from kernelcraft.cli import app

    return CliRunner().invoke(app, list(args), prog_name="kernelcraft")


def test_click_parse_errors_are_one_line_usage_errors():
    err = one_line_usage_error(kc("eval", "x.py", "y.py", "--bogus"))  # through the entry point
    assert "No such option: --bogus" in err and "see `kernelcraft eval --help`" in err
    for args, needle, where in [
        (["eval"], "Missing argument 'task'", "kernelcraft eval --help"),
        (["eval", "x.py", "y.py", "--trials", "three"], "'--trials'", "kernelcraft eval --help"),
        (["tasks", "--level", "9"], "'--level'", "kernelcraft tasks --help"),
        (["nosuchcommand"], "No such command 'nosuchcommand'", "kernelcraft --help"),
        (["train", "data"], "Missing argument 'config'", "kernelcraft train data --help"),
        (["optimize", "tiny/level1/relu", "--budget", "0"], "'--budget'", "kernelcraft optimize --help"),
    ]:
        err = one_line_usage_error(invoke(*args))
        assert needle in err and where in err, (args, err)


def test_values_that_make_no_sense_are_refused_before_anything_runs(tmp_path):
    task, cand = str(FIXTURES / "tasks" / "tiny_elementwise.py"), str(FIXTURES / "legit" / "torch_elementwise.py")
    opt = ["optimize", "tiny/level1/diag_matmul", "--device", "cpu", "--out", str(tmp_path / "o")]
    bench = ["bench", "tiny/level1", "--device", "cpu", "--out", str(tmp_path / "b")]
    for args, flag in [
        (["eval", task, cand, "--device", "cpu", "--time-budget", "0"], "--time-budget"),
        (["eval", task, cand, "--device", "cpu", "--time-budget", "-1"], "--time-budget"),
        (["eval", task, cand, "--device", "cpu", "--trials", "0"], "--trials"),
        (opt + ["--time-limit", "0"], "--time-limit"),
        (opt + ["--tau", "0"], "--tau"),
        (opt + ["--min-speedup", "-1"], "--min-speedup"),
        (opt + ["--backend", "fortran"], "--backend"),
        (opt + ["--max-tokens", "0"], "--max-tokens"),
        (bench + ["--budget", "0"], "--budget"),
        (bench + ["--time-limit", "0"], "--time-limit"),
        (bench + ["--time-budget", "0"], "--time-budget"),
        (["tune", "tiny/level1/softmax", "--budget-share", "0", "--out", str(tmp_path / "t")], "--budget-share"),
        (["serve", "--max-body-mb", "0"], "--max-body-mb"),
        (["serve", "--log-level", "loud"], "--log-level"),
        (["train", "learn", "--trials", "0", "--out", str(tmp_path / "l")], "--trials"),
    ]:
        err = one_line_usage_error(invoke(*args))
        assert flag in err, (args, err)
    assert list(tmp_path.iterdir()) == []  # no run directory for a command that never ran


def test_an_unknown_task_name_suggests_the_closest():
    err = one_line_usage_error(invoke("eval", "tiny/level1/reluu", "c.py"))
    assert "did you mean tiny/level1/relu" in err, err
    err = one_line_usage_error(invoke("tasks", "--show", "level1/softmx"))
    assert "did you mean level1/softmax" in err, err  # answered in the form it was asked in
    err = one_line_usage_error(invoke("bench", "tiny/levl1", "--device", "cpu"))
    assert "did you mean tiny/level1" in err, err
    err = one_line_usage_error(invoke("eval", "tiny/level1/qqqqqqqqqq", "c.py"))
    assert "did you mean" not in err  # nothing close: no guess


def test_a_file_that_cannot_be_read_is_named(tmp_path):
    binary = tmp_path / "blob.py"
    binary.write_bytes(bytes(range(128, 256)))
    task, cand = str(FIXTURES / "tasks" / "tiny_elementwise.py"), str(FIXTURES / "legit" / "torch_elementwise.py")
    err = one_line_usage_error(invoke("eval", task, str(binary), "--device", "cpu"))
    assert f"candidate {binary} is not UTF-8 text" in err, err
    err = one_line_usage_error(invoke("eval", str(binary), cand, "--device", "cpu"))
    assert f"{binary} is not UTF-8 text" in err, err
    err = one_line_usage_error(invoke("eval", task, str(tmp_path), "--device", "cpu"))
    assert "is a directory" in err, err
    err = one_line_usage_error(invoke("train", "data", str(binary)))
    assert f"config {binary} is not UTF-8 text" in err and "YAML" in err, err


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a GPU host can tune")
def test_tune_without_a_gpu_is_a_usage_error_naming_the_fix(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for extra in ([], ["--device", "cpu"]):
        err = one_line_usage_error(invoke("tune", "tiny/level1/softmax", *extra))
        assert "GPU host" in err and "kernelcraft optimize tiny/level1/softmax --device cpu" in err, err
    assert list(tmp_path.iterdir()) == []  # no runs/tune-softmax


def test_a_usage_error_leaves_no_directory_behind(tmp_path):
    new = tmp_path / "new" / "run"
    err = one_line_usage_error(invoke("optimize", "tiny/level1/diag_matmul", "--device", "cpu", "--policy", "nope",
                                      "--out", str(new)))
    assert "unknown policy" in err
    err = one_line_usage_error(invoke("bench", "tiny/level1", "--device", "cpu", "--policy", "nope", "--out", str(new)))
    assert "unknown policy" in err
    afile = tmp_path / "afile"
    afile.write_text("")
    err = one_line_usage_error(invoke("optimize", "tiny/level1/diag_matmul", "--device", "cpu", "--out", str(afile)))
    assert "exists and is not a directory" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_a_usage_error_found_by_the_run_removes_only_a_directory_without_results(tmp_path, monkeypatch):
    """A problem the library finds once it has started (an endpoint that stops answering) still leaves no new
    directory behind, unless it holds a finished evaluation by then."""
    import kernelcraft.cli.optimize as cli_optimize
    from kernelcraft.search.policies import PolicyError
    from kernelcraft.search.rundb import RunDB

    def failing(finished):
        def run(task, out, opts, **kw):
            out.mkdir(parents=True, exist_ok=True)
            db = RunDB(out)
            db.set_meta("task", task.name)
            if finished:
                cid, _ = db.add_candidate("class ModelNew: pass\n", policy="recipes", round=1)
                db.claim(cid)
                db.finish(cid, {"status": "incorrect", "speedup": None, "reasons": [], "message": "", "timing": None})
            db.close()
            raise PolicyError("every request to http://127.0.0.1:9/v1/chat/completions failed this round")
        return run

    for finished in (False, True):
        monkeypatch.setattr(cli_optimize, "optimize", failing(finished))
        out = tmp_path / f"finished-{finished}" / "run"
        err = one_line_usage_error(invoke("optimize", "tiny/level1/diag_matmul", "--device", "cpu", "--out", str(out)))
        assert "failed this round" in err
        assert out.exists() == finished, finished  # a finished evaluation is kept for the resume


# ---- a bench through a pipe and in a terminal ------------------------------------------------------------------

LAST_WORDS = "the last words of this message are the ones that matter: counted as a failure"
LOUD = f'''import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, *args):
        super().__init__()
        raise RuntimeError("this candidate refuses to be built, and says why at length so that {LAST_WORDS}")
'''


@pytest.fixture(scope="module")
def small_bench(tmp_path_factory, cache_dir):
    """Two tasks judged (one correct, one failing with a long message) into OUT, then the same command again:
    a resume with nothing left to do. Both through a pipe."""
    root = tmp_path_factory.mktemp("small-bench")
    tasks, cands = root / "tasks", root / "cands"
    tasks.mkdir()
    cands.mkdir()
    for name in ("tiny_elementwise.py", "tiny_diag_matmul.py"):
        (tasks / name).write_text((FIXTURES / "tasks" / name).read_text())
    (cands / "tiny_elementwise.py").write_text((FIXTURES / "legit" / "torch_elementwise.py").read_text())
    (cands / "tiny_diag_matmul.py").write_text(LOUD)
    args = ["bench", str(tasks), "--candidates", str(cands), "--device", "cpu", "--baselines", "none", "--trials", "2",
            "--time-budget", "0.2", "--processes", "1", "--remeasure-above", "0", "--jobs", "1",
            "--out", str(root / "out")]
    first = kc(*args)
    assert first.returncode == 0, first.stderr[-3000:]
    again = kc(*args)
    assert again.returncode == 0, again.stderr[-3000:]
    return {"args": args, "out": root / "out", "first": first, "again": again}


def test_bench_through_a_pipe_is_never_cut(small_bench):
    first = small_bench["first"]
    said = [ln for ln in first.stderr.splitlines() if "tiny_diag_matmul:" in ln]
    assert said and said[0].rstrip().endswith(LAST_WORDS), said  # not "…: no bes"
    for run in (first, small_bench["again"]):
        head = run.stdout.splitlines()[0]  # the headline: each outcome counted once, on one line
        assert re.fullmatch(r"2 task\(s\): \d faster · \d correct, not faster · 0 incorrect · 1 failed", head), head
        legends = [ln for ln in run.stdout.splitlines() if ln.startswith(("faster: ", "fP (fast_p): "))]
        assert len(legends) == 2 and all(len(ln) > 200 for ln in legends), run.stdout  # whole, not wrapped
        rows = [ln for ln in run.stdout.splitlines() if ln.startswith("│ all ")]
        assert len(rows) == 1 and rows[0].count("│") == 13 and rows[0].count("%") == 6, run.stdout  # one line each
        assert "…" not in run.stdout
        title = [ln.strip() for ln in run.stdout.splitlines() if "bench — " in ln]
        assert len(title) == 1 and title[0].startswith(f"bench — {small_bench['args'][1]} (cpu ") \
            and title[0].endswith(")"), run.stdout  # the title on one line


def test_bench_in_a_terminal_fits_its_width(small_bench):
    for columns in (80, 60):
        rc, shown, _ = kc_pty(*small_bench["args"], columns=columns)
        assert rc == 0, shown
        lines = [seg.rstrip() for ln in ANSI.sub("", shown).split("\n") for seg in ln.split("\r")]
        table = [ln for ln in lines if re.match(r"[│ ]*all\b", ln)]
        assert table, shown
        assert any(ln.startswith("2 task(s): ") for ln in lines) and any(ln.startswith("fP (fast_p): ") for ln in lines)
        assert max(len(ln) for ln in lines if not ln.startswith("bench ━")) <= columns, max(lines, key=len)
        assert "…" not in "\n".join(lines)
        if columns == 80:  # room enough for every number whole: the box and the padding give way first
            assert len(re.findall(r"\b\d+%", table[0])) == 6 and len(re.findall(r"\d\.\d\dx", table[0])) >= 3, table


def test_bench_report_after_a_resume_counts_every_invocation(small_bench):
    html = (small_bench["out"] / "report.html").read_text()
    header = html[html.index("id='header'"):html.index("</div>", html.index("id='header'"))]
    assert re.search(r"2 evaluations took \d", header), header
    assert "this invocation" in header and "resumed 2 item(s)" in header, header
    assert not re.search(r"· 0 s$", header), header
