"""Training metrics: one JSON line per logged step in OUT/metrics.jsonl, and TensorBoard when installed.

Design decisions
- JSON lines are the record (what `kernelcraft report` plots); TensorBoard (torch's SummaryWriter, if the
  `tensorboard` package is importable) is a live view of the same numbers, written beside it in OUT/tb.
- Each record names its stage (`sft`, `selftrain`, `grpo`), round (self-training) and step, plus whatever
  the trainer logged (TRL: loss, kl, reward, completion lengths; ours under `kernelcraft/`: raw and
  smoothed reward mean/max, correctness rate, fast_1, evaluations, evaluations/min, generation tokens/s,
  reward latency p50/p95). A resumed stage logs again the steps after its checkpoint; readers merge the
  records of one (stage, round, step), later values winning.
- Records are appended and flushed one at a time: a kill loses at most the line being written, and a torn
  last line is skipped by the reader.
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
