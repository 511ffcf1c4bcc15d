"""The bench report: one self-contained HTML page from a bench summary (`metrics.summarise`).

No dependencies, no network, no JavaScript; plots are SVG generated here; every string from a task, a
candidate or a verdict is HTML-escaped. The header's time covers every invocation of the directory.
Rationale: docs/design/bench.md#report
"""
from __future__ import annotations

import math
from pathlib import Path

from kernelcraft.bench.metrics import OUTCOME_MEANING, OUTCOME_WORDS, OUTCOMES
from kernelcraft.search.report import _CSS, _e, log_grid

_CSS_BENCH = "th.num{text-align:right}"
SERIES_COLORS = {"candidate": "#1f5fbf", "inductor": "#c25e00", "inductor-max-autotune": "#7d4e9e",
                 "cudagraph": "#187a3a"}
STATUS_CLASS = {"correct": "ok", "incorrect": "bad", "rejected": "bad", "no_candidate": "warn"}


def _x(v, digits=2, suffix="x") -> str:
    return "—" if v is None else f"{v:.{digits}f}{suffix}"


def _pct(v) -> str:
    return "—" if v is None else f"{100 * v:.0f}%"


def _spread(lo_hi, fmt) -> str:
    """' [lo–hi]' in small print, or '' without an interval (what the per-task CIs allow, `metrics`)."""
    if not lo_hi or None in lo_hi or lo_hi[0] == lo_hi[1]:
        return ""
    return f"<span class='muted' style='font-size:11px'> [{fmt(lo_hi[0])}–{fmt(lo_hi[1])}]</span>"


def _log_range(values) -> tuple[float, float]:
    vals = [v for v in values if v and v > 0] + [1.0]
    lo, hi = math.log10(max(min(vals) / 1.3, 1e-3)), math.log10(max(vals) * 1.3)
    if hi - lo < 0.3:
        lo, hi = lo - 0.15, hi + 0.15
    return lo, hi


def _series(summary: dict) -> dict[str, list]:
    """{series name: [speedup or None per item]} — the candidate and each measured baseline."""
    items = summary.get("items") or []
    names = [b for b in (summary.get("baselines") or {}).get("names", []) if b != "eager"]
    out = {}
    if not summary.get("baselines_only"):
        out["candidate"] = [r["speedup"] for r in items]
    for b in names:
        out[b] = [(r["baselines"].get(b) or {}).get("speedup") if (r["baselines"].get(b) or {}).get("status")
                  == "correct" else None for r in items]
    return out


def _legend(series, x0: int, y0: int) -> str:
    parts = []
    for i, name in enumerate(series):
        x = x0 + i * 170
        parts.append(f"<rect x='{x}' y='{y0 - 9}' width='12' height='10' fill='{SERIES_COLORS.get(name, '#556')}'/>"
                     f"<text x='{x + 16}' y='{y0}' fill='#334'>{_e(name)}</text>")
    return "".join(parts)


def distribution_plot(summary: dict, width: int = 1100, height: int = 320) -> str:
    series = _series(summary)
    if not series or not summary.get("items"):
        return "<p class='muted'>Nothing measured yet.</p>"
    lo, hi = _log_range([v for s in series.values() for v in s])
    L, R, T, B = 60, 20, 28, 40
    ph, pw = height - T - B, width - L - R
    y = lambda s: T + (hi - math.log10(s)) / (hi - lo) * ph
    n = len(summary["items"])
    out = [(f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' viewBox='0 0 {width} {height}' "
           "role='img' aria-label='speedup distribution' font-family='system-ui,sans-serif' font-size='11'>"),
           f"<rect x='{L}' y='{T}' width='{pw}' height='{ph}' fill='#fbfbfd' stroke='#dde'/>"]
    log_grid(out, lo, hi, y, L, width - R)
    out.append(_legend(series, L, 14))
    fails = []
    for name, vals in series.items():
        ok = sorted((v for v in vals if v), reverse=True)
        fails.append(f"{name}: {n - len(ok)} failed")
        if not ok:
            continue
        c = SERIES_COLORS.get(name, "#556")
        pts = [(L + (i + 0.5) * pw / n, y(v)) for i, v in enumerate(ok)]
        out.append("<polyline fill='none' stroke='{}' stroke-width='1.5' points='{}'/>".format(
            c, " ".join(f"{px:.1f},{py:.1f}" for px, py in pts)))
        for (px, py), v in zip(pts, ok):
            out.append(f"<circle cx='{px:.1f}' cy='{py:.1f}' r='3' fill='{c}'><title>{_e(name)} {v:.3f}x</title></circle>")
    out.append(f"<text x='{L + pw / 2:.0f}' y='{height - 8}' text-anchor='middle' fill='#556'>tasks ranked by speedup "
               f"vs eager, each series sorted on its own (correct results only; {_e('; '.join(fails))})</text></svg>")
    return "".join(out)


