"""The caller's side of the judge: the static screen, and starting, reusing and watching judge processes (`runner`,
`zygote`, `warm`, `sandbox`, `gpushare`). Nothing here runs candidate code; all but `single` (the one-sided jobs a
judge process runs instead of an evaluation) runs in the caller and touches no CUDA.

Rationale: docs/design/judge-caller.md
"""
