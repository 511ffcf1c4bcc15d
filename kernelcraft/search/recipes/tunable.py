"""Tunable Triton kernels: what a template instance is, its knob space, which configurations are valid.

Two families (`gemm`; `rownorm`, a norm or a scan over rows: the last dimension, a group of channels, the
channels at a position); every knob an ordered tuple of values; `valid` masks configurations that cannot
compile or run well on a Hopper GPU (an estimate). Pure data and arithmetic: nothing here imports
torch or triton. `lookup_config` reads tuned configurations (the user's store, then the shipped one).
Rationale: docs/design/recipes.md#tunable
"""
from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
NORM_OPS = ("softmax", "log_softmax", "layernorm", "rmsnorm", "l2norm", "l1norm_mean")
SCAN_OPS = ("cumsum", "cumprod")
ROW_OPS = NORM_OPS + SCAN_OPS
SMEM_LIMIT = 227 * 1024  # bytes of shared memory one block may use on sm_90
MAX_ACC_PER_THREAD = 128  # fp32 accumulator values per thread before the tile spills
MAX_ROW_PER_THREAD = 64  # row elements per thread a row kernel keeps in registers
MIN_POSITIONS = 16  # positions a channel-norm tile spans at least (its loads are contiguous along them)

KNOBS = {
    "gemm": {
        "BLOCK_M": (64, 128, 256),
        "BLOCK_N": (64, 128, 256),
        "BLOCK_K": (32, 64, 128),
        "GROUP_M": (1, 8),
        "num_warps": (4, 8),
        "num_stages": (2, 3, 4),
    },
    "rownorm": {
        "BLOCK_N": (256, 512, 1024, 2048, 4096, 8192, 16384),
        "num_warps": (1, 2, 4, 8, 16),
        "num_stages": (1, 2, 3),
    },
}
SHAPE_KEYS = {"gemm": ("M", "N", "K"), "rownorm": ("rows", "cols")}
OPTIONAL_SHAPE_KEYS = {"gemm": {"batch": 1}, "rownorm": {}}  # key: the value it stands for when absent
TRIANGLES = ("", "upper", "lower")
MAX_SPLIT_K = 64
SMS = 132  # streaming multiprocessors of the Hopper GPUs the masks and the split are sized for


class TunableError(ValueError):
    """A kernel, shape or configuration that does not describe a valid template instance."""


