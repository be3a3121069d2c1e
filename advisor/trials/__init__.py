"""Trials: one run of the user's training step with a set of knobs, measured.

Torch is imported only inside a trial (the harness and what it runs); the parent side — `Knobs`, the
runners that start trials and read their records — imports none, so the search and the CLI stay
light. Runners: a subprocess per trial (`runner.run_trial`, the CLI's), the notebook's own process
(`inprocess.run_trial_in_process`), a recorded response surface (`replay.ReplayRunner`). A trial's
steady-state samples/s and its noise are measured from its step records (`measurement`).
"""
