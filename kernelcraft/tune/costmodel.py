"""The learned cost model: runtime from shape, configuration and compiled-kernel features (LightGBM).

One model per template family; target log(runtime / the shape's roofline bound), with measurement drift
taken out within each shape (`beta`); `predict(..., anchor=)` calibrates on one measured configuration
(`anchor_weight`). Saved as one JSON file; a file for another feature list is refused. `holdout` scores
leave-one-shape-out. lightgbm (extra `tune`) is imported by `require()`.

Rationale: docs/design/tune.md#costmodel
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from kernelcraft.search.recipes import tunable
from kernelcraft.tune.features import FEATURE_KEYS

SMS = 132  # streaming multiprocessors of an H100 SXM
PARAMS = {"objective": "regression", "learning_rate": 0.05, "num_leaves": 31, "min_data_in_leaf": 5,
          "feature_fraction": 0.9, "bagging_fraction": 0.9, "bagging_freq": 1, "lambda_l2": 1.0,
          "verbosity": -1, "deterministic": True, "force_row_wise": True}
ROUNDS = 300


class CostModelError(RuntimeError):
    """The cost model cannot be used: lightgbm missing, no data, or a model file for other features."""


def require():
    try:
        import lightgbm
        import numpy
    except ImportError as e:
        raise CostModelError(f"the cost model needs lightgbm ({e}): pip install 'kernelcraft[tune]'") from None
    return lightgbm, numpy


def _log2(x: float) -> float:
    return math.log2(max(float(x), 1e-9))


def feature_names(kind: str) -> list[str]:
    if kind == "gemm":
        base = ["log_M", "log_N", "log_K", "bytes", "b_trans", "vectors", "epilogue_ops",
                "log_BLOCK_M", "log_BLOCK_N", "log_BLOCK_K", "GROUP_M", "num_warps", "num_stages",
                "log_tiles", "waves", "last_wave_fill", "k_iters", "pad_waste", "smem_pipeline_kb", "acc_per_thread",
                "log_flops", "log_bytes_moved"]
    else:
        base = ["log_rows", "log_cols", "bytes", "weight", "bias"] + [f"op_{o}" for o in tunable.ROW_OPS] + \
               ["log_BLOCK_N", "num_warps", "num_stages", "chunks", "one_tile", "per_thread", "row_passes",
                "waves", "log_bytes_moved"]
    return base + [f"c_{k}" for k in FEATURE_KEYS]


def _tri_share(kernel: tunable.Kernel) -> float:
    """The share of a GEMM's output tiles that compute a product: about half when a triangle is kept."""
    return 0.5 if kernel.tri else 1.0


def featurize(kernel: tunable.Kernel, shape: dict, config: dict, features: dict | None = None) -> list[float]:
    """The model's input row (order: `feature_names(kernel.kind)`); unknown compiled features are NaN."""
    nb = tunable.DTYPE_BYTES[kernel.dtype]
    if kernel.kind == "gemm":
        M, N, K = shape["M"], shape["N"], shape["K"]
        nbatch, work = tunable.batch_of(shape), _tri_share(kernel)
        bm, bn, bk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
        tiles = math.ceil(M / bm) * math.ceil(N / bn) * nbatch * work * kernel.split_k
        waves = tiles / SMS
        fill = tiles / (math.ceil(waves) * SMS)
        pad = (math.ceil(M / bm) * bm * math.ceil(N / bn) * bn) / (M * N) - 1
        row = [_log2(M), _log2(N), _log2(K), nb, float(kernel.b_trans), kernel.vectors,
               kernel.epilogue.count("\n") + 1, _log2(bm), _log2(bn), _log2(bk), config["GROUP_M"],
               config["num_warps"], config["num_stages"], _log2(tiles), waves, fill, math.ceil(K / kernel.split_k / bk), pad,
               config["num_stages"] * (bm + bn) * bk * nb / 1024, bm * bn / (32 * config["num_warps"]),
               _log2(2 * M * N * K * nbatch * work), _log2((M * K + K * N + M * N) * nb * nbatch)]
    else:
        rows, cols = shape["rows"], shape["cols"]
        bn, w = config["BLOCK_N"], config["num_warps"]
        one = bn >= cols or kernel.channels
        passes = 1 if one or kernel.op in tunable.SCAN_OPS else 2
        row = [_log2(rows), _log2(cols), nb, float(kernel.weight), float(kernel.bias)] + \
              [float(kernel.op == o) for o in tunable.ROW_OPS] + \
              [_log2(bn), w, config["num_stages"], math.ceil(cols / bn), float(one), bn / (32 * w), passes,
               rows / SMS, _log2(rows * cols * nb * (passes + 1))]
    f = features or {}
    return row + [float(f[k]) if k in f and f[k] is not None else math.nan for k in FEATURE_KEYS]


