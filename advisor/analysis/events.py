"""The events of a Kineto trace file, decoded with msgspec, and the kinds the analysis sorts them into.

Decoding is typed: only the fields the analysis needs are materialized, which is what makes a 54 MB
trace load faster and in less memory than `json.load`. Events are decoded by phase (a tagged union on
'ph'): complete events and instants with their fields, the other phases (flows, metadata) with their time
only. Both category vocabularies (old: `Operator`, `Kernel`, `Runtime`, `Memcpy`, `Memset`; new: `cpu_op`,
`kernel`, `cuda_runtime`, `gpu_memcpy`, ...) and other accelerators' own categories map onto one set of
kinds (`kind_of`).
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterator, Union

import msgspec

from advisor.analysis.reading import Unclean
from advisor.errors import NotATrace, TraceError

class EventArgs(msgspec.Struct, gc=False):
    """The arguments of a complete event that the analysis reads; everything else in `args` is skipped while
    decoding."""

    external_id: Union[int, str, None] = msgspec.field(name="External id", default=None)
    external_id_old: Union[int, str, None] = msgspec.field(name="external id", default=None)
    correlation: Union[int, str, None] = None
    device: Union[int, str, None] = None
    bytes: Union[int, float, None] = None
    kind: Union[str, None] = None
    # Shapes, strides and dtypes of an operator's inputs: kept undecoded (Raw), read only for collectives' sizes
    # and the layout of convolutions' inputs, so that the thousands of other operators that carry them cost no lists.
    input_dims: msgspec.Raw = msgspec.field(name="Input Dims", default=msgspec.Raw(b""))
    input_strides: msgspec.Raw = msgspec.field(name="Input Strides", default=msgspec.Raw(b""))
    input_type: msgspec.Raw = msgspec.field(name="Input type", default=msgspec.Raw(b""))


def input_lists(args: EventArgs | None, *fields: str) -> tuple[list, ...] | None:
    """An operator's input lists that these `EventArgs` fields hold ("Input Dims", "Input Strides", "Input
    type"), decoded; None where the trace did not record one of them or it cannot be read."""
    raws = [getattr(args, f) for f in fields] if args is not None else []
    if not raws or not all(raws):
        return None
    try:
        return tuple(msgspec.json.decode(raw) for raw in raws)
    except msgspec.DecodeError:
        return None


class MemoryArgs(msgspec.Struct, gc=False):
    """The arguments of a `[memory]` instant that the analysis reads: the allocator's event."""

    device_type: Union[int, str, None] = msgspec.field(name="Device Type", default=None)
    device_id: Union[int, str, None] = msgspec.field(name="Device Id", default=None)
    alloc_bytes: Union[int, float, None] = msgspec.field(name="Bytes", default=None)
    total_allocated: Union[int, float, None] = msgspec.field(name="Total Allocated", default=None)
    total_reserved: Union[int, float, None] = msgspec.field(name="Total Reserved", default=None)


class Args(EventArgs):
    """Both kinds of arguments, for a `LooseEvent` (whose phase is not known while it is decoded)."""

    device_type: Union[int, str, None] = msgspec.field(name="Device Type", default=None)
    device_id: Union[int, str, None] = msgspec.field(name="Device Id", default=None)
    alloc_bytes: Union[int, float, None] = msgspec.field(name="Bytes", default=None)
    total_allocated: Union[int, float, None] = msgspec.field(name="Total Allocated", default=None)
    total_reserved: Union[int, float, None] = msgspec.field(name="Total Reserved", default=None)


class Event(msgspec.Struct, gc=False, tag_field="ph", tag="X"):
    """One complete ('ph': 'X') Chrome-trace event, as decoded. `ts`/`dur` are rewritten to relative microseconds
    on load. Its phase is its class (`ph`): `Instant` for 'i', `Unused` for the phases the analysis does not read;
    a trace that this typing does not fit is decoded again as `LooseEvent`s (see `decode`)."""

    name: str = ""
    cat: str = ""
    ts: Union[int, float, None] = None
    dur: Union[int, float, None] = None
    pid: Union[int, str, None] = None
    tid: Union[int, str, None] = None
    args: Union[EventArgs, None] = None

    @property
    def ph(self) -> str:
        """The event's phase ('X', 'i', ...)."""
        return self.__struct_config__.tag

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


