"""The search: which change to try next and whether it helped.

measurement (steady-state samples/s and its noise) → bounds (what holds the step back) → strategy (the
next change, keep or revert) → state (session.json). Torch-free: trials run elsewhere (advisor.trials.runner,
advisor.api, advisor.trials.replay) and hand back their records.
"""
