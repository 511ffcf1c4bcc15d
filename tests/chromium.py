"""Headless Chromium for the report tests: the DOM after load, and the laid-out boxes of chosen elements.

The reports carry no JavaScript. To measure their layout, a copy of the page gets a script appended that writes
`getBoundingClientRect()` of the elements a CSS selector picks (and of their nearest <svg>) into the DOM, which
`--dump-dom` then prints: real text metrics from a real browser, not estimates."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

_PROBE = """<script>
const out = [];
for (const el of document.querySelectorAll(%s)) {
  const r = el.getBoundingClientRect(), s = el.closest('svg').getBoundingClientRect();
  out.push({text: el.textContent, box: [r.left, r.top, r.right, r.bottom], svg: [s.left, s.top, s.right, s.bottom]});
}
const pre = document.createElement('pre'); pre.id = 'kc-layout'; pre.textContent = JSON.stringify(out);
document.body.appendChild(pre);
</script>"""


def _base(profile: Path) -> list[str]:
    return [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-dev-shm-usage", f"--user-data-dir={profile}"]


def dump_dom(page: Path, profile: Path) -> str:
    r = subprocess.run(_base(profile) + ["--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def boxes(page: Path, selector: str, workdir: Path) -> list[dict]:
    """[{text, box: [left, top, right, bottom], svg: [...]}] of every element `selector` picks in `page`."""
    probe = workdir / (page.stem + ".probe.html")
    probe.write_text(page.read_text().replace("</body>", _PROBE % json.dumps(selector) + "</body>"))
    dom = dump_dom(probe, workdir / "chrome-profile")
    m = re.search(r"<pre id=\"kc-layout\">(.*?)</pre>", dom, re.S)
    assert m, dom[-2000:]
    return json.loads(m.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&"))


def overlaps(a: list[float], b: list[float], slack: float = 0.5) -> bool:
    return a[0] < b[2] - slack and b[0] < a[2] - slack and a[1] < b[3] - slack and b[1] < a[3] - slack


def inside(box: list[float], outer: list[float], slack: float = 0.5) -> bool:
    return (box[0] >= outer[0] - slack and box[1] >= outer[1] - slack and box[2] <= outer[2] + slack
            and box[3] <= outer[3] + slack)


def assert_labels_whole_and_apart(found: list[dict], what: str) -> None:
    assert found, f"no {what} labels"
    for f in found:
        assert inside(f["box"], f["svg"]), f"{what} label {f['text']!r} is cut by its plot's edge: {f}"
    for i, a in enumerate(found):
        for b in found[i + 1:]:
            assert not overlaps(a["box"], b["box"]), f"{what} labels {a['text']!r} and {b['text']!r} overlap"