def task_bars(summary: dict, height: int = 240) -> str:
    """Per task, the candidate's bar next to each baseline's. Task names are whole, vertical under their group
    (a group is at least a line of text wide, so neighbours never overlap), and the plot grows downwards to fit
    the longest (never cut, never rotated into each other)."""
    series = _series(summary)
    items = summary.get("items") or []
    if not series or not items:
        return "<p class='muted'>Nothing measured yet.</p>"
    k = len(series)
    bw = 7 if len(items) * k < 160 else 4
    gw = max(k * bw + 8, 16)
    longest = max(len(str(r["item"])) for r in items)
    L, R, T, B = 60, 20, 28, 20 + int(longest * 6.5)
    width = max(700, L + R + gw * len(items))
    ph = height - T - 20
    height = height + B - 20
    lo, hi = _log_range([v for s in series.values() for v in s])
    y = lambda s: T + (hi - math.log10(s)) / (hi - lo) * ph
    out = [(f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' viewBox='0 0 {width} {height}' "
           "role='img' aria-label='per-task speedups' font-family='system-ui,sans-serif' font-size='10'>"),
           f"<rect x='{L}' y='{T}' width='{width - L - R}' height='{ph}' fill='#fbfbfd' stroke='#dde'/>"]
    log_grid(out, lo, hi, y, L, width - R)
    out.append(_legend(series, L, 14))
    y1 = y(1.0)
    for i, r in enumerate(items):
        x0 = L + i * gw + 4
        for j, (name, vals) in enumerate(series.items()):
            v, x = vals[i], x0 + j * bw
            c = SERIES_COLORS.get(name, "#556")
            if v:
                top, bot = sorted((y(v), y1))
                out.append(f"<rect x='{x:.1f}' y='{top:.1f}' width='{bw - 1}' height='{max(bot - top, 1):.1f}' fill='{c}'>"
                           f"<title>{_e(r['item'])} — {_e(name)}: {v:.3f}x</title></rect>")
            else:
                what = r["status"] if name == "candidate" else ((r["baselines"].get(name) or {}).get("status") or "—")
                out.append(f"<text x='{x + bw / 2:.1f}' y='{y1 + 4:.1f}' text-anchor='middle' fill='{c}' font-size='11'>"
                           f"×<title>{_e(r['item'])} — {_e(name)}: {_e(what)}</title></text>")
        lx, ly = x0 + (k * bw) / 2 + 3, T + ph + 6
        out.append(f"<text class='xlabel' x='{lx:.1f}' y='{ly}' transform='rotate(-90 {lx:.1f} {ly})' "
                   f"text-anchor='end' fill='#445'>{_e(r['item'])}</text>")
    out.append("</svg>")
    return "".join(out)


def _fast_table(summary: dict) -> str:
    keys = list((summary.get("fast_p") or {}).keys())
    if not keys:
        return ""
    head = "".join(f"<th class='num' title='{_e(f'correct with a speedup above {k}x (point estimate), share of all tasks')}'>"
                   f"fast<sub>{_e(k)}</sub></th>" for k in keys)
    rows = [("all tasks, vs eager", summary, "")]
    if summary.get("fast_p_vs_compile"):
        rows.append(("all tasks, vs best torch.compile", summary, "_vs_compile"))
    for lv, m in (summary.get("by_level") or {}).items():
        rows.append((f"level {lv}, vs eager", m, ""))
        if m.get("fast_p_vs_compile"):
            rows.append((f"level {lv}, vs best torch.compile", m, "_vs_compile"))
    body = []
    for label, m, sfx in rows:
        fp, rng = m.get(f"fast_p{sfx}") or {}, m.get(f"fast_p{sfx}_range") or {}
        body.append(f"<tr><td>{_e(label)}</td><td class='num'>{m.get('tasks', '')}</td>"
                    + "".join(f"<td class='num'>{_pct(fp.get(k))}{_spread(rng.get(k), _pct)}</td>" for k in keys)
                    + f"<td class='num'>{_x(m.get(f'geomean_speedup{sfx}'))}"
                    f"{_spread(m.get(f'geomean_speedup{sfx}_ci95'), _x)}</td>"
                    f"<td class='num'>{_x(m.get(f'median_speedup{sfx}'))}</td>"
                    f"<td class='num'>{_x(m.get(f'geomean_speedup{sfx}_correct'))}</td></tr>")
    return ("<table id='fastp'><tr><th>scope</th><th class='num'>tasks</th>" + head + "<th class='num'>geomean "
            "(failures = 1)</th><th class='num'>median (failures = 1)</th><th class='num'>geomean (correct only)</th>"
            "</tr>" + "".join(body) + "</table>")


