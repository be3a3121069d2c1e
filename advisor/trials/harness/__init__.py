"""What runs inside a trial's process: the entry that runs the user's script as `__main__`, the step driver that
times, profiles and measures its steps, the figures it takes there (memory, the machine's load, the device),
and the zygote's side that forks such processes."""
