"""For the tests of the `triton` recipe's generated kernels (`tritonfuse`, `dimreduce`, `pooling`, `depthwise`): a task source
traced and fused as the `recipes` analysis does it, the candidate rendered from that, the calls left in the graph."""
from __future__ import annotations

import json

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


def case_files(tmp_path, cases, kernel: str):
    """Each (reference source, input shape) written out with its `triton` candidate, which must launch `kernel`:
    the path of a JSON listing of [reference path, candidate path, shape] for an interpreter script."""
    listing = []
    for i, (source, shape) in enumerate(cases):
        ref, cand = tmp_path / f"ref{i}.py", tmp_path / f"cand{i}.py"
        ref.write_text(source)
        cand.write_text(candidate(source))
        assert kernel in cand.read_text()
        listing.append((str(ref), str(cand), list(shape)))
    path = tmp_path / "cases.json"
    path.write_text(json.dumps(listing))
    return path
