"""What runs in the advisor's process to run a trial: the runner (a process per trial, forked from the zygote where
it can be), torchrun's forked ranks, a Ray job, a trial in the notebook's own process; the processes a trial
started, found and ended from outside it; its memory, watched from outside."""
