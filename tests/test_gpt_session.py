"""A real session on the GPT example (attention written by hand): the trace's rule proposes `sdpa`, the trial
applies and measures it, the session keeps or reverts it and says which; the analysis gives attention's share
by hand in the baseline and fused in the sdpa trial; the patch applies and runs with the same losses."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from advisor.code.patch import suggest_patch
from advisor.trials.knobs import APPLIED, Knobs
from conftest import ROOT, advisor_main, run_script, require


@pytest.fixture(scope="module")
def gpt_session(tmp_path_factory) -> Path:
    """A session of three short trials on examples/gpt.py, sdpa the only knob it may turn (the search
    proposes it from the baseline's trace: no --try)."""
    root = tmp_path_factory.mktemp("gpt")
    shutil.copytree(ROOT / "examples", root / "examples", ignore=shutil.ignore_patterns("data", "*.ipynb"))
    out = root / "session"
    done = advisor_main("profile", "examples/gpt.py", "--device", "cpu", "--out", str(out), "--max-trials", "3",
                        "--steps", "2", "--windows", "2", "--window", "0.3", "--only", "sdpa",
                        "--", "--batch-size", "8", "--context", "64", cwd=root)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def sdpa_row(state: dict) -> dict:
    """The session's row that turned sdpa on."""
    return next(t for t in state["trials"] if (t.get("knobs") or {}).get("sdpa"))


def test_the_session_proposes_applies_and_decides_sdpa(gpt_session):
    state = json.loads((gpt_session / "session.json").read_text())
    row = sdpa_row(state)
    assert row["recommendation"] == "sdpa" and row["outcomes"]["sdpa"] == APPLIED
    assert row["decision"] in ("kept", "reverted") and "samples/s" in row["reason"]  # measured, and said so
    best = next(t for t in state["trials"] if t["name"] == state["best"])
    kept = bool((state["final_knobs"] or {}).get("sdpa"))
    assert kept == bool(best["knobs"].get("sdpa"))  # the final settings are the best trial's
    if row["decision"] == "reverted":
        assert not kept
    plan = json.loads((gpt_session / row["folder"] / "trial.json").read_text())["attention_plan"]
    assert [p["class"] for p in plan] == ["CausalSelfAttention"]
    assert "is_causal=True" in plan[0]["statement"] and "dropout_p=self.attn_dropout.p" in plan[0]["statement"]
    if kept:
        assert "scaled_dot_product_attention" in (gpt_session / "suggested.patch").read_text()


def test_attention_share_by_hand_in_the_baseline_and_fused_with_sdpa(gpt_session):
    state = json.loads((gpt_session / "session.json").read_text())
    figures = {}
    for name in (state["trials"][0]["folder"], sdpa_row(state)["folder"]):
        done = advisor_main("analyze", str(gpt_session / name), "--json")
        assert done.returncode == 0, done.stderr
        figures[name] = json.loads(done.stdout)["traces"][0]
    baseline, fused = (figures[k]["attention"] for k in figures)
    assert baseline["implementations"] == ["hand-written"] and baseline["per_step"] == 4  # four blocks
    assert 0 < baseline["hand_written_share"] == baseline["share"] < 1 and baseline["fused_share"] == 0
    assert fused["hand_written_share"] == 0 and 0 < fused["fused_share"] < 1 and fused["per_step"] == 4
    assert "hand-written" not in fused["implementations"] and fused["implementations"]
    text = advisor_main("analyze", str(gpt_session / state["trials"][0]["folder"])).stdout
    assert "Attention share of step" in text and "hand-written" in text
    assert "sdpa" in [r["id"] for r in figures[state["trials"][0]["folder"]]["recommendations"]]


def losses(script: Path) -> list[float]:
    """The first steps' losses of the GPT script, without dropout (its random draws differ in the fused call)."""
    # As `python SCRIPT` runs it, forked from this worker's zygote (torch imported there already).
    done = run_script(script, "--dropout", "0", "--max-steps", "3", "--log-every", "1", "--batch-size", "4",
                      "--context", "32", cwd=script.parent, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:]
    return [float(x) for x in re.findall(r"loss (\S+)", done.stdout)]


def test_the_patch_applies_and_runs_with_the_same_losses(gpt_session, tmp_path):
    require("patch")
    state = json.loads((gpt_session / "session.json").read_text())
    plan = json.loads((gpt_session / sdpa_row(state)["folder"] / "trial.json").read_text())["attention_plan"]
    script = Path(plan[0]["file"])
    diff = suggest_patch(script, None, Knobs(sdpa=True), state["user_values"], root=script.parent.parent,
                         attention_plan=plan)
    # One call in place of the five lines, split one argument a line where it passes the file's width.
    added = "".join(line[1:].strip() for line in diff.splitlines() if line.startswith("+ "))
    assert diff.count("\n-        ") == 5 and "y = F.scaled_dot_product_attention(q," in added
    assert "is_causal=True" in added and max(len(line) - 1 for line in diff.splitlines() if line.startswith("+ ")) <= 100
    shutil.copytree(script.parent, tmp_path / "examples")
    applied = subprocess.run(["patch", "-p1"], input=diff, cwd=tmp_path, capture_output=True, text=True)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    before, after = losses(script), losses(tmp_path / "examples" / "gpt.py")
    assert len(before) == 3 and after == pytest.approx(before, rel=1e-4)
