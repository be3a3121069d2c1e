"""Load torch.profiler (Kineto) Chrome traces into a `Trace`, without importing torch.

Reads `.json` and `.json.gz` files, both category vocabularies (old: `Operator`, `Kernel`, `Runtime`,
`Memcpy`, `Memset`; new: `cpu_op`, `kernel`, `cuda_runtime`, `gpu_memcpy`, ...), `deviceProperties` and the
legacy `computeProperties`. Decoding is typed with msgspec: only the fields the analysis needs are
materialized, which is what makes a 54 MB trace load faster and in less memory than `json.load`.

All times in a `Trace` are microseconds relative to the earliest event (`origin_us`), as floats; traces
that store nanoseconds are converted here, once.
"""

from __future__ import annotations

import gc
import os
import re
import stat
import threading
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from operator import attrgetter
from pathlib import Path
from typing import Union

import msgspec

from advisor.errors import NotATrace, TraceError
from advisor.files import NotARegularFile, describe_os_error, is_regular, read_regular

TRACE_SUFFIXES = (".json", ".json.gz")


class Args(msgspec.Struct):
    """The event arguments the analysis reads; everything else in `args` is skipped while decoding."""

    external_id: Union[int, str, None] = msgspec.field(name="External id", default=None)
    external_id_old: Union[int, str, None] = msgspec.field(name="external id", default=None)
    correlation: Union[int, str, None] = None
    device: Union[int, str, None] = None
    bytes: Union[int, float, None] = None
    kind: Union[str, None] = None
    device_type: Union[int, str, None] = msgspec.field(name="Device Type", default=None)
    device_id: Union[int, str, None] = msgspec.field(name="Device Id", default=None)
    alloc_bytes: Union[int, float, None] = msgspec.field(name="Bytes", default=None)
    total_allocated: Union[int, float, None] = msgspec.field(name="Total Allocated", default=None)
    total_reserved: Union[int, float, None] = msgspec.field(name="Total Reserved", default=None)


class Event(msgspec.Struct):
    """One Chrome-trace event, as decoded. `ts`/`dur` are rewritten to relative microseconds on load."""

    ph: str = ""
    name: str = ""
    cat: str = ""
    ts: Union[int, float, None] = None
    dur: Union[int, float, None] = None
    pid: Union[int, str, None] = None
    tid: Union[int, str, None] = None
    args: Union[Args, None] = None

    @property
    def end(self) -> float:
        """End time in microseconds."""
        return self.ts + self.dur

    @property
    def external_id(self):
        """The id that links an operator, its runtime calls and its device activity."""
        a = self.args
        if a is None:
            return None
        return a.external_id if a.external_id is not None else a.external_id_old

    @property
    def correlation(self):
        """The id that links a runtime call to the device activity it launched."""
        return None if self.args is None else self.args.correlation


class DeviceProperties(msgspec.Struct):
    """An accelerator as described in `deviceProperties` (or legacy `computeProperties`)."""

    id: Union[int, str, None] = None
    name: str = ""
    totalGlobalMem: Union[int, float, None] = None
    computeMajor: Union[int, None] = None
    computeMinor: Union[int, None] = None
    major: Union[int, None] = None  # legacy `computeProperties`
    minor: Union[int, None] = None
    numSms: Union[int, None] = None


class TraceDocument(msgspec.Struct):
    """The top level of a Kineto trace file."""

    traceEvents: list[Event]
    deviceProperties: Union[list[DeviceProperties], None] = None
    computeProperties: Union[list[DeviceProperties], None] = None
    distributedInfo: Union[dict, None] = None
    displayTimeUnit: Union[str, None] = None
    traceTimeUnit: Union[str, None] = None


_DECODER = msgspec.json.Decoder(Union[TraceDocument, list[Event]])

