"""Checkpoints and resume: which trainer checkpoint a stage restarts from after a kill.

A checkpoint counts only when every file the stage needs is there and `trainer_state.json` parses; the
newest complete one wins. A stage is done when its `model/` holds a `config.json`.

Rationale: docs/design/train.md#checkpoints
"""
from __future__ import annotations

import json
import re
from pathlib import Path

_CKPT = re.compile(r"^checkpoint-(\d+)$")
TRAINER_STATE = "trainer_state.json"


def complete_checkpoints(out: str | Path, required: tuple[str, ...] = (TRAINER_STATE,)) -> list[Path]:
    """Complete checkpoints under `out`, oldest first."""
    out = Path(out)
    if not out.is_dir():
        return []
    found = []
    for p in out.iterdir():
        m = _CKPT.match(p.name)
        if m and p.is_dir() and all((p / f).is_file() for f in required):
            try:
                json.loads((p / TRAINER_STATE).read_text())
            except ValueError:
                continue
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found)]


def last_checkpoint(out: str | Path, required: tuple[str, ...] = (TRAINER_STATE,)) -> Path | None:
    done = complete_checkpoints(out, required)
    return done[-1] if done else None


def checkpoint_step(path: Path | None) -> int:
    return int(_CKPT.match(path.name).group(1)) if path is not None else 0


def final_model(stage_dir: str | Path) -> Path | None:
    p = Path(stage_dir) / "model"
    return p if (p / "config.json").is_file() else None
