"""One trial in a process of its own: `run_trial` starts `advisor.trials.harness.entry` in a new process group
(forked from the zygote, `advisor.trials.launch.zygote`, where it can be; else a fresh `python -c`)
with the script, the step and the knobs, waits (time limit, Ctrl-C), ends every process of the trial
(DataLoader workers and daemons included), and completes its record (`advisor.trials.record`).

The parent side, torch-free at import. Every process a trial starts carries its token in its
environment (`ADVISOR_TRIAL`), so that one that left the process group is still found and ended.
"""

from __future__ import annotations

import ast
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Sequence

from advisor.errors import AdvisorError
from advisor.trials.launch.commands import HARNESS_ENTRY, needs_torchrun, torchrun_command, torchrun_module
from advisor.trials.record.ranks import crash_message, rank_files
from advisor.trials.knobs import Knobs
from advisor.trials.spec import TrialSpec
from advisor.trials.record.progress import ProgressWatch, TrialProgress
from advisor.trials.record import LOG_FILE, SCHEMA, TRIAL_FILE, TRIAL_MARKER, TRIAL_TOKEN, TrialResult, \
    complete_record
from advisor.trials.record.storage import write_json_atomic
from advisor.trials.harness.targets import TargetNotFound, locate_target, parse_step, parse_target
from advisor.trials.launch.processes import advisor_importable, end_trial_processes, interrupts_held, \
    sigterm_as_interrupt
from advisor.trials.launch.zygote import start_trial as start_forked
from advisor.trials.launch.memory_watch import MemoryWatch


class TrialFailed(AdvisorError):
    """A trial that did not finish: the CLI prints one line (after the user's traceback, if any)."""

    exit_code = 1


# --------------------------------------------------------------------------------------------------
# Running a trial


# A trial whose process (or a rank) crashes in native code runs once more: torch's profiler has rare races
# with the threads of a process group that abort a rank as the profiler stops (malloc's heap checks), and
# a crash the second run does not meet is not the knobs' doing. The record keeps why (`retried_after`).
NATIVE_CRASH_RETRIES = 1


