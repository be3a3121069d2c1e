"""Small Kineto (torch.profiler) Chrome traces built event by event, in the format of tests/data/traces.

Host events (`cpu_op`, `user_annotation`, `cuda_runtime`) carry the process and thread ids; device events
(`kernel`, `gpu_memcpy`, `gpu_memset`) carry the device as pid and the stream as tid, and the runtime call
that launched each shares its `args.correlation`, as Kineto writes them. Times given to the builder are
microseconds from the trace's start; the document holds them as absolute timestamps, as real traces do.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

# deviceProperties entries as the recorded H100 and V100 traces have them (fields the analysis reads, and a few).
H100 = {"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85017493504, "computeMajor": 9,
        "computeMinor": 0, "maxThreadsPerBlock": 1024, "warpSize": 32, "numSms": 132}
V100 = {"id": 0, "name": "Tesla V100-SXM2-32GB", "totalGlobalMem": 34089730048, "computeMajor": 7,
        "computeMinor": 0, "maxThreadsPerBlock": 1024, "warpSize": 32, "numSms": 80}

BASE_TS = 4545356948923.315  # µs, like the recorded H100 traces' clock


class TraceBuilder:
    """Collects events; `document()` is the trace as a dict, `write(path)` the file (.json or .json.gz)."""

    def __init__(self, devices: tuple[dict, ...] | None = (H100,), pid: int = 1305, tid: int = 1305,
                 distributed: dict | None = None, runtime_category: str = "cuda_runtime"):
        self.devices = devices
        self.pid, self.tid = pid, tid
        self.distributed = distributed
        self.runtime_category = runtime_category
        self.events: list[dict] = []
        self._external = 0
        self._correlation = 0

    def _next_external(self) -> int:
        self._external += 1
        return self._external

    def _next_correlation(self) -> int:
        self._correlation += 1
        return self._correlation

    def _host(self, cat: str, name: str, start: float, dur: float, pid, tid, args: dict) -> dict:
        event = {"ph": "X", "cat": cat, "name": name, "pid": self.pid if pid is None else pid,
                 "tid": self.tid if tid is None else tid, "ts": BASE_TS + start, "dur": dur, "args": args}
        self.events.append(event)
        return event

    def step(self, number: int, start: float, dur: float, pid=None) -> dict:
        """A `ProfilerStep#number` span (a user annotation on the main thread)."""
        return self._host("user_annotation", f"ProfilerStep#{number}", start, dur, pid, None,
                          {"External id": self._next_external(), "Record function id": 0})

    def op(self, name: str, start: float, dur: float, cat: str = "cpu_op", pid=None, tid=None) -> dict:
        """A CPU operator (or, with cat='user_annotation', an annotation such as 'Optimizer.step#SGD.step')."""
        return self._host(cat, name, start, dur, pid, tid, {"External id": self._next_external(),
                                                             "Record function id": 0})

    def dataloader(self, start: float, dur: float, multiprocess: bool = False) -> dict:
        """The DataLoader's `__next__` span, single- or multi-process iterator."""
        kind = "_MultiProcessingDataLoaderIter" if multiprocess else "_SingleProcessDataLoaderIter"
        return self.op(f"enumerate(DataLoader)#{kind}.__next__", start, dur, cat="user_annotation")

    def runtime(self, name: str, start: float, dur: float, correlation: int | None = None, pid=None,
                tid=None, cat: str | None = None) -> dict:
        """A runtime call on the host (cudaLaunchKernel, cudaStreamSynchronize, ...)."""
        correlation = self._next_correlation() if correlation is None else correlation
        return self._host(cat or self.runtime_category, name, start, dur, pid, tid,
                          {"External id": self._external, "cbid": 211, "correlation": correlation})

    def device(self, cat: str, name: str, start: float, dur: float, correlation: int, device: int = 0,
               stream: int = 7, **args) -> dict:
        """Device activity (kernel, gpu_memcpy, gpu_memset, or another accelerator's category)."""
        event = {"ph": "X", "cat": cat, "name": name, "pid": device, "tid": stream, "ts": BASE_TS + start,
                 "dur": dur, "args": {"External id": self._external, "queued": 0, "device": device, "context": 1,
                                      "stream": stream, "correlation": correlation, **args}}
        self.events.append(event)
        return event

    def launch(self, kernel: str, call_start: float, call_dur: float, start: float, dur: float,
               call: str = "cudaLaunchKernel", device: int = 0, cat: str = "kernel") -> dict:
        """A launch call on the host and the kernel it ran on the device."""
        r = self.runtime(call, call_start, call_dur)
        return self.device(cat, kernel, start, dur, r["args"]["correlation"], device=device)

    def copy(self, call_start: float, call_dur: float, start: float, dur: float, nbytes: int,
             name: str = "Memcpy HtoD (Pageable -> Device)", call: str = "cudaMemcpyAsync",
             sync_dur: float | None = None) -> dict:
        """A copy call, its device copy, and (sync_dur given) the cudaStreamSynchronize right after the call,
        as `.to(device)` without non_blocking records them."""
        r = self.runtime(call, call_start, call_dur)
        event = self.device("gpu_memcpy", name, start, dur, r["args"]["correlation"], bytes=nbytes)
        if sync_dur is not None:
            self.runtime("cudaStreamSynchronize", call_start + call_dur + 1, sync_dur)
        return event

    def memory(self, ts: float, total_allocated: float, total_reserved: float, nbytes: float = 0,
               device_type: int = 1, device_id: int = 0) -> dict:
        """A `[memory]` instant event."""
        event = {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": self.pid,
                 "tid": self.tid, "ts": BASE_TS + ts,
                 "args": {"Total Reserved": total_reserved, "Total Allocated": total_allocated, "Bytes": nbytes,
                          "Device Id": device_id, "Device Type": device_type}}
        self.events.append(event)
        return event

    def document(self) -> dict:
        """The trace file's JSON document."""
        doc = {"schemaVersion": 1, "traceEvents": list(self.events), "displayTimeUnit": "ms"}
        if self.devices:
            doc["deviceProperties"] = [dict(d) for d in self.devices]
        if self.distributed:
            doc["distributedInfo"] = dict(self.distributed)
        return doc

    def write(self, path: Path | str) -> Path:
        """Write the trace (gzip when the name ends in .gz) and return its path."""
        path = Path(path)
        text = json.dumps(self.document()).encode()
        path.write_bytes(gzip.compress(text) if path.name.endswith(".gz") else text)
        return path