# Both category vocabularies (and other accelerators' runtimes) mapped onto one set of kinds.
KIND_BY_CATEGORY = {
    "mtia_ccp_events": "kernel",  # Meta MTIA: work run by the accelerator's command processors
    "cpu_op": "op",
    "operator": "op",
    "user_annotation": "annotation",
    "gpu_user_annotation": "gpu_annotation",
    "python": "op",
    "python_function": "python_function",
    "kernel": "kernel",
    "memcpy": "memcpy",
    "gpu_memcpy": "memcpy",
    "memset": "memset",
    "gpu_memset": "memset",
    "runtime": "runtime",
    "cuda_runtime": "runtime",
    "cuda_driver": "runtime",
    "trace": "trace",
}


# Categories of device activity in the CUDA vocabulary, which ROCm and XPU traces share.
CUDA_DEVICE_CATEGORIES = frozenset({"kernel", "memcpy", "gpu_memcpy", "memset", "gpu_memset"})
CUDA_RUNTIME_CATEGORIES = frozenset({"runtime", "cuda_runtime", "cuda_driver"})
_OWN_DEVICE_SUFFIXES = {"_kernel": "kernel", "_memcpy": "memcpy", "_memset": "memset"}


@lru_cache(maxsize=None)
def kind_of(category: str) -> str | None:
    """The analysis kind of a trace category, or None for categories the analysis ignores."""
    c = category.lower()
    kind = KIND_BY_CATEGORY.get(c)
    if kind is None and (c.endswith("_runtime") or c.endswith("_driver")):
        kind = "runtime"  # hip/xpu/mtia/privateuse1 runtimes play the role CUDA's does
    if kind is None:
        # Accelerators with their own vocabulary (mlu_memcpy, gcu_kernel, ...) name device activity so.
        kind = next((k for suffix, k in _OWN_DEVICE_SUFFIXES.items() if c.endswith(suffix)), None)
    return kind


@lru_cache(maxsize=None)
def accelerator_of(category: str) -> str | None:
    """The accelerator a device-activity or runtime category belongs to: 'cuda' for the CUDA vocabulary
    (CUDA and ROCm traces), else the category's prefix ('mtia' for mtia_ccp_events), None for host ones."""
    c = category.lower()
    if c in CUDA_DEVICE_CATEGORIES or c in CUDA_RUNTIME_CATEGORIES:
        return "cuda"
    if kind_of(c) in ("kernel", "memcpy", "memset", "runtime") and "_" in c:
        return c.split("_", 1)[0]
    return None


@dataclass(frozen=True)
class Device:
    """An accelerator used in the trace."""

    index: int
    name: str
    vendor: str  # "nvidia" | "amd" | "intel" | another accelerator's name ("mtia") | "unknown"
    total_memory: int | None
    compute_capability: tuple[int, int] | None  # with described=False: the lowest the kernel names allow
    described: bool = True  # False: not in deviceProperties, recognised from the trace's events

    @property
    def capability_text(self) -> str:
        """'8.0'-style compute capability, or '' when unknown."""
        return "" if self.compute_capability is None else "%d.%d" % self.compute_capability


@dataclass(frozen=True)
class MemorySample:
    """One `[memory]` instant event: an allocation (bytes > 0) or a free (bytes < 0)."""

    ts: float
    device_type: int  # 0 = CPU, 1 = CUDA (Kineto's c10::DeviceType)
    device_id: int
    bytes: float
    total_allocated: float | None
    total_reserved: float | None