@dataclass(frozen=True)
class Kernel:
    """A template family plus everything fixed in its code. gemm: `epilogue`, Python lines over `acc`
    (the fp32 accumulator tile) and `v0..` (`vectors` row vectors of length N) ending in an assignment
    to `out`; `b_trans`, B is the transpose of a contiguous (N, K) matrix (a Linear weight: its unit
    stride, which Triton specialises, is along K); `a_trans`, A the transpose of a contiguous (K, M) matrix;
    `batched`, A (batch, M, K) @ B (batch, K, N), one grid axis per batch (shape key `batch`); `tri`
    ("upper"/"lower"), the output's triangle kept as torch.triu/tril with `tri_diag` keep it, zeros elsewhere,
    and tiles wholly outside it never compute their product; `split_k` > 1, K cut into that many ranges
    computed apart and summed (a plain product only: few output tiles, a long K). rownorm: `op`, `eps`,
    `weight`, `bias`; a scan op (`SCAN_OPS`) also `reverse` (from the last element), `exclusive` (each
    output leaves its own element out) and `masked` (the scan of x * mask, a second input of x's shape); a
    layernorm `groups` > 0, x (B, C, ...) normalised per sample over each of that many groups of channels
    (GroupNorm; InstanceNorm is one channel per group), `weight` and `bias` per channel; `channels`, the op
    over dimension 1 of x (B, C, ...) at each position (shape: rows = B x positions, cols = C), one tile of
    all the channels by BLOCK_N / C positions."""
    kind: str
    dtype: str
    epilogue: str = "out = acc"
    vectors: int = 0
    b_trans: bool = False
    op: str = ""
    eps: float = 0.0
    weight: bool = False
    bias: bool = False
    a_trans: bool = False
    batched: bool = False
    tri: str = ""
    tri_diag: int = 0
    split_k: int = 1
    reverse: bool = False
    exclusive: bool = False
    masked: bool = False
    groups: int = 0
    channels: bool = False

    def __post_init__(self):
        if self.kind not in KNOBS:
            raise TunableError(f"unknown kernel kind {self.kind!r}: one of {sorted(KNOBS)}")
        if self.dtype not in DTYPE_BYTES:
            raise TunableError(f"unsupported dtype {self.dtype!r}: one of {sorted(DTYPE_BYTES)}")
        if self.kind == "rownorm" and self.op not in ROW_OPS:
            raise TunableError(f"unknown row op {self.op!r}: one of {ROW_OPS}")
        if self.tri not in TRIANGLES or (self.tri and self.kind != "gemm") or (self.tri_diag and not self.tri):
            raise TunableError(f"triangle {self.tri!r} (diagonal {self.tri_diag}): one of {TRIANGLES[1:]}, gemm only")
        if self.split_k != 1 and not (self.kind == "gemm" and 2 <= self.split_k <= MAX_SPLIT_K and not self.batched
                                      and not self.tri and not self.vectors and self.epilogue == "out = acc"):
            raise TunableError(f"split_k={self.split_k}: 2..{MAX_SPLIT_K}, for a plain unbatched product only")
        if (self.reverse or self.exclusive or self.masked) and not (self.kind == "rownorm" and self.op in SCAN_OPS):
            raise TunableError(f"reverse, exclusive and masked are for the scans {SCAN_OPS} only")
        if self.groups and not (self.kind == "rownorm" and self.op == "layernorm" and self.groups > 0):
            raise TunableError(f"groups={self.groups}: a positive count, for a grouped layernorm only")
        if self.channels and not (self.kind == "rownorm" and self.op in NORM_OPS and self.op != "layernorm"
                                  and not (self.weight or self.bias or self.groups)):
            raise TunableError("channels: a norm without affine over dimension 1 (not layernorm, not grouped)")

    def key(self) -> str:
        """A stable identity of the generated code (kind, dtype, then a hash of the rest; a field at the
        default it had before it existed is left out, so older keys still name the same code)."""
        d = asdict(self)
        for name in _LATER_FIELDS:
            if d[name] == Kernel.__dataclass_fields__[name].default:
                del d[name]
        body = json.dumps(d, sort_keys=True)
        tag = self.op if self.kind == "rownorm" else "epi"
        return f"{self.kind}-{self.dtype}-{tag}-{hashlib.sha256(body.encode()).hexdigest()[:10]}"

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Kernel":
        return cls(**d)


_LATER_FIELDS = ("a_trans", "batched", "tri", "tri_diag", "split_k", "reverse", "exclusive", "masked", "groups",
                 "channels")  # added after keys were first stored


@dataclass
class Match:
    """A kernel found in a task: the Kernel, its shape, and the expressions ModelNew passes it.
    gemm bindings: `a`, `b` (2-D operands, possibly transposed views), `vectors` (one expression per
    v_i), `lead` (the input whose leading dimensions the output keeps, for a Linear on an N-D input).
    rownorm bindings: `x`, optional `weight`, `bias`, `mask` (a masked scan)."""
    kernel: Kernel
    shape: dict
    bindings: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"kernel": self.kernel.to_json(), "shape": dict(self.shape), "bindings": dict(self.bindings)}

    @classmethod
    def from_json(cls, d: dict) -> "Match":
        return cls(Kernel.from_json(d["kernel"]), dict(d["shape"]), dict(d.get("bindings", {})))


