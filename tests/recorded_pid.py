"""Processes a candidate records for a test, found again on the host. A candidate runs in a PID namespace of its own
(`kernelcraft.judge.process.isolation`) where the host allows one, and knows only that namespace's numbers: it records
`<os.readlink('/proc/self/ns/pid')> <pid>` (its namespace and the pid there), and `host_pid` finds the host's
process with that namespace and that last NSpid entry. Without a namespace the record names the host's own one.
Shared by test_faults.py and test_warm.py."""
from __future__ import annotations

import os
import re
from pathlib import Path

RECORD = re.compile(r"(pid:\[\d+\]) (\d+)")


def parse(text: str) -> tuple[str, int]:
    """(the namespace link, the pid in it) of a record; a ValueError names a malformed one."""
    m = RECORD.fullmatch(text.strip())
    if not m:
        raise ValueError(f"not a '<pid namespace> <pid>' record: {text!r}")
    return m.group(1), int(m.group(2))


def host_pid(text: str) -> int | None:
    """The host pid of the live (non-zombie) process a record names, or None if there is none."""
    ns, pid = parse(text)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry}/ns/pid") != ns:
                continue
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if int(fields["NSpid"].split()[-1]) == pid and fields["State"].split()[0] not in ("Z", "X"):
            return int(entry)
    return None
