"""GEMM regions of a traced forward, each replaced by a call to its own tuned Triton GEMM kernel.

A region is one matrix product (`nn.Linear`, `F.linear`, matmul/mm/bmm/`@`, a matrix-product einsum) over any
tensors of the graph, plus the longest run of elementwise ops after it that the GEMM template's epilogue takes
(`tunematch.epilogue_step`: same shape and dtype, scalars and length-N vectors as other operands, a triu/tril
last). Invariant: every value inside a region except its output is read only inside the region (the fused
kernel never writes it); the output may have any readers. Everything outside the regions stays the
reference's PyTorch ops. Runs in the `rewrite` subprocess on a shape-propagated graph (meta tensors).
Rationale: docs/design/recipes.md#gemmsplice
"""
from __future__ import annotations

import operator
import re
from dataclasses import dataclass, field

from kernelcraft.search.recipes import tunematch, tunetemplates
from kernelcraft.search.recipes.fxrules import _torch
from kernelcraft.search.recipes.tunable import Kernel, Match, split_for
from kernelcraft.search.recipes.tunematch import _arg, _dt, _meta

MIN_DIM = 16  # below this in M, N or K a product is a matrix-vector one: memory-bound work for another kernel


@dataclass
class Operand:
    """A kernel argument: a graph node, or a parameter read by attribute path; `t`: passed as its `.t()`."""
    node: object = None
    attr: str | None = None
    t: bool = False


@dataclass
class Region:
    gemm: object  # the product's node
    members: list  # the epilogue's nodes, in graph order; the last (or the product) is the output
    a: Operand
    b: Operand
    vectors: list  # Operand per v_i of the kernel
    match: Match  # the kernel and its shape (bindings: a description only)
    ops: list[str] = field(default_factory=list)

    @property
    def output(self):
        return self.members[-1] if self.members else self.gemm


@dataclass
class Spliced:
    source: str  # the kernel modules and one `_kc_gemm{i}(a, b, vectors)` per region
    regions: list[dict]  # {"name", "match", "ops"} per region


def _strided_t(n, rows: int, cols: int) -> bool:
    """A 2-D value of shape (rows, cols) laid out as the transpose of a contiguous (cols, rows) matrix."""
    tm = _meta(n)
    return tm is not None and len(tm.shape) == 2 and tuple(tm.stride) == (1, rows) and cols > 1


def _product(gm, n):
    """(a, b, bias operands, a transposed, b transposed, batched, K, N) of a product node, else None."""
    torch = _torch()
    F = torch.nn.functional
    nodes = lambda *xs: all(hasattr(x, "op") and _meta(x) is not None for x in xs)  # noqa: E731
    if n.op == "call_module":
        mod = gm.get_submodule(n.target)
        if type(mod) is not torch.nn.Linear or len(n.args) != 1 or n.kwargs or not nodes(n.args[0]):
            return None
        vecs = [Operand(attr=f"{n.target}.bias")] if mod.bias is not None else []
        return (Operand(n.args[0]), Operand(attr=f"{n.target}.weight", t=True), vecs, False, True, False,
                mod.in_features, mod.out_features)
    if n.op == "call_function" and n.target in (F.linear, torch._C._nn.linear):
        x, w, b = _arg(n, 0, "input"), _arg(n, 1, "weight"), _arg(n, 2, "bias")
        if not nodes(x, w) or len(_meta(w).shape) != 2 or (b is not None and not nodes(b)):
            return None
        N, K = (int(d) for d in _meta(w).shape)
        if b is not None and tuple(_meta(b).shape) != (N,):
            return None
        return Operand(x), Operand(w, t=True), ([Operand(b)] if b is not None else []), False, True, False, K, N
    if n.op == "call_function" and n.target is torch.einsum:
        operands = n.args[1:] if len(n.args) == 3 else (tuple(n.args[1]) if len(n.args) == 2 else ())
        roles = tunematch._einsum_roles(n.args[0]) if len(operands) == 2 and not n.kwargs else None
        if roles is None or not nodes(*operands):
            return None
        (batched, b_t), (a, b) = roles, operands
        return _operands(a, b, batched, b_t)
    is_bmm = (n.op == "call_function" and n.target is torch.bmm) or (n.op == "call_method" and n.target == "bmm")
    is_mm = ((n.op == "call_function" and n.target in (torch.matmul, torch.mm, operator.matmul))
             or (n.op == "call_method" and n.target in ("matmul", "mm")))
    if not (is_mm or is_bmm) or len(n.args) != 2 or n.kwargs or not nodes(*n.args):
        return None
    a, b = n.args
    sa, sb = tuple(_meta(a).shape), tuple(_meta(b).shape)
    if len(sa) == 3 and len(sb) == 3 and sa[0] == sb[0]:
        return _operands(a, b, True, False)
    if is_bmm or len(sb) != 2 or len(sa) < 2:
        return None
    return _operands(a, b, False, False)


