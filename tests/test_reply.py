"""The reply parser: good, malformed and adversarial LLM replies (fixtures in tests/fixtures/replies)."""
from __future__ import annotations

import ast

import pytest

from kernelcraft.search.reply import code_blocks, parse_reply, sections

from conftest import FIXTURES

REPLIES = FIXTURES / "replies"


def reply(name: str) -> str:
    return (REPLIES / name).read_text()


def test_good_reply_takes_the_last_block_that_defines_modelnew():
    p = parse_reply(reply("good.md"))
    assert p.ok and p.reason is None
    assert "A.unsqueeze(1) * B" in p.code
    assert "model = ModelNew()" not in p.code  # the later usage example is not the implementation
    assert "print(x[:, None].shape)" not in p.code
    assert set(p.sections) == {"Performance Analysis", "Algorithm Design", "Code Implementation"}
    assert "O(N²M)" in p.sections["Performance Analysis"]
    assert p.blocks == 3


def test_bold_headings_and_tilde_fences():
    p = parse_reply(reply("good_second.md"))
    assert p.ok and "torch.mul(B, A.view(-1, 1))" in p.code
    assert set(parse_reply(reply("good_duplicate.md")).sections) == {
        "Performance Analysis", "Algorithm Design", "Code Implementation"}


@pytest.mark.parametrize("name,reason", [
    ("no_code.md", "no_code_block"),
    ("truncated.md", "truncated"),
    ("no_modelnew.md", "no_modelnew"),
    ("syntax_error.md", "syntax_error"),
])
def test_malformed_replies_are_parse_errors_with_a_reason(name, reason):
    p = parse_reply(reply(name))
    assert not p.ok and p.code is None
    assert p.reason == reason
    assert p.message  # something the next prompt can quote


def test_truncated_message_points_at_max_tokens():
    assert "cut off" in parse_reply(reply("truncated.md")).message


def test_four_backtick_fence_with_inner_backticks_and_nested_modelnew_decoy():
    p = parse_reply(reply("adversarial_fences.md"))
    assert p.ok
    tree = ast.parse(p.code)
    assert [n.name for n in tree.body if isinstance(n, ast.ClassDef)] == ["ModelNew"]
    assert 'DOC = """' in p.code and "class NotIt" in p.code  # the inner ``` stayed inside the string


def test_modelnew_only_in_comment_or_string_does_not_count():
    text = "```python\n# class ModelNew(nn.Module): ...\nX = 'class ModelNew: pass'\n```\n"
    assert parse_reply(text).reason == "no_modelnew"


def test_raw_python_without_fences_is_accepted():
    src = "import torch\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x * 2\n"
    p = parse_reply(src)
    assert p.ok and p.code == src


def test_empty_and_prose_only_replies():
    assert parse_reply("").reason == "no_code_block"
    assert parse_reply(None).reason == "no_code_block"
    assert parse_reply("I cannot help with that.").reason == "no_code_block"


def test_non_python_blocks_are_ignored_and_indented_fences_are_dedented():
    text = ("```cuda\n__global__ void k() {}\n```\n"
            "  ```python\n  import torch\n  class ModelNew(torch.nn.Module):\n      pass\n  ```\n")
    p = parse_reply(text)
    assert p.ok and p.code.startswith("import torch\nclass ModelNew")
    assert [b.lang for b in code_blocks(text)] == ["cuda", "python"]


def test_closing_fence_must_be_at_least_as_long_and_same_char():
    text = "````python\nx = 1\n```\nclass ModelNew: pass\n~~~~\n````\n"
    blocks = code_blocks(text)
    assert len(blocks) == 1 and blocks[0].closed
    assert "class ModelNew" in blocks[0].code


def test_crlf_reply_and_huge_reply():
    text = reply("good.md").replace("\n", "\r\n")
    assert parse_reply(text).ok
    big = "word " * 200_000 + "\n" + reply("good.md")
    assert parse_reply(big).ok


def test_sections_absent_is_not_an_error():
    p = parse_reply("```python\nclass ModelNew: pass\n```")
    assert p.ok and p.sections == {}
    assert sections("## 2) algorithm design\nplan\n") == {"Algorithm Design": "plan"}
