"""The step driver: what turns a training script's steps into a trial's timed, profiled, measured steps.

A step ends either when a call of the target returns (a step function, wrapped where it is defined) or,
with no target, when the training loop's optimizer steps (`advisor.trials.interposition.loop`). Either way `end_step`
times it from the end of the previous one (the user's data loading included), attributes the batches
fetched meanwhile (`advisor.trials.interposition.loaders.LoaderTracker`: the loader that fed it, its batch size and the
time it waited for them), calls `prof.step()` (so the trace's `ProfilerStep#N` span is step N) and
appends its record to `steps.jsonl`, flushed, so a killed trial keeps its finished steps.

The steps' phases (wait, warmup, profiled, settle, windows) are its `StepSchedule` (`advisor.trials.record.schedule`);
after the last window `TrialComplete` (a BaseException: passes the user's `except Exception`) ends the script.

Memory: the driver's `StepMemory` (`advisor.trials.harness.step_memory`) records the first step's activations, where
memory was at an out-of-memory error (before its frames unwind) or at the end of a finished trial, and each step's.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any, Callable

from advisor.trials.harness import profiler
from advisor.trials.harness.torchrun_rank import all_measured
from advisor.trials.record.ranks import rank_files
from advisor.knobs import STARTING, compiled
from advisor.knobs.in_trial import workers_queue
from advisor.trials.knobs import Knobs
from advisor.trials.interposition.model import compiled_graphs
from advisor.trials.interposition.step import StepInterposition
from advisor.trials.interposition.loaders import LoaderRecord, LoaderTracker, leading_dimension
from advisor.trials.record.turns import Turns, finished, pass_turn, settled, wait_for_the_other, wait_for_turn
from advisor.trials.record.schedule import StepSchedule
from advisor.trials.harness.op_count import OpCounter
from advisor.trials.harness.step_memory import StepMemory
from advisor.trials.record.trace_budget import TracePlan, budget_bytes, plan_trace
from advisor.trials.record.storage import dumps, write_json_atomic

STEPS_FILE = "steps.jsonl"


class TrialComplete(BaseException):
    """Raised out of the step once the trial has measured what it needs; ends the user's script."""


class TargetInWorker(Exception):
    """The target runs while the DataLoader makes a batch (in `__getitem__` or `collate_fn`): not a step."""


def loss_value(result: Any) -> float | None:
    """A scalar loss from what the step returned: a number, a one-element tensor, or the first one
    in a tuple/list or under the key `loss`."""
    import torch

    if isinstance(result, dict):
        result = result.get("loss")
    elif isinstance(result, (tuple, list)) and result:
        result = result[0]
    if isinstance(result, torch.Tensor) and result.numel() == 1:
        return float(result.detach().float().item())
    if isinstance(result, (int, float)) and not isinstance(result, bool):
        return float(result)
    return None


def refuse_inside_loader(tracker: LoaderTracker, target: str) -> None:
    """Raise `TargetInWorker` when the target is called while a DataLoader makes a batch."""
    import torch.utils.data

    if tracker.fetching or torch.utils.data.get_worker_info() is not None:
        raise TargetInWorker(
            f"{target} runs while the DataLoader makes a batch (in a Dataset's __getitem__ or a collate_fn, "
            "in its worker processes): it is not a training step. Name the function that runs one "
            "optimization step, or give no target and the steps are found where the optimizer steps")


def start_profiler(schedule: StepSchedule, index: int, device_type: str, out_dir: Path, worker: str) -> Any:
    """A started torch.profiler over the schedule's wait, warmup and profiled steps, the next step's index
    `index`; it writes its trace (gzipped, named after `worker`) into `out_dir`."""
    import torch

    activities = [torch.profiler.ProfilerActivity.CPU]
    if device_type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    prof = profiler.profile(
        activities=activities,
        schedule=live_schedule(schedule),
        on_trace_ready=torch.profiler.tensorboard_trace_handler(str(out_dir), worker_name=worker, use_gzip=True),
        record_shapes=True,
        profile_memory=True,
    )
    # A loop's profiler starts after its first step: number its spans from there, so that the trace's
    # ProfilerStep#N is step N in either way of running.
    prof.step_num = index
    prof.current_action = prof.schedule(index)
    prof.start()
    return prof