def describe(match: Match) -> str:
    """One line for people: the template, its dtype and layout, and the size."""
    k, s = match.kernel, match.shape
    if k.kind == "rownorm":
        how = [w for on, w in ((k.reverse, "reverse"), (k.exclusive, "exclusive"), (k.masked, "masked")) if on]
        if k.channels:
            return f"{k.op} over the channels ({k.dtype}), {s['rows']} positions of {s['cols']} channels"
        if k.groups:
            return (f"group norm ({k.dtype}, {k.groups} groups of channels per sample), {s['rows']} rows of "
                    f"{s['cols']}")
        return f"row {' '.join(how + [k.op])} ({k.dtype}), {s['rows']} rows of {s['cols']}"
    words = [w for on, w in ((k.a_trans, "A transposed"), (k.b_trans, "B transposed"), (k.batched, "batched"),
                             (k.split_k > 1, f"K in {k.split_k} ranges")) if on]
    if k.tri:
        words.append(f"{k.tri} triangle kept" + (f" (diagonal {k.tri_diag})" if k.tri_diag else ""))
    if k.epilogue != "out = acc":
        words.append(f"fused epilogue of {k.epilogue.count(chr(10)) + 1} lines")
    dot = "tf32x3 tensor-core dot" if k.dtype == "float32" else "tensor-core dot"
    size = f"{s['M']}x{s['N']}x{s['K']}" + (f", {s['batch']} products" if "batch" in s else "")
    return f"GEMM ({k.dtype}, {dot}{', ' + ', '.join(words) if words else ''}), MxNxK {size}"


def check_shape(kind: str, shape: dict) -> dict:
    keys, optional = SHAPE_KEYS[kind], OPTIONAL_SHAPE_KEYS[kind]
    if not set(keys) <= set(shape) <= set(keys) | set(optional) \
            or not all(isinstance(shape[k], int) and not isinstance(shape[k], bool) and shape[k] > 0 for k in shape):
        extra = f" (optional: {', '.join(optional)})" if optional else ""
        raise TunableError(f"a {kind} shape is {{{', '.join(keys)}}}{extra} with positive integers, not {shape!r}")
    return {k: shape[k] for k in (*keys, *optional) if k in shape}


