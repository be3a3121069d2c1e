"""A data-parallel job as the report shows it: its ranks side by side (a table and a timeline of one step
per rank), the straggler called out, the verdict and the job's advice."""

from __future__ import annotations

from dataclasses import dataclass

from advisor.analysis.diagnosis import Diagnosis
from advisor.analysis.job import CAUSE, Job, common_step, compute_us, exposed_us, jobs_of, own_us, rank_of
from advisor.report import charts
from advisor.report.formatting import ms, pct
from advisor.report.terminal import ROLE_LABELS


@dataclass(frozen=True)
class JobView:
    """What the templates show of one job."""

    title: str
    verdict: str
    straggler: str | None  # 'rank 1: +141.3 ms per step (94% of the step), its input pipeline (DataLoader)'
    straggler_rank: int | None
    rows: tuple[tuple[str, ...], ...]  # rank, step, own, waits in collectives, DataLoader, compute, bound
    missing_ranks: str | None
    timeline: str | None  # chart data URI
    timeline_step: str | None
    job: Job

    @property
    def recommendations(self) -> tuple:
        """The job's advice, best first."""
        return self.job.recommendations


def job_view(job: Job) -> JobView:
    """Format a job for the templates; its timeline draws the same step of every rank."""
    s = job.straggler
    rows = tuple((str(rank_of(d)), ms(d.step_time_us / 1000), ms(own_us(d) / 1000), ms(exposed_us(d) / 1000),
                  ms(d.breakdown_us["dataloader"] / 1000), ms(compute_us(d) / 1000), d.bound or "n/a")
                 for d in job.ranks)
    step = common_step(job)
    timeline = None
    if step is not None:
        segments = [d.extra["step_timelines"][step]["segments"] for d in job.ranks]
        highlight = job.rank_numbers.index(s.rank) if s is not None else None
        timeline = charts.rank_timeline_chart([f"rank {r}" for r in job.rank_numbers], segments, highlight,
                                              ROLE_LABELS)
    return JobView(
        title=f"Data-parallel job: {job.world_size} ranks ({job.backend or 'unknown backend'})",
        verdict=job.verdict,
        straggler=None if s is None else (f"rank {s.rank}: +{ms(s.excess_us / 1000)} per step ({pct(s.share)} of the "
                                          f"step), {CAUSE[s.bound]}"),
        straggler_rank=None if s is None else s.rank,
        rows=rows,
        missing_ranks=", ".join(map(str, job.missing_ranks)) or None,
        timeline=timeline, timeline_step=step, job=job)


def job_views(diagnoses: list[Diagnosis]) -> list[JobView]:
    """The views of the data-parallel jobs among these diagnoses."""
    return [job_view(j) for j in jobs_of(diagnoses)]
