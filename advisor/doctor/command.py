"""`advisor doctor [SCRIPT] [--device auto|cpu|cuda] [--json]`: run the checks (`advisor.doctor.checks`) for
the device the advisor would use, and print them (or the advisor.doctor/1 JSON document). With SCRIPT, first
whether this interpreter finds every module the script imports (`advisor.doctor.imports`).

Exit code: 0 when every check the device needs passed (torch, the device, the profiler's trace); a failed
optional check (compile, NVML, pinned memory, data parallelism) is listed with what it costs and leaves
the exit code 0. 1 when a needed check failed (also --device cuda where no CUDA device is available).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterator

from advisor.doctor.checks import CHECKS, FAILED, NEEDED, SKIPPED, Check, Machine, run_check, skipped
from advisor.doctor.imports import imports_check
from advisor.errors import first_line
from advisor.escape import for_terminal
from advisor.trials.record.storage import dumps

SCHEMA = "advisor.doctor/1"
NEEDS_CUDA = "needs a CUDA device, and none is available"


def add_doctor_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of `advisor doctor`."""
    parser.add_argument("script", nargs="?", type=Path,
                        help="also check that this interpreter finds every module the script imports (the trials "
                             "run the script under the interpreter the advisor is installed in)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="the device to check for (default auto: CUDA where a device is visible, else the CPU)")
    parser.add_argument("--json", action="store_true", help="print the versioned JSON document instead")
    parser.epilog = ("Exit code 0 when everything the device needs works (torch, the device, the profiler's "
                     "trace); 1 when one of those failed. A failed optional check (compile, NVML, pinned memory, "
                     "data parallelism) is listed with what it costs and leaves the exit code 0.")


def machine_for(requested: str) -> Machine:
    """The device the advisor would use for `requested`, as a trial resolves it."""
    import torch

    available = torch.cuda.is_available()
    return Machine(requested, "cuda" if requested != "cpu" and available else "cpu")


def run_doctor(requested: str, script: Path | None = None) -> dict[str, Any]:
    """Every check for the device `requested` names (and SCRIPT's imports); the advisor.doctor/1 document."""
    started = time.perf_counter()
    checks: list[Check] = [imports_check(script)] if script is not None else []
    try:
        machine = machine_for(requested)
    except ImportError as exc:  # no torch at all: that is the one finding
        checks.append(Check("torch", FAILED, f"torch cannot be imported: {first_line(exc)}", needed=True,
                            breaks="nothing runs: every trial imports torch",
                            fix="install torch (pip install torch; a CUDA build on a GPU machine)"))
        machine = Machine(requested, "cpu")
    else:
        no_cuda = requested == "cuda" and machine.device == "cpu"
        if no_cuda:  # the device checked is the one asked for; the devices check says there is none
            machine = Machine(requested, "cuda")
        for name, function in CHECKS:
            if no_cuda and name not in ("torch", "cpu", "devices"):
                check = skipped(name, NEEDS_CUDA)
            else:
                check = run_check(name, function, machine)
            check.needed = name in NEEDED and check.status != SKIPPED
            checks.append(check)
    failed_needed = [c.name for c in checks if c.status == FAILED and c.needed]
    return {"schema": SCHEMA, "requested_device": requested, "device": machine.device, "python": sys.executable,
            "ok": not failed_needed, "exit_code": 1 if failed_needed else 0,
            "failed": [c.name for c in checks if c.status == FAILED], "failed_needed": failed_needed,
            "seconds": round(time.perf_counter() - started, 2), "checks": [c.to_dict() for c in checks]}


def print_document(document: dict[str, Any]) -> None:
    """The checks as lines: status, name, what was found; a failure with what it breaks and the fix."""
    device, requested = document["device"], document["requested_device"]
    print(f"advisor doctor: device {device}" + (f" (--device {requested})" if requested != device else "")
          + f", Python {for_terminal(document['python'])}")
    for check in document["checks"]:
        status = check["status"]
        mark = "FAILED" if status == FAILED and check["needed"] else status
        print(f"  {mark:8} {check['name']:14} {for_terminal(check['summary'])}")
        if status == FAILED:
            print(f"  {'':8} {'':14} breaks: {for_terminal(check['breaks'])}")
            print(f"  {'':8} {'':14} fix: {for_terminal(check['fix'])}")
    optional = [name for name in document["failed"] if name not in document["failed_needed"]]
    lacking = [name for name in document["failed_needed"] if name != "script_imports"]
    if lacking:
        verdict = f"the {device} device lacks what the advisor needs: {', '.join(lacking)} failed"
    elif document["failed_needed"]:
        verdict = f"the script's imports are not all found by this Python; the {device} device has what it needs"
    else:
        verdict = f"everything the {device} device needs works"
    if optional:
        verdict += f" ({len(optional)} optional check(s) failed: {', '.join(optional)})"
    print(f"{verdict}; {document['seconds']:.1f} s")


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """This process's stdout (file descriptor 1, where C++ libraries print too) sent to stderr for a while."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def doctor_command(args: argparse.Namespace) -> int:
    """`advisor doctor`: the checks, printed or as JSON; the exit code says whether the device has what it needs."""
    if args.json:
        with stdout_to_stderr():  # whatever a library prints while the checks run keeps out of the JSON
            document = run_doctor(args.device, args.script)
        sys.stdout.write(dumps(document, indent=1) + "\n")
        return document["exit_code"]
    document = run_doctor(args.device, args.script)
    print_document(document)
    return document["exit_code"]
