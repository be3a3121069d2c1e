"""Command line: `advisor analyze | compare | profile | lint | report | doctor`. Heavy modules are imported per command."""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import shlex
import sys
from pathlib import Path

from advisor.errors import AdvisorError
from advisor.escape import for_terminal, output_stream
from advisor.report.compare_command import add_compare_arguments, compare_command


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argument parser with one sub-command per job.

    Only the invoked sub-command's module is imported to describe its arguments, so `advisor analyze`
    does not pay for importing the trial or lint code.
    """
    parser = argparse.ArgumentParser(
        prog="advisor", description=__doc__,
        epilog="The distribution is torch-advisor (pip install torch-advisor; from a checkout pip install -e .). "
               "Install it where your script's dependencies are: its trials run under this Python, "
               f"{sys.executable}.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", required=True)

    analyze = sub.add_parser("analyze", help="diagnose a recorded torch.profiler trace (no torch needed)")
    analyze.add_argument("path", help="a .json/.json.gz trace, a folder of them, or a trial/session folder")
    analyze.add_argument("--json", action="store_true", help="print the versioned JSON document instead")
    analyze.add_argument("--steps", help="which ProfilerStep numbers to use, e.g. 3-5 or 2,4")

    compare = sub.add_parser("compare", help="what changed between two runs, decided against the noise (no torch "
                             "needed)")
    add_compare_arguments(compare)

    profile = sub.add_parser("profile", help="run a training script under the profiler, apply what helps")
    if command in (None, "profile"):  # its defaults come from the search's options (trials, records)
        add_profile_arguments(profile)

    lint = sub.add_parser("lint", help="static check of a training script for memory and speed mistakes")
    if command in (None, "lint"):
        from advisor.code import lint as lint_module

        lint_module.add_lint_arguments(lint)

    report = sub.add_parser("report", help="HTML report (and TensorBoard runs) of a session or trace(s)")
    if command in (None, "report"):
        from advisor import report as report_module

        report_module.add_report_arguments(report)

    doctor = sub.add_parser("doctor", help="what this machine gives the advisor: torch, devices, profiler, compile")
    if command in (None, "doctor"):
        from advisor.doctor.command import add_doctor_arguments

        add_doctor_arguments(doctor)
    return parser


def import_numpy_without_blas_threads() -> None:
    """Import numpy with OpenBLAS told to start no thread pool (unless the user sized it): the analysis does no
    linear algebra, yet OpenBLAS starts a spinning worker per core as it loads (50 ms of CPU). The variable is
    read as the library loads, then taken away again so that nothing this process starts inherits it."""
    if "numpy" not in sys.modules and "OPENBLAS_NUM_THREADS" not in os.environ:
        os.environ["OPENBLAS_NUM_THREADS"] = "1"
        try:
            import numpy  # noqa: F401
        finally:
            del os.environ["OPENBLAS_NUM_THREADS"]


# glibc's mallopt parameters (malloc.h). Setting the mmap threshold also stops glibc raising it as it goes.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8
READER_MMAP_THRESHOLD = 32 * 2**20  # glibc's largest
READER_TRIM_THRESHOLD = 64 * 2**20  # above what the prefetch touches of the heap (`reading.HEAP_BOUND`)


def keep_freed_blocks() -> None:
    """Have glibc's malloc serve blocks of up to 32 MiB from one heap for all threads, and keep up to 64 MiB freed
    at its top, in a process that only reads: the pieces of inflated text and the figures' arrays (hundreds of
    KiB each) would otherwise be mapped alone, or trimmed, as they are freed and their pages faulted in again
    by the next (a quarter of the page faults of reading a 54 MB trace); and the heap the prefetch's thread
    touches ahead of the reader (`reading.touch_heap`) is the reader's. Nothing changes where the C library
    is not glibc."""
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(M_MMAP_THRESHOLD, READER_MMAP_THRESHOLD)
    mallopt(M_TRIM_THRESHOLD, READER_TRIM_THRESHOLD)
    mallopt(M_ARENA_MAX, 1)


def _command_of(argv: list[str]) -> str | None:
    """The sub-command named on the command line (first word that is not an option)."""
    return next((a for a in argv if not a.startswith("-")), None)


READ_ONLY_COMMANDS = ("analyze", "compare")  # run as the program, they end so (`exit_without_teardown`)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `advisor` console script."""
    read_only = argv is None and _command_of(sys.argv[1:]) in READ_ONLY_COMMANDS
    if read_only:
        # A reader that ends as soon as it has printed: the cyclic collector would only rescan, again and again,
        # the modules it imports (numpy, rich) and the events it reads, none of them garbage.
        gc.disable()
    code = run_command(sys.argv[1:] if argv is None else argv)
    if read_only:
        exit_without_teardown(code)
    return code