def live_schedule(schedule: StepSchedule) -> Callable[[int], Any]:
    """torch.profiler's schedule (wait, warmup, record once) read from `schedule` at each step, so that the
    steps to record can be cut after the profiler started (`StepDriver._plan_trace`)."""
    from torch.profiler import ProfilerAction

    def action(step: int) -> ProfilerAction:
        if step < schedule.wait:
            return ProfilerAction.NONE
        if step < schedule.wait + schedule.warmup:
            return ProfilerAction.WARMUP
        if step < schedule.total - 1:
            return ProfilerAction.RECORD
        return ProfilerAction.RECORD_AND_SAVE if step == schedule.total - 1 else ProfilerAction.NONE

    return action


PAUSED_S = 0.01  # a wait for the turn longer than this let the loader's workers fill their queue


class StepDriver:
    """Times, profiles, measures and records each step; ends the script once the trial is measured."""

    def __init__(self, config: dict[str, Any], device_type: str, loader_records: list[LoaderRecord],
                 tracker: LoaderTracker | None = None):
        self.out_dir = Path(config["out_dir"])
        self.loop = bool(config.get("loop"))  # no step function: steps end where the optimizer steps
        self.schedule = StepSchedule.from_config(config)
        self.done = False
        self.use_profiler = config.get("profile", True)
        self.device_type = device_type
        self.knobs = Knobs.from_dict(config["knobs"])
        self.interposition = StepInterposition(self.knobs, device_type, loader_records)
        self.loader_records = loader_records
        self.tracker = tracker or LoaderTracker()
        self.index = 0
        self.depth = 0
        self.started = False
        self.failed_step: int | None = None
        self.prof = None
        self.period_start = time.perf_counter()
        self.times: dict[str, float] = {}
        self.user_threads: int | None = None  # torch's intra-op threads as the script left them
        self.applied_at_start: dict[str, str] = {}  # the outcomes of the knobs applied once the steps start
        self.last_loss: Any = None  # the last scalar a backward ran from (the loss, when the step returns none)
        self.memory = StepMemory(device_type)
        self.load_meter: Any = None  # the machine's load beside each window, from the first window on
        # Windows taken in turns with another trial (advisor.trials.record.turns), or None: measured alone.
        self.turns = Turns.from_dict((config.get("measure") or {}).get("turns"))
        self.window_began: float | None = None  # epoch seconds the current window's first step began
        # One set of files per rank in a data-parallel trial (advisor.trials.record.ranks).
        self.files = rank_files(config.get("world_size", 1), config.get("rank", 0))
        self.steps_file = open(self.out_dir / self.files["steps"], "a", buffering=1)
        # The operators of the last unprofiled step before the profiler's warm-up, counted to bound the trace.
        self.op_counter = OpCounter()
        self.count_step: int | None = None
        self.trace_plan: TracePlan | None = None
        # Where not even one light step fits the budget: counts the recorded step's operators and stops the
        # profiler (which writes its trace) at the plan's `ops_recorded`.
        self.cutter: OpCounter | None = None
        # Whether the step is compiled (a knob, or the script's own torch.compile): dynamo would run a step counted
        # under a dispatch mode eagerly and move the compile into the profiler's warm-up.
        self.compiles: Callable[[], bool] = lambda: compiled(self.knobs)
        self.deadline: float | None = config.get("deadline")  # the time limit's end: windows are cut to fit it
        self.fastest_step_s: float | None = None  # of the steps after the first (set-up, a compile)
        self.windows_cut: str | None = None

    # --- a step function ---------------------------------------------------------------------------

    def wrap(self, fn: Any, target: str) -> Any:
        """What `__advisor_wrap__` does to each definition of the target."""
        if isinstance(fn, (staticmethod, classmethod)):
            return type(fn)(self.wrap(fn.__func__, target))
        if not callable(fn):
            return fn

        @functools.wraps(fn)
        def step(*args, **kwargs):
            if self.depth:  # a recursive or nested call is part of the current step
                return fn(*args, **kwargs)
            refuse_inside_loader(self.tracker, target)
            self.depth += 1
            try:
                return self.run_step(fn, args, kwargs)
            except TrialComplete:
                raise
            except BaseException as exc:
                self.failed_step = self.index  # the message says which step failed
                if not isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    self.memory.record_failure(exc)  # while the traceback still holds the step's tensors
                raise
            finally:
                self.depth -= 1

        return step

    def run_step(self, fn: Callable, args: tuple, kwargs: dict) -> Any:
        """One call of the target as one step: the knobs around the call, then `end_step`."""
        if self.done:
            raise TrialComplete()
        if not self.started:
            self.begin()
        entered = time.perf_counter()
        self.memory.step_entered(self.schedule.first_profiled(self.index))
        complete = False
        try:
            with self.interposition.step(args, kwargs):
                result = fn(*args, **kwargs)
            complete = True
        finally:
            self.memory.stop_recording(self.index, complete)  # up to the failure, if the step failed
        loss = loss_value(result)
        batch = leading_dimension(list(args) + list(kwargs.values()))
        self.end_step(entered, batch, "step arguments" if batch is not None else None, loss)
        return result

    # --- both ways ---------------------------------------------------------------------------------

    def begin(self) -> None:
        """Before the first step: a step function's loader exists by now, so the schedule and the profiler
        start; a loop's first step starts here (before the script runs, its set-up included), and they
        start after it. The first step's activations are recorded either way."""
        self.started = True
        self.times["first_step_at"] = time.time()
        self.memory.watch_first_step(started=self.loop)
        if self.loop:
            self.period_start = time.perf_counter()
        else:
            self._schedule_and_profile(next_index=0)

    def _schedule_and_profile(self, next_index: int) -> None:
        """Size the schedule to the workers of the loader that feeds the steps; start the profiler, whose
        first span is step `next_index` (a loop's profiler starts once its first step has ended)."""
        import torch

        fed = self.tracker.last or (self.loader_records[-1] if self.loader_records else None)
        effective = fed.effective if fed is not None else {}
        self.schedule.add_queue(*workers_queue(effective))
        # The schedule as sized now, for the parent's progress display (advisor.trials.record.progress).
        write_json_atomic(self.out_dir / self.files["schedule"], self.schedule.to_dict())
        self.user_threads = torch.get_num_threads()
        self.applied_at_start = {k.name: k.at_steps_start(getattr(self.knobs, k.name), torch)  # over the script's own
                                 for k in STARTING if getattr(self.knobs, k.name)}  # (torch's threads)
        if self.use_profiler:
            self.prof = start_profiler(self.schedule, next_index, self.device_type, self.out_dir,
                                       self.files["worker"])
            # A step that is not profiled, the last before the warm-up: none where the profiler waits no step.
            if self.schedule.wait - 1 >= next_index:
                self.count_step = self.schedule.wait - 1
                if self.count_step == next_index and not self.compiles():
                    self.op_counter.start()

    def end_step(self, entered: float | None, batch: int | None, batch_source: str | None, loss: float | None) -> None:
        """A step ended: time it, attribute its batches, record it, move the schedule on; raise
        `TrialComplete` once the trial is measured. `entered`: when the step function was called (None
        for a loop, whose steps have no call)."""
        import torch

        if self.device_type == "cuda":
            torch.cuda.synchronize()
        ended = time.perf_counter()
        if self.cutter is not None:  # the trace was written within this step (cut): the profiler's time, not the step's
            ended -= self.times.get("trace_cut_s", 0.0)
        wall = ended - self.period_start
        waited, fed, fetched = self.tracker.step_ended()
        call = ended - entered if entered is not None else max(0.0, wall - waited)
        if batch is None and fetched is not None:
            batch, batch_source = fetched, "DataLoader"
        if loss is None and self.last_loss is not None:
            loss = loss_value(self.last_loss)
        self.last_loss = None
        if self.cutter is not None:
            self.cutter.stop()  # the recorded step ended, cut or not
            self.cutter = None
        if self.index == self.count_step:
            self._plan_trace()  # before the profiler moves on: the steps it records are decided now
        if self.loop and self.index == 0:
            self.memory.stop_recording(self.index, complete=True)
            self._schedule_and_profile(next_index=1)  # the spans of a loop's steps are numbered as a function's
        elif self.prof is not None:
            self.prof.step()  # ends span ProfilerStep#index; a trace is exported after the last one
        if self.index == 0:
            self.memory.take_model_dtypes()
        phase = self.schedule.phase(self.index)
        window, load, closed = self.schedule.window, None, False
        if phase == "window":
            if self.window_began is None:
                self.window_began = time.time() - wall
            closed = self.schedule.count_window_step(wall, batch)
            if closed and self.load_meter is not None:
                load = self.load_meter.sample()  # the load beside the window that just closed
        self.record(wall, call, waited, fed, batch, batch_source, loss, phase, window, load)
        if self.index > 0:
            self.fastest_step_s = min(wall, self.fastest_step_s or wall)
        self.index += 1
        if self.index == self.count_step and self.prof is not None and not self.compiles():
            self.op_counter.start()  # from the end of the step before (a loop's, where its profiler started)
        part = self.trace_plan.ops_recorded if self.trace_plan is not None else None
        if part and self.prof is not None and self.schedule.first_profiled(self.index):
            self.cutter = OpCounter(part, self._cut_trace)
            self.cutter.start()
        if self.index == self.schedule.total:
            self.finish()  # the profiler's part is over; measurement (if any) runs without it
            if self.deadline is not None and self.fastest_step_s is not None:
                self.windows_cut = self.schedule.fit_windows(self.fastest_step_s, self.deadline - time.time())
                if self.windows_cut:  # the progress display's time left follows the windows that remain
                    write_json_atomic(self.out_dir / self.files["schedule"], self.schedule.to_dict())
            self.done = not self.schedule.windows
        if phase == "window":
            # Every rank of a job stops at the same step, once all have measured their windows.
            self.done = all_measured(self.schedule.measured())
        if self.load_meter is None and self.schedule.windows and self.schedule.phase(self.index) == "window":
            self.load_meter = self._load_meter()
        if self.turns is not None and (closed or (phase != "window" and self.schedule.phase(self.index) == "window")):
            self._take_turn(window if closed else None)
        self.period_start = time.perf_counter()
        if self.done:
            self.memory.record_end()
            self.finish()
            raise TrialComplete()

    def _plan_trace(self) -> None:
        """The counted step ended: record as many steps as the trace's budget holds (one light step where
        not even one does), and tell the progress display the schedule as it now is."""
        ops = self.op_counter.stop()
        if ops is None or self.prof is None:
            return
        import psutil

        budget = budget_bytes(psutil.virtual_memory().available)
        self.trace_plan = plan_trace(ops, self.index, self.schedule.active, budget)
        if self.trace_plan.steps < self.schedule.active:
            self.schedule.record_fewer(self.trace_plan.steps)
        # Beside the schedule now: a trial the memory watch stops never writes its result.
        write_json_atomic(self.out_dir / self.files["schedule"],
                          {**self.schedule.to_dict(), "trace_plan": self.trace_plan.to_dict()})
        if self.trace_plan.light:  # read when the profiler prepares its warm-up, which has not begun
            from torch._C._profiler import _ExperimentalConfig

            self.prof.record_shapes = self.prof.profile_memory = False
            # The trace alone, without the event list torch keeps beside it for Python: a quarter less at the peak.
            self.prof.experimental_config = _ExperimentalConfig(trace_only=True)

    def _cut_trace(self) -> None:
        """The recorded step reached the plan's operators: stop the profiler, which ends the step's span and
        writes the trace now; the step runs on unrecorded."""
        if self.prof is not None:
            self.times["trace_cut_at"] = time.time()
            began = time.perf_counter()
            self.finish_profiling()  # the rest of the step runs without the trace's memory
            self.times["trace_cut_s"] = time.perf_counter() - began  # left out of the step's time

    def _take_turn(self, closed: int | None) -> None:
        """Windows in turns: pass the turn after window `closed` (None: before the first window), wait for it
        to come back, then settle again before the next window counts; done once the two's windows settle."""
        ended, began = time.time(), time.perf_counter()
        # Their refill would run beside the other's window: stopped before the turn passes (descheduled between the
        # two on a busy machine, they refilled beside its start).
        with self.tracker.workers_stopped() as stopped:
            if closed is not None:
                pass_turn(self.turns, closed, self.window_began or ended, ended, self.schedule.groups[-1])
                self.window_began = None
            done = self.done or settled(self.turns)
            waited = 0.0 if done else wait_for_turn(self.turns, first=closed is None)
            if done or settled(self.turns):  # read again after a wait only: the other's window may have settled it
                self.done = True
                finished(self.turns)
                wait_for_the_other(self.turns)
        if stopped:
            self.times["workers_stopped_s"] = self.times.get("workers_stopped_s", 0.0) + time.perf_counter() - began
        if self.done:
            return
        if waited > PAUSED_S:
            self.schedule.resettle(self.index)
        if self.load_meter is not None:
            self.load_meter.sample()  # the pause is not the next window's load: the other trial ran in it

    def _load_meter(self) -> Any:
        """A meter of the machine's load from now on; None where psutil cannot read it."""
        from advisor.trials.harness.machine_load import LoadMeter

        try:
            import torch

            return LoadMeter(torch.cuda.current_device() if self.device_type == "cuda" else None)
        except Exception:  # the load is a hint for the session: a trial never fails for want of it
            return None

    def record(self, wall: float, call: float, waited: float, fed: LoaderRecord | None, batch: int | None,
               batch_source: str | None, loss: float | None, phase: str, window: int = 0,
               load: dict[str, Any] | None = None) -> None:
        """Append the step's JSON line (flushed, so a killed trial keeps its finished steps)."""
        step = {
            "index": self.index,
            "wall_s": wall,
            "call_s": call,
            "data_s": waited,  # time in the DataLoader's __next__ since the previous step
            "loader": self.loader_records.index(fed) if fed in self.loader_records else None,
            "recorded": phase == "profiled",
            "phase": phase,
            "batch_size": batch,
            "batch_size_source": batch_source if batch is not None else None,
            "loss": loss,
            **self.memory.process_now(),
        }
        if phase == "window":
            step["window"] = window
        if load is not None:
            step["load"] = load  # on the step that closed its window: other processes' share beside it
        step.update(self.memory.allocator_now())
        if compiled(self.knobs):
            step["graphs"] = compiled_graphs()  # a graph first counted in a window step compiled while measured
        self.steps_file.write(dumps(step) + "\n")

    # --- how it ended --------------------------------------------------------------------------------

    def finish(self) -> None:
        """Stop the profiler (the trace is already written by then)."""
        self.times["last_step_at"] = time.time()
        self.finish_profiling()  # the windows run without the trace's memory

    def finish_profiling(self) -> None:
        """Stop the profiler, if it runs (it writes its trace), drop it and give its trace's memory back."""
        if self.prof is not None:
            self.prof.stop()
            self.prof = None
            profiler.give_back_trace_memory()

    def close(self, result: dict[str, Any]) -> dict[str, str]:
        """Stop the profiler and write what the steps measured into a trial result; returns the step
        interposition's knob outcomes (those decided while the steps ran and after them)."""
        self.op_counter.stop()  # a step that failed while counted
        if self.cutter is not None:
            self.cutter.stop()
        self.memory.stop_recording(self.index, complete=False)
        if self.turns is not None:
            finished(self.turns)  # ended, measured or not: the other trial measures without waiting for it
        try:
            self.finish()
        except Exception as exc:  # a profiler that cannot stop must not hide the trial's result
            result["profiler_stop_error"] = f"{type(exc).__name__}: {exc}"
        self.steps_file.close()
        result["memory"] = self.memory.peaks()
        result["schedule"] = self.schedule.to_dict()
        result["trace_plan"] = self.trace_plan.to_dict() if self.trace_plan is not None else None
        result["windows_cut"] = self.windows_cut
        result["user_threads"] = self.user_threads
        result["model_dtypes"] = self.memory.model_dtypes
        result.setdefault("times", {}).update(self.times)
        return {**self.interposition.outcomes, **self.interposition.outcomes_after_steps()}
