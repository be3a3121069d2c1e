"""Input pipeline: the step waits on the DataLoader."""

from __future__ import annotations

from advisor.analysis.diagnosis import Diagnosis
from advisor.analysis.rules.recommendation import Recommendation, ms, pct

DATALOADER_SHARE = 0.05


def more_workers(d: Diagnosis) -> Recommendation | None:
    """The step waits on the DataLoader: load batches in worker processes, overlapped with compute."""
    share = max(d.dataloader_share, d.loader_steady_share or 0.0)
    if share < DATALOADER_SHARE:
        return None
    evidence = [f"{pct(d.dataloader_share)} of the step is spent in DataLoader.__next__ "
                f"({ms(d.breakdown_us['dataloader'])} per step) with nothing else running"]
    evidence += [f.message for f in d.findings if f.code == "loader-queue"]
    return Recommendation(
        id="more-workers",
        title="Load data in parallel: raise DataLoader num_workers",
        knobs={"num_workers": "increase"},
        predicted_gain=0.9 * share,
        evidence=tuple(evidence),
        code_change="DataLoader(dataset, batch_size=..., num_workers=4, persistent_workers=True)",
        caveat="Each worker holds a copy of the Dataset; grow num_workers while it helps, up to the CPU count.",
        bound="input",
    )
