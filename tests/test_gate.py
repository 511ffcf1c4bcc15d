"""The device gate (judge/speed/gate.py): sharers beside each other, a timer alone, writer preference, stepping
aside, the idle floor. Each `DeviceGate` is its own open file, as in separate judge processes."""
import threading
import time

from kernelcraft.judge.speed.gate import EXCLUSIVE, SHARED, DeviceGate


def _in_thread(fn):
    done = threading.Event()

    def run():
        fn()
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return done


def test_sharers_together_a_timer_alone(tmp_path):
    path = str(tmp_path / "gpu.lock")
    a, b, timer, late = DeviceGate(path), DeviceGate(path), DeviceGate(path), DeviceGate(path)
    a.share()
    b.share()  # two evaluations' checks at once
    assert a.mode == b.mode == SHARED
    assert not a.wanted()

    timed = _in_thread(timer.exclusive)
    deadline = time.monotonic() + 10
    while not a.wanted() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert a.wanted() and b.wanted()  # the timer waits: both sharers are asked to step aside
    assert not timed.wait(0.3)  # ... and it does not get the device while they hold it

    entered = _in_thread(late.share)  # writer preference: a new sharer waits behind the waiting timer
    assert not entered.wait(0.3)

    back_a = _in_thread(a.step_aside)
    assert not timed.wait(0.3)  # b still shares
    back_b = _in_thread(b.step_aside)
    assert timed.wait(10) and timer.mode == EXCLUSIVE
    assert not back_a.wait(0.3) and not back_b.wait(0.1) and not entered.is_set()  # all out while it times

    timer.share()  # after its rounds, the timer shares again (the weights trial): the others come back
    assert back_a.wait(10) and back_b.wait(10) and entered.wait(10)
    assert a.stepped_aside == 1 and a.out_s > 0.3
    for g in (a, b, timer, late):
        g.close()


def test_two_timers_take_turns(tmp_path):
    path = str(tmp_path / "gpu.lock")
    first, second = DeviceGate(path), DeviceGate(path)
    first.share()
    second.share()
    one = _in_thread(first.exclusive)  # both upgrade at once: neither may deadlock holding its shared hold
    two = _in_thread(second.exclusive)
    deadline = time.monotonic() + 10
    while not (one.is_set() or two.is_set()) and time.monotonic() < deadline:
        time.sleep(0.01)
    winner, loser, loser_done = (first, second, two) if one.is_set() else (second, first, one)
    assert winner.mode == EXCLUSIVE and not loser_done.wait(0.3)
    winner.release()
    assert loser_done.wait(10) and loser.mode == EXCLUSIVE
    loser.close()
    winner.close()


def test_no_path_is_a_no_op(tmp_path):
    g = DeviceGate(None)
    g.share()
    assert g.mode is None and not g.wanted() and g.idle_floor() is None
    g.exclusive()
    g.record_idle(0.01)
    g.close()


def test_idle_floor_is_the_lowest_exclusive_calibration(tmp_path):
    path = str(tmp_path / "gpu.lock")
    g = DeviceGate(path)
    g.share()
    g.record_idle(0.015)  # only a timer (exclusive) writes it: a sharer's probe may have met others' work
    assert g.idle_floor() is None
    g.exclusive()
    g.record_idle(0.015)
    g.record_idle(0.030)
    assert g.idle_floor() == 0.015
    g.record_idle(0.012)
    assert DeviceGate(path).idle_floor() == 0.012
    g.close()