def split_for(M: int, N: int, K: int) -> int:
    """How many K ranges a plain product is cut into: 1 unless its 128x128 output tiles fill under a quarter
    of the SMs while K is long (>= 16384); then enough ranges for about two tiles per SM, each >= 2048 long."""
    tiles = -(-M // 128) * -(-N // 128)
    if tiles * 4 >= SMS or K < 16384:
        return 1
    split = 1
    while split * 2 <= MAX_SPLIT_K and tiles * split * 2 <= 2 * SMS and K // (split * 2) >= 2048:
        split *= 2
    return split


def batch_of(shape: dict) -> int:
    """How many independent products a gemm shape stands for (1 without a `batch` key)."""
    return int(shape.get("batch", 1))


def _np2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def channel_tile(channels: int) -> int:
    """The smallest tile a norm over `channels` channels takes: all of them (a power of two) by `MIN_POSITIONS`."""
    return _np2(channels) * MIN_POSITIONS


def knobs(kind: str) -> dict[str, tuple]:
    return KNOBS[kind]


def why_invalid(kernel: Kernel, shape: dict, config: dict) -> str | None:
    """None for a configuration worth compiling, else the reason it is masked."""
    space = KNOBS[kernel.kind]
    if set(config) != set(space):
        return f"configuration knobs {sorted(config)} are not {sorted(space)}"
    for k, v in config.items():
        if v not in space[k]:
            return f"{k}={v} is not one of {space[k]}"
    nbytes = DTYPE_BYTES[kernel.dtype]
    if kernel.kind == "gemm":
        bm, bn, bk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
        if bm > max(64, _np2(shape["M"])) or bn > max(64, _np2(shape["N"])) or bk > max(32, _np2(shape["K"])):
            return "block larger than the problem"
        smem = config["num_stages"] * (bm * bk + bk * bn) * nbytes
        if smem > SMEM_LIMIT:
            return f"~{smem // 1024} KB of shared memory > {SMEM_LIMIT // 1024} KB"
        if bm * bn / (32 * config["num_warps"]) > MAX_ACC_PER_THREAD:
            return "accumulator tile too large for the registers"
        if config["GROUP_M"] > 1 and shape["M"] <= bm:
            return "one row of tiles: grouping changes nothing"
        return None
    bn, warps, cols = config["BLOCK_N"], config["num_warps"], shape["cols"]
    if kernel.channels:  # a tile of all the channels by bn / C positions, never looped
        if channel_tile(cols) > bn:
            return f"fewer than {MIN_POSITIONS} positions per tile"
        if bn > _np2(cols) * max(MIN_POSITIONS, _np2(shape["rows"])):
            return "tile wider than the positions"
        if not 1 <= bn / (32 * warps) <= MAX_ROW_PER_THREAD:
            return f"{bn / (32 * warps):g} tile elements per thread (1..{MAX_ROW_PER_THREAD})"
        return None if config["num_stages"] == 1 else "one tile: no loop to pipeline"
    if bn > max(256, _np2(cols)):
        return "block larger than the row"
    per_thread = bn / (32 * warps)
    if per_thread < 1 or per_thread > MAX_ROW_PER_THREAD:
        return f"{per_thread:g} row elements per thread (1..{MAX_ROW_PER_THREAD})"
    if bn >= cols and config["num_stages"] != 1:
        return "the row fits one block: no loop to pipeline"
    return None


def valid(kernel: Kernel, shape: dict, config: dict) -> bool:
    return why_invalid(kernel, shape, config) is None


def all_configs(kernel: Kernel, shape: dict) -> list[dict]:
    """Every valid configuration, in a fixed order (what exhaustive autotuning measures)."""
    space = KNOBS[kernel.kind]
    names = list(space)
    out = []
    for values in itertools.product(*(space[n] for n in names)):
        cfg = dict(zip(names, values))
        if why_invalid(kernel, shape, cfg) is None:
            out.append(cfg)
    return out


# The configurations worth trying first on a Hopper GPU (Triton's matmul autotuning list, sized for fp32's
# tf32x3 registers, and the row kernels' register-resident and looped shapes), in the order they are tried.
SHORTLIST = {
    "gemm": [(128, 128, 32, 8, 8, 3), (128, 128, 64, 8, 8, 3), (128, 256, 32, 8, 8, 3), (256, 128, 32, 8, 8, 3),
             (128, 128, 32, 8, 4, 4), (256, 64, 32, 8, 8, 4), (64, 128, 64, 8, 4, 4), (128, 64, 64, 8, 4, 4),
             (64, 64, 64, 8, 4, 4), (128, 128, 64, 1, 8, 3), (64, 64, 32, 1, 4, 3)],
    "rownorm": [(bn, w, st) for bn in (16384, 8192, 4096, 2048, 1024) for w in (16, 8, 4) for st in (1, 2)],
}


def shortlist(kernel: Kernel, shape: dict) -> list[dict]:
    """The valid configurations of `SHORTLIST` for this shape, the default first, no repeats."""
    out = [default_config(kernel, shape)]
    for values in SHORTLIST[kernel.kind]:
        cfg = dict(zip(KNOBS[kernel.kind], values))
        if why_invalid(kernel, shape, cfg) is None and cfg not in out:
            out.append(cfg)
    return out


def config_key(config: dict) -> str:
    return ",".join(f"{k}={config[k]}" for k in sorted(config))


def default_config(kernel: Kernel, shape: dict) -> dict:
    """The hand-written starting point (the game's "-O3 schedule"): Triton's tutorial choices, moved to
    the nearest valid configuration when they do not fit the shape."""
    if kernel.kind == "gemm":
        want = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32 if kernel.dtype == "float32" else 64,
                "GROUP_M": 8, "num_warps": 4, "num_stages": 3}
    elif kernel.channels:  # 32 positions of every channel
        want = {"BLOCK_N": min(16384, max(256, _np2(shape["cols"]) * 32)), "num_warps": 4, "num_stages": 1}
    else:
        bn = min(_np2(shape["cols"]), 4096)
        want = {"BLOCK_N": max(256, bn), "num_warps": 4 if bn <= 2048 else 8, "num_stages": 1}
    return nearest_valid(kernel, shape, want)


