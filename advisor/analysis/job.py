"""A data-parallel job seen whole: the ranks' diagnoses side by side, the straggler and the job's verdict.

A job's step is as slow as its slowest rank: every other rank waits for it in the next collective. So a
rank's own time is its step less its exposed communication (the time it only waited), and the straggler
is the rank whose own time is longest, when it exceeds the others' median by STRAGGLER_SHARE of the step.
What it spends the extra time on (the breakdown role where it exceeds the others most) is the cause,
and the job's bound: its input pipeline, compute (the ranks' work is unbalanced), copies, the host, or
communication. Without a straggler, the job is bound by communication when the ranks' median exposed
communication reaches COMMUNICATION_SHARE, else by what bounds its ranks.

Ranks come from each trace's `distributedInfo` (rank, world_size, backend); traces of one trial folder
(or one folder) with the same world size form a job. Pure functions over Diagnoses.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from statistics import median

from advisor.analysis.bound import BOUNDS
from advisor.analysis.breakdown import ROLES
from advisor.analysis.diagnosis import Diagnosis
from advisor.analysis.rules import ranked
from advisor.analysis.rules.recommendation import Recommendation, ms, pct
from advisor.knobs import proposed_knobs

STRAGGLER_SHARE = 0.15  # own time beyond the other ranks' median, as a share of the job's step
COMMUNICATION_SHARE = 0.15  # median exposed communication that makes the job communication-bound

ROLE_BOUND = {"kernel": "compute", "memset": "compute", "cpu_op": "compute", "memcpy": "copy",
              "communication": "communication", "runtime": "host", "dataloader": "input", "other": "host"}
CAUSE = {"input": "its input pipeline (DataLoader)", "compute": "compute (more work than the other ranks)",
         "copy": "host-to-device copies", "host": "the host (runtime calls, Python)",
         "communication": "waiting in collectives"}


@dataclass(frozen=True)
class Straggler:
    """The rank the others wait for: how much longer its own time is, and what it spends it on."""

    rank: int
    excess_us: float  # own time per step beyond the other ranks' median
    share: float  # excess_us as a share of the job's step
    bound: str  # where the extra time goes (a key of BOUNDS)
    excess_by_role_us: dict[str, float]  # per breakdown role, beyond the other ranks' median
    others_wait_us: float  # the other ranks' median exposed communication per step: their wait for it


@dataclass(frozen=True)
class Job:
    """The ranks of one data-parallel job, their straggler and the verdict on the whole."""

    source: str
    backend: str | None
    world_size: int
    ranks: tuple[Diagnosis, ...]  # by rank
    missing_ranks: tuple[int, ...]  # ranks of the world whose traces are not here
    straggler: Straggler | None
    bound: str | None
    verdict: str
    recommendations: tuple[Recommendation, ...]

    @property
    def rank_numbers(self) -> tuple[int, ...]:
        """The ranks present, in order."""
        return tuple(rank_of(d) for d in self.ranks)

    @property
    def step_us(self) -> float:
        """The job's step: its slowest rank's."""
        return max(d.step_time_us for d in self.ranks)

    @property
    def representative(self) -> Diagnosis:
        """The rank whose figures explain the job: the straggler, else the rank with the longest own time."""
        if self.straggler is not None:
            return self.ranks[self.rank_numbers.index(self.straggler.rank)]
        return max(self.ranks, key=own_us)


def rank_of(d: Diagnosis) -> int:
    """The trace's rank (0 when it does not say)."""
    rank = (d.distributed or {}).get("rank")
    return rank if isinstance(rank, int) and not isinstance(rank, bool) else 0


def world_of(d: Diagnosis) -> int | None:
    """The trace's world size, None when it was not recorded in a process group."""
    size = (d.distributed or {}).get("world_size")
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None


def exposed_us(d: Diagnosis) -> float:
    """Exposed communication per step: the time the rank waited in collectives."""
    return d.communication.exposed_us if d.communication is not None else 0.0


def own_us(d: Diagnosis) -> float:
    """The rank's own time per step: its step less the time it waited in collectives."""
    return max(0.0, d.step_time_us - exposed_us(d))


