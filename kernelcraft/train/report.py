"""The training report: one self-contained HTML page of a training run's curves (`kernelcraft report OUT`).

No dependencies, no network, no JavaScript; it reads only the run directory, so it works on a run in progress
or a killed one. A metric never logged is left out.

Rationale: docs/design/train.md#report
"""
from __future__ import annotations

import html
import json
import math
from pathlib import Path

from kernelcraft.search.report import _CSS
from kernelcraft.train.hackcases import HackCases
from kernelcraft.train.metrics import read_metrics
from kernelcraft.train.pipeline import RUN_MARK

CHARTS = [  # (title, stage, [(metric key, label)])
    ("SFT loss", "sft", [("loss", "loss")]),
    ("Self-training loss", "selftrain", [("loss", "loss")]),
    ("Self-training: correct samples per round", "selftrain_round",
     [("correct_rate", "correct"), ("fast_1", "fast_1")]),
    ("GRPO reward (smoothed)", "grpo", [("kernelcraft/reward_mean", "mean"), ("kernelcraft/reward_max", "max")]),
    ("GRPO raw reward (speedup)", "grpo",
     [("kernelcraft/raw_reward_mean", "mean"), ("kernelcraft/raw_reward_max", "max")]),
    ("GRPO correctness", "grpo", [("kernelcraft/correct_rate", "correct"), ("kernelcraft/fast_1", "fast_1")]),
    ("GRPO KL", "grpo", [("kl", "kl")]),
    ("Generation tokens/s", "grpo", [("kernelcraft/gen_tokens_per_s", "tokens/s")]),
    ("Evaluations per minute", "grpo", [("kernelcraft/evaluations_per_min", "evaluations/min")]),
    ("Reward latency (s)", "grpo",
     [("kernelcraft/reward_latency_p50_s", "p50"), ("kernelcraft/reward_latency_p95_s", "p95")]),
    ("Held-out reward (speedup; failures 0)", "heldout", [("reward_mean", "mean")]),
    ("Held-out geomean speedup", "heldout", [("geomean_speedup", "per sample"), ("best_geomean", "best per task")]),
]
COLORS = ["#2f6fdb", "#c2410c", "#187a3a", "#7d4e9e"]


def is_train_run(path: str | Path) -> bool:
    return (Path(path) / RUN_MARK).is_file()


def _e(x) -> str:
    return html.escape(str(x), quote=True)


def chart(title: str, series: list[tuple[str, list[tuple[float, float]]]], w: int = 540, h: int = 200) -> str:
    pts = [p for _, s in series for p in s]
    if not pts:
        return ""
    L, R, T, B = 52, w - 10, 24, h - 26
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = min(p[1] for p in pts), max(p[1] for p in pts)
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:
        y0, y1 = y0 - 1, y1 + 1
    X = lambda v: L + (v - x0) / (x1 - x0) * (R - L)  # noqa: E731
    Y = lambda v: B - (v - y0) / (y1 - y0) * (B - T)  # noqa: E731
    out = [f"<svg width='{w}' height='{h}' viewBox='0 0 {w} {h}' role='img' aria-label='{_e(title)}'>",
           f"<text x='{L}' y='14' font-weight='600'>{_e(title)}</text>"]
    for v in (y0, (y0 + y1) / 2, y1):
        out.append(f"<line x1='{L}' x2='{R}' y1='{Y(v):.1f}' y2='{Y(v):.1f}' stroke='#e8e8f0'/>"
                   f"<text x='{L - 4}' y='{Y(v) + 4:.1f}' text-anchor='end' fill='#556' font-size='11'>{v:.3g}</text>")
    out.append(f"<text x='{L}' y='{h - 8}' fill='#556' font-size='11'>step {x0:g}</text>"
               f"<text x='{R}' y='{h - 8}' text-anchor='end' fill='#556' font-size='11'>step {x1:g}</text>")
    for i, (label, s) in enumerate(series):
        c = COLORS[i % len(COLORS)]
        path = " ".join(f"{'M' if j == 0 else 'L'}{X(x):.1f},{Y(y):.1f}" for j, (x, y) in enumerate(s))
        out.append(f"<path d='{path}' fill='none' stroke='{c}' stroke-width='1.8'/>")
        out += [f"<circle cx='{X(x):.1f}' cy='{Y(y):.1f}' r='2.5' fill='{c}'><title>{_e(label)} step {x:g}: "
                f"{y:.4g}</title></circle>" for x, y in s]
        out.append(f"<text x='{R - 90 * (len(series) - i)}' y='14' fill='{c}' font-size='12'>— {_e(label)}</text>")
    return "".join(out) + "</svg>"


