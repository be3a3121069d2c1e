"""What runs inside a trial's subprocess: the user's script as `__main__`, its steps timed, profiled, measured.

The parent (`advisor.trials.launch.runner`) starts `python -c HARNESS_ENTRY CONFIG_JSON` (`main` here, from
`advisor.trials.launch.commands`) in a new process group. Here we:

1. cap memory if asked (`memory_limit`, `advisor.trials.harness.trial_facts.cap_memory`): device memory on a CUDA
   device, the process's writable memory (RLIMIT_DATA) on the CPU;
2. interpose on DataLoaders (`advisor.trials.interposition.loaders`): the knobs where the training loader is built, the
   user's own values recorded, every batch timed and attributed to its loader; where transformers'
   `TrainingArguments` feed the loader, its DataLoader knobs are set there (`advisor.trials.interposition.frameworks`);
3. find the steps, one of three ways:
   - a step function in the script (`script.py:train_step` or `Class.method`): the script is compiled
     with `name = __advisor_wrap__(name, 'target')` inserted right after every definition of it (an AST
     rewrite, as pytest does for asserts; line numbers are the user's own); each outermost call is one
     step, run under the step knobs (autocast, GradScaler, gradient accumulation, non_blocking);
   - a step function in a module the script imports (`--step pkg.module:Class.method` or
     `--step path/to/module.py:Class.method`): the same rewrite, applied when that module is imported;
   - no target: the script runs unchanged and each optimizer step ends a step (`advisor.trials.interposition.loop`);
4. run the script as `__main__` in the folder the command was run from (as `python path/to/script.py`
   would: its own folder first on `sys.path`); the step driver (`advisor.trials.harness.driver`) times each step
   (synchronizing an accelerator), profiles a few, measures the steady state in windows after them,
   and raises `TrialComplete` (a BaseException, so `except Exception` in the user's loop does not
   swallow it) once the trial is measured; DataLoader workers are stopped and the process exits.

Results go to files in the trial folder so that nothing is lost if the process is killed: one JSON line
per step in `steps.jsonl` as it ends, and `harness.json` at the end. The parent merges both into
`trial.json`. Torch is imported only inside functions: `locate_target` is also used by the parent.
"""

from __future__ import annotations

import builtins
import faulthandler
import gc
import importlib.machinery
import importlib.util
import json
import os
import signal
import sys
import time
import traceback
import types
from pathlib import Path
from typing import Any

from advisor.trials.harness.activations import is_out_of_memory
from advisor.trials.harness.driver import StepDriver, TargetInWorker, TrialComplete
from advisor.trials.harness.own_processes import OwnProcesses, started_text
from advisor.trials.interposition.frameworks import TrainerSettings
from advisor.trials.harness.trial_facts import SetupProblem, cap_memory, device_facts, resolve_device
from advisor.knobs import compiled
from advisor.trials.knobs import Knobs
from advisor.trials.interposition.loaders import LoaderRecord, LoaderTracker, data_changes, dataloader_outcomes, \
    install_dataloader_knobs, training_loader
from advisor.trials.interposition.loop import LoopInterposition, capture_losses, mark_closures
from advisor.trials.interposition.step import step_records
from advisor.trials.interposition.model import ModelInterposition, records_of
from advisor.trials.interposition.own_settings import OwnSettings
from advisor.trials.interposition.optimizers import optimizer_changes
from advisor.trials.harness.torchrun_rank import one_rank_on_demand, rank_of
from advisor.trials.interposition.ddp_arguments import DDPKnobs
from advisor.trials.record.ranks import rank_files
from advisor.trials.record.storage import write_json_atomic
from advisor.trials.harness.targets import TargetNotFound, rewrite_script

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the advisor package: our frames


# --------------------------------------------------------------------------------------------------
# Errors


def user_traceback(exc: BaseException) -> str:
    """The traceback as the user would see it running their script: our frames left out."""
    te = traceback.TracebackException.from_exception(exc)
    pending, seen = [te], set()
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        frames = [f for f in current.stack if not os.path.abspath(f.filename).startswith(_HERE + os.sep)]
        frames = [f for f in frames if not f.filename.startswith("<string>")]
        current.stack = traceback.StackSummary.from_list(frames)
        pending += [c for c in (current.__cause__, current.__context__) if c is not None]
    return "".join(te.format())