def _operands(a, b, batched: bool, b_t_eq: bool):
    """The product A @ B, or A @ B^T when the equation names B's transpose (B is then (N, K))."""
    sa, sb = tuple(_meta(a).shape), tuple(_meta(b).shape)
    if batched:
        if len(sa) != 3 or len(sb) != 3 or sa[0] != sb[0] or sa[2] != sb[1]:
            return None
        return Operand(a), Operand(b), [], False, False, True, int(sb[1]), int(sb[2])
    if len(sb) != 2 or len(sa) < 2:
        return None
    if b_t_eq:
        N, K = (int(d) for d in sb)
        b_t = tuple(_meta(b).stride) == (K, 1)
    else:
        K, N = (int(d) for d in sb)
        b_t = _strided_t(b, K, N)
    a_t = len(sa) == 2 and _strided_t(a, int(sa[0]), int(sa[1]))
    if int(sa[-1]) != K:
        return None
    return Operand(a), Operand(b, t=b_t_eq), [], a_t, b_t, False, K, N


def _closed(gemm, members: list, k: int) -> bool:
    """Whether the product plus members[:k] is a region: every value but the last read only inside it."""
    body = [gemm] + members[:k]
    inside = set(body)
    return all(set(x.users) <= inside for x in body[:-1])


def _epilogue(gm, gemm, members: list, vecs: list, shape: tuple, dtype: str, N: int, batched: bool):
    """(epilogue lines, vectors, triangle, diagonal, op names) of the product followed by `members`, else None."""
    names = {gemm: "acc"}
    lines = ["acc = acc + v0"] if vecs else []
    vecs, ops, tri, tri_diag = list(vecs), [], "", 0
    for n in members:
        if tri:
            return None  # the triangle is the last op: f(0) need not be 0
        found = tunematch._triangle_of(n, n.args[0]) if n.args and n.args[0] in names else None
        if found is not None and (batched or len(shape) == 2):
            (tri, tri_diag), names[n] = found, names[n.args[0]]
        else:
            step = tunematch.epilogue_step(gm, n, names, len(vecs), shape, dtype, N, lambda o: True)
            if step is None:
                return None
            expr, new = step
            vecs += [Operand(o) for o in new]
            names[n] = f"e{len(lines)}"
            lines.append(f"{names[n]} = {expr}")
        ops.append(_op_name(gm, n))
    lines.append(f"out = {names[members[-1]] if members else 'acc'}")
    return lines, vecs, tri, tri_diag, ops


def _op_name(gm, n) -> str:
    if n.op == "call_module":
        return type(gm.get_submodule(n.target)).__name__
    return n.target if isinstance(n.target, str) else getattr(n.target, "__name__", str(n.target))