def _baseline_table(summary: dict) -> str:
    b = (summary.get("baselines") or {})
    rows = []
    for name, m in (b.get("summary") or {}).items():
        if name == "eager":
            rows.append(f"<tr><td>eager</td><td class='num'>{_e(m.get('tasks', ''))}</td><td colspan='5' class='muted'>"
                        f"{_e(m.get('note', ''))}</td></tr>")
            continue
        fp = m.get("fast_p") or {}
        rows.append(f"<tr><td>{_e(name)}</td><td class='num'>{_e(m.get('tasks', ''))}</td>"
                    f"<td class='num'>{_e(m.get('correct', ''))}</td>"
                    f"<td class='num'>{_x(m.get('geomean_speedup_correct'))}</td>"
                    f"<td class='num'>{_x(m.get('median_speedup_correct'))}</td>"
                    f"<td class='num'>{_pct(fp.get('1'))}</td><td class='num'>{_pct(fp.get('2'))}</td></tr>")
    skipped = "".join(f"<li>{_e(k)}: {_e(v)}</li>" for k, v in (b.get("skipped") or {}).items())
    return ("<table id='baselines'><tr><th>baseline</th><th class='num'>tasks</th><th class='num'>correct</th>"
            "<th class='num'>geomean vs eager (correct)</th><th class='num'>median vs eager (correct)</th>"
            "<th class='num'>fast<sub>1</sub></th><th class='num'>fast<sub>2</sub></th></tr>"
            + "".join(rows) + "</table>" + (f"<p>Skipped:</p><ul>{skipped}</ul>" if skipped else ""))


def _roof_cols(summary: dict) -> tuple[str, ...]:
    """The roofline's fractions the task table shows: none without peaks for the bench's GPU (`bench.roofline`)."""
    if not (summary.get("roofline") or {}).get("product"):
        return ()
    return ("reference", "compile") if summary.get("baselines_only") else ("reference", "compile", "candidate")


def _roof_head(cols) -> str:
    tip = "the roofline bound over the measured time: 100% is at the roof"
    return ("<th class='num' title='max(FLOPs / peak, bytes / bandwidth)'>bound, ms</th><th>bound by</th>"
            + "".join(f"<th class='num' title='{tip}'>roof: {c}</th>" for c in cols)) if cols else ""


def _roof_cells(r: dict, cols) -> str:
    x = r.get("roofline") or {}
    pct = lambda v: "" if v is None else f"{100 * v:.0f}%" if v >= 0.1 else f"{100 * v:.2g}%"  # noqa: E731
    return (f"<td class='num'>{'' if not x else format(x['bound_ms'], '.3g')}</td><td>{_e(x.get('bound_by', ''))}</td>"
            + "".join(f"<td class='num'>{pct(x.get(c))}</td>" for c in cols)) if cols else ""


def _roof_note(summary: dict) -> str:
    """Under the task table: the peaks the roofline used, or why there is none, and the tasks without one."""
    r = summary.get("roofline")
    if not r:
        return ""
    if not r.get("product"):
        return f"<p class='muted' id='roofline'>{_e(r.get('note'))}</p>"
    rates = ", ".join(f"{k} {v:g}" for k, v in r["tflops"].items())
    without = "".join(f"<li>{_e(k)}: {_e(v)}</li>" for k, v in (r.get("without") or {}).items())
    return (f"<p class='muted' id='roofline'>Roofline on the {_e(r['product'])}: {r['memory_tb_s']:g} TB/s, TFLOP/s "
            f"{_e(rates)} ({_e(r['source'])}; dense). {_e(r['note'])}. Minimal work: the reference's FLOPs as "
            "PyTorch's FlopCounterMode counts them, and its inputs, parameters and outputs moved once.</p>"
            + (f"<p class='muted'>Without a roofline:</p><ul class='muted'>{without}</ul>" if without else ""))


