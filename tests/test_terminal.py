"""What a user sees on a terminal and in a pipe: a running trial's phases and time left (a real short CPU
trial), and the session's ladder, its next steps and `advisor analyze` at 80 columns, whole (no '…'); in a
pipe at 80, 100 and 120 columns, no line ends in spaces, no change wraps and no phrase is cut."""

from __future__ import annotations

import io
import json
import re

import msgspec
import pytest
from rich.console import Console

from advisor.analysis.analyze import analyze_path
from advisor.escape import output_stream
from advisor.report.progress_line import TrialProgressDisplay, progress_display
from advisor.report.terminal import print_analysis, print_session
from advisor.search.session import run_session
from advisor.search.state import SessionOptions, document, reference_row
from advisor.search.strategy import surface_space
from advisor.trials.replay.surface import ReplayRunner, load_surface
from advisor.trials.record.progress import PHASES, trial_progress
from advisor.trials.launch.runner import run_trial
from advisor.trials.spec import TrialSpec
from conftest import SAMPLE_RUNS, SURFACES, TRACES, run_advisor, whole_at
from records import record

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
SLOW_START = """\
import time
from torch.utils.data import DataLoader

def train_step(x):
    time.sleep(0.05)
    return x.float().sum()

if __name__ == "__main__":
    time.sleep(0.5)  # a slow start: a data set loading, a model being built
    for epoch in range(100):
        for x in DataLoader(list(range(64)), batch_size=4):
            train_step(x)
"""


def screen_lines(text: str) -> list[str]:
    """What a terminal shows of rich's output, line by line: colours dropped, each redraw a line."""
    return [line for line in re.split(r"[\r\n]", ANSI.sub("", text)) if line.strip()]


def check_width(lines: list[str], width: int = 80) -> None:
    """Every line within the width (but a copyable path or command), nothing cut short."""
    whole_at(lines, width)


def test_a_running_trial_reports_its_phases_and_a_terminal_shows_them(tmp_path):
    script = tmp_path / "slow_start.py"
    script.write_text(SLOW_START)
    seen = []
    screen = io.StringIO()
    display = TrialProgressDisplay(Console(file=screen, force_terminal=True, width=80))

    def on_progress(progress):
        seen.append(progress)
        display.update(progress)

    result = run_trial(TrialSpec(f"{script}:train_step", None, tmp_path / "t", name="00-baseline", steps=2, wait=1,
                                 warmup=1, device="cpu", windows=2, window_s=0.2), on_progress=on_progress)
    assert result.ok, result.message
    phases = [p.phase for p in seen]
    assert phases[0] == "starting" and phases[-1] == "done" and "window" in phases, phases
    assert [PHASES.index(p) for p in phases] == sorted(PHASES.index(p) for p in phases), phases  # in order
    assert all(p.remaining_s is not None and p.remaining_s >= 0 for p in seen if p.phase != "starting")
    assert {p.step for p in seen if p.phase == "window"} <= {1, 2}

    # Each step's recorded phase is what the watch says is in progress once the steps before it have ended.
    record = json.loads((result.path / "trial.json").read_text())
    steps, schedule = record["steps"], record["schedule"]
    names = {"wait": "warm-up", "warmup": "warm-up", "profiled": "profiled", "settle": "settling", "window": "window"}
    for k, step in enumerate(steps):
        now = trial_progress("00-baseline", schedule, steps[:k], 1.0)
        assert now.phase == ("starting" if k == 0 else names[step["phase"]]), (k, step, now)
        if step["phase"] == "window":
            assert now.step == step["window"] + 1 and now.steps == 2, (k, step, now)
    assert trial_progress("00-baseline", schedule, steps, 1.0).phase == "finishing"
    assert not (result.path / "schedule.json").exists()  # in trial.json now, as the steps file

    # The terminal showed each phase it was told of, on one line of at most 80 columns, and erased it at the end.
    shown = screen_lines(screen.getvalue())
    for progress in seen[:-1]:
        assert any(f"trial 00: {progress.describe()}" in line for line in shown), (progress, shown)
    check_width(shown)
    assert "s left" in screen.getvalue()
    # Where the output is not a terminal, nothing is shown at all.
    assert progress_display(Console(file=io.StringIO())) is None