def nearest_valid(kernel: Kernel, shape: dict, want: dict) -> dict:
    """The valid configuration closest to `want` (sum of knob-index distances; ties: fixed order)."""
    if why_invalid(kernel, shape, want) is None:
        return dict(want)
    space = KNOBS[kernel.kind]

    def idx(k, v):
        vals = space[k]
        return vals.index(v) if v in vals else min(range(len(vals)), key=lambda i: abs(math.log2(vals[i] / v)))
    target = {k: idx(k, want[k]) for k in space}
    cands = all_configs(kernel, shape)
    if not cands:
        raise TunableError(f"no valid configuration for {kernel.key()} at {shape}")
    return min(cands, key=lambda c: sum(abs(space[k].index(c[k]) - target[k]) for k in space))


# ---- the tuned-configuration store ---------------------------------------------------------------

BUILTIN_STORE = Path(__file__).with_name("tuned_configs.json")
TUNED_ENV = "KERNELCRAFT_TUNED"


def tuned_store_path() -> Path:
    """Where `kernelcraft tune` records tuned configurations and the `tuned` recipe looks first."""
    if os.environ.get(TUNED_ENV):
        return Path(os.environ[TUNED_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kernelcraft" / "tuned.json"


def _entries(path: Path) -> list[dict]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    return [e for e in data.get("entries", []) if isinstance(e, dict)] if isinstance(data, dict) else []


def record_tuned(kernel: Kernel, shape: dict, config: dict, *, ms: float, gpu: str, source: str,
                 path: Path | None = None) -> Path:
    """Add (or replace) the tuned configuration of `kernel` at `shape` in the store."""
    path = Path(path or tuned_store_path())
    entries = [e for e in _entries(path)
               if not (e.get("kernel") == kernel.key() and e.get("shape") == shape and e.get("gpu") == gpu)]
    entries.append({"kernel": kernel.key(), "kind": kernel.kind, "dtype": kernel.dtype, "shape": dict(shape),
                    "config": dict(config), "ms": ms, "gpu": gpu, "source": source})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"entries": entries}, indent=1) + "\n")
    os.replace(tmp, path)
    return path


OTHER_GPU = 1.0  # distance added to an entry tuned on another GPU product (a factor of 2 in one size)
OTHER_CODE = 0.5  # ... and to one tuned for another kernel of the same family and dtype


def lookup_config(kernel: Kernel, shape: dict, *, gpu: str | None = None, paths=None) -> tuple[dict, str]:
    """(configuration, where it came from) for `kernel` at `shape` on the GPU product `gpu` (its
    `torch.cuda.get_device_name`; None: any) (docs/design/recipes.md#tunable)."""
    paths = [tuned_store_path(), BUILTIN_STORE] if paths is None else [Path(p) for p in paths]
    keys = SHAPE_KEYS[kernel.kind]
    best, best_d, origin = None, math.inf, "default"
    for path in paths:
        for e in _entries(path):
            if e.get("kernel") != kernel.key() and not (e.get("kind") == kernel.kind and e.get("dtype") == kernel.dtype):
                continue
            cfg, eshape = e.get("config") or {}, e.get("shape") or {}
            try:
                eshape = check_shape(kernel.kind, eshape)
            except TunableError:
                continue
            if why_invalid(kernel, shape, cfg) is not None:
                continue
            d = sum(abs(math.log2(eshape[k] / shape[k])) for k in keys) \
                + (abs(math.log2(batch_of(eshape) / batch_of(shape))) if kernel.kind == "gemm" else 0) \
                + (0 if e.get("kernel") == kernel.key() else OTHER_CODE) + (OTHER_GPU if gpu and e.get("gpu") != gpu else 0)
            if d < best_d:
                best, best_d = cfg, d
                origin = f"{path.name}: {'exact' if d == 0 else 'nearest'} ({e.get('gpu', '?')}, {eshape})"
    if best is None:
        return default_config(kernel, shape), "default"
    return dict(best), origin