def _items_table(summary: dict) -> str:
    names = [b for b in (summary.get("baselines") or {}).get("names", []) if b != "eager"]
    roof = _roof_cols(summary)
    if summary.get("baselines_only"):  # no candidate was judged: each task's baselines, not a column of statuses
        head = ("<tr><th>task</th><th class='num'>level</th>" + "".join(f"<th class='num'>{_e(b)} vs eager</th>"
                                                                          for b in names) + _roof_head(roof) + "</tr>")
        body = []
        for r in summary.get("items") or []:
            cells = []
            for b in names:
                x = r["baselines"].get(b) or {}
                ok = x.get("status") == "correct"
                cells.append(f"<td class='num {'' if ok else STATUS_CLASS.get(x.get('status'), 'muted')}'>"
                             f"{_x(x.get('speedup')) if ok else _e(x.get('status') or '—')}</td>")
            body.append(f"<tr><td>{_e(r['item'])}</td><td class='num'>{_e(r['level'] if r['level'] is not None else '')}"
                        f"</td>{''.join(cells)}{_roof_cells(r, roof)}</tr>")
        return "<table id='items'>" + head + "".join(body) + "</table>"
    head = ("<tr><th>task</th><th class='num'>level</th><th>status</th><th class='num'>speedup</th>"
            "<th class='num'>95% CI</th><th class='num'>vs best compile</th>"
            + "".join(f"<th class='num'>{_e(b)}</th>" for b in names) + _roof_head(roof) + "<th>message</th></tr>")
    body = []
    for r in summary.get("items") or []:
        cls = STATUS_CLASS.get(r["status"], "warn")
        reasons = f" <span class='muted'>({_e(', '.join(r['reasons']))})</span>" if r["reasons"] else ""
        if r.get("outcome") in ("faster", "not_faster"):  # the headline's word for it
            reasons += f" <span class='muted'>· {_e(OUTCOME_WORDS[r['outcome']])}</span>"
        if r.get("fallback"):  # scored at an optimize run's fallback (bench/fallback.py)
            reasons += f" <span class='warn'>· fallback: {_e(r['fallback'])}</span>"
        ci = r.get("ci95")
        cells = []
        for b in names:
            x = r["baselines"].get(b) or {}
            cells.append(f"<td class='num'>{_x(x.get('speedup')) if x.get('status') == 'correct' else _e(x.get('status') or '—')}</td>")
        body.append(f"<tr><td>{_e(r['item'])}</td><td class='num'>{_e(r['level'] if r['level'] is not None else '')}</td>"
                    f"<td class='{cls}'>{_e(r['status'])}{reasons}</td><td class='num'>{_x(r['speedup'], 3)}</td>"
                    f"<td class='num'>{(_x(ci[0]) + '–' + _x(ci[1])) if ci else ''}</td>"
                    f"<td class='num'>{_x(r.get('speedup_vs_compile'), 3)}</td>{''.join(cells)}{_roof_cells(r, roof)}"
                    f"<td class='muted'>{_e(r.get('message') or '')}</td></tr>")
    return "<table id='items'>" + head + "".join(body) + "</table>"


