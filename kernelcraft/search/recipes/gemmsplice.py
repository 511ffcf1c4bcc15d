"""GEMM regions of a traced forward, each replaced by a call to its own tuned Triton GEMM kernel.

A region is one matrix product (`nn.Linear`, `F.linear`, matmul/mm/bmm/`@`, a matrix-product einsum) over any
tensors of the graph, plus the longest run of elementwise ops after it that the GEMM template's epilogue takes
(`gemmparts.epilogue_step`: same shape and dtype, scalars and length-N vectors as other operands, a triu/tril
last). Invariant: every value inside a region except its output is read only inside the region (the fused
kernel never writes it); the output may have any readers. Everything outside the regions stays the
reference's PyTorch ops. Runs in the `rewrite` subprocess on a shape-propagated graph (meta tensors).
Rationale: docs/design/recipes.md#gemmsplice
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from kernelcraft.search.recipes import gemmparts, tunetemplates
from kernelcraft.search.recipes.tunable import Match
from kernelcraft.search.recipes.gemmparts import _dt, _meta
from kernelcraft.search.recipes.render import generated_launcher


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
    p = gemmparts.product_of(gm, n)
    if p is None:
        return None
    operand = lambda x, **kw: Operand(attr=x, **kw) if isinstance(x, str) else Operand(x, **kw)  # noqa: E731
    vecs = [operand(p.bias)] if p.bias is not None else []
    if p.linear:
        return Operand(p.a), operand(p.b, t=True), vecs, False, True, False, p.K, p.N
    if p.batched:
        return Operand(p.a), Operand(p.b), [], False, False, True, p.K, p.N
    sa = tuple(_meta(p.a).shape)
    b_t = tuple(_meta(p.b).stride) == (p.K, 1) if p.b_named_t else _strided_t(p.b, p.K, p.N)
    a_t = len(sa) == 2 and _strided_t(p.a, int(sa[0]), int(sa[1]))
    return Operand(p.a), Operand(p.b, t=p.b_named_t), [], a_t, b_t, False, p.K, p.N


def _closed(gemm, members: list, k: int) -> bool:
    """Whether the product plus members[:k] is a region: every value but the last read only inside it."""
    body = [gemm] + members[:k]
    inside = set(body)
    return all(set(x.users) <= inside for x in body[:-1])


def _epilogue(gm, gemm, members: list, vecs: list, shape: tuple, dtype: str, N: int, batched: bool):
    """(epilogue lines, vectors, triangle, diagonal) of the product followed by `members`, else None."""
    epi = gemmparts.gemm_epilogue(gm, gemm, members, members[-1] if members else gemm, len(vecs), shape, dtype, N,
                                  batched, lambda o: True)
    if epi is None:
        return None
    lines, new, tri, tri_diag = epi
    return lines, vecs + [Operand(o) for o in new], tri, tri_diag


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
    size = gemmparts.gemm_size(shape, batched, N, K)
    if size is None:
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
    lines, vecs, tri, tri_diag = _epilogue(gm, gemm, members, vecs, shape, dtype, N, batched)
    kernel = gemmparts.gemm_kernel(dtype, lines, len(vecs), a_t, b_t, batched, tri, tri_diag, size)
    desc = {"a": a.attr or a.node.name, "b": b.attr or b.node.name}
    ops = [_op_name(gm, n) for n in [gemm] + members]
    return Region(gemm, members, a, b, vecs, Match(kernel, size, desc), ops)


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
            call = g.call_function(generated_launcher(name), (a, b, tuple(value(v) for v in r.vectors)))
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
