"""`threads`: torch's intra-op threads of the training process (`torch.set_num_threads`).

- **In the trial**: `torch.set_num_threads(n)` in the training process when the steps start, over a value the
  script set itself; DataLoader workers run one thread each, as torch makes them.
- **Proposed when**: on the CPU, with DataLoader workers: the step's threads make room for them (threads +
  workers within the cores, with each larger worker count and alone), since workers and the step fighting
  over the cores is slower than either alone. On an accelerator the search does not propose it.
- **The patch writes**: `torch.set_num_threads(N)` after the imports, where CUDA is not available.
"""

from advisor.knobs.knob import AT_STEPS_START, COUNT, NEEDS_A_VALUE, PROCESS, Knob

KNOB = Knob("threads", COUNT, PROCESS, AT_STEPS_START, "torch threads", alone=NEEDS_A_VALUE, numerics=False)