def _time_table(t: dict) -> str:
    """The run directory's evaluations by kind and level: seconds on the device (per task), off it, waiting for it,
    and the largest phases (`timeuse`)."""
    def num(v, fmt="{:.0f}"):
        return "" if v is None else fmt.format(v)

    rows = [("all", t)] + list(t.get("by_kind", {}).items()) + [(f"level {k}", v)
                                                                 for k, v in t.get("by_level", {}).items()]
    head = ("<table id='time'><tr><th>evaluations of</th>" + "".join(
        f"<th class='num'>{h}</th>" for h in ("count", "tasks", "on the device, s", "per task, s", "median each, s",
                                               "off it, s", "waiting, s")) + "<th>largest phases, s</th></tr>")
    body = "".join(
        f"<tr><td>{_e(name)}</td><td class='num'>{b['evaluations']}</td><td class='num'>{b['tasks']}</td>"
        f"<td class='num'>{num(b['device_s'])}</td><td class='num'>{num(b.get('device_s_per_task'), '{:.1f}')}</td>"
        f"<td class='num'>{num(b.get('median_device_s'), '{:.2f}')}</td><td class='num'>{num(b['off_device_s'])}</td>"
        f"<td class='num'>{num(b['wait_s'])}</td>"
        f"<td>{_e(', '.join(f'{k} {v:.0f}' for k, v in list(b['phases_s'].items())[:4]))}</td></tr>"
        for name, b in rows)
    return head + body + "</table><p class='muted'>Every evaluation this directory holds, whichever invocation " \
        "measured it (baselines from the shared cache and verdicts an optimize run took from them are not counted " \
        "again). On the device: the judge's device phase, under the device lock on a GPU.</p>"


def _secs(v: float) -> str:
    v = float(v or 0)
    if v < 100:
        return f"{v:.1f} s" if v < 10 else f"{v:.0f} s"
    return f"{v / 60:.0f} min" if v < 6000 else f"{v / 3600:.1f} h"


def _time(s: dict) -> str:
    """The header's time (docs/design/bench.md#report): every evaluation in the directory, then this invocation's wall."""
    t = s.get("time_use") or {}
    wall = s.get("wall_s")
    now = ""
    if wall is not None:
        now = (f"this invocation {_secs(wall)} (resumed {s['resumed']} item(s) already judged)" if s.get("resumed")
               else f"{_secs(wall)} wall")
    if not t.get("evaluations"):
        return now or "no evaluation yet"
    spent = (t.get("device_s") or 0) + (t.get("off_device_s") or 0) + (t.get("wait_s") or 0)
    return (f"{t['evaluations']} evaluations took {_secs(spent)} ({_secs(t.get('device_s'))} of it on the device) "
            "over every invocation" + (f"; {now}" if now else ""))


OUTCOME_CLASS = {"faster": "ok", "not_faster": "warn", "incorrect": "bad", "rejected": "bad", "failed": "bad",
                 "no_candidate": "warn"}
FAST_P_TIP = ("fast_p: the share of all scored tasks whose candidate is correct with a speedup above p, by the point "
              "estimate (fast_1 can count a task whose 95% CI reaches below 1; fast_0 is the share correct); the "
              "small [lo–hi] is what the per-task CIs allow")


def _outcome_legend(s: dict) -> str:
    """What each headline outcome means, the ones on the page."""
    o = s.get("outcomes") or {}
    keys = [k for k in OUTCOMES if o.get(k) or k not in ("rejected", "no_candidate")]
    return ("<dl id='outcomes' class='muted' style='font-size:12px'>"
            + "".join(f"<dt><b>{_e(OUTCOME_WORDS[k])}</b></dt><dd>{_e(OUTCOME_MEANING[k])}</dd>" for k in keys)
            + "</dl>")


