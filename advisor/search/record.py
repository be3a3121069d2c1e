"""The session record's shape, typed: session.json ("advisor.session/1") and each of its trial rows as msgspec
`Struct`s, every key the search writes declared once with its type. A key that is not declared is an error.

The search still holds the record as a dict (the form it is written in, key order and all, so a session
written by an earlier release resumes and reports unchanged). These types are checked where the record
crosses the disk: every `save` (a misspelt or mistyped key the search writes is named there, not found in the
report weeks later: an error under the test suite, ADVISOR_STRICT_RECORD=1, a one-line warning on stderr for a
user, whose session goes on) and every `--resume` (a session.json that is not one of ours gets one line naming
the field). tests/test_session_record.py checks that what the search reads of the record is declared here.

`UNSET`: a key an earlier release did not write, or that is written only once it is known (absent, not null).
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

SCHEMA = "advisor.session/1"


class Record(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A part of the record: unknown keys refused."""


class BestBound(Record):
    """What binds the best trial's step (`advisor.search.bounds`; name None where the figures cannot say)."""

    name: str | None
    label: str
    evidence: list[str]


class RunningTrial(Record):
    """The trial in flight: a killed session's --resume ends it by its process and token."""

    name: str
    pid: int
    token: str


class OwnSetting(Record):
    """A setting the script makes itself (its autocast, a fused optimizer, a compiled model), read in the
    baseline's run."""

    value: Any
    what: str
    site: str | None = None


class CoreUse(Record):
    """How the best settings use the machine's cores."""

    cores: int | None = None
    ranks: int | None = None
    workers: int | None = None
    threads: int | None = None
    all_used: bool | None = None


class SessionTime(Record):
    """Where the session's wall time went (`advisor.search.timing`); the parts add to `wall_s`."""

    wall_s: float
    startup_s: float
    warmup_s: float
    measurement_s: float
    reruns_s: float
    other_s: float
    to_best_s: float | None = None
    trials_to_best: int | None = None
    simulated: bool = False


class PredictionError(Record):
    """How far the predictions were from what was measured, over the trials that had one."""

    trials: int
    median_abs: float | None = None
    sign_agreement: float | None = None


class TrialRow(Record, kw_only=True):
    """One row of `trials`: a trial as the search decided on it."""

    index: int
    name: str
    folder: str
    change: str
    knobs: dict[str, Any]
    status: str
    decision: str | None
    """baseline, kept, reverted, failed, not applicable or measured; null until the trial is decided."""
    reason: str
    recommendation: str | None
    message: str
    batch_size: int | None
    median_step_s: float | None
    samples_per_s: float | None
    """Samples/s (steps/s where that is the session's unit)."""
    interval: list[float] | None | UnsetType = UNSET
    """The samples/s interval, [low, high], about 95 %."""
    measured: str | None | UnsetType = UNSET
    """What it was measured on: windows, blocks or steps."""
    peak_memory_bytes: float | None
    """Bytes: an int, or a float where a device reported one."""
    peak_memory_source: str | None
    capacity_bytes: float | None
    peak_capped_bytes: float | None | UnsetType = UNSET
    checkpoint_blocks: dict[str, Any] | None | UnsetType = UNSET
    """What checkpointing would wrap, and its bytes."""
    loss: float | None
    speedup: float | None
    gain: float | None
    moves: dict[str, Any] | None | UnsetType = UNSET
    """Knob → value the change made on its base."""
    base: str | UnsetType = UNSET
    """The best it was measured against."""
    predicted_gain: float | None
    """Share of step time the change was predicted to save."""
    predicted_samples_gain: float | None | UnsetType = UNSET
    """The same, as a change in samples/s."""
    noise: float | None
    tried_under: str | None | UnsetType = UNSET
    """The best trial's bound when this was tried."""
    helps_now: bool | None | UnsetType = UNSET
    """Whether the change addresses that bound."""
    bound: str | None | UnsetType = UNSET
    """This trial's own bound."""
    bound_evidence: list[str] | UnsetType = UNSET
    outcomes: dict[str, str] | None | UnsetType = UNSET
    """What each requested knob did."""
    compile: dict[str, Any] | None | UnsetType = UNSET
    """torch.compile's cost and graphs, where the trial compiled."""
    load: str | None | UnsetType = UNSET
    """What the machine's other work took from it."""
    drift: str | UnsetType = UNSET
    """Why the best was measured again beside it: the machine's load changed during the trial."""


class SessionRecord(Record, kw_only=True):
    """session.json."""

    schema: str
    target: str
    command: str
    options: dict[str, Any]
    """How the session ran (`SessionOptions.to_dict()`)."""
    status: str
    """running, done, interrupted or failed."""
    started_at: float
    updated_at: float
    trials: list[TrialRow]
    recommendations: list[dict[str, Any]]
    """The open recommendations after the last trial."""
    notes: list[str]
    script: str | None
    cwd: str | UnsetType = UNSET
    lint: list[dict[str, Any]] | None
    device: dict[str, Any] | None
    """The baseline's device facts."""
    user_values: dict[str, Any]
    own_settings: dict[str, OwnSetting] | UnsetType = UNSET
    memory_cap: dict[str, Any] | None | UnsetType = UNSET
    """What --memory-limit capped, as in trial.json."""
    baseline: str | None
    best: str | None
    final_knobs: dict[str, Any] | None
    speedup: float | None
    speedup_basis: str | UnsetType = UNSET
    """How the speedup was read: direct, one load, chained or in turns."""
    speedup_pairs: int | UnsetType = UNSET
    """Pairs run in turns for it."""
    bound: BestBound | None | UnsetType = UNSET
    unit: str | UnsetType = UNSET
    """samples/s, or steps/s where no step knew its batch size."""
    training_loader: dict[str, Any] | None | UnsetType = UNSET
    """The loader that feeds the steps."""
    patch: str | None
    patch_root: str | None | UnsetType = UNSET
    """The folder `patch -p1 < suggested.patch` runs in."""
    pooled: dict[str, list[str]] | UnsetType = UNSET
    """Trial → earlier runs of its settings measured with it."""
    running_trial: RunningTrial | None | UnsetType = UNSET
    sites: dict[str, Any] | UnsetType = UNSET
    """Where the step's phases are in the script."""
    graphs: dict[str, Any] | UnsetType = UNSET
    """Each trial's what-if graph (`advisor.knobs.graph`)."""
    prediction_error: PredictionError | None | UnsetType = UNSET
    paired: list[str] | UnsetType = UNSET
    """Trials measured in turns against the best."""
    unmeasured: list[str] | UnsetType = UNSET
    """Levers the budget left unmeasured."""
    core_use: CoreUse | None | UnsetType = UNSET
    time: SessionTime | None | UnsetType = UNSET
    replay: str | UnsetType = UNSET
    """The recorded surface a replayed session was served from."""
    replay_noise: float | None | UnsetType = UNSET
    replay_seed: int | None | UnsetType = UNSET
    replay_drift: float | None | UnsetType = UNSET
    exhausted: list[Any] | UnsetType = UNSET
    """Written by releases before `unmeasured`."""


FIELDS = frozenset(SessionRecord.__struct_fields__)
ROW_FIELDS = frozenset(TrialRow.__struct_fields__)


def typed(doc: dict[str, Any]) -> SessionRecord:
    """The record as its types, or `msgspec.ValidationError` naming the first key that does not fit."""
    return msgspec.convert(doc, SessionRecord)
