"""The `attention` rule (`search/recipes/attention.py`): written-out attention becomes one fused call and
nn.MultiheadAttention stops computing weights nobody reads; the near misses are left alone; the rewritten graph
computes the reference's values on CPU tensors; whether a mask is causal is decided from the mask and kept only
while what it is made of is unchanged."""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from kernelcraft.search.recipes import attention, rewrite
from kernelcraft.task import load_task

from test_simplify import _analysed, _check, _every_variant_is_the_reference, _m

Q = torch.randn(2, 3, 10, 8)  # (batch, heads, length, head size)


def _qkv(s, x):
    return x, x.flip(-2) * 0.5, x.roll(1, dims=-2)


def _causal(n):
    return torch.tril(torch.ones(n, n)).view(1, 1, n, n)


class Masked(nn.Module):
    """softmax(q k^T / sqrt(d) with a buffer's mask sliced to the length) v."""

    def __init__(self, mask, value=float("-inf"), keep_scores=False):
        super().__init__()
        self.register_buffer("mask", mask)
        self.value, self.keep_scores = value, keep_scores

    def forward(self, x):
        q, k, v = _qkv(self, x)
        T = x.size(-2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.mask[:, :, :T, :T] == 0, self.value)
        p = F.softmax(att, dim=-1)
        y = p @ v
        return y + p.mean(-1, keepdim=True) if self.keep_scores else y


def test_written_out_attention_becomes_one_call():
    ops, code = _check(Masked(_causal(16)), [Q], "attention")
    assert "_kc_attention" in ops and "softmax" not in ops and "masked_fill" not in ops and "matmul" not in ops
    ops, _ = _check(_m(lambda s, x: torch.softmax(x @ x.transpose(-1, -2) / 3.0, -1) @ x), [Q], "attention")
    assert "_kc_attention" in ops and "softmax" not in ops
    ops, _ = _check(_m(lambda s, x: F.softmax(torch.bmm(x, x.permute(0, 2, 1)), dim=2).bmm(x)),
                    [Q[0]], "attention")  # no scale: 1, not SDPA's default 1/sqrt(d)
    assert "_kc_attention" in ops
    ops, _ = _check(_m(lambda s, x: s.mods[0](F.softmax(0.25 * (x @ x.mT), dim=-1)) @ x, nn.Dropout(0.0)),
                    [Q], "attention")
    assert "_kc_attention" in ops and "Dropout" not in ops
    ops, _ = _check(Masked((torch.rand(1, 1, 16, 16) > 0.3).float() + torch.eye(16)), [Q], "attention")
    assert "_kc_attention" in ops  # any mask (each row keeps its diagonal): passed to the kernel as it is


def test_a_mask_computed_from_the_input_is_passed_every_call():
    model = _m(lambda s, x: F.softmax((x @ x.transpose(-2, -1)).masked_fill(x.sum(-1, keepdim=True) > 50.0,
                                                                               float("-inf")), -1) @ x)
    ops, code = _check(model, [Q], "attention")
    assert "_kc_attention" in ops and ", False)" in code.replace("\n", "")  # mask_fixed False: never cached


class TrilAtRun(nn.Module):
    """The causal mask made at each call: tril of a buffer of ones sliced to the length, compared with 0."""

    def __init__(self):
        super().__init__()
        self.register_buffer("ones", torch.ones(16, 16))

    def forward(self, x):
        T = x.size(-2)
        m = torch.tril(self.ones[:T, :T]) == 0
        return F.softmax((x @ x.transpose(-2, -1)).masked_fill(m, float("-inf")), -1) @ x


def test_a_mask_made_of_buffers_and_sizes_is_kept():
    ops, code = _check(TrilAtRun(), [Q], "attention")
    call = code.split("_kc_attention(")[1].split(")")[0]
    assert "_kc_attention" in ops and "True" in call and "ones" in call  # mask_fixed, keyed on the buffer


