"""The run report: one self-contained HTML page from a run directory's database.

No dependencies, no network, no JavaScript; everything shown comes from the database (a running or killed run
has a report too) and text from candidates and replies is HTML-escaped. One number per candidate everywhere
(`_Standing`): the confirmed speedup where the run confirms, else marked "unconfirmed".
Rationale: docs/design/search.md#report
"""
from __future__ import annotations

import ast
import difflib
import html
import json
import math
from collections import defaultdict
from pathlib import Path

from kernelcraft.search import fallback
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
                "events": db.events(), "invocations": db.invocations()}
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


class _Standing:
    """Where each candidate stands, in one place, so every part of the page agrees (docs/design/search.md#report)."""

    def __init__(self, rows, conf: dict, bar: float, summary: dict):
        self.conf, self.bar = conf, bar
        self.confirming = bool(conf) or bool(summary.get("confirmed"))  # this run's numbers are confirmations

    def held(self, r) -> dict | None:
        c = self.conf.get(r.id)
        ok = c and c["status"] == "correct" and c["speedup"] and c["ci_low"] is not None and c["ci_low"] > self.bar
        return c if ok else None

    def label(self, r) -> str:
        if not r.faster_than(self.bar):
            return r.status or r.state
        if self.held(r):
            return "confirmed"
        if r.id in self.conf:
            return "not reproduced"
        return "verified, unconfirmed" if self.confirming else "verified"

    def reported(self, r) -> float | None:
        """The speedup this page reports for a candidate's place: the confirmed one where the run confirms."""
        if not r.faster_than(self.bar):
            return None
        c = self.held(r)
        if c:
            return c["speedup"]
        return None if self.confirming else r.speedup

    def rank_key(self, r):
        group = {"confirmed": 0, "verified": 0, "verified, unconfirmed": 1, "not reproduced": 2}.get(self.label(r), 3)
        return (group if r.correct else 4, -(self.reported(r) or r.speedup or 0.0), r.id)


STATUS_MEANING = {"improved": "a candidate was verified faster (and confirmed where the run confirms): best.py "
                             "was written",
                  "no_improvement": "correct candidates, none verified faster: best.py holds the fallback",
                  "no_correct": "no candidate passed the correctness trials: best.py holds the fallback, the "
                                "reference itself",
                  "in progress": "the run has not finished"}

LABEL_COLORS = {"confirmed": "#187a3a", "verified": "#187a3a", "verified, unconfirmed": "#5f8f3a",
                "not reproduced": "#9a6700"}


