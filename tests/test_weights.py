"""Weights and module mode as inputs (kernelcraft/judge/correctness/weights.py, weightdraw.py): the perturbation, the
state matching, and evaluations that show what the verdict records. The cheats and the legitimate patterns themselves
are fixtures (tests/fixtures/hacks/weights_*.py, mode_*.py; legit/guard_weights_*.py, guard_mode_*.py, run by
test_guards)."""
from __future__ import annotations

import textwrap

import pytest
import torch

from kernelcraft.evaluate import evaluate
from kernelcraft.judge.correctness import weightdraw, weights
from kernelcraft.judge.correctness.acceptance import Acceptance
from kernelcraft.protocol import Protocol, ProtocolError

from conftest import FIXTURES

TASKS = FIXTURES / "tasks"
LEGIT = FIXTURES / "legit"


def _entry(key, t, kind="param", **extra):
    return {"key": key, "shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch."), "kind": kind, **extra}


def _rms(t):
    return float(t.double().square().mean().sqrt())


def test_perturbation_moves_every_element_and_keeps_what_must_stay():
    torch.manual_seed(0)
    ones, zeros = torch.ones(4, 8, 8), torch.zeros(64)
    var = torch.rand(32) + 0.1
    w = torch.empty(32, 16).uniform_(-0.25, 0.25)
    w[0, 0] = float("inf")
    fc_bias, gate = torch.zeros(32), torch.zeros(1)
    steps = torch.arange(10)
    mask = torch.tril(torch.ones(6, 6))
    values = [ones, zeros, var, w, fc_bias, gate, steps, mask, w]
    entries = [_entry("ln.weight", ones), _entry("ln.bias", zeros), _entry("bn.running_var", var, "stat"),
               _entry("fc.weight", w), _entry("fc.bias", fc_bias), _entry("gate", gate),
               _entry("bn.num_batches_tracked", steps, "stat"), _entry("mask", mask, "buffer"),
               _entry("head.weight", w, same_as=3)]
    new, n = weightdraw.perturbed(values, entries)
    assert n == 6  # parameters and floating statistics; not the int counter, the mask or the tied copy
    # an all-ones LayerNorm weight becomes clearly non-uniform, its gain kept (deep networks do not blow up)
    assert (new[0] != 1).all() and new[0].std() > 0.2 and abs(_rms(new[0]) - 1) < 1e-4
    # a zero bias is moved off zero as a whole (the mean of many outputs sees it), at the module's weight scale
    assert (new[1].abs() > 0.06).all() and 0.1 < abs(float(new[1].mean())) < 0.4
    assert (new[2] > 0).all() and not torch.equal(new[2], var)  # a variance stays a variance
    finite = w.flatten()[1:]
    assert new[3][0, 0] == float("inf") and (new[3].flatten()[1:] != finite).all()
    rel = ((new[3].flatten()[1:] - finite).norm() / finite.norm()).item()
    assert 0.2 < rel < 0.8 and abs(_rms(new[3].flatten()[1:]) / _rms(finite) - 1) < 1e-3  # moved, RMS kept
    scale = _rms(finite)  # a Linear's zero bias moves at its weight's RMS (PyTorch's own bias scale)
    assert 0.1 * scale < abs(float(new[4].mean())) < 0.4 * scale and (new[4].abs() > 0.06 * scale).all()
    assert 0.06 < abs(float(new[5])) < 0.4  # a zero gate with no sibling: scale 1
    assert torch.equal(new[6], steps) and torch.equal(new[7], mask)
    assert new[8] is new[3]  # tied: one value under both keys
    again, _ = weightdraw.perturbed(values, entries)
    assert not torch.equal(again[0], new[0])  # a fresh draw every time


