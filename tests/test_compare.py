"""`advisor compare A B` on real pairs of recorded runs: the loader's workers (traces), AMP (two trials of one
recording on an H100), one setting measured twice, a slower pair against the CI gate, session folders, a
data-parallel job's ranks; its JSON document, its page in headless Chromium and its notebook view."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import advisor
from advisor.analysis.compare import SCHEMA, compare
from advisor.analysis.kernels import is_tensor_core
from conftest import SAMPLE_RUNS, SURFACES, TRACES, require, run_advisor
from report_helpers import rewrite_trace_names, run_chromium

WORKERS_0 = TRACES / "resnet50-v100-workers0.pt.trace.json.gz"
WORKERS_4 = TRACES / "resnet50-v100-workers4.pt.trace.json.gz"
H100 = SURFACES / "h100-image-classifier"
CPU = SURFACES / "cpu-image-classifier"
# One setting measured twice (runs 1 and 3 of the surface's three, in its shuffled order; run 3 kept no trace).
TWICE = ("num_workers=0-batch_size=128-uint8_copies=on-threads=1-r1", "num_workers=0-batch_size=128-uint8_copies=on-threads=1-r3")
# Two workers, then none: the loader bound comes back.
FAST, SLOW = "num_workers=2-batch_size=32-uint8_copies=off-threads=1-r1", "num_workers=0-batch_size=32-uint8_copies=off-threads=1-r1"


def compare_json(*args: str) -> tuple[int, dict]:
    """`advisor compare ... --json` as a real process: its exit code and document."""
    done = run_advisor("compare", *args, "--json")
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


def test_loader_workers_pair_names_the_loader_wait_as_what_moved():
    """ResNet-50 with 0, then 4 DataLoader workers (the same training on a V100): the loader wait is what moved,
    the single-process loader's operator is gone and the multi-process one came, and B is faster."""
    code, doc = compare_json(str(WORKERS_0), str(WORKERS_4))
    assert code == 0 and doc["schema"] == SCHEMA
    assert doc["moved_most"]["role"] == "dataloader" and doc["moved_most"]["change_ms"] < -50
    assert doc["verdict"]["word"] == "faster" and doc["verdict"]["unit"] == "steps/s"  # traces alone: no batch size
    low, high = doc["verdict"]["interval"]
    assert 1 < low < doc["verdict"]["ratio"] < high
    operators = {m["name"]: m for m in doc["operators"]["names"]}
    single = operators["enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"]
    assert single["status"] == "removed" and single["a_ms"] > 40
    families = doc["operators"]["families"]
    assert families[0]["name"] == "DataLoader" and families[0]["change_ms"] < -40  # the family that moved most
    assert doc["settings"] == []  # traces without trial.json: no settings recorded to differ
    assert any("ProfilerStep spans" in n for n in doc["notes"])

    done = run_advisor("compare", str(WORKERS_0), str(WORKERS_4))
    assert done.returncode == 0, done.stderr
    assert "B is 25.9% faster than A" in done.stdout
    assert re.search(r"Moved most: loader wait \(DataLoader\): 59\.26 → 1\.19 ms per step", done.stdout)


def test_amp_trials_name_the_kernels_moved_to_tensor_cores():
    """Two trials of one H100 recording, fp32 and AMP bf16 (the image classifier, batch 32, no workers): the
    settings name the AMP knob, and the kernels that came onto Tensor Cores are bf16 Tensor Core kernels."""
    c = compare(H100 / "fp32-b32-w0-pageable", H100 / "bf16-b32-w0-pageable")
    assert ("knob amp", None, "bf16") in c.settings
    onto = c.tensor_cores["moved_onto"]
    assert onto and all(is_tensor_core("nvidia", m.name) and m.change_us > 0 for m in onto)
    assert any("bf16" in m.name and m.status == "added" for m in onto)
    assert all(m.b_us == 0 or m.change_us < 0 for m in c.tensor_cores["moved_off"])
    assert "6 kernel(s) came onto Tensor Cores" in c.tensor_cores["text"]
    # cuDNN ran some fp32 convolutions as TF32 on Tensor Cores already: bf16 replaced those too, so the Tensor
    # Core share does not rise here; the FP32-unit matmuls halved.
    fp32 = next(m for m in c.kernel_families if m.name == "matmul/conv (FP32 units)")
    assert fp32.b_us < 0.6 * fp32.a_us
    # A loader-bound step: AMP leaves it as fast as it was, within the noise of the ten profiled steps.
    assert c.verdict.word == "same" and c.moved_most[0] == "dataloader"