def _plot(rows, standing: "_Standing", width=1100, height=380) -> str:
    pts = [r for r in rows if r.state == "done"]
    if not pts:
        return "<p class='muted'>No evaluated candidates yet.</p>"
    ok = [r.speedup for r in pts if r.correct] + [r.ci_high for r in pts if r.correct and r.ci_high] + [1.0]
    ok += [r.ci_low for r in pts if r.correct and r.ci_low]
    ok += [standing.conf[r.id]["speedup"] for r in pts if r.id in standing.conf and standing.conf[r.id]["speedup"]]
    lo, hi = math.log10(max(min(ok) / 1.3, 1e-3)), math.log10(max(ok) * 1.3)
    if hi - lo < 0.3:
        lo, hi = lo - 0.15, hi + 0.15
    failed = [r for r in pts if not r.correct]
    L, R, T = 60, 20, 16
    band = 26 if failed else 0
    ph = height - T - 64 - band
    xs = {r.id: L + (i + 0.5) * (width - L - R) / len(pts) for i, r in enumerate(pts)}
    y = lambda s: T + (hi - math.log10(s)) / (hi - lo) * ph  # noqa: E731
    out = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' viewBox='0 0 {width} {height}' "
           "role='img' aria-label='speedup over candidates' font-family='system-ui,sans-serif' font-size='11'>",
           f"<rect x='{L}' y='{T}' width='{width - L - R}' height='{ph}' fill='#fbfbfd' stroke='#dde'/>"]
    log_grid(out, lo, hi, y, L, width - R)
    ry = y(1.0)
    out.append(f"<text x='{width - R - 4}' y='{ry - 4:.1f}' text-anchor='end' fill='#556'>reference</text>")
    by = T + ph + band / 2 + 4
    if failed:  # the band of failures, labelled inside the plot's left edge
        out.append(f"<rect x='{L}' y='{T + ph + 3}' width='{width - L - R}' height='{band - 6}' fill='#fdf3f2'/>"
                   f"<text class='band' x='{L - 6}' y='{by + 4:.1f}' text-anchor='end' fill='#b3261e'>failed</text>")
    best, path = None, []
    for r in pts:  # the running best of the numbers the headline uses
        v = standing.reported(r)
        if v is not None and (best is None or v > best):
            best = v
        if best is not None:
            x, yy = xs[r.id], y(best)
            path.append(f"H{x:.1f} V{yy:.1f}" if path else f"M{x:.1f} {yy:.1f}")
    if path:
        out.append(f"<path id='best-line' data-final='{best:.2f}' d='{' '.join(path)}' fill='none' stroke='#187a3a' "
                   "stroke-width='1.5' opacity='0.6'/>")
    for r in pts:
        x = xs[r.id]
        c = standing.conf.get(r.id)
        tip = _e(f"#{r.id} {standing.label(r)}" + (f" {r.speedup:.2f}x [{_fmt(r.ci_low)}, {_fmt(r.ci_high)}]"
                                                   if r.correct else "")
                 + (f"; confirmation {c['speedup']:.2f}x" if c and c["speedup"] else (f"; confirmation {c['status']}"
                                                                                     if c else ""))
                 + " — " + ", ".join(techniques(r.source, r.meta)))
        if r.correct:
            col = LABEL_COLORS.get(standing.label(r), STATUS_COLORS["correct"])
            yy = y(r.speedup)
            if r.ci_low and r.ci_high:
                out.append(f"<line x1='{x:.1f}' x2='{x:.1f}' y1='{y(r.ci_high):.1f}' y2='{y(r.ci_low):.1f}' stroke='{col}'/>")
            out.append(f"<circle cx='{x:.1f}' cy='{yy:.1f}' r='4.5' fill='{col}'><title>{tip}</title></circle>")
            if c and c["speedup"]:  # the confirmation: a ring at its own number, joined to the search's
                cy = y(c["speedup"])
                out.append(f"<line x1='{x:.1f}' x2='{x:.1f}' y1='{yy:.1f}' y2='{cy:.1f}' stroke='#556' "
                           f"stroke-dasharray='2 2'/><circle class='confirmation' cx='{x:.1f}' cy='{cy:.1f}' r='6' "
                           f"fill='none' stroke='#187a3a' stroke-width='2'><title>{tip}</title></circle>")
        else:
            col = STATUS_COLORS.get(r.status or "", "#b3261e")
            out.append(f"<g stroke='{col}' stroke-width='2'><title>{tip}</title><line x1='{x - 4:.1f}' x2='{x + 4:.1f}' "
                       f"y1='{by - 4:.1f}' y2='{by + 4:.1f}'/><line x1='{x - 4:.1f}' x2='{x + 4:.1f}' y1='{by + 4:.1f}' "
                       f"y2='{by - 4:.1f}'/></g>")
    axis = T + ph + band
    step = max(1, math.ceil(len(pts) / 25))  # x-axis: candidate ids, at most ~25 labels
    for i, r in enumerate(pts):
        if i % step == 0 or i == len(pts) - 1 and (len(pts) - 1) % step >= step / 2:
            x = xs[r.id]
            out.append(f"<line x1='{x:.1f}' x2='{x:.1f}' y1='{axis}' y2='{axis + 4}' stroke='#99a'/>"
                       f"<text class='xlabel' x='{x:.1f}' y='{axis + 16}' text-anchor='middle' fill='#445'>#{r.id}</text>")
    line = ("best confirmed speedup so far" if standing.confirming else "best verified speedup so far")
    out.append(f"<text x='{(L + width - R) / 2:.0f}' y='{height - 22}' text-anchor='middle' fill='#334'>candidate, in "
               "order of proposal</text>"
               f"<text x='{(L + width - R) / 2:.0f}' y='{height - 6}' text-anchor='middle' fill='#667'>dots: the search's "
               f"measurement with its 95% CI{'; rings: the confirmation in a fresh worker' if standing.conf else ''}; "
               f"line: {line}</text></svg>")
    return "".join(out)