def roofline_ms(kernel: tunable.Kernel, shape: dict) -> float:
    """The shape's lower bound on an H100 (ms): matrix work at the dot's rate, or compulsory bytes at 3 TB/s."""
    nb = tunable.DTYPE_BYTES[kernel.dtype]
    if kernel.kind == "gemm":
        M, N, K = shape["M"], shape["N"], shape["K"]
        nbatch = tunable.batch_of(shape)
        rate = 160e12 if kernel.dtype == "float32" else 800e12  # tf32x3 is three TF32 products
        return max(2 * M * N * K * nbatch * _tri_share(kernel) / rate, (M * K + K * N + M * N) * nb * nbatch / 3e12) * 1e3
    return 2 * shape["rows"] * shape["cols"] * nb / 3e12 * 1e3


def records_of(rows: list[dict]) -> list[dict]:
    """The successful measurements among recorded rows ({"shape": name, "kernel", "size", "config",
    "features", "ok", "ms", "ref_ms", "speedup", ...}: the benchmark's table and `kernelcraft tune`'s
    store), as `fit` reads them."""
    out = []
    for r in rows:
        if r.get("ok") and r.get("ms"):
            out.append({"kernel": tunable.Kernel.from_json(r["kernel"]) if isinstance(r["kernel"], dict) else r["kernel"],
                        "shape": r["size"], "config": r["config"],
                        "features": r.get("features"), "ms": float(r["ms"]), "group": r.get("shape"),
                        "ref_ms": r.get("ref_ms"), "speedup": r.get("speedup")})
    return out


def group_of(r: dict) -> str:
    """The shape a record belongs to: its `group` (the task's name), else its kernel and sizes."""
    return r.get("group") or f"{r['kernel'].key()}|{json.dumps(r['shape'], sort_keys=True)}"


def _paired(r: dict) -> bool:
    return bool(r.get("ref_ms") and r.get("speedup") and r["ref_ms"] > 0 and r["speedup"] > 0)


def drift_slope(records: list[dict]) -> float:
    """`beta` (docs/design/tune.md#costmodel): the pooled within-shape slope of log ms on log ref_ms, clipped to [0, 1],
    or 0 where it is not clearly positive (t <= 2), too few shapes or records lack a paired reference."""
    if not records or not all(_paired(r) for r in records):
        return 0.0
    by: dict[str, list[tuple[float, float]]] = {}
    for r in records:
        by.setdefault(group_of(r), []).append((math.log(r["ms"]), math.log(r["ref_ms"])))
    sxy = sxx = syy = 0.0
    n = k = 0
    for pts in by.values():
        if len(pts) < 2:
            continue
        my, mx = sum(p[0] for p in pts) / len(pts), sum(p[1] for p in pts) / len(pts)
        sxy += sum((y - my) * (x - mx) for y, x in pts)
        sxx += sum((x - mx) ** 2 for _, x in pts)
        syy += sum((y - my) ** 2 for y, _ in pts)
        n, k = n + len(pts), k + 1
    if sxx <= 0 or n - k - 1 < 1:
        return 0.0
    b = sxy / sxx
    se = math.sqrt(max(syy - b * sxy, 0.0) / (n - k - 1) / sxx)
    return min(1.0, b) if b > 0 and b > 2 * se else 0.0


def log_targets(records: list[dict], beta: float) -> list[float]:
    """log of each record's runtime with `beta` of its paired reference's drift within its shape removed."""
    if beta <= 0:
        return [math.log(r["ms"]) for r in records]
    sums: dict[str, list[float]] = {}
    for r in records:
        sums.setdefault(group_of(r), []).append(math.log(r["ms"] * r["speedup"]))
    mean = {g: sum(v) / len(v) for g, v in sums.items()}
    return [math.log(r["ms"]) - beta * (math.log(r["ms"] * r["speedup"]) - mean[group_of(r)]) for r in records]


