"""Serve: evaluation at scale — `pool` (build and timing slots on every device), `cluster` (the same
slots as Ray actors) and `service` (the HTTP reward service over a pool).
Rationale: docs/design/serve.md
"""
