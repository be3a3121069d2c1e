"""The phases of a trial's steps (advisor.trials.record.schedule), without running a trial."""

from __future__ import annotations

import subprocess
import sys

from advisor.trials.record.adaptive import Against
from advisor.trials.record.schedule import MIN_WINDOW_STEPS, StepSchedule


def phases(schedule: StepSchedule, steps: int) -> list[str]:
    return [schedule.phase(i) for i in range(steps)]


def test_the_schedule_imports_without_torch():
    code = "import sys, advisor.trials.record.schedule; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_phases_come_in_order():
    schedule = StepSchedule(wait=2, warmup=1, active=3, windows=1, window_s=1.0)
    assert schedule.total == 6
    assert phases(schedule, 8) == ["wait", "wait", "warmup", "profiled", "profiled", "profiled", "window", "window"]
    assert [schedule.first_profiled(i) for i in range(5)] == [False, False, False, True, False]


def test_a_loop_waits_at_least_one_step():
    """The first step of a loop holds the script's set-up: never warmup nor profiled."""
    assert StepSchedule(wait=0, warmup=1, active=2, loop=True).phase(0) == "wait"
    assert StepSchedule(wait=0, warmup=1, active=2).phase(0) == "warmup"
    assert StepSchedule(wait=3, warmup=1, active=2, loop=True).wait == 3


def test_the_queue_depth_is_added_to_wait_and_settle():
    schedule = StepSchedule(wait=1, warmup=1, active=1, windows=2, window_s=0.5)
    schedule.add_queue(workers=2, prefetch_factor=None)  # DataLoader's default prefetch factor: 2
    assert (schedule.queue_depth, schedule.wait, schedule.total, schedule.settle) == (4, 5, 7, 4)
    assert schedule.min_window_steps == MIN_WINDOW_STEPS  # more than one cycle of 2 workers
    assert phases(schedule, 12) == ["wait"] * 5 + ["warmup", "profiled"] + ["settle"] * 4 + ["window"]


def test_no_settle_without_windows_and_none_without_workers():
    schedule = StepSchedule(wait=1, warmup=1, active=1)
    schedule.add_queue(workers=3, prefetch_factor=4)
    assert (schedule.queue_depth, schedule.wait, schedule.settle) == (12, 13, 0)
    many = StepSchedule(wait=1, warmup=1, active=1, windows=1, window_s=1.0)
    many.add_queue(workers=8, prefetch_factor=2)
    assert many.min_window_steps == 8  # one cycle of 8 workers
    idle = StepSchedule(wait=1, warmup=1, active=1, windows=1, window_s=1.0)
    idle.add_queue(workers=0, prefetch_factor=4)
    assert (idle.queue_depth, idle.wait, idle.settle, idle.min_window_steps) == (0, 1, 0, MIN_WINDOW_STEPS)


def test_a_window_closes_after_window_s_seconds_and_min_window_steps_steps():
    schedule = StepSchedule(wait=0, warmup=0, active=1, windows=2, window_s=1.0)
    schedule.add_queue(workers=7, prefetch_factor=1)  # a window spans one cycle of 7 workers
    for _ in range(6):
        schedule.count_window_step(5.0)
    assert schedule.window == 0  # long enough, but 6 steps of the 7 a window needs
    schedule.count_window_step(5.0)
    assert schedule.window == 1 and not schedule.measured()
    for _ in range(7):
        schedule.count_window_step(0.125)
    assert schedule.window == 1  # 7 steps, but 0.875 s of the 1 s a window needs
    schedule.count_window_step(0.125)
    assert schedule.window == 2 and schedule.measured()


def test_a_window_of_long_steps_still_holds_min_window_steps():
    """Steps of 0.5 s in 1 s windows: a window holds MIN_WINDOW_STEPS of them, not two."""
    schedule = StepSchedule(wait=0, warmup=0, active=1, windows=1, window_s=1.0)
    for _ in range(MIN_WINDOW_STEPS - 1):
        schedule.count_window_step(0.5)
    assert schedule.window == 0
    schedule.count_window_step(0.5)
    assert schedule.window == 1 and schedule.measured()


def test_the_trial_is_measured_after_its_windows():
    assert StepSchedule(wait=1, warmup=1, active=1).measured()  # no windows: measured once profiled
    schedule = StepSchedule(wait=1, warmup=1, active=1, windows=3, window_s=0.0)
    measured = []
    for _ in range(3 * MIN_WINDOW_STEPS):
        schedule.count_window_step(0.1)
        measured.append(schedule.measured())
    assert measured == [False] * (3 * MIN_WINDOW_STEPS - 1) + [True]  # 3 windows of MIN_WINDOW_STEPS steps


def test_the_recorded_schedule_and_messages():
    schedule = StepSchedule.from_config({"wait": 2, "warmup": 1, "active": 3, "loop": False,
                                         "measure": {"windows": 2, "window_s": 0.5}})
    schedule.add_queue(workers=1, prefetch_factor=2)
    for _ in range(MIN_WINDOW_STEPS):
        schedule.count_window_step(1.0)
    assert schedule.to_dict() == {"wait": 4, "warmup": 1, "active": 3, "queue_depth": 2, "settle": 2,
                                  "windows": 2, "window_s": 0.5, "min_window_steps": MIN_WINDOW_STEPS,
                                  "windows_measured": 1}
    assert schedule.completed_message() == "3 steps profiled, then 1 window(s) of at least 0.5 s measured"
    assert schedule.script_ended(8, "train.py", "step") == {
        "status": "ok", "message": "3 steps profiled, then 1 window(s) of at least 0.5 s measured; train.py ended "
                                   "after 1 measurement window(s) (of 2)"}
    assert schedule.script_ended(3, "train.py", None) == {
        "status": "error", "message": "train.py finished after 3 optimizer step(s); the trial needs 8 "
                                      "(wait 4 + warmup 1 + record 3)", "script_ended": {"steps": 3, "needed": 8}}
    assert StepSchedule.from_config({"wait": 0, "warmup": 0, "active": 1}).completed_message() == "1 steps profiled"


def test_a_script_that_ends_before_its_windows_settle_against_the_best_says_so():
    """Measured against the best, the windows asked for are a range: the message gives its most, not the count a
    trial alone would have measured (a session once said "ended after 10 of 5 measurement window(s)")."""
    against = Against(100.0, 0.05, min_gain=0.03, margin=0.03, min_windows=3, max_windows=15)
    schedule = StepSchedule(wait=0, warmup=0, active=1, windows=5, window_s=0.5, against=against)
    for samples in (55, 45, 55, 45):  # no gain, within a noise too wide to call: the verdict stays open
        for _ in range(MIN_WINDOW_STEPS):
            schedule.count_window_step(0.5 / MIN_WINDOW_STEPS * 1.0001, samples / MIN_WINDOW_STEPS)
    assert schedule.window == 4 and schedule.verdict is None
    assert schedule.script_ended(30, "train.py", None)["message"].endswith(
        "train.py ended after 4 measurement window(s) (up to 15, before they settled the comparison with the best)")