def _region(gm, gemm, after: list) -> Region | None:
    prod = _product(gm, gemm)
    if prod is None or _meta(gemm) is None:
        return None
    a, b, vecs, a_t, b_t, batched, K, N = prod
    shape, dtype = tuple(_meta(gemm).shape), _dt(gemm)
    if dtype is None or shape[-1] != N or any(_dt(o.node) != dtype for o in (a, b, *vecs) if o.node is not None):
        return None
    nb, M = (int(shape[0]), int(shape[1])) if batched else (1, 1)
    if not batched:
        for d in shape[:-1]:
            M *= int(d)
    if min(M, N, K) < MIN_DIM:
        return None
    members, inside = [], {gemm}
    for n in after:  # grow: every op the epilogue can take whose tensor operands include a region value
        if not any(o in inside for o in n.all_input_nodes):
            continue
        if _epilogue(gm, gemm, members + [n], vecs, shape, dtype, N, batched) is not None:
            members.append(n)
            inside.add(n)
    k = max(i for i in range(len(members) + 1) if _closed(gemm, members, i))  # i = 0 always closes
    members = members[:k]
    lines, vecs, tri, tri_diag, ops = _epilogue(gm, gemm, members, vecs, shape, dtype, N, batched)
    epilogue = "\n".join(lines)
    plain = epilogue == "out = acc" and not vecs and not tri and not batched
    kernel = Kernel("gemm", dtype, epilogue=epilogue, vectors=len(vecs), b_trans=b_t, a_trans=a_t, batched=batched,
                    tri=tri, tri_diag=tri_diag, split_k=split_for(M, N, K) if plain else 1)
    shape_d = {"M": M, "N": N, "K": K, **({"batch": nb} if batched else {})}
    desc = {"a": a.attr or a.node.name, "b": b.attr or b.node.name}
    return Region(gemm, members, a, b, vecs, Match(kernel, shape_d, desc), [_op_name(gm, gemm)] + ops)


def regions(gm) -> list[Region]:
    """The GEMM regions of gm's graph, in graph order; none overlap."""
    nodes = [n for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]
    found, taken = [], set()
    for i, n in enumerate(nodes):
        if n in taken:
            continue
        try:
            r = _region(gm, n, [x for x in nodes[i + 1:] if x not in taken])
        except (AttributeError, TypeError, ValueError, KeyError, IndexError):
            r = None  # a pattern the matcher cannot read is no region, never a failure
        if r is not None:
            found.append(r)
            taken |= {n, *r.members}
    return found


def _launcher(name: str):
    def launcher(*a):  # placeholder object: the graph calls it by name, the generated module defines it
        raise RuntimeError("generated launcher placeholder")

    launcher.__name__ = launcher.__qualname__ = name
    launcher.__module__ = "kernelcraft_generated"
    launcher._kc_generated = True
    return launcher


def kernel_source(i: int, region: Region) -> str:
    """Region i's kernel module, its names suffixed (`_kc_g{i}_*`), and `_kc_gemm{i}(a, b, vectors)` running it
    with the configuration `_KC_GEMM{i}_CONFIG`, a module global the rendered candidate defines."""
    body = tunetemplates.kernel_module(region.match.kernel).replace(tunetemplates.HEADER, "")
    body = re.sub(r"\b_kc_(gemm_kernel|launch|run)\b", lambda m: f"_kc_g{i}_{m.group(1).replace('gemm_', '')}", body)
    doc = f"{' -> '.join(region.ops)} as one kernel, shape {region.match.shape}"
    return (body.strip() + f'\n\n\ndef _kc_gemm{i}(a, b, vectors):\n    """{doc}."""\n'
            f"    return _kc_g{i}_run(a, b, vectors, _KC_GEMM{i}_CONFIG)\n")


def splice(gm) -> Spliced | None:
    """Replace each GEMM region of gm.graph by a call to its kernel's launcher; None when there is none."""
    found = regions(gm)
    if not found:
        return None
    g = gm.graph
    replaced, sources, info = {}, [], []  # replaced: a region's output -> the call standing for it

    def value(o: Operand):
        if o.node is not None:
            v = replaced.get(o.node, o.node)
        else:
            v = g.get_attr(o.attr)
        return g.call_method("t", (v,)) if o.t else v

    for i, r in enumerate(found):
        out, name = r.output, f"_kc_gemm{i}"
        with g.inserting_before(out):
            a, b = value(r.a), value(r.b)
            call = g.call_function(_launcher(name), (a, b, tuple(value(v) for v in r.vectors)))
        call.meta["tensor_meta"] = out.meta.get("tensor_meta")
        out.replace_all_uses_with(call)
        replaced[out] = call
        for m in reversed([r.gemm] + r.members):
            g.erase_node(m)
        sources.append(kernel_source(i, r))
        info.append({"name": name, "match": r.match.to_json(), "ops": r.ops})
    g.lint()
    gm.recompile()
    return Spliced(tunetemplates.HEADER + "\n\n" + "\n\n".join(sources), info)