HARNESS_FUNCTIONS = ("get_inputs", "get_init_inputs")


def _comparable_reference(reference: str, source: str) -> tuple[str, list[str]]:
    """The reference without the task's input functions the candidate does not define (docs/design/search.md#report)."""
    try:
        ref_tree, cand_tree = ast.parse(reference), ast.parse(source)
    except SyntaxError:
        return reference, []
    defined = {n.name for n in cand_tree.body if isinstance(n, ast.FunctionDef)}
    lines, dropped = reference.splitlines(), []
    for node in sorted(ref_tree.body, key=lambda n: -n.lineno):
        if isinstance(node, ast.FunctionDef) and node.name in HARNESS_FUNCTIONS and node.name not in defined:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
            del lines[first:node.end_lineno]
            dropped.append(node.name)
    while lines and not lines[-1].strip():
        lines.pop()
    return "\n".join(lines) + "\n", sorted(dropped)


def _diff(reference: str, source: str) -> str:
    ref, dropped = _comparable_reference(reference, source)
    lines = list(difflib.unified_diff(ref.splitlines(), source.splitlines(), "reference.py", "best.py",
                                      lineterm="", n=3))
    cls = lambda ln: "add" if ln.startswith("+") and not ln.startswith("+++") else (  # noqa: E731
        "del" if ln.startswith("-") and not ln.startswith("---") else ("hunk" if ln.startswith("@@") else ""))
    body = "\n".join(f"<span class='{cls(ln)}'>{_e(ln)}</span>" for ln in lines)
    note = (f"<p class='muted' id='diff-note'>{_e(' and '.join(dropped))} {'are' if len(dropped) > 1 else 'is'} the "
            "task's and left out of the reference's side: inputs always come from the task, never from a "
            "candidate.</p>" if dropped else "")
    return note + f"<pre class='diff'>{body or _e('(identical)')}</pre>"


def _terms(standing: "_Standing", bar: float, control, measured: bool = False, fb: bool = False) -> str:
    ctrl = (f"; here {bar:.3f}x, because the null control (the reference timed against itself) measured a bias"
            if bar > 1.0 and control else "")
    rows = [("correct", "passed every correctness trial: outputs within tolerance of the reference's on fresh "
                        "random inputs"),
            ("verified (faster)", f"correct, and the lower end of its speedup's 95% confidence interval is above the "
                                  f"bar ({bar:.3f}x: the --min-speedup{ctrl}), so timing noise cannot explain it"),
            ("confirmed", "verified, then re-timed in a fresh worker with new inputs, another seed and twice the "
                          "timing budget, and still verified: the confirmed number is the one reported (headline, "
                          "leaderboard order, best-so-far line)"),
            ("verified, unconfirmed", "verified by the search's own measurement but not re-timed (only the leaders "
                                      "are); ranked after every confirmed candidate"),
            ("not reproduced", "verified in the search, but the re-timing did not hold up: not a result")]
    if not standing.confirming:
        rows = [r for r in rows if r[0] not in ("verified, unconfirmed", "not reproduced")]
    rows += [("incorrect", "outputs outside tolerance on a trial; rejected: a guard caught a shortcut (its reason "
                           "names which); failed: a build error, runtime error or timeout; parse error: the proposal "
                           "held no candidate code")]
    if fb:
        rows.append(("fallback", f"what best.py holds when no candidate was verified faster: {fallback.RULE}"))
    if measured:
        rows.append(("null control", "the reference timed against itself before any candidate: what timing noise "
                                     "and bias alone read on this host (ideally 1.00x). When its 95% CI lies wholly "
                                     "above 1, the bar is raised to its speedup"))
    return ("<h2>What the words mean</h2><dl id='terms'>"
            + "".join(f"<dt><b>{_e(k)}</b></dt><dd>{_e(v)}</dd>" for k, v in rows) + "</dl>")