def test_amp_traces_move_matmuls_from_fp32_units_to_tensor_cores():
    """The char transformer on an H100, fp32 then AMP bf16: the Tensor Core share rises and the FP32 matmul
    family all but leaves."""
    c = compare(TRACES / "h100-char-transformer-fp32.pt.trace.json.gz",
                TRACES / "h100-char-transformer-bf16.pt.trace.json.gz")
    assert c.tensor_cores["b_share"] > c.tensor_cores["a_share"] + 0.1
    fp32 = next(m for m in c.kernel_families if m.name == "matmul/conv (FP32 units)")
    assert fp32.b_us < 0.1 * fp32.a_us
    assert any(m.status == "removed" and "sgemm" in m.name for m in c.tensor_cores["moved_off"])


def test_one_setting_measured_twice_is_the_same_within_the_noise():
    """The same setting's runs 1 and 3: the same within the noise, and the gate at 5% passes (exit 0); a run
    against itself is a ratio of exactly 1."""
    a, b = (str(CPU / name) for name in TWICE)
    code, doc = compare_json(a, b, "--fail-if-slower", "5")
    assert code == 0 and doc["verdict"]["word"] == "same" and doc["gate"] == {"fail_if_slower": 5.0, "failed": False}
    assert doc["a"]["source"] == doc["b"]["source"] == "windows"
    assert doc["breakdown"] == [] and any("kept no trace" in n for n in doc["notes"])  # run 3 kept none
    low, high = doc["verdict"]["interval"]
    assert low < 1 < high
    done = run_advisor("compare", a, a, "--fail-if-slower", "5")
    assert done.returncode == 0 and "the same within the noise" in done.stdout and "passed" in done.stdout


def test_runs_from_two_machines_say_so_beside_the_verdict():
    """The image classifier recorded on an AMD EPYC with avx512_bf16 (the CPU surface) against the same script's
    session on an Intel Xeon with AMX and another torch: the difference is said to be the machines' as much as the
    settings', naming which facts differ, beside the verdict in the terminal and in the document. Two runs of one
    machine (the surface's runs 1 and 3; the surface against the conv example's session, recorded on that
    machine's kind) say nothing of it. One CPU model name ("AMD EPYC") covers CPUs with and without bf16
    instructions: those are a setting of their own."""
    surface = str(CPU / FAST)
    code, doc = compare_json(surface, str(SAMPLE_RUNS / "image_classifier"))
    assert code == 0 and doc["machines"].startswith("A and B ran on different machines")
    assert "(device, CPU bf16 instructions, torch:" in doc["machines"]
    settings = {s["name"]: (s["a"], s["b"]) for s in doc["settings"]}
    assert settings["CPU bf16 instructions"] == ("avx512_bf16", "amx_bf16, amx_tile, avx512_bf16")
    assert "CPU cores" not in settings  # two cores each
    done = run_advisor("compare", surface, str(SAMPLE_RUNS / "image_classifier"))
    said, figures = done.stdout.find("A and B ran on different machines"), done.stdout.find("\nFigures")
    assert 0 < said < figures, done.stdout  # with the verdict, before the tables
    for pair in ((CPU / TWICE[0], CPU / TWICE[1]), (CPU / FAST, SAMPLE_RUNS / "conv_classifier")):
        assert compare(*pair).machines is None


def test_a_slower_pair_fails_the_gate():
    """Two workers, then none: B is slower beyond the noise, by more than 5% (exit 1) but not more than 50%
    (exit 0); the other way round B is faster, and the gate passes."""
    a, b = str(CPU / FAST), str(CPU / SLOW)
    code, doc = compare_json(a, b, "--fail-if-slower", "5")
    assert code == 1 and doc["verdict"]["word"] == "slower" and doc["gate"]["failed"] is True
    assert doc["verdict"]["interval"][1] < 1
    assert {"name": "knob num_workers", "a": "2", "b": "0"} in doc["settings"]
    assert doc["moved_most"]["role"] == "dataloader"
    done = run_advisor("compare", a, b, "--fail-if-slower", "5")
    assert done.returncode == 1 and "FAILED" in done.stdout
    assert run_advisor("compare", a, b, "--fail-if-slower", "50").returncode == 0
    code, doc = compare_json(b, a, "--fail-if-slower", "5")
    assert code == 0 and doc["verdict"]["word"] == "faster"


