"""Which build path (kernelcraft/builder/fastbuild.py) a corpus of candidates would take, and why the split declines.

Usage: python3 benchmarks/split_coverage.py DIR_OR_FILE... [--markdown] [--show-declines N] [--compile N]

Static: nothing is compiled. For each Python file, every `load_inline(...)` call whose `cuda_sources` is a
string literal, a module-level name bound to one, or a list of those, is planned with the call's literal
`extra_cflags` / `extra_cuda_cflags` (a non-literal argument counts as none). Reports how many sources
take the split (kernels through nvcc without torch), `types`, `bare` or the plain build, and the split's
decline reasons (`cusplit.decline_reason`). With `--compile N`, the first N sources planned `split` are also
built cold, one at a time, through BuildCache (benchmarks/build_time.py's child, `fast+pch`: on a CPU-only
torch nvcc and g++ run and the link uses stand-ins for libtorch_cuda) and the variant that built each is
counted: `split` (compiled, linked and imported), or the fallback it took and why.
"""
from __future__ import annotations

import argparse
import ast
import collections
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kernelcraft.builder import cusplit, fastbuild  # noqa: E402


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
    """(cuda source, extra_cflags, extra_cuda_cflags, the call's literal arguments) of each load_inline call."""
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
        flags = [f if isinstance(f, list) else None for f in flags]
        cpp = _literal(kw["cpp_sources"], names) if "cpp_sources" in kw else ""
        funcs = _literal(kw["functions"], names) if "functions" in kw else None
        call = {"cpp": cpp if cpp is not None else "", "cuda": cuda, "cflags": flags[0], "cuda_cflags": flags[1],
                "functions": [funcs] if isinstance(funcs, str) else funcs}
        yield cuda, flags[0], flags[1], call


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--show-declines", type=int, default=0, help="print the first N declined files")
    ap.add_argument("--compile", type=int, default=0, help="build the first N split sources (see above)")
    ap.add_argument("--no-templates", action="store_true", help="leave kernel templates unsplit "
                    "(KERNELCRAFT_SPLIT=notemplates)")
    args = ap.parse_args()
    if args.no_templates:
        os.environ[fastbuild.SPLIT_SWITCH] = "notemplates"
    files = sorted(f for p in map(Path, args.paths) for f in ([p] if p.is_file() else p.rglob("*.py")))
    paths, reasons, declined, to_build = collections.Counter(), collections.Counter(), [], []
    for f in files:
        for cuda, cflags, cuda_cflags, call in sources(f):
            p = fastbuild.plan("", cuda, {}, cflags, cuda_cflags)
            path = p.variant.split("-")[0] if p else "plain"
            paths[path] += 1
            if path == "split" and len(to_build) < args.compile:
                to_build.append((f, call))
            if path != "split":
                why = (cusplit.decline_reason(cuda, cuda_cflags, fastbuild.split_templates())
                       or "host flags (extra_cflags)")
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
    if to_build:
        compile_split(to_build, args.markdown)
    return 0


def compile_split(to_build, markdown: bool) -> None:
    """Build each source cold through build_time.py's child (`fast+pch`); count the variant that built it."""
    import json
    import tempfile

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import build_time

    built, walls, fails = collections.Counter(), collections.defaultdict(list), []
    for i, (f, call) in enumerate(to_build):
        with tempfile.TemporaryDirectory(prefix="kc-cov-") as tmp:
            spec = Path(tmp) / "spec.json"
            spec.write_text(json.dumps({**call, "name": f"kc_cov_{i}"}))
            res = build_time.run_child(f"@{spec}", "fast+pch")
        variant = str(res.get("variant", "?")).removesuffix("+pch").split("-")[0]
        key = f"{variant}: {res.get('status')}"
        built[key] += 1
        walls[key].append(res.get("wall_s") or 0.0)
        if variant != "split":
            err = (res.get("error") or res.get("stderr") or "").strip()
            fails.append((f.name, key, err.splitlines()[-1][:200] if err else ""))
        print(f"[{i + 1}/{len(to_build)}] {f.name}: {key} ({res.get('wall_s') or 0:.1f} s)", file=sys.stderr,
              flush=True)
    if markdown:
        print("\n| built as | status | sources | median wall |\n|---|---|---|---|")
        for key, n in built.most_common():
            v, st = key.split(": ", 1)
            print(f"| {v} | {st} | {n} | {sorted(walls[key])[len(walls[key]) // 2]:.1f} s |")
    else:
        print(dict(built))
    for name, key, err in fails:
        print(f"  {name}: {key} {err}")


if __name__ == "__main__":
    sys.exit(main())
