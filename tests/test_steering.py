"""The user steers the search: `--only`, `--skip` and `--try`, on sessions replayed from the H100 surface
(fast), through the CLI (errors, the record, `--resume`), and one real CPU session for `--try`/`--skip`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from advisor.errors import AdvisorError
from advisor.search.runner_up import contender
from advisor.search.session import run_session
from advisor.search.space import KNOB_NAMES, check_steering, knob_names, try_settings
from advisor.search.state import SessionOptions
from advisor.search.strategy import surface_space, turned
from advisor.trials.replay.surface import ReplayRunner, load_surface
from conftest import ROOT, SURFACES, advisor_main

SURFACE = SURFACES / "h100-image-classifier"


def replay(out: Path, options: SessionOptions, runner=None) -> dict:
    points = load_surface(SURFACE)
    return run_session(f"{SURFACE}:replay", out, options, log=lambda m: None,
                       runner=runner or ReplayRunner(points, out, 0.05, 1), script=False,
                       space=surface_space(points), extra={"replay": str(SURFACE)}, outputs=False)


def turned_by(state: dict) -> set[str]:
    """Every knob any trial of the session set away from the user's own values."""
    return set().union(*(turned({}, {k: v for k, v in t["knobs"].items() if v is not None})
                         for t in state["trials"][1:]))


def test_knob_names_and_try_settings_are_checked_in_one_line():
    assert knob_names(["amp,batch_size", "compile"], "--only") == ("amp", "batch_size", "compile")
    with pytest.raises(AdvisorError) as bad:
        knob_names(["amp,batchsize"], "--only")
    message = str(bad.value)
    assert message.startswith("--only: unknown knob 'batchsize' (known: ") and "\n" not in message
    assert all(name in message for name in KNOB_NAMES)
    assert try_settings("uint8_copies") == {"uint8_copies": True}
    assert try_settings("amp") == {"amp": "bf16"}
    assert try_settings("amp=fp16,channels_last,batch_size=128") == {"amp": "fp16", "channels_last": True,
                                                                     "batch_size": 128}
    assert try_settings("num_workers=4") == {"num_workers": 4, "persistent_workers": True}
    for text, said in (("batch_size", "batch_size needs a value"), ("batch_size=lots", "a whole number"),
                       ("amp=fp8", "amp must be one of"), ("compile=maybe", "true or false"),
                       ("speed=11", "unknown knob 'speed'")):
        with pytest.raises(AdvisorError, match=said):
            try_settings(text)
    with pytest.raises(AdvisorError, match="--only and --skip both name amp"):
        check_steering(("amp",), ("amp",), ())
    with pytest.raises(AdvisorError, match="compile is also in --skip"):
        check_steering(None, ("compile",), ("compile",))


def test_only_bounds_the_search_and_resume_keeps_it(tmp_path):
    """A session with --only amp,batch_size changes nothing else, also once it is interrupted and resumed
    (the options come from session.json, not from the resuming call)."""
    out = tmp_path / "only"
    points = load_surface(SURFACE)
    served = ReplayRunner(points, out, 0.05, 1)
    calls = []

    def interrupted(name, knobs):
        calls.append(name)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return served(name, knobs)

    options = SessionOptions(max_trials=6, only=("amp", "batch_size"))
    with pytest.raises(KeyboardInterrupt):
        replay(out, options, interrupted)
    saved = json.loads((out / "session.json").read_text())
    assert saved["options"]["only"] == ["amp", "batch_size"] and saved["status"] == "interrupted"
    state = run_session("", out, SessionOptions(max_trials=6), resume=True, log=lambda m: None,
                        runner=ReplayRunner(points, out, 0.05, 2), script=False, space=surface_space(points),
                        outputs=False)
    assert state["status"] == "done" and len(state["trials"]) > 3
    assert turned_by(state) <= {"amp", "batch_size"} and turned_by(state), state["trials"]
    # Without --only, the loader-bound baseline's first move is more workers: the bound was there to follow.
    free = replay(tmp_path / "free", SessionOptions(max_trials=2))
    assert "num_workers" in turned_by(free)


def test_tries_run_right_after_the_baseline_and_skip_is_never_proposed(tmp_path):
    options = SessionOptions(max_trials=8, tries=("batch_size=128", "amp=bf16"), skip=("num_workers",))
    state = replay(tmp_path / "tries", options)
    rows = state["trials"]
    assert [r["change"] for r in rows[1:3]] == ["--try batch_size=128", "--try amp=bf16"], rows
    assert all(r["recommendation"] == "try" and r["decision"] in ("kept", "reverted") for r in rows[1:3])
    assert rows[1]["knobs"]["batch_size"] == 128 and rows[2]["knobs"]["amp"] == "bf16"
    # The second try is made on top of the best after the first: batch 128 stays if it was kept.
    assert (rows[2]["knobs"]["batch_size"] == 128) == (rows[1]["decision"] == "kept")
    assert "num_workers" not in turned_by(state)
    assert state["options"]["tries"] == ["batch_size=128", "amp=bf16"] and state["options"]["skip"] == ["num_workers"]


