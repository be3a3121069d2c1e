"""DataLoaders in a trial: the knobs applied where the training loader is built, and the batches it hands out.

Inside the trial only (torch is imported lazily). `torch.utils.data.DataLoader.__init__` is wrapped: the
user's arguments are bound to the signature, the values the user wrote (or the defaults they relied on)
are recorded with the place in the user's code that built the loader (its *site*, `file.py:LINE`), and
the requested DataLoader knobs (`batch_size`, `num_workers`, `pin_memory`, `persistent_workers`,
`prefetch_factor`, and the micro-batches of `accumulation_steps`) override them — on the training loader
only, once it is known: a script that also builds an evaluation loader keeps that one as written.

Which loader trains is measured, not guessed: every batch a loader hands out (`__next__` of its
iterator) is timed and attributed to it (`LoaderTracker`), and the loader whose batch came last before
each step is the one that feeds the steps. The baseline trial finds it; later trials are told its site.
The time spent fetching batches between two steps is the time the step waited for data.
"""

from __future__ import annotations

import inspect
import os
import site
import sysconfig
import time
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from advisor.knobs import BY_NAME, DATALOADER_KNOBS, DECIDED_AT_LOADER, KNOBS, PLANNED_AT_LOADER
from advisor.knobs.in_trial import DataChange, LoaderArguments, declared_class
from advisor.trials.knobs import APPLIED, Knobs, not_applicable

_TORCH_DIR = None  # set on first use: frames inside torch are not the user's code
_OUR_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the advisor package
# Installed packages are not the user's code either: a DataLoader that transformers' Trainer or accelerate
# builds, a backward that Lightning calls, are placed at the line of the user's code that called into them
# (`trainer.train()`), which is what a patch can change and where the framework's settings are made.
INSTALLED = tuple({os.path.join(os.path.abspath(p), "") for p in (
    sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *getattr(site, "getsitepackages", list)())})


@dataclass
class LoaderRecord:
    """One DataLoader the script built: what the user wrote, what it was built with, where, and its use."""

    user: dict[str, Any]
    effective: dict[str, Any]
    outcomes: dict[str, str]
    site: str | None = None  # "file.py:LINE" of the DataLoader(...) call in the user's code
    ordinal: int = 0  # loaders built at the same site before this one
    fetches: int = 0  # batches it handed out
    steps: int = 0  # steps whose last batch came from it: the training loader feeds the most
    rebuilds: "LoaderRecord | None" = None  # the loader it was rebuilt from (accelerate's prepare): fed as that one
    batch_sampler: bool = False  # built with a batch_sampler of the script's: no batch_size reaches it

    def to_dict(self, training: bool = False) -> dict[str, Any]:
        """JSON form (trial.json `dataloaders`)."""
        return {"user": self.user, "effective": self.effective, "outcomes": self.outcomes, "site": self.site,
                "ordinal": self.ordinal, "fetches": self.fetches, "steps": self.steps, "training": training,
                "rebuilds": None if self.rebuilds is None else self.rebuilds.site}

    def fed_as(self) -> "LoaderRecord":
        """The loader its batches count for: the one it rebuilds, else itself."""
        return self.rebuilds or self


def plan_loader_arguments(
    user: dict[str, Any], knobs: Knobs, *, accelerator: bool
) -> tuple[dict[str, Any], dict[str, str]]:
    """Pure: the DataLoader arguments to build with, and each requested knob's outcome.

    `user` holds the bound values of batch_size, batch_sampler, num_workers, pin_memory,
    persistent_workers and prefetch_factor. Overrides that DataLoader would reject (prefetch_factor or
    persistent_workers without workers, batch_size with a batch_sampler) are skipped with a reason.
    """
    loader = LoaderArguments(user, {k: user.get(k) for k in DATALOADER_KNOBS}, accelerator)
    outcomes = loader.plan(knobs, PLANNED_AT_LOADER)  # each knob's own plan, in the registry's order
    return loader.effective, outcomes


def user_frame() -> Any:
    """The innermost frame on the stack that is the user's code (not torch's, not ours, not an installed
    package's), or None."""
    global _TORCH_DIR
    if _TORCH_DIR is None:
        import torch

        _TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
    frame = inspect.currentframe()
    while frame is not None:
        filename = os.path.abspath(frame.f_code.co_filename)
        ours = filename.startswith((_TORCH_DIR, _OUR_DIR, *INSTALLED))
        if not ours and not frame.f_code.co_filename.startswith("<"):
            return frame
        frame = frame.f_back
    return None


def user_site() -> str | None:
    """`file.py:LINE` of the innermost frame on the stack that is the user's code."""
    frame = user_frame()
    return None if frame is None else f"{os.path.abspath(frame.f_code.co_filename)}:{frame.f_lineno}"