def test_session_folders_and_their_trials():
    """A session folder stands for its best trial: the char transformer's best against its own baseline."""
    session = SAMPLE_RUNS / "char_transformer"
    best = json.loads((session / "session.json").read_text())["best"]
    c = compare(session / "trials" / "00-baseline", session)
    assert c.b.kind == "session" and best in c.b.label and c.a.kind == "trial"
    assert any(name.startswith("knob") for name, _, _ in c.settings)
    assert c.verdict.unit == "samples/s" and c.verdict.ratio > 1


def test_data_parallel_runs_name_each_slowest_rank():
    """Two trials of the two-rank DDP sample: each side's slowest rank, with its step and bound."""
    trials = SAMPLE_RUNS / "ddp_classifier" / "trials"
    code, doc = compare_json(str(trials / "00-baseline"), str(trials / "02-batch-128"))
    for side in ("a", "b"):
        rank = doc["ranks"][side]
        assert rank["ranks"] == 2 and rank["rank"] in (0, 1) and rank["step_ms"] > 0
        assert len(doc[side]["traces"]) == 2
    assert {"name": "knob batch_size", "a": None, "b": "128"} in doc["settings"]


def test_bad_input_is_one_line():
    done = run_advisor("compare", str(WORKERS_0), "/nonexistent/run")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "/nonexistent/run" in done.stderr
    done = run_advisor("compare", str(WORKERS_0), str(WORKERS_4), "--fail-if-slower", "-1")
    assert done.returncode == 2 and "--fail-if-slower" in done.stderr


def test_notebook_view_and_frame():
    """advisor.compare returns a Comparison that renders in a notebook (scoped styles, the verdict, the
    tables) and converts to a frame and to the JSON document."""
    c = advisor.compare(WORKERS_0, WORKERS_4)
    html = c._repr_html_()
    assert html.startswith('<div class="advisor-nb">') and "B is 25.9% faster than A" in html
    assert "_SingleProcessDataLoaderIter" in html and "<script" not in html
    frame = c.to_frame()
    assert list(frame.columns) == ["figure", "unit", "a", "b", "change"] and "loader wait per step" in set(frame.figure)
    assert c.to_dict()["schema"] == SCHEMA


@pytest.fixture(scope="module")
def browser() -> str:
    """The chromium executable: skipped with the reason and the fix where it is not installed, never in CI
    (conftest's `require`, as the report's browser tests)."""
    return require("chromium")


def test_page_in_chromium(browser, tmp_path: Path):
    """The page of `--html`, as Chromium builds it: the verdict, the breakdown and the settings tables; names
    from the trace that carry markup stay text."""
    hostile = rewrite_trace_names(WORKERS_4, tmp_path / "hostile.pt.trace.json.gz", ("<b>x</b>", "<img src=x>"))
    out = tmp_path / "compare.html"
    done = run_advisor("compare", str(WORKERS_0), str(hostile), "--html", str(out))
    assert done.returncode == 0, done.stderr
    html = out.read_text()
    assert "<script" not in html and "<b>x</b>" not in html and "&lt;b&gt;x&lt;/b&gt;" in html
    dumped = run_chromium("--dump-dom", out.as_uri())
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    dom = dumped.stdout
    # The rewritten names hide the ProfilerStep spans too (the whole trace is one step): whatever the verdict,
    # the page shows it, with the step's breakdown and the names as text.
    assert re.search(r'data-verdict="(faster|slower|same|unknown)"', dom) and "Where the step's time moved" in dom
    assert dom.count('class="compare-breakdown"') == 1 and "<b>x</b>" not in dom and "<img src=" not in dom
    shot = tmp_path / "compare.png"
    done = run_chromium(f"--screenshot={shot}", "--window-size=1280,1600", out.as_uri())
    assert done.returncode == 0 and shot.stat().st_size > 10_000


def test_one_step_each_has_no_noise_to_judge_against():
    """Two traces of one step each (the legacy format's, the MI250's last complete one): the ratio is given,
    the verdict is "unknown", and the gate does not fail on it."""
    code, doc = compare_json(str(TRACES / "mi250-rocm-minitoy.pt.trace.json.gz"),
                             str(TRACES / "legacy-format-computeProperties.json.gz"), "--fail-if-slower", "1")
    assert code == 0 and doc["verdict"]["word"] == "unknown" and doc["verdict"]["interval"] is None
    assert doc["verdict"]["ratio"] < 0.8 and doc["gate"]["failed"] is False
