"""Tripwires: what the candidate's own process checks on itself — process-state snapshot, hooks, threads (`guards`),
output snapshot and kernels a call ran (`calls`, `kerneltrace`). A candidate can silence them; they name attempted
cheats and are trusted only as bad news: correctness and timing are decided in the judge.

Rationale: docs/design/judge-tripwires.md
"""
