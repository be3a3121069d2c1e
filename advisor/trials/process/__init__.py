"""The process that runs a trial: the harness inside it, the step driver, and the runners outside it."""
