"""Where a bench's seconds went (`bench.timeuse`): every evaluation the run directory holds (the bench's verdict and
baseline records, its optimize runs' databases) is counted once, on the right clock, under its kind and level; what
was measured elsewhere is not."""
from __future__ import annotations

import pytest

from kernelcraft.bench.timeuse import one_line, time_use
from kernelcraft.search.rundb import RunDB


def _v(**phases) -> dict:
    return {"status": "correct", "speedup": 1.2, "phases_s": phases}


@pytest.fixture
def run_dir(tmp_path):
    """(verdict records, baseline records, the runs folder) as a bench holds them."""
    verdicts = [
        {**_v(spawn=0.5, **{"import": 0.3}, wait_device=2.0, init=1.0, check=2.0, time=1.0),
         "task_sha256": "A", "level": 1},
        {**_v(start=1.0, wait_device=1.0, check=1.5, time=0.5), "task_sha256": "B", "level": 2},
        {"status": "no_candidate", "phases_s": {"check": 99.0}, "task_sha256": "C", "level": 2},  # no evaluation
    ]
    base = [
        {**_v(spawn=0.2, init=3.0, check=1.0, time=1.0), "baseline": "inductor", "task_sha256": "A"},
        {**_v(spawn=0.2, init=50.0), "baseline": "inductor", "task_sha256": "B", "cached": True},  # measured elsewhere
        {**_v(spawn=0.2, init=0.5, check=1.0, time=0.5), "baseline": "cudagraph", "task_sha256": "B"},
    ]
    runs = tmp_path / "bench" / "runs"
    db = RunDB(runs / "task_b")
    db.set_meta("task_sha256", "B")
    cid, _ = db.add_candidate("class ModelNew: pass  # 1", policy="recipes", round=1)
    db.claim(cid)
    db.finish(cid, _v(prepare=2.0, check=1.0, time=1.0))
    shared, _ = db.add_candidate("class ModelNew:\n    x = 2", policy="recipes", round=1)
    db.claim(shared)
    db.finish(shared, {**_v(init=40.0), "shared": "a bench baseline"})  # counted once, as the baseline
    db.add_confirmation(cid, _v(check=0.5, time=2.0))
    db.set_meta("null_control", {"status": "correct", "phases_s": {"check": 0.25, "time": 0.75}})
    db.close()
    return verdicts, base, runs


def test_every_evaluation_is_counted_once_on_its_clock(run_dir):
    t = time_use(*run_dir)
    assert t["evaluations"] == 2 + 2 + 3
    # on the device: everything but start-up/build phases and the wait for the device lock
    assert t["device_s"] == pytest.approx(4.0 + 2.0 + 5.0 + 2.0 + 2.0 + 2.5 + 1.0)
    assert t["off_device_s"] == pytest.approx(0.8 + 1.0 + 0.2 + 0.2 + 2.0)
    assert t["wait_s"] == pytest.approx(3.0)
    assert t["tasks"] == 2 and t["device_s_per_task"] == pytest.approx(18.5 / 2)
    kinds = t["by_kind"]
    assert set(kinds) == {"candidate", "inductor", "cudagraph", "search", "confirm", "null"}
    assert kinds["inductor"]["evaluations"] == 1 and kinds["inductor"]["device_s"] == pytest.approx(5.0)
    assert kinds["search"]["evaluations"] == 1 and kinds["search"]["off_device_s"] == pytest.approx(2.0)
    assert kinds["null"]["device_s"] == pytest.approx(1.0)
    assert t["phases_s"]["check"] == pytest.approx(2.0 + 1.5 + 1.0 + 1.0 + 1.0 + 0.5 + 0.25, abs=0.05)  # to 0.1 s


def test_levels_come_from_the_records_or_the_tasks(run_dir):
    t = time_use(*run_dir, levels={"A": 1, "B": 2})
    assert t["by_level"]["1"]["device_s"] == pytest.approx(4.0 + 5.0)
    assert t["by_level"]["2"]["device_s"] == pytest.approx(2.0 + 2.0 + 2.0 + 2.5 + 1.0)
    assert t["by_level"]["2"]["tasks"] == 1 and t["by_level"]["2"]["evaluations"] == 5
    unknown = time_use(*run_dir)  # baselines and run databases carry no level of their own
    assert unknown["by_level"]["other"]["evaluations"] == 5


def test_an_empty_or_missing_directory_reports_nothing_measured(tmp_path):
    t = time_use([], [], tmp_path / "nothing")
    assert t["evaluations"] == 0 and t["device_s"] == 0 and t["by_kind"] == {}
    assert "no evaluation" in one_line(t)


def test_the_line_for_a_person_names_the_largest_phases(run_dir):
    line = one_line(time_use(*run_dir))
    assert line.startswith("time: 7 evaluations, 18 s on the device (9.2 s per task)")
    assert "init 4 s" in line and "check 7 s" in line