@dataclass
class Trace:
    """A parsed trace: host spans, device activity and memory events, in relative microseconds."""

    path: str
    steps: list[Event] = field(default_factory=list)  # ProfilerStep#N spans, sorted by start
    ops: list[Event] = field(default_factory=list)  # CPU ops, user annotations, python ops
    runtime: list[Event] = field(default_factory=list)
    kernels: list[Event] = field(default_factory=list)
    memcpys: list[Event] = field(default_factory=list)
    memsets: list[Event] = field(default_factory=list)
    memory: list[MemorySample] = field(default_factory=list)
    devices: list[Device] = field(default_factory=list)  # all devices the file describes (or its events show)
    # The accelerator the device activity ran on: "cuda" for the CUDA vocabulary (CUDA and ROCm), else the
    # prefix of the accelerator's own categories ("mtia"); None when the trace shows no accelerator.
    accelerator: str | None = None
    gpu_vocabulary: bool = False  # device activity in the CUDA vocabulary's categories (a GPU)
    distributed: dict | None = None
    origin_us: float = 0.0
    time_unit: str = "us"
    event_count: int = 0
    skipped: dict[str, int] = field(default_factory=dict)  # odd but legal events left out: reason → count

    @property
    def has_device_activity(self) -> bool:
        """True when the trace recorded kernels, copies or memsets on an accelerator."""
        return bool(self.kernels or self.memcpys or self.memsets)

    @property
    def used_device_ids(self) -> list[int]:
        """The accelerator ids that ran kernels or copies, from the events themselves."""
        ids = set()
        for e in self.kernels + self.memcpys + self.memsets:
            d = e.args.device if e.args is not None else None
            if d is None:
                d = e.pid
            if isinstance(d, int):
                ids.add(d)
        return sorted(ids)

    @property
    def used_devices(self) -> list[Device]:
        """Devices that ran something; all described devices when the events do not say."""
        ids = set(self.used_device_ids)
        used = [d for d in self.devices if d.index in ids]
        return used or ([] if ids or not self.has_device_activity else self.devices[:1])


def trace_files(path: Path) -> list[Path]:
    """The trace files a path names: the file itself, or every trace file under a folder."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise TraceError(path, describe_os_error(exc)) from None
    except ValueError as exc:  # a NUL in the name
        raise TraceError(path, f"not a usable path ({exc})") from None
    if stat.S_ISREG(mode):
        return [path]
    if not stat.S_ISDIR(mode):
        raise TraceError(path, "not a regular file or a folder (a FIFO, socket or device)")
    found = sorted(p for p in path.rglob("*") if p.name.endswith(TRACE_SUFFIXES)
                   and p.name not in ("trial.json", "session.json") and _listed_file(p))
    if not found:
        raise TraceError(path, "folder contains no .json or .json.gz trace files")
    return found


def _listed_file(path: Path) -> bool:
    """A regular file found in a folder; one that cannot be looked at is kept, so that reading it says why."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except PermissionError:
        return True
    except OSError:
        return False


_prefetched: dict[Path, tuple[threading.Thread, list]] = {}


def prefetch(path: Path) -> None:
    """Start reading (and gunzipping) a trace file on a background thread.

    zlib releases the GIL, so the CLI can import the analysis modules meanwhile; `read_bytes` picks the
    result up (or re-raises its error).
    """
    path = Path(path)
    if not is_regular(path):
        return
    box: list = []

    def work():
        try:
            box.append(_read_bytes(path))
        except BaseException as exc:  # handed to the reader on the main thread
            box.append(exc)

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    _prefetched[path] = (thread, box)


def read_bytes(path: Path) -> bytes:
    """The JSON text of a trace file, gunzipped if needed, with clear errors for broken files."""
    pending = _prefetched.pop(Path(path), None)
    if pending is None:
        return _read_bytes(path)
    thread, box = pending
    thread.join()
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]


# How far a .json.gz may inflate: at most MAX_INFLATION times its own size (real traces inflate 10 to 31
# times), and any file at least INFLATED_FLOOR bytes. A gzip bomb (2 MB inflating to 2 GiB) is refused
# after inflating the bound, not read whole. ADVISOR_MAX_TRACE_BYTES (a byte count) replaces the bound.
MAX_INFLATION = 100
INFLATED_FLOOR = 256 * 2**20
MAX_TRACE_BYTES_ENV = "ADVISOR_MAX_TRACE_BYTES"


def inflated_limit(path: Path, compressed_size: int) -> int:
    """The most bytes a gzipped trace of `compressed_size` bytes may inflate to (see MAX_INFLATION)."""
    given = os.environ.get(MAX_TRACE_BYTES_ENV)
    if given:
        try:
            limit = int(given)
        except ValueError:
            limit = -1
        if limit <= 0:
            raise TraceError(path, f"{MAX_TRACE_BYTES_ENV}={given!r} is not a positive number of bytes")
        return limit
    return max(INFLATED_FLOOR, MAX_INFLATION * compressed_size)


