"""The memory figures of a trial's steps, taken inside the trial (torch imported lazily): each step's (the
process's and the allocator's), the activations of the first step, the model's parameter dtypes after it,
where memory stood at an out-of-memory failure or at the end of a finished trial, and the peaks.
The step driver (`advisor.trials.harness.driver`) holds one; the figures themselves are
`advisor.trials.harness.activations`'.
"""

from __future__ import annotations

from typing import Any

from advisor.trials.harness.activations import ActivationRecorder, is_out_of_memory, memory_breakdown, parameter_dtypes
from advisor.trials.harness.process_memory import peak_rss_bytes, proc_status_bytes


class StepMemory:
    """Takes the memory figures of one trial's steps; a figure that cannot be taken never fails a step."""

    def __init__(self, device_type: str):
        import psutil

        self.device_type = device_type
        self.process = psutil.Process()
        self.recorder: ActivationRecorder | None = None  # set from the first step's start to its end
        self.activations: dict[str, Any] | None = None
        self.model_dtypes: dict[str, int] | None = None  # parameter bytes by dtype, after the first step
        self.at_failure: dict[str, Any] | None = None
        self.at_end: dict[str, Any] | None = None

    # --- the first step ----------------------------------------------------------------------------

    def watch_first_step(self, started: bool = False) -> None:
        """Record the activations of the first step: from `step_entered`, or from now if it has `started`
        (a loop's first step starts with the script)."""
        self.recorder = ActivationRecorder()
        if started:
            self.recorder.__enter__()

    def step_entered(self, first_profiled: bool) -> None:
        """A call of the step function begins: the first step's recording starts; the allocator's peaks
        count from the first profiled step."""
        if first_profiled and self.device_type == "cuda":
            import torch

            torch.cuda.reset_peak_memory_stats()
        if self.recorder is not None:
            self.recorder.__enter__()

    def stop_recording(self, index: int, complete: bool) -> None:
        """End the first step's recording (if it runs) and summarise it; `complete`: the step ran to its end."""
        if self.recorder is None:
            return
        self.recorder.__exit__(None, None, None)
        self.activations = self.recorder.safe_summary(index, complete=complete)
        self.recorder = None

    def take_model_dtypes(self) -> None:
        """After the first step: the model's parameter bytes by dtype."""
        try:
            self.model_dtypes = parameter_dtypes()
        except Exception:  # a figure we could not take must not fail the step
            self.model_dtypes = None

    # --- each step ---------------------------------------------------------------------------------

    def process_now(self) -> dict[str, Any]:
        """The process's memory now: a step record's `rss_bytes`, `vms_bytes` and `data_bytes`."""
        memory = self.process.memory_info()
        return {
            "rss_bytes": memory.rss,
            "vms_bytes": memory.vms,
            "data_bytes": getattr(memory, "data", None),  # what a CPU memory_limit (RLIMIT_DATA) counts
        }

    def allocator_now(self) -> dict[str, Any]:
        """The CUDA allocator's figures now and its peaks (none on a CPU): a step record's `cuda_*` fields."""
        if self.device_type != "cuda":
            return {}
        import torch

        return {"cuda_allocated_bytes": torch.cuda.memory_allocated(),
                "cuda_max_allocated_bytes": torch.cuda.max_memory_allocated(),
                "cuda_max_reserved_bytes": torch.cuda.max_memory_reserved()}

    # --- how it ended ------------------------------------------------------------------------------

    def record_failure(self, exc: BaseException) -> None:
        """On an out-of-memory error: where memory was at the failure."""
        try:
            if is_out_of_memory(exc):
                self.at_failure = memory_breakdown("at failure", self.device_type, self.activations)
        except Exception as problem:  # little memory left, or a torch without these counters
            self.at_failure = {"when": "at failure", "unavailable": f"{type(problem).__name__}: {problem}"}

    def record_end(self) -> None:
        """At the end of a finished trial: where memory was."""
        try:
            self.at_end = memory_breakdown("end", self.device_type, self.activations)
        except Exception as exc:  # a figure we could not take must not fail a finished trial
            self.at_end = {"when": "end", "unavailable": f"{type(exc).__name__}: {exc}"}

    def breakdown(self) -> dict[str, Any] | None:
        """Where memory was at an out-of-memory failure, else at the end (None when neither was taken)."""
        return self.at_failure or self.at_end

    def peaks(self) -> dict[str, Any]:
        """Peak memory as the process and the allocator saw it."""
        memory: dict[str, Any] = {"peak_rss_bytes": peak_rss_bytes()}
        if "peak_vms_bytes" in (status := proc_status_bytes()):
            memory["peak_vms_bytes"] = status["peak_vms_bytes"]
        if self.device_type == "cuda":
            import torch

            free, total = torch.cuda.mem_get_info()
            memory.update(
                cuda_max_allocated_bytes=torch.cuda.max_memory_allocated(),
                cuda_max_reserved_bytes=torch.cuda.max_memory_reserved(),
                cuda_free_bytes_at_end=free,
                cuda_total_bytes=total,
            )
        return memory