class Instant(msgspec.Struct, gc=False, tag_field="ph", tag="i"):
    """An instant ('ph': 'i') event: the analysis reads the `[memory]` ones, their name, time and, of their
    arguments, the allocator's (a struct of five fields rather than the thirteen of `Args`); not their category,
    process or thread, which would be three more objects each of the 28,000 in a trace that records memory."""

    name: str = ""
    ts: Union[int, float, None] = None
    args: Union[MemoryArgs, None] = None

    @property
    def ph(self) -> str:
        """The event's phase."""
        return self.__struct_config__.tag


class Unused(msgspec.Struct, gc=False, tag_field="ph"):
    """An event of a phase the analysis does not read (flows, metadata, counters, ...): only its time is decoded
    (`ts`, which tells microseconds from nanoseconds), not its names or arguments: a third of a Kineto trace's
    events are the flow events that link runtime calls to kernels, which the analysis links by correlation id."""

    ts: Union[int, float, None] = None

    @property
    def ph(self) -> str:
        """The event's phase."""
        return self.__struct_config__.tag


# The other phases of the Chrome trace format, a class each (a tagged union is decoded by its tag), named in
# this module so that pickle finds them.
UNUSED_PHASES = "BEIbnesStTpFfPNODMCVvRc()"
UNUSED = tuple(type(f"Unused_{i}", (Unused,), {"__doc__": Unused.__doc__, "__module__": __name__}, tag=ph)
               for i, ph in enumerate(UNUSED_PHASES))
globals().update((cls.__name__, cls) for cls in UNUSED)
# Any event of a trace, by its phase (a tuple in the subscript: `Union[A, *B]` is Python 3.11's syntax only).
AnyEvent = Union[(Event, Instant, *UNUSED)]


class LooseEvent(Event, tag=False):
    """Any Chrome-trace event, its phase a field: what a trace is decoded as when its events do not all fit the
    tagged classes above (an event without 'ph', or of a phase the format does not have)."""

    ph: str = ""
    args: Union[Args, None] = None


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

    traceEvents: list[AnyEvent]
    deviceProperties: Union[list[DeviceProperties], None] = None
    computeProperties: Union[list[DeviceProperties], None] = None
    distributedInfo: Union[dict, None] = None
    displayTimeUnit: Union[str, None] = None
    traceTimeUnit: Union[str, None] = None


class LooseDocument(TraceDocument):
    """A trace file whose events are decoded as `LooseEvent`s."""

    traceEvents: list[LooseEvent]


_DECODER = msgspec.json.Decoder(Union[TraceDocument, list[AnyEvent]])
_DOCUMENT_DECODER = msgspec.json.Decoder(TraceDocument)
_EVENTS_DECODER = msgspec.json.Decoder(list[AnyEvent])
_LOOSE_DECODER = msgspec.json.Decoder(Union[LooseDocument, list[LooseEvent]])


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


def decode(path: Path, raw: bytes) -> TraceDocument:
    """Decode JSON bytes into a TraceDocument, naming the problem (and the event) when the shape is wrong.

    Its events are decoded by phase (`Event`, `Instant`, `Unused`), which skips what the analysis never reads;
    a document that does not fit (or is no JSON at all) is decoded again as `LooseEvent`s, as the analysis did
    before it decoded by phase, and its errors named so."""
    try:
        doc = _DECODER.decode(raw)
    except (msgspec.MsgspecError, UnicodeDecodeError, RecursionError):
        doc = loose_decode(path, raw)
    if isinstance(doc, list):  # Chrome's "JSON Array Format": a bare list of events
        doc = TraceDocument(traceEvents=doc)
    return doc