def _read_bytes(path: Path) -> bytes:
    try:
        raw = read_regular(path)
    except OSError as exc:
        problem = describe_os_error(exc)
        if not isinstance(exc, (NotARegularFile, FileNotFoundError)):
            problem = f"cannot read: {problem}"
        raise TraceError(path, problem) from None
    except ValueError as exc:
        raise TraceError(path, f"not a usable path ({exc})") from None
    if not raw:
        raise TraceError(path, "empty file")
    if raw[:2] == b"\x1f\x8b":
        raw = inflate(path, raw, inflated_limit(path, len(raw)))
        if not raw:
            raise TraceError(path, "empty file (gzip of nothing)")
    elif path.name.endswith(".gz"):
        raise TraceError(path, "not gzip data, although the name ends in .gz")
    return raw


def inflate(path: Path, raw: bytes, limit: int) -> bytes:
    """Gunzip `raw` (one or more gzip members), refusing as soon as the output would pass `limit` bytes."""
    parts: list[bytes] = []
    total = 0
    data = raw
    while True:
        inflater = zlib.decompressobj(wbits=31)
        try:
            part = inflater.decompress(data, limit + 1 - total)  # stops after limit + 1 bytes
        except zlib.error as exc:
            raise TraceError(path, f"corrupt gzip data ({exc})") from None
        total += len(part)
        if total > limit:
            bound = (f"{MAX_TRACE_BYTES_ENV} allows {limit:,}" if os.environ.get(MAX_TRACE_BYTES_ENV) else
                     f"the bound is {MAX_INFLATION}× the file's size or {INFLATED_FLOOR // 2**20} MiB, whichever is "
                     f"larger; {MAX_TRACE_BYTES_ENV} sets another")
            raise TraceError(path, f"refused to inflate: the gzip data of {len(raw):,} bytes inflates to more than "
                                   f"{limit:,} bytes ({bound})")
        parts.append(part)
        if not inflater.eof:
            raise TraceError(path, "truncated gzip data (the file ends before the gzip stream does)")
        data = inflater.unused_data
        if not data.strip(b"\0"):  # the end, or the zero padding some tools leave after the stream
            break
        if data[:2] != b"\x1f\x8b":
            raise TraceError(path, "corrupt gzip data (bytes after the end of the gzip stream)")
    return parts[0] if len(parts) == 1 else b"".join(parts)


def decode(path: Path, raw: bytes) -> TraceDocument:
    """Decode JSON bytes into a TraceDocument, naming the problem (and the event) when the shape is wrong."""
    try:
        doc = _DECODER.decode(raw)
    except msgspec.ValidationError as exc:
        raise NotATrace(path, f"not a torch.profiler trace: {_event_of_error(raw, str(exc))}{exc}") from None
    except msgspec.DecodeError as exc:
        text = str(exc)
        if "truncated" in text:
            raise TraceError(path, "truncated JSON (the file ends in the middle of the document)") from None
        raise NotATrace(path, f"not valid JSON ({text})") from None
    except UnicodeDecodeError:
        raise NotATrace(path, f"not valid JSON ({_not_utf8(raw)})") from None
    except RecursionError:
        raise NotATrace(path, "not valid JSON for this reader (arrays or objects nested too deeply)") from None
    if isinstance(doc, list):  # Chrome's "JSON Array Format": a bare list of events
        doc = TraceDocument(traceEvents=doc)
    return doc