def run_trial(spec: TrialSpec, *, on_start: Callable[[int, str], None] | None = None,
              on_progress: Callable[[TrialProgress], None] | None = None) -> TrialResult:
    """Run `spec.target` (`script.py[:name]`) once in a fresh subprocess with `spec.knobs`; write and return its
    results.

    No target: the script runs unchanged and each optimizer step ends a step (`TrialSpec` says what each of
    its fields asks). `on_start(pid, token)`: called once the trial process runs (the session records both,
    to end a trial its killed predecessor left behind). `on_progress(progress)`: called about every
    PROGRESS_POLL_S while the trial runs with its phase and an estimate of the time left
    (`advisor.trials.record.progress`), and once more, phase "done", when it has ended. A data-parallel
    trial's ranks start under torchrun, each profiled (`advisor.trials.launch.commands`,
    `advisor.trials.record.ranks`); with a Ray address, the job runs on that cluster instead, a node per
    `nnodes` (`advisor.trials.launch.ray_job`).

    A trial that fails (error, oom, timeout, target-not-found) returns a result with that status;
    bad arguments raise AdvisorError; Ctrl-C marks the trial "interrupted" and re-raises
    KeyboardInterrupt once the trial's processes are gone.
    """
    timeout_s, nproc_per_node = spec.timeout_s, spec.nproc_per_node
    knobs = spec.knobs or Knobs()  # None: the user's own settings
    script, func = parse_target(spec.target)
    step_module, defined_in = None, script
    if spec.step is not None:
        if func is not None:
            raise AdvisorError(f"{spec.target}: give the step either after the script (script.py:name) or with --step")
        step_module, defined_in, func = parse_step(spec.step, script)
    _check_arguments(spec)
    out = _make_trial_folder(spec.out_dir)
    started = time.time()
    schedule = {"wait": spec.wait, "warmup": spec.warmup, "active": spec.steps, "windows": spec.windows,
                "window_s": spec.window_s}
    if spec.against and spec.windows:
        schedule["against"] = spec.against
    if spec.turns and spec.windows:
        schedule["turns"] = spec.turns
    record = _new_record(name=spec.name or out.name, target=func, step=spec.step, script=script,
                         script_args=spec.script_args, device=spec.device, knobs=knobs, schedule=schedule,
                         profiled=spec.profile, memory_limit=spec.memory_limit, started=started)
    try:
        _locate_step(script, defined_in, func)
    except TargetNotFound as exc:
        record.update(status="target-not-found", message=f"{defined_in.name}: {exc}")
        return complete_record(record, out, started, nproc_per_node)

    config = _harness_config(record, out, step_module, spec.loader)
    config["deadline"] = started + timeout_s  # windows that would outlast it are cut (StepSchedule.fit_windows)
    child_env = child_environment(spec.env, spec.device, record["token"])
    if spec.ray_address is not None:
        from advisor.trials.launch.ray_job import run_ray_job

        # The ranks run in their node's environment, with what the trial adds to ours (and our thread count).
        shipped = {k: v for k, v in child_env.items() if os.environ.get(k) != v or k == "OMP_NUM_THREADS"}
        return run_ray_job(record, out, config, shipped, started, address=spec.ray_address, nnodes=spec.nnodes,
                           nproc_per_node=nproc_per_node, timeout_s=timeout_s, on_start=on_start)
    # A data-parallel script that calls init_process_group runs as a one-rank job, decided when the call
    # happens (advisor.trials.harness.torchrun_rank.one_rank_on_demand); one that reads torchrun's variables before
    # that call fails on the first read, and runs again under torchrun (one rank).
    torchrun = nproc_per_node > 1
    write_json_atomic(out / TRIAL_FILE, record)
    record["nproc_per_node"] = nproc_per_node
    attempt = 0
    while True:
        config["torchrun"] = torchrun
        start = _trial_starter(spec.python or sys.executable, config, nproc_per_node, spec.torchrun_args, torchrun,
                               child_env, timeout_s)
        code = _run_process(start, out, record, timeout_s=timeout_s, on_start=on_start, started=started,
                            nproc_per_node=nproc_per_node, on_progress=on_progress)
        crash = crash_message(out, nproc_per_node)
        if record["status"] == "running" and not torchrun and needs_torchrun(out, script):
            torchrun = True
            record["single_rank_job"] = True
            attempt += 1
            _set_attempt_aside(out, nproc_per_node, attempt)
            continue
        if crash is None or record["status"] != "running" or attempt >= NATIVE_CRASH_RETRIES:
            break
        record.setdefault("retried_after", []).append(crash)
        attempt += 1
        _set_attempt_aside(out, nproc_per_node, attempt)
    if record["status"] == "running" and not (out / rank_files(nproc_per_node, 0)["result"]).exists():
        record.update(_exit_status(code, out, crash))  # the harness never got to say how the trial went
    return complete_record(record, out, started, nproc_per_node)


def _check_arguments(spec: TrialSpec) -> None:
    """Refuse (AdvisorError) a schedule, a time limit or a device no trial can run with."""
    steps, wait, warmup, windows, window_s = spec.steps, spec.wait, spec.warmup, spec.windows, spec.window_s
    timeout_s, device = spec.timeout_s, spec.device
    if steps < 1 or wait < 0 or warmup < 0:
        raise AdvisorError(f"--steps must be >= 1 (got steps={steps}, wait={wait}, warmup={warmup})")
    if windows < 0 or (windows and not (math.isfinite(window_s) and window_s > 0)):
        raise AdvisorError(f"--windows must be >= 0 and --window > 0 (got {windows} windows of {window_s} s)")
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        raise AdvisorError(f"--timeout must be a positive number of seconds, not {timeout_s}")
    if device not in ("auto", "cpu", "cuda"):
        raise AdvisorError(f"--device: expected auto, cpu or cuda, not {device!r}")