def render(summary: dict) -> str:
    s = summary
    scored = not s.get("baselines_only")
    b = s.get("baselines") or {}
    cards = [("tasks", s.get("tasks"), "tasks scored (input errors are not)")]
    if scored:
        fp = s.get("fast_p") or {}
        o = s.get("outcomes") or {}
        cards += [(OUTCOME_WORDS[k], f"<span class='{OUTCOME_CLASS[k]}' id='outcome-{k}'>{o.get(k, 0)}</span>",
                   OUTCOME_MEANING[k]) for k in OUTCOMES if o.get(k) or k not in ("rejected", "no_candidate")]
        cards += [("fast<sub>1</sub> vs eager", _pct(fp.get("1")), FAST_P_TIP),
                  ("geomean speedup", _x(s.get("geomean_speedup"))
                   + "<span class='muted' style='font-size:12px;display:block'>failures = 1.0</span>",
                   "geometric mean over all scored tasks, every failure counted as 1.0x (the reference stays)"),
                  ("geomean (correct)", _x(s.get("geomean_speedup_correct")), "geometric mean over correct tasks only")]
        fell = s.get("fallbacks") or {}
        if any(fell.values()):
            cards.append(("at a fallback", f"<span class='warn' id='fallbacks'>{sum(fell.values())}</span>",
                          "correct, not faster: optimize verified no candidate faster and the task is scored at its "
                          "fallback (" + ", ".join(f"{k} {n}" for k, n in fell.items() if n) + ")"))
        if s.get("fast_p_vs_compile"):
            cards.append(("fast<sub>1</sub> vs compile", _pct(s["fast_p_vs_compile"].get("1")),
                          "fast_1 against each task's best correct torch.compile baseline instead of eager"))
    unverifiable = s.get("unverifiable") if scored else sum((m or {}).get("unverifiable") or 0  # the baselines'
                                                             for m in (b.get("summary") or {}).values())
    if unverifiable:
        cards.append(("unverifiable", f"{unverifiable} <span class='muted' style='font-size:12px;display:block'>"
                      "failures the reference could not judge</span>", "unverifiable_reference: the reference draws "
                      "random numbers or is ill-conditioned in fp32, so the fixed tolerance judged"))
    if s.get("input_errors"):
        cards.append(("input errors", f"<span class='bad'>{s['input_errors']}</span>",
                      "inputs the bench could not use (not scored)"))
    proto = s.get("protocol") or {}
    h = ["<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
         f"<title>kernelcraft bench — {_e(s.get('source'))}</title><style>{_CSS}{_CSS_BENCH}</style></head><body>",
         f"<h1>kernelcraft bench — {_e(s.get('source'))}</h1>",
         f"<div class='sub' id='header'>{_e(s.get('device'))} · "
         + ("<b>baselines only</b> (no candidates judged)" if not scored else
            f"candidates: <b>{_e(s.get('candidates'))}</b>"
            + (f" (policy {_e(s.get('policy'))}, budget {_e(s.get('budget'))}, {_e(s.get('task_jobs') or 1)} task(s) "
               "at a time)" if s.get("candidates") == "optimize" else ""))
         + f" · {proto.get('trials')} trials, {proto.get('time_budget_s')} s timing budget, mode {_e(proto.get('mode'))}"
         + f" · baselines {_e(', '.join(b.get('names') or []) or 'none')}"
         + f" · {_e(_time(s))}</div>",
         "<div class='cards' id='summary'>" + "".join(f"<div class='card' title='{_e(tip)}'>{k}<b>{v}</b></div>"
                                                      for k, v, tip in cards) + "</div>"]
    if scored:
        h += [_outcome_legend(s), "<h2>fast<sub>p</sub> and speedups</h2>", _fast_table(s),
              f"<p class='muted' id='fastp-legend'>{_e(FAST_P_TIP)}. {_e(s.get('speedup_definition', ''))}</p>"]
    h += ["<h2>Speedup distribution</h2>", f"<div id='distribution'>{distribution_plot(s)}</div>",
          "<h2>Per task, against the baselines</h2>", f"<div id='bars' style='overflow-x:auto'>{task_bars(s)}</div>",
          "<h2>Baselines</h2>", _baseline_table(s),
          (f"<p class='muted'>Baseline verdicts: measured in this run {b.get('measured_now', 0)}, from this "
          f"directory {b.get('from_run', 0)}, from the cache {b.get('cache_hits', 0)}.</p>"),
          "<h2>Tasks</h2>", _items_table(s), _roof_note(s)]
    if (s.get("time_use") or {}).get("evaluations"):
        h += ["<h2>Where the time went</h2>", _time_table(s["time_use"])]
    if s.get("errors"):
        h.append("<h2>Input errors (not scored)</h2><ul id='errors'>"
                 + "".join(f"<li>{_e(e['message'])}</li>" for e in s["errors"]) + "</ul>")
    if s.get("notes"):
        h.append("<h2>Notes</h2><ul>" + "".join(f"<li>{_e(n)}</li>" for n in s["notes"]) + "</ul>")
    h.append("<p class='muted'>Generated by kernelcraft bench; every number is a paired, interleaved measurement "
             "against the eager reference in an isolated worker process. Full records: "
             f"{_e(s.get('verdicts', 'verdicts.jsonl'))}.</p></body></html>")
    return "\n".join(h)


def write_report(summary: dict, path: str | Path) -> Path:
    path = Path(path)
    path.write_text(render(summary), encoding="utf-8")
    return path
