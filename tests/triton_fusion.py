"""For the tests of the `triton` recipe's generated kernels (`tritonfuse`, `dimreduce`, `pooling`): a task source
traced and fused as the `recipes` analysis does it, the candidate rendered from that, the calls left in the graph."""
from __future__ import annotations

from kernelcraft.search.recipes import render, rewrite

# the interpreter scripts' loader of a reference or candidate file as a module of its own
LOAD = '''
def load(path, name):
    mod = types.ModuleType(name)
    exec(compile(open(path).read(), path, "exec"), mod.__dict__)
    return mod
'''


def fuse(source: str):
    """(graph module, reference model, `rewrite.triton_kernels`'s result) for the reference in `source`."""
    model, inputs = rewrite._build(rewrite._load_reference(source))
    gm = rewrite._trace(model, inputs)
    return gm, model, rewrite.triton_kernels(gm)


def candidate(source: str) -> str:
    """The `triton` recipe's candidate for `source` (the fused graph must be non-empty)."""
    gm, model, fused = fuse(source)
    assert fused is not None
    prelude, code = rewrite.render_graph(gm, model)
    a = rewrite.Analysis(traced=True, variants={"": {"prelude": "", "code": "", "triton": {
        "prelude": prelude, "code": code, "kernels": fused.source, "regions": fused.regions}}})
    return render.render(source, ["triton"], a)


def calls(gm) -> list:
    """The graph's function and method calls by name, in order."""
    return [getattr(n.target, "__name__", n.target) for n in gm.graph.nodes if n.op in ("call_function", "call_method")]
