"""The HTML report and TensorBoard runs, on real trial folders and traces, in a real browser and server.

Sessions are built from the recorded baseline trials of sample_runs/ (tests/report_helpers.py); the
report is opened in headless Chromium (Debian's `chromium`), and TensorBoard runs are read back through a
real `tensorboard` server's HTTP API.
"""

from __future__ import annotations

import base64
import gzip
import json
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

import msgspec
import pytest
from PIL import Image

from advisor.errors import AdvisorError
from advisor.report import charts, views
from advisor.report import render_session_report, render_trace_report, write_report, write_tensorboard
from report_helpers import (IMAGE_BASELINE, REPO, TRACES, LadderRow, build_session, free_port, recorded_session,
                            rewrite_trace_names, run_chromium, ten_trial_specs)
from conftest import require

XSS = "<script>alert(1)</script>"
HTML = "<b>html</b>"
PATCH = """--- a/examples/image_classifier.py
+++ b/examples/image_classifier.py
@@ -1,2 +1,2 @@
-loader = DataLoader(data, batch_size=32)
+loader = DataLoader(data, batch_size=64, num_workers=2)  # <b>html</b> stays text
"""


@pytest.fixture(scope="session")
def browser() -> str:
    """The chromium executable; the browser tests skip (with the reason) only when it is not installed, and
    never in CI, whose .ci/run installs it."""
    return require("chromium")


@pytest.fixture
def session_dir(tmp_path: Path) -> Path:
    """A session folder: a recorded one from sample_runs/ when present, else one built from real trials."""
    recorded = recorded_session()
    if recorded is not None:
        return Path(shutil.copytree(recorded, tmp_path / "session"))
    return build_session(tmp_path / "session", patch=PATCH)


class Elements(HTMLParser):
    """Start tags (with attributes) and text of an HTML document, as a browser's DOM dump gives them."""

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)

    def count(self, tag: str) -> int:
        """How many elements of this tag the document has."""
        return sum(1 for t, _ in self.tags if t == tag)

    def all_text(self) -> str:
        """The document's text, entities decoded."""
        return "".join(self.text)