class CostModel:
    """Predicts a configuration's runtime (ms) for one template family."""

    def __init__(self, kind: str, *, rounds: int = ROUNDS, threads: int = 1, seed: int = 0, drift: bool = True):
        if kind not in tunable.KNOBS:
            raise CostModelError(f"unknown kernel kind {kind!r}")
        self.kind, self.rounds, self.threads, self.seed, self.drift = kind, rounds, threads, seed, drift
        self.names = feature_names(kind)
        self.booster = None
        self.n_train = 0
        self.beta = 0.0
        self.anchor_weight = 1.0

    def fit(self, records: list[dict], *, calibrate: bool = False) -> "CostModel":
        """Train on `records` (`records_of`); with `calibrate`, also fit `anchor_weight` (docs/design/tune.md#costmodel:
        one extra model per training shape)."""
        lgb, np = require()
        recs = [r for r in records if r["kernel"].kind == self.kind and r.get("ms")]
        if len(recs) < 10:
            raise CostModelError(f"{len(recs)} {self.kind} measurements: too few to train on (10 at least)")
        X = np.array([featurize(r["kernel"], r["shape"], r["config"], r.get("features")) for r in recs])
        self.beta = drift_slope(recs) if self.drift else 0.0
        y = np.array(log_targets(recs, self.beta)) - np.log([roofline_ms(r["kernel"], r["shape"]) for r in recs])
        params = dict(PARAMS, num_threads=self.threads, seed=self.seed,
                      min_data_in_leaf=min(PARAMS["min_data_in_leaf"], max(1, len(recs) // 4)))
        self.booster = lgb.train(params, lgb.Dataset(X, y, feature_name=self.names, free_raw_data=True),
                                 num_boost_round=self.rounds)
        self.n_train = len(recs)
        self.anchor_weight = self._fit_anchor_weight(recs) if calibrate else 1.0
        return self

    def _fit_anchor_weight(self, recs: list[dict]) -> float:
        """Least squares over the training shapes, each left out in turn: the weight w minimising the squared
        log error of all its configurations after adding w x (log error at its default configuration)."""
        groups = sorted({group_of(r) for r in recs})
        num = den = 0.0
        for g in groups:
            test = [r for r in recs if group_of(r) == g]
            k, shape = test[0]["kernel"], test[0]["shape"]
            default = tunable.default_config(k, shape)
            anchor = next((r for r in test if r["config"] == default), None)
            if anchor is None:
                continue
            try:
                m = CostModel(self.kind, rounds=self.rounds, threads=self.threads, seed=self.seed, drift=self.drift)
                m.fit([r for r in recs if group_of(r) != g])
            except CostModelError:  # too few records without this shape
                continue
            pred = m.predict(k, shape, [r["config"] for r in test], [r.get("features") for r in test])
            err = [math.log(r["ms"] / p) for r, p in zip(test, pred)]
            at = err[test.index(anchor)]
            num, den = num + at * sum(err), den + len(err) * at * at
        return min(1.0, max(0.0, num / den)) if den > 0 else 1.0

    def predict(self, kernel: tunable.Kernel, shape: dict, configs: list[dict],
                features: list[dict | None] | None = None, *, anchor: dict | None = None) -> list[float]:
        """Predicted runtimes (ms) of `configs` of `kernel` at `shape`; `anchor` ({"config", "ms",
        "features"}: a measured configuration of this kernel and shape, the game's start) calibrates them."""
        _, np = require()
        if self.booster is None:
            raise CostModelError("the cost model is not trained")
        if not configs:
            return []
        feats = features or [None] * len(configs)
        X = np.array([featurize(kernel, shape, c, f) for c, f in zip(configs, feats)])
        roof = roofline_ms(kernel, shape)
        scale = roof
        if anchor is not None:
            at = self.predict(kernel, shape, [anchor["config"]], [anchor.get("features")])[0]
            scale *= (float(anchor["ms"]) / at) ** self.anchor_weight
        return [float(v) * scale for v in np.exp(self.booster.predict(X, num_threads=self.threads))]

    def save(self, path: str | Path) -> Path:
        if self.booster is None:
            raise CostModelError("nothing to save: the cost model is not trained")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"format": "kernelcraft-costmodel-1", "kind": self.kind, "features": self.names,
                                    "n_train": self.n_train, "beta": self.beta,
                                    "anchor_weight": self.anchor_weight,
                                    "model": self.booster.model_to_string()}))
        return path

    @classmethod
    def load(cls, path: str | Path) -> "CostModel":
        lgb, _ = require()
        try:
            d = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise CostModelError(f"cannot read cost model {path}: {e}") from None
        if d.get("format") != "kernelcraft-costmodel-1":
            raise CostModelError(f"{path} is not a kernelcraft cost model")
        m = cls(d["kind"])
        if d["features"] != m.names:
            raise CostModelError(f"{path} was trained on other features (an older kernelcraft?): retrain it")
        m.booster, m.n_train = lgb.Booster(model_str=d["model"]), d["n_train"]
        m.beta = float(d.get("beta", 0.0))  # a file without them: no drift correction, no calibration
        m.anchor_weight = float(d.get("anchor_weight", 1.0))
        return m


