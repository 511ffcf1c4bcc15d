"""Stateful references (KernelBench level 3's RNNs keep `self.hidden` in a plain attribute and update it on every
call): the judge calls both sides in step in the trials, restores both to their constructed state before every timed
round, and keeps the weights check's extra reference call from advancing it. A candidate that drops the state update
is still wrong."""
from __future__ import annotations

from pathlib import Path

import pytest

from kernelcraft.evaluate import evaluate

FIXTURES = Path(__file__).parent / "fixtures"
TASK = FIXTURES / "tasks" / "guard_stateful_rnn.py"
SAME = FIXTURES / "legit" / "guard_stateful_rnn_same.py"
LAZY = FIXTURES / "legit" / "guard_stateful_rnn_lazy_buffers.py"
FAST = dict(device="cpu", trials=3, time_budget_s=0.3, min_rounds=6, remeasure_above=None)

# the hidden state is computed but never kept: right on the first call only
STATELESS = SAME.read_text().replace("        self.hidden = self.tanh(self.i2h(torch.cat((x, self.hidden), dim=1)))\n"
                                     "        return self.h2o(self.hidden)",
                                     "        return self.h2o(self.tanh(self.i2h(torch.cat((x, self.hidden), dim=1))))")


@pytest.mark.parametrize("processes", [1, 2])
def test_the_reference_own_stateful_code_is_correct_with_timing(processes, cache_dir):
    v = evaluate(TASK, SAME, processes=processes, cache_dir=cache_dir, **FAST)
    assert v.status == "correct", v.message
    assert v.timing is not None and v.timing.samples >= 6
    assert v.weights is not None and v.weights.checked and v.weights.changed_output


def test_buffers_allocated_on_the_first_call_behind_a_flag_are_correct_with_timing(cache_dir):
    v = evaluate(TASK, LAZY, processes=1, cache_dir=cache_dir, **FAST)
    assert v.status == "correct", v.message
    assert v.timing is not None and v.timing.samples >= 6


def test_scalar_flags_go_back_with_the_tensors():
    import torch

    from kernelcraft.judge.process import modelstate

    class Lazy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.buf, self._ready, self.calls, self.tag = None, False, 0, "a"

    m = Lazy()
    snap = modelstate.plain_state(m)
    assert {n for _, n, _ in snap} == {"buf", "_ready", "calls", "tag"}  # not nn.Module's own attributes
    m.buf, m._ready, m.calls = torch.ones(2), True, 3
    assert modelstate.changed(snap, modelstate.plain_state(m))
    modelstate.set_plain_state(m, snap)
    assert m.buf is None and m._ready is False and m.calls == 0 and m.tag == "a"
    assert not modelstate.changed(snap, modelstate.plain_state(m))
    m.calls = 0.0  # a value of another type is a change
    assert modelstate.changed(snap, modelstate.plain_state(m))


def test_dropping_the_state_update_is_incorrect(cache_dir):
    assert STATELESS != SAME.read_text()
    v = evaluate(TASK, STATELESS, processes=1, cache_dir=cache_dir, **FAST)
    assert v.status == "incorrect" and "value_mismatch" in v.reasons, (v.status, v.reasons, v.message)


def test_a_warm_reference_starts_each_candidate_from_its_constructed_state(cache_dir):
    first = evaluate(TASK, SAME, processes=1, cache_dir=cache_dir, **FAST)
    again = evaluate(TASK, SAME.read_text() + "\n# another candidate\n", processes=1, cache_dir=cache_dir, **FAST)
    assert first.status == again.status == "correct", (first.message, again.message)
    assert again.env.reference == "warm"


def test_restored_state_stays_where_the_forward_moved_it():
    """Values go back, placement does not: a model that moved its hidden state once (and remembers that in a flag)
    keeps it on that device and dtype (here the meta device and float64 stand in for the GPU)."""
    import torch

    from kernelcraft.judge.process import modelstate

    class Cell(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.hidden = torch.arange(4.0)
            self.lazy = None

    m = Cell()
    snap = modelstate.plain_state(m)
    m.hidden = (m.hidden + 1).to(torch.float64)
    m.lazy = torch.ones(2)
    assert modelstate.changed(snap, modelstate.plain_state(m))
    modelstate.set_plain_state(m, snap)
    assert m.hidden.dtype == torch.float64 and m.hidden.tolist() == [0.0, 1.0, 2.0, 3.0] and m.lazy is None
    assert not modelstate.changed(snap, [(i, n, v.float() if v is not None else None)
                                         for i, n, v in modelstate.plain_state(m)])
    m.hidden = torch.empty(4, device="meta")
    modelstate.set_plain_state(m, snap)
    assert m.hidden.device.type == "meta"