def compute_us(d: Diagnosis) -> float:
    """Compute per step: kernels (and memsets) on an accelerator, operators on the CPU."""
    b = d.breakdown_us
    return b["kernel"] + b["memset"] if d.platform != "cpu" else b["cpu_op"]


def find_straggler(ranks: list[Diagnosis]) -> Straggler | None:
    """The rank the others wait for, when its own time stands out (see the module docstring)."""
    if len(ranks) < 2:
        return None
    slow = max(ranks, key=own_us)
    others = [d for d in ranks if d is not slow]
    step = median(d.step_time_us for d in ranks)
    excess = own_us(slow) - median(own_us(d) for d in others)
    if not step or excess < STRAGGLER_SHARE * step:
        return None
    by_role = {role: slow.breakdown_us.get(role, 0.0) - median(d.breakdown_us.get(role, 0.0) for d in others)
               for role in ROLES}
    role = max(by_role, key=by_role.get)
    return Straggler(rank_of(slow), excess, excess / step, ROLE_BOUND[role], by_role,
                     median(exposed_us(d) for d in others))


def job_recommendations(ranks: list[Diagnosis], straggler: Straggler | None, representative: Diagnosis,
                        bound: str | None) -> tuple[Recommendation, ...]:
    """The job's advice: the straggler's fix first, then the representative rank's own advice (without
    communication advice where the wait is for the straggler), each marked helps-now against the job's bound."""
    own = list(representative.recommendations)
    found: list[Recommendation] = []
    if straggler is not None:
        own = [r for r in own if r.bound != "communication"]
        found.append(straggler_advice(straggler, representative, own))
        own = [r for r in own if not (straggler.bound == "input" and r.id == "more-workers")]
    out = []
    for r in found + own:
        helps = bound is None or r.bound == bound
        out.append(dataclasses.replace(r, helps_now=helps, helps_once="" if helps else BOUNDS.get(bound, "")))
    return ranked(out, representative.platform)


def straggler_advice(s: Straggler, d: Diagnosis, own: list[Recommendation]) -> Recommendation:
    """What fixes the straggler: its loader's workers, balanced work, or its own advice for its bound."""
    evidence = (f"rank {s.rank} spends {ms(s.excess_us)} per step ({pct(s.share)} of the job's step) more than "
                f"the other ranks' median on its own work, mostly {CAUSE[s.bound]}",
                f"the other ranks wait for it: {ms(s.others_wait_us)} per step in collectives with nothing computing")
    if s.bound == "input":
        workers = next((r for r in own if r.id == "more-workers"), None)
        return Recommendation(
            id="straggler-workers", title=f"Rank {s.rank} waits on its DataLoader: raise num_workers",
            knobs=proposed_knobs("more-workers", "increase"), predicted_gain=s.share,
            evidence=evidence + (workers.evidence if workers is not None else ()),
            code_change="DataLoader(dataset, batch_size=..., num_workers=4, persistent_workers=True)  # on every rank",
            caveat="A rank whose data is slower to read (a slow disk, larger samples) needs more workers than the "
                   "others; every rank gets the same DataLoader arguments unless the script sets them by rank.",
            bound="input")
    if s.bound == "compute":
        return Recommendation(
            id="rank-imbalance", title=f"Balance the work across ranks: rank {s.rank} computes more than the others",
            knobs={}, predicted_gain=s.share, evidence=evidence,
            code_change="DistributedSampler(dataset, drop_last=True)  # equal shards; bucket samples by length "
                        "so each rank's batches cost the same; keep logging and evaluation off the step on rank 0",
            caveat="Imbalance comes from the data (uneven shards, variable lengths) or from work one rank does "
                   "alone; a rank on a slower or busier device shows the same.",
            bound="compute")
    return Recommendation(
        id="straggler", title=f"Rank {s.rank} is slower than the others: {CAUSE[s.bound]}", knobs={},
        predicted_gain=s.share, evidence=evidence,
        code_change="Apply rank {}'s own advice below; it sets the pace of every rank.".format(s.rank),
        bound=s.bound)