# --------------------------------------------------------------------------------------------------
# Entry point


def stop_children() -> None:
    """End every process this one started (DataLoader workers): terminate, then kill."""
    import psutil

    children = psutil.Process().children(recursive=True)
    for child in children:
        try:
            child.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(children, timeout=2)
    for child in alive:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass


class StepModuleLoader(importlib.machinery.SourceFileLoader):
    """Loads the module that defines the step with the step wrapped, as the script's own is rewritten."""

    def __init__(self, fullname: str, path: str, target: str):
        super().__init__(fullname, path)
        self.target = target

    def get_code(self, fullname: str) -> types.CodeType:
        """Always from the source (a cached .pyc would skip the rewrite)."""
        return rewrite_script(self.get_source(fullname), self.path, self.target)


class StepModuleFinder:
    """A meta-path finder that hands the module named (or at the file named) to `StepModuleLoader`."""

    def __init__(self, module: str | None, file: str | None, target: str):
        self.module, self.file, self.target = module, file and os.path.realpath(file), target

    def find_spec(self, fullname: str, path: Any = None, target: Any = None):
        """A spec with the rewriting loader for the step's module; None for every other module."""
        if self.module is not None and fullname != self.module:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            return None
        if self.file is not None and os.path.realpath(spec.origin) != self.file:
            return None
        spec.loader = StepModuleLoader(fullname, spec.origin, self.target)
        return spec