class _ConvGroupNormMean(torch.nn.Module):
    """KernelBench's Conv3d_GroupNorm_Mean, small: at construction the output is ~0 (each group's normalised
    values average to zero), so only the GroupNorm's weight and bias move it."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv3d(3, 16, 3)
        self.group_norm = torch.nn.GroupNorm(8, 16)

    def forward(self, x):
        return self.group_norm(self.conv(x)).mean(dim=(1, 2, 3, 4))

    def assuming_initial_norm(self, x):  # the cheat: F.group_norm with weight=None, bias=None (1 and 0)
        y = torch.nn.functional.group_norm(self.conv(x), 8, None, None, self.group_norm.eps)
        return y.mean(dim=(1, 2, 3, 4))


def test_new_weights_catch_an_assumed_groupnorm_by_a_wide_margin():
    """The candidate that assumes GroupNorm weight 1 and bias 0 (as constructed) is right on every trial with the
    construction weights; after new weights it must miss by far more than the widest bound a trial uses (TF32's
    fixed 2^-8 on a GPU), on every one of 50 draws. Zero-mean noise on the bias alone averages out in the mean:
    such a draw leaves this cheat within that bound on ~5% of draws."""
    torch.manual_seed(0)
    model, x = _ConvGroupNormMean(), torch.randn(8, 3, 8, 12, 12)
    sd = model.state_dict()
    values = [v.clone() for v in sd.values()]
    entries = [_entry(k, v) for k, v in sd.items()]
    tf32 = 2.0 ** -8
    with torch.no_grad():
        assert weightdraw.excess(model(x), model.assuming_initial_norm(x), Acceptance.fixed(1, 1e-6, 1e-6)) < 1  # exact as constructed
        ratios = []
        for seed in range(50):
            torch.manual_seed(seed)
            new, n = weightdraw.perturbed(values, entries)
            assert n == 4
            model.load_state_dict(dict(zip(sd, new)))
            ratios.append(weightdraw.excess(model(x), model.assuming_initial_norm(x), Acceptance.fixed(1, tf32, tf32)))
    assert min(ratios) > 10, sorted(ratios)[:5]


def test_excess_is_the_change_in_units_of_the_bound():
    old = torch.tensor([0.0, 1.0, 2.0, float("nan")])
    bound = 1e-3 * 1.29 + 1e-3 * old.abs()  # atol x max(1, RMS of the finite elements) + rtol x |old|
    new = old + torch.tensor([0.0, 0.0, 5.0, 1.0]) * bound
    assert weightdraw.excess(old, new, Acceptance.fixed(1, 1e-3, 1e-3)) == pytest.approx(5.0, rel=1e-2)
    assert weightdraw.excess((old, torch.arange(3)), (old, torch.arange(3) + 1), Acceptance.fixed(2, 1e-3, 1e-3)) == 0.0  # ints, NaN skipped
    assert weightdraw.excess(torch.arange(3), torch.arange(3), Acceptance.fixed(1, 1e-3, 1e-3)) is None


def test_match_names_what_differs():
    ref = [{"key": "fc.weight", "shape": [4, 3]}, {"key": "fc.bias", "shape": [4]}]
    assert weights.match(ref, [{"key": "fc.bias", "shape": [4]}, {"key": "fc.weight", "shape": [4, 3]}]) == []
    got = weights.match(ref, [{"key": "fc.weight", "shape": [3, 4]}, {"key": "lin.bias", "shape": [4]}])
    assert "missing fc.bias" in got and "unexpected lin.bias" in got
    assert any(g.startswith("fc.weight: shape [3, 4]") for g in got)
    assert weights.match(ref, None) == ["the candidate's state_dict could not be read"]
    assert weights.match(ref, None, "state_dict() raised KeyError") == [
        "the candidate's state_dict could not be read (state_dict() raised KeyError)"]


def test_what_moves():
    assert weightdraw.moves({"key": "w", "shape": [3], "dtype": "float32", "kind": "param"})
    assert weightdraw.moves({"key": "bn.running_mean", "shape": [3], "dtype": "float16", "kind": "stat"})
    assert not weightdraw.moves({"key": "n", "shape": [], "dtype": "int64", "kind": "stat"})
    assert not weightdraw.moves({"key": "mask", "shape": [3], "dtype": "float32", "kind": "buffer"})
    assert not weightdraw.moves({"key": "e", "shape": [0, 4], "dtype": "float32", "kind": "param"})
    assert not weightdraw.moves({"key": "tied", "shape": [3], "dtype": "float32", "kind": "param", "same_as": 0})


def _write(tmp_path, name, src):
    p = tmp_path / name
    p.write_text(textwrap.dedent(src))
    return p


def test_renamed_parameters_are_not_a_drop_in(tmp_path):
    """An honest rewrite under other parameter names cannot take the reference's state_dict: not `correct`, and
    the message names the keys and the rule. (The cheats this rule closes are fixtures: weights_renamed_keys,
    weights_load_raises, weights_no_parameters.)"""
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
    assert v.status == "incorrect" and v.reasons == ["weights_mismatch"], v.message
    assert "missing fc.weight" in v.message and "unexpected linear.weight" in v.message
    assert "load_state_dict(Model.state_dict(), strict=True)" in v.message
    w = v.weights
    assert w.matched is False and not w.checked and w.tensors == 2
    assert "missing fc.weight" in w.mismatch and "unexpected linear.bias" in w.mismatch
    assert v.to_json()["weights"]["matched"] is False and "weights_as_inputs" not in v.guards


def test_an_extra_persistent_tensor_is_not_a_drop_in(tmp_path):
    """A derived tensor registered as a persistent buffer is a key the reference's state_dict lacks: a strict load
    of the reference's fails on it (persistent=False is the way: legit/guard_weights_nonpersistent_buffer.py)."""
    cand = _write(tmp_path, "extra.py", """
        import torch
        import torch.nn as nn

        class ModelNew(nn.Module):
            def __init__(self, in_features, out_features):
                super().__init__()
                self.fc = nn.Linear(in_features, out_features)
                self.register_buffer("ones", torch.ones(1))

            def forward(self, x):
                return torch.relu(self.fc(x)) * self.ones
        """)
    v = evaluate(TASKS / "guard_linear.py", cand, device="cpu", timing=False)
    assert v.status == "incorrect" and v.reasons == ["weights_mismatch"], v.message
    assert v.weights.mismatch == ["unexpected ones"]


