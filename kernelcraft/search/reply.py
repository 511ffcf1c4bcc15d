"""Reply parsing: from an LLM's reply to candidate source (or a recorded `parse_error`).

Fences follow CommonMark; the candidate is the last closed Python block that parses and defines `ModelNew` at
top level (checked with `ast`, nothing executed), or a fenceless reply that is such Python. Anything else is a
`parse_error` with a specific reason.
Rationale: docs/design/search.md#reply
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from kernelcraft.candidate import structure_problem

_OPEN = re.compile(r"^( {0,3})(`{3,}|~{3,})[ \t]*([^\s`]*)[^`]*$")
_PY_LANGS = {"", "python", "py", "python3", "py3", "ipython", "pycon"}
SECTIONS = ("Performance Analysis", "Algorithm Design", "Code Implementation")
_SECTION_RE = re.compile(r"^[ \t]{0,3}(?:#{1,6}[ \t]*)?(?:\*\*|__)?[ \t]*(?:\d+[.)][ \t]*)?(" + "|".join(SECTIONS)
                         + r")\b[ \t]*(?:\*\*|__)?[ \t]*[:.\u2014-]?[ \t]*(?:\*\*|__)?(.*)$", re.IGNORECASE | re.MULTILINE)


@dataclass
class Block:
    lang: str
    code: str
    closed: bool
    start_line: int


@dataclass
class ParsedReply:
    code: str | None
    reason: str | None = None  # no_code_block | truncated | no_modelnew | syntax_error
    message: str = ""
    sections: dict[str, str] = field(default_factory=dict)
    blocks: int = 0

    @property
    def ok(self) -> bool:
        return self.code is not None


def code_blocks(text: str) -> list[Block]:
    lines = text.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = _OPEN.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = len(m.group(1)), m.group(2), m.group(3).lower()
        close = re.compile(r"^ {0,3}" + re.escape(fence[0]) + "{" + str(len(fence)) + r",}[ \t]*$")
        body, j = [], i + 1
        while j < len(lines) and not close.match(lines[j]):
            line = lines[j]
            strip = min(indent, len(line) - len(line.lstrip(" ")))
            body.append(line[strip:])
            j += 1
        blocks.append(Block(lang=lang, code="\n".join(body) + "\n", closed=j < len(lines), start_line=i + 1))
        i = j + 1
    return blocks


def sections(text: str) -> dict[str, str]:
    """The protocol sections' text, keyed by canonical name (code blocks included as written)."""
    marks = [(m.start(), m.end(), next(s for s in SECTIONS if s.lower() == m.group(1).lower()), m.group(2))
             for m in _SECTION_RE.finditer(text)]
    out = {}
    for k, (_, end, name, same_line) in enumerate(marks):
        stop = marks[k + 1][0] if k + 1 < len(marks) else len(text)
        body = (same_line.strip() + "\n" + text[end:stop]).strip()
        if body and name not in out:
            out[name] = body
    return out


def _defines_modelnew(code: str) -> tuple[bool, str | None]:
    problem = structure_problem(code)
    if problem is None:
        return True, None
    return False, problem[1]


def parse_reply(text: str | None) -> ParsedReply:
    if not text or not text.strip():
        return ParsedReply(None, "no_code_block", "the reply is empty")
    secs = sections(text)
    blocks = code_blocks(text)
    py = [b for b in blocks if b.lang in _PY_LANGS]
    for b in reversed([b for b in py if b.closed]):
        ok, _ = _defines_modelnew(b.code)
        if ok:
            return ParsedReply(b.code, sections=secs, blocks=len(blocks))
    if not blocks:
        ok, _ = _defines_modelnew(text)
        if ok:
            return ParsedReply(text if text.endswith("\n") else text + "\n", sections=secs)
        return ParsedReply(None, "no_code_block", "the reply has no fenced code block "
                           "(expected the implementation in a ```python block)", secs, 0)
    open_blocks = [b for b in py if not b.closed]
    if open_blocks:
        return ParsedReply(None, "truncated", f"the code block opened at line {open_blocks[-1].start_line} is never "
                           "closed: the reply was cut off (max tokens?) before the code ended", secs, len(blocks))
    mentions = [b for b in py if "ModelNew" in b.code]
    if mentions:
        b = mentions[-1]
        try:
            ast.parse(b.code)
        except SyntaxError as e:
            return ParsedReply(None, "syntax_error", f"the code block at line {b.start_line} is not valid Python: "
                               f"{e.msg} (line {e.lineno} of the block)", secs, len(blocks))
    return ParsedReply(None, "no_modelnew", f"none of the {len(blocks)} code block(s) defines `class ModelNew` "
                       "at top level", secs, len(blocks))