def is_training_site(record: LoaderRecord, training: dict[str, Any] | None) -> bool:
    """Whether the knobs go to this loader: the training loader once known, every loader before."""
    if not training:
        return True
    return record.site == training.get("site") and record.ordinal == training.get("ordinal", 0)


def data_changes(knobs: Knobs, device_type: str) -> dict[str, DataChange]:
    """The requested knobs' changes of the training Dataset and the step's copies (their `DataChange`: 8-bit
    images), one each for this trial, in the registry's order."""
    return {k.name: declared_class(k.on_data)(device_type) for k in KNOBS if k.on_data and getattr(knobs, k.name)}


def install_dataloader_knobs(knobs: Knobs, *, accelerator: bool, records: list[LoaderRecord],
                             training: dict[str, Any] | None = None,
                             taken: Callable[[], set[str]] | None = None,
                             changes: dict[str, DataChange] | None = None) -> Callable[[], None]:
    """Wrap `DataLoader.__init__` so the training loader (`training`: its site and ordinal; every loader
    when None) gets the knobs (its arguments; its Dataset, by the knobs' `changes`) and every loader is recorded;
    returns an undo. `taken()`: the knobs a framework's own settings took
    (`advisor.trials.interposition.frameworks`), which no DataLoader gets again."""
    import dataclasses

    import torch.utils.data

    cls = torch.utils.data.DataLoader
    original = cls.__init__
    signature = inspect.signature(original)
    built: list[tuple[LoaderRecord, Any]] = []  # each loader (a weak reference), to know a rebuild

    def __init__(self, *args, **kwargs):  # noqa: N807 - it replaces __init__
        if getattr(self, "_advisor_building", False):  # a subclass calling super().__init__ again
            return original(self, *args, **kwargs)
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        values = bound.arguments
        user = {k: values.get(k) for k in (*DATALOADER_KNOBS, "batch_sampler")}
        site = user_site()
        record = LoaderRecord(user={k: user[k] for k in DATALOADER_KNOBS}, effective={}, outcomes={}, site=site,
                              ordinal=sum(r.site == site for r in records))
        # A loader whose batch_sampler is an earlier loader's (or wraps it: accelerate's prepare, the Trainer's
        # loader) is that loader rebuilt: the knobs go to the one the script built, which the rebuild takes
        # its batches and arguments from.
        sampler = user["batch_sampler"]
        if sampler is not None:
            record.rebuilds = next((r for r, ref in reversed(built) if ref() is not None and any(
                s is ref().batch_sampler for s in (sampler, getattr(sampler, "batch_sampler", None)))), None)
            record.batch_sampler = record.rebuilds is None
        built.append((record, weakref.ref(self)))
        given = taken() if taken is not None else set()
        if is_training_site(record, training):
            own = dataclasses.replace(knobs, **{k: None for k in given}) if given else knobs
            record.effective, record.outcomes = plan_loader_arguments(user, own, accelerator=accelerator)
            for name, change in (changes or {}).items():
                if (outcome := change.at_training_loader(values.get("dataset"), site)) is not None:
                    record.outcomes[name] = outcome
        else:
            record.effective = dict(record.user)
            record.outcomes = {k: not_applicable("not the training loader") for k in knobs.requested()
                               if k in DECIDED_AT_LOADER and k not in given}
        for key in DATALOADER_KNOBS:
            values[key] = record.effective[key]
        records.append(record)
        self._advisor_record = record
        self._advisor_building = True
        try:
            return original(*bound.args, **bound.kwargs)
        finally:
            self._advisor_building = False

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    __init__.__signature__ = signature  # type: ignore[attr-defined]
    cls.__init__ = __init__

    def undo() -> None:
        cls.__init__ = original

    return undo


def leading_dimension(value: Any, depth: int = 0) -> int | None:
    """The leading dimension of the first tensor in a batch (looking two levels into lists, tuples, dicts)."""
    import torch

    if isinstance(value, torch.Tensor):
        return int(value.shape[0]) if value.dim() > 0 else None
    if depth < 2 and isinstance(value, (list, tuple)):
        items = value
    elif depth < 2 and isinstance(value, dict):
        items = value.values()
    else:
        return None
    for item in items:
        found = leading_dimension(item, depth + 1)
        if found is not None:
            return found
    return None