def series_of(records: list[dict], stage: str, key: str) -> list[tuple[float, float]]:
    pts = [(r.get("round", 0) * 1e6 + r["step"] if stage == "selftrain" else r["step"], r[key]) for r in records
           if r.get("stage") == stage and isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    return sorted(pts)


def render(run_dir: str | Path) -> str:
    run_dir = Path(run_dir)
    mark = json.loads((run_dir / RUN_MARK).read_text())
    recs = read_metrics(run_dir)
    charts = [chart(t, [(lab, series_of(recs, st, k)) for k, lab in keys]) for t, st, keys in CHARTS]
    card_p = run_dir / "data" / "card.json"
    card = json.loads(card_p.read_text()) if card_p.is_file() else None
    hack = HackCases(run_dir / "hackcases.db") if (run_dir / "hackcases.db").is_file() else None
    try:
        counts = hack.counts() if hack else {}
        recent = hack.rows()[-10:] if hack else []
    finally:
        if hack:
            hack.close()
    summary_p = run_dir / "grpo" / "summary.json"
    summary = json.loads(summary_p.read_text()) if summary_p.is_file() else {}
    cards = [("model", mark["config"]["model"]["path"]), ("latest stage", mark["stage"]),
             ("GRPO steps", summary.get("steps", "—")), ("evaluations", summary.get("evaluations", "—")),
             ("hack cases", counts.get("hack", 0)), ("suspicious", counts.get("suspicious", 0))]
    if card:
        cards.insert(1, ("train / held-out examples", f"{card['splits']['train']['examples']} / "
                                                      f"{card['splits']['heldout']['examples']}"))
    parts = [f"<!doctype html><meta charset='utf-8'><title>kernelcraft training — {_e(run_dir.name)}</title>",
             f"<style>{_CSS}</style><h1>Training run {_e(run_dir.name)}</h1>",
             f"<div class='sub'>kernelcraft {_e(mark['kernelcraft'])} · {_e(run_dir)}</div><div class='cards'>"]
    parts += [f"<div class='card'>{_e(k)}<b>{_e(v)}</b></div>" for k, v in cards]
    parts.append("</div><h2>Curves</h2>")
    drawn = [c for c in charts if c]
    parts.append("".join(f"<div style='display:inline-block;margin:4px'>{c}</div>" for c in drawn)
                 or "<p class='muted'>No metrics logged yet.</p>")
    if recent:
        parts.append("<h2>Latest hack cases</h2><table><tr><th>id</th><th>stage</th><th>task</th><th>label</th>"
                     "<th>reason</th><th>detail</th></tr>")
        parts += [f"<tr><td class='num'>{r['id']}</td><td>{_e(r['stage'])}</td><td>{_e(r['task'])}</td>"
                  f"<td>{_e(r['label'])}</td><td>{_e(r['reason'])}</td><td>{_e(r['detail'][:200])}</td></tr>"
                  for r in recent]
        parts.append("</table>")
    return "\n".join(parts) + "\n"


def write_train_report(run_dir: str | Path, output: str | Path | None = None) -> Path:
    path = Path(output) if output else Path(run_dir) / "report.html"
    path.write_text(render(run_dir))
    return path


def summary_json(run_dir: str | Path) -> dict:
    recs = read_metrics(run_dir)
    last = {}
    for r in recs:
        last[r["stage"]] = r
    return {"stages": sorted(last), "last": last, "records": len(recs)}
