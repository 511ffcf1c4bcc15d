"""The parts of a matrix product in a traced FX graph, and of the GEMM template instance that runs it: the
product (`product_of`: `nn.Linear`, `F.linear`, matmul/mm/bmm/`@`, a matrix-product einsum), the elementwise
epilogue after it (`gemm_epilogue`, one op at a time by `epilogue_step`; a triu/tril only last), the template
shape and the `Kernel`. Shared by `tunematch` (a whole forward is one instance) and `gemmsplice` (GEMM regions
inside a larger forward), which differ only in which operands they accept and how they pass them; and the
FX-reading helpers every template matcher shares (`_meta`, `_dt`, `_floating_batched`, `_arg`, `_is_fn`, `_dim_is`,
`_attr_expr`).
Rationale: docs/design/recipes.md#tunematch
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass

from kernelcraft.search.recipes import tritonfuse
from kernelcraft.search.recipes.fxrules import _torch
from kernelcraft.search.recipes.tunable import DTYPE_BYTES, Kernel, split_for

MIN_DIM = 16  # below this in M, N or K a product is a matrix-vector one: memory-bound work for another kernel


def _meta(n):
    tm = n.meta.get("tensor_meta") if hasattr(n, "meta") else None
    return tm if tm is not None and hasattr(tm, "shape") else None


def _dt(n) -> str | None:
    tm = _meta(n)
    name = str(tm.dtype).replace("torch.", "") if tm is not None else None
    return name if name in DTYPE_BYTES else None


def _floating_batched(x, nd: int) -> bool:
    """x a float32/16 or bfloat16 batch of (channels, nd spatial dimensions) inputs."""
    tm = _meta(x)
    return tm is not None and len(tm.shape) == nd + 2 and _dt(x) in ("float32", "float16", "bfloat16")


def _arg(n, i: int, name: str, default=None):
    if len(n.args) > i:
        return n.args[i]
    return n.kwargs.get(name, default)


def _is_fn(n, fns=(), methods=()):
    return (n.op == "call_function" and n.target in fns) or (n.op == "call_method" and n.target in methods)


def _dim_is(dim, rank: int, axis: int) -> bool:
    """`dim` (an int or a one-element list/tuple) names dimension `axis` of `rank` dimensions."""
    if isinstance(dim, (list, tuple)):
        dim = dim[0] if len(dim) == 1 else None
    return isinstance(dim, int) and not isinstance(dim, bool) and -rank <= dim < rank and dim % rank == axis


def _last_dim(dim, rank: int) -> bool:
    return _dim_is(dim, rank, rank - 1)


def _attr_expr(target: str) -> str:
    return "self." + target


def _einsum_roles(eq: str):
    """(batched, b transposed) of a matrix-product equation: "PK,KN->PN" (P one or more letters, A's
    leading dims), "PK,NK->PN" (B transposed), "bMK,bKN->bMN" (a batch); else None."""
    if not isinstance(eq, str) or "->" not in eq or "." in eq:
        return None
    ins, out = eq.replace(" ", "").split("->")
    parts = ins.split(",")
    if len(parts) != 2 or len(set(out)) != len(out):
        return None
    a, b = parts
    if len(b) == 3 and len(a) == 3 and a[0] == b[0] == out[0] and len(out) == 3:  # bMK,bKN->bMN
        k, m, n = a[2], a[1], b[2]
        if b[1] == k and out[1:] == m + n and len({a[0], m, k, n}) == 4:
            return True, False
        return None
    if len(b) != 2 or len(a) < 2:
        return None
    lead, k = a[:-1], a[-1]
    if len(set(a)) != len(a) or k in out:
        return None
    if b[0] == k and b[1] not in a and out == lead + b[1]:
        return False, False
    if b[1] == k and b[0] not in a and out == lead + b[0]:
        return False, True
    return None


@dataclass
class Product:
    """A matrix product node's parts, shared by the whole-forward match and `gemmsplice`: A and B as graph nodes
    (an `nn.Linear` module's weight and bias as attribute paths instead), `b_named_t` when B is given as its
    (N, K) transpose (a Linear weight, an einsum's "...k,nk"), `batched` for one product per leading index."""
    a: object
    b: object  # a node, or an attribute path (str)
    bias: object  # None, a node, or an attribute path (str)
    linear: bool  # nn.Linear or F.linear: B a weight, `bias` its bias
    b_named_t: bool
    batched: bool
    K: int
    N: int


def _nodes(*xs) -> bool:
    return all(hasattr(x, "op") and _meta(x) is not None for x in xs)


def product_of(gm, n) -> Product | None:
    """The parts of product node `n` (`nn.Linear`, `F.linear`, matmul/mm/bmm/`@`, a matrix-product einsum)."""
    torch = _torch()
    F = torch.nn.functional
    if n.op == "call_module":
        mod = gm.get_submodule(n.target)
        if type(mod) is not torch.nn.Linear or len(n.args) != 1 or n.kwargs or not _nodes(n.args[0]):
            return None
        return Product(n.args[0], f"{n.target}.weight", f"{n.target}.bias" if mod.bias is not None else None, True,
                       True, False, mod.in_features, mod.out_features)
    if n.op == "call_function" and n.target in (F.linear, torch._C._nn.linear):
        x, w, b = _arg(n, 0, "input"), _arg(n, 1, "weight"), _arg(n, 2, "bias")
        if not _nodes(x, w) or len(_meta(w).shape) != 2 or (b is not None and not _nodes(b)):
            return None
        N, K = (int(d) for d in _meta(w).shape)
        if b is not None and tuple(_meta(b).shape) != (N,):
            return None
        return Product(x, w, b, True, True, False, K, N)
    if n.op == "call_function" and n.target is torch.einsum:
        operands = n.args[1:] if len(n.args) == 3 else (tuple(n.args[1]) if len(n.args) == 2 else ())
        roles = _einsum_roles(n.args[0]) if len(operands) == 2 and not n.kwargs else None
        if roles is None or not _nodes(*operands):
            return None
        return _binary(*operands, *roles)
    is_bmm = (n.op == "call_function" and n.target is torch.bmm) or (n.op == "call_method" and n.target == "bmm")
    is_mm = ((n.op == "call_function" and n.target in (torch.matmul, torch.mm, operator.matmul))
             or (n.op == "call_method" and n.target in ("matmul", "mm")))
    if not (is_mm or is_bmm) or len(n.args) != 2 or n.kwargs or not _nodes(*n.args):
        return None
    a, b = n.args
    sa, sb = tuple(_meta(a).shape), tuple(_meta(b).shape)
    if len(sa) == 3 and len(sb) == 3 and sa[0] == sb[0]:
        return _binary(a, b, True, False)
    if is_bmm or len(sb) != 2 or len(sa) < 2:
        return None
    return _binary(a, b, False, False)


def _binary(a, b, batched: bool, b_named_t: bool) -> Product | None:
    """A @ B, or A @ B^T when the equation names B's transpose (B is then (N, K))."""
    sa, sb = tuple(_meta(a).shape), tuple(_meta(b).shape)
    if batched:
        if len(sa) != 3 or len(sb) != 3 or sa[0] != sb[0] or sa[2] != sb[1]:
            return None
        return Product(a, b, None, False, False, True, int(sb[1]), int(sb[2]))
    if len(sb) != 2 or len(sa) < 2:
        return None
    K, N = (int(sb[1]), int(sb[0])) if b_named_t else (int(sb[0]), int(sb[1]))
    return Product(a, b, None, False, b_named_t, False, K, N) if int(sa[-1]) == K else None


def _triangle_of(n) -> tuple[str, int] | None:
    """("upper" | "lower", diagonal) when n is torch.triu/tril of its first argument, else None."""
    torch = _torch()
    for tri, fn in (("upper", torch.triu), ("lower", torch.tril)):
        if _is_fn(n, (fn,), (fn.__name__,)):
            d = _arg(n, 1, "diagonal", 0)
            if isinstance(d, int) and not isinstance(d, bool):
                return tri, d
    return None


def epilogue_step(gm, n, names: dict, nvec: int, shape: tuple, dtype: str, N: int, vector_ok):
    """(expression, new vector operand nodes) of elementwise node `n` as one line of a GEMM epilogue, or None.

    `names` maps the values already in the epilogue (the product first) to their variable names; `n` must read
    at least one of them, have the product's shape and dtype, and take its other operands from finite
    scalars or vectors of shape (N,) or (1, N) of that dtype that `vector_ok(node)` accepts. New vectors are
    named v{nvec}, v{nvec + 1}, ... in the order returned. Nothing is changed when `n` cannot join."""
    low = tritonfuse._lowering(gm, n)
    if low is None or _meta(n) is None or _dt(n) != dtype or tuple(_meta(n).shape) != shape:
        return None
    operands, fn = low
    exprs, new = [], []
    for o in operands:
        if hasattr(o, "op"):
            if o in names:
                exprs.append(names[o])
            elif vector_ok(o) and _meta(o) is not None and _dt(o) == dtype \
                    and tuple(_meta(o).shape) in ((N,), (1, N)):
                exprs.append(f"v{nvec + len(new)}")
                new.append(o)
            else:
                return None
        elif isinstance(o, (int, float)) and not isinstance(o, bool) and math.isfinite(o):
            exprs.append(repr(float(o)))
        else:
            return None
    if not any(hasattr(o, "op") and o in names for o in operands):
        return None
    return fn(exprs), new


def gemm_epilogue(gm, gemm, members: list, out, nvec: int, shape: tuple, dtype: str, N: int, batched: bool,
                  vector_ok):
    """(epilogue lines ending in `out = ...`, new vector nodes, triangle, diagonal) of product `gemm` followed by
    the elementwise `members`, or None. `out` is the value the kernel writes; only it may be a triu/tril (the
    last op: f(0) need not be 0), and only on 2-D or batched outputs. `nvec` vectors come first (a bias)."""
    names = {gemm: "acc"}
    lines = ["acc = acc + v0"] if nvec else []
    new, tri, tri_diag = [], "", 0
    for n in members:
        found = _triangle_of(n) if n is out and n.args and n.args[0] in names else None
        if found is not None and (batched or len(shape) == 2):
            (tri, tri_diag), names[n] = found, names[n.args[0]]
            continue
        step = epilogue_step(gm, n, names, nvec + len(new), shape, dtype, N, vector_ok)
        if step is None:
            return None
        expr, vecs = step
        new += vecs
        names[n] = f"e{len(lines)}"
        lines.append(f"{names[n]} = {expr}")
    if out not in names:
        return None
    return lines + [f"out = {names[out]}"], new, tri, tri_diag


def gemm_size(shape: tuple, batched: bool, N: int, K: int) -> dict | None:
    """The template shape of a product whose output has `shape`: {M, N, K} (+ batch); None below MIN_DIM."""
    nb, M = (int(shape[0]), int(shape[1])) if batched else (1, math.prod(int(d) for d in shape[:-1]))
    if min(M, N, K) < MIN_DIM:  # a matrix-vector product is memory-bound work for another kernel
        return None
    return {"M": M, "N": N, "K": K, **({"batch": nb} if batched else {})}


def gemm_kernel(dtype: str, lines: list[str], nvec: int, a_t: bool, b_t: bool, batched: bool, tri: str,
                tri_diag: int, size: dict) -> Kernel:
    """The template instance; a plain product (no epilogue, triangle or batch) cut into K ranges per `split_for`."""
    epilogue = "\n".join(lines)
    plain = epilogue == "out = acc" and not nvec and not tri and not batched
    return Kernel("gemm", dtype, epilogue=epilogue, vectors=nvec, b_trans=b_t, a_trans=a_t, batched=batched, tri=tri,
                  tri_diag=tri_diag, split_k=split_for(size["M"], size["N"], size["K"]) if plain else 1)