# Where a trace's events begin: the key of the top-level object (`decode_pieces` checks that it is), and where
# Kineto ends one event and starts the next.
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_BETWEEN_EVENTS = b"},\n  {"
_HEAD_BYTES = 16 * 2**20  # the most text before the events, or in one event, that `decode_pieces` holds


def decode_pieces(path: Path, pieces: Iterator[bytes], sink: Callable[[list], None] | None = None
                  ) -> tuple[TraceDocument, int] | None:
    """(the document, the length of its text) decoded from its JSON text in pieces (`reading.inflated_pieces`),
    each run of whole events as it arrives (and handed to `sink`, in file order, while its events are still in
    the processor's cache: `sorting.EventSorter.add`); None where the text does not split so (the caller
    decodes it whole, as `decode`, which also names any problem).

    The text is cut only between two events of the top-level 'traceEvents' array, and every run of events and
    the rest of the document decode on their own, which they can only where the cuts lie between events: a
    cut inside an event or a string leaves brackets or quotes open. The document is the same as `decode`'s."""
    try:
        return _decode_pieces(pieces, sink or _ignore)
    except (Unclean, msgspec.MsgspecError, UnicodeDecodeError, RecursionError):
        return None
    finally:
        close = getattr(pieces, "close", None)
        if close is not None:
            close()


def _ignore(events: list) -> None:
    pass


def _decode_pieces(pieces: Iterator[bytes], sink: Callable[[list], None]) -> tuple[TraceDocument, int] | None:
    # Each run is decoded from bytes of its own: an event's undecoded arguments (msgspec.Raw) keep them alive.
    held, held_bytes, size, head, events = [], 0, 0, None, []  # held: the text not decoded yet, in parts
    for piece in pieces:
        size += len(piece)
        if head is None:
            piece = b"".join((*held, piece))
            found = _EVENTS_KEY.search(piece)
            if found is None:
                held, held_bytes = [piece], len(piece)
                if held_bytes > _HEAD_BYTES:
                    return None
                continue
            head = piece[:found.end() - 1]
            _DOCUMENT_DECODER.decode(head + b"[]}")  # the key is the top-level object's (no bracket left open)
            piece, held, held_bytes = piece[found.end():], [b"["], 1
        cut = piece.rfind(_BETWEEN_EVENTS)
        if cut < 0:
            held.append(piece)
            held_bytes += len(piece)
            if held_bytes > _HEAD_BYTES:
                return None
            continue
        view = memoryview(piece)
        run = _EVENTS_DECODER.decode(b"".join((*held, view[:cut + 1], b"]")))
        sink(run)
        events += run
        held = [b"[", view[cut + 2:]]  # from after the comma
        held_bytes = 1 + len(held[1])
    if head is None:
        return None
    rest = b"".join((head, *held))
    if rest.find(b'"traceEvents"', len(head)) >= 0:  # the key again after the events? the last one counts
        return None
    doc = _DOCUMENT_DECODER.decode(rest)
    sink(doc.traceEvents)
    events += doc.traceEvents
    doc.traceEvents = events
    return doc, size


def loose_decode(path: Path, raw: bytes) -> LooseDocument | list[LooseEvent]:
    """The document decoded with `LooseEvent`s, naming the problem where even that does not fit."""
    try:
        return _LOOSE_DECODER.decode(raw)
    except msgspec.ValidationError as exc:
        raise NotATrace(path, f"not a torch.profiler trace: {_event_of_error(raw, str(exc))}{exc}") from None
    except msgspec.DecodeError as exc:
        text = str(exc)
        if "truncated" in text:
            raise TraceError(path, "truncated JSON (the file ends in the middle of the document)") from None
        if "UTF-8" in text:  # msgspec says so as a DecodeError or a UnicodeDecodeError, by its path: one message
            raise NotATrace(path, f"not valid JSON ({_not_utf8(raw)})") from None
        raise NotATrace(path, f"not valid JSON ({text})") from None
    except UnicodeDecodeError:
        raise NotATrace(path, f"not valid JSON ({_not_utf8(raw)})") from None
    except RecursionError:
        raise NotATrace(path, "not valid JSON for this reader (arrays or objects nested too deeply)") from None


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