def run(config: dict[str, Any]) -> dict[str, Any]:
    """Run the user's script under the config; return the harness result (written by `main`)."""
    script = os.path.abspath(config["script"])
    target = config.get("target")  # None: a loop, whose steps end where its optimizer steps
    config = dict(config, loop=not target)
    step_module = config.get("step_module")  # where the target is defined, when not in the script
    result: dict[str, Any] = {"status": "error", "message": "", "steps_expected": None, "python": sys.executable}
    driver = loop = model = changes = trainer = own = None
    optimizers: list[Any] = []
    loader_records: list[LoaderRecord] = []
    knobs = Knobs.from_dict(config["knobs"])
    started = time.time()
    try:
        device_type = resolve_device(config["device"])
        result["device"] = device_facts(device_type)
        if config.get("memory_limit"):
            result["memory_cap"] = cap_memory(int(config["memory_limit"]), device_type)
        trainer = TrainerSettings(knobs, accelerator=device_type != "cpu")
        trainer.install()
        changes = data_changes(knobs, device_type)  # of the training Dataset and the step's copies
        install_dataloader_knobs(knobs, accelerator=device_type != "cpu", records=loader_records,
                                 training=config.get("loader"), taken=trainer.taken, changes=changes)
        tracker = LoaderTracker(changes=changes)
        tracker.install()
        processes = OwnProcesses()
        processes.install()
        ddp = DDPKnobs(knobs)
        ddp.install()
        if not config.get("torchrun"):
            one_rank_on_demand(result)
        own = OwnSettings(knobs)  # its hook first: it reads the model before the knobs change it
        own.install()
        model = ModelInterposition(knobs, device_type)
        model.install()
        optimizers = optimizer_changes(knobs)
        for optimizer in optimizers:
            optimizer.install()
        if changes:
            import torch

            for change in changes.values():
                change.install(torch)  # the step's copies, for the rest of the trial's process
        driver = StepDriver(config, device_type, loader_records, tracker)
        driver.compiles = lambda: compiled(knobs) or own.compiles_itself()  # no operator count then
        result["steps_expected"] = driver.schedule.total
        sites: dict[str, Any] = {}
        result["sites"] = sites
        capture_losses(lambda loss: (setattr(driver, "last_loss", loss), own.backward_ran()), sites)
        mark_closures()
        source = Path(script).read_text()
        if target and not step_module:
            code = rewrite_script(source, script, target)
        else:
            code = compile(source, script, "exec", dont_inherit=True)
        if target and step_module:
            sys.meta_path.insert(0, StepModuleFinder(step_module.get("module"), step_module.get("file"), target))
        if not target:
            loop = LoopInterposition(knobs, device_type, step_ended=lambda: driver.end_step(None, None, None, None))
            loop.install()
        builtins.__advisor_wrap__ = driver.wrap  # type: ignore[attr-defined]  # what a rewritten module calls
        module = types.ModuleType("__main__")
        module.__dict__.update(
            __file__=script, __builtins__=builtins, __spec__=None, __loader__=None, __package__=None
        )
        sys.modules["__main__"] = module
        sys.argv = [script, *config.get("script_args", [])]
        sys.path[0] = os.path.dirname(script)
        cwd = config.get("cwd")  # a Ray node may not have the folder the command was run from
        os.chdir(cwd if cwd and os.path.isdir(cwd) else os.path.dirname(script))
        result["times"] = {"setup_s": time.time() - started}
        if loop is not None:
            driver.begin()
        try:
            exec(code, module.__dict__)
        except SystemExit as exc:
            if exc.code not in (None, 0):
                raise
        driver.finish()
        result.update(driver.schedule.script_ended(driver.index, os.path.basename(script), target,
                                                   started_text(processes.targets)))
    except TrialComplete:
        result.update(status="ok", message=driver.schedule.completed_message())
    except TargetNotFound as exc:
        result.update(status="target-not-found", message=str(exc))
    except SetupProblem as exc:
        result.update(status="error", message=str(exc))
    except BaseException as exc:  # the user's error, an OOM, or SIGINT inside the child
        result.update(failure(exc, driver, os.path.basename(script)))
        if model is not None:
            model.failed(exc)  # a compile error raised in a step (compiling the backward) is the compile's outcome
    finally:
        if driver is not None:
            step_outcomes = driver.close(result)
            if loop is not None:
                step_outcomes = loop.outcomes
            step_outcomes = {**step_outcomes, **driver.applied_at_start}
            result["outcomes"] = {**dataloader_outcomes(knobs, loader_records, changes), **step_outcomes,
                                  **ddp.outcomes(), **model_outcomes(model, optimizers),
                                  **(trainer.outcomes if trainer else {})}
            result["framework"] = trainer.record() if trainer is not None else None
            for change in (changes or {}).values():
                result.update(change.record())  # the 8-bit images' plan
            result["user_ddp"] = ddp.user
            result["user_model"] = model_user_values(model, optimizers)
            result.update(records_of(model))  # what the model's changes record: the compile's graphs, ...
            result["optimizers"] = next(filter(None, (o.record() for o in optimizers)), None)
            result["own_settings"] = own.record(result["optimizers"]) if own is not None else None
            trains = training_loader(loader_records)
            result["dataloaders"] = [r.to_dict(training=r is trains) for r in loader_records]
            result["training_loader"] = None if trains is None else {
                "site": trains.site, "ordinal": trains.ordinal, "index": loader_records.index(trains),
                "batch_sampler": trains.batch_sampler}
            result.update(step_records(driver.interposition if loop is None else None))  # accumulation's cycles
            result["memory_breakdown"] = driver.memory.breakdown()
            result["activations"] = driver.memory.activations
    result.setdefault("times", {})["harness_s"] = time.time() - started
    return result


def model_outcomes(model: ModelInterposition | None, optimizers: list[Any]) -> dict[str, str]:
    """The outcomes of the model's knobs (`ModelChange`s, torch settings) and the optimizers' (`Knob.on_optimizer`)."""
    out = model.outcomes_after_steps() if model is not None else {}
    return {**out, **{k: v for o in optimizers for k, v in o.outcomes().items()}}


def model_user_values(model: ModelInterposition | None, optimizers: list[Any]) -> dict[str, Any]:
    """The script's own values of the model's and the optimizers' knobs the trial changed (the patch's "from X to
    Y")."""
    values = model.user_values() if model is not None else {}
    return {**values, **{k: v for o in optimizers for k, v in o.user_values().items()}}