def _not_utf8(raw: bytes) -> str:
    """'not UTF-8 text: byte 0xff at offset 57' (msgspec's own offsets count from the string, not the file)."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"not UTF-8 text: byte 0x{raw[exc.start]:02x} at offset {exc.start}"
    return "not UTF-8 text"


_EVENT_IN_PATH = re.compile(r"`\$(?:\.traceEvents)?\[(\d+)\]")


def _event_of_error(raw: bytes, message: str) -> str:
    """'event 12 ('aten::mm'): ' for a validation error inside an event, so the user can find it; '' otherwise.

    Only on the error path, and only for files small enough to decode a second time without types."""
    found = _EVENT_IN_PATH.search(message)
    if found is None:
        return ""
    index = int(found.group(1))
    name = None
    if len(raw) <= 64 * 2**20:
        import json  # the standard library's reader: it also reads numbers msgspec calls out of range

        try:
            doc = json.loads(raw)
            events = doc.get("traceEvents") if isinstance(doc, dict) else doc
            event = events[index] if isinstance(events, list) and index < len(events) else None
            name = event.get("name") if isinstance(event, dict) else None
        except (ValueError, RecursionError):
            pass
    return f"event {index} ({name!r}): " if isinstance(name, str) else f"event {index}: "


def _time_scale(doc: TraceDocument, events: list[Event]) -> tuple[float, str]:
    """Microseconds per trace time unit. Chrome traces use microseconds; some writers use nanoseconds."""
    unit = (doc.traceTimeUnit or "").lower()
    if unit == "ns":
        return 0.001, "ns"
    # Wall-clock timestamps in ns are > 1e17 (2001 onwards); in microseconds they stay below 1e17
    # until the year 5138. Relative ns timestamps cannot be told apart and are taken as microseconds.
    for e in events[:1000]:
        if e.ts is not None and e.ts > 1e17:
            return 0.001, "ns"
    return 1.0, "us"


def _devices(path: Path | str, doc: TraceDocument, runtime_names: set[str], kernel_kinds: set[str]) -> list[Device]:
    key = "deviceProperties" if doc.deviceProperties else "computeProperties"
    props = doc.deviceProperties or doc.computeProperties or []
    amd_events = any(n.startswith("hip") for n in runtime_names) or "Dispatch Kernel" in kernel_kinds
    devices = []
    for i, p in enumerate(props):
        name = p.name or ""
        lowered = name.lower()
        if any(k in lowered for k in ("amd", "radeon", "instinct")) or amd_events:
            vendor = "amd"
        elif "intel" in lowered:
            vendor = "intel"
        elif name:
            vendor = "nvidia"
        else:
            vendor = "unknown"
        major = p.computeMajor if p.computeMajor is not None else p.major
        minor = p.computeMinor if p.computeMinor is not None else p.minor
        if not all(v is None or 0 <= v < 100 for v in (major, minor)):
            raise TraceError(path, f"{key}[{i}] has compute capability {major}.{minor}, not a real one")
        if not _size(p.totalGlobalMem):
            raise TraceError(path, f"{key}[{i}] has 'totalGlobalMem': {p.totalGlobalMem}, not a memory size")
        cap = (int(major), int(minor or 0)) if major is not None else None
        index = p.id if isinstance(p.id, int) else i
        total = int(p.totalGlobalMem) if p.totalGlobalMem else None
        devices.append(Device(index=index, name=name, vendor=vendor, total_memory=total, compute_capability=cap))
    return devices


# Kernel names say which vendor's libraries built them, and for NVIDIA the architecture they were compiled
# for (a kernel built for sm_X runs on X or newer, so the device is at least the newest X seen).
NVIDIA_KERNEL = re.compile(r"^(?:void )?(?:volta|turing|ampere|hopper|sm_?\d{2,3}a?)_|cutlass|cudnn|cublas|nvjet|xmma")
AMD_KERNEL = re.compile(r"^Cijk_|rocblas|miopen|hipblaslt|_MI\d+x\d+x\d+", re.IGNORECASE)
NVIDIA_ARCHITECTURES = (("volta_", (7, 0)), ("turing_", (7, 5)), ("ampere_", (8, 0)), ("hopper_", (9, 0)))
SM_IN_NAME = re.compile(r"(?:^|[^a-z0-9])sm_?(\d{2,3})a?(?![0-9])|cutlass_(\d{2,3})_")


def vendor_from_names(runtime_names: set[str], kernel_names: set[str]) -> str:
    """'nvidia', 'amd' or 'unknown', from runtime call names (hip*, cuda*) and kernel names."""
    if any(n.startswith("hip") for n in runtime_names) or any(AMD_KERNEL.search(n) for n in kernel_names):
        return "amd"
    if any(n.startswith("cu") for n in runtime_names) or any(NVIDIA_KERNEL.search(n) for n in kernel_names):
        return "nvidia"
    return "unknown"


def capability_from_names(kernel_names: set[str]) -> tuple[int, int] | None:
    """The lowest NVIDIA compute capability the kernel names allow (volta_ → 7.0, sm90_ → 9.0), or None."""
    found = []
    for name in kernel_names:
        found += [cap for prefix, cap in NVIDIA_ARCHITECTURES if name.startswith(prefix)]
        for m in SM_IN_NAME.finditer(name):
            digits = m.group(1) or m.group(2)  # "80" → 8.0, "100" → 10.0
            found.append((int(digits[:-1]), int(digits[-1])))
    return max(found, default=None)


def _devices_from_events(trace: Trace, kernel_names: set[str]) -> list[Device]:
    """Devices the events show when the file describes none: vendor and architecture from names."""
    if not trace.has_device_activity:
        return []
    if trace.accelerator not in (None, "cuda"):
        vendor, cap = trace.accelerator, None
    else:
        vendor = vendor_from_names({e.name for e in trace.runtime}, kernel_names)
        cap = capability_from_names(kernel_names) if vendor == "nvidia" else None
        if vendor == "unknown":
            return []
    return [Device(index=i, name="", vendor=vendor, total_memory=None, compute_capability=cap, described=False)
            for i in (trace.used_device_ids or [0])]


def _as_int(value, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


# Bounds beyond which a trace's numbers cannot be real, and figures computed from them would be nonsense
# (300-digit step times): no event lasts, or lies from the trace's median time, more than a week; no copy,
# allocation or device memory is larger than an exbibyte.
MAX_SPAN_US = 7 * 24 * 3600 * 1e6
MAX_BYTES = 2**60


def _floats(events: list[Event], name: str):
    """One time field of the events as a float array: None → NaN, an integer too large for a float → inf."""
    import numpy as np

    try:
        return np.fromiter(map(attrgetter(name), events), float, len(events))
    except (TypeError, OverflowError):  # a missing time, or a huge integer: the slow way, value by value
        values = map(attrgetter(name), events)
        return np.array([v if v is None or abs(v) < 1e308 else float("inf") for v in values], dtype=float)


def _low_median(values) -> float:
    """The lower median: one of the values themselves, so that of two times the later one is the outlier."""
    import numpy as np

    if values.size == 0:
        return 0.0
    k = (values.size - 1) // 2
    return float(np.partition(values, k)[k])


def _first_in_file(events: list[Event], candidates: list[Event]) -> tuple[int, Event]:
    """(index in the file, event) of the candidate that comes first in the file."""
    position = {id(e): i for i, e in enumerate(events)}
    e = min(candidates, key=lambda c: position[id(c)])
    return position[id(e)], e


def _check_times(path: Path | str, events: list[Event], timed: list[Event], memory_events: list[Event],
                 scale: float) -> None:
    """TraceError naming the first event (in file order) whose times the analysis cannot use: no 'ts' or
    'dur', a negative duration, one longer than MAX_SPAN_US, a time further than that from the rest."""
    # numpy is imported here, not with the module: the CLI imports this module to start reading the file on
    # a thread, and numpy's import runs meanwhile only if it comes after.
    import numpy as np

    with np.errstate(invalid="ignore", over="ignore"):
        ts = np.concatenate([_floats(timed, "ts"), _floats(memory_events, "ts")]) * scale
        dur = np.concatenate([_floats(timed, "dur"), np.zeros(len(memory_events))]) * scale
        finite = np.isfinite(ts) & np.isfinite(dur)
        center = _low_median(ts[finite])
        bad = ~finite | (dur < 0) | (dur > MAX_SPAN_US) | (np.abs(ts - center) > MAX_SPAN_US)
    if bad.any():
        everyone = timed + memory_events
        i, e = _first_in_file(events, [everyone[k] for k in np.flatnonzero(bad)])
        if e.name == "[memory]" and e.ph == "i":
            problem = "has no 'ts'" if e.ts is None else f"has a time far from the rest of the trace (ts {e.ts})"
            raise TraceError(path, f"event {i} ([memory]) {problem}")
        if e.ts is None or e.dur is None:
            missing = "ts" if e.ts is None else "dur"
            raise TraceError(path, f"event {i} ({e.name!r}) is a complete event without '{missing}'")
        if e.dur < 0:
            problem = f"has a negative duration (dur {e.dur})"
        elif e.dur * scale > MAX_SPAN_US or not np.isfinite(float(e.dur) * scale):
            problem = f"lasts longer than a week (dur {e.dur})"
        else:
            problem = f"lies more than a week from the rest of the trace (ts {e.ts})"
        raise TraceError(path, f"event {i} ({e.name!r}) {problem}")
    if not (dur > 0).any() and np.ptp(ts[:len(timed)]) == 0:
        raise TraceError(path, "its events span no time (each lasts 0 µs, all at one moment): nothing to analyse")


def _check_sizes(path: Path | str, events: list[Event], memory_events: list[Event], memcpys: list[Event]) -> None:
    """TraceError naming the first event whose byte counts are negative (but for freed bytes) or beyond
    MAX_BYTES: a copy's bytes, an allocation's bytes, the allocator's totals."""
    bad = []
    for e in memory_events:
        a = e.args
        if a is not None and not (_size(a.alloc_bytes, signed=True) and _size(a.total_allocated)
                                  and _size(a.total_reserved)):
            bad.append(e)
    bad += [e for e in memcpys if e.args is not None and not _size(e.args.bytes)]
    if bad:
        i, e = _first_in_file(events, bad)
        a = e.args
        fields = {"Bytes": a.alloc_bytes, "Total Allocated": a.total_allocated, "Total Reserved": a.total_reserved,
                  "bytes": a.bytes}
        key = next(k for k, v in fields.items() if not _size(v, signed=k == "Bytes"))
        raise TraceError(path, f"event {i} ({e.name!r}) has '{key}': {fields[key]}, not a byte count")


