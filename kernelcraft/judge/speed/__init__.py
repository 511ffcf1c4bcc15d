"""Speed: the timed rounds (`rounds`), the device they have alone (`gate`), the candidate's several processes
(`siblings`), the statistics and the clock (`timing`), the reproducibility interval (`reproduce`) and the CPU time
billed from outside the clock (`treecpu`).

Rationale: docs/design/judge-speed.md
"""
