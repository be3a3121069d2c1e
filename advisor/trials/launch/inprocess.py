"""A trial in the notebook's own process: `train_step(batch)` called once per batch of the user's loader,
driven by the same step driver as a subprocess trial (`advisor.trials.harness.driver`), its record the same
`trial.json`.

DataLoader knobs reach the loader by rebuilding it from the given one with changed arguments
(`plan_loader_arguments` decides which; dataset, sampler, collate_fn and the rest are kept); the step
knobs wrap each call as in a subprocess trial. In-process means a trial cannot be isolated: an
out-of-memory error is caught, recorded as "oom" and its memory released (frames cleared,
`gc.collect()`, the CUDA cache emptied); there is no time limit or memory cap, and `device="cpu"`
cannot hide a GPU from the step. What the steps write to the process's file descriptors 1 and 2 (the
profiler's own messages from C++, `USDT: ... profiler_start`, `CPUAllocator.cpp ... Memory block of unknown
size`, and the DataLoader workers' output) goes into the trial's output.log, as a subprocess trial's does;
a notebook's `print` writes to the notebook's own stream, not to those descriptors, and still shows there.
Torch is imported when used.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import inspect
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterable

from advisor.errors import AdvisorError
from advisor.trials.harness.activations import is_out_of_memory
from advisor.trials.harness.driver import StepDriver, TrialComplete
from advisor.trials.harness.trial_facts import SetupProblem, device_facts, resolve_device
from advisor.trials.harness.entry import user_traceback
from advisor.trials.harness.process_memory import proc_status_bytes, reset_peak_rss
from advisor.knobs import DATALOADER_KNOBS, KNOBS
from advisor.trials.knobs import Knobs, not_applicable
from advisor.trials.interposition.model import ModelInterposition, records_of
from advisor.trials.interposition.loaders import LoaderRecord, dataloader_outcomes, plan_loader_arguments
from advisor.trials.record import (LOG_FILE, RESULT_FILE, SCHEMA as TRIAL_SCHEMA, TRIAL_FILE, TrialResult,
                                   complete_record)
from advisor.trials.record.storage import write_json_atomic


def step_source(train_step: Callable) -> tuple[str, str]:
    """(where, name) of the step: its .py file or "<notebook>", and its qualified name."""
    name = getattr(train_step, "__qualname__", None) or type(train_step).__name__
    code = getattr(inspect.unwrap(train_step), "__code__", None)
    filename = code.co_filename if code is not None else ""
    # IPython compiles cells to names like /tmp/ipykernel_123/456.py that do not exist on disk.
    if filename.endswith(".py") and os.path.isfile(filename) and "ipykernel_" not in filename:
        return os.path.abspath(filename), name
    session_name = os.environ.get("JPY_SESSION_NAME")  # the notebook's path, set by recent Jupyter servers
    return (os.path.basename(session_name) if session_name else "<notebook>"), name


# --- the loader ---------------------------------------------------------------------------------

def loader_user_values(loader) -> dict[str, Any]:
    """The DataLoader values a knob can change, as the given loader has them (plus a custom batch_sampler)."""
    values = {k: getattr(loader, k, None) for k in DATALOADER_KNOBS}
    # With a batch_size the DataLoader made its batch_sampler itself; only a user's own one matters.
    values["batch_sampler"] = loader.batch_sampler if loader.batch_size is None else None
    return values


def rebuild_arguments(loader, effective: dict[str, Any]) -> dict[str, Any]:
    """Every DataLoader argument of `loader` as it was built, with the effective knob values."""
    from torch.utils.data import DataLoader, IterableDataset

    names = [n for n in inspect.signature(DataLoader.__init__).parameters if n not in ("self", "shuffle")]
    args = {n: getattr(loader, n) for n in names if hasattr(loader, n)}
    args.update(effective)
    iterable = isinstance(loader.dataset, IterableDataset)
    if loader.batch_size is not None:  # batches from batch_size + sampler (+ drop_last): rebuild the same way
        args["batch_sampler"] = None
        args["sampler"] = None if iterable else loader.sampler
    elif loader.batch_sampler is not None:  # the user's batch_sampler: DataLoader takes it alone
        args.update(batch_size=1, sampler=None, drop_last=False)
    else:  # no batching
        args.update(batch_size=None, sampler=None if iterable else loader.sampler)
    if not args.get("num_workers"):
        args["multiprocessing_context"] = None  # DataLoader accepts a context only with worker processes
    return args


def apply_loader_knobs(loader: Iterable, knobs: Knobs, *, accelerator: bool,
                       ) -> tuple[Iterable, list[LoaderRecord], dict[str, str]]:
    """The loader to iterate (rebuilt when a DataLoader knob changes it), its record, and knob outcomes."""
    from torch.utils.data import DataLoader

    requested = [k for k in DATALOADER_KNOBS if getattr(knobs, k) is not None]
    if not isinstance(loader, DataLoader):
        return loader, [], {k: not_applicable("the loader is not a torch DataLoader") for k in requested}
    user = loader_user_values(loader)
    effective, outcomes = plan_loader_arguments(user, knobs, accelerator=accelerator)
    own = {k: user[k] for k in DATALOADER_KNOBS}
    if effective != own and type(loader).__init__ is not DataLoader.__init__:
        why = not_applicable(f"{type(loader).__name__} has its own __init__: it cannot be rebuilt")
        effective, outcomes = own, {k: why for k in requested}
    record = LoaderRecord(user=own, effective=effective, outcomes=outcomes)
    if effective == own:
        return loader, [record], dataloader_outcomes(knobs, [record])
    rebuilt = type(loader)(**rebuild_arguments(loader, effective))
    return rebuilt, [record], dataloader_outcomes(knobs, [record])


def release_memory() -> None:
    """Give back what a failed trial held: garbage, and cached CUDA blocks."""
    import torch

    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def shutdown_workers(iterator: Any) -> None:
    # A multi-process iterator stops its workers when collected; persistent workers live on with the
    # loader, so stop them now rather than leave processes behind.
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if callable(shutdown):
        shutdown()


# --- one trial in this process --------------------------------------------------------------------

def _flush_all() -> None:
    """Python's and C's buffered output written out, so that it lands where the descriptors point now."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):  # None, or closed, in some embedding hosts
            pass
    try:
        ctypes.CDLL(None).fflush(None)  # C stdio buffers (printf from native code)
    except (OSError, AttributeError):  # no C library to load by that name: nothing buffered by it to flush
        pass