def failure(exc: BaseException, driver: StepDriver | None, script: str) -> dict[str, Any]:
    """Status, message, error type and the user's traceback of a trial that raised."""
    step = f" in step {driver.failed_step}" if driver is not None and driver.failed_step is not None else ""
    try:
        oom = is_out_of_memory(exc)
    except Exception:
        oom = isinstance(exc, MemoryError)
    if oom and driver is not None and driver.memory.at_failure is None:
        driver.memory.record_failure(exc)  # out of memory outside a step (e.g. loading data)
    status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "oom" if oom else "error"
    if isinstance(exc, SystemExit):
        text = f"{script} exited with code {exc.code}"
    elif isinstance(exc, TargetInWorker) or "TargetInWorker" in str(exc):
        # Raised in a DataLoader worker, it reaches us wrapped in the loader's own RuntimeError.
        found = [line.split(": ", 1)[1] for line in str(exc).splitlines() if "TargetInWorker: " in line]
        return {"status": "error", "message": found[0] if found else str(exc), "error_type": "TargetInWorker"}
    else:
        first = (str(exc).strip().splitlines() or [""])[0]
        text = f"{type(exc).__name__}{step}: {first}" if first else f"{type(exc).__name__}{step}"
        if isinstance(exc, ImportError):  # the script's dependency is not where the advisor is
            text += (f" (the trial ran under {sys.executable}: install the advisor in the environment that has "
                     f"the script's dependencies; `advisor doctor {script}` checks its imports)")
    return {"status": status, "message": text, "error_type": type(exc).__name__, "traceback": user_traceback(exc),
            "failed_at": time.time()}  # in a data-parallel trial, the rank that failed first is the cause


def die_with_parent(parent: int | None) -> None:
    """On Linux, ask the kernel to end this trial (SIGKILL) when the advisor that started it dies: a killed
    session must not leave a trial running unsupervised (its workers follow: they watch their parent)."""
    if not parent:
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux
        return
    if os.getppid() != parent:  # it died before the request took effect
        os._exit(1)


def import_torch_and_freeze() -> None:
    """Import torch and dynamo, then move what the imports made to the collector's permanent generation, as
    every trial process has it, forked from a zygote (`advisor.trials.launch.zygote`) or not."""
    try:
        import torch  # noqa: F401
    except Exception:  # the trial says what is wrong with torch where it imports it for the steps
        return
    try:  # torch.optim's optimizers import dynamo in their constructor: about 1 s of nearly every trial
        import torch._dynamo  # noqa: F401
    except ImportError:
        pass
    # What the imports made (some 320,000 objects): each trial's scans of live objects (its modules and
    # optimizers, 80 ms each) and full collections (190 ms) skip it. A fresh trial without it ran the conv
    # example's bf16 steps 8-12% slower than a forked one, and two trials in turns (one of them forked, the
    # other fresh) read a speedup off by as much, by which of the two was forked.
    gc.freeze()


def main(argv: list[str]) -> int:
    """`harness CONFIG_JSON`: run one trial (or one rank of it, under torchrun) and write its result file
    (`harness.json`, or `harness.rank{R}.json`) into the trial folder."""
    config = json.loads(argv[0])
    rank, world_size = rank_of()
    config.update(rank=rank, world_size=world_size)
    if not config.get("torchrun"):  # under torchrun the parent is torchrun's agent, which ends its ranks itself
        die_with_parent(config.get("parent"))
    out_dir = Path(config["out_dir"])
    # A crash in native code (a segfault, an abort in torch) writes no result: the Python stack at the
    # crash goes to this rank's crash file instead, so that the trial can say where it died.
    crash_file = open(out_dir / rank_files(world_size, rank)["crash"], "w")
    faulthandler.enable(file=crash_file, all_threads=True)
    if not gc.get_freeze_count():  # a fresh process: as a forked trial starts
        import_torch_and_freeze()
    result = run(config)
    # Workers are ended directly: letting the collector shut down a loader whose worker failed waits 5 s for
    # each worker to join. No collection from here on, then: one can come at any allocation (10 s of a
    # failed two-worker trial under load), and the process ends without one.
    gc.disable()
    result.update(rank=rank, world_size=world_size)
    write_json_atomic(out_dir / rank_files(world_size, rank)["result"], result)
    stop_children()
    sys.stdout.flush()
    sys.stderr.flush()
    # The user's non-daemon threads or atexit hooks must not keep a finished trial alive.
    os._exit(0)


if __name__ == "__main__":  # each rank of a data-parallel trial, started by torchrun
    main(sys.argv[1:])
