"""The user's code: `lint` reads a training script for mistakes (never running it), `patch` writes a
session's final knobs into it as a unified diff, `settings` finds where a value is set across the files
of a repository. Torch-free; imports nothing of the trials but the `Knobs` the patch writes.
"""
