"""The script's own settings (issue 53): read from the running trial, recorded with where the script sets them,
never proposed, credited or patched again. Real CPU trials and a real CPU session; the search's side on the
recorded H100 surface, replayed as a script that autocasts to bf16 itself."""

from __future__ import annotations

import json
from pathlib import Path

from advisor.search.proposal import own_moves
from advisor.search.session import run_session
from advisor.search.state import SessionOptions
from advisor.search.strategy import surface_space
from advisor.trials.knobs import Knobs
from advisor.trials.replay.surface import ReplayRunner, load_surface
from advisor.trials.launch.runner import run_trial
from advisor.trials.spec import TrialSpec
from conftest import SURFACES, advisor_main
from trial_helpers import trial_record, write_script

# A loop that autocasts to bf16 and builds its optimizer fused itself (the GPT, small).
OWN_AMP_FUSED = '''
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 8))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
loader = DataLoader(TensorDataset(torch.randn(4096, 64), torch.randint(0, 8, (4096,))), batch_size=32)
for epoch in range(100):
    for x, y in loader:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
'''

# A convnet the script compiles and puts in channels_last itself, accumulating gradients over two batches;
# its evaluation runs under autocast, without gradients (not a training setting).
OWN_COMPILE_LAYOUT = '''
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                      nn.Linear(8, 4)).to(memory_format=torch.channels_last)
model = torch.compile(model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
    model(torch.randn(2, 3, 16, 16))
for i in range(200):
    x = torch.randn(8, 3, 16, 16).contiguous(memory_format=torch.channels_last)
    loss = nn.functional.cross_entropy(model(x), torch.randint(0, 4, (8,)))
    loss.backward()
    if i % 2 == 1:
        optimizer.step()
        optimizer.zero_grad()
'''


def line_of(script: Path, text: str) -> int:
    """The 1-based line of the script that holds `text`."""
    return next(i for i, line in enumerate(script.read_text().splitlines(), 1) if text in line)


def test_a_trial_records_the_scripts_own_settings_but_not_the_advisors_autocast(tmp_path):
    """Compiled, channels_last, accumulating: each read from the running trial, with the compile's line. The
    trial's own bf16 autocast (the amp knob) is the advisor's, and an autocast under no_grad is an
    evaluation's: neither is taken for the script's."""
    script = write_script(tmp_path, OWN_COMPILE_LAYOUT)
    result = run_trial(TrialSpec(str(script), Knobs(amp="bf16"), tmp_path / "t", steps=4, device="cpu"))
    record = trial_record(result.path)
    assert record["status"] == "ok", record.get("message")
    own = record["own_settings"]
    assert "amp" not in own, own
    assert own["compile"] == {"value": True, "what": "torch.compile",
                              "site": f"{script}:{line_of(script, 'torch.compile(')}"}
    assert own["channels_last"]["value"] is True and own["accumulation_steps"]["value"] == 2
    assert record["user_values"]["compile"] is True and record["user_values"]["accumulation_steps"] == 2
    assert record["knob_outcomes"]["amp"] == "applied"


def test_own_moves_are_the_ones_that_change_nothing_in_effect():
    user = {"amp": "bf16", "fused_optimizer": True, "num_workers": 4, "persistent_workers": False}
    assert own_moves({"amp": "bf16"}, Knobs(), user) == {"amp": "bf16"}
    assert own_moves({"amp": "fp16"}, Knobs(), user) == {}  # another value is a move from the user's
    assert own_moves({"num_workers": 8, "persistent_workers": True}, Knobs(), user) == {}
    assert own_moves({"num_workers": 4}, Knobs(num_workers=2), user) == {}  # the best moved it: 4 is a move


