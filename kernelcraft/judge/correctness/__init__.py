"""Correctness: the trials (`trials`), the fixed and calibrated rules (`compare`, `precision`, `bounds`, `fp64`,
`partial`), the weights trial (`weights`, its draw in `weightdraw`) and what the trials accepted (`acceptance`),
handed on as a value to everything judged after them.

Rationale: docs/design/judge-correctness.md
"""
