"""The header of a fault/legit fixture: `# expect: STATUS[/REASON] — why`, `# task:`, `# options: {json}`,
`# message: REGEX`, `# covered-in:`. Shared by test_eval.py and test_faults.py."""
import json
import re
from pathlib import Path


def read_header(path: Path) -> dict:
    head: dict = {"options": {}, "message": None, "task": "tiny_elementwise.py", "covered_in": None}
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        key, _, value = line[1:].strip().partition(":")
        value = value.strip()
        if key == "expect":
            verdict = re.split(r"\s+(?:—|--|-)\s+", value, maxsplit=1)[0].strip()
            status, _, reason = verdict.partition("/")
            head["status"], head["reason"] = status, reason or None
        elif key == "task":
            head["task"] = value
        elif key == "options":
            head["options"] = json.loads(value)
        elif key == "message":
            head["message"] = value
        elif key == "covered-in":
            head["covered_in"] = value
    assert "status" in head, f"{path.name}: the first line must be '# expect: STATUS/REASON — ...'"
    return head
