"""`threads`: torch's intra-op threads of the training process (`torch.set_num_threads`).

- **In the trial**: `torch.set_num_threads(n)` in the training process when the steps start, over a value the
  script set itself; DataLoader workers run one thread each, as torch makes them.
- **Proposed when**: on the CPU, with DataLoader workers: the step's threads make room for them (threads +
  workers within the cores, with each larger worker count and alone), since workers and the step fighting
  over the cores is slower than either alone. On an accelerator the search does not propose it.
- **The patch writes**: `torch.set_num_threads(N)` after the imports, where CUDA is not available.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from advisor.knobs.graph import StepGraph, TrialSettings
from advisor.knobs.knob import AFTER_IMPORTS, APPLIED, AT_STEPS_START, COUNT, NEEDS_A_VALUE, PROCESS, Knob, WhatIf, \
    Written
from advisor.knobs.offer import Best, Offer


def setting(trial: TrialSettings) -> int:
    """The torch threads the trial's step ran on: the knob's, else the script's, else what the trial recorded
    (0: not known)."""
    torch_threads = ((trial.record.get("device_facts") or {}).get("cpu") or {}).get("torch_threads")
    return int(trial.value("threads", torch_threads or 0) or 0)


def transform(g: StepGraph, value: Any, p: float, params: dict[str, float]) -> StepGraph:
    """On a CPU, the step's operators (not the optimizer's host work) take (T/T')^β as long (β = p) on T'
    threads as on T; on a GPU the host's work is one Python thread, which torch's threads do not move."""
    if g.platform != "cpu" or not g.threads or int(value) == g.threads:
        return g
    k = (g.threads / max(1, int(value))) ** p
    return dataclasses.replace(g, threads=int(value), device_s=g.host_s + g.ops_s * k, matmul_s=g.matmul_s * k,
                               matmul_tc_s=g.matmul_tc_s * k, conv_s=g.conv_s * k)


# β, 1: the operators split perfectly over their threads (the CPU time they take stays the same).
WHAT_IF = WhatIf("threads", "threads", setting, transform, "threads", prior=1.0, bounds=(0.2, 1.5))

# The session tries fewer threads only for a step on the CPU, beside its DataLoader workers: a run on a GPU (the same
# script on another machine) keeps torch's default, which its CPU-side work may need.
WRITTEN = Written(AFTER_IMPORTS, lines=(
    "if not torch.cuda.is_available():  # measured by advisor on the CPU, beside the DataLoader workers",
    "    torch.set_num_threads({value})  # torch's intra-op threads"))


def offer(best: Best) -> Offer | None:
    """On the CPU, with DataLoader workers: fewer torch threads for the step, so that it and the workers do not
    fight over the cores (threads + workers within the cores)."""
    if best.accelerator or best.workers < 1 or not best.threads:
        return None
    target = max(1, best.cores - best.workers)
    if best.threads <= target:
        return None
    return Offer({"threads": target}, f"threads {best.threads}→{target} beside {best.workers} workers",
                 f"threads-{target}", 0.1, "input", predicted=False)


def core_use(cores: int | None, ranks: int, final: dict[str, Any],
             user_values: dict[str, Any]) -> dict[str, Any] | None:
    """How settings share the CPU: DataLoader workers and torch threads per rank, against the `cores` ("all_used":
    they take every core); the session's settings (`final`) over the script's own. None where a figure is
    missing."""
    workers = final.get("num_workers") if final.get("num_workers") is not None else user_values.get("num_workers")
    threads = final.get("threads") or user_values.get("threads")
    if not cores or workers is None or not threads:
        return None
    return {"cores": cores, "ranks": ranks, "workers": workers, "threads": threads,
            "all_used": ranks * (workers + threads) >= cores}


def core_use_text(use: dict[str, Any], input_bound: bool) -> str | None:
    """Where the settings take every core (`core_use`): that, in words, and what it leaves a loader-bound step;
    None where cores are left."""
    if not use.get("all_used"):
        return None
    ranks = f" in each of {use['ranks']} ranks" if (use.get("ranks") or 1) > 1 else ""
    more = ("; more workers would take cores from the training process: make each sample cheaper to load, "
            "or use a machine with more cores" if input_bound else "")
    return (f"all {use['cores']} CPU cores are in use: {use['workers']} DataLoader worker(s) and "
            f"{use['threads']} torch thread(s){ranks}{more}")


def set_threads(value: int, torch: Any) -> str:
    """torch's intra-op threads for the steps, over what the script set itself."""
    torch.set_num_threads(value)
    return APPLIED


KNOB = Knob("threads", COUNT, PROCESS, AT_STEPS_START, "torch threads", alone=NEEDS_A_VALUE, numerics=False,
            proposed_as="fewer-threads", spread=(0.10, 0.10), whatif=WHAT_IF, written=WRITTEN, offer=offer,
            moved=lambda v: f"threads →{v}", at_steps_start=set_threads)
