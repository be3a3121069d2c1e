"""Reading traces fast without reading them differently: ISA-L's inflate and zlib (the fallback) give the same
bytes and the same errors, and a folder's ranks read in parallel processes give the same document as one
after another."""

from __future__ import annotations

import gzip
import json
import random
import shutil
import threading
import time
import zlib
from pathlib import Path

import pytest

from advisor.analysis import reading
from advisor.analysis.analyze import READ_PROCESSES_ENV, analysis_document, analyze_path, encode_json
from advisor.analysis.events import LooseEvent, decode, decode_pieces
from advisor.analysis.reading import INFLATE_ENV, inflate, inflate_clean, inflate_zlib
from advisor.analysis.trace import load_trace
from advisor.errors import TraceError
from conftest import SAMPLE_RUNS, TRACES, run_advisor

REAL = [TRACES / "a100-rank3-of-8.pt.trace.json.gz", TRACES / "mi250-rocm-minitoy.pt.trace.json.gz",
        TRACES / "legacy-format-computeProperties.json.gz"]


@pytest.mark.skipif(reading.fast_zlib is None, reason="isal is not installed: zlib alone reads the traces")
@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_isal_and_zlib_inflate_real_traces_alike(path: Path):
    raw = path.read_bytes()
    limit = reading.inflated_limit(path, len(raw))
    fast = inflate_clean(reading.fast_zlib, raw, limit)
    assert fast is not None and fast == inflate_zlib(path, raw, limit) == gzip.decompress(raw)


def test_two_members_and_padding_inflate_alike():
    """Concatenated gzip members and the zero padding some tools leave after the stream, with either."""
    raw = gzip.compress(b'{"traceEvents": [') + gzip.compress(b"]}") + b"\0" * 16
    limit = 1 << 20
    assert inflate_zlib(Path("x.json.gz"), raw, limit) == b'{"traceEvents": []}'
    if reading.fast_zlib is not None:
        assert inflate_clean(reading.fast_zlib, raw, limit) == b'{"traceEvents": []}'


@pytest.mark.parametrize("raw, problem", [
    (gzip.compress(random.Random(0).randbytes(100_000))[:5000], "truncated gzip data"),
    (b"\x1f\x8b\x08\x00" + b"\xff" * 64, "corrupt gzip data"),
    (gzip.compress(b"{}") + b"garbage!", "bytes after the end of the gzip stream"),
    (gzip.compress(b" " * 5_000_000), "refused to inflate"),
], ids=["truncated", "corrupt", "trailing", "bomb"])
def test_broken_gzip_is_named_alike_by_either(raw: bytes, problem: str, monkeypatch):
    """What ISA-L does not read cleanly is read again by zlib, whose errors name the problem: the same error
    with isal as with ADVISOR_INFLATE=zlib."""
    path = Path("broken.json.gz")
    errors = []
    for inflater in ("", "zlib"):
        monkeypatch.setenv(INFLATE_ENV, inflater)
        with pytest.raises(TraceError) as caught:
            inflate(path, raw, 1_000_000)
        errors.append(caught.value.problem)
    assert errors[0] == errors[1] and problem in errors[0]


def test_zlib_fallback_reads_the_whole_analysis_alike():
    """`advisor analyze --json` with ISA-L and with zlib only: the same document."""
    trace = str(TRACES / "resnet50-v100-workers4.pt.trace.json.gz")
    fast = run_advisor("analyze", trace, "--json")
    slow = run_advisor("analyze", trace, "--json", env={INFLATE_ENV: "zlib"})
    assert fast.returncode == slow.returncode == 0 and fast.stdout == slow.stdout


def test_ranks_read_in_parallel_give_the_document_of_one_after_another(monkeypatch):
    """A DDP trial's two ranks: parsed in two processes (the default on two cores and more) or in this one,
    the same diagnoses; a broken trace among them is the same one-line error either way."""
    folder = SAMPLE_RUNS / "ddp_classifier" / "trials" / "00-baseline"
    documents = []
    for processes in ("2", "1"):
        monkeypatch.setenv(READ_PROCESSES_ENV, processes)
        documents.append(encode_json(analysis_document(folder, analyze_path(folder, parallel=True))))
    assert documents[0] == documents[1] and b'"straggler"' in documents[0]


def test_a_broken_rank_is_the_same_error_in_parallel(tmp_path: Path, monkeypatch):
    for rank, source in enumerate(REAL[:2]):
        (tmp_path / f"rank{rank}.pt.trace.json.gz").write_bytes(source.read_bytes())
    (tmp_path / "rank2.pt.trace.json.gz").write_bytes(zlib.compress(b"not gzip")[:20])
    errors = []
    for processes in ("2", "1"):
        monkeypatch.setenv(READ_PROCESSES_ENV, processes)
        with pytest.raises(TraceError) as caught:
            analyze_path(tmp_path, parallel=True)
        errors.append(str(caught.value))
    assert errors[0] == errors[1] and "rank2.pt.trace.json.gz" in errors[0]
    monkeypatch.setenv(READ_PROCESSES_ENV, "many")
    done = run_advisor("analyze", str(tmp_path), env={READ_PROCESSES_ENV: "many"})
    assert done.returncode == 2 and "ADVISOR_READ_PROCESSES" in done.stderr