class Bf16Script(ReplayRunner):
    """The recorded H100 surface as a script that runs under its own bf16 autocast: its baseline is the
    recorded bf16 point, and the record says so as a live trial would."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.user_values = {**self.user_values, "amp": "bf16"}

    def __call__(self, name, knobs, against=None):
        result = super().__call__(name, knobs, against)
        path = result.path / "trial.json"
        record = json.loads(path.read_text())
        record["user_values"] = {**(record.get("user_values") or {}), "amp": "bf16"}
        record["own_settings"] = {"amp": {"value": "bf16", "what": "bf16 autocast", "site": "train.py:84"}}
        path.write_text(json.dumps(record))
        return result


def test_a_replayed_session_never_proposes_or_credits_the_scripts_own_autocast(tmp_path):
    """On the surface as recorded, AMP bf16 is proposed and measured; on the same surface as a script that
    autocasts itself, no trial sets amp=bf16, and the baseline row names the script's own."""
    surface = SURFACES / "h100-image-classifier"
    points = load_surface(surface)
    states = {}
    for name, runner in (("plain", ReplayRunner), ("bf16", Bf16Script)):
        out = tmp_path / name
        states[name] = run_session(f"{surface}:replay", out, SessionOptions(max_trials=10), log=lambda m: None,
                                   runner=runner(points, out), script=False, space=surface_space(points),
                                   outputs=False)
    assert any(t["knobs"].get("amp") == "bf16" for t in states["plain"]["trials"])
    own = states["bf16"]
    assert not any(t["knobs"].get("amp") == "bf16" for t in own["trials"]), [t["change"] for t in own["trials"]]
    assert not any("AMP" in (t.get("change") or "") for t in own["trials"])
    assert own["trials"][0]["reason"].endswith("; the script's own: bf16 autocast, train.py line 84")
    assert own["final_knobs"].get("amp") is None and own["own_settings"]["amp"]["value"] == "bf16"


def test_a_cpu_session_on_a_script_with_its_own_autocast_and_fused_optimizer(tmp_path):
    """Neither is run again (--try asks for both: each is a note, not a trial), neither is credited, the patch
    writes neither, and the baseline row names both with their lines."""
    script = write_script(tmp_path, OWN_AMP_FUSED, "train.py")
    out = tmp_path / "session"
    done = advisor_main("profile", str(script), "--device", "cpu", "--try", "amp", "--try", "fused_optimizer",
                        "--max-trials", "2", "--windows", "2", "--window", "0.3", "--steps", "2", "--wait", "1",
                        "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    state = json.loads((out / "session.json").read_text())
    amp_line, fused_line = line_of(script, "torch.autocast("), line_of(script, "fused=True")
    assert state["user_values"]["amp"] == "bf16" and state["user_values"]["fused_optimizer"] is True
    assert state["trials"][0]["reason"] == (f"the user's own settings; the script's own: bf16 autocast, train.py "
                                            f"line {amp_line}; fused AdamW, train.py line {fused_line}")
    for knob, what in (("amp", "bf16 autocast"), ("fused_optimizer", "fused AdamW")):
        assert f"--try {knob}: not run, the script has it already ({what}, train.py line" in " ".join(state["notes"])
    assert not any(t["knobs"].get("amp") or t["knobs"].get("fused_optimizer") for t in state["trials"])
    assert "the script's own: bf16 autocast" in done.stdout
    assert f"own: bf16 autocast, train.py line {amp_line}; fused AdamW" in (out / "report.html").read_text()
    patch = (out / "suggested.patch").read_text() if (out / "suggested.patch").exists() else ""
    assert "autocast" not in "".join(l for l in patch.splitlines(True) if l.startswith("+"))
    assert "fused" not in "".join(l for l in patch.splitlines(True) if l.startswith("+"))


def test_what_nothing_predicted_says_no_prediction_not_zero(tmp_path):
    """Issue 54: a change no rule or model predicted (a knob taken off again, a --try no advice speaks for, the
    re-measures) records no prediction; the what-if model's and the rules' figures are still recorded."""
    surface = SURFACES / "h100-image-classifier"
    points = load_surface(surface)
    out = tmp_path / "s"
    state = run_session(f"{surface}:replay", out, SessionOptions(max_trials=10, tries=("tf32",)), log=lambda m: None,
                        runner=ReplayRunner(points, out), script=False, space=surface_space(points))
    rows = {t["name"]: t for t in state["trials"]}
    tried = next(t for t in rows.values() if t["recommendation"] == "try")
    assert tried["predicted_gain"] is None and tried["predicted_samples_gain"] is None
    assert any(t["predicted_samples_gain"] is not None for t in rows.values() if t["recommendation"] != "try")
    assert all(t["predicted_gain"] is None for t in rows.values() if t["recommendation"] in ("confirm", "best-again"))
    assert "no prediction" in (out / "report.html").read_text()