@dataclass
class LoaderTracker:
    """Times every batch a DataLoader hands out and remembers which loader's came last."""

    fetch_s: float = 0.0  # time spent fetching since the last step ended
    last: LoaderRecord | None = None  # the loader whose batch came last
    fetching: bool = False  # inside a loader's __next__ (a target called now is not a step)
    samples: dict = field(default_factory=dict)  # samples each loader handed out since the last step
    # The knobs' changes of the batches (`DataChange.batch`: 8-bit images marked for the step's copy, or converted
    # as they leave the loader on the CPU), by knob.
    changes: dict = field(default_factory=dict)
    # The DataLoader iterator that handed out the last batch (its workers, where it has some); weakly: a finished
    # epoch's iterator shuts its workers down when it goes.
    iterator: Any = None

    def install(self) -> Callable[[], None]:
        """Time `__next__` of every DataLoader iterator, attributed to its loader; returns an undo."""
        from torch.utils.data import DataLoader
        from torch.utils.data.dataloader import _BaseDataLoaderIter

        original_iter, original_next = DataLoader.__iter__, _BaseDataLoaderIter.__next__
        tracker = self

        def __iter__(loader):  # noqa: N807
            iterator = original_iter(loader)
            iterator._advisor_record = getattr(loader, "_advisor_record", None)
            # What the knobs do to its batches (an 8-bit Dataset's: known once its iteration starts, as its workers
            # copy it)
            iterator._advisor_changes = [(c, how) for c in tracker.changes.values()
                                         if (how := c.batches_of(loader.dataset)) is not None]
            return iterator

        def __next__(iterator):  # noqa: N807
            started = time.perf_counter()
            tracker.fetching = True
            try:
                batch = original_next(iterator)
            finally:
                tracker.fetching = False
                tracker.fetch_s += time.perf_counter() - started
            for change, how in getattr(iterator, "_advisor_changes", ()):
                batch = change.batch(batch, how)
            tracker.iterator = weakref.ref(iterator)
            record = getattr(iterator, "_advisor_record", None)
            if record is not None:
                record.fetches += 1
                record = record.fed_as()
                tracker.last = record
                size = leading_dimension(batch)
                if size is not None:
                    tracker.samples[id(record)] = tracker.samples.get(id(record), 0) + size
            return batch

        DataLoader.__iter__, _BaseDataLoaderIter.__next__ = __iter__, __next__

        def undo() -> None:
            DataLoader.__iter__, _BaseDataLoaderIter.__next__ = original_iter, original_next

        return undo

    def step_ended(self) -> tuple[float, LoaderRecord | None, int | None]:
        """At the end of a step: the time it waited for batches, the loader that fed it, and the samples
        that loader handed out for it (several batches where the loop accumulates gradients itself)."""
        waited, self.fetch_s = self.fetch_s, 0.0
        samples = self.samples.get(id(self.last)) if self.last is not None else None
        self.samples = {}
        if self.last is not None:
            self.last.steps += 1
        return waited, self.last, samples

    @contextmanager
    def workers_stopped(self) -> Iterator[int]:
        """The worker processes of the loader that fed the last batch stopped (SIGSTOP) for the block, and
        continued (SIGCONT) after it however it ends: a trial waiting while another measures would otherwise refill
        its queue beside the other's window (a paused trial's two workers took 20-29 % of the CPU beside its
        partner's first windows, and slowed that partner's 2-thread step by more). Yields how many were stopped."""
        import signal

        iterator = self.iterator() if self.iterator is not None else None
        workers = [w for w in getattr(iterator, "_workers", None) or [] if getattr(w, "pid", None)]
        stopped = []
        try:
            for worker in workers:
                try:
                    os.kill(worker.pid, signal.SIGSTOP)
                    stopped.append(worker.pid)
                except OSError:  # ended meanwhile
                    continue
            yield len(stopped)
        finally:
            for pid in stopped:
                try:
                    os.kill(pid, signal.SIGCONT)
                except OSError:
                    continue


def training_loader(records: list[LoaderRecord]) -> LoaderRecord | None:
    """The loader that fed most steps (None when no step took a batch from a DataLoader)."""
    fed = [r for r in records if r.steps]
    return max(fed, key=lambda r: r.steps) if fed else None


def dataloader_outcomes(knobs: Knobs, records: list[LoaderRecord], changes: dict[str, DataChange] | None = None) \
        -> dict[str, str]:
    """Per requested DataLoader knob: its outcome over all loaders the script built, and by its `DataChange` once
    the steps ran, where it has one (8-bit images: whether the step's copy converted them)."""
    outcomes = {}
    for key in DECIDED_AT_LOADER:
        value = getattr(knobs, key)
        if value is None:
            continue
        if BY_NAME[key].changes_nothing(value):
            outcomes[key] = APPLIED  # one micro-step per cycle, or float images as built: nothing to change
            continue
        # The training loader's reason first: "not the training loader" of the others is not why.
        seen = sorted((r.outcomes[key] for r in records if key in r.outcomes),
                      key=lambda outcome: outcome == not_applicable("not the training loader"))
        if not records:
            outcomes[key] = not_applicable("the script built no DataLoader before the steps ended")
        elif APPLIED in seen:
            outcomes[key] = APPLIED
        else:  # no loader was built for it (a notebook's loader, rebuilt with its arguments only)
            outcomes[key] = seen[0] if seen else not_applicable("no DataLoader was built with it")
    for name, change in (changes or {}).items():
        outcomes[name] = change.outcome(outcomes.get(name))
    return outcomes


