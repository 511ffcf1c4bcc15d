"""Guards against cheating candidates: every hack fixture must be denied, every legit one must pass.

Fixtures are data (tests/fixtures/{hacks,legit}/...), one candidate a file. The FIRST line of each is a
machine-readable expectation, the second a comment naming the cheat:

    # expect: EXPECT | task: TASK.py | device: cpu|gpu | screen: on|off|both [| key: value | flag]...

EXPECT is one of
    correct                         status must be "correct"
    STATUS REASON[,REASON...]       status must be STATUS and at least one listed REASON must be among the
                                    verdict's reasons (several codes only where the fixture says why)
    no_gain MAX                     not correct, or correct with speedup <= MAX ("denied its speedup")
screen:  on   = run with the static screen only (only the screen can catch it);
         off  = run with screen=False only;
         both = run twice; with screen=False the runtime guards alone must reach the verdict.
Optional keys: `off: EXPECT` (a different expectation with screen=False), `mode: open|strict`,
`module_mode: train|eval` (the protocol's module mode, default train),
`timing: on|off` (default on), `budget: S` (time_budget_s, default 0.5),
`no_pidns: EXPECT` (the fixture is run once more with KERNELCRAFT_PIDNS=0, the candidate in the judge's own PID
namespace, and must get EXPECT there; a verdict that says the candidate had no namespace of its own is held to it
too: the second layer, the seccomp filter and the audits, must deny what the namespace makes impossible),
`remeasure: X` (remeasure_above; default evaluate's 3.0),
`min_speedup: X`, `guards: a,b` (guards that must be listed), `trials: N`,
`static: flagged|dodges|clean|any` (what the AST screen alone must say, checked in test_screen.py: flagged =
one of the expected reasons; dodges = no finding, the fixture is built to reach the runtime layer; clean = no
finding, legit code; any = not pinned, for fixtures whose fix may land in either layer), flag `slow`.

GPU fixtures (`gpu_*.py` hacks, `guard_gpu_*.py` legit) are run by test_gpu_guards.py under `-m gpu`.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from kernelcraft.evaluate import check_task, evaluate
from kernelcraft.judge.process.isolation import PIDNS_SWITCH
from kernelcraft.verdict import REASONS

FIXTURES = Path(__file__).parent / "fixtures"
HACKS = FIXTURES / "hacks"
LEGIT = FIXTURES / "legit"
TASKS = FIXTURES / "tasks"
STATUSES = {"correct", "incorrect", "compile_error", "runtime_error", "timeout", "rejected"}
TIME_BUDGET_S = 0.5
NO_GAIN_RERUNS = 2  # runs of a no-gain hack after one that read a gain


# -- the header format ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Expect:
    status: str | None  # None: "no_gain"
    reasons: tuple[str, ...] = ()
    max_speedup: float | None = None

    @classmethod
    def parse(cls, text: str) -> "Expect":
        parts = text.split()
        if not parts:
            raise ValueError("empty expectation")
        if parts[0] == "correct" and len(parts) == 1:
            return cls("correct")
        if parts[0] == "no_gain" and len(parts) == 2:
            return cls(None, (), float(parts[1]))
        if parts[0] in STATUSES and parts[0] != "correct" and len(parts) == 2:
            reasons = tuple(r for r in parts[1].split(",") if r)
            unknown = [r for r in reasons if r not in REASONS]
            if not reasons or unknown:
                raise ValueError(f"unknown reason code(s) {unknown} in {text!r}")
            return cls(parts[0], reasons)
        raise ValueError(f"cannot parse expectation {text!r}")

    def __str__(self) -> str:
        if self.status is None:
            return f"no_gain {self.max_speedup}"
        return self.status + (" " + ",".join(self.reasons) if self.reasons else "")


@dataclass(frozen=True)
class Spec:
    path: Path
    expect: Expect
    task: Path
    device: str
    screen: str
    expect_off: Expect | None = None
    expect_no_pidns: Expect | None = None
    pidns: bool = True  # False: run with KERNELCRAFT_PIDNS=0 (the `no_pidns` case)
    mode: str = "open"
    module_mode: str = "train"
    timing: bool = True
    remeasure: float | None = 3.0
    min_speedup: float | None = None
    guards: tuple[str, ...] = ()
    trials: int = 5
    processes: int | None = None  # None: the device's default
    budget: float = TIME_BUDGET_S
    static: str | None = None
    slow: bool = False
    extra: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def screens(self) -> list[bool]:
        return {"on": [True], "off": [False], "both": [True, False]}[self.screen]

    def expectation(self, screen: bool, namespaced: bool = True) -> Expect:
        """What the verdict must be: `namespaced` says whether the candidate had a PID namespace of its own."""
        if not namespaced and self.expect_no_pidns is not None:
            return self.expect_no_pidns
        return self.expect_off if (not screen and self.expect_off is not None) else self.expect


def parse_header(path: Path) -> Spec:
    lines = path.read_text().splitlines()
    if len(lines) < 2 or not lines[0].startswith("# expect:") or not lines[1].startswith("#"):
        raise ValueError(f"{path.name}: line 1 must be '# expect: ...' and line 2 a comment naming the cheat")
    fields = [f.strip() for f in lines[0][1:].split(" | ")]
    kv, flags = {}, set()
    for f in fields:
        if ":" in f:
            k, v = f.split(":", 1)
            kv[k.strip()] = v.strip()
        else:
            flags.add(f)
    for required in ("expect", "task", "device", "screen"):
        if required not in kv:
            raise ValueError(f"{path.name}: header lacks '{required}:'")
    if kv["device"] not in ("cpu", "gpu") or kv["screen"] not in ("on", "off", "both"):
        raise ValueError(f"{path.name}: device must be cpu|gpu and screen on|off|both")
    task = TASKS / kv["task"]
    if not task.is_file():
        raise ValueError(f"{path.name}: task file {task} not found")
    known = {"expect", "task", "device", "screen", "off", "mode", "timing", "remeasure", "min_speedup",
             "guards", "trials", "static", "budget", "module_mode", "processes", "no_pidns"}
    unknown = set(kv) - known
    if unknown or flags - {"slow"}:
        raise ValueError(f"{path.name}: unknown header keys {sorted(unknown | (flags - {'slow'}))}")
    if kv.get("static") not in (None, "flagged", "dodges", "clean", "any"):
        raise ValueError(f"{path.name}: static must be flagged|dodges|clean|any")
    return Spec(
        path=path, expect=Expect.parse(kv["expect"]), task=task, device=kv["device"], screen=kv["screen"],
        expect_off=Expect.parse(kv["off"]) if "off" in kv else None,
        expect_no_pidns=Expect.parse(kv["no_pidns"]) if "no_pidns" in kv else None,
        mode=kv.get("mode", "open"), module_mode=kv.get("module_mode", "train"),
        timing=kv.get("timing", "on") == "on",
        remeasure=float(kv["remeasure"]) if "remeasure" in kv else 3.0,
        min_speedup=float(kv["min_speedup"]) if "min_speedup" in kv else None,
        guards=tuple(g for g in kv.get("guards", "").split(",") if g),
        trials=int(kv.get("trials", 5)), processes=int(kv["processes"]) if "processes" in kv else None,
        budget=float(kv.get("budget", TIME_BUDGET_S)), static=kv.get("static"),
        slow="slow" in flags, extra=kv)


def hack_files(device: str) -> list[Path]:
    files = sorted(HACKS.glob("*.py"))
    return [f for f in files if f.name.startswith("gpu_") == (device == "gpu")]


def legit_files(device: str) -> list[Path]:
    files = sorted(LEGIT.glob("guard_*.py"))
    return [f for f in files if f.name.startswith("guard_gpu_") == (device == "gpu")]


def all_guard_fixtures() -> list[Path]:
    return hack_files("cpu") + hack_files("gpu") + legit_files("cpu") + legit_files("gpu")


def cases(files: list[Path]) -> list:
    """One pytest param per (fixture, screen setting), and one more without a PID namespace where the fixture names
    what it must get there (`no_pidns`), marked slow where the fixture says so."""
    out = []
    for f in files:
        spec = parse_header(f)
        marks = [pytest.mark.slow] if spec.slow else []
        for scr in spec.screens:
            out.append(pytest.param(spec, scr, id=f"{f.stem}-screen_{'on' if scr else 'off'}", marks=marks))
        if spec.expect_no_pidns is not None:
            scr = spec.screens[-1]
            out.append(pytest.param(replace(spec, pidns=False), scr,
                                    id=f"{f.stem}-screen_{'on' if scr else 'off'}-no_pidns", marks=marks))
    return out


# -- running and judging --------------------------------------------------------------------------------------
def run_fixture(spec: Spec, screen: bool, device: str, cache_dir=None):
    saved = os.environ.get(PIDNS_SWITCH)
    if not spec.pidns:
        os.environ[PIDNS_SWITCH] = "off"  # the workers inherit it (a forked one from its request's environment)
    try:
        v = evaluate(spec.task, spec.path, device=device, mode=spec.mode, module_mode=spec.module_mode,
                     screen=screen, timing=spec.timing,
                     time_budget_s=spec.budget, trials=spec.trials, remeasure_above=spec.remeasure,
                     processes=spec.processes, cache_dir=cache_dir)
    finally:
        if saved is None:
            os.environ.pop(PIDNS_SWITCH, None)
        else:
            os.environ[PIDNS_SWITCH] = saved
    if not spec.pidns:
        assert not namespaced(v), f"{spec.name}: {PIDNS_SWITCH}=off, yet the candidate had a PID namespace"
    return v


def namespaced(v) -> bool:
    """Did the candidate have a PID namespace of its own (the verdict's env.isolation says)?"""
    iso = (v.env.isolation if v.env else None) or {}
    return bool((iso.get("candidate") or {}).get("pid_namespace"))


def describe(v) -> str:
    t = v.timing
    timing = (f"speedup {t.speedup:.2f}x ci {t.ci95} within-run {t.within_ci95} note {t.note!r}" if t
              else "no timing")
    return (f"status={v.status} reasons={v.reasons} speedup={v.speedup} ({timing}) guards={v.guards}\n"
            f"message: {v.message[:800]}")


def check_verdict(v, expect: Expect, spec: Spec) -> None:
    where = f"{spec.name} (expected {expect}): {describe(v)}"
    if expect.status is None:  # no_gain
        assert not _shows_gain(v, expect), where
        return
    assert v.status == expect.status, where
    if expect.status == "correct":
        assert v.reasons == [], where
        if spec.min_speedup is not None:
            assert v.speedup is not None and v.speedup >= spec.min_speedup, where
    else:
        assert set(expect.reasons) & set(v.reasons), where
        assert v.speedup is None, where  # never a speedup for a verdict other than correct
    for g in spec.guards:
        assert g in v.guards, where


# -- the fixtures ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec,screen", cases(hack_files("cpu")))
def test_hack_denied(spec: Spec, screen: bool, cache_dir):
    v = run_fixture(spec, screen, "cpu", cache_dir)
    expect = spec.expectation(screen, namespaced(v))
    for _ in range(NO_GAIN_RERUNS):
        # stopping rule: a no-gain hack must not gain systematically, so it is run again while it reads a gain
        # (one run on a loaded 2-core host read 2.4x on ~1 ms calls); a real gain reads one on every run
        if expect.status is not None or not _shows_gain(v, expect):
            break
        v = run_fixture(spec, screen, "cpu", cache_dir)
    check_verdict(v, expect, spec)


def _shows_gain(v, expect: Expect) -> bool:
    """A correct verdict above the no-gain bound. An honest "cannot tell" shows none: the verdict says the host was
    too noisy and the interval it reports reaches down to 1x. Not this run's own interval: under bursty load on 2
    cores the rounds' errors are correlated in time and a no-gain candidate read 2.14x within-run (1.50-2.80),
    reported 0.31-4.08. A real gain still shows: the sabotage guarded against (3 ms on a 2 ms call) reads ~2.4x,
    above 1 at the reported interval's lower end."""
    noisy = (v.timing is not None and (v.timing.note or "").startswith("host too noisy")
             and v.timing.ci95[0] <= 1.0)
    return v.status == "correct" and (v.speedup is None or v.speedup > expect.max_speedup) and not noisy


@pytest.mark.parametrize("spec,screen", cases(legit_files("cpu")))
def test_legit_correct(spec: Spec, screen: bool, cache_dir):
    assert spec.expect.status == "correct", f"{spec.name}: a legit fixture must expect `correct`"
    v = run_fixture(spec, screen, "cpu", cache_dir)
    check_verdict(v, spec.expect, spec)


# -- the fixture set itself -------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", all_guard_fixtures(), ids=lambda p: p.name)
def test_fixture_header_is_valid(path: Path):
    spec = parse_header(path)
    assert spec.device == ("gpu" if path.name.startswith(("gpu_", "guard_gpu_")) else "cpu"), \
        f"{path.name}: GPU fixtures are named gpu_*.py (hacks) / guard_gpu_*.py (legit), and only they"
    if path.parent == LEGIT:
        assert spec.expect.status == "correct" and spec.screen == "on"
    else:
        assert spec.static is not None, f"{path.name}: hack fixtures say what the static screen does (static:)"
    if spec.static == "flagged":
        assert spec.expect.reasons or spec.screen != "on"
    compile(path.read_text(), str(path), "exec")


# Each class of cheat the judge must catch (numbered), and the reason code(s) at least one CPU (or GPU) hack
# fixture must expect.
CHEATS = {
    "1 extra streams": ("gpu", {"extra_stream"}),
    "2 lazy outputs": ("cpu", {"non_tensor_output", "lazy_output"}),
    "3 cached outputs": ("cpu", {"stale_output"}),
    "4 memory reuse": ("cpu", {"value_mismatch", "nan_or_inf"}),
    "5 input mutation": ("cpu", {"input_mutation"}),
    "6 timer tampering": ("cpu", {"timer_tampering"}),
    "7 global state": ("cpu", {"global_state_tampering"}),
    "8 threads": ("cpu", {"thread_injection"}),
    "9 problem shrinking": ("cpu", {"shape_mismatch"}),
    "10 precision": ("cpu", {"value_mismatch"}),
    "11 reference call": ("cpu", {"reference_call", "no_custom_kernel"}),
    "12 suspicious speedup": ("cpu", {"suspicious_speedup"}),
    "13 weights ignored": ("cpu", {"weights_ignored"}),
    "14 module mode changed": ("cpu", {"mode_changed"}),
    "15 precision hidden from fixed tolerances": ("cpu", {"precision_downgrade"}),
}


@pytest.mark.parametrize("cheat", sorted(CHEATS))
def test_every_cheat_has_fixtures(cheat: str):
    device, codes = CHEATS[cheat]
    specs = [parse_header(f) for f in hack_files(device)]
    expected = set()
    for s in specs:
        expected |= set(s.expect.reasons) | set(s.expect_off.reasons if s.expect_off else ())
    assert codes <= expected, f"cheat {cheat}: no {device} hack fixture expects {sorted(codes - expected)}"


def test_header_parser_rejects_malformed(tmp_path):
    bad = {
        "no_header.py": "import torch\n",
        "bad_reason.py": "# expect: rejected not_a_code | task: guard_slow.py | device: cpu | screen: both\n#\n",
        "bad_screen.py": "# expect: correct | task: guard_slow.py | device: cpu | screen: maybe\n#\n",
        "no_task.py": "# expect: correct | task: nope.py | device: cpu | screen: on\n#\n",
        "unknown_key.py": "# expect: correct | task: guard_slow.py | device: cpu | screen: on | colour: red\n#\n",
    }
    for name, text in bad.items():
        p = tmp_path / name
        p.write_text(text)
        with pytest.raises(ValueError):
            parse_header(p)
    ok = tmp_path / "ok.py"
    ok.write_text("# expect: no_gain 1.5 | task: guard_slow.py | device: cpu | screen: both | off: incorrect "
                  "value_mismatch | remeasure: 0.5 | slow\n# why\n")
    spec = parse_header(ok)
    assert spec.expect == Expect(None, (), 1.5) and spec.expectation(False) == Expect("incorrect", ("value_mismatch",))
    assert spec.remeasure == 0.5 and spec.slow and spec.screens == [True, False]
    assert spec.expect_no_pidns is None and len(cases([ok])) == 2
    ok.write_text("# expect: correct | task: guard_slow.py | device: cpu | screen: off | no_pidns: rejected "
                  "peer_tampering\n# why\n")
    spec = parse_header(ok)
    assert spec.expectation(False) == Expect("correct")
    assert spec.expectation(False, namespaced=False) == Expect("rejected", ("peer_tampering",))
    (plain, _), (fallback, _) = (c.values for c in cases([ok]))
    assert plain.pidns and not fallback.pidns


# -- in-process unit tests of the runtime guards (no worker) ------------------------------------------------------
def test_process_state_sees_patches_and_flags():
    import torch

    from kernelcraft.judge.tripwires import guards

    state = guards.ProcessState.capture()
    state.verify()  # nothing changed
    orig = torch.nn.functional.gelu
    try:
        torch.nn.functional.gelu = lambda x, approximate="none": orig(x)
        with pytest.raises(guards.Reject) as e:
            state.verify()
        assert e.value.reasons == ["global_state_tampering"]
    finally:
        torch.nn.functional.gelu = orig
    state.verify()
    n = torch.get_num_threads()
    try:
        torch.set_num_threads(1 if n > 1 else 2)
        with pytest.raises(guards.Reject) as e:
            state.verify()
        assert e.value.reasons == ["global_state_tampering"]
    finally:
        torch.set_num_threads(n)
    import time

    real = time.perf_counter
    try:
        time.perf_counter = lambda: 0.0
        with pytest.raises(guards.Reject) as e:
            state.verify()
        assert e.value.reasons == ["timer_tampering"]
    finally:
        time.perf_counter = real
    state.verify()


def test_same_values_nan_and_structure():
    import torch

    from kernelcraft.judge.tripwires.calls import same_values

    a = torch.tensor([1.0, float("nan")])
    assert same_values(a, a.clone())
    assert not same_values(a, torch.tensor([1.0, 2.0]))
    assert not same_values(a, a.double())
    assert same_values((a, a), [a.clone(), a.clone()])
    assert not same_values((a,), (a, a))


def test_check_threads_flags_only_candidate_threads(tmp_path):
    import threading

    from kernelcraft.judge.tripwires import guards

    state = guards.ProcessState.capture()
    cand = tmp_path / "candidate.py"
    cand.write_text("import threading\n\ndef run(ev):\n    ev.wait(5)\n")
    ns: dict = {}
    exec(compile(cand.read_text(), str(cand), "exec"), ns)
    ev = threading.Event()
    foreign = threading.Thread(target=lambda: ev.wait(5), daemon=True)
    foreign.start()
    try:
        guards.check_threads(state, str(cand))  # a thread not started by candidate code
        t = threading.Thread(target=ns["run"], args=(ev,), daemon=True)
        t.start()
        with pytest.raises(guards.Reject) as e:
            guards.check_threads(state, str(cand))
        assert e.value.reasons == ["thread_injection"]
    finally:
        ev.set()


# -- degenerate tasks: check_task and `kernelcraft tasks --check` ----------------------------------------------
DEGENERATE = {
    "guard_degenerate_constant.py": "constant",
    "guard_degenerate_input_blind.py": "does not depend on the inputs",
    "guard_degenerate_weight_blind.py": "does not depend on the weights",
}


@pytest.mark.parametrize("name", sorted(DEGENERATE))
def test_check_task_flags_degenerate(name: str, cache_dir):
    r = check_task(TASKS / name, device="cpu", cache_dir=cache_dir)
    assert r["ok"] is False, r
    assert any(DEGENERATE[name] in p for p in r["problems"]), r


@pytest.mark.parametrize("name", ["guard_linear.py", "guard_slow.py"])
def test_check_task_passes_good_tasks(name: str, cache_dir):
    r = check_task(TASKS / name, device="cpu", cache_dir=cache_dir)
    assert r["ok"] is True and r["problems"] == [], r


def test_cli_tasks_check_json(cache_dir):
    files = [str(TASKS / "guard_matmul.py"), str(TASKS / "guard_degenerate_weight_blind.py")]
    p = subprocess.run([sys.executable, "-m", "kernelcraft.cli", "tasks", "--check", *files, "--device", "cpu",
                        "--json"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 1, p.stderr  # a flagged task: exit 1, the record still printed
    rec = json.loads(p.stdout.strip().splitlines()[-1])
    assert rec["checked"] == 2
    bad = [r["task"] for r in rec["degenerate"]]
    assert len(bad) == 1 and "weight_blind" in bad[0], rec
