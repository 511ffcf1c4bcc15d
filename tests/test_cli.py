"""The `kernelcraft` command, run as a subprocess, against the CLI contract (docs/contract.md):
`eval ... --json` prints the verdict record as the last stdout line and exits 0 whatever the verdict;
usage errors exit non-zero with a one-line message; `tasks --json` lists built-in tasks."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kernelcraft.task import builtin_names

FIXTURES = Path(__file__).parent / "fixtures"
TASKS = FIXTURES / "tasks"
LEGIT = FIXTURES / "legit"
FAULTS = FIXTURES / "faults"

CONTRACT_KEYS = {"task", "candidate_sha256", "device", "status", "reasons", "message", "correctness", "timing",
                 "speedup", "build_s", "wall_s", "env"}
ENV_KEYS = {"kernelcraft", "torch", "cuda", "gpu"}
NAME_RE = re.compile(r"(gpu|tiny)/level[123]/[A-Za-z0-9_]+")


def kc(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="80", NO_COLOR="1")
    return subprocess.run([sys.executable, "-m", "kernelcraft.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def last_json(stdout: str) -> dict:
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    assert lines, "nothing on stdout"
    return json.loads(lines[-1])


def assert_record(rec: dict) -> None:
    missing = CONTRACT_KEYS - set(rec)
    assert not missing, f"record lacks {missing}: {rec}"
    assert ENV_KEYS <= set(rec["env"]), rec["env"]
    assert rec["status"] in ("correct", "incorrect", "compile_error", "runtime_error", "timeout", "rejected")
    assert isinstance(rec["reasons"], list)
    assert re.fullmatch(r"[0-9a-f]{64}", rec["candidate_sha256"])
    if rec["status"] != "correct":
        assert rec["speedup"] is None


def test_eval_json_correct(cache_dir):
    r = kc("eval", str(TASKS / "tiny_elementwise.py"), str(LEGIT / "torch_elementwise.py"), "--device", "cpu",
           "--json", "--time-budget", "0.5", "--trials", "2")
    assert r.returncode == 0, r.stderr[-3000:]
    rec = last_json(r.stdout)
    assert_record(rec)
    assert rec["status"] == "correct", rec["message"]
    assert rec["device"] == "cpu"
    assert rec["task"].endswith("tiny_elementwise.py")
    assert rec["speedup"] > 0 and rec["timing"]["ci95"][0] <= rec["speedup"] <= rec["timing"]["ci95"][1]
    assert rec["correctness"]["trials"] == rec["correctness"]["passed"] == 2
    assert rec["env"]["kernelcraft"] and rec["env"]["torch"]


def test_eval_json_incorrect_exits_zero(cache_dir):
    r = kc("eval", str(TASKS / "tiny_elementwise.py"), str(FAULTS / "shape_mismatch.py"), "--device", "cpu",
           "--json", "--no-timing", "--trials", "1")
    assert r.returncode == 0, r.stderr[-3000:]
    rec = last_json(r.stdout)
    assert_record(rec)
    assert (rec["status"], rec["reasons"]) == ("incorrect", ["shape_mismatch"])
    assert rec["timing"] is None and rec["speedup"] is None


def test_eval_json_crash_exits_zero(cache_dir):
    r = kc("eval", str(TASKS / "tiny_elementwise.py"), str(FAULTS / "segfault_forward.py"), "--device", "cpu",
           "--json", "--no-timing", "--trials", "1")
    assert r.returncode == 0, r.stderr[-3000:]
    rec = last_json(r.stdout)
    assert (rec["status"], rec["reasons"]) == ("runtime_error", ["crashed"])


def test_eval_json_parse_error_exits_zero(cache_dir):
    r = kc("eval", str(TASKS / "tiny_elementwise.py"), str(FAULTS / "parse_error.py"), "--device", "cpu", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    rec = last_json(r.stdout)
    assert_record(rec)
    assert (rec["status"], rec["reasons"]) == ("compile_error", ["parse_error"])


def test_eval_human_output(cache_dir):
    r = kc("eval", str(TASKS / "tiny_elementwise.py"), str(FAULTS / "value_mismatch.py"), "--device", "cpu",
           "--no-timing", "--trials", "1")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "incorrect" in r.stdout and "value_mismatch" in r.stdout


def one_line_error(r: subprocess.CompletedProcess) -> str:
    assert r.returncode != 0
    err = r.stderr.strip()
    assert err, "a usage error must say what is wrong"
    assert "Traceback" not in err, err
    assert len(err.splitlines()) == 1, f"expected a one-line message, got:\n{err}"
    return err


def test_missing_candidate_file_is_usage_error(cache_dir, tmp_path):
    missing = tmp_path / "no_such_candidate.py"
    r = kc("eval", str(TASKS / "tiny_elementwise.py"), str(missing), "--device", "cpu", "--json")
    err = one_line_error(r)
    assert "not found" in err.lower(), err
    assert not r.stdout.strip(), "no verdict record for a usage error"


def test_missing_candidate_short_path_is_usage_error(cache_dir):
    r = kc("eval", str(TASKS / "tiny_elementwise.py"), "nope.py", "--device", "cpu", "--json")
    err = one_line_error(r)
    assert "nope.py" in err


def test_unknown_task_name_is_usage_error(cache_dir):
    r = kc("eval", "tiny/level1/kc_no_such_task", str(LEGIT / "torch_elementwise.py"), "--device", "cpu", "--json")
    err = one_line_error(r)
    assert "kc_no_such_task" in err


def test_missing_task_file_is_usage_error(cache_dir):
    r = kc("eval", "kc_missing_task.py", str(LEGIT / "torch_elementwise.py"), "--device", "cpu", "--json")
    one_line_error(r)


def test_bad_mode_is_usage_error(cache_dir):
    r = kc("eval", str(TASKS / "tiny_elementwise.py"), str(LEGIT / "torch_elementwise.py"), "--device", "cpu",
           "--mode", "sloppy", "--json")
    one_line_error(r)


def test_unknown_device_is_usage_error(cache_dir):
    r = kc("eval", str(TASKS / "tiny_elementwise.py"), str(LEGIT / "torch_elementwise.py"), "--device", "tpu",
           "--json")
    one_line_error(r)


def test_tasks_json_lists_builtin_tasks():
    r = kc("tasks", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    rec = last_json(r.stdout)
    assert isinstance(rec["tasks"], list)
    for row in rec["tasks"]:  # the built-in suite is written elsewhere: zero tasks is fine
        assert NAME_RE.fullmatch(row["name"]), row
        assert row["tier"] in ("gpu", "tiny") and row["name"].startswith(row["tier"] + "/")
        assert row["level"] == int(row["name"].split("/")[1][-1])
    tiny = sorted(row["name"] for row in rec["tasks"] if row["tier"] == "tiny")
    assert tiny == sorted(builtin_names("tiny"))


def test_tasks_json_tier_filter():
    r = kc("tasks", "--json", "--tier", "tiny", "--level", "1")
    assert r.returncode == 0, r.stderr[-3000:]
    names = [row["name"] for row in last_json(r.stdout)["tasks"]]
    assert all(n.startswith("tiny/level1/") for n in names), names


def test_entry_point_script(cache_dir):
    exe = shutil.which("kernelcraft")
    if exe is None:
        pytest.skip("the `kernelcraft` entry point is not on PATH")
    r = subprocess.run([exe, "tasks", "--json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "tasks" in last_json(r.stdout)


TINY = builtin_names("tiny")


@pytest.mark.skipif(not TINY, reason="no built-in tiny tasks yet")
def test_eval_builtin_tiny_task(cache_dir, tmp_path):
    """A built-in task by name; the candidate is the reference itself renamed to ModelNew (trivially correct)."""
    from kernelcraft.task import load_task

    name = next((n for n in TINY if n.endswith("/relu")), TINY[0])
    source = load_task(name).source
    cand = tmp_path / "renamed_reference.py"
    cand.write_text(re.sub(r"\bModel\b", "ModelNew", source))
    r = kc("eval", name, str(cand), "--device", "cpu", "--json", "--no-timing", "--trials", "2")
    assert r.returncode == 0, r.stderr[-3000:]
    rec = last_json(r.stdout)
    assert_record(rec)
    assert rec["task"] == name
    assert rec["status"] == "correct", rec["message"]
