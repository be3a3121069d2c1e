"""Reading trace files: which files a path names, their bytes, gunzipped within a bound.

Only regular files are opened (a FIFO in a folder of traces is refused, not waited on), and a `.json.gz`
may inflate to a bounded size only (`inflated_limit`): a gzip bomb is refused after inflating the bound,
not read whole; it is inflated in pieces (`inflated_pieces`), which `events.decode_pieces` decodes as they
come. Nothing here decodes JSON: `prefetch` starts reading on a thread while the CLI imports the rest of
the analysis, so this module imports nothing else (the standard library, and advisor's errors and files).
"""

from __future__ import annotations

import os
import queue
import stat
import threading
import zlib
from pathlib import Path
from typing import Iterator

from advisor.errors import TraceError
from advisor.files import NotARegularFile, describe_os_error, is_regular, read_regular

try:  # ISA-L's inflate (python-isal): two to three times zlib's speed on traces; zlib where it is not installed
    from isal import isal_zlib as fast_zlib
except ImportError:  # pragma: no cover - isal is a dependency; a build without its wheel still reads traces
    fast_zlib = None
# ADVISOR_INFLATE=zlib reads with zlib alone (the fallback, and how the tests hold the two to one result).
INFLATE_ENV = "ADVISOR_INFLATE"

TRACE_SUFFIXES = (".json", ".json.gz")


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


_prefetched: dict[Path, tuple[threading.Event, list]] = {}
GZIP_MAGIC = b"\x1f\x8b"
# How many pieces of JSON text (`PIECE_BYTES` each) the prefetch's thread inflates ahead of the reader: a
# bound on the text held at once, so that the memory of the pieces decoded is used again for the next.
PIECES_AHEAD = 16
PREFETCH_THREAD = "advisor-prefetch"


def prefetch(path: Path, heap: bool = False) -> None:
    """Start reading a trace file, and inflating its JSON text in pieces, on a background thread.

    zlib (and ISA-L) release the GIL: the CLI imports the analysis modules meanwhile, and then decodes each
    piece while the thread inflates the next ones, on another core where there is one. `read_file` picks the
    pieces up (or re-raises the error that stopped them). With `heap`, a second thread touches the heap the
    reader will grow (`touch_heap`): for a process whose threads share one heap (`cli.keep_freed_blocks`).
    """
    path = Path(path)
    if not is_regular(path):
        return
    box: list = []  # the stored bytes, or the error that stopped their reading; then, gzipped, the Pieces
    ready = threading.Event()

    def work():
        try:
            raw = _stored_bytes(path)
        except BaseException as exc:  # handed to the reader on the main thread
            box.append(exc)
            ready.set()
            return
        box.append(raw)
        if raw[:2] != GZIP_MAGIC:
            ready.set()
            return
        pieces = Pieces()
        box.append(pieces)
        ready.set()
        try:
            for piece in inflated_pieces(path, raw):
                if not pieces.hand(piece):
                    return
        except BaseException as exc:  # noqa: BLE001 - raised to the reader after the pieces before it
            pieces.hand(exc)
            return
        pieces.hand(Pieces.END)

    def touch():
        ready.wait()
        if isinstance(box[0], bytes) and box[0][:2] == GZIP_MAGIC:
            touch_heap(min(HEAP_BOUND, int(HEAP_PER_TEXT_BYTE * int.from_bytes(box[0][-4:], "little"))))

    threading.Thread(target=work, name=PREFETCH_THREAD, daemon=True).start()
    if heap:
        threading.Thread(target=touch, name="advisor-touch-heap", daemon=True).start()
    _prefetched[path] = (ready, box)


# A reader of a gzipped trace grows glibc's heap by about 0.4 bytes per byte of its JSON text (21 MB for the 54 MB
# test trace: the lists of its events, the columns, the figures' arrays), each page of it faulted in when first
# touched (2 to 3 µs each on the machines here: a twentieth of the trace's reading). A gzip file ends with the
# size of its text (of its last member; modulo 4 GiB).
HEAP_PER_TEXT_BYTE = 0.4
HEAP_BOUND = 48 * 2**20


def touch_heap(size: int) -> None:
    """Allocate `size` bytes from glibc's heap, touch every page and free them again, on a thread of the prefetch:
    their page faults are taken on another core while the reader imports the analysis, and the reader's heap
    grows into pages already there (one heap for all threads, kept at its top: `cli.keep_freed_blocks`).
    Nothing on one core, nor where the C library is not glibc."""
    if size <= 0 or len(os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else ()) < 2:
        return
    import ctypes

    libc = ctypes.CDLL(None)
    if not hasattr(libc, "mallopt"):  # not glibc
        return
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.memset.argtypes, libc.free.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t], [ctypes.c_void_p]
    block = libc.malloc(size)
    if block:
        libc.memset(block, 0, size)  # ctypes lets the GIL go meanwhile
        libc.free(block)


class Pieces:
    """The pieces of JSON text a prefetch's thread inflates, in order, as an iterator for the reader (at most
    PIECES_AHEAD waiting); closing it stops the thread."""

    END = object()

    def __init__(self) -> None:
        self.waiting: queue.Queue = queue.Queue(PIECES_AHEAD)
        self.closed = threading.Event()

    def hand(self, item) -> bool:
        """Give the reader a piece, the error that ends them or END, waiting while PIECES_AHEAD wait; False
        once the reader has closed."""
        while not self.closed.is_set():
            try:
                self.waiting.put(item, timeout=0.05)
                return True
            except queue.Full:
                pass
        return False

    def __iter__(self) -> Pieces:
        return self

    def __next__(self) -> bytes:
        if self.closed.is_set():
            raise StopIteration
        item = self.waiting.get()
        if item is Pieces.END:
            self.close()
            raise StopIteration
        if isinstance(item, BaseException):
            self.close()
            raise item
        return item

    def close(self) -> None:
        """Stop the thread (it hands nothing more)."""
        self.closed.set()


