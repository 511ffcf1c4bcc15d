"""Training metrics: one JSON line per logged step in OUT/metrics.jsonl, and TensorBoard when installed.

Records carry stage, round and step; `read_metrics` merges the records of one (stage, round, step), later
values winning, and skips a torn line.

Rationale: docs/design/train.md#metrics
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

METRICS = "metrics.jsonl"


class MetricsLog:
    def __init__(self, out_dir: str | Path, *, tensorboard: bool = True):
        self.path = Path(out_dir) / METRICS
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(Path(out_dir) / "tb"))
            except Exception:  # noqa: BLE001 — tensorboard not installed (or broken): JSON lines only
                self._tb = None

    def write(self, stage: str, step: int, values: dict, *, round: int | None = None) -> dict:
        rec = {"time": time.time(), "stage": stage, "step": int(step)}
        if round is not None:
            rec["round"] = round
        for k, v in values.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                continue
            rec[k] = v
        with open(self.path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        if self._tb is not None:
            prefix = stage if round is None else f"{stage}/round{round}"
            for k, v in rec.items():
                if k not in ("time", "stage", "step", "round"):
                    self._tb.add_scalar(f"{prefix}/{k}", v, int(step))
            self._tb.flush()
        return rec

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def read_metrics(out_dir: str | Path) -> list[dict]:
    """The metrics of a run, one record per (stage, round, step) — later lines' values win (a resumed
    stage's re-logged steps, a stage's closing summary at its last step) — in time order."""
    path = Path(out_dir) / METRICS
    if not path.is_file():
        return []
    recs: dict[tuple, dict] = {}
    for line in path.read_text().splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue  # a line torn by a kill
        key = (r.get("stage"), r.get("round"), r.get("step"))
        recs[key] = {**recs.get(key, {}), **r}
    return sorted(recs.values(), key=lambda r: r["time"])


def trainer_callback(log: MetricsLog, stage: str, round: int | None = None, extra=None):
    """A transformers TrainerCallback writing every `on_log` to `log` (with `extra()`'s values merged in)."""
    from transformers import TrainerCallback

    class _Metrics(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kw):
            if state.is_world_process_zero and logs:
                log.write(stage, state.global_step, {**logs, **(extra() if extra else {})}, round=round)

    return _Metrics()
