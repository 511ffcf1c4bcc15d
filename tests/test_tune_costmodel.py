"""The learned cost model: featurising, training, held-out evaluation and persistence (needs lightgbm, the
`tune` extra, which the `test` extra includes)."""
from __future__ import annotations

import json
import math

import pytest

from kernelcraft.search.recipes import tunable
from kernelcraft.tune import costmodel

pytest.importorskip("lightgbm")

KERNEL = tunable.Kernel("gemm", "float16", epilogue="out = acc")
SHAPES = [{"M": m, "N": n, "K": k} for m, n, k in [(1024, 1024, 1024), (2048, 1024, 4096), (4096, 4096, 512),
                                                   (512, 8192, 2048), (8192, 2048, 1024)]]


def _ms(shape, cfg) -> float:
    """A synthetic runtime: roofline time divided by an efficiency that depends on the configuration."""
    k = tunable.knobs("gemm")
    eff = 0.8 / (1 + 0.2 * abs(k["BLOCK_M"].index(cfg["BLOCK_M"]) - 1)
                 + 0.3 * abs(k["num_warps"].index(cfg["num_warps"]) - 1) + 0.15 * abs(k["num_stages"].index(cfg["num_stages"]) - 1) + 0.1 * (cfg["GROUP_M"] == 1))
    return costmodel.roofline_ms(KERNEL, shape) / eff


def _records():
    rows = []
    for i, shape in enumerate(SHAPES):
        for cfg in tunable.all_configs(KERNEL, shape)[::2]:
            rows.append({"shape": f"s{i}", "kernel": KERNEL.to_json(), "size": shape, "config": cfg,
                         "features": {"regs": 128.0, "occupancy": 0.25}, "ok": True, "ms": _ms(shape, cfg)})
    rows.append({"shape": "s0", "kernel": KERNEL.to_json(), "size": SHAPES[0], "config": rows[0]["config"],
                 "ok": False, "reason": "compile_error"})  # failures never train the model
    return rows


def test_featurize_is_fixed_width_and_marks_unknown_features():
    cfg = tunable.default_config(KERNEL, SHAPES[0])
    names = costmodel.feature_names("gemm")
    row = costmodel.featurize(KERNEL, SHAPES[0], cfg, None)
    assert len(row) == len(names) and math.isnan(row[names.index("c_regs")])
    row = costmodel.featurize(KERNEL, SHAPES[0], cfg, {"regs": 96.0})
    assert row[names.index("c_regs")] == 96.0
    rk = tunable.Kernel("rownorm", "float32", op="softmax")
    assert len(costmodel.featurize(rk, {"rows": 8, "cols": 4096}, tunable.default_config(rk, {"rows": 8, "cols": 4096}))) \
        == len(costmodel.feature_names("rownorm"))


def test_train_predict_and_holdout_on_unseen_shapes():
    recs = costmodel.records_of(_records())
    assert all(r["ms"] > 0 for r in recs)
    h = costmodel.holdout(recs, "gemm", rounds=120)
    assert h["shapes"] == len(SHAPES) and h["r2"] > 0.8 and h["mape"] < 0.25, h
    assert h["spearman_within_median"] > 0.6, h


def test_save_load_round_trip_and_refusals(tmp_path):
    recs = costmodel.records_of(_records())
    m = costmodel.CostModel("gemm", rounds=50).fit(recs)
    cfgs = tunable.all_configs(KERNEL, SHAPES[1])[:5]
    before = m.predict(KERNEL, SHAPES[1], cfgs)
    path = m.save(tmp_path / "m.json")
    again = costmodel.CostModel.load(path)
    assert again.predict(KERNEL, SHAPES[1], cfgs) == pytest.approx(before) and again.n_train == len(recs)
    d = json.loads(path.read_text())
    d["features"] = d["features"][:-1]
    (tmp_path / "old.json").write_text(json.dumps(d))
    with pytest.raises(costmodel.CostModelError, match="other features"):
        costmodel.CostModel.load(tmp_path / "old.json")
    (tmp_path / "junk.json").write_text("{}")
    with pytest.raises(costmodel.CostModelError, match="not a kernelcraft cost model"):
        costmodel.CostModel.load(tmp_path / "junk.json")
    with pytest.raises(costmodel.CostModelError, match="too few"):
        costmodel.CostModel("gemm").fit(recs[:3])
    with pytest.raises(costmodel.CostModelError, match="not trained"):
        costmodel.CostModel("rownorm").predict(KERNEL, SHAPES[0], cfgs)


ROW = tunable.Kernel("rownorm", "float32", op="rmsnorm", weight=True)
ROW_SHAPES = [{"rows": r, "cols": c} for r, c in [(4096, 4096), (16384, 1024), (2048, 8192)]]