def read_file(path: Path) -> tuple[bytes, Iterator[bytes] | None]:
    """A trace file's bytes as stored (gzipped or not), with clear errors for a file that cannot be read; and,
    where they are gzipped, an iterator over their JSON text in pieces (`inflated_pieces`; inflated by the
    prefetch's thread where one started), None otherwise."""
    pending = _prefetched.pop(Path(path), None)
    if pending is None:
        raw = _stored_bytes(path)
        return raw, (inflated_pieces(path, raw) if raw[:2] == GZIP_MAGIC else None)
    ready, box = pending
    ready.wait()
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0], (box[1] if len(box) == 2 else None)


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


def _stored_bytes(path: Path) -> bytes:
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
    return raw


def json_text(path: Path, raw: bytes) -> bytes:
    """The JSON text of a trace file's stored bytes: gunzipped within the bound, with clear errors for broken
    gzip data."""
    if raw[:2] == GZIP_MAGIC:
        raw = inflate(path, raw, inflated_limit(path, len(raw)))
        if not raw:
            raise TraceError(path, "empty file (gzip of nothing)")
    elif path.name.endswith(".gz"):
        raise TraceError(path, "not gzip data, although the name ends in .gz")
    return raw


def inflate(path: Path, raw: bytes, limit: int) -> bytes:
    """Gunzip `raw` (one or more gzip members), refusing as soon as the output would pass `limit` bytes.

    ISA-L inflates where it is installed; data it does not read cleanly to the end within the bound (corrupt,
    truncated, too large) is read again by zlib, whose errors name the problem."""
    if fast_zlib is not None and os.environ.get(INFLATE_ENV, "").lower() != "zlib":
        clean = inflate_clean(fast_zlib, raw, limit)
        if clean is not None:
            return clean
    return inflate_zlib(path, raw, limit)


def inflate_clean(module, raw: bytes, limit: int) -> bytes | None:
    """`raw` gunzipped with `module` (zlib's interface), or None where it is not clean gzip data that inflates
    within `limit` bytes (the caller reads it again to say why)."""
    parts: list[bytes] = []
    total = 0
    data = raw
    while True:
        inflater = module.decompressobj(wbits=31)
        try:
            part = inflater.decompress(data, limit + 1 - total)
        except Exception:  # noqa: BLE001 - whatever the binding raises, zlib says what is wrong
            return None
        total += len(part)
        if total > limit or not inflater.eof:
            return None
        parts.append(part)
        data = inflater.unused_data
        if not data.strip(b"\0"):
            break
        if data[:2] != b"\x1f\x8b":
            return None
    return parts[0] if len(parts) == 1 else b"".join(parts)


def inflate_zlib(path: Path, raw: bytes, limit: int) -> bytes:
    """Gunzip `raw` with zlib, naming the problem of data that is not clean gzip within `limit` bytes."""
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


# A gzipped trace is inflated in pieces of this many bytes, which the decoder reads one after another
# (`events.decode_pieces`): the memory of one piece is used again for the next, where 54 MB of JSON text held
# whole would be touched page by page, once (a page fault every 4 KiB: a tenth of a large trace's reading).
PIECE_BYTES = 2**18
_INPUT_BYTES = 2**16  # gzip data fed to the inflater at a time


class Unclean(Exception):
    """Gzip data that `inflated_pieces` does not read cleanly to its end within the bound: the caller reads it
    whole (`json_text`), which names the problem."""


def inflated_pieces(path: Path, raw: bytes) -> Iterator[bytes]:
    """The JSON text of gzipped stored bytes (one or more gzip members), in pieces of at most PIECE_BYTES;
    raises Unclean (after any pieces) where the data is corrupt, truncated or inflates beyond `inflated_limit`."""
    limit = inflated_limit(path, len(raw))
    module = fast_zlib if fast_zlib is not None and os.environ.get(INFLATE_ENV, "").lower() != "zlib" else zlib
    data, at, total = memoryview(raw), 0, 0
    inflater = module.decompressobj(wbits=31)
    while True:
        if inflater.eof:
            rest = inflater.unused_data + bytes(data[at:])
            if not rest.strip(b"\0"):  # the end, or the zero padding some tools leave after the stream
                return
            if rest[:2] != GZIP_MAGIC:
                raise Unclean
            data, at, inflater = memoryview(rest), 0, module.decompressobj(wbits=31)
        if inflater.unconsumed_tail:
            given = inflater.unconsumed_tail
        elif at < len(data):
            given, at = data[at:at + _INPUT_BYTES], at + _INPUT_BYTES
        else:
            given = b""  # all fed: what the inflater still holds, then the end (or a truncated stream)
        try:
            piece = inflater.decompress(given, PIECE_BYTES)
        except Exception:  # noqa: BLE001 - whatever the binding raises, zlib says what is wrong
            raise Unclean from None
        total += len(piece)
        if total > limit or (not piece and not given and not inflater.eof):
            raise Unclean
        if piece:
            yield piece