def test_near_misses():
    _check(Masked(_causal(16), keep_scores=True), [Q], "attention", applies=False)  # the weights are returned
    _check(Masked(_causal(16), value=-1e9), [Q], "attention", applies=False)  # a finite fill: not the same program
    _check(_m(lambda s, x: F.softmax(x @ x.transpose(-2, -1), dim=-2) @ x), [Q], "attention", applies=False)
    _check(_m(lambda s, x: s.mods[0](F.softmax(x @ x.transpose(-2, -1), dim=-1)) @ x, nn.Dropout(0.1)),
           [Q], "attention", applies=False)  # random: another stream would differ
    _check(_m(lambda s, x: F.softmax((x @ x.transpose(-2, -1)) * s.t, dim=-1) @ x, t=torch.tensor(0.3)),
           [Q], "attention", applies=False)  # a learned temperature: a tensor, not a scale
    _check(_m(lambda s, x: F.softmax(x @ x.transpose(-2, -1), dim=-1) @ x[:1]), [Q], "attention",
           applies=False)  # broadcast batch dimensions
    _check(_m(lambda s, x: F.relu(x @ x.transpose(-2, -1)) @ x), [Q], "attention", applies=False)
    _check(_m(lambda s, x: F.softmax(x @ x.transpose(-2, -1), dim=-1, dtype=torch.float64).float() @ x), [Q],
           "attention", applies=False)


class MHA(nn.Module):
    def __init__(self, dropout=0.0, read_weights=False):
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 4, dropout=dropout)
        self.read_weights = read_weights

    def forward(self, x):
        out, w = self.attn(x, x, x)
        return out + w.sum() if self.read_weights else out


def test_multihead_attention_without_its_weights():
    x = torch.randn(12, 2, 16)
    ops, code = _check(MHA(), [x], "attention")
    assert "need_weights = False" in code
    _check(MHA(read_weights=True), [x], "attention", applies=False)
    _check(MHA(dropout=0.1), [x], "attention", applies=False)  # in training mode: random


def _helper():
    ns = {"torch": torch}
    exec(attention.HELPER, ns)
    return ns


def test_the_causal_test_is_kept_while_its_buffer_is_unchanged():
    ns = _helper()
    fn, cache = ns["_kc_attention"], ns["_kc_attention_causal"]
    q, k, v = torch.randn(3, 2, 10, 8), torch.randn(3, 2, 10, 8), torch.randn(3, 2, 10, 8)
    buf = _causal(16)

    def ref(masked_out):
        s = (q @ k.transpose(-2, -1)) * 0.5
        return torch.softmax(s.masked_fill(masked_out, float("-inf")), -1) @ v

    masked_out = buf[:, :, :10, :10] == 0
    torch.testing.assert_close(fn(q, k, v, 0.5, masked_out, True, buf, 10), ref(masked_out))
    assert [c for c, _ in cache.values()] == [True]
    buf[0, 0, 9, 9] = 0.0  # changed in place (a state_dict load copies the same way): tested again
    masked_out = buf[:, :, :10, :10] == 0
    torch.testing.assert_close(fn(q, k, v, 0.5, masked_out, True, buf, 10), ref(masked_out))
    assert sorted(c for c, _ in cache.values()) == [False, True]
    other = _causal(16)  # another tensor: kept answers are not its own, even were it at a freed one's address
    other[0, 0, 1, 3] = 1.0  # row 1 also sees position 3: not causal
    masked_out = other[:, :, :10, :10] == 0
    key = next(iter(cache))
    cache[((other.data_ptr(), other._version, tuple(other.shape), other.stride(), str(other.device)), 10,
           (1, 1, 10, 10))] = (True, cache[key][1])
    torch.testing.assert_close(fn(q, k, v, 0.5, masked_out, True, other, 10), ref(masked_out))
    masked_out = torch.zeros(1, 1, 10, 10, dtype=torch.bool).triu(1)  # made from the inputs: not kept
    n = len(cache)
    torch.testing.assert_close(fn(q, k, v, 0.5, masked_out, False), ref(masked_out))
    assert len(cache) == n


def test_a_buffer_sliced_by_a_traced_size_is_traced():
    """The reference's trace falls back to buffers as graph values when one is sliced by a traced length."""
    task = load_task("tests/fixtures/tasks/attention_causal.py")
    mod = rewrite._load_reference(task.source)
    model, inputs = rewrite._build(mod)
    gm = rewrite._trace(model, inputs)
    assert any(n.op == "get_attr" and n.target == "bias" for n in gm.graph.nodes)


def test_attention_fixtures_every_variant_is_the_reference():
    for name in ("attention_causal.py", "attention_mha.py"):
        task, a = _analysed(name, {"attention"})
        assert _every_variant_is_the_reference(task, a) >= 1
