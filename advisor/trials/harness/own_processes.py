"""The processes the script starts itself (`multiprocessing`), DataLoader workers aside: steps taken there (Hogwild
training, `torch.multiprocessing.spawn` ranks) are not the trial's to count, and a trial that counted none says
why. Torch-free."""

from __future__ import annotations

from typing import Any

WORKER_LOOP = "torch.utils.data._utils.worker._worker_loop"  # a DataLoader worker's target


class OwnProcesses:
    """Records the target of every process the script starts, DataLoader workers aside."""

    def __init__(self):
        self.targets: list[str] = []

    def install(self) -> None:
        """Interpose `multiprocessing`'s Process.start for the rest of the trial's process."""
        from multiprocessing import process

        start = process.BaseProcess.start
        seen = self.targets

        def recorded(proc: Any) -> None:
            target = getattr(proc, "_target", None)
            name = f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', repr(target))}"
            if name != WORKER_LOOP:
                seen.append(name)
            return start(proc)

        process.BaseProcess.start = recorded


def started_text(targets: list[str]) -> str:
    """What a trial that counted no step says of the processes its script started ("" where none)."""
    if not targets:
        return ""
    names = ", ".join(sorted(set(t.rsplit(".", 1)[-1] if t.startswith("__main__.") else t for t in targets)))
    return (f"; the script started {len(targets)} process(es) of its own ({names}): the trial counts the steps of "
            "the script's own process, not theirs (for data-parallel ranks, run it with --nproc-per-node, "
            "torchrun's way)")
