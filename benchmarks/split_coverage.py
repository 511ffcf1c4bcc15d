"""Which build path (kernelcraft/fastbuild.py) a corpus of candidates would take, and why the split declines.

Usage: python3 benchmarks/split_coverage.py DIR_OR_FILE... [--markdown] [--show-declines N]

Static: nothing is compiled. For each Python file, every `load_inline(...)` call whose `cuda_sources` is a
string literal, a module-level name bound to one, or a list of those, is planned with the call's literal
`extra_cflags` / `extra_cuda_cflags` (a non-literal argument counts as none). Reports how many sources
take the split (kernels through nvcc without torch), `types`, `bare` or the plain build, and the split's
decline reasons (`cusplit.decline_reason`). Whether a split source then compiles is the GPU tests' and
build_time.py's business; a split that does not compile falls back to `types`.
"""
from __future__ import annotations

import argparse
import ast
import collections
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kernelcraft import cusplit, fastbuild  # noqa: E402


def _literal(node, names: dict):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name) and node.id in names:
        return _literal(names[node.id], {})
    if isinstance(node, (ast.List, ast.Tuple)):
        parts = [_literal(e, names) for e in node.elts]
        return parts if all(isinstance(p, str) for p in parts) else None
    return None


def sources(path: Path):
    """(cuda source, extra_cflags, extra_cuda_cflags) of each load_inline call in the file."""
    try:
        tree = ast.parse(path.read_text(errors="replace"))
    except SyntaxError:
        return
    names = {t.id: node.value for node in tree.body if isinstance(node, ast.Assign)
             for t in node.targets if isinstance(t, ast.Name)}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "load_inline"):
            continue
        kw = {k.arg: k.value for k in node.keywords}
        cuda = _literal(kw["cuda_sources"], names) if "cuda_sources" in kw else None
        if cuda is None:
            continue
        cuda = "\n".join(cuda) if isinstance(cuda, list) else cuda
        flags = [_literal(kw[k], names) if k in kw else None for k in ("extra_cflags", "extra_cuda_cflags")]
        yield cuda, *[f if isinstance(f, list) else None for f in flags]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--show-declines", type=int, default=0, help="print the first N declined files")
    args = ap.parse_args()
    files = sorted(f for p in map(Path, args.paths) for f in ([p] if p.is_file() else p.rglob("*.py")))
    paths, reasons, declined = collections.Counter(), collections.Counter(), []
    for f in files:
        for cuda, cflags, cuda_cflags in sources(f):
            p = fastbuild.plan("", cuda, {}, cflags, cuda_cflags)
            path = p.variant.split("-")[0] if p else "plain"
            paths[path] += 1
            if path != "split":
                why = cusplit.decline_reason(cuda, cuda_cflags) or "host flags (extra_cflags)"
                reasons[re.sub(r":.*", "", why)] += 1
                declined.append((f, why))
    total = sum(paths.values())
    print(f"{len(files)} files, {total} load_inline CUDA sources")
    if args.markdown:
        print("\n| build path | sources | share |\n|---|---|---|")
        for path in ("split", "types", "bare", "plain"):
            print(f"| {path} | {paths[path]} | {100 * paths[path] / max(total, 1):.0f}% |")
        print("\n| split declined because | sources |\n|---|---|")
        for why, n in reasons.most_common():
            print(f"| {why} | {n} |")
    else:
        print(dict(paths), dict(reasons.most_common()))
    for f, why in declined[:args.show_declines]:
        print(f"  {f}: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
