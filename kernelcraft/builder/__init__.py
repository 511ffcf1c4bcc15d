"""Build: inline CUDA/C++ extensions compiled once into a content-addressed cache (`cache`), fast
(`fastbuild`: the split of `cusplit`/`cutemplates`, host headers precompiled by `pch`).

Named `builder`, not `build`: tools (linters, packagers, structure viewers) treat a `build/` folder as
generated output and skip it.
Rationale: docs/design/builder.md
"""