def verdict_of(ranks: list[Diagnosis], world: int, straggler: Straggler | None) -> tuple[str | None, str]:
    """The job's bound and its verdict in one sentence."""
    step = max(d.step_time_us for d in ranks)
    shares = sorted(exposed_us(d) / d.step_time_us for d in ranks if d.step_time_us)
    waiting = median(shares) if shares else 0.0
    if straggler is not None:
        text = (f"rank {straggler.rank} is the straggler: {ms(straggler.excess_us)} per step more than the other "
                f"ranks ({pct(straggler.share)} of the step), spent on {CAUSE[straggler.bound]}; the others wait for "
                f"it in collectives")
        return straggler.bound, text
    if len(ranks) == 1:
        d = ranks[0]
        bound = d.bound
        text = (f"rank {rank_of(d)} of {world} only: a straggler cannot be named from one rank; this rank waits "
                f"{ms(exposed_us(d))} per step in collectives ({pct(waiting)} of its step) and is bound by "
                f"{BOUNDS.get(bound, 'what its trace cannot say')}")
        return bound, text
    spread = (max(own_us(d) for d in ranks) - min(own_us(d) for d in ranks)) / step if step else 0.0
    if waiting >= COMMUNICATION_SHARE:
        text = (f"the ranks are balanced (own time within {pct(spread)} of the step); communication not "
                f"overlapped with compute takes {pct(waiting)} of the step (median over ranks)")
        return "communication", text
    bounds = [d.bound for d in ranks if d.bound is not None]
    bound = max(set(bounds), key=bounds.count) if bounds else None
    text = (f"the ranks are balanced (own time within {pct(spread)} of the step) and wait {pct(waiting)} of it in "
            f"collectives; the job is bound by {BOUNDS.get(bound, 'what the traces cannot say')}, as its ranks are")
    return bound, text


def job_of(source: str, ranks: list[Diagnosis]) -> Job:
    """The job of these ranks' diagnoses (one trace per rank)."""
    ranks = sorted(ranks, key=rank_of)
    world = max([world_of(d) or 1 for d in ranks] + [len(ranks)])
    straggler = find_straggler(ranks)
    bound, verdict = verdict_of(ranks, world, straggler)
    present = {rank_of(d) for d in ranks}
    job = Job(source=source, backend=(ranks[0].communication.backend if ranks[0].communication else None),
              world_size=world, ranks=tuple(ranks), missing_ranks=tuple(r for r in range(world) if r not in present),
              straggler=straggler, bound=bound, verdict=verdict, recommendations=())
    return dataclasses.replace(job, recommendations=job_recommendations(ranks, straggler, job.representative, bound))


def jobs_of(diagnoses: list[Diagnosis]) -> list[Job]:
    """The data-parallel jobs among diagnoses: traces recorded in a process group, grouped by folder and
    world size (several ranks of one trial, or a folder of per-rank traces); one trace per rank (the
    first found)."""
    groups: dict[tuple[str, int], dict[int, Diagnosis]] = {}
    for d in diagnoses:
        world = world_of(d)
        if world is None:
            continue
        groups.setdefault((str(Path(d.source).parent), world), {}).setdefault(rank_of(d), d)
    return [job_of(folder, list(ranks.values())) for (folder, _), ranks in groups.items()]


def jobs_of_path(path: Path | str, diagnoses: list[Diagnosis]) -> list[Job]:
    """The data-parallel jobs of an analysed path: none for a single file (one rank's trace; its job is the
    folder's view), `jobs_of` for a folder."""
    return [] if Path(path).is_file() else jobs_of(diagnoses)


def job_diagnosis(job: Job) -> Diagnosis:
    """The job as one Diagnosis the search can follow: the representative rank's figures, with the job's
    bound, verdict and advice."""
    d = job.representative
    return dataclasses.replace(d, bound=job.bound, bound_evidence=(job.verdict,) + tuple(d.bound_evidence),
                               recommendations=job.recommendations, extra={**d.extra, "job": job})


def common_step(job: Job) -> str | None:
    """The step to draw for every rank: among the steps all ranks recorded, the one whose job step (its
    slowest rank's) is the median; None when the ranks share no step name."""
    timelines = [d.extra.get("step_timelines") or {} for d in job.ranks]
    shared = set(timelines[0]).intersection(*timelines[1:]) if timelines else set()
    if not shared:
        return None
    by_length = sorted(shared, key=lambda name: max(t[name]["duration_us"] for t in timelines))
    return by_length[len(by_length) // 2]