def _document_of(path: Path) -> bytes:
    """`advisor analyze --json`'s document of one trace, its path left out (the copies differ in it)."""
    return encode_json(analysis_document(path, analyze_path(path))).replace(str(path).encode(), b"TRACE")


@pytest.mark.parametrize("source", [TRACES / "mi250-rocm-minitoy.pt.trace.json.gz",
                                    TRACES / "h200-gpt-attention-sdpa.pt.trace.json.gz"], ids=lambda p: p.name)
def test_events_decoded_by_phase_or_loose_give_the_same_analysis(source: Path, tmp_path: Path):
    """Events are decoded by phase (flows and metadata with their time only); a trace one of whose events has no
    'ph' is decoded again as LooseEvents, every field of every event. Both give the same document; and the
    fields of the phases the analysis does not read are not checked, so a flow event's odd name is no error."""
    doc = json.loads(gzip.decompress(source.read_bytes()))
    unread = next(e for e in doc["traceEvents"] if e.get("ph") not in ("X", "i"))
    copies = {}
    for variant in ("as-is", "loose", "odd-flow"):
        events = [dict(e) for e in doc["traceEvents"]]
        if variant == "loose":
            events.append({"name": "no phase", "ts": events[0].get("ts")})
        if variant == "odd-flow":
            events.append(dict(unread, name=5, cat=["not", "text"], args=[1, 2]))
        path = tmp_path / variant / source.name
        path.parent.mkdir()
        path.write_bytes(gzip.compress(json.dumps(dict(doc, traceEvents=events)).encode(), compresslevel=1))
        copies[variant] = path
    assert all(type(e) is LooseEvent for e in decode(copies["loose"], gzip.decompress(
        copies["loose"].read_bytes())).traceEvents)
    assert not any(type(e) is LooseEvent for e in decode(source, gzip.decompress(source.read_bytes())).traceEvents)
    documents = {variant: _document_of(path) for variant, path in copies.items()}
    assert documents["as-is"] == documents["loose"] == documents["odd-flow"]
    assert b'"bound"' in documents["as-is"]


def _pieces_of(text: bytes, piece_bytes: int, monkeypatch):
    """`decode_pieces` of `text` gzipped, inflated in pieces of `piece_bytes`: (the document, its text's length),
    or None where it reads the text whole."""
    monkeypatch.setattr(reading, "PIECE_BYTES", piece_bytes)
    path = Path("pieces.json.gz")
    return decode_pieces(path, reading.inflated_pieces(path, gzip.compress(text, compresslevel=1)))


@pytest.mark.parametrize("path", REAL[1:], ids=lambda p: p.name)
def test_a_trace_decoded_in_pieces_is_the_trace_decoded_whole(path: Path, monkeypatch):
    """Real traces, cut between their events wherever a piece ends (pieces of 4 KiB: hundreds of runs of
    events, events split across pieces): the same document as decoding the text whole."""
    text = gzip.decompress(path.read_bytes())
    doc, size = _pieces_of(text, 4096, monkeypatch)
    assert doc == decode(path, text) and size == len(text) and len(doc.traceEvents) > 100


KINETO = (b'{\n  "schemaVersion": 1,\n  "deviceProperties": [{"id": 0, "name": "GPU \\"traceEvents\\": [x"}],\n'
          b'  "traceEvents": [\n%s\n  ],\n  "traceName": "t"%s\n}')
EVENT = (b'  {\n    "ph": "X", "cat": "kernel", "name": "k%d", "pid": 1, "tid": 2,\n    "ts": %d, "dur": 3,\n'
         b'    "args": {"correlation": %d%s}\n  }')


def _kineto(n: int, args: bytes = b"", tail: bytes = b"") -> bytes:
    return KINETO % (b",\n".join(EVENT % (i, 10 * i, i, args) for i in range(n)), tail)