def _row_records(paired: bool, seed: int = 0) -> list[dict]:
    """Row measurements whose times carry a per-measurement drift factor; with `paired` the reference
    shares it (as in the paired rounds of a real table), else the reference drifts on its own."""
    import random
    rng = random.Random(seed)
    out = []
    for i, shape in enumerate(ROW_SHAPES):
        for cfg in tunable.all_configs(ROW, shape):
            true = costmodel.roofline_ms(ROW, shape) * (2 + cfg["num_warps"] / 8 + math.log2(cfg["BLOCK_N"]) / 10)
            drift = math.exp(rng.gauss(0, 0.3))
            ref = 0.5 * (drift if paired else math.exp(rng.gauss(0, 0.3)))
            out.append({"group": f"r{i}", "kernel": ROW, "shape": shape, "config": cfg, "features": None,
                        "ms": true * drift, "ref_ms": ref, "speedup": ref / (true * drift), "true": true})
    return out


def test_drift_shared_with_the_reference_is_taken_out_of_the_target_within_each_shape():
    recs = _row_records(paired=True)
    beta = costmodel.drift_slope(recs)
    assert 0.9 <= beta <= 1.0
    y = costmodel.log_targets(recs, 1.0)
    for g in {r["group"] for r in recs}:
        idx = [i for i, r in enumerate(recs) if r["group"] == g]
        resid = [y[i] - math.log(recs[i]["true"]) for i in idx]
        assert max(resid) - min(resid) < 0.01  # the drift is gone: target = true time x one constant
        mean_y, mean_ms = sum(y[i] for i in idx) / len(idx), sum(math.log(recs[i]["ms"]) for i in idx) / len(idx)
        assert mean_y == pytest.approx(mean_ms, abs=0.01)  # the shape's level is kept
    # a reference that does not drift with the candidate is no evidence: no correction
    assert costmodel.drift_slope(_row_records(paired=False)) == 0.0
    assert costmodel.drift_slope([dict(r, ref_ms=None) for r in recs]) == 0.0  # unpaired records: raw times
    assert costmodel.log_targets(recs, 0.0) == [math.log(r["ms"]) for r in recs]
    assert costmodel.CostModel("rownorm", rounds=20).fit(recs).beta == beta


def _levelled_records() -> list[dict]:
    """GEMM records whose shapes run at levels (0.6x .. 1.6x) no input explains: only a measurement of the
    shape can tell them."""
    rows = []
    for i, shape in enumerate(SHAPES):
        level = [0.6, 1.6, 1.0, 1.3, 0.8][i]
        cfgs = tunable.all_configs(KERNEL, shape)[::3]
        default = tunable.default_config(KERNEL, shape)
        cfgs = cfgs + ([default] if default not in cfgs else [])
        for cfg in cfgs:
            rows.append({"shape": f"s{i}", "kernel": KERNEL.to_json(), "size": shape, "config": cfg,
                         "features": None, "ok": True, "ms": level * _ms(shape, cfg)})
    return costmodel.records_of(rows)


def test_one_measurement_calibrates_the_level_of_an_unseen_shape():
    recs = _levelled_records()
    h = costmodel.holdout(recs, "gemm", rounds=60)
    c = h["calibrated"]
    assert c["shapes"] == h["shapes"] == len(SHAPES) and c["n"] == h["n"] - len(SHAPES)  # defaults not scored
    assert c["mape"] < 0.5 * h["mape"] and c["r2"] > h["r2"] and c["r2"] > 0.8, (h["mape"], c["mape"], c["r2"])
    weights = [p["anchor_weight"] for p in c["per_shape"].values()]
    assert all(0.5 < w <= 1.0 for w in weights), weights
    # the anchor multiplies every prediction by one factor: ratios (all the agents use) are unchanged
    m = costmodel.CostModel("gemm", rounds=60).fit([r for r in recs if r["group"] != "s1"], calibrate=True)
    cfgs = tunable.all_configs(KERNEL, SHAPES[1])[:6]
    anchor = {"config": tunable.default_config(KERNEL, SHAPES[1]), "ms": 2.0, "features": None}
    plain, cal = m.predict(KERNEL, SHAPES[1], cfgs), m.predict(KERNEL, SHAPES[1], cfgs, anchor=anchor)
    assert [b / a for a, b in zip(plain, cal)] == pytest.approx([cal[0] / plain[0]] * len(cfgs))
    at = m.predict(KERNEL, SHAPES[1], [anchor["config"]])[0]
    assert cal[0] / plain[0] == pytest.approx((2.0 / at) ** m.anchor_weight)
    assert m.predict(KERNEL, SHAPES[1], [anchor["config"]], anchor=anchor)[0] != pytest.approx(at)


def test_saved_model_keeps_drift_and_anchor_weight_and_older_files_load(tmp_path):
    m = costmodel.CostModel("rownorm", rounds=20).fit(_row_records(paired=True), calibrate=True)
    assert m.beta >= 0.9 and 0.0 <= m.anchor_weight <= 1.0
    again = costmodel.CostModel.load(m.save(tmp_path / "m.json"))
    assert (again.beta, again.anchor_weight) == (m.beta, m.anchor_weight)
    d = json.loads((tmp_path / "m.json").read_text())
    del d["beta"], d["anchor_weight"]  # a file written before drift correction and calibration
    (tmp_path / "old.json").write_text(json.dumps(d))
    old = costmodel.CostModel.load(tmp_path / "old.json")
    assert (old.beta, old.anchor_weight) == (0.0, 1.0)
