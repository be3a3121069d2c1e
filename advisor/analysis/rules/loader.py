"""Input pipeline: the step waits on the DataLoader."""

from __future__ import annotations

from advisor.analysis.diagnosis import Diagnosis
from advisor.analysis.rules.recommendation import Recommendation, ms, pct
from advisor.knobs import WORKER_COUNT, proposed_knobs


def loader_workers(trial: dict | None) -> tuple[int | None, int | None]:
    """(the training DataLoader's workers, the machine's logical cores) as a trial recorded them, each None
    when it did not (a trace without a trial record)."""
    trial = trial or {}
    loaders = [x for x in trial.get("dataloaders") or [] if isinstance(x, dict)]
    loader = next((x for x in loaders if x.get("training")), loaders[0] if loaders else {})
    workers = (loader.get("effective") or {}).get(WORKER_COUNT)
    cores = ((trial.get("device_facts") or {}).get("cpu") or {}).get("logical_cores")
    return (workers if isinstance(workers, int) else None), (cores if isinstance(cores, int) and cores > 0 else None)


def more_workers(d: Diagnosis) -> Recommendation | None:
    """The step waits on the DataLoader: load batches in worker processes, overlapped with compute (up to the
    CPU count: with as many workers as cores, more only compete with the step for them)."""
    idle = d.extra.get("loader_idle_share") or 0.0  # the wait with no kernel, copies or not beside it
    # Whatever its size: the share is what more workers can take back, and what that is worth decides its place
    # (`advisor.analysis.worth`); one too small to be worth the user's attention is dropped with the rest.
    share = max(d.dataloader_share, d.loader_steady_share or 0.0, idle)
    if share <= 0:
        return None
    workers, cores = loader_workers(d.trial)
    if workers and cores and workers >= cores:
        return None
    target = 4 if not workers else 2 * workers
    target = min(target, cores) if cores else target
    evidence = [f"{pct(d.dataloader_share)} of the step is spent in DataLoader.__next__ "
                f"({ms(d.breakdown_us['dataloader'])} per step) with nothing else running"]
    hidden = idle - d.dataloader_share
    if hidden >= 0.01:  # the breakdown counted part of the wait as copies or runtime calls
        evidence.append(f"with no kernel running it waits {pct(idle)} of the step ({ms(idle * d.step_time_us)}): "
                        f"{pct(hidden)} of it beside host-to-device copies or runtime calls, which the breakdown "
                        "counts first")
    evidence += [f.message for f in d.findings if f.code == "loader-queue"]
    return Recommendation(
        id="more-workers",
        title="Load data in parallel: raise DataLoader num_workers",
        knobs=proposed_knobs("more-workers", "increase"),
        predicted_gain=0.9 * share,
        evidence=tuple(evidence),
        code_change=f"DataLoader(dataset, batch_size=..., num_workers={target}, persistent_workers=True)",
        caveat="Each worker holds a copy of the Dataset; grow num_workers while it helps, up to the CPU count.",
        bound="input",
        recoverable=share,
    )
