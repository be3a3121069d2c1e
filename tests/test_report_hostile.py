"""`advisor report` reads a session folder as untrusted input: paths named in session.json and trial.json are
followed only inside the folder, only regular files are opened, hand-edited records render what they can.

Which files were opened is observed with an audit hook (`sys.addaudithook`, event "open"): every `open()`
and `os.open()` in this process reports its path there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from advisor.errors import AdvisorError
from advisor.report.html import render_session_report, write_report
from report_helpers import IMAGE_BASELINE, LadderRow, build_session

OPENED: list[str] | None = None  # paths opened while a test records, else None


def _audit(event: str, args: tuple) -> None:
    if event == "open" and OPENED is not None and isinstance(args[0], (str, bytes, os.PathLike)):
        OPENED.append(os.fsdecode(args[0]))


sys.addaudithook(_audit)  # hooks cannot be removed: this one records only inside `opened_files`


def opened_files(render) -> tuple[object, list[str]]:
    """(render(), every path opened meanwhile)."""
    global OPENED
    OPENED = []
    try:
        result = render()
        return result, list(OPENED)
    finally:
        OPENED = None


ONE_TRIAL = [LadderRow("00-baseline", "baseline", "baseline")]


def outside_trace(tmp_path: Path) -> Path:
    """A real trace outside the session folder, whose trial name would show if it were read."""
    folder = tmp_path / "elsewhere" / "secret-trial"
    folder.mkdir(parents=True)
    (trace,) = IMAGE_BASELINE.glob("*.pt.trace.json.gz")
    target = folder / "secret.pt.trace.json.gz"
    target.write_bytes(trace.read_bytes())
    return target


def edit_trial(session_dir: Path, name: str, **fields) -> None:
    path = session_dir / "trials" / name / "trial.json"
    record = json.loads(path.read_text())
    record.update(fields)
    path.write_text(json.dumps(record))


def test_recorded_sessions_have_nothing_unread():
    """The shapes match what advisor writes: the recorded sessions in sample_runs/ render with nothing left out."""
    from advisor.report.session_folder import checked_trial_traces, load_session
    from conftest import SAMPLE_RUNS

    sessions = sorted(p.parent for p in SAMPLE_RUNS.glob("*/session.json"))
    assert sessions
    for folder in sessions:
        session = load_session(folder)
        assert session["unread"] == [], folder
        for row in session["trials"]:
            traces, problems = checked_trial_traces(folder, row)
            ranks = json.loads((folder / row["folder"] / "trial.json").read_text()).get("world_size") or 1
            assert len(traces) == ranks and problems == [], (folder, row["name"])  # one trace per rank


def test_fields_recorded_as_null_are_not_problems(tmp_path):
    """null is how a record says "not recorded" (and how strict records write NaN): never said as unread."""
    session_dir = build_session(tmp_path / "s", ONE_TRIAL)
    session = json.loads((session_dir / "session.json").read_text())
    for key in ("memory_cap", "device", "options", "final_knobs", "trials", "notes", "lint", "speedup", "patch"):
        session[key] = None
    (session_dir / "session.json").write_text(json.dumps(session))
    html = render_session_report(session_dir)
    assert 'id="unread"' not in html


@pytest.mark.parametrize("listed", ["../../../elsewhere/secret-trial/secret.pt.trace.json.gz", "ABSOLUTE",
                                    "/etc/passwd", "/proc/self/environ", "../../../../../../../../etc/passwd"])
def test_trace_files_outside_the_session_are_never_opened(tmp_path, listed):
    secret = outside_trace(tmp_path)
    session_dir = build_session(tmp_path / "s", ONE_TRIAL)
    listed = str(secret) if listed == "ABSOLUTE" else listed
    edit_trial(session_dir, "00-baseline", trace_files=[listed])
    html, opened = opened_files(lambda: render_session_report(session_dir))
    assert not any(p in ("/etc/passwd", "/proc/self/environ") or p.startswith(str(tmp_path / "elsewhere"))
                   for p in opened), opened
    assert 'id="unread"' in html and "is not inside the session folder: not read" in html
    assert "secret" not in html.replace(listed, ""), "the outside trace was shown"


def test_a_listed_file_inside_the_session_that_is_no_trace_is_said(tmp_path):
    session_dir = build_session(tmp_path / "s", ONE_TRIAL)
    edit_trial(session_dir, "00-baseline", trace_files=["../../session.json"])
    html = render_session_report(session_dir)
    assert "trial 00-baseline: " in html and "not a torch.profiler trace" in html
    assert "No trace for this trial" in html


def test_links_out_of_the_session_are_not_followed(tmp_path):
    secret = outside_trace(tmp_path)
    session_dir = build_session(tmp_path / "s", ONE_TRIAL)
    folder = session_dir / "trials" / "00-baseline"
    for trace in folder.glob("*.pt.trace.json.gz"):
        trace.unlink()
    (folder / "trial.x.pt.trace.json.gz").symlink_to(secret)  # found by the folder's glob, not listed
    edit_trial(session_dir, "00-baseline", trace_files=[])
    (folder / "passwd.pt.trace.json").symlink_to("/etc/passwd")
    html, opened = opened_files(lambda: render_session_report(session_dir))
    assert not any(p == "/etc/passwd" or p.startswith(str(tmp_path / "elsewhere")) for p in opened), opened
    assert "links outside the session folder: not read" in html and "No trace for this trial" in html


def test_trial_folder_and_patch_outside_the_session_are_not_read(tmp_path):
    outside_trace(tmp_path)
    session_dir = build_session(tmp_path / "s", ONE_TRIAL + [LadderRow("01-x", "x", "reverted")])
    session = json.loads((session_dir / "session.json").read_text())
    session["trials"][1]["folder"] = "../elsewhere/secret-trial"
    session["patch"] = "/etc/passwd"
    (session_dir / "session.json").write_text(json.dumps(session))
    html, opened = opened_files(lambda: render_session_report(session_dir))
    assert not any(p == "/etc/passwd" or p.startswith(str(tmp_path / "elsewhere")) for p in opened), opened
    assert "its folder &#39;../elsewhere/secret-trial&#39; is not inside the session folder" in html
    assert "the patch &#39;/etc/passwd&#39; is not inside the session folder: not read" in html
    assert "root:" not in html


def test_fifos_in_a_trial_folder_do_not_hang_the_report(tmp_path):
    session_dir = build_session(tmp_path / "s", ONE_TRIAL + [LadderRow("01-x", "x", "reverted")])
    baseline = session_dir / "trials" / "00-baseline"
    (trace,) = baseline.glob("*.pt.trace.json.gz")
    trace.unlink()
    os.mkfifo(trace)  # listed in trial.json, now a FIFO
    other = session_dir / "trials" / "01-x"
    (other / "trial.json").unlink()
    os.mkfifo(other / "trial.json")
    os.mkfifo(session_dir / "suggested.patch")
    proc = subprocess.run([sys.executable, "-m", "advisor.cli", "report", str(session_dir)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    html = (session_dir / "report.html").read_text()
    assert f"trace file &#39;{trace.name}&#39; is not a regular file: not read" in html
    assert "trial 01-x: trial.json is not a regular file: not read" in html
    fifo_session = tmp_path / "fifo-session"
    fifo_session.mkdir()
    os.mkfifo(fifo_session / "session.json")
    proc = subprocess.run([sys.executable, "-m", "advisor.cli", "report", str(fifo_session)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "not a regular file" in proc.stderr


def test_hand_edited_session_renders_what_it_can(tmp_path):
    session_dir = build_session(tmp_path / "s", ONE_TRIAL + [LadderRow("01-x", "x", "kept", throughput=1.5)])
    session = json.loads((session_dir / "session.json").read_text())
    session["trials"][0]["samples_per_s"] = "fast"
    session["trials"][1]["speedup"] = float("nan")
    session["trials"][1]["knobs"] = ["num_workers", 2]
    session["trials"][1]["interval"] = {"low": 1}
    session["speedup"] = "x2"
    session["device"] = [1, 2]
    session["recommendations"] = [{"title": 5, "evidence": "one line", "predicted_gain": -1e999}, "not a dict"]
    session["notes"] = {"a": 1}
    session["lint"] = [{"line": "ten"}]
    session["memory_cap"] = {"bytes": "1 GiB"}
    (session_dir / "session.json").write_text(json.dumps(session))  # NaN and -Infinity, as Python writes them
    html = render_session_report(session_dir)
    assert 'id="unread"' in html
    for said in ("trials[0].samples_per_s: text where a number from 0 to 1e18 goes", "trials[1].speedup: NaN",
                 "trials[1].knobs: a list where an object goes", "speedup: text where", "device: a list where",
                 "recommendations[1]: text where an object goes", "notes: an object where a list goes",
                 "lint[0].line: text where", "memory_cap.bytes: text where"):
        assert said in html, said
    ladder = html.split('id="ladder"')[1].split("</table>")[0]
    assert "n/a" in ladder  # the baseline's samples/s, dropped
    for content in ('[1, 2]', '"text"', '{"schema": ["advisor.session/1"]}', "\xff"):
        (session_dir / "session.json").write_text(content, errors="surrogateescape")
        with pytest.raises(AdvisorError, match="session.json: not"):
            render_session_report(session_dir)


def test_cli_report_of_a_broken_session_is_one_line(tmp_path):
    session_dir = build_session(tmp_path / "s", ONE_TRIAL)
    (session_dir / "session.json").write_text('{"schema": "advisor.session/1", "trials": ' + "[" * 100000)
    proc = subprocess.run([sys.executable, "-m", "advisor.cli", "report", str(session_dir)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr


def test_file_names_that_are_not_utf8_render(tmp_path):
    session_dir = build_session(tmp_path / "s", ONE_TRIAL)
    folder = session_dir / "trials" / "00-baseline"
    (trace,) = folder.glob("*.pt.trace.json.gz")
    odd = os.fsdecode(b"tr\xffce.pt.trace.json.gz")
    trace.rename(folder / odd)
    edit_trial(session_dir, "00-baseline", trace_files=[odd])
    out = write_report(session_dir, session_dir / "report.html")
    assert "tr\\xffce.pt.trace.json.gz" in out.read_text(encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "advisor.cli", "report", str(folder), "-o",
                           str(tmp_path / "t.html")], capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert b"tr\\xffce.pt.trace.json.gz" in (tmp_path / "t.html").read_bytes()


def test_notebook_readers_stay_inside_the_session(tmp_path):
    from advisor.api import Session, Trial

    secret = outside_trace(tmp_path)
    session_dir = build_session(tmp_path / "s", ONE_TRIAL + [LadderRow("01-x", "x", "reverted")])
    session = json.loads((session_dir / "session.json").read_text())
    session["trials"][1]["folder"] = str(secret.parent)
    (session_dir / "session.json").write_text(json.dumps(session))
    with pytest.raises(AdvisorError, match="is not inside"):
        Session(session_dir).trial("01-x")
    folder = session_dir / "trials" / "00-baseline"
    for trace in folder.glob("*.pt.trace.json.gz"):
        trace.unlink()
    (folder / "a.pt.trace.json.gz").symlink_to(secret)
    trial, opened = opened_files(lambda: Trial.load(folder).diagnosis)
    assert trial is None and not any(p.startswith(str(secret.parent)) for p in opened)
