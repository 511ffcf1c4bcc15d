"""The judging protocol (kernelcraft/protocol.py): one model, one default per device kind, one validation,
taken by every entry point and recorded in every verdict."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernelcraft.evaluate import evaluate
from kernelcraft.protocol import DEVICE_DEFAULTS, WEAKENING, Protocol, ProtocolError

FIXTURES = Path(__file__).parent / "fixtures"
TASK = FIXTURES / "tasks" / "tiny_elementwise.py"
NO_MODELNEW = "import torch\n\nclass NotIt(torch.nn.Module):\n    pass\n"


def test_device_kinds_have_their_own_defaults():
    p = Protocol()
    assert p.time_budget_s is None and p.timeout_s is None  # "the device's default", until resolved
    cpu, gpu = p.resolved("cpu"), p.resolved("cuda:1")
    assert (cpu.time_budget_s, cpu.timeout_s) == (DEVICE_DEFAULTS["cpu"]["time_budget_s"], DEVICE_DEFAULTS["cpu"]["timeout_s"])
    assert (gpu.time_budget_s, gpu.timeout_s) == (DEVICE_DEFAULTS["cuda"]["time_budget_s"], DEVICE_DEFAULTS["cuda"]["timeout_s"])
    assert Protocol(time_budget_s=0.25).resolved("cuda").time_budget_s == 0.25  # a given value is kept


def test_bad_values_and_unknown_knobs_name_themselves():
    with pytest.raises(ProtocolError, match="trials"):
        Protocol.make(trials=0)
    with pytest.raises(ProtocolError, match="trails: unknown option"):
        Protocol.make(trails=3)
    with pytest.raises(ProtocolError, match="mode"):
        Protocol.make(mode="lenient")
    assert issubclass(ProtocolError, ValueError)  # the caller's bug, as every bad option is


def test_a_zero_timing_budget_is_refused_by_every_entry_point():
    """No timing at all is `timing=False`; a budget of 0 s timed nothing and reported an interval anyway, beside a
    correct verdict."""
    for bad in (0, 0.0, -1):
        with pytest.raises(ProtocolError, match="time_budget_s"):
            Protocol.make(time_budget_s=bad)
    with pytest.raises(ProtocolError, match="time_budget_s"):
        evaluate(TASK, NO_MODELNEW, device="cpu", time_budget_s=0)
    assert Protocol.make(time_budget_s=0.05).time_budget_s == 0.05
    pytest.importorskip("fastapi")
    from kernelcraft.serve.service import Options

    with pytest.raises(Exception, match="time_budget_s"):
        Options(time_budget_s=0)


def test_make_layers_overrides_and_protocols_are_values():
    base = Protocol(trials=3, mode="strict")
    p = Protocol.make(base, atol=1e-3)
    assert (p.trials, p.mode, p.atol) == (3, "strict", 1e-3)
    assert Protocol.make(base.key(), trials=4).trials == 4  # a pinned dict round-trips
    assert Protocol.make(remeasure_above=None).remeasure_above is None  # an explicit None is kept: never re-measure
    with pytest.raises(Exception):
        base.trials = 9  # frozen
    assert base.with_(seed=7).seed == 7 and base.seed == 42


def test_verdict_records_the_resolved_protocol_even_without_a_worker(cache_dir):
    v = evaluate(TASK, NO_MODELNEW, device="cpu", trials=3)
    assert v.status == "compile_error"
    assert v.protocol is not None and v.protocol.trials == 3
    assert v.protocol.time_budget_s == DEVICE_DEFAULTS["cpu"]["time_budget_s"]
    assert v.to_json()["protocol"]["trials"] == 3  # in the JSON record too (additive to the contract)
    same = evaluate(TASK, NO_MODELNEW, device="cpu", protocol=Protocol(trials=3))
    assert same.protocol == v.protocol  # a Protocol and knob keywords are the same thing
    with pytest.raises(ProtocolError, match="bogus_knob"):
        evaluate(TASK, NO_MODELNEW, device="cpu", bogus_knob=1)


def test_the_service_takes_the_same_knobs_except_the_weakening_ones():
    pytest.importorskip("fastapi")
    from kernelcraft.serve.service import Options

    fields = set(Options.model_fields)
    assert set(Protocol.model_fields) - set(WEAKENING) <= fields
    assert not fields & set(WEAKENING)
    for name in Protocol.model_fields:  # same defaults and bounds, not a copy that can drift
        if name in fields:
            assert Options.model_fields[name].default == Protocol.model_fields[name].default, name
    with pytest.raises(Exception):
        Options(screen=False)


def _kc(*args):
    env = dict(os.environ, COLUMNS="200", NO_COLOR="1")
    return subprocess.run([sys.executable, "-m", "kernelcraft.cli", *args], capture_output=True, text=True,
                          timeout=120, env=env)


def test_cli_spells_each_knob_once_and_keeps_old_spellings(tmp_path):
    cand = tmp_path / "c.py"
    cand.write_text(NO_MODELNEW)
    new = _kc("eval", str(TASK), str(cand), "--device", "cpu", "--json", "--time-budget", "0.4", "--trials", "2")
    old = _kc("eval", str(TASK), str(cand), "--device", "cpu", "--json", "--eval-time", "0.4", "--trials", "2")
    assert new.returncode == old.returncode == 0, new.stderr + old.stderr
    assert json.loads(new.stdout.splitlines()[-1])["protocol"] == json.loads(old.stdout.splitlines()[-1])["protocol"]
    assert json.loads(new.stdout.splitlines()[-1])["protocol"]["time_budget_s"] == 0.4
    clash = _kc("eval", str(TASK), str(cand), "--device", "cpu", "--time-budget", "1", "--eval-time", "2")
    assert clash.returncode == 2 and "disagree" in clash.stderr
    bad = _kc("eval", str(TASK), str(cand), "--device", "cpu", "--target-ci", "2")
    assert bad.returncode == 2 and "--target-ci" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    bad = _kc("eval", str(TASK), str(cand), "--device", "cpu", "--build-timeout", "-1")
    assert bad.returncode == 2 and "--build-timeout:" in bad.stderr and "_" not in bad.stderr.split(":")[1], bad.stderr
    for cmd in ("eval", "optimize", "bench"):
        text = _kc(cmd, "--help").stdout
        for flag in ("--time-budget", "--trials", "--mode", "--timeout", "--remeasure-above"):
            assert flag in text, (cmd, flag)
        assert "--eval-time" not in text  # an alias that works but is not advertised


def test_an_optimize_run_refuses_a_resume_under_other_rules(tmp_path):
    from kernelcraft.search.optimize import Options, optimize

    class Nothing:
        name = "nothing"

        def propose(self, ctx):
            return []

    opts = Options(device="cpu", budget=1, null_control=False, confirm=0, protocol=Protocol(trials=2))
    optimize(TASK, tmp_path, opts, policy=Nothing())
    optimize(TASK, tmp_path, opts, policy=Nothing())  # same rules: resumes
    with pytest.raises(ValueError, match="trials"):
        optimize(TASK, tmp_path, Options(device="cpu", budget=1, null_control=False, confirm=0,
                                         protocol=Protocol(trials=3)), policy=Nothing())
