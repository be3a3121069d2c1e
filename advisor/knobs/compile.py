"""`compile`: `torch.compile` of the model's forward.

- **In the trial**: the model's forward through `torch.compile` from its second call. The compile runs in
  the steps before the measured windows, so it is never in samples/s: the trial records it (`compile_s`,
  graphs, graph breaks) and the session says after how many steps it pays back.
- **Proposed when**: compute or launch overhead binds.
- **Not applicable**: a compile that fails (no C++ compiler for the CPU backend, a construct the compiler
  refuses): the eager forward is put back, the trial goes on, the reason is recorded.
- **The patch writes**: `torch.compile` of the model just before the optimizer is built from it.
"""

from advisor.knobs.knob import AT_FIRST_CALL, FLAG, MODEL, Knob

KNOB = Knob("compile", FLAG, MODEL, AT_FIRST_CALL, "torch.compile",
            trainer_keywords=(("torch_compile", True),))