def _size(value, signed: bool = False) -> bool:
    """A byte count the analysis can use: absent, or a number within ±MAX_BYTES (negative only if signed)."""
    return value is None or ((-MAX_BYTES if signed else 0) <= value <= MAX_BYTES)


def _usable_steps(steps: list[Event], skipped: dict[str, int]) -> list[Event]:
    """ProfilerStep spans that can be steps: those of zero length, and those that start before the step
    before ends (steps are disjoint spans), are left out and counted in `skipped`."""
    kept: list[Event] = []
    for e in steps:
        if e.dur <= 0:
            reason = "ProfilerStep# spans of zero length"
        elif kept and e.ts < kept[-1].ts + kept[-1].dur:
            reason = "ProfilerStep# spans that overlap the step before"
        else:
            kept.append(e)
            continue
        skipped[reason] = skipped.get(reason, 0) + 1
    return kept


def build_trace(path: Path | str, doc: TraceDocument) -> Trace:
    """Sort a decoded document into a Trace: kinds, relative microseconds, devices, memory samples."""
    events = doc.traceEvents
    scale, unit = _time_scale(doc, events)
    trace = Trace(path=str(path), distributed=doc.distributedInfo, time_unit=unit, event_count=len(events))
    buckets = {"op": trace.ops, "annotation": trace.ops, "runtime": trace.runtime, "kernel": trace.kernels,
               "memcpy": trace.memcpys, "memset": trace.memsets}
    bucket_of_category: dict = {}  # category -> list to append to, or None to skip; filled as met
    steps = trace.steps
    memory_events = []
    for e in events:
        ph = e.ph
        if ph == "X":
            cat = e.cat
            bucket = bucket_of_category.get(cat, False)
            if bucket is False:
                bucket = bucket_of_category[cat] = buckets.get(kind_of(cat))
            if bucket is None:
                continue
            if bucket is trace.ops and e.name.startswith("ProfilerStep#"):
                bucket = steps
            bucket.append(e)
        elif ph == "i" and e.name == "[memory]":
            memory_events.append(e)
    timed = steps + trace.ops + trace.runtime + trace.kernels + trace.memcpys + trace.memsets
    if not timed:
        raise NotATrace(path, f"no events the analysis can use: none of its {len(events)} events is a complete "
                              "('ph': 'X') event of a known category (operators, runtime calls, kernels, copies)")
    # Checked once over the kept events, vectorized, not inside the loop above.
    _check_times(path, events, timed, memory_events, scale)
    _check_sizes(path, events, memory_events, trace.memcpys)
    origin = 0
    if scale != 1.0:
        # Integer nanoseconds since the epoch do not fit a float exactly: subtract the (integer) origin
        # first, exactly, then scale. Microsecond timestamps fit a float as they are.
        origin = min(e.ts for e in timed + memory_events)
        for e in timed:
            e.ts = (e.ts - origin) * scale
            e.dur = e.dur * scale
    trace.origin_us = origin * scale
    for e in memory_events:
        a = e.args or Args()
        trace.memory.append(MemorySample(
            ts=(e.ts - origin) * scale,
            device_type=_as_int(a.device_type, 0),
            device_id=_as_int(a.device_id, -1),
            bytes=float(a.alloc_bytes or 0),
            total_allocated=None if a.total_allocated is None else float(a.total_allocated),
            total_reserved=None if a.total_reserved is None else float(a.total_reserved),
        ))
    for group in (trace.steps, trace.runtime, trace.kernels, trace.memcpys, trace.memsets):
        group.sort(key=_start)
    trace.ops.sort(key=_start_outer_first)
    trace.steps[:] = _usable_steps(trace.steps, trace.skipped)
    runtime_names = {e.name for e in trace.runtime}
    kernel_kinds = {e.args.kind for e in trace.kernels[:50] if e.args is not None and e.args.kind}
    trace.accelerator, trace.gpu_vocabulary = _accelerator(bucket_of_category)
    trace.devices = _devices(path, doc, runtime_names, kernel_kinds)
    if not trace.devices:
        trace.devices = _devices_from_events(trace, {e.name for e in trace.kernels})
    return trace


