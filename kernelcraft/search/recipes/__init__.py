"""The offline `recipes` policy: `policy` proposes recipes (technique tokens), `render` turns a recipe
and the reference into ModelNew source, `rewrite`/`fxrules` are the FX algebraic rewrites and
`tritonfuse` the Triton elementwise fusion."""
