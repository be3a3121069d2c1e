"""The session record, typed: session.json ("advisor.session/1") and each of its trial rows as msgspec `Struct`s,
every key the search writes declared once with its type. The search holds the record as these types and reads it
by attribute: a misspelt field is an error where it is read or written, not a silent None.

The fields are declared in the order the search first writes them, so session.json is written as before, key for
key. `UNSET`: a key an earlier release did not write, or that is written only once it is known (absent, not null);
such a field is read with `get("key")` (None while unset), the others as attributes. The types are checked again
where the record crosses the disk: every `save` (a value of the wrong type is named there: an error under the test
suite, ADVISOR_STRICT_RECORD=1, a one-line warning on stderr for a user, whose session goes on) and every
`--resume` (a session.json that is not one of ours gets one line naming the field). Readers outside the search
(the CLI, the tests) may read the record as they read its JSON, `record["trials"]`.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

SCHEMA = "advisor.session/1"


class Record(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A part of the record: unknown keys refused, on the disk and in memory."""

    def _field(self, key: str) -> str:
        if key not in self.__struct_fields__:
            raise KeyError(f"{type(self).__name__} has no field {key!r} (advisor.search.record)")
        return key

    def get(self, key: str, default: Any = None) -> Any:
        """A field that may be unset (an earlier release did not write it): its value, or `default`."""
        value = getattr(self, self._field(key))
        return default if value is UNSET else value

    def __getitem__(self, key: str) -> Any:
        value = getattr(self, self._field(key))
        if value is UNSET:
            raise KeyError(key)
        return value

    def __contains__(self, key: str) -> bool:
        return key in self.__struct_fields__ and getattr(self, key) is not UNSET

    def setdefault(self, key: str, default: Any) -> Any:
        """A field that may be unset: its value, set to `default` first where it is unset."""
        if getattr(self, self._field(key)) is UNSET:
            setattr(self, key, default)
        return getattr(self, key)

    def update(self, **fields: Any) -> None:
        """Set these fields (declared ones only)."""
        for key, value in fields.items():
            setattr(self, self._field(key), value)


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
    recommendation: str | None
    knobs: dict[str, Any]
    status: str
    message: str
    decision: str | None
    """baseline, kept, reverted, failed, not applicable or measured; null until the trial is decided."""
    reason: str
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
    base: str | UnsetType = UNSET
    """The best it was measured against."""
    drift: str | UnsetType = UNSET
    """Why the best was measured again beside it: the machine's load changed during the trial."""
    script_ended: dict[str, int] | UnsetType = UNSET
    """Where the script ended before the trial had its steps: the steps it ran, and those the trial needed."""


class SessionRecord(Record, kw_only=True, dict=True):
    """session.json. In memory it also holds `folder`, the session's folder (never written)."""

    schema: str
    target: str
    script: str | None
    command: str
    cwd: str | UnsetType = UNSET
    lint: list[dict[str, Any]] | None
    options: dict[str, Any]
    """How the session ran (`SessionOptions.to_dict()`)."""
    status: str
    """running, done, interrupted or failed."""
    started_at: float
    updated_at: float
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
    bound: BestBound | None | UnsetType = UNSET
    unit: str | UnsetType = UNSET
    """samples/s, or steps/s where no step knew its batch size."""
    training_loader: dict[str, Any] | None | UnsetType = UNSET
    """The loader that feeds the steps."""
    trials: list[TrialRow]
    recommendations: list[dict[str, Any]]
    """The open recommendations after the last trial."""
    notes: list[str]
    patch: str | None
    pooled: dict[str, list[str]] | UnsetType = UNSET
    """Trial → earlier runs of its settings measured with it."""
    running_trial: RunningTrial | None | UnsetType = UNSET
    replay: str | UnsetType = UNSET
    """The recorded surface a replayed session was served from."""
    replay_noise: float | None | UnsetType = UNSET
    replay_seed: int | None | UnsetType = UNSET
    replay_drift: float | None | UnsetType = UNSET
    sites: dict[str, Any] | UnsetType = UNSET
    """Where the step's phases are in the script."""
    graphs: dict[str, Any] | UnsetType = UNSET
    """Each trial's what-if graph (`advisor.knobs.graph`)."""
    prediction_error: PredictionError | None | UnsetType = UNSET
    paired: list[str] | UnsetType = UNSET
    """Trials measured in turns against the best."""
    unmeasured: list[str] | UnsetType = UNSET
    """Levers the budget left unmeasured."""
    speedup_pairs: int | UnsetType = UNSET
    """Pairs run in turns for it."""
    speedup_basis: str | UnsetType = UNSET
    """How the speedup was read: direct, one load, chained or in turns."""
    time: SessionTime | None | UnsetType = UNSET
    patch_root: str | None | UnsetType = UNSET
    """The folder `patch -p1 < suggested.patch` runs in."""
    core_use: CoreUse | None | UnsetType = UNSET
    exhausted: list[Any] | UnsetType = UNSET
    """Written by releases before `unmeasured`."""

    def __setattr__(self, name: str, value: Any) -> None:
        # `dict=True` makes room for `folder` alone: any other name that is not a field is a misspelling.
        if name != "folder" and name not in self.__struct_fields__:
            raise AttributeError(f"SessionRecord has no field {name!r} (advisor.search.record)")
        super().__setattr__(name, value)


FIELDS = frozenset(SessionRecord.__struct_fields__)
ROW_FIELDS = frozenset(TrialRow.__struct_fields__)


def typed(doc: dict[str, Any]) -> SessionRecord:
    """The record as its types, or `msgspec.ValidationError` naming the first key that does not fit."""
    return msgspec.convert(doc, SessionRecord)
