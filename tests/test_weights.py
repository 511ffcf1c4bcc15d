"""Weights and module mode as inputs (kernelcraft/judge/correctness/weights.py): the perturbation, the state matching, and
evaluations that show what the verdict records. The cheats and the legitimate patterns themselves are fixtures
(tests/fixtures/hacks/weights_*.py, mode_*.py; legit/guard_weights_*.py, guard_mode_*.py, run by test_guards)."""
from __future__ import annotations

import textwrap

import pytest
import torch

from kernelcraft.evaluate import evaluate
from kernelcraft.judge.correctness import weights
from kernelcraft.protocol import Protocol, ProtocolError

from conftest import FIXTURES

TASKS = FIXTURES / "tasks"
LEGIT = FIXTURES / "legit"


def _entry(key, t, kind="param", **extra):
    return {"key": key, "shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch."), "kind": kind, **extra}


def test_perturbation_moves_every_element_and_keeps_what_must_stay():
    torch.manual_seed(0)
    ones, zeros = torch.ones(4, 8, 8), torch.zeros(64)
    var = torch.rand(32) + 0.1
    w = torch.empty(32, 16).uniform_(-0.25, 0.25)
    w[0, 0] = float("inf")
    steps = torch.arange(10)
    mask = torch.tril(torch.ones(6, 6))
    values = [ones, zeros, var, w, steps, mask, w]
    entries = [_entry("ln.weight", ones), _entry("ln.bias", zeros), _entry("bn.running_var", var, "stat"),
               _entry("fc.weight", w), _entry("bn.num_batches_tracked", steps, "stat"),
               _entry("mask", mask, "buffer"), _entry("head.weight", w, same_as=3)]
    new, n = weights.perturbed(values, entries)
    assert n == 4  # parameters and floating statistics; not the int counter, the mask or the tied copy
    assert (new[0] != 1).all() and new[0].std() > 0.05  # an all-ones LayerNorm weight stops being uniform
    assert (new[1] != 0).all()
    assert (new[2] > 0).all() and not torch.equal(new[2], var)  # a variance stays a variance
    assert new[3][0, 0] == float("inf") and (new[3].flatten()[1:] != w.flatten()[1:]).all()
    rel = ((new[3] - w).flatten()[1:].norm() / w.flatten()[1:].norm()).item()
    assert 0.1 < rel < 0.5  # moved, magnitude kept
    assert torch.equal(new[4], steps) and torch.equal(new[5], mask)
    assert new[6] is new[3]  # tied: one value under both keys
    again, _ = weights.perturbed(values, entries)
    assert not torch.equal(again[0], new[0])  # a fresh draw every time


def test_match_names_what_differs():
    ref = [{"key": "fc.weight", "shape": [4, 3]}, {"key": "fc.bias", "shape": [4]}]
    assert weights.match(ref, [{"key": "fc.bias", "shape": [4]}, {"key": "fc.weight", "shape": [4, 3]}]) == []
    got = weights.match(ref, [{"key": "fc.weight", "shape": [3, 4]}, {"key": "lin.bias", "shape": [4]}])
    assert "missing fc.bias" in got and "unexpected lin.bias" in got
    assert any(g.startswith("fc.weight: shape [3, 4]") for g in got)
    assert weights.match(ref, None) == ["the candidate's state_dict could not be read"]


def _write(tmp_path, name, src):
    p = tmp_path / name
    p.write_text(textwrap.dedent(src))
    return p


def test_renamed_parameters_are_recorded_not_rejected(tmp_path):
    cand = _write(tmp_path, "renamed.py", """
        import torch
        import torch.nn as nn

        class ModelNew(nn.Module):
            def __init__(self, in_features, out_features):
                super().__init__()
                self.linear = nn.Linear(in_features, out_features)

            def forward(self, x):
                return torch.relu(self.linear(x))
        """)
    v = evaluate(TASKS / "guard_linear.py", cand, device="cpu", timing=False)
    assert v.status == "correct", v.message
    w = v.weights
    assert w.matched is False and not w.checked and w.tensors == 2
    assert "missing fc.weight" in w.mismatch and "unexpected linear.bias" in w.mismatch
    assert v.to_json()["weights"]["matched"] is False and "weights_as_inputs" not in v.guards


def test_weights_record_of_a_drop_in(tmp_path):
    v = evaluate(TASKS / "guard_linear.py", LEGIT / "guard_weights_same_names.py", device="cpu", timing=False)
    assert v.status == "correct", v.message
    assert v.weights.checked and v.weights.matched and v.weights.perturbed == 2 and v.weights.changed_output
    assert "weights_as_inputs" in v.guards