@pytest.mark.parametrize("surface, tried", [("cpu-image-classifier", "num_workers=2"),
                                            ("cpu-conv-classifier", "channels_last")])
def test_a_try_is_priced_by_the_model_as_the_searchs_own_changes_are(tmp_path, surface, tried):
    """The CPU truth surfaces, replayed without noise: `--try num_workers=2` on the image classifier measures +35 %,
    where its baseline's loader wait (the finding's gain, what the bound could give back at most) priced it at
    +395 %; channels_last on the conv example +44 %, priced +8 % by a finding of the layout alone. The model
    that prices the search's own moves is within a third of either."""
    points = load_surface(SURFACES / surface)
    out = tmp_path / "s"
    state = run_session(f"{SURFACES / surface}:replay", out, SessionOptions(max_trials=2, tries=(tried,)),
                        log=lambda m: None, runner=ReplayRunner(points, out, 0.0, 0), script=False,
                        space=surface_space(points), extra={"replay": str(SURFACES / surface)}, outputs=False)
    row = state.trials[1]
    assert row.change == f"--try {tried}" and row.decision == "kept"
    assert abs(row.predicted_samples_gain - row.gain) < 0.35, (row.predicted_samples_gain, row.gain)


def test_a_change_that_was_not_applicable_is_never_the_runner_up(tmp_path):
    from types import SimpleNamespace

    out = tmp_path / "s"
    state = replay(out, SessionOptions(max_trials=5))
    state.best = state.trials[0].name
    best = SimpleNamespace(name=state.best, path=out / state.trials[0].folder)
    fastest = max(state.trials[1:], key=lambda t: t.samples_per_s or 0)
    assert contender(out, state, best, 0.03)[0] is fastest  # ahead of the best (the baseline here)
    # The same row, had its only knob been not applicable: it measured a setting already run.
    knob = sorted(turned(state.trials[0].knobs, fastest.knobs))[0]
    fastest.update(decision="not applicable", outcomes={knob: "not applicable: the surface holds none"})
    assert (contender(out, state, best, 0.03) or [None])[0] is not fastest


def test_the_cli_refuses_an_unknown_knob_in_one_line_and_creates_nothing(tmp_path):
    done = advisor_main("profile", "--replay", str(SURFACE), "--skip", "compile,warp_speed", "--out",
                       str(tmp_path / "x"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "--skip: unknown knob 'warp_speed' (known: amp, batch_size, num_workers" in done.stderr
    assert not (tmp_path / "x").exists()
    resumed = advisor_main("profile", "--resume", str(tmp_path / "x"), "--only", "amp")
    assert resumed.returncode == 2 and "a resumed session keeps the ones it started with" in resumed.stderr


def test_a_real_cpu_session_tries_8_bit_copies_second_and_never_compiles(tmp_path):
    out = tmp_path / "real"
    done = advisor_main("profile", str(ROOT / "examples" / "image_classifier.py"), "--device", "cpu",
                        "--try", "uint8_copies", "--skip", "compile", "--max-trials", "2", "--windows", "2",
                        "--window", "0.3", "--steps", "2", "--wait", "1", "--out", str(out), env={"COLUMNS": "100"})
    assert done.returncode == 0, done.stderr[-3000:]
    state = json.loads((out / "session.json").read_text())
    second = state["trials"][1]
    assert second["change"] == "--try uint8_copies" and second["knobs"]["uint8_copies"] is True
    assert second["outcomes"]["uint8_copies"] == "applied", second
    assert not any(t["knobs"].get("compile") for t in state["trials"])
    assert state["options"]["skip"] == ["compile"] and state["options"]["tries"] == ["uint8_copies"]
    assert not [line for line in done.stdout.splitlines() if line.endswith(" ")]
    report = (out / "report.html").read_text()  # the options, under the report's options
    assert "<code>skip=compile</code>" in report and "<code>tries=uint8_copies</code>" in report


def test_tune_checks_its_steering_before_any_trial(tmp_path):
    import advisor

    def step(batch):
        raise AssertionError("no trial may run")

    for kwargs, said in (({"skip": ["warp_speed"]}, "skip: unknown knob 'warp_speed'"),
                         ({"only": "amp", "skip": "amp"}, "--only and --skip both name amp"),
                         ({"tries": ["compile"]}, "compile cannot be tried in the notebook's process")):
        with pytest.raises(AdvisorError, match=said):
            advisor.tune(step, [1, 2, 3], out=tmp_path / "s", log=None, **kwargs)
    assert not (tmp_path / "s").exists()
