"""Search: the contrastive optimisation loop (`optimize`) over a run database (`rundb`), exemplars
(`exemplars`), prompts (`prompt`, `prompts/`, `reply`) and policies (`policies`: `recipes/` offline,
`llm` for OpenAI-compatible endpoints and local models); `fallback` picks what `best.py` holds when nothing
was verified faster; `report` renders a run.
Rationale: docs/design/search.md
"""
