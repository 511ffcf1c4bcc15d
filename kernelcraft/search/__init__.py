"""Search: the contrastive optimisation loop (`optimize`) over a run database (`rundb`), exemplars
(`exemplars`), prompts (`prompt`, `prompts/`, `reply`) and policies (`policies`: `recipes/` offline,
`llm` for OpenAI-compatible endpoints and local models); `report` renders a run.
Rationale: docs/design/search.md
"""
