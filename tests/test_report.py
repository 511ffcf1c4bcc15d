"""The HTML report: self-contained, escapes candidate text, shows plot/leaderboard/diff/techniques, and
renders in a real headless browser (Chromium from the distribution; skipped when absent)."""
from __future__ import annotations

import re
import shutil
import struct
import subprocess
import zlib

import pytest
from typer.testing import CliRunner

from kernelcraft.cli import app
from kernelcraft.search.report import write_report
from kernelcraft.search.rundb import RunDB
from kernelcraft.task import load_task

TASK = load_task("tiny/level1/diag_matmul")
BEST = (TASK.source.replace("return torch.diag(A) @ B", "return A[:, None] * B  # <b>row</b> scaling")
        .replace("class Model(", "class ModelNew("))
EVIL = "class ModelNew:\n    '''</pre><script>alert(1)</script>'''\n"


def _verdict(status, speedup=None, ci=None, message=""):
    return {"status": status, "speedup": speedup, "reasons": [] if status == "correct" else ["value_mismatch"],
            "message": message, "timing": {"speedup": speedup, "ci95": ci} if speedup else None}


@pytest.fixture
def run_dir(tmp_path):
    db = RunDB(tmp_path)
    db.set_meta("task", TASK.name)
    db.set_meta("task_source", TASK.source)
    db.set_meta("device", "CPU: test, 2 cores")
    db.set_meta("options", {"policy": "recipes"})
    rows = [(BEST, {"recipe": ["rewrite:diag_matmul"]}, _verdict("correct", 7.5, [7.1, 7.9])),
            (BEST.replace("A[:, None]", "A.unsqueeze(1)"), {"recipe": ["compile:default"]},
             _verdict("correct", 1.01, [0.95, 1.08])),
            (EVIL, {}, _verdict("incorrect", message="mismatch </pre><script>alert(1)</script>")),
            (BEST.replace("* B", "* B * 1"), {"recipe": ["cudagraph"]}, _verdict("correct", 0.6, [0.55, 0.62]))]
    for i, (src, meta, v) in enumerate(rows, 1):
        cid, _ = db.add_candidate(src, policy="recipes", round=1 + i // 2, meta=meta, parents=[1] if i > 1 else [])
        db.claim(cid)
        db.finish(cid, v)
    db.add_parse_error(policy="openai:m", round=3, reply="prose", message="no code block", reason="no_code_block")
    db.add_confirmation(1, _verdict("correct", 7.2, [7.0, 7.4]))
    db.set_meta("summary", {"status": "improved", "best_candidate": 1, "best_speedup": 7.2, "best_ci95": [7.0, 7.4],
                            "confirmed": True, "stopped": "budget", "wall_s": 42.0})
    db.close()
    return tmp_path


def test_report_contents(run_dir):
    path = write_report(run_dir)
    assert path == run_dir / "report.html"
    html = path.read_text()
    assert html.startswith("<!DOCTYPE html>") and "</html>" in html
    assert not re.search(r"(src|href)=['\"]https?://", html) and "<script" not in html  # self-contained, no JS
    assert "<svg" in html and html.count("<circle") == 3 and "failed" in html  # 3 correct points, failures band
    assert "7.20x" in html and "confirmed" in html and "improved" in html
    assert "&lt;/pre&gt;&lt;script&gt;alert(1)" in html  # messages escaped
    assert "# &lt;b&gt;row&lt;/b&gt; scaling" in html  # candidate source escaped
    board = html[html.index("id='leaderboard'"):html.index("</table>", html.index("id='leaderboard'"))]
    assert board.index("7.50x") < board.index("1.01x") < board.index("0.60x")  # ranked by speedup
    assert "verified" in board and "parse_error" in board and "no_code_block" in board
    diff = html[html.index("class='diff'"):]
    assert "<span class='add'>+        return A[:, None] * B  # &lt;b&gt;row&lt;/b&gt; scaling</span>" in diff
    assert "<span class='del'>-        return torch.diag(A) @ B</span>" in diff
    assert "algebraic rewrite (diag matmul -&gt; broadcast multiply)" in html
    assert "id='techniques'" in html


def test_report_cli_and_errors(run_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("elsewhere") / "r.html"
    r = CliRunner().invoke(app, ["report", str(run_dir), "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    assert out.is_file() and '"report"' in r.stdout.splitlines()[-1]
    r = CliRunner().invoke(app, ["report", str(tmp_path_factory.mktemp("empty"))])
    assert r.exit_code == 2


def test_report_of_a_run_in_progress(tmp_path):
    db = RunDB(tmp_path)
    db.set_meta("task_source", TASK.source)
    db.add_candidate(BEST, policy="recipes", round=1)
    db.close()
    html = write_report(tmp_path).read_text()
    assert "in progress" in html and "No evaluated candidates yet" in html


def _png_stats(path):
    """(width, height, number of distinct pixel rows) of an 8-bit RGB(A) PNG, decoded with zlib only."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, w, h, bpp = 8, b"", 0, 0, 3
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, color = struct.unpack(">IIBB", chunk[:10])
            bpp = {2: 3, 6: 4}[color]
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + n
    raw = zlib.decompress(idat)
    stride = w * bpp + 1
    rows = {raw[i * stride + 1:(i + 1) * stride] for i in range(h)}  # filter bytes skipped: rows still differ
    return w, h, len(rows)


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed")
def test_report_renders_in_headless_chromium(run_dir, tmp_path_factory):
    path = write_report(run_dir)
    base = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-dev-shm-usage", f"--user-data-dir={tmp_path_factory.mktemp('chrome')}"]
    dom = subprocess.run(base + ["--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "id=\"leaderboard\"" in dom.stdout and "<svg" in dom.stdout and "id=\"best\"" in dom.stdout
    shot = tmp_path_factory.mktemp("shot") / "report.png"
    r = subprocess.run(base + [f"--screenshot={shot}", "--window-size=1200,1800", path.as_uri()],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and shot.is_file(), r.stderr[-2000:]
    w, h, distinct = _png_stats(shot)
    assert (w, h) == (1200, 1800)
    assert distinct > 200  # a real page was painted (a blank screenshot has a handful of distinct rows)
