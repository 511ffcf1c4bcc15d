"""The judge's processes and what passes between them: the judge process (`worker`: one job's sequence; `jobs`: its
life across jobs), the sides (`side`, driven through `sideproc`, forked by `forker`), the wire, the shared-memory
arenas, isolation between them (`isolation`, `freeze`, `audit`), and how a side's failure is named (`failures`).

Rationale: docs/design/judge-process.md
"""