@pytest.mark.parametrize("variant, streamed", [
    ("plain", True),
    ("nested objects laid out as events", True),  # cuts inside an event: that run does not decode, read whole
    ("the key again after the events", False),  # the last 'traceEvents' is the one that counts
    ("the key inside an earlier object", False),
    ("one line", True),  # no cut between events: one run, the rest of the document
], ids=lambda v: v if isinstance(v, str) else "")
def test_a_document_that_does_not_split_between_events_is_decoded_whole(variant, streamed, monkeypatch):
    """The text is cut only between two events of the top-level array, each run and the rest decoded on
    their own; any other cut (inside an event, a string, another object's 'traceEvents') does not decode, and
    the text is then decoded whole: the document is always `decode`'s, whatever the layout."""
    text = {"plain": _kineto(300),
            "nested objects laid out as events": _kineto(300, b', "x": [{\n  },\n  {\n  }]'),
            "the key again after the events": _kineto(300, tail=b',\n  "traceEvents": []'),
            "the key inside an earlier object": _kineto(300).replace(
                b'"schemaVersion": 1', b'"distributedInfo": {"traceEvents": [{"ph": "i"},\n  {"ph": "i"}]}'),
            "one line": json.dumps(json.loads(_kineto(300))).encode()}[variant]
    whole = decode(Path("whole.json"), text)
    for piece_bytes in (64, 1000, 1 << 20):
        found = _pieces_of(text, piece_bytes, monkeypatch)
        if variant == "nested objects laid out as events" and piece_bytes == 1 << 20:
            assert found is None  # the one run holds a cut inside an event
            continue
        assert (found is not None) == streamed or variant == "nested objects laid out as events"
        assert found is None or found[0] == whole
    assert len(whole.traceEvents) == (0 if "again" in variant else 300)


@pytest.mark.parametrize("prefetched", [False, True], ids=["read", "prefetched"])
@pytest.mark.parametrize("cut", [0.3, 0.9], ids=["early", "late"])
def test_a_truncated_trace_is_the_same_error_after_pieces_decoded(cut: float, prefetched: bool, tmp_path: Path):
    """A gzip stream that ends early, after whole pieces of events were decoded: the error of reading it whole,
    also where the prefetch's thread inflated the pieces (its error is raised to the reader after them)."""
    raw = REAL[0].read_bytes()
    path = tmp_path / "cut.pt.trace.json.gz"
    path.write_bytes(raw[:int(len(raw) * cut)])
    if prefetched:
        reading.prefetch(path)
    with pytest.raises(TraceError) as caught:
        load_trace(path)
    assert "truncated gzip data" in caught.value.problem


def _prefetch_thread_ends(timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while any(t.name == reading.PREFETCH_THREAD for t in threading.enumerate()):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_prefetch_hands_the_pieces_in_order_and_stops_when_the_reader_does(monkeypatch):
    """The prefetch's thread inflates while the reader decodes, at most PIECES_AHEAD pieces ahead: the reader
    gets the text `inflated_pieces` gives, in order, and its thread ends at the end; where the reader stops
    early (it decodes the text whole, or had the trace already), closing the pieces ends the thread too."""
    monkeypatch.setattr(reading, "PIECE_BYTES", 4096)  # many more pieces than the thread holds ahead
    path = REAL[0]
    reading.prefetch(path)
    raw, pieces = reading.read_file(path)
    assert raw == path.read_bytes()
    assert b"".join(pieces) == b"".join(reading.inflated_pieces(path, raw)) == gzip.decompress(raw)
    assert _prefetch_thread_ends()
    reading.prefetch(path)
    _, pieces = reading.read_file(path)
    assert len(next(pieces)) == 4096
    time.sleep(0.2)  # the thread fills its queue and waits
    pieces.close()
    assert _prefetch_thread_ends() and list(pieces) == []


def test_a_prefetched_plain_json_trace_is_read_whole(tmp_path: Path):
    """A trace that is not gzipped has no pieces: the reader decodes its bytes as stored."""
    path = tmp_path / "plain.pt.trace.json"
    path.write_bytes(gzip.decompress(REAL[1].read_bytes()))
    reading.prefetch(path)
    assert reading.read_file(path) == (path.read_bytes(), None)
    assert _prefetch_thread_ends()


def test_a_session_read_again_in_its_report_parses_each_trace_once(tmp_path: Path, monkeypatch):
    """A session's trials' traces, read by the search as it ran (paths relative to where it runs) and then by its
    report (absolute, in order): the second reading of each is the Trace the first parsed, with the path as the
    report gives it. A rewritten file is parsed again."""
    from advisor.analysis.trace import forget_traces, load_trace

    forget_traces()
    sources = sorted(TRACES.glob("*.pt.trace.json.gz"), key=lambda p: p.stat().st_size)[:3]  # the smallest
    for i in range(16):  # a session of 16 trials, each trace its own file
        (tmp_path / f"{i:02d}").mkdir()
        shutil.copy(sources[i % len(sources)], tmp_path / f"{i:02d}" / "trace.json.gz")
    monkeypatch.chdir(tmp_path)
    first = [load_trace(Path(f"{i:02d}") / "trace.json.gz") for i in range(16)]
    again = [load_trace(tmp_path / f"{i:02d}" / "trace.json.gz") for i in range(16)]
    assert all(a.ops is b.ops and b.path == str(tmp_path / f"{i:02d}" / "trace.json.gz")
               for i, (a, b) in enumerate(zip(first, again)))
    shutil.copy(sources[1], tmp_path / "00" / "trace.json.gz")  # another trace in its place
    assert load_trace(tmp_path / "00" / "trace.json.gz").ops is not first[0].ops
    forget_traces()
