"""What a session leaves besides its record: notes on a changed batch, `suggested.patch` (the kept
settings written where the script sets them), `report.html` and the TensorBoard runs."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

import msgspec

from advisor.search.record import CoreUse, SessionRecord, SessionTime
from advisor.errors import AdvisorError
from advisor.knobs import KNOBS, batch_size, threads, written_at
from advisor.knobs.knob import FROM_TRIAL
from advisor.search.state import SessionOptions, save
from advisor.search.timing import session_time
from advisor.trials.knobs import Knobs
from advisor.trials.harness.targets import parse_step, parse_target


def out_of_memory_note(record: dict[str, Any]) -> str:
    """Where memory went in a trial that ran out of it, as far as the trial could tell."""
    summary = record.get("summary") or {}
    parts = []
    breakdown = summary.get("memory_breakdown") or {}
    for key in ("parameters", "gradients", "optimizer_state", "activations"):
        value = breakdown.get(key) if isinstance(breakdown, dict) else None
        if isinstance(value, (int, float)) and value:
            parts.append(f"{key.replace('_', ' ')} {value / 2**20:.0f} MiB")
    peak = summary.get("peak_memory_bytes")
    where = f" (peak {peak / 2**20:.0f} MiB: {', '.join(parts)})" if peak and parts else (
        f" (peak {peak / 2**20:.0f} MiB)" if peak else "")
    return (f"The user's settings ran out of memory{where}; the session looked for the closest configuration "
            "that fits: AMP, then activation checkpointing of the repeated blocks (the same batch), then "
            "micro-batches with gradient accumulation (same effective batch), then a smaller batch.")


def repository_root(script: Path) -> Path:
    """The git work tree holding the script (so `git apply` works from its top), else the script's folder."""
    for folder in script.resolve().parents:
        if (folder / ".git").exists():
            return folder
    return script.resolve().parent


def step_function(state: SessionRecord, script: Path) -> tuple[str | None, Path | None]:
    """The function the step runs in and its file, for the patch: the target; or a step in an imported
    module (--step); or, with no target, the function that called backward (a plain function or method;
    None for a loop at module level or in a nested function)."""
    _, func = parse_target(state.target)
    step = (state.options or {}).get("step")
    if step:
        _, file, name = parse_step(step, script)
        return name, file
    if func is not None:
        return func, None
    site = (state.get("sites") or {}).get("backward") or {}
    name, file = site.get("function"), site.get("file")
    if not name or not file or "<" in name or len(name.split(".")) > 2 or not Path(file).is_file():
        return None, None
    return name, Path(file)


def best_plan(out: Path, state: SessionRecord, knob: str, field: str) -> Any:
    """What the best trial recorded for the patch of `knob` (its trial.json `field`: the Dataset conversion
    uint8_copies moved, the attention lines sdpa replaced, the blocks checkpointing wrapped), or None."""
    row = next((t for t in state.trials if t.name == state.best), None)
    if row is None or not (row.knobs or {}).get(knob):
        return None
    try:
        return json.loads((out / row.folder / "trial.json").read_text()).get(field)
    except (OSError, ValueError):
        return None


def recorded_plans(out: Path, state: SessionRecord) -> dict[str, Any]:
    """What the best trial recorded for the patch of each knob written from its trial's record, by the record's
    field (`uint8_plan`, `attention_plan`, `checkpoint_plan`: `write_patch`'s keywords)."""
    return {k.written.record: best_plan(out, state, k.name, k.written.record) for k in written_at(FROM_TRIAL)}


def batch_inputs(out: Path, state: SessionRecord) -> list[int] | None:
    """The positions of the model's inputs the best trial moved in the layout a kept knob gives the batch (the
    record of the knob whose patch writes it where the step moves the batch: `Written.batch_record`), or None."""
    return next((found for k in KNOBS if k.written.batch_record
                 and (found := best_plan(out, state, k.name, k.written.batch_record)) is not None), None)


def wrap_up(out: Path, state: SessionRecord, options: SessionOptions,
            outputs: Callable[[Path, SessionRecord], None] | None = None) -> None:
    """The session done: the batch's notes and the time it took in the record, saved, and the outputs written
    (`finish_outputs`, or `outputs`)."""
    state.notes.extend(batch_size.training_notes(state.user_values or {}, state.final_knobs or {},
                                                  options.keep_effective_batch))
    state.time = msgspec.convert(session_time(out, state), SessionTime | None)
    state.status = "done"
    save(state)
    (outputs or finish_outputs)(out, state)


def finish_outputs(out: Path, state: SessionRecord) -> None:
    """suggested.patch (when a script was tuned and something changed), report.html, TensorBoard runs."""
    final = Knobs.from_dict(state.final_knobs or {})
    from advisor.code.patch import write_patch

    if final.requested() and state.get("replay"):
        state.notes.append("no suggested.patch: the trials were replayed from a recorded surface; "
                           "make the final settings below in the recorded script")
    elif final.requested() and not state.script:
        state.notes.append("no suggested.patch: the step did not come from a script file; "
                           "make the final settings below in your code")
    elif final.requested():
        script = Path(state.script)
        try:
            func, step_file = step_function(state, script)
            written, notes = write_patch(script, func, final, state.user_values, out,
                                         root=repository_root(script),
                                         loader_site=(state.get("training_loader") or {}).get("site"),
                                         step_file=step_file, **recorded_plans(out, state),
                                         channels_last_inputs=batch_inputs(out, state))
            state.notes.extend(notes)
        except AdvisorError as exc:  # the settings stand; only the code change could not be written
            state.notes.append(f"no suggested.patch: {exc}")
            written = None
        state.patch = None if written is None else os.path.relpath(written, out)
        state.patch_root = None if written is None else str(repository_root(script))  # where `patch -p1` runs
    cores = ((state.device or {}).get("cpu") or {}).get("logical_cores")
    ranks = max(1, int((state.options or {}).get("nproc_per_node") or 1))
    state.core_use = msgspec.convert(threads.core_use(cores, ranks, state.final_knobs or {}, state.user_values or {}),
                                     CoreUse | None)
    save(state)  # the report reads session.json: it must already name the patch
    from advisor.report import write_report
    from advisor.report.tensorboard import session_run, write_run
    from advisor.trials.launch.zygote import call_forked

    write_report(out, out / "report.html")
    run = session_run(out)  # here, from the traces' views the HTML report has just made
    # TensorBoard's writer is torch's: written where the trials' zygote has torch imported already, else here.
    if not call_forked("advisor.report.tensorboard", "write_run_json", [json.dumps(run)]):
        write_run(run)