def render(run: dict) -> str:
    rows, conf, summ = run["rows"], run["confirmations"], run["summary"] or {}
    control = run.get("control") or {}
    biased = control.get("status") == "correct" and (control.get("ci95") or [0])[0] > 1.0
    ctrl = control.get("speedup") if biased else None
    bar = summ.get("bar") or max((run["options"] or {}).get("min_speedup", 1.0), ctrl or 1.0)
    standing = _Standing(rows, conf, bar, summ)
    done = [r for r in rows if r.state == "done"]
    correct = [r for r in rows if r.correct]
    ranked = sorted(rows, key=standing.rank_key)
    fb = summ.get("fallback") or {}  # a finished run without a verified-faster best (search/fallback.py)
    if summ:  # a finished (or stopped) run: the loop's own, confirmed choice
        best = next((r for r in rows if r.id == summ.get("best_candidate")), None)
    else:  # a run in progress: the leader so far, by the same numbers as the leaderboard
        best = next((r for r in ranked if standing.reported(r) is not None
                     or standing.label(r) == "verified, unconfirmed"), None)
    status = summ.get("status", "in progress")
    scls = {"improved": "ok", "no_improvement": "warn", "no_correct": "bad"}.get(status, "muted")
    if best is not None and standing.held(best):
        c = standing.held(best)
        best_sp, ci, how = c["speedup"], [c["ci_low"], c["ci_high"]], "confirmed"
    elif best is not None:
        best_sp, ci = best.speedup, [best.ci_low, best.ci_high]
        how = "unconfirmed" if standing.confirming or not summ else ""
    else:  # a fallback's number (1.00x and no CI for the reference), or none yet
        best_sp, ci, how = fb.get("speedup"), fb.get("ci95"), ""
    tokens = summ.get("tokens") or {}
    wrong = [r.status for r in done if not r.correct]
    cards = [("status", f"<span class='{scls}'>{_e(status)}</span>", STATUS_MEANING.get(status, "")),
             ("best speedup", (f"<span id='headline'>{best_sp:.2f}x</span>" if best_sp else "—")
              + (f"<span class='muted' style='font-size:12px;display:block'>95% CI {_fmt(ci[0])}–{_fmt(ci[1])}"
                 f"{f' ({how})' if how else ''}</span>" if ci and ci[0] else "")
              + (f"<span class='warn' style='font-size:12px;display:block' id='fallback-card'>fallback: "
                 f"{'the reference' if fb['kind'] == 'reference' else 'not verified faster'}</span>" if fb else ""),
              "the best candidate's speedup over the reference: the confirmed number where the run confirms; a "
              "fallback's where none was verified faster (1.00x for the reference itself)"),
             ("candidates", len(rows) if not summ.get("budget") else f"{len(rows)} / {summ['budget']}",
              "candidates proposed (of the budget)"),
             ("correct", len(correct), "passed every correctness trial, faster or not"),
             ("verified faster", sum(r.faster_than(bar) for r in rows),
              f"correct, with the 95% CI's lower end above the bar ({bar:.3f}x)")]
    if standing.confirming:
        cards.append(("confirmed", sum(standing.held(r) is not None for r in rows),
                      "verified faster, re-timed in a fresh worker and still verified faster"))
    rejected = wrong.count("rejected")
    cards += [("incorrect", wrong.count("incorrect"), "outputs outside tolerance")]
    if rejected:
        cards.append(("rejected", rejected, "a guard caught a shortcut (its reason names which)"))
    cards += [("failed", len(wrong) - wrong.count("incorrect") - rejected - wrong.count("parse_error"),
               "build error, runtime error or timeout"),
              ("parse errors", sum(r.status == "parse_error" for r in rows), "the proposal held no candidate code")]
    if control.get("speedup"):
        cards.append(("null control", f"{control['speedup']:.3f}x<span class='muted' style='font-size:12px;display:block'>"
                      "reference vs itself</span>", "the reference timed against itself: what timing noise alone "
                      "reads here (ideally 1.00x); when its 95% CI lies wholly above 1 the bar is raised to its speedup"))
    if tokens.get("prompt") or tokens.get("completion"):
        cards.append(("tokens", f"{tokens.get('prompt', 0) + tokens.get('completion', 0):,}",
                      "prompt and completion tokens of the LLM policy"))
    opts = run["options"] or {}
    spans = run.get("invocations") or []
    total = summ.get("wall_s_total") or (sum(b - a for a, b in spans) if spans else summ.get("wall_s"))
    n_inv = summ.get("invocations") or len(spans) or 1
    when = (f" · {total:.0f} s" + (f" over {n_inv} invocations" if n_inv > 1 else "")) if total else ""
    stopped = summ.get("stopped")
    h = ["<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
         f"<title>kernelcraft report — {_e(run['task'])}</title><style>{_CSS}</style></head><body>",
         f"<h1>kernelcraft optimize — {_e(run['task'])}</h1>",
         f"<div class='sub' id='header'>{_e(run['device'])} · policy <b>{_e(opts.get('policy', '?'))}</b>"
         + (f" · stopped: <span title='{_e(summ.get('stopped_detail', ''))}'>{_e(stopped)}</span>" if stopped else "")
         + _e(when) + "</div>",
         (f"<p class='muted' id='stopped'>Stopped ({_e(stopped)}): {_e(summ['stopped_detail'])}.</p>"
          if summ.get("stopped_detail") else ""),
         "<div class='cards' id='summary'>" + "".join(f"<div class='card' title='{_e(tip)}'>{_e(k)}<b>{v}</b></div>"
                                                      for k, v, tip in cards) + "</div>", "<h2>Speedup over candidates</h2>", f"<div id='plot'>{_plot(rows, standing)}</div>"]
    h.append("<h2>Leaderboard</h2>"
             + ("<p class='muted'>Ranked by the confirmed speedup; candidates verified only by the search's own "
                "measurement come after, marked unconfirmed.</p>" if standing.confirming else "")
             + "<table id='leaderboard'><tr><th>#</th><th>id</th><th>round</th><th>status</th>"
             "<th>speedup (search)</th><th>95% CI</th><th>confirmed</th><th>techniques</th><th>policy</th>"
             "<th>parents</th></tr>")
    for i, r in enumerate(ranked, 1):
        c = conf.get(r.id)
        st = standing.label(r)
        color = LABEL_COLORS.get(st) or STATUS_COLORS.get(r.status or "", "#556")
        reasons = f" <span class='muted'>({_e(', '.join(r.reasons))})</span>" if r.reasons else ""
        if fb.get("candidate") == r.id:
            reasons += " <span class='warn'>· best.py (fallback)</span>"
        h.append(f"<tr data-id='{r.id}'><td class='num'>{i if r.correct else ''}</td><td class='num'>{r.id}</td>"
                 f"<td class='num'>{r.round}</td>"
                 f"<td style='color:{color}'>{_e(st)}{reasons}</td><td class='num'>{_fmt(r.speedup)}{'x' if r.speedup else ''}</td>"
                 f"<td class='num'>{_fmt(r.ci_low)}–{_fmt(r.ci_high)}</td>"
                 f"<td class='num'>{(_fmt(c['speedup']) + 'x') if c and c['speedup'] else (_e(c['status']) if c else '')}</td>"
                 f"<td>{''.join(f'<span class=tag>{_e(t)}</span>' for t in techniques(r.source, r.meta))}</td>"
                 f"<td>{_e(r.policy)}</td><td>{_e(', '.join(map(str, r.parents)))}</td></tr>")
    h.append("</table>")
    h.append("<h2>Best candidate</h2>")
    if best is not None:
        h.append(f"<p id='best'>Candidate <b>#{best.id}</b> — {best_sp:.2f}x{f' ({how})' if how else ''}. Techniques: "
                 + "".join(f"<span class='tag'>{_e(t)}</span>" for t in techniques(best.source, best.meta)) + "</p>")
        h.append("<h3>Diff against the reference</h3>" + _diff(run["reference"], best.source))
    else:
        h.append(_fallback(fb, rows, run["reference"]))
    h.append(_terms(standing, bar, biased, measured=bool(control.get("status")), fb=bool(fb)))
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


def _fallback(fb: dict, rows, reference: str) -> str:
    """The best-candidate section of a run without a verified-faster best: its fallback, said as such."""
    if not fb:
        return "<p id='best' class='warn'>No candidate is verified faster than the reference.</p>"
    row = next((r for r in rows if r.id == fb.get("candidate")), None)
    return (f"<p id='best' class='warn'><b>Fallback</b>: no candidate was verified faster than the reference, so "
            f"{_e(fallback.describe(fb))}.</p>"
            + ("<h3>Diff against the reference</h3>" + _diff(reference, row.source) if row else ""))


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