@contextlib.contextmanager
def output_into(path: Path):
    """File descriptors 1 and 2 appended to `path` for the block, then restored: native code and child
    processes write there, not to the notebook or terminal the process runs in."""
    _flush_all()
    try:
        saved = [os.dup(1), os.dup(2)]
    except OSError:  # a process without descriptor 1 or 2 (a daemon): nothing would show anyway
        yield
        return
    try:
        with open(path, "ab") as log:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            try:
                yield
            finally:
                _flush_all()
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)


def run_trial_in_process(train_step: Callable, loader: Iterable, knobs: Knobs | None, out_dir: Path, *,
                         name: str | None = None, steps: int = 5, wait: int = 2, warmup: int = 1,
                         device: str = "auto", windows: int = 0, window_s: float = 1.0,
                         ) -> tuple[TrialResult, BaseException | None]:
    """Run `train_step(batch)` over the loader as one trial; write trial.json and the trace to `out_dir`.

    Returns the result and, for status "error", the step's exception (the caller decides whether to
    raise it). An out-of-memory error is recorded as "oom" and its memory released; Ctrl-C is recorded
    as "interrupted" and re-raised.
    """
    knobs = knobs or Knobs()
    if steps < 1 or wait < 0 or warmup < 0:
        raise AdvisorError(f"steps must be >= 1 (got steps={steps}, wait={wait}, warmup={warmup})")
    if device not in ("auto", "cpu", "cuda"):
        raise AdvisorError(f"device: expected auto, cpu or cuda, not {device!r}")
    try:
        device_type = resolve_device(device)
    except SetupProblem as exc:
        raise AdvisorError(str(exc).replace("--device", "device=")) from None
    out = Path(out_dir).resolve()
    if (out / TRIAL_FILE).exists():
        raise AdvisorError(f"{out}: already holds a trial; choose another folder")
    out.mkdir(parents=True, exist_ok=True)
    where, func = step_source(train_step)
    started = time.time()
    record: dict[str, Any] = {
        "schema": TRIAL_SCHEMA, "name": name or out.name, "target": func, "script": where, "script_args": [],
        "device": device, "knobs": knobs.to_dict(), "knob_outcomes": {}, "user_values": None, "dataloaders": [],
        "schedule": {"wait": wait, "warmup": warmup, "active": steps, "windows": windows, "window_s": window_s},
        "profiled": True, "memory_limit": None,
        "status": "running", "message": "", "device_facts": None, "steps": [], "summary": None,
        "trace_files": [], "log_file": LOG_FILE, "pid": os.getpid(), "in_process": True,
        "times": {"started_at": started},
    }
    write_json_atomic(out / TRIAL_FILE, record)
    result: dict[str, Any] = {"status": "error", "message": "", "device": device_facts(device_type)}
    config = {"out_dir": str(out), "wait": wait, "warmup": warmup, "active": steps, "knobs": knobs.to_dict(),
              "measure": {"windows": windows, "window_s": window_s}}
    batches, records, loader_outcomes = loader, [], {}
    driver = iterator = batch = failure = None
    interrupted = False
    measured_peak = reset_peak_rss()
    import torch

    threads = torch.get_num_threads()  # the threads knob must not outlive the trial in the notebook
    model = ModelInterposition(knobs, device_type)  # undone after the trial: the model is the notebook's
    with output_into(out / LOG_FILE):  # the profiler's own messages: the trial's log, as in the CLI
        try:
            batches, records, loader_outcomes = apply_loader_knobs(loader, knobs, accelerator=device_type != "cpu")
            model.install()
            driver = StepDriver(config, device_type, records)
            result["steps_expected"] = driver.schedule.total
            step = driver.wrap(train_step, func)
            while True:
                iterator = iter(batches)
                produced = False
                for batch in iterator:
                    produced = True
                    step(batch)
                if not produced:  # an empty loader, or a one-shot iterable that is used up
                    ended = driver.schedule.script_ended(driver.index, "the loader", func)
                    if ended["status"] == "ok":
                        result.update(ended)
                    else:
                        result["script_ended"] = ended["script_ended"]
                        result["message"] = (f"the loader ran out of batches after {driver.index} step(s); the "
                                             f"trial needs {driver.schedule.total} (wait {driver.schedule.wait} + "
                                             f"warmup {warmup} + record {steps})")
                    break
        except TrialComplete:
            result.update(status="ok", message=driver.schedule.completed_message())
        except BaseException as exc:  # the step's error, out of memory, Ctrl-C, or a loader that cannot be built
            at = f" in step {driver.failed_step}" if driver is not None and driver.failed_step is not None else ""
            first = (str(exc).strip().splitlines() or [""])[0]
            interrupted = isinstance(exc, KeyboardInterrupt)
            oom = not interrupted and is_out_of_memory(exc)
            status = "interrupted" if interrupted else "oom" if oom else "error"
            result.update(status=status, message=f"{type(exc).__name__}{at}: {first}" if first else
                          f"{type(exc).__name__}{at}", error_type=type(exc).__name__, traceback=user_traceback(exc))
            if oom:
                traceback.clear_frames(exc.__traceback__)  # the frames hold the tensors that did not fit
            else:
                failure = exc
        finally:
            batch = None
            if driver is not None:
                result["outcomes"] = {**loader_outcomes, **driver.close(result), **model.outcomes_after_steps()}
                result.update(records_of(model))  # what the model's changes record (channels_last's inputs)
            model.undo()
            for knob in KNOBS:  # what this process cannot apply (the notebook built it already)
                if knob.not_in_notebook and getattr(knobs, knob.name):
                    result.setdefault("outcomes", {})[knob.name] = not_applicable(knob.not_in_notebook)
            if batches is not loader or not getattr(loader, "persistent_workers", False):
                shutdown_workers(iterator)  # the user's persistent workers stay with the user's loader
            iterator = batches = None
            peak = proc_status_bytes().get("peak_rss_bytes") if measured_peak else None  # VmHWM since the reset
            if peak is not None and "memory" in result:
                result["memory"]["peak_rss_bytes"] = peak
            result["dataloaders"] = [r.to_dict(training=True) for r in records]
            if driver is not None:
                result.setdefault("outcomes", {}).update(driver.applied_at_start)
            torch.set_num_threads(threads)
            if result["status"] == "oom":
                release_memory()
    write_json_atomic(out / RESULT_FILE, result)
    trial = complete_record(record, out, started)
    if peak is not None and trial.peak_memory_source and "ru_maxrss" in trial.peak_memory_source:
        # The process is the notebook's: its lifetime peak says nothing about this trial.
        done = json.loads((out / TRIAL_FILE).read_text())
        done["summary"]["peak_memory_source"] = "process peak RSS during the trial (VmHWM, reset at its start)"
        write_json_atomic(out / TRIAL_FILE, done)
        trial = TrialResult.from_record(done, out)
    if interrupted:
        raise KeyboardInterrupt
    return trial, failure