def reference_of(state: dict) -> dict | None:
    """The row speed-ups are measured against, as session.json holds it (what the report reads)."""
    reference = reference_row(record(state))
    return None if reference is None else msgspec.to_builtins(reference)


def sample_session(name: str) -> tuple[dict, object]:
    out = SAMPLE_RUNS / name
    state = json.loads((out / "session.json").read_text())
    state["_dir"] = str(out)
    return state, out


def test_the_session_summary_is_whole_at_80_columns_and_says_what_to_do_next():
    for name in ("image_classifier", "ddp_classifier", "char_transformer"):
        state, out = sample_session(name)
        for terminal in (True, False):
            text = io.StringIO()
            print_session(state, out, reference_of(state),
                          Console(file=text, width=80, force_terminal=terminal, color_system=None))
            lines = text.getvalue().splitlines()
            # The patch command stays on one line, whatever its length, so that it can be copied whole.
            check_width([line for line in lines if not line.lstrip().startswith("patch -p1")])
            for row in state["trials"]:  # every trial and its figures, as a list
                assert any(line.startswith(f" {row['index']:02d} {row['change']}: {row['decision']}")
                           for line in lines), (row, lines)
                assert any(f"{row['samples_per_s']:.1f}" in line for line in lines)
            assert "Next:" in lines
            assert any(line.strip() == f"patch -p1 < {out / state['patch']}" for line in lines), lines
    # Wide enough, the ladder is the table.
    wide = io.StringIO()
    print_session(state, out, reference_of(state), Console(file=wide, width=200, color_system=None))
    assert "┃ change" in wide.getvalue() and "…" not in wide.getvalue()


def test_the_patch_command_names_its_folder_and_the_bound_and_cores_that_remain():
    state, out = sample_session("ddp_classifier")
    root = out.parents[1]
    state.update(patch_root=str(root), core_use={"cores": 4, "ranks": 2, "workers": 1, "threads": 1,
                                                 "all_used": True})
    text = io.StringIO()
    print_session(state, out, reference_of(state), Console(file=text, width=80, color_system=None))
    lines = [line.strip() for line in text.getvalue().splitlines()]
    assert f"cd {root}" in lines and f"patch -p1 < {out.relative_to(root) / 'suggested.patch'}" in lines
    said = " ".join(lines)
    assert "the best trial is still bound by input pipeline (DataLoader)" in said
    assert "all 4 CPU cores are in use: 1 DataLoader worker(s) and 1 torch thread(s) in each of 2 ranks" in said


def test_analyze_in_a_pipe_at_80_columns_cuts_nothing():
    done = run_advisor("analyze", str(SAMPLE_RUNS / "ddp_classifier"), env={"COLUMNS": "80"})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    check_width(lines)
    assert "Summary" in lines and " rank 1  ← straggler" in lines, done.stdout
    # Each trace's full name is there, under its section's rule, not cut.
    assert any("(trial_rank1." in line and ".pt.trace.json.gz)" in line for line in lines), done.stdout


def piped(width: int) -> tuple[io.StringIO, Console]:
    """A console as the CLI makes it for a pipe (its lines trimmed), and what it wrote."""
    text = io.StringIO()
    return text, Console(file=output_stream(text), width=width)


def test_piped_output_has_no_trailing_spaces_and_no_change_wraps(tmp_path):
    points = load_surface(SURFACES / "h100-image-classifier")
    out = tmp_path / "replay"
    long_try = "batch_size=64,pin_memory,non_blocking"  # a change as long as a pair's
    replayed = document(run_session("surface:replay", out, SessionOptions(max_trials=5, tries=(long_try,)),
                                    log=lambda m: None, runner=ReplayRunner(points, out, 0.05, 3), script=False,
                                    space=surface_space(points), outputs=False))
    sessions = [(replayed, out), sample_session("image_classifier"), sample_session("char_transformer")]
    for width in (80, 100, 120):
        for state, folder in sessions:
            text, console = piped(width)
            print_session(state, folder, reference_of(state), console)
            lines = text.getvalue().splitlines()
            assert not [line for line in lines if line.endswith(" ")], (width, lines)
            assert "…" not in text.getvalue(), (width, lines)  # no column crushed to fit a change
            for row in state["trials"]:  # each change whole on one line, table or list
                assert any(row["change"] in line for line in lines), (width, row["change"], lines)
            if width >= 100 and folder != out:  # short changes: the table fits whole
                assert any("┃ change" in line for line in lines), lines
    # At 100 columns the long change does not fit a table row whole: the ladder is a list.
    text, console = piped(100)
    print_session(replayed, out, reference_of(replayed), console)
    assert f" 01 --try {long_try}: " in text.getvalue() and "┃ change" not in text.getvalue()


