"""The files each rank of a data-parallel trial writes into the trial folder (`steps.rank{R}.jsonl`,
`harness.rank{R}.json`, its trace `trial_rank{R}.*.pt.trace.json.gz`, a crash's `crash.rank{R}.txt`), read
back and merged into one record; a single-process trial writes the plain names. Torch-free: the runner and
the record read them without torch.
"""

from __future__ import annotations

import os
import re
import sysconfig
from pathlib import Path
from typing import Any, Callable


def rank_files(world_size: int, rank: int) -> dict[str, str]:
    """The names of one rank's files in the trial folder (the plain names for a single process)."""
    if world_size <= 1:
        return {"steps": "steps.jsonl", "result": "harness.json", "worker": "trial", "crash": "crash.txt",
                "schedule": "schedule.json"}
    return {"steps": f"steps.rank{rank}.jsonl", "result": f"harness.rank{rank}.json", "worker": f"trial_rank{rank}",
            "crash": f"crash.rank{rank}.txt", "schedule": f"schedule.rank{rank}.json"}


def native_crash(folder: Path, world_size: int, rank: int) -> str | None:
    """How a rank crashed in native code (a segfault, an abort), from the Python stack its faulthandler
    wrote: the fatal error, the innermost frame of the user's code and, when the crash came from inside a
    library, that frame too, e.g. "Fatal Python error: Segmentation fault in train_step (/w/tiny.py, line 8),
    inside string_at (/usr/lib/python3.11/ctypes/__init__.py, line 519)". None when the rank wrote its
    result or did not crash so."""
    names = rank_files(world_size, rank)
    if (folder / names["result"]).exists():
        return None
    try:
        text = (folder / names["crash"]).read_text(errors="replace")
    except OSError:
        return None
    lines = [line.strip() for line in text.splitlines()]
    if not lines or not lines[0]:
        return None
    # The crashing thread's frames, most recent first: 'File "/w/tiny.py", line 8 in train_step'.
    current = next((i for i, line in enumerate(lines) if line.startswith("Current thread")), len(lines))
    frames = []
    for line in lines[current + 1:]:
        match = _FAULTHANDLER_FRAME.match(line)
        if match is None:
            break
        frames.append(match.groups())
    if not frames:
        return lines[0]
    user = next((f for f in frames if not f[0].startswith(_LIBRARY_PATHS) and f[0] != "<string>"), frames[0])
    where = f"{lines[0]} in {user[2]} ({user[0]}, line {user[1]})"
    if user is not frames[0]:
        where += f", inside {frames[0][2]} ({frames[0][0]}, line {frames[0][1]})"
    return where


_FAULTHANDLER_FRAME = re.compile(r'^File "(.*)", line (\d+) in (.*)$')
# Frames of the standard library, installed packages and the advisor's harness are not the user's code.
_LIBRARY_PATHS = tuple({*(sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")),
                        str(Path(__file__).resolve().parents[1]) + os.sep})


def crash_message(folder: Path, world_size: int) -> str | None:
    """'rank 1 crashed: Fatal Python error: Aborted (in ...)' for the rank that crashed first in native code
    ('the trial process crashed: ...' for a single process); None when none did (`native_crash`)."""
    crashed = []
    for rank in range(world_size):
        crash = native_crash(folder, world_size, rank)
        if crash is not None:  # a peer that lost the rank that crashed may abort too, a moment later
            written = (folder / rank_files(world_size, rank)["crash"]).stat().st_mtime_ns
            crashed.append((written, rank, crash))
    if not crashed:
        return None
    _, rank, crash = min(crashed)
    return f"rank {rank} crashed: {crash}" if world_size > 1 else f"the trial process crashed: {crash}"


def merge_ranks(folder: Path, world_size: int, read_result: Callable[[Path], dict],
                read_steps: Callable[[Path], list]) -> tuple[dict[str, Any], list[dict[str, Any]], list[list]]:
    """The ranks' results merged into one harness result (rank 0's, with the first failure's status and
    message), each rank's result, and each rank's steps."""
    results, steps = [], []
    for rank in range(world_size):
        names = rank_files(world_size, rank)
        results.append(read_result(folder / names["result"]))
        steps.append(read_steps(folder / names["steps"]))
    merged = dict(results[0]) if results and results[0] else {}
    failed = [(rank, r) for rank, r in enumerate(results) if r and r.get("status") not in (None, "ok")]
    crash = crash_message(folder, world_size)
    if crash is not None:
        # A rank that died in native code wrote no result; its peers fail after it (a connection reset).
        merged.update(status="error", message=crash, error_type="NativeCrash", traceback=None)
    elif failed:
        # The rank that failed first is the cause; the others fail after it (a peer that closed).
        rank, result = min(failed, key=lambda item: item[1].get("failed_at") or float("inf"))
        message = result.get("message", "")
        merged.update(status=result["status"], message=f"rank {rank}: {message}" if world_size > 1 else message,
                      error_type=result.get("error_type"), traceback=result.get("traceback"))
    elif any(not r for r in results):
        missing = [rank for rank, r in enumerate(results) if not r]
        merged.update(status="error", message=f"rank(s) {', '.join(map(str, missing))} ended without a result")
    return merged, results, steps
