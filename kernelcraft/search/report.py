"""The run report: one self-contained HTML page from a run directory's database.

Design decisions
- No dependencies and no network: the plot is SVG generated here, styles are inline, there is no
  JavaScript. The page opens from disk, in a mail attachment or a CI artifact, and renders the same in
  any browser (a test renders it in headless Chromium).
- Contents: the outcome (status, confirmed best speedup with its CI, budget used), speedup over
  candidates (log scale, every candidate in order, failures on a separate band, the running best
  verified speedup as a step line, hover titles), the leaderboard with verdicts, the best candidate's
  diff against the reference, its techniques, technique statistics over all correct candidates, and
  the recent failures with their messages.
- Everything shown comes from the database, so a report can be made for a run in progress or one
  that was killed; text from candidates and replies is always HTML-escaped.
"""
from __future__ import annotations

import difflib
import html
import json
import math
from collections import defaultdict
from pathlib import Path

from kernelcraft.search.rundb import DB_NAME, RunDB
from kernelcraft.search.techniques import techniques

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1180px;color:#1d2330;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #dde;padding-bottom:4px}
.sub{color:#667;margin-bottom:14px}.cards{display:flex;flex-wrap:wrap;gap:10px}
.card{border:1px solid #dde;border-radius:8px;padding:8px 14px;min-width:120px}.card b{display:block;font-size:20px}
.ok{color:#187a3a}.bad{color:#b3261e}.warn{color:#9a6700}.muted{color:#778}
table{border-collapse:collapse;width:100%;font-size:13px}th,td{border-bottom:1px solid #e6e6ee;padding:4px 6px;text-align:left;vertical-align:top}
th{background:#f5f6fa}td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
pre{background:#f7f7fa;border:1px solid #e3e3ea;border-radius:6px;padding:8px;overflow:auto;font-size:12px;line-height:1.35}
.diff .add{background:#e6ffec}.diff .del{background:#ffebe9}.diff .hunk{color:#6639ba}
.tag{display:inline-block;background:#eef1fb;border-radius:10px;padding:1px 8px;margin:1px 2px;font-size:12px}
details{margin:6px 0}summary{cursor:pointer}
"""

STATUS_COLORS = {"verified": "#187a3a", "correct": "#8a8fa0", "incorrect": "#b3261e", "compile_error": "#c25e00",
                 "runtime_error": "#c25e00", "timeout": "#7d4e9e", "rejected": "#a0149b", "parse_error": "#e0a100"}


def _e(x) -> str:
    return html.escape(str(x), quote=True)


def _fmt(x, digits=2) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def load_run(run_dir: str | Path) -> dict:
    run_dir = Path(run_dir)
    if not (run_dir / DB_NAME).is_file():
        raise FileNotFoundError(f"{run_dir} is not a kernelcraft run directory (no {DB_NAME})")
    db = RunDB(run_dir)
    try:
        return {"rows": db.rows(), "confirmations": db.confirmations(), "task": db.get_meta("task", "?"),
                "reference": db.get_meta("task_source", ""), "device": db.get_meta("device", ""),
                "options": db.get_meta("options", {}), "summary": db.get_meta("summary"),
                "control": db.get_meta("null_control"),
                "events": db.events()}
    finally:
        db.close()


def log_grid(out: list, lo: float, hi: float, y, L: int, right: int) -> None:
    """Log-scale speedup gridlines at 1, 2, 5 x 10^k between 10^lo and 10^hi, and a dashed line at 1x."""
    for d in range(math.floor(lo), math.ceil(hi) + 1):
        for m in (1, 2, 5):
            v = m * 10 ** d
            if lo <= math.log10(v) <= hi:
                yy = y(v)
                out.append(f"<line x1='{L}' x2='{right}' y1='{yy:.1f}' y2='{yy:.1f}' stroke='#e8e8f0'/>"
                           f"<text x='{L - 6}' y='{yy + 4:.1f}' text-anchor='end' fill='#556'>{v:g}x</text>")
    ry = y(1.0)
    out.append(f"<line x1='{L}' x2='{right}' y1='{ry:.1f}' y2='{ry:.1f}' stroke='#556' stroke-dasharray='5 4'/>")


def _plot(rows, bar=1.0, width=1100, height=340) -> str:
    pts = [r for r in rows if r.state == "done"]
    if not pts:
        return "<p class='muted'>No evaluated candidates yet.</p>"
    ok = [r.speedup for r in pts if r.correct] + [r.ci_high for r in pts if r.correct and r.ci_high] + [1.0]
    ok += [r.ci_low for r in pts if r.correct and r.ci_low]
    lo, hi = math.log10(max(min(ok) / 1.3, 1e-3)), math.log10(max(ok) * 1.3)
    if hi - lo < 0.3:
        lo, hi = lo - 0.15, hi + 0.15
    L, R, T, B, band = 60, 20, 16, 46, 26
    ph = height - T - B - band
    xs = {r.id: L + (i + 0.5) * (width - L - R) / len(pts) for i, r in enumerate(pts)}
    y = lambda s: T + (hi - math.log10(s)) / (hi - lo) * ph  # noqa: E731
    out = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' viewBox='0 0 {width} {height}' "
           "role='img' aria-label='speedup over candidates' font-family='system-ui,sans-serif' font-size='11'>",
           f"<rect x='{L}' y='{T}' width='{width - L - R}' height='{ph}' fill='#fbfbfd' stroke='#dde'/>"]
    log_grid(out, lo, hi, y, L, width - R)
    ry = y(1.0)
    out.append(f"<text x='{width - R - 4}' y='{ry - 4:.1f}' text-anchor='end' fill='#556'>reference</text>")
    by = T + ph + band / 2 + 4
    out.append(f"<text x='{L - 6}' y='{by + 4:.1f}' text-anchor='end' fill='#b3261e'>failed</text>")
    best, steps = None, []
    for r in pts:
        if r.faster_than(bar) and (best is None or r.speedup > best):
            best = r.speedup
        steps.append((xs[r.id], y(best) if best else None))
    path = []
    for x, yy in steps:
        if yy is not None:
            path.append(f"H{x:.1f} V{yy:.1f}" if path else f"M{x:.1f} {yy:.1f}")
    if path:
        out.append(f"<path d='{' '.join(path)}' fill='none' stroke='#187a3a' stroke-width='1.5' opacity='0.6'/>")
    for r in pts:
        x = xs[r.id]
        tip = _e(f"#{r.id} {r.status}" + (f" {r.speedup:.2f}x [{_fmt(r.ci_low)}, {_fmt(r.ci_high)}]" if r.correct else "")
                 + " — " + ", ".join(techniques(r.source, r.meta)))
        if r.correct:
            c = STATUS_COLORS["verified" if r.faster_than(bar) else "correct"]
            yy = y(r.speedup)
            if r.ci_low and r.ci_high:
                out.append(f"<line x1='{x:.1f}' x2='{x:.1f}' y1='{y(r.ci_high):.1f}' y2='{y(r.ci_low):.1f}' stroke='{c}'/>")
            out.append(f"<circle cx='{x:.1f}' cy='{yy:.1f}' r='4.5' fill='{c}'><title>{tip}</title></circle>")
        else:
            c = STATUS_COLORS.get(r.status or "", "#b3261e")
            out.append(f"<g stroke='{c}' stroke-width='2'><title>{tip}</title><line x1='{x - 4:.1f}' x2='{x + 4:.1f}' "
                       f"y1='{by - 4:.1f}' y2='{by + 4:.1f}'/><line x1='{x - 4:.1f}' x2='{x + 4:.1f}' y1='{by + 4:.1f}' "
                       f"y2='{by - 4:.1f}'/></g>")
    out.append(f"<text x='{(L + width - R) / 2:.0f}' y='{height - 8}' text-anchor='middle' fill='#556'>candidates in "
               "order of proposal (line: best verified speedup so far; bars: 95% CI)</text></svg>")
    return "".join(out)


def _diff(reference: str, source: str) -> str:
    lines = list(difflib.unified_diff(reference.splitlines(), source.splitlines(), "reference.py", "best.py",
                                      lineterm="", n=3))
    cls = lambda ln: "add" if ln.startswith("+") and not ln.startswith("+++") else (  # noqa: E731
        "del" if ln.startswith("-") and not ln.startswith("---") else ("hunk" if ln.startswith("@@") else ""))
    body = "\n".join(f"<span class='{cls(ln)}'>{_e(ln)}</span>" for ln in lines)
    return f"<pre class='diff'>{body or _e('(identical)')}</pre>"


def render(run: dict) -> str:
    rows, conf, summ = run["rows"], run["confirmations"], run["summary"] or {}
    control = run.get("control") or {}
    biased = control.get("status") == "correct" and (control.get("ci95") or [0])[0] > 1.0
    ctrl = control.get("speedup") if biased else None
    bar = summ.get("bar") or max((run["options"] or {}).get("min_speedup", 1.0), ctrl or 1.0)
    done = [r for r in rows if r.state == "done"]
    correct = sorted((r for r in rows if r.correct), key=lambda r: -r.speedup)
    if summ:  # a finished (or stopped) run: the loop's own, confirmed choice
        best = next((r for r in rows if r.id == summ.get("best_candidate")), None)
    else:  # a run in progress: the leader so far
        best = next((r for r in correct if r.faster_than(bar)), None)
    status = summ.get("status", "in progress")
    scls = {"improved": "ok", "no_improvement": "warn", "no_correct": "bad"}.get(status, "muted")
    best_sp = summ.get("best_speedup") or (best.speedup if best else None)
    ci = summ.get("best_ci95") or ([best.ci_low, best.ci_high] if best else None)
    tokens = summ.get("tokens") or {}
    cards = [("status", f"<span class='{scls}'>{_e(status)}</span>"),
             ("best speedup", (f"{best_sp:.2f}x" if best_sp else "—")
              + (f"<span class='muted' style='font-size:12px;display:block'>95% CI {_fmt(ci[0])}–{_fmt(ci[1])}"
                 f"{' (confirmed)' if summ.get('confirmed') else ''}</span>" if ci and ci[0] else "")),
             ("candidates", len(rows)), ("correct", len(correct)),
             ("verified faster", sum(r.faster_than(bar) for r in rows)),
             ("failed", sum(1 for r in done if not r.correct and r.status != "parse_error")),
             ("parse errors", sum(r.status == "parse_error" for r in rows))]
    if control.get("speedup"):
        cards.append(("null control", f"{control['speedup']:.3f}x<span class='muted' style='font-size:12px;display:block'>"
                      "reference vs itself</span>"))
    if tokens.get("prompt") or tokens.get("completion"):
        cards.append(("tokens", f"{tokens.get('prompt', 0) + tokens.get('completion', 0):,}"))
    opts = run["options"] or {}
    h = ["<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
         f"<title>kernelcraft report — {_e(run['task'])}</title><style>{_CSS}</style></head><body>",
         f"<h1>kernelcraft optimize — {_e(run['task'])}</h1>",
         f"<div class='sub'>{_e(run['device'])} · policy <b>{_e(opts.get('policy', '?'))}</b>"
         + (f" · stopped: {_e(summ.get('stopped'))}" if summ.get("stopped") else "")
         + (f" · {summ.get('wall_s', 0):.0f} s" if summ.get("wall_s") else "") + "</div>",
         "<div class='cards' id='summary'>" + "".join(f"<div class='card'>{_e(k)}<b>{v}</b></div>" for k, v in cards)
         + "</div>", "<h2>Speedup over candidates</h2>", f"<div id='plot'>{_plot(rows, bar)}</div>"]
    h.append("<h2>Leaderboard</h2><table id='leaderboard'><tr><th>#</th><th>id</th><th>round</th><th>status</th>"
             "<th>speedup</th><th>95% CI</th><th>confirmed</th><th>techniques</th><th>policy</th><th>parents</th></tr>")
    ranked = correct + [r for r in rows if not r.correct]
    for i, r in enumerate(ranked, 1):
        c = conf.get(r.id)
        st = ("verified" if r.faster_than(bar) else r.status) or r.state
        color = STATUS_COLORS.get("verified" if r.faster_than(bar) else (r.status or ""), "#556")
        reasons = f" <span class='muted'>({_e(', '.join(r.reasons))})</span>" if r.reasons else ""
        h.append(f"<tr><td class='num'>{i if r.correct else ''}</td><td class='num'>{r.id}</td><td class='num'>{r.round}</td>"
                 f"<td style='color:{color}'>{_e(st)}{reasons}</td><td class='num'>{_fmt(r.speedup)}{'x' if r.speedup else ''}</td>"
                 f"<td class='num'>{_fmt(r.ci_low)}–{_fmt(r.ci_high)}</td>"
                 f"<td class='num'>{(_fmt(c['speedup']) + 'x') if c and c['speedup'] else (_e(c['status']) if c else '')}</td>"
                 f"<td>{''.join(f'<span class=tag>{_e(t)}</span>' for t in techniques(r.source, r.meta))}</td>"
                 f"<td>{_e(r.policy)}</td><td>{_e(', '.join(map(str, r.parents)))}</td></tr>")
    h.append("</table>")
    h.append("<h2>Best candidate</h2>")
    if best is not None:
        h.append(f"<p id='best'>Candidate <b>#{best.id}</b> — {best_sp:.2f}x. Techniques: "
                 + "".join(f"<span class='tag'>{_e(t)}</span>" for t in techniques(best.source, best.meta)) + "</p>")
        h.append("<h3>Diff against the reference</h3>" + _diff(run["reference"], best.source))
    else:
        h.append("<p id='best' class='warn'>No candidate was verified faster than the reference: no best.py was "
                 "written (the reference is never passed off as an optimisation).</p>")
    h.append(_technique_table(correct))
    fails = [r for r in done if not r.correct][-8:]
    if fails:
        h.append("<h2>Recent failures</h2>")
        for r in fails:
            h.append(f"<details><summary>#{r.id} {_e(r.status)} {_e(', '.join(r.reasons))}</summary>"
                     f"<pre>{_e((r.message or '(no message)')[:4000])}</pre></details>")
    h.append("<p class='muted'>Generated by kernelcraft from the run database; speedups are reference time / "
             "candidate time from paired, interleaved timing in isolated worker processes.</p></body></html>")
    return "\n".join(h)


def _technique_table(correct) -> str:
    stats = defaultdict(list)
    for r in correct:
        for t in techniques(r.source, r.meta):
            stats[t].append(r.speedup)
    if not stats:
        return ""
    rows = sorted(stats.items(), key=lambda kv: -max(kv[1]))
    body = "".join(f"<tr><td>{_e(t)}</td><td class='num'>{len(v)}</td><td class='num'>{max(v):.2f}x</td>"
                   f"<td class='num'>{math.exp(sum(math.log(x) for x in v) / len(v)):.2f}x</td></tr>" for t, v in rows)
    return ("<h2>Techniques (correct candidates)</h2><table id='techniques'><tr><th>technique</th><th>candidates</th>"
            f"<th>best</th><th>geomean</th></tr>{body}</table>")


def write_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Render `run_dir`'s report to `out` (default RUN_DIR/report.html) and return the path."""
    run = load_run(run_dir)
    path = Path(out) if out else Path(run_dir) / "report.html"
    path.write_text(render(run), encoding="utf-8")
    return path


def summary_json(run_dir: str | Path) -> dict:
    run = load_run(run_dir)
    return json.loads(json.dumps(run["summary"] or {}))
