"""The project's text says what the code does: a short README, docs/ links that resolve, every environment
variable, reason code, protocol field and command documented, nothing that points outside the repository and no
history words. Reads files only (no candidate runs)."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _tracked(*patterns: str) -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", *patterns], cwd=ROOT, capture_output=True, text=True, check=True)
        files = [ROOT / f for f in out.stdout.split()]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: every file under the root
        files = [p for pat in patterns for p in ROOT.glob(f"**/{pat}")]
    return [f for f in files if f.is_file()]


def _markdown() -> list[Path]:
    return [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted(DOCS.rglob("*.md"))]


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    out = set()
    for line in re.sub(r"```.*?```", "", page.read_text(), flags=re.S).splitlines():
        m = re.match(r"#+\s+(.*)", line)
        if m:
            out.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return out


def test_the_readme_fits_on_a_few_screens():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


def test_the_readme_test_command_is_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    command = 'python -m pytest -q -m "not gpu"'
    assert command in readme and command in ci


def test_every_link_in_the_docs_resolves():
    bad = []
    for page in _markdown():
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for link in re.findall(r"\]\(([^)\s]+)\)", text):
            if link.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = link.partition("#")
            target = (page.parent / path) if path else page
            if not target.exists():
                bad.append(f"{page.relative_to(ROOT)}: {link} (no such file)")
            elif anchor and target.suffix == ".md" and anchor.lower() not in _anchors(target):
                bad.append(f"{page.relative_to(ROOT)}: {link} (no such heading)")
    assert not bad, "\n".join(bad)


def test_every_docs_page_the_code_names_exists_with_its_heading():
    bad = []
    for src in sorted((ROOT / "kernelcraft").rglob("*.py")):
        for ref in re.findall(r"docs/[\w\-/]+\.md(?:#[\w\-]+)?", src.read_text()):
            path, _, anchor = ref.partition("#")
            target = ROOT / path
            if not target.is_file() or (anchor and anchor not in _anchors(target)):
                bad.append(f"{src.relative_to(ROOT)}: {ref}")
    assert not bad, "\n".join(bad)


def test_every_environment_variable_the_code_reads_is_in_the_table():
    table = (DOCS / "environment.md").read_text()
    names = set()
    for src in (ROOT / "kernelcraft").rglob("*.py"):
        names |= set(re.findall(r"\b(KERNELCRAFT_[A-Z0-9_]+)\b", src.read_text()))
    assert names, "no KERNELCRAFT_ variable found in the code: the scan is wrong"
    assert sorted(n for n in names if f"`{n}`" not in table) == []


def test_every_reason_code_protocol_field_and_command_is_documented():
    from kernelcraft.cli import app
    from kernelcraft.protocol import Protocol
    from kernelcraft.verdict import REASONS

    contract, protocol, cli = ((DOCS / p).read_text() for p in ("contract.md", "protocol.md", "cli.md"))
    assert [c for c in REASONS if f"`{c}`" not in contract] == []
    assert [f for f in Protocol.model_fields if f"`{f}`" not in protocol] == []
    import typer.main

    group = typer.main.get_command(app)
    commands = [f"kernelcraft {name}" for name in group.commands]
    assert len(commands) >= 6 and [c for c in commands if c not in cli] == []


HISTORY = re.compile(r"\bissues? #?\d+|\b(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|"
                     r"twelfth|thirteenth|fourteenth|fifteenth|\d+(st|nd|rd|th)) session\b|\bsession \d+\b", re.I)
OUTSIDE = re.compile(r"\.\./shared\b|\bshared/(CONTRACT\.md|datasets)")


@pytest.mark.parametrize("rule", ["history", "outside"])
def test_the_project_speaks_of_the_product_inside_the_repository(rule):
    pattern = HISTORY if rule == "history" else OUTSIDE
    me = Path(__file__).resolve()
    found = []
    for f in _tracked("*.py", "*.md", "*.toml", "*.yaml", "*.yml", "*.txt", ".ci/run"):
        if f.resolve() == me:
            continue
        for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            if pattern.search(line):
                found.append(f"{f.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert not found, "\n".join(found[:20])