def test_a_recommendation_is_never_cut_mid_phrase():
    diagnosis = analyze_path(str(TRACES / "resnet50-v100-workers0.pt.trace.json.gz"))
    for width in (80, 100, 120):
        text, console = piped(width)
        print_analysis(diagnosis, console)
        lines = text.getvalue().splitlines()
        assert not [line for line in lines if line.endswith(" ")], (width, lines)
        for r in diagnosis[0].recommendations:
            phrase = f"(~{100 * r.predicted_gain:.1f}% of step time; worth {100 * r.worth:+.0f}%)"
            assert any(phrase in line for line in lines), (width, phrase, lines)
            if not r.helps_now:
                assert any(f"helps once {r.helps_once} is fixed" in line for line in lines), (width, lines)


def test_two_trials_in_turns_each_have_a_line_until_both_end():
    """The baseline and the best run side by side at a session's end, each reporting from its own thread: one
    display, a line each, gone once both are done."""
    from advisor.trials.record.progress import TrialProgress

    screen = io.StringIO()
    display = TrialProgressDisplay(Console(file=screen, force_terminal=True, width=100))
    display.update(TrialProgress("14-speedup-00", "window", 1, 3, 4.0, 6.0))
    display.update(TrialProgress("15-speedup-12", "warm-up", 1, 2, 2.0, 9.0))
    assert len(display.tasks) == 2 and display.progress is not None
    display.update(TrialProgress("14-speedup-00", "done", elapsed_s=10.0))
    assert list(display.tasks) == ["15-speedup-12"] and display.progress is not None
    display.update(TrialProgress("15-speedup-12", "done", elapsed_s=11.0))
    assert display.tasks == {} and display.progress is None and display.last_duration_s == 11.0


def test_the_time_line_adds_up_to_the_whole_on_a_recorded_session(tmp_path):
    # sample_runs/image_classifier as recorded (one trial after another), then with its last trial recorded
    # as a re-run that took its windows in turns with the one before (its start moved back into that trial):
    # the parts, the time between trials included, make 100 % and the seconds add up to the wall time.
    import shutil

    from advisor.report.formatting import time_text
    from advisor.search.timing import SHARES, session_time

    out = tmp_path / "session"
    shutil.copytree(SAMPLE_RUNS / "image_classifier", out)
    state = json.loads((out / "session.json").read_text())
    for turns in (False, True):
        if turns:
            last, before = state["trials"][-1], state["trials"][-2]
            last["change"] = f"{before['change']} (again)"
            trial = json.loads((out / last["folder"] / "trial.json").read_text())
            earlier = json.loads((out / before["folder"] / "trial.json").read_text())["times"]
            shift = trial["times"]["started_at"] - (earlier["started_at"] + 1.0)
            trial["times"] = {k: v - shift if isinstance(v, float) and k.endswith("_at") else v
                              for k, v in trial["times"].items()}
            (out / last["folder"] / "trial.json").write_text(json.dumps(trial))
        time = session_time(out, record(state))
        assert sum(time[k] for k in SHARES) + time["other_s"] == pytest.approx(time["wall_s"], rel=1e-9)
        assert time["reruns_s"] > 0 if turns else time["reruns_s"] == 0
        line = time_text(time)
        shares = [int(x) for x in re.findall(r"(\d+)%", line)]
        assert len(shares) == 5 and sum(shares) == 100, line
        assert line.startswith(f"{time['wall_s']:.0f} s in all: start-up"), line
