"""The offline `recipes` policy: `policy` proposes recipes (technique tokens), `render` turns a recipe
and the reference into ModelNew source, `rewrite` traces the reference and applies the FX algebraic rewrites
(`fxrules`, `simplify`, `reductions`, `activations`, `poollinear`, `convreduce`) and `tritonfuse` the Triton
elementwise fusion (with `dimreduce`, reductions over one dimension, `pooling` and `depthwise`, depthwise
convolutions); `tunable`, `tunematch` (with `gemmparts`), `gemmsplice` and `tunetemplates` hold the tunable Triton
templates.
Rationale: docs/design/recipes.md#policy
"""