def test_constant_buffers_are_loaded_not_perturbed(tmp_path):
    """A causal mask kept as a buffer may be computed instead of read: only parameters (and normalisation
    statistics) get new values, so such a candidate stays correct."""
    task = _write(tmp_path, "masked.py", """
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def __init__(self, n, d):
                super().__init__()
                self.proj = nn.Linear(d, d)
                self.register_buffer("mask", torch.tril(torch.ones(n, n)))

            def forward(self, x):
                s = self.proj(x) @ x.transpose(-1, -2)
                return torch.softmax(s.masked_fill(self.mask == 0, float("-inf")), dim=-1)

        def get_inputs():
            return [torch.randn(4, 16, 8)]

        def get_init_inputs():
            return [16, 8]
        """)
    cand = _write(tmp_path, "cand.py", """
        import torch
        import torch.nn as nn

        class ModelNew(nn.Module):
            def __init__(self, n, d):
                super().__init__()
                self.proj = nn.Linear(d, d)
                self.register_buffer("mask", torch.tril(torch.ones(n, n)))

            def forward(self, x):
                n = x.shape[1]
                causal = torch.ones(n, n, dtype=torch.bool, device=x.device).tril()
                s = self.proj(x) @ x.transpose(-1, -2)
                return torch.softmax(s.masked_fill(~causal, float("-inf")), dim=-1)
        """)
    v = evaluate(task, cand, device="cpu", timing=False)
    assert v.status == "correct", v.message
    assert v.weights.checked and v.weights.tensors == 3 and v.weights.perturbed == 2


def test_tied_weights_get_one_value(tmp_path):
    task = _write(tmp_path, "tied.py", """
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def __init__(self, d):
                super().__init__()
                self.enc = nn.Linear(d, d, bias=False)
                self.dec = nn.Linear(d, d, bias=False)
                self.dec.weight = self.enc.weight

            def forward(self, x):
                return self.dec(torch.tanh(self.enc(x)))

        def get_inputs():
            return [torch.randn(8, 16)]

        def get_init_inputs():
            return [16]
        """)
    cand = _write(tmp_path, "cand.py", """
        import torch
        import torch.nn as nn

        class ModelNew(nn.Module):
            def __init__(self, d):
                super().__init__()
                self.enc = nn.Linear(d, d, bias=False)
                self.dec = nn.Linear(d, d, bias=False)
                self.dec.weight = self.enc.weight

            def forward(self, x):
                w = self.enc.weight
                return torch.tanh(x @ w.t()) @ w.t()
        """)
    v = evaluate(task, cand, device="cpu", timing=False)
    assert v.status == "correct", v.message
    assert v.weights.checked and v.weights.tensors == 2 and v.weights.perturbed == 1


# -- module mode -------------------------------------------------------------------------------------------------
def test_module_mode_is_a_protocol_knob():
    assert Protocol().module_mode == "train"  # KernelBench's default
    assert Protocol(module_mode="eval").key()["module_mode"] == "eval"
    with pytest.raises(ProtocolError, match="module_mode"):
        Protocol.make(module_mode="inference")


def test_the_mode_is_applied_to_both_sides():
    """The folded-BatchNorm candidate is right in eval mode (its fixture) and wrong in train mode: the knob
    reaches the models, and the verdict records it."""
    cand = LEGIT / "guard_mode_eval_folded_batchnorm.py"
    v = evaluate(TASKS / "guard_batchnorm.py", cand, device="cpu", timing=False, module_mode="train")
    assert v.status == "incorrect" and "value_mismatch" in v.reasons, v.message
    assert v.module_mode.mode == "train" and v.protocol.module_mode == "train"
    v = evaluate(TASKS / "guard_batchnorm.py", cand, device="cpu", timing=False, module_mode="eval")
    assert v.status == "correct", v.message
    assert v.module_mode.mode == "eval" and v.module_mode.reference_init == "train"


def test_eval_in_init_is_overridden_and_recorded(tmp_path):
    """A candidate that puts itself in eval mode in __init__ gets the protocol's mode anyway (as a user's
    model.train() would), and the verdict says what its construction left."""
    cand = _write(tmp_path, "init_eval.py", """
        import torch.nn as nn

        class ModelNew(nn.Module):
            def __init__(self, in_features, out_features):
                super().__init__()
                self.fc = nn.Linear(in_features, out_features)
                self.bn = nn.BatchNorm1d(out_features)
                self.eval()

            def forward(self, x):
                return self.bn(self.fc(x))
        """)
    v = evaluate(TASKS / "guard_batchnorm.py", cand, device="cpu", timing=False)
    assert v.status == "correct", v.message
    assert v.module_mode.candidate_init == "eval" and v.module_mode.reference_init == "train"