def exit_without_teardown(code: int) -> None:
    """End the process now, its output flushed, without freeing each of the hundreds of thousands of events it
    read (0.08 s of CPU for a 54 MB trace; the system reclaims it all at once). Only for commands that write
    nothing but their output; where the output cannot be flushed (a closed pipe), Python's exit says so."""
    try:
        sys.stdout.flush(), sys.stderr.flush()
    except (OSError, ValueError):
        return
    os._exit(code)


def run_command(argv: list[str]) -> int:
    """Parse `argv` and run its command; the exit code."""
    parser = build_parser(_command_of(argv))
    args = parser.parse_args(argv)
    try:
        if args.command == "analyze":
            from advisor.analysis.reading import prefetch

            keep_freed_blocks()

            prefetch(args.path, heap=True)  # decompress (and fault the heap in) while the analysis modules import
            import_numpy_without_blas_threads()
            return analyze_command(args)
        if args.command == "compare":
            keep_freed_blocks()
            import_numpy_without_blas_threads()
            return compare_command(args)
        if args.command == "profile":
            return profile_command(args)
        if args.command == "lint":
            from advisor.code import lint as lint_module

            return lint_module.lint_command(args)
        if args.command == "report":
            from advisor import report as report_module

            return report_module.report_command(args)
        if args.command == "doctor":
            from advisor.doctor.command import doctor_command

            return doctor_command(args)
    except AdvisorError as exc:
        if args.debug:
            raise
        print(f"advisor: error: {for_terminal(exc)}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:
        # A file the command was given, or found, that the system refuses (a folder that cannot be searched):
        # one line naming it. An OSError without a file name is a bug, and keeps its traceback.
        if args.debug or exc.filename is None:
            raise
        from advisor.files import describe_os_error

        print(f"advisor: error: {for_terminal(exc.filename)}: {describe_os_error(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("advisor: interrupted", file=sys.stderr)
        return 130
    parser.error(f"unknown command {args.command}")
    return 2


# --- advisor analyze ------------------------------------------------------------------------------

def analyze_command(args: argparse.Namespace) -> int:
    """`advisor analyze PATH [--json] [--steps ...]`: the terminal summary, or the JSON document."""
    from advisor.analysis.analyze import analysis_document, analyze_path, encode_json

    skipped: list = []
    diagnoses = analyze_path(args.path, args.steps, skipped, linter=lint_trial_script, parallel=True)
    if args.json:
        sys.stdout.buffer.write(encode_json(analysis_document(args.path, diagnoses, skipped)) + b"\n")
        return 0
    from advisor.analysis.job import jobs_of_path
    from advisor.report.terminal import print_analysis

    print_analysis(diagnoses, skipped=skipped, jobs=jobs_of_path(args.path, diagnoses))
    return 0


def lint_trial_script(script: Path) -> list[dict] | None:
    """`advisor lint` findings on the script a trial names; the linter is imported only when one does."""
    from advisor.code.lint import script_findings

    return script_findings(script)


# --- advisor profile ------------------------------------------------------------------------------

def add_profile_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of `advisor profile`."""
    parser.add_argument("target", nargs="?",
                        help="script.py (the steps are found where its optimizer steps), or script.py:train_step "
                             "or script.py:Class.method (each call one step)")
    parser.add_argument("--step", metavar="MODULE:NAME",
                        help="the step function, defined in a module the script imports: pkg.module:Class.method "
                             "or path/to/module.py:function")
    parser.add_argument("--steps", type=int, default=5, help="steps recorded by the profiler (default 5)")
    parser.add_argument("--wait", type=int, default=2, help="first steps left out of the trace (default 2)")
    parser.add_argument("--warmup", type=int, default=1, help="profiler warm-up steps (default 1)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="where the step runs: auto (default) is CUDA where a device is visible, else the CPU; "
                             "the knobs for an accelerator (pinned copies, TF32, cuDNN autotuning) apply on cuda only")
    parser.add_argument("--out", help="output folder (default runs/<script>-<timestamp>)")
    parser.add_argument("--no-apply", action="store_true", help="only run the baseline trial and diagnose it")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a trial may take (default 600)")
    parser.add_argument("--nproc-per-node", type=int, default=1,
                        help="data-parallel trials: ranks per node, started by torchrun (default 1: one process)")
    parser.add_argument("--torchrun", default="", metavar="OPTIONS",
                        help="torchrun's own options, passed through, e.g. \"--nnodes 2 --node-rank 0 "
                             "--rdzv-endpoint host:29400\"")
    parser.add_argument("--ray", metavar="ADDRESS", dest="ray_address",
                        help="run each trial as one job on the Ray cluster at ADDRESS (host:port, or auto): "
                             "--nnodes nodes of --nproc-per-node ranks each (needs pip install 'torch-advisor[ray]'; "
                             "from a checkout pip install -e '.[ray]')")
    parser.add_argument("--nnodes", type=int, default=1, help="with --ray: nodes the job spans (default 1)")
    parser.add_argument("--memory-limit", help="cap the trial's memory, e.g. 4G or 800M: device memory on a GPU, "
                        "the process's writable memory on the CPU")
    add_session_arguments(parser)
    parser.set_defaults(script_args=[])
    parser.epilog = "Arguments after -- are passed to the script: advisor profile train.py -- --lr 0.1"
    # argparse cannot take options after the target and still hand the rest after `--` to a
    # positional, so the script's arguments are split off before argparse sees them.
    original = parser.parse_known_args

    def parse_known_args(args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        script_args = []
        if "--" in args:
            split = args.index("--")
            args, script_args = args[:split], args[split + 1 :]
        namespace, extras = original(args, namespace)
        namespace.script_args = script_args
        return namespace, extras

    parser.parse_known_args = parse_known_args


def parse_size(text: str) -> int:
    """`4G`, `800M`, `1.5GiB` or plain bytes -> bytes; one-line error otherwise."""
    units = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
    raw = text.strip().lower().removesuffix("ib").removesuffix("b")
    number, unit = (raw[:-1], raw[-1]) if raw and raw[-1] in units else (raw, "")
    try:
        value = int(float(number) * units[unit])
    except (ValueError, OverflowError):  # "lots", "inf", "nan"
        raise AdvisorError(f"--memory-limit: cannot read {text!r} as a size like 4G or 800M") from None
    if value <= 0:
        raise AdvisorError(f"--memory-limit: must be positive, not {text!r}")
    return value


def add_session_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `advisor profile` that steer the session."""
    from advisor.search.state import SessionOptions

    defaults = SessionOptions()
    parser.add_argument("--max-trials", type=int, default=defaults.max_trials,
                        help=f"trials in all, baseline included (default {defaults.max_trials})")
    parser.add_argument("--time-budget", type=float, default=None, metavar="S",
                        help="the whole session within S seconds, its end included: no trial starts that would "
                             "leave too little time to confirm the best and read the speedup")
    parser.add_argument("--windows", type=int, default=defaults.windows,
                        help=f"steady-state windows measured after the profiled steps (default {defaults.windows}; "
                             "0: decide on the profiled steps)")
    parser.add_argument("--window", type=float, default=defaults.window_s, dest="window_s",
                        help=f"seconds each window lasts at least (default {defaults.window_s:g})")
    parser.add_argument("--replay", metavar="SURFACE_DIR",
                        help="run the session on a recorded response surface (trial folders) instead of a script")
    parser.add_argument("--replay-noise", type=float, default=None, metavar="S",
                        help="with --replay: draw each served trial's steady-state windows around its setting's "
                             "recorded samples/s (the median of its recordings) with relative spread S (0.05: 5%%; "
                             "0: each window the recorded figure), "
                             "as a live machine's noise; without it, recordings are served as they are")
    parser.add_argument("--replay-drift", type=float, default=None, metavar="D",
                        help="with --replay-noise: a load that comes and goes across the session's simulated time "
                             "(spells of about 20 s, each quiet or slowing every step by up to 1+D times: 1.0 is "
                             "up to twice as slow), as other jobs on a shared machine")
    parser.add_argument("--seed", type=int, default=0, help="with --replay-noise: the noise's seed (default 0)")
    parser.add_argument("--keep-effective-batch", action="store_true",
                        help="never change the batch size (the effective batch stays as written)")
    parser.add_argument("--only", action="append", default=[], metavar="KNOBS",
                        help="the search turns only these knobs, e.g. amp,batch_size (repeatable)")
    parser.add_argument("--skip", action="append", default=[], metavar="KNOBS",
                        help="the search never turns these knobs, e.g. compile (repeatable)")
    parser.add_argument("--try", action="append", default=[], dest="tries", metavar="KNOB[=VALUE]",
                        help="run this setting as a trial right after the baseline, decided like any other change: "
                             "uint8_copies, batch_size=128, amp=bf16,channels_last (one trial; repeatable)")
    parser.add_argument("--resume", metavar="DIR", help="continue the session in DIR that was interrupted")


def replayed_from(out: Path) -> tuple[str | None, float | None, int, float | None]:
    """The surface a session folder was replayed from (None if it was not), with its noise, seed and drift."""
    from advisor.search.state import SESSION_FILE

    try:
        state = json.loads((out / SESSION_FILE).read_text())
        noise, drift = state.get("replay_noise"), state.get("replay_drift")
        return (state.get("replay"), None if noise is None else float(noise), int(state.get("replay_seed") or 0),
                None if drift is None else float(drift))
    except (OSError, ValueError, TypeError, AttributeError):
        return None, None, 0, None  # resume_state says what is wrong with the folder


def check_arguments(args: argparse.Namespace) -> None:
    """The numbers of `advisor profile`, checked before anything runs: one line naming the bad one."""
    whole = {"--steps": (args.steps, 1), "--wait": (args.wait, 0), "--warmup": (args.warmup, 0),
             "--max-trials": (args.max_trials, 1), "--windows": (args.windows, 0),
             "--nproc-per-node": (args.nproc_per_node, 1), "--nnodes": (args.nnodes, 1)}
    for flag, (value, least) in whole.items():
        if value < least:
            raise AdvisorError(f"{flag}: must be at least {least}, not {value}")
    seconds = {"--timeout": args.timeout, "--window": args.window_s, "--time-budget": args.time_budget}
    for flag, value in seconds.items():
        if value is not None and not (math.isfinite(value) and value > 0):
            raise AdvisorError(f"{flag}: must be a positive number of seconds, not {value}")
    if args.replay_noise is not None and not (math.isfinite(args.replay_noise) and 0 <= args.replay_noise < 1):
        raise AdvisorError(f"--replay-noise: a relative spread in [0, 1), not {args.replay_noise}")
    if args.nnodes > 1 and not args.ray_address:
        raise AdvisorError("--nnodes: only with --ray ADDRESS (with torchrun, pass its options with --torchrun)")
    if args.ray_address and args.torchrun:
        raise AdvisorError("--ray: the cluster places the ranks; --torchrun's options do not apply")
    if args.ray_address:
        from advisor.trials.launch.ray_job import ray_installed

        ray_installed()  # says how to install it, before anything runs
    if args.replay_noise is not None and not (args.replay or args.resume):
        raise AdvisorError("--replay-noise: only with --replay SURFACE_DIR")
    if args.replay_drift is not None and not (math.isfinite(args.replay_drift) and 0 <= args.replay_drift <= 10):
        raise AdvisorError(f"--replay-drift: a load strength in [0, 10], not {args.replay_drift}")
    if args.replay_drift is not None and args.replay_noise is None and not args.resume:
        raise AdvisorError("--replay-drift: only with --replay-noise S (the drift slows the windows it draws)")


def steering(args: argparse.Namespace) -> dict:
    """--only, --skip and --try as SessionOptions fields, checked (one line naming a bad knob)."""
    from advisor.search.space import check_steering, knob_names

    if args.resume and (args.only or args.skip or args.tries):
        raise AdvisorError("--only, --skip, --try: a resumed session keeps the ones it started with (see its "
                           "session.json); start a new session to change them")
    only = knob_names(args.only, "--only") if args.only else None
    skip = knob_names(args.skip, "--skip")
    check_steering(only, skip, tuple(args.tries))
    return {"only": only, "skip": skip, "tries": tuple(args.tries)}


def profile_command(args: argparse.Namespace) -> int:
    """`advisor profile`: the session (default), or only the baseline and its diagnosis (--no-apply)."""
    # The session's modules are torch-free but not small: imported for this command only.
    from rich.console import Console

    from advisor.report.progress_line import progress_display
    from advisor.report.terminal import print_session
    from advisor.search.session import run_session
    from advisor.search.trial_runner import diagnose_trial
    from advisor.search.state import SessionOptions, document, reference_row
    from advisor.trials.record import load_trial
    from advisor.trials.launch.runner import default_out_dir
    from advisor.trials.harness.targets import parse_target

    check_arguments(args)
    memory_limit = parse_size(args.memory_limit) if args.memory_limit else None
    options = SessionOptions(steps=args.steps, wait=args.wait, warmup=args.warmup, device=args.device,
                             script_args=tuple(args.script_args), timeout_s=args.timeout, step=args.step,
                             memory_limit=memory_limit, max_trials=1 if args.no_apply else args.max_trials,
                             time_budget_s=args.time_budget, keep_effective_batch=args.keep_effective_batch)
    options = dataclasses.replace(options, windows=args.windows, window_s=args.window_s,
                                  nproc_per_node=args.nproc_per_node, torchrun_args=tuple(shlex.split(args.torchrun)),
                                  ray_address=args.ray_address, nnodes=args.nnodes, **steering(args))
    runner, space, extra, replay = None, None, {}, args.replay
    noise, seed, drift = args.replay_noise, args.seed, args.replay_drift
    if args.resume:
        out = Path(args.resume)
        target = ""
        replay, noise, seed, drift = replayed_from(out)
    elif replay:
        out = Path(args.out) if args.out else Path("runs") / f"replay-{Path(replay).name}"
        target = f"{Path(replay).resolve()}:replay"
        extra = {"replay": str(Path(replay).resolve()), "replay_noise": noise, "replay_seed": seed,
                 "replay_drift": drift}
    else:
        if not args.target:
            raise AdvisorError("profile: give script.py (or script.py:train_step, or --replay SURFACE_DIR, or "
                               "--resume DIR)")
        script, _ = parse_target(args.target)
        out = Path(args.out) if args.out else default_out_dir(script)
        target = args.target
    if replay:
        from advisor.search.strategy import surface_space
        from advisor.trials.replay.surface import ReplayRunner, load_surface

        points = load_surface(replay)
        runner, space = ReplayRunner(points, out.resolve(), noise, seed, drift), surface_space(points)
    words = sys.argv[sys.argv.index("profile") + 1:] if "profile" in sys.argv else []
    command = "advisor profile " + " ".join(shlex.quote(a) for a in words) if not args.resume else ""
    # Ctrl-C: run_session marks the session interrupted and says how to resume; the CLI prints the rest.
    # On a terminal each trial shows its phase and the time left while it runs; elsewhere nothing extra.
    console = Console(file=output_stream())
    state = run_session(target, out, options, command=command, resume=bool(args.resume),
                        log=lambda m: print(m, flush=True), runner=runner, script=not replay, space=space,
                        extra=extra, progress=progress_display(console))
    out = Path(state.folder)
    baseline = load_trial(out / state.trials[0].folder)
    if args.no_apply:
        from advisor.report.terminal import print_analysis

        diagnosis = diagnose_trial(baseline)
        if diagnosis is not None:
            print_analysis([diagnosis])
    record, reference = document(state), reference_row(state)  # the report reads the record as session.json holds it
    print_session(record, out, None if reference is None else record["trials"][state.trials.index(reference)], console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
