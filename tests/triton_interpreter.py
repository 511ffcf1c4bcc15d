"""Running rendered Triton candidates in Triton's CPU interpreter (`TRITON_INTERPRET=1`), for the tests of the
tunable templates: a subprocess each, since the interpreter is chosen when triton is first imported."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
# Triton 3.6's interpreter turns a runtime int into a 1-element array that NumPy >= 2.4 refuses to index
# with (`range(0, K, BLOCK_K)` in the GEMM kernel); this shim, test-only, reads the element instead.
SHIM = textwrap.dedent("""
    import triton.runtime.interpreter as _ti
    _orig = _ti._patch_lang_tensor
    def _patched(tensor, scope):
        _orig(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))
    _ti._patch_lang_tensor = _patched
""")


def run(script: str, *, timeout: float = 600, **env) -> subprocess.CompletedProcess:
    """`script` (dedented) after the shim, in a fresh interpreter-mode Python, from the repository root."""
    return subprocess.run([sys.executable, "-c", SHIM + textwrap.dedent(script)], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=dict(os.environ, TRITON_INTERPRET="1", **env))


def wrong_candidates(cases: list[tuple[str, str]], tmp_path: Path, *, timeout: float = 600) -> list[str]:
    """The candidate files among (reference source, candidate path) pairs whose outputs differ from their
    reference's (tests/test_recipes.py `_same_as_reference`: two input draws, rtol 1e-4)."""
    listing = tmp_path / "cases.json"
    listing.write_text(json.dumps(cases))
    proc = run(f"""
        import json, sys
        sys.path.insert(0, {str(TESTS)!r})
        import test_recipes as t
        bad = []
        for ref, path in json.load(open({str(listing)!r})):
            if not t._same_as_reference(type("T", (), {{"source": ref}}), open(path).read()):
                bad.append(path)
        print(json.dumps(bad))
    """, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