def dump_dom(html_file: Path) -> str:
    """The DOM that Chromium built for a file, serialized after the load event."""
    done = run_chromium("--dump-dom", html_file.as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def chart_svgs(html: str) -> list[bytes]:
    """The SVG documents embedded as base64 data: images."""
    return [base64.b64decode(m) for m in re.findall(r'src="data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)"', html)]


# ---- session report in the browser ----

def test_session_report_in_chromium(browser, session_dir: Path, tmp_path: Path):
    """The ladder table and the charts are in the page Chromium renders, and its screenshot is not blank."""
    out = write_report(session_dir, session_dir / "report.html")
    session = json.loads((session_dir / "session.json").read_text())
    html = out.read_text()
    assert "<script" not in html and "http://" not in html and "https://" not in html  # self-contained, inert

    dom = Elements(dump_dom(out))
    ladder_rows = [r for r in session["trials"] if r["decision"] in ("baseline", "kept")]
    assert ("table", {"id": "ladder", "class": "ladder"}) in dom.tags
    ladder_html = html.split('id="ladder"', 1)[1].split("</table>", 1)[0]
    assert ladder_html.count("<tr>") == 1 + len(ladder_rows)  # header + baseline + kept changes
    for row in ladder_rows:
        assert row["name"] in ladder_html
        assert row["speedup"] is None or f"×{row['speedup']:.2f}" in ladder_html
    charts = [a for t, a in dom.tags if t == "img" and a.get("src", "").startswith("data:image/svg+xml;base64,")]
    assert {a.get("id") for a in charts} >= {"chart-throughput", "chart-breakdown", "chart-memory"}
    for svg in chart_svgs(html):
        assert svg.lstrip().startswith(b"<?xml") and b"<svg" in svg and b"<text" in svg  # text kept as text
    text = dom.all_text()
    assert "What held the baseline back" in text and session["command"] in text
    assert session["speedup"] is None or f"×{session['speedup']:.2f}" in text
    for note in session["notes"]:
        assert note in text
    patch = session_dir / (session.get("patch") or "suggested.patch")
    if patch.is_file():
        assert patch.read_text().strip() in text  # the patch, as text
        assert dom.count("b") == 0  # its "<b>html</b>" did not become an element
    device_table = html.split('id="device"', 1)[1].split("</table>", 1)[0]
    assert device_table.count("<tr>") >= 3 and "no device facts" not in device_table

    shot = tmp_path / "report.png"
    done = run_chromium(f"--screenshot={shot}", "--window-size=1280,2000", out.as_uri())
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
    with Image.open(shot) as img:
        rgb = img.convert("RGB")
        assert rgb.size == (1280, 2000)
        colors = rgb.getcolors(maxcolors=1 << 20)
        not_white = sum(n for n, c in colors if c != (255, 255, 255))
    assert len(colors) > 200, f"only {len(colors)} colours: the screenshot looks blank"
    assert not_white > 0.3 * 1280 * 2000


def test_session_report_is_deterministic_and_reads_only_the_folder(session_dir: Path):
    """The same session folder gives the same bytes (stable chart ids, no timestamps), its charts drawn
    again; drawn once more for the same figures, a chart is the one drawn before."""
    first = render_session_report(session_dir)
    charts.DRAWN.clear()
    views._trace_view.cache_clear()  # its traces diagnosed again too
    assert render_session_report(session_dir) == first
    drawn = dict(charts.DRAWN)
    assert drawn and render_session_report(session_dir) == first
    assert all(charts.DRAWN[key] is uri for key, uri in drawn.items())
    series = [("cpu", (0.0, 1.0, 2.0), (0.0, 2e9, 1e9))]
    uri = charts.memory_timeline_chart(series, None, cumulative=False)
    assert charts.memory_timeline_chart(list(series), None, cumulative=False) is uri
    assert charts.memory_timeline_chart([("cpu", (0.0, 1.0, 2.0), (0.0, 2e9, 3e9))], None, cumulative=False) != uri


def test_interrupted_session_reports_the_trials_so_far(tmp_path: Path):
    """A session killed mid-way (status interrupted, no patch yet) still gets a report that says so."""
    session_dir = build_session(tmp_path / "s", [LadderRow("00-baseline", "baseline", "baseline")])
    path = session_dir / "session.json"
    session = json.loads(path.read_text())
    session.update(status="interrupted", best=None, speedup=None, final_knobs=None, recommendations=[],
                   patch="../../../../../../etc/passwd")  # only files inside the session folder are read
    path.write_text(json.dumps(session))
    html = render_session_report(session_dir)
    assert "the session is interrupted: this report shows the trials finished so far" in html
    assert "nothing was tried: the session ran the baseline only" in html and "No patch" in html
    assert "root:" not in html


# ---- escaping ----

def test_trace_names_render_as_text(browser, tmp_path: Path):
    """Kernel, operator and device names with <script> and HTML are shown as text, in the page and charts."""
    folder = tmp_path / "traces"
    folder.mkdir()
    cpu_source = next(IMAGE_BASELINE.glob("*.pt.trace.json.gz"))
    rewrite_trace_names(cpu_source, folder / "evil-cpu.pt.trace.json.gz", (XSS, HTML))
    gpu_source = TRACES / "mi250-rocm-minitoy.pt.trace.json.gz"  # kernels and a device name
    gpu = gpu_source.exists() and rewrite_trace_names(gpu_source, folder / "evil-gpu.pt.trace.json.gz", (XSS, HTML))
    out = write_report(tmp_path / "traces", tmp_path / "report.html")
    html = out.read_text()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "&lt;b&gt;html&lt;/b&gt;" in html
    assert "<script" not in html and HTML not in html

    dom = Elements(dump_dom(out))
    assert dom.count("script") == 0 and dom.count("b") == 0  # nothing injected into the rendered page
    text = dom.all_text()
    assert XSS + "aten::" in text or HTML + "aten::" in text  # operator names, as text
    if gpu:
        assert re.search(re.escape(XSS) + r"|" + re.escape(HTML), text)
        assert "Device: " + HTML in text or "Device: " + XSS in text  # device name from the trace


def test_session_names_render_as_text(browser, tmp_path: Path):
    """Trial names and changes from session.json: escaped in tables, escaped inside the chart SVG too."""
    session_dir = build_session(tmp_path / "session", patch=PATCH)
    path = session_dir / "session.json"
    session = json.loads(path.read_text())
    session["trials"][1]["name"] = XSS  # names are labels; the folder stays what it is
    session["trials"][1]["change"] = HTML
    path.write_text(json.dumps(session))
    out = write_report(session_dir, session_dir / "report.html")
    html = out.read_text()
    assert "<script" not in html and HTML not in html and "&lt;script&gt;" in html
    for svg in chart_svgs(html):
        assert b"<script" not in svg and b"<b>" not in svg
    assert any(b"&lt;script&gt;alert(1)&lt;/script&gt;" in svg for svg in chart_svgs(html))
    dom = Elements(dump_dom(out))
    assert dom.count("script") == 0 and dom.count("b") == 0
    assert XSS in dom.all_text() and HTML in dom.all_text()


# ---- size and speed ----

LOAD_PROBE = ('<script>window.addEventListener("load", function () { void document.body.offsetHeight;'
              ' document.documentElement.setAttribute("data-load-ms", String(performance.now())); });</script>')


def test_ten_trial_report_is_small_and_renders_fast(browser, tmp_path: Path):
    """A 10-trial session report: under 5 MB, with one chart per figure, loaded and laid out by Chromium (its
    load time is printed; how fast a busy machine lays it out is not asserted)."""
    session_dir = build_session(tmp_path / "session", ten_trial_specs(), patch=PATCH)
    out = write_report(session_dir, session_dir / "report.html")
    size = out.stat().st_size
    assert size < 5_000_000, f"{size} bytes"
    html = out.read_text()
    # Three session charts, plus a memory timeline in each trial's section whose trace has memory events.
    timelines = html.count('alt="Allocated memory over the trace"')
    assert timelines >= 1
    assert len(chart_svgs(html)) == 3 + timelines
    # A copy with a probe that records, at the load event after a forced layout, the time since navigation.
    probe = tmp_path / "probe.html"
    probe.write_text(out.read_text().replace("</body>", LOAD_PROBE + "</body>"))
    empty = tmp_path / "empty.html"
    empty.write_text("<!DOCTYPE html><html><body>" + LOAD_PROBE + "</body></html>")
    t0 = time.perf_counter()
    dom = dump_dom(probe)
    wall_report = time.perf_counter() - t0
    t0 = time.perf_counter()
    dump_dom(empty)
    wall_empty = time.perf_counter() - t0
    load_ms = float(re.search(r'data-load-ms="([0-9.]+)"', dom).group(1))
    print(f"10-trial report: {size / 1e6:.2f} MB, load {load_ms:.0f} ms in page; chromium wall "
          f"{wall_report:.2f} s vs {wall_empty:.2f} s for an empty page")
    assert load_ms > 0  # the load event fired after a forced layout
    assert "10 trial(s)" in Elements(dom).all_text()


# ---- recorded traces, inputs, CLI ----

def test_trace_report_of_a_folder_has_a_section_per_trace():
    """`advisor report sample_runs`: each trace's diagnosis and its recommendations."""
    html = render_trace_report(REPO / "sample_runs")
    assert html.count("<h2>char_transformer.py, trial 00-baseline") == 1
    assert html.count("<h2>image_classifier.py, trial 00-baseline") == 1
    assert "Load data in parallel: raise DataLoader num_workers" in html
    assert "Autocast matmuls and convolutions to bf16 (CPU AMP)" in html
    assert "enumerate(DataLoader)#" in html  # the heaviest operator of the loader-bound example


def test_write_report_picks_session_or_traces_and_names_bad_input(tmp_path: Path):
    """A folder with session.json is a session; a bad session.json is one error naming the file."""
    session_dir = build_session(tmp_path / "s", [LadderRow("00-baseline", "baseline", "baseline")])
    assert 'id="ladder"' in write_report(session_dir, tmp_path / "a.html").read_text()
    trace_only = write_report(session_dir / "trials", tmp_path / "b.html").read_text()
    assert 'id="ladder"' not in trace_only and "image_classifier.py, trial 00-baseline" in trace_only
    (session_dir / "session.json").write_text('{"schema": "something/else"}')
    with pytest.raises(AdvisorError, match="session.json: not an advisor session record"):
        render_session_report(session_dir)


def test_cli_report_writes_html_and_tensorboard(tmp_path: Path):
    """`advisor report DIR --tensorboard` and `advisor report TRACE -o FILE`; a bad path is one line, exit 2."""
    session_dir = build_session(tmp_path / "s", [LadderRow("00-baseline", "baseline", "baseline")])
    from conftest import advisor_main

    run = lambda *a: advisor_main("report", *a, cwd=tmp_path)
    done = run(str(session_dir), "--tensorboard")
    assert done.returncode == 0, done.stderr
    assert (session_dir / "report.html").is_file()
    assert len(list((session_dir / "trials" / "session").glob("events.out.tfevents.*"))) == 1
    assert "the session run and 1 trial(s) with traces" in done.stdout
    trace = next(IMAGE_BASELINE.glob("*.pt.trace.json.gz"))
    done = run(str(trace), "-o", str(tmp_path / "trace.html"))
    assert done.returncode == 0 and (tmp_path / "trace.html").stat().st_size > 10_000, done.stderr
    done = run(str(tmp_path / "missing"))
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0 and "missing" in done.stderr


# ---- TensorBoard ----

def _get_json(url: str):
    with urllib.request.urlopen(url, timeout=30) as response:
        body = response.read()
        if response.headers.get("Content-Encoding") == "gzip":  # the profiler plugin's trace and memory views
            body = gzip.decompress(body)
        return msgspec.json.decode(body)  # the trace views are megabytes: json.loads took seconds


def test_tensorboard_server_shows_the_session_run_and_each_trials_profile(tmp_path: Path):
    """A real tensorboard server over DIR/trials: one run, `session`, with a series per figure over the trial
    index (no series without data: a CPU session has no GPU series), its text shown as written; and the
    PyTorch profiler plugin (torch-tb-profiler, installed with the package) lists every trial with a trace
    and serves its Overview, Operator, Trace and Memory views."""
    tensorboard = Path(sys.executable).parent / "tensorboard"
    assert tensorboard.exists(), f"{tensorboard} is missing: make install installs tensorboard"
    session_dir = build_session(tmp_path / "session")
    rows = json.loads((session_dir / "session.json").read_text())["trials"]
    (session_dir / "trials" / "00-baseline" / "events.out.tfevents.1.old.0").write_bytes(b"")  # the old layout
    write_tensorboard(session_dir)
    write_tensorboard(session_dir)  # re-running replaces the event file, it does not add to them
    assert [p.parent.name for p in session_dir.rglob("events.out.tfevents.*")] == ["session"]
    traced = [r["name"] for r in rows if list((session_dir / r["folder"]).glob("*.pt.trace.json.gz"))]
    assert len(traced) == len(rows) - 1  # the failed trial has no trace: it is in the session's text only

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    profiler = f"{base}/data/plugin/pytorch_profiler"
    log = tmp_path / "tensorboard.log"
    with open(log, "wb") as sink:  # a file, not a pipe: a chatty server can never block on a full pipe
        server = subprocess.Popen([str(tensorboard), "--logdir", str(session_dir / "trials"), "--host",
                                   "127.0.0.1", "--port", str(port), "--load_fast", "false"],
                                  stdout=sink, stderr=sink, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        runs, tags, profiled = [], {}, {}
        while time.monotonic() < deadline:
            assert server.poll() is None, log.read_text()[-2000:]
            try:
                runs = _get_json(f"{base}/data/runs")
                tags = _get_json(f"{base}/data/plugin/scalars/tags")
                profiled = _get_json(f"{profiler}/runs")
                if tags.get("session") and len(profiled["runs"]) == len(traced) and not profiled["loading"]:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        assert runs == ["session"]
        series = set(tags["session"])
        assert {"throughput/samples_per_s", "throughput/samples_per_s_kept", "step_time/ms",
                "memory/peak_gb", "breakdown/dataloader", "breakdown/cpu_op"} <= series
        # A CPU session: no kernels, copies or runtime, so no series for them (they were all zeros)
        assert not {"breakdown/kernel", "breakdown/memcpy", "breakdown/memset", "breakdown/runtime",
                    "breakdown/communication", "gpu/utilization"} & series, series

        def points(tag):
            query = urllib.parse.urlencode({"run": "session", "tag": tag})
            return [(step, round(value, 1)) for _wall, step, value in
                    _get_json(f"{base}/data/plugin/scalars/scalars?{query}")]

        measured = [r for r in rows if r["samples_per_s"] is not None]
        assert points("throughput/samples_per_s") == [(r["index"], round(r["samples_per_s"], 1)) for r in measured]
        # The ladder: after each trial, the samples/s of the setting kept (01 kept, 02 reverted, 03 kept)
        ladder = [rows[0], rows[1], rows[1], rows[3], rows[3]]
        assert [r["decision"] for r in rows] == ["baseline", "kept", "reverted", "kept", "failed"]
        assert points("throughput/samples_per_s_kept") == [
            (i, round(r["samples_per_s"], 1)) for i, r in enumerate(ladder)]

        text_tags = _get_json(f"{base}/data/plugin/text/tags")["session"]
        query = urllib.parse.urlencode({"run": "session", "tag": text_tags[0]})
        texts = _get_json(f"{base}/data/plugin/text/text?{query}")
        assert [t["step"] for t in texts] == [r["index"] for r in rows]
        baseline = texts[0]["text"]
        assert "DataLoader.__next__" in baseline and "<strong>next</strong>" not in baseline, baseline
        assert "out of memory at batch 128" in texts[-1]["text"]

        assert sorted(profiled["runs"]) == sorted(traced)
        for run in traced:
            assert {"Overview", "Operator", "Trace", "Memory"} <= set(_get_json(f"{profiler}/views?run={run}"))
            worker = _get_json(f"{profiler}/workers?run={run}&view=Overview")[0]
            span = (_get_json(f"{profiler}/spans?run={run}&worker={worker}") or [""])[0]
            query = urllib.parse.urlencode({"run": run, "worker": worker, "span": span})
            overview = _get_json(f"{profiler}/overview?{query}")
            assert overview["steps"]["rows"] and {"title": "Device Type", "value": "CPU"} in overview["environments"]
            operators = _get_json(f"{profiler}/operation?{query}&group_by=Operation")
            assert operators["host_total_time"]["rows"]
            assert len(_get_json(f"{profiler}/trace?{query}")["traceEvents"]) > 100
            assert _get_json(f"{profiler}/memory?{query}")["metadata"]["default_device"] == "CPU"
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def test_tensorboard_text_shows_names_as_written():
    """Markdown in a trial's name, change or reason (or HTML) renders as the characters written, through the
    Markdown renderer of TensorBoard's Text tab."""
    from tensorboard.plugin_util import markdown_to_safe_html

    from advisor.report.tensorboard import trial_text

    odd = r"__init__ *x* [a](b) `c` # 1. - + ! | \ & <b>html</b>"
    row = {"name": odd, "change": odd, "decision": "kept", "status": "ok", "reason": odd}
    html = markdown_to_safe_html(trial_text(row, None))
    text = html.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
    assert text.count(odd) == 3 and "<strong>init</strong>" not in html and "<b>html</b>" not in html, html


def test_trace_report_shows_the_memory_timeline(tmp_path):
    from conftest import gpu_trace

    from advisor.report import write_report

    out = write_report(gpu_trace("v100-memory-events.pt.trace.json.gz"), tmp_path / "v100.html")
    html = out.read_text()
    assert "Memory over time" in html
    assert 'alt="Allocated memory over the trace" src="data:image/svg+xml;base64,' in html


def test_session_report_lists_the_scripts_lint_findings(tmp_path):
    from advisor.code.lint import lint_source

    from advisor.report import write_report
    from report_helpers import build_session

    session_dir = build_session(tmp_path / "session")
    session = json.loads((session_dir / "session.json").read_text())
    script = "import torch\nfor x in data:\n    loss = model(x)\n    loss.backward()\n    torch.cuda.empty_cache()\n"
    findings = lint_source(script, "train <script>.py")
    assert findings
    session["lint"] = [f.to_dict() for f in findings]
    (session_dir / "session.json").write_text(json.dumps(session))
    html = write_report(session_dir, tmp_path / "report.html").read_text()
    assert 'id="lint"' in html
    assert "train &lt;script&gt;.py:5" in html
    assert findings[0].title in html


# ---- what the page says after a session, as a user reads it in the browser ----

def section(text: str, heading: str, next_heading: str) -> str:
    """The rendered text between two headings of the page."""
    return text.split(heading, 1)[1].split(next_heading, 1)[0]


def test_advice_after_a_session_agrees_with_what_it_measured(browser, tmp_path: Path):
    """A recommendation the session tried and reverted is shown with what it measured, not as open advice;
    the verdict names what still binds the best trial; prediction and measurement share one unit; lint fixes
    give way to the knob the session measured, and copy advice to a CPU session's device."""
    session_dir = build_session(tmp_path / "session", patch=PATCH)
    path = session_dir / "session.json"
    session = json.loads(path.read_text())
    assert session["device"]["type"] == "cpu" and session["final_knobs"]["num_workers"] == 2
    rows = session["trials"]
    rows[0].update(bound="input", bound_evidence=["the loop waited for its next batch 52% of the time"])
    rows[1]["gain"], rows[2]["gain"] = 0.8, -0.028  # as their reasons say: against the best when tried
    for row in rows:
        if row["samples_per_s"]:
            row["interval"] = [0.9 * row["samples_per_s"], 1.1 * row["samples_per_s"]]
        if row["predicted_gain"] is not None:
            row["predicted_samples_gain"] = 1 / (1 - row["predicted_gain"]) - 1  # as the session records it
    session.update(
        bound={"name": "compute", "label": "compute", "evidence": ["the CPU computes 71% of the step"]},
        cwd="/home/user/project",
        options={**session["options"], "script_args": [], "timeout_s": 600.0, "time_budget_s": None},
        lint=[{"file": "/home/user/project/train.py", "line": 9, "col": 0, "rule": "dataloader-num-workers",
               "title": "DataLoader without worker processes", "what": "built without `num_workers`",
               "why": "batches load in the training process", "fix": "DataLoader(data, num_workers=4)"},
              {"file": "/home/user/project/train.py", "line": 9, "col": 0, "rule": "dataloader-pin-memory",
               "title": "DataLoader without pin_memory on a CUDA path", "what": "does not pin memory",
               "why": "pageable copies are staged", "fix": "DataLoader(data, pin_memory=True)"}])
    path.write_text(json.dumps(session))
    out = write_report(session_dir, tmp_path / "report.html")
    text = Elements(dump_dom(out)).all_text()

    top = section(text, "Verdict", "Ladder")
    assert "What held the baseline back" in top and "the loop waited for its next batch 52% of the time" in top
    assert "What still binds it" in top and "compute — the CPU computes 71% of the step" in top
    assert "amp bf16 (02-amp-bf16): -2.8% samples/s, reverted" in section(top, "Tried, not kept", "Best trial")
    assert "Autocast" not in top  # the baseline's top prediction is no headline once AMP was measured

    still_open = section(text, "Recommendations still open", "Static checks of the script")
    assert "predicted gain" not in still_open  # the only open advice (AMP) was measured: no prediction shown
    measured = section(still_open, "Advised, measured, not kept", "\n\n\n")
    assert "Autocast matmuls and convolutions to bf16 (CPU AMP): amp bf16 (02-amp-bf16): -2.8% samples/s" in measured

    trials = section(text, "All trials", "Throughput per trial")
    assert "predicted change" in trials and "measured change" in trials and "predicted gain" not in trials
    assert "+42.9%" in trials  # a predicted 30% of the step saved is +42.9% samples/s, beside the measured +80.0%
    assert "+80.0%" in trials

    lint = section(text, "Static checks of the script", "Suggested code change")
    assert "This session: measured: num_workers=2 was kept (03-batch-64); the suggested patch sets it" in lint
    assert "This session: not measured: it ran on the CPU" in lint

    assert "cd /home/user/project\n" + session["command"] in text  # Reproduce: where to run it from
    options = section(text, "Options:", "Written by advisor")
    assert "timeout_s=600" in options and "keep_effective_batch=no" in options
    assert "None" not in options and "[]" not in options and "600.0" not in options
    assert re.search(r"00-baseline · baseline\s", text) and "00-baseline · baseline · baseline" not in text

    svgs = chart_svgs(out.read_text())
    throughput = next(s for s in svgs if b"steady state" in s)
    assert b"95% interval" in throughput  # the tables' interval, drawn
    memory = next(s for s in svgs if b"peak memory, GB" in s)
    assert b"off the scale" in memory and b"capacity 25" in memory  # host RAM named, not drawn as the axis

    from advisor.report.notebook import render_session_html  # the notebook's verdict: the same rows
    notebook = render_session_html(session_dir)
    assert "What still binds it" in notebook and "Tried, not kept" in notebook


def test_failed_baseline_shows_the_users_traceback(browser, tmp_path: Path):
    """A session whose script fails at once: the page says what failed, with the user's traceback, and draws
    no ladder, charts, best trial or advice."""
    from conftest import advisor_main

    script = tmp_path / "broken.py"
    script.write_text('import torch\n\ndef load_rows(path):\n    with open(path) as f:\n        return list(f)\n\n'
                      'rows = load_rows("missing.csv")\n')
    done = advisor_main("profile", str(script), "--device", "cpu", "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert done.returncode != 0
    session = json.loads((tmp_path / "run" / "session.json").read_text())
    assert session["status"] == "failed" and session["cwd"] == str(tmp_path)
    html = (tmp_path / "run" / "report.html").read_text()
    text = Elements(dump_dom(tmp_path / "run" / "report.html")).all_text()
    verdict = section(text, "Verdict", "Recommendations still open")
    assert "What failed" in verdict and "FileNotFoundError" in verdict
    assert 'rows = load_rows("missing.csv")' in verdict and "Traceback (most recent call last)" in verdict
    assert "Best trial" not in text and "Ladder" not in text and "Throughput per trial" not in text
    assert 'id="chart-throughput"' not in html and "Nothing left to recommend" not in text
    assert "None: no trial was measured." in text


def test_the_ladder_does_not_repeat_a_setting_a_re_measure_confirmed():
    from advisor.report.html import ladder_rows

    rows = [{"name": "00-baseline", "decision": "baseline", "recommendation": None, "knobs": {}},
            {"name": "01-workers-2", "decision": "kept", "recommendation": "more-workers", "knobs": {"num_workers": 2}},
            {"name": "02-amp-bf16", "decision": "reverted", "recommendation": "amp", "knobs": {"amp": "bf16"}},
            {"name": "03-confirm-01", "decision": "kept", "recommendation": "confirm", "knobs": {"num_workers": 2}},
            {"name": "04-confirm-02", "decision": "kept", "recommendation": "confirm", "knobs": {"amp": "bf16"}}]
    assert [r["name"] for r in ladder_rows(rows)] == ["00-baseline", "01-workers-2", "04-confirm-02"]
