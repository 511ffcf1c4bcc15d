"""Correctness: compare a candidate's outputs with the reference's.

Design decisions
- Outputs must have the reference's structure: a plain `torch.Tensor` where the reference returns one,
  a tuple/list of the same length where it returns a sequence. Tensor subclasses (lazy wrappers,
  `__torch_function__` tricks) and tensors without real storage are not outputs.
- Tolerance: `|cand - ref| <= atol * scale + rtol * |ref|`, elementwise, where `scale` is
  max(1, RMS of the reference output). Scaling atol by the output's magnitude lets an fp32 kernel that
  sums in another order pass at any magnitude (a K=4096 matmul has outputs of RMS ~64), while a real
  precision loss (TF32, fp16 inside an fp32 task) is still far outside it. Defaults per output dtype:
  fp32 1e-4, fp16/bf16 1e-2, fp64 1e-7; `atol`/`rtol` override both.
- NaN/Inf are compared as values: allowed only where the reference has the same non-finite value.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

DEFAULT_TOL = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 1e-2, torch.float64: 1e-7}


@dataclass
class Comparison:
    reasons: list[str] = field(default_factory=list)
    message: str = ""
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    atol: float | None = None
    rtol: float | None = None

    @property
    def ok(self) -> bool:
        return not self.reasons

    def fail(self, reason: str, message: str) -> "Comparison":
        self.reasons.append(reason)
        self.message = self.message or message
        return self


def as_tensor_list(out) -> list | None:
    """The outputs as a list (None if the structure is neither a tensor nor a tuple/list)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return list(out)
    return None


def is_plain_tensor(t) -> bool:
    return type(t) is torch.Tensor or type(t) is torch.nn.Parameter


def has_real_storage(t: torch.Tensor) -> bool:
    try:
        return t.untyped_storage().data_ptr() != 0 or t.numel() == 0
    except Exception:
        return False


def default_tolerance(dtype: torch.dtype) -> float:
    return DEFAULT_TOL.get(dtype, 1e-4 if dtype.is_floating_point else 0.0)


def compare_outputs(ref, cand, atol: float | None = None, rtol: float | None = None) -> Comparison:
    res = Comparison()
    ref_list, cand_list = as_tensor_list(ref), as_tensor_list(cand)
    if ref_list is None:
        return res.fail("non_tensor_output", f"the reference returned {type(ref).__name__}; "
                        "kernelcraft compares tensors and tuples/lists of tensors")
    if cand_list is None or isinstance(ref, torch.Tensor) != isinstance(cand, torch.Tensor):
        return res.fail("non_tensor_output",
                        f"expected {_describe(ref)}, got {_describe(cand)}")
    if len(ref_list) != len(cand_list):
        return res.fail("shape_mismatch",
                        f"expected {len(ref_list)} outputs, got {len(cand_list)}")
    for i, (r, c) in enumerate(zip(ref_list, cand_list)):
        where = f"output {i}: " if len(ref_list) > 1 else ""
        if not isinstance(r, torch.Tensor):
            if r != c:
                return res.fail("value_mismatch", f"{where}expected {r!r}, got {c!r}")
            continue
        if not isinstance(c, torch.Tensor):
            return res.fail("non_tensor_output", f"{where}expected a tensor, got {type(c).__name__}")
        if not is_plain_tensor(c):
            return res.fail("lazy_output", f"{where}got a {type(c).__module__}.{type(c).__name__}, "
                            "not a plain torch.Tensor")
        if c.layout != torch.strided or not has_real_storage(c):
            return res.fail("lazy_output", f"{where}the output has no real strided storage")
        if c.shape != r.shape:
            return res.fail("shape_mismatch", f"{where}expected shape {tuple(r.shape)}, got {tuple(c.shape)}")
        if c.dtype != r.dtype:
            return res.fail("dtype_mismatch", f"{where}expected dtype {r.dtype}, got {c.dtype}")
        if c.device != r.device:
            return res.fail("device_mismatch", f"{where}expected device {r.device}, got {c.device}")
        _compare_values(res, r, c, atol, rtol, where)
        if not res.ok:
            return res
    return res


def resolve_tolerance(dtype: torch.dtype, atol, rtol) -> tuple[float, float]:
    """(atol, rtol) for this dtype: the given values, or the dtype's default for those left None."""
    tol = default_tolerance(dtype)
    return (tol if atol is None else atol), (tol if rtol is None else rtol)


def rms_scale(values: torch.Tensor) -> float:
    """atol is relative to the reference's RMS where that exceeds 1 (finite float64 values)."""
    return max(1.0, float(values.pow(2).mean().sqrt())) if values.numel() else 1.0


def within_tolerance(r64: torch.Tensor, c64: torch.Tensor, atol: float, rtol: float, scale: float) -> torch.Tensor:
    """The one elementwise bound every comparison uses: |c - r| <= atol * scale + rtol * |r|."""
    return (c64 - r64).abs() <= atol * scale + rtol * r64.abs()


def _compare_values(res: Comparison, r: torch.Tensor, c: torch.Tensor, atol, rtol, where: str) -> None:
    if not (r.dtype.is_floating_point or r.dtype.is_complex):
        if not torch.equal(r, c):
            n = int((r != c).sum())
            res.fail("value_mismatch", f"{where}{n} of {r.numel()} elements differ")
        return
    a, rt = resolve_tolerance(r.dtype, atol, rtol)
    res.atol, res.rtol = a, rt
    r64, c64 = r.detach().double(), c.detach().double()
    r_fin, c_fin = torch.isfinite(r64), torch.isfinite(c64)
    bad_nonfinite = (~c_fin & ~(~r_fin & ((c64 == r64) | (torch.isnan(c64) & torch.isnan(r64))))).sum()
    if int(bad_nonfinite):
        res.fail("nan_or_inf", f"{where}{int(bad_nonfinite)} NaN/Inf values where the reference has none")
        return
    missing_nonfinite = int((~r_fin & c_fin).sum())
    if missing_nonfinite:
        res.fail("value_mismatch", f"{where}{missing_nonfinite} finite values where the reference has NaN/Inf")
        return
    both = r_fin & c_fin
    if not bool(both.any()):
        return
    rv, cv = r64[both], c64[both]
    scale = rms_scale(rv)
    diff = (cv - rv).abs()
    res.max_abs_err = max(res.max_abs_err, float(diff.max()))
    res.max_rel_err = max(res.max_rel_err, float((diff / rv.abs().clamp_min(a * scale)).max()))
    over = ~within_tolerance(rv, cv, a, rt, scale)
    if bool(over.any()):
        n = int(over.sum())
        res.fail("value_mismatch",
                 f"{where}{n} of {rv.numel()} elements outside tolerance (atol={a:g}×{scale:.3g}, rtol={rt:g}); "
                 f"max abs err {float(diff.max()):.3g}")


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return "a tensor" if is_plain_tensor(x) else f"a {type(x).__name__} (tensor subclass)"
    if isinstance(x, (tuple, list)):
        return f"a {type(x).__name__} of {len(x)}"
    return f"a {type(x).__name__}"