def _accelerator(bucket_of_category: dict) -> tuple[str | None, bool]:
    """(accelerator, device activity in the CUDA vocabulary) from the categories of the kept events.

    An accelerator's own categories name it (mtia_ccp_events, xpu_runtime); the CUDA vocabulary, which
    ROCm shares, is 'cuda'. Runtime calls alone name an accelerator only when they are not CUDA's: a
    CPU run may still call cudaGetDeviceCount.
    """
    device, runtime = set(), set()
    for category, bucket in bucket_of_category.items():
        if bucket is None:
            continue
        kind = kind_of(category)
        (runtime if kind == "runtime" else device if kind in ("kernel", "memcpy", "memset") else set()).add(
            accelerator_of(category))
    gpu_vocabulary = "cuda" in device
    own = sorted(a for a in device | runtime if a not in (None, "cuda"))
    return (own[0] if own else "cuda" if gpu_vocabulary else None), gpu_vocabulary


def _start(e: Event) -> float:
    return e.ts


def _start_outer_first(e: Event) -> tuple[float, float]:
    # An operator and its first child can start at the same time: the enclosing (longer) one first.
    return (e.ts, -e.dur)


def load_trace(path: Path | str) -> Trace:
    """Read one trace file (.json or .json.gz) into a Trace; raise TraceError naming the problem."""
    path = Path(path)
    raw = read_bytes(path)
    with collector_paused():
        doc = decode(path, raw)
        del raw
        if not doc.traceEvents:
            raise TraceError(path, "trace has no events ('traceEvents' is empty)")
        return build_trace(path, doc)


@contextmanager
def collector_paused():
    """Pause the cyclic garbage collector: a trace is hundreds of thousands of small acyclic objects,
    which the collector would only rescan again and again while they are created and analysed."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