def _r2(y: list[float], p: list[float]) -> float:
    mean = sum(y) / len(y)
    ss_tot = sum((a - mean) ** 2 for a in y)
    return 1 - sum((a - b) ** 2 for a, b in zip(y, p)) / ss_tot if ss_tot > 0 else float("nan")


def _spearman(y: list[float], p: list[float]) -> float:
    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        for rank, i in enumerate(order):
            r[i] = float(rank)
        return r
    return _pearson(ranks(y), ranks(p))


def _pearson(a: list[float], b: list[float]) -> float:
    n = len(a)
    ma, mb = sum(a) / n, sum(b) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(a, b))
    va, vb = sum((x - ma) ** 2 for x in a), sum((y - mb) ** 2 for y in b)
    return cov / math.sqrt(va * vb) if va > 0 and vb > 0 else float("nan")


def _scores(ys: list[float], ps: list[float], per: dict) -> dict:
    logs = [math.log(v) for v in ys], [math.log(v) for v in ps]
    sp = sorted(p["spearman"] for p in per.values())
    return {"shapes": len(per), "n": len(ys), "r2": _r2(ys, ps), "r2_log": _r2(*logs),
            "mape": sum(abs(b - a) / a for a, b in zip(ys, ps)) / len(ys),
            "spearman_within_median": sp[len(sp) // 2] if sp else float("nan"), "per_shape": per}


def _shape_scores(y: list[float], pred: list[float]) -> dict:
    return {"n": len(y), "r2": _r2(y, pred), "mape": sum(abs(b - a) / a for a, b in zip(y, pred)) / len(y),
            "spearman": _spearman(y, pred)}


def holdout(records: list[dict], kind: str, *, calibrate: bool = True, **model_options) -> dict:
    """Leave-one-shape-out: for each shape (record `group`), a model trained on the others predicts it —
    with no measurement of it (the top-level scores), and calibrated on its measured default configuration
    (`calibrated`: scored on its other configurations; shapes whose default was not measured are left out).
    `calibrate=False` scales by the measurement in full (anchor weight 1) instead of fitting the weight."""
    recs = [r for r in records if r["kernel"].kind == kind]
    groups = sorted({group_of(r) for r in recs})
    if len(groups) < 2:
        raise CostModelError(f"holdout needs measurements of 2 shapes or more, not {len(groups)}")
    ys, ps, per, cys, cps, cper = [], [], {}, [], [], {}
    for g in groups:
        test = [r for r in recs if group_of(r) == g]
        model = CostModel(kind, **model_options).fit([r for r in recs if group_of(r) != g], calibrate=calibrate)
        k, shape = test[0]["kernel"], test[0]["shape"]
        pred = model.predict(k, shape, [r["config"] for r in test], [r.get("features") for r in test])
        y = [r["ms"] for r in test]
        ys, ps = ys + y, ps + pred
        per[g] = dict(_shape_scores(y, pred), beta=model.beta)
        default = tunable.default_config(k, shape)
        anchor = next((r for r in test if r["config"] == default), None)
        rest = [i for i, r in enumerate(test) if r is not anchor]
        if anchor is not None and len(rest) >= 2:
            f = (anchor["ms"] / pred[test.index(anchor)]) ** model.anchor_weight
            cy, cp = [y[i] for i in rest], [pred[i] * f for i in rest]
            cys, cps = cys + cy, cps + cp
            cper[g] = dict(_shape_scores(cy, cp), anchor_weight=model.anchor_weight)
    out = {"kind": kind, **_scores(ys, ps, per)}
    out["calibrated"] = _scores(cys, cps, cper) if cys else None
    return out