def _make_trial_folder(out_dir: str | os.PathLike) -> Path:
    """The trial's folder, resolved, created and marked as a trial's; AdvisorError if it holds a trial."""
    out = Path(out_dir).resolve()
    if (out / TRIAL_FILE).exists():
        raise AdvisorError(f"{out}: already holds a trial; choose another folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / TRIAL_MARKER).touch()  # this folder is a trial's: --resume may remove it, never a folder without
    except OSError as exc:
        raise AdvisorError(f"{out}: cannot create the trial folder: {exc.strerror}") from None
    return out


def _new_record(*, name: str, target: str | None, step: str | None, script: Path, script_args: Sequence[str],
                device: str, knobs: Knobs, schedule: dict[str, Any], profiled: bool, memory_limit: int | None,
                started: float) -> dict[str, Any]:
    """The record of a trial that is starting: what was asked, status "running", a fresh token."""
    return {
        "schema": SCHEMA,
        "name": name,
        "target": target,
        "step": step,
        "script": str(script),
        "script_args": list(script_args),
        "device": device,
        "knobs": knobs.to_dict(),
        "knob_outcomes": {},
        "user_values": None,
        "dataloaders": [],
        "training_loader": None,
        "accumulation": None,
        "schedule": schedule,
        "profiled": profiled,
        "memory_limit": memory_limit,
        "memory_cap": None,
        "status": "running",
        "message": "",
        "device_facts": None,
        "steps": [],
        "summary": None,
        "trace_files": [],
        "log_file": LOG_FILE,
        "pid": None,
        "token": uuid.uuid4().hex,
        "times": {"started_at": started},
    }


# One parse at a time: the ending starts the two trials of a pair from two threads, and CPython 3.11 keeps the
# depth of the tree it builds in one counter for all threads, so two parses at once can fail with "SystemError: AST
# constructor recursion depth mismatch" (python/cpython#106905; a test in tests/test_zygote.py makes it happen).
_PARSING = threading.Lock()


def _parse(path: Path) -> ast.Module:
    """The file's tree, one parse at a time in this process."""
    source = path.read_text()
    with _PARSING:
        return ast.parse(source, filename=str(path))


def _locate_step(script: Path, defined_in: Path, func: str | None) -> None:
    """Parse the script and the file that defines the step, and find the step there (TargetNotFound when
    it is not); a file that does not parse is an AdvisorError."""
    parsed = script
    try:
        tree = _parse(script)
        if defined_in != script:
            parsed = defined_in
            tree = _parse(defined_in)
        if func is not None:
            locate_target(tree, func)
    except (SyntaxError, ValueError) as exc:
        # A null byte is refused before parsing starts (a ValueError before Python 3.11.4): no file or line.
        where = f"{exc.filename}:{exc.lineno}" if getattr(exc, "lineno", None) and exc.filename else str(parsed)
        raise AdvisorError(f"{where}: cannot parse the script: {getattr(exc, 'msg', exc)}") from None


def _harness_config(record: dict[str, Any], out: Path, step_module: dict[str, Any] | None,
                    loader: dict[str, Any] | None) -> dict[str, Any]:
    """What the harness is told: the trial as its record asks for it, where the step is defined, the
    training loader the DataLoader knobs go to, and the folder to write into."""
    schedule = record["schedule"]
    return {
        "script": record["script"],
        "target": record["target"],
        "step_module": step_module,
        "loader": loader,
        "script_args": record["script_args"],
        "knobs": record["knobs"],
        "out_dir": str(out),
        "wait": schedule["wait"],
        "warmup": schedule["warmup"],
        "active": schedule["active"],
        "device": record["device"],
        "memory_limit": record["memory_limit"],
        "profile": record["profiled"],
        "measure": {"windows": schedule["windows"], "window_s": schedule["window_s"],
                    "against": schedule.get("against"), "turns": schedule.get("turns")},
        "parent": os.getpid(),
        # The folder the command was run from, as `python path/to/script.py` would run in: a relative
        # path the user gives (--data data/) or the script writes (output_dir="out") means the same there.
        "cwd": os.getcwd(),
    }


# Inductor's and AOTAutograd's on-disk caches (torch's folder, shared by a session's trials and later sessions): a
# second compile of one graph in another trial is a cache hit. On by default in torch; a user's own setting stands.
COMPILE_CACHES = {"TORCHINDUCTOR_FX_GRAPH_CACHE": "1", "TORCHINDUCTOR_AUTOGRAD_CACHE": "1"}


def child_environment(env: dict[str, str] | None, device: str, token: str) -> dict[str, str]:
    """The trial process's environment: `env` (or ours), this advisor importable, the trial's token, and
    torch.compile's caches on (COMPILE_CACHES) unless the user set them."""
    child_env = dict(os.environ if env is None else env)
    child_env["PYTHONPATH"] = advisor_importable(child_env)
    child_env["PYTHONUNBUFFERED"] = "1"
    for name, setting in COMPILE_CACHES.items():
        child_env.setdefault(name, setting)
    if device == "cpu":
        child_env["CUDA_VISIBLE_DEVICES"] = ""  # the script's own "cuda if available" picks the CPU
    child_env[TRIAL_TOKEN] = token
    return child_env


def _harness_command(python: str, config: str, nproc_per_node: int, torchrun_args: Sequence[str],
                     torchrun: bool) -> list[str]:
    """The harness in one process, or under torchrun with a rank per process of a data-parallel trial."""
    if not torchrun:
        return [python, "-c", HARNESS_ENTRY, config]
    return torchrun_command(python, nproc_per_node, list(torchrun_args), config)


def _trial_starter(python: str, config: dict[str, Any], nproc_per_node: int, torchrun_args: Sequence[str],
                   torchrun: bool, env: dict[str, str], timeout_s: float) -> Callable[[Path], Any]:
    """How the trial's process starts, given its log: forked from the zygote where it can be (the harness, or
    torchrun that starts the ranks: `advisor.trials.launch.zygote`), else a fresh process in a new process
    group."""
    cwd = config["cwd"]

    def start(log_path: Path) -> Any:
        if torchrun:
            module = torchrun_module(nproc_per_node, list(torchrun_args), json.dumps(config))
            forked = start_forked(python, None, cwd, env, str(log_path), timeout_s, module=module)
        else:
            forked = start_forked(python, config, cwd, env, str(log_path), timeout_s)
        if forked is not None:
            return forked
        command = _harness_command(python, json.dumps(config), nproc_per_node, torchrun_args, torchrun)
        with open(log_path, "wb") as log:
            return subprocess.Popen(command, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    env=env, start_new_session=True)  # one killpg ends it and its workers

    return start


def _run_process(start: Callable[[Path], Any], out: Path, record: dict[str, Any], *, timeout_s: float,
                 on_start: Callable[[int, str], None] | None, started: float, nproc_per_node: int,
                 on_progress: Callable[[TrialProgress], None] | None = None) -> int:
    """Start the trial's process (its pid into the record), wait for it up to its time limit (then status
    "timeout"), end every process of the trial, and return its exit code. Ctrl-C (or SIGTERM) ends them,
    completes the record as "interrupted" and re-raises KeyboardInterrupt."""
    proc = None
    previous_sigterm = sigterm_as_interrupt()
    try:
        proc = start(out / LOG_FILE)
        record["pid"] = proc.pid
        write_json_atomic(out / TRIAL_FILE, record)
        if on_start is not None:
            on_start(proc.pid, record["token"])
        watch = MemoryWatch(proc.pid)
        try:
            _wait(proc, timeout_s, on_progress and _progress_watch(out, record, nproc_per_node), on_progress, watch)
        except subprocess.TimeoutExpired:
            end_trial_processes(proc.pid, record["token"])
            proc.wait()
            record.update(status="timeout", message=f"the trial exceeded its time limit of {timeout_s:g} s")
        except MemoryExceeded as exc:
            end_trial_processes(proc.pid, record["token"])
            proc.wait()
            record.update(status="oom", message=str(exc) + _trace_estimate(out, record, nproc_per_node),
                          error_type="MemoryWatch")
        record["watched_peak_bytes"] = watch.peak  # the trial's processes' resident memory, at its highest
    except KeyboardInterrupt:
        with interrupts_held():  # a second Ctrl-C must not leave the record at "running"
            if proc is not None:
                end_trial_processes(proc.pid, record["token"])
                proc.wait()
            record.update(status="interrupted", message="interrupted (Ctrl-C); the trial's processes were stopped")
            complete_record(record, out, started, nproc_per_node)
        raise
    finally:
        if previous_sigterm is not None:
            signal.signal(signal.SIGTERM, previous_sigterm)
        if proc is not None:
            # Workers the harness could not reach, a script that double-forked out of the group.
            end_trial_processes(proc.pid, record["token"])
    return proc.returncode


PROGRESS_POLL_S = 0.25  # how often a running trial's progress and memory are read


class MemoryExceeded(Exception):
    """The trial's processes held more memory than the watch allows (`memory_watch`)."""


def _trace_estimate(out: Path, record: dict[str, Any], nproc_per_node: int) -> str:
    """What the trial estimated its trace at, from its schedule file (kept in the record), as a clause."""
    try:
        plan = json.loads((out / rank_files(nproc_per_node, 0)["schedule"]).read_text()).get("trace_plan")
    except (OSError, ValueError, AttributeError):
        return ""
    if not isinstance(plan, dict) or not isinstance(plan.get("estimated_bytes"), int):
        return ""
    record["trace_plan"] = plan
    return (f"; its trace was estimated at {plan['estimated_bytes'] / 2**30:.1f} GiB "
            f"({plan.get('ops_per_step')} operators a step)")


def _progress_watch(out: Path, record: dict[str, Any], nproc_per_node: int) -> ProgressWatch:
    """A watch on the trial's first rank's steps and schedule files."""
    names = rank_files(nproc_per_node, 0)
    return ProgressWatch(record["name"], out / names["steps"], out / names["schedule"], record["schedule"])


def _wait(proc: Any, timeout_s: float, watch: ProgressWatch | None,
          on_progress: Callable[[TrialProgress], None] | None, memory: MemoryWatch | None = None) -> None:
    """Wait for the trial's process up to its time limit (subprocess.TimeoutExpired past it) and while its
    memory stays within the watch's (MemoryExceeded past it), telling `on_progress` where the trial is as it
    goes, and "done" once it has ended however it ended."""
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            if watch is not None and on_progress is not None:
                on_progress(watch.poll())
            stop = memory.exceeded() if memory is not None else None
            if stop is not None:
                raise MemoryExceeded(stop)
            try:
                proc.wait(timeout=max(0.0, min(PROGRESS_POLL_S, deadline - time.monotonic())))
                return
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    raise
    finally:
        if watch is not None and on_progress is not None:
            on_progress(watch.poll(finished=True))


def _set_attempt_aside(out: Path, world_size: int, attempt: int) -> None:
    """Clear the trial folder for another run after a native crash: the crashed run's log is kept beside
    (output.attempt1.log), its traces and per-rank files go, so that the trial holds one run's figures."""
    (out / LOG_FILE).replace(out / f"output.attempt{attempt}.log")
    for trace in out.glob("*.pt.trace.json*"):
        trace.unlink()
    for rank in range(world_size):
        for name in ("result", "steps", "crash", "schedule"):
            (out / rank_files(world_size, rank)[name]).unlink(missing_ok=True)


def _exit_status(code: int, out: Path, crash: str | None) -> dict[str, str]:
    """Status and message of a trial process that ended without writing its result (`crash`: how it
    crashed in native code, from `crash_message`)."""
    if crash is not None:
        return {"status": "error", "message": f"{crash}; see {out / LOG_FILE}", "error_type": "NativeCrash"}
    if code == -signal.SIGKILL:
        # Nobody here sent it: on Linux that is almost always the kernel's out-of-memory killer.
        return {"status": "oom", "message": "the trial process was killed (SIGKILL), most likely by the "
                                            f"kernel's out-of-memory killer; see {out / LOG_FILE}"}
    why = f"killed by signal {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
    return {"status": "error", "message": f"the trial process {why}; see {out / LOG_FILE}"}


def default_out_dir(script: Path) -> Path:
    """`runs/<script-stem>-<timestamp>` in the current folder."""
    return Path("runs") / f"{script.stem}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


