"""The search's policy, the one seam between the session's loop and how it chooses: the next trials, the follow-up
after a decision (a swap, or a pair with the move worth most beside it), when to stop, and how a candidate is
judged against the best. The loop (`advisor.search.session`) runs what the policy says; what it says is
pure functions over the session record (`strategy`, `expected`, `pairing`, `simplify`, `decision`). Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from advisor.search.record import SessionRecord
from advisor.search.budget import STOP_SHARE, kept_for_time, reserve, trials_in_time
from advisor.search.cost import by_cost, seconds, slower_compile, trial_seconds
from advisor.search.decision import Decision, decide
from advisor.search.expected import levers_left, untried, value
from advisor.search.pairing import late_pair, pair_proposal, pairs_on
from advisor.search.predictions import reprice
from advisor.search.proposal import Proposal
from advisor.search.simplify import swap_proposal, takes_off, unproven_knobs, without_proposal
from advisor.search.space import TRY, pending_try, user_space
from advisor.search.state import SessionOptions
from advisor.search.strategy import SearchSpace, propose
from advisor.search.trial_runner import TrialRunner
from advisor.trials.record import TrialResult
from advisor.trials.record.measurement import Measurement

PAIR_TRIES = 2  # a pair that fails gives way once to the next second move of the same first move


@dataclass(frozen=True)
class Policy:
    """How a session chooses, for one session's folder, options, search space and runner."""

    out: Path
    options: SessionOptions
    space: SearchSpace
    run: TrialRunner
    started: float | None = None  # time.monotonic() when the session's trials began: --time-budget counts from it
    pair_tries: int = PAIR_TRIES

    @classmethod
    def of(cls, out: Path, options: SessionOptions, space: SearchSpace, run: TrialRunner,
           started: float | None = None) -> Policy:
        """The policy of a session: the search space less what the user's --only and --skip keep out."""
        return cls(out, options, user_space(space, options.only, options.skip), run, started)

    def next_trials(self, state: SessionRecord, best: TrialResult, diagnosis: Any, bound: Any) -> list[Proposal]:
        """The candidates for the next trial, the one to run first: the user's --try settings, then a knob the
        best holds without a gain of its own (taken off), then the proposals ranked by expected improvement per
        second of wall time (`cost.by_cost`: a compile pays for its compile); where none is left, or none is worth
        a trial (`answer_known`), the fastest reverted change not yet paired, with its next move."""
        asked = pending_try(self.options, state, best.knobs, diagnosis)
        if asked:  # priced as the search's own are: a finding's gain is what its bound could give back at most
            return reprice([asked], state, best.name, best.knobs)
        unproven = unproven_knobs(state)
        if unproven:
            return [without_proposal(best.knobs, unproven[0])]
        proposals = by_cost(propose(diagnosis, bound, best, state, self.options, self.space), self.out, state)
        if proposals and not self.answer_known(state, proposals):
            return proposals
        # The round is over (nothing left, or nothing worth a trial): a reverted change gets its second move.
        late = late_pair(self.out, state, self.options, self.space, best.knobs, least=self.least_worth)
        return [late] if late is not None else proposals

    def stop(self, state: SessionRecord, proposals: list[Proposal]) -> str | None:
        """Why the session stops before the next trial (the note it leaves), or None: nothing left to try, the
        trials or the time (less what is kept back for the end) spent, or the answer known (`answer_known`)."""
        options = self.options
        if not proposals:
            return ("stopped: a full round over the knobs kept nothing more" if len(state.trials) > 1
                    else "stopped: nothing to try")
        if len(state.trials) >= options.max_trials - reserve(options, self.run):
            # One trial is a diagnosis-only run, not a budget that ran out: it stops without a note ("").
            return (f"stopped after {options.max_trials} trials (--max-trials) with {len(proposals)} change(s) left "
                    f"to try{levers_left(proposals, state)}" if options.max_trials > 1 else "")
        if not self.time_for(state, proposals[0]):
            kept = kept_for_time(options, self.run)
            return (f"stopped: the time budget of {options.time_budget_s:g} s (--time-budget) holds no more trials"
                    + (f" beside the {kept} kept for the end" if kept else "")
                    + levers_left(proposals, state))
        return self.answer_known(state, proposals)

    def answer_known(self, state: SessionRecord, proposals: list[Proposal]) -> str | None:
        """Why no trial left can change the answer, or None: every candidate is a kind of change the session has
        measured already, and none is expected to improve on the best (`expected.value`, the scale the candidates
        are ranked on) by half the least gain worth keeping (STOP_SHARE). A setting the user asked for, a knob taken
        off and a lever the trace points at that no trial has measured yet always run."""
        if any(p.recommendation == TRY or takes_off(p.recommendation) for p in proposals) or untried(proposals, state):
            return None
        most, likeliest = max(((value(p, state), p) for p in proposals), key=lambda pair: pair[0])
        if most >= self.least_worth:
            return None
        return (f"stopped: the answer is known: no change left is expected to improve on the best by "
                f"{100 * self.least_worth:.1f}% (the most, {likeliest.change}: {100 * most:+.1f}%)")

    @property
    def least_worth(self) -> float:
        """The least expected improvement over the best (`expected.value`) worth a trial: half the least gain worth
        keeping (STOP_SHARE)."""
        return STOP_SHARE * self.options.min_gain

    def room(self, state: SessionRecord) -> bool:
        """Whether one more trial fits in the budget (its trials and its time) less what is kept back for the end."""
        return len(state.trials) < self.options.max_trials - reserve(self.options, self.run) \
            and self.time_for(state)

    def time_for(self, state: SessionRecord, proposal: Proposal | None = None) -> bool:
        """Whether the --time-budget left holds one more trial (`proposal`, priced as `cost.seconds`: a first
        compile on top) and the trials' time kept for the end (`kept_for_time`)."""
        if self.options.time_budget_s is None:
            return True
        trial = trial_seconds(self.out, state)
        first = 1.0 if proposal is None else seconds(proposal, self.out, state) / trial
        left = trials_in_time(self.out, state, self.options, self.started)
        return left >= first + kept_for_time(self.options, self.run)

    def follow_up(self, state: SessionRecord, best: TrialResult, proposal: Proposal, result: TrialResult,
                  decision: Decision | None, bound: Any) -> tuple[Proposal | None, str]:
        """A next move on a change that did not pay, measured against the best, and why: in the place of a model
        knob the best holds (they interact), else, where the change moved or addressed the bound, or its gain hid
        in the noise, the pair with the move worth most beside it. (None, "") where none."""
        row = next(t for t in state.trials if t.name == result.name) if result.ok else None
        # A change found not applicable changed nothing: no swap or pair is made on it (it is never proposed again).
        if (decision is None or decision.keep or row is None or row.decision == "not applicable"
                or decision.reason.startswith("loss")):
            return None, ""
        second = swap_proposal(state, best.knobs, proposal)
        if slower_compile(proposal, decision, second, self.options.min_gain):
            return None, ""  # its compile is paid again, and the layout is not what the model says made it slower
        if second is not None:
            return second, second.why or ""
        if "+" in proposal.recommendation or takes_off(proposal.recommendation) or not pairs_on(decision, row, bound):
            return None, ""
        # Noise hides a small first step, and some changes pay only with a second (pinned copies with more
        # workers): a change that moved the bound, or addressed it, without paying is a base for the move worth
        # most beside it, measured together against the best.
        second = pair_proposal(result, proposal, state, self.options, self.space, best.knobs)
        state.setdefault("paired", []).append(result.name)
        if second is None or value(second, state) < self.least_worth:
            return None, ""  # the pair worth most is not worth a trial: it cannot change the answer
        return second, f"together with {proposal.change}"

    def give_way(self, state: SessionRecord, best: TrialResult, first: TrialResult, proposal: Proposal,
                 failed: Proposal) -> tuple[Proposal | None, str]:
        """A pair that could not run (a setting that fails) gives way to the nearest one of its direction: the
        first move with its next second move."""
        second = pair_proposal(first, proposal, state, self.options, self.space, best.knobs,
                               why=f"in place of {failed.change}, which failed")
        return second, (second.why or "") if second is not None else ""

    def judge(self, best: Measurement, candidate: Measurement, losses: list[float], reference_losses: list[float],
              proposal: Proposal) -> Decision:
        """Keep or revert a candidate measured against the best (`advisor.search.decision.decide`): one standard
        error of evidence for a change that addresses the bound, two for the rest."""
        return decide(best, candidate, losses, reference_losses, self.options.min_gain,
                      addresses_bound=proposal.helps_now)
