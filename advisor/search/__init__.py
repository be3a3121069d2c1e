"""The search: which change to try next and whether it helped.

bounds (what holds the step back, from a trial's diagnosis and its steady-state measurement,
`advisor.trials.record.measurement`) → strategy (the next change, keep or revert) → state (session.json).
Torch-free: trials run elsewhere (advisor.trials.launch.runner, advisor.api, advisor.trials.replay.surface) and hand
back their records.
"""