def test_a_reference_of_constant_buffers_only_needs_no_drop_in(tmp_path):
    """A reference whose state holds nothing the judge moves (a constant buffer, no parameters) has no weights a
    candidate could assume: one that computes the constant instead of keeping the buffer stays correct, recorded
    as not a drop-in."""
    task = _write(tmp_path, "const.py", """
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def __init__(self, n):
                super().__init__()
                self.register_buffer("mask", torch.tril(torch.ones(n, n)))

            def forward(self, x):
                return x * self.mask

        def get_inputs():
            return [torch.randn(4, 16, 16)]

        def get_init_inputs():
            return [16]
        """)
    cand = _write(tmp_path, "cand.py", """
        import torch
        import torch.nn as nn

        class ModelNew(nn.Module):
            def __init__(self, n):
                super().__init__()

            def forward(self, x):
                return torch.tril(x)
        """)
    v = evaluate(task, cand, device="cpu", timing=False)
    assert v.status == "correct", v.message
    assert v.weights.matched is False and v.weights.mismatch == ["missing mask"] and not v.weights.checked
    assert "only constant buffers" in v.weights.note


def test_every_candidate_process_faces_the_new_weights(cache_dir):
    """With `processes` > 1 each extra candidate process passes the same trial with new weights before it is timed
    (the cheat that differs by process is weights_later_process_copies.py); the record counts them."""
    v = evaluate(TASKS / "guard_linear.py", LEGIT / "guard_weights_same_names.py", device="cpu", processes=3,
                 time_budget_s=0.3, remeasure_above=None, cache_dir=cache_dir)
    assert v.status == "correct", v.message
    assert v.weights.processes == 2 and v.weights.checked and v.weights.matched


def test_weights_record_of_a_drop_in(tmp_path):
    v = evaluate(TASKS / "guard_linear.py", LEGIT / "guard_weights_same_names.py", device="cpu", timing=False)
    assert v.status == "correct", v.message
    assert v.weights.checked and v.weights.matched and v.weights.perturbed == 2 and v.weights.changed_output
    assert v.weights.output_change > weights.CLEAR_MARGIN and v.weights.note == ""  # the trial had teeth
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
