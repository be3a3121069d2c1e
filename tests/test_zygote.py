"""Trials forked from the zygote (advisor.trials.launch.zygote) are the processes fresh ones would be."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from test_distributed import left_behind
from trial_helpers import EXAMPLES, pair_in_turns, trial_record, write_script

from advisor.trials.knobs import Knobs
from advisor.trials.launch.runner import run_trial
from advisor.trials.spec import TrialSpec
from advisor.trials.launch.zygote import FRESH_VARIABLE, start_trial
from conftest import trial_environment

# The step writes down, once, what its process is.
FACTS = """
    import gc, json, os, signal, sys
    import numpy as np
    import torch

    weight = torch.nn.Parameter(torch.ones(4))
    optimizer = torch.optim.SGD([weight], lr=0.1)  # as training scripts do (it imports torch._dynamo)
    written = []

    def train_step(x):
        if not written:
            with open("/proc/self/environ", "rb") as f:
                shown = dict(v.split(b"=", 1) for v in f.read().split(b"\\0") if b"=" in v)
            facts = {"pid": os.getpid(), "ppid": os.getppid(), "sid": os.getsid(0), "pgid": os.getpgid(0),
                     "cwd": os.getcwd(), "argv0": sys.argv[0], "path": sys.path,
                     "token": os.environ.get("ADVISOR_TRIAL"),
                     "proc_token": shown.get(b"ADVISOR_TRIAL", b"").decode(),
                     "draw": float(np.random.random()),
                     "sigint": str(signal.getsignal(signal.SIGINT)), "sigpipe": str(signal.getsignal(signal.SIGPIPE)),
                     "environ": {k: v for k, v in os.environ.items() if k not in ("ADVISOR_TRIAL", "ADVISOR_FRESH_TRIALS")},
                     "flags": list(sys.flags),
                     # torch's imports in the collector's permanent generation: a fresh trial without them
                     # there ran the conv example's bf16 steps 8-12% slower than a forked one
                     "frozen": gc.get_freeze_count() > 100_000}
            open(f"facts-{os.getpid()}.json", "w").write(json.dumps(facts))
            print("hello from the step")
            written.append(1)
        return (x * 2).sum()

    if __name__ == "__main__":
        for _ in range(100):
            train_step(torch.ones(4))
"""


def _trial_facts(script, folder, tmp_path):
    result = run_trial(TrialSpec(f"{script}:train_step", Knobs(), folder, steps=2, wait=0, warmup=0, windows=0,
                                 device="cpu"))
    assert result.status == "ok", result.message
    record = trial_record(result.path)
    facts = json.loads((tmp_path / f"facts-{record['pid']}.json").read_text())
    assert "hello from the step" in (result.path / "output.log").read_text()
    return record, facts


@pytest.mark.skipif(not os.path.exists("/proc/self/environ"), reason="forked trials are Linux's")
def test_a_forked_trial_is_the_process_a_fresh_one_would_be(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    script = write_script(tmp_path, FACTS)
    # Ctrl-C as the advisor has it when each trial starts, not when the zygote did: the first with it ignored
    # (a shell's background job), which a fresh process inherits; the others with Python's handler.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        forked = [_trial_facts(script, tmp_path / "forked0", tmp_path)]
        signal.signal(signal.SIGINT, signal.default_int_handler)
        forked.append(_trial_facts(script, tmp_path / "forked1", tmp_path))
        monkeypatch.setenv(FRESH_VARIABLE, "1")
        fresh = _trial_facts(script, tmp_path / "fresh", tmp_path)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert forked[0][1]["sigint"] == str(signal.SIG_IGN)
    forked[0][1]["sigint"] = fresh[1]["sigint"]  # compared with the fresh one's below, as the rest is

    zygote = forked[0][1]["ppid"]
    assert zygote != os.getpid() and forked[1][1]["ppid"] == zygote  # both forked, from one zygote
    assert fresh[1]["ppid"] == os.getpid()  # and the fresh one is the runner's child
    for record, facts in forked + [fresh]:
        # a session and process group of its own, found by its token in /proc as a fresh process is
        assert facts["pid"] == facts["sid"] == facts["pgid"] == record["pid"]
        assert facts["token"] == facts["proc_token"] == record["token"]
        assert facts["cwd"] == str(tmp_path) and facts["argv0"] == str(script)
        assert facts["frozen"]
        for same in ("path", "sigint", "sigpipe", "environ", "flags"):
            assert facts[same] == fresh[1][same], same
    assert forked[0][1]["draw"] != forked[1][1]["draw"]  # numpy seeded anew, as a fresh process's is


@pytest.mark.skipif(not os.path.exists("/proc/self/environ"), reason="forked trials are Linux's")
def test_a_switch_to_another_environment_and_back_forks_from_the_zygote_kept_for_each(tmp_path, monkeypatch):
    """A zygote serves one environment; the last two are kept, so switching back starts none."""
    monkeypatch.chdir(tmp_path)
    script = write_script(tmp_path, FACTS)
    first = _trial_facts(script, tmp_path / "first", tmp_path)[1]
    monkeypatch.setenv("ADVISOR_TEST_SWITCH", "1")  # read by nothing, but an environment of its own
    other = _trial_facts(script, tmp_path / "other", tmp_path)[1]
    monkeypatch.delenv("ADVISOR_TEST_SWITCH")
    monkeypatch.setenv("COLUMNS", "77")  # the terminal's width: each trial's own, from the same zygote
    back = _trial_facts(script, tmp_path / "back", tmp_path)[1]
    assert other["ppid"] != first["ppid"] and other["environ"]["ADVISOR_TEST_SWITCH"] == "1"
    assert back["ppid"] == first["ppid"] and "ADVISOR_TEST_SWITCH" not in back["environ"]
    assert back["environ"]["COLUMNS"] == "77" and first["environ"]["COLUMNS"] != "77"


@pytest.mark.skipif(not os.path.exists("/proc/self/environ"), reason="forked trials are Linux's")
def test_a_zygote_that_died_is_replaced_and_its_trial_ends_with_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # In the environment the test above switched to, whose zygote it kept: the zygotes killed here are that
    # environment's, and the default one the tests after it fork from lives on (a new one imports torch again).
    monkeypatch.setenv("ADVISOR_TEST_SWITCH", "1")
    script = write_script(tmp_path, FACTS.replace("return (x * 2).sum()", """if os.path.exists("hang"):
            time.sleep(60)
        return (x * 2).sum()""").replace("import json, os", "import json, os, time"))
    first = _trial_facts(script, tmp_path / "first", tmp_path)[1]
    (tmp_path / "hang").touch()
    os.kill(first["ppid"], signal.SIGKILL)  # the zygote, between trials
    started = time.monotonic()
    result = run_trial(TrialSpec(f"{script}:train_step", Knobs(), tmp_path / "second", steps=2, wait=0, warmup=0,
                                 windows=0, device="cpu", timeout_s=60),
                                 on_start=lambda pid, token: _kill_parent_once_hanging(pid, tmp_path))
    # Forked from a new zygote, which then died too: the trial followed it, long before its time limit.
    assert result.status == "error" and time.monotonic() - started < 40, result.message
    record = trial_record(result.path)
    assert record["pid"] != first["pid"]


def _kill_parent_once_hanging(pid, folder):
    import psutil

    zygote = psutil.Process(pid).ppid()
    assert zygote != os.getpid()
    deadline = time.monotonic() + 30
    while not (folder / f"facts-{pid}.json").exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # its first step writes them, then hangs
    os.kill(zygote, signal.SIGKILL)


def _scalars(run_dir):
    """{tag: [(step, value), ...]} and the writer's pid, from the one event file of a TensorBoard run."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = run_dir.glob("events.out.tfevents.*")
    acc = EventAccumulator(str(events))
    acc.Reload()
    scalars = {tag: [(e.step, round(e.value, 6)) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    return scalars, int(events.name.split(".")[-2])


def test_the_sessions_tensorboard_run_is_written_in_a_child_of_the_zygote_the_same(tmp_path, monkeypatch):
    # The advisor then never imports torch itself: TensorBoard's writer is torch's, the zygote has torch.
    from advisor import cli
    from advisor.report import write_tensorboard

    monkeypatch.chdir(tmp_path)
    script = write_script(tmp_path, FACTS)
    out = tmp_path / "session"
    code = cli.main(["profile", f"{script}:train_step", "--device", "cpu", "--max-trials", "2", "--only", "threads",
                     "--steps", "2", "--wait", "0", "--warmup", "0", "--windows", "2", "--window", "0.2",
                     "--out", str(out)])
    assert code == 0
    forked, writer = _scalars(out / "trials" / "session")
    assert writer != os.getpid() and forked["throughput/samples_per_s"]
    write_tensorboard(out)  # the same run, written here
    here, writer = _scalars(out / "trials" / "session")
    assert writer == os.getpid() and here == forked


# Each rank writes down, once, what its process is (its command line shows whether it was exec'd or forked).
RANK_FACTS = """
    import json, os, signal, sys
    import numpy as np
    import torch, torch.distributed as dist

    written = []

    def train_step(x):
        if not written:
            with open("/proc/self/cmdline", "rb") as f:
                cmdline = f.read().decode(errors="replace")
            facts = {"pid": os.getpid(), "sid": os.getsid(0), "pgid": os.getpgid(0), "cmdline": cmdline,
                     "argv": sys.argv, "path": sys.path, "cwd": os.getcwd(), "token": os.environ.get("ADVISOR_TRIAL"),
                     "threads": torch.get_num_threads(), "draw": float(np.random.random()),
                     "signals": {name: str(signal.getsignal(getattr(signal, name)))
                                 for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGPIPE")},
                     "unbuffered": [type(s.buffer).__name__ for s in (sys.stdout, sys.stderr)],
                     "environ": {k: v for k, v in os.environ.items() if k != "ADVISOR_FRESH_TRIALS"}}
            with open(f"facts-{os.environ['RANK']}-{os.getpid()}.json", "w") as f:
                f.write(json.dumps(facts))
            written.append(1)
        loss = x.sum()
        dist.all_reduce(loss)
        return loss

    if __name__ == "__main__":
        dist.init_process_group("gloo")
        for _ in range(100):
            train_step(torch.ones(4))
"""


def _rank_facts(script, folder, tmp_path):
    result = run_trial(TrialSpec(f"{script}:train_step", Knobs(), folder, steps=2, wait=0, warmup=0, windows=0,
                                 device="cpu", nproc_per_node=2))
    assert result.status == "ok", result.message
    facts = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("facts-*.json"))]
    for path in tmp_path.glob("facts-*.json"):
        path.unlink()
    return trial_record(result.path), facts


@pytest.mark.skipif(not os.path.exists("/proc/self/environ"), reason="forked ranks are Linux's")
def test_a_forked_rank_is_the_process_a_fresh_rank_would_be(tmp_path, monkeypatch):
    """torchrun's ranks are forked from its agent (advisor.trials.launch.forked_ranks), sparing each its import
    of torch; with ADVISOR_FRESH_TRIALS=1 torchrun starts them afresh. Either way a rank is the same process."""
    monkeypatch.chdir(tmp_path)
    script = write_script(tmp_path, RANK_FACTS)
    forked_record, forked = _rank_facts(script, tmp_path / "forked", tmp_path)
    monkeypatch.setenv(FRESH_VARIABLE, "1")
    fresh_record, fresh = _rank_facts(script, tmp_path / "fresh", tmp_path)
    assert len(forked) == len(fresh) == 2
    for facts in forked:  # the agent's command line: it was forked from the zygote, the rank from it
        assert "advisor.trials.harness.zygote_serve" in facts["cmdline"], facts["cmdline"]
    for facts in fresh:
        assert "-m\0advisor.trials.harness.entry" in facts["cmdline"], facts["cmdline"]
    # Values torchrun draws anew for each job (its run's id, its store's port, its error files' folder); and
    # inductor's cache folder, which inductor writes into the environment where it first looks it up (the
    # zygote's imports did; a fresh rank does once it compiles, the same folder).
    drawn = {"ADVISOR_TRIAL", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE",
             "TORCHINDUCTOR_CACHE_DIR"}
    for record, ranks in ((forked_record, forked), (fresh_record, fresh)):
        for rank in ranks:
            assert rank["pid"] == rank["sid"] == rank["pgid"]  # a session of its own, as torchrun starts a rank
            assert rank["token"] == record["token"] and rank["cwd"] == str(tmp_path)
            assert rank["threads"] == 1  # torchrun's OMP_NUM_THREADS=1 for several ranks a node, taken
            rank["environ"] = {k: v for k, v in rank["environ"].items() if k not in drawn}
    for one, other in zip(forked, fresh):
        for same in ("argv", "path", "signals", "unbuffered", "environ"):
            assert one[same] == other[same], same
    assert forked[0]["draw"] != forked[1]["draw"]  # numpy seeded anew in each rank
    assert not left_behind(forked_record["token"])


@pytest.mark.skipif(not os.path.exists("/proc/self/environ"), reason="forked trials are Linux's")
@pytest.mark.parametrize("body", ["import sys; print('out'); sys.exit(3)", "raise SystemExit('bye')",
                                  "print('out'); raise ValueError('broke')", "print('out')"])
def test_a_module_forked_ends_as_python_m_would(tmp_path, body):
    """What the zygote runs as `python -m` (torchrun's launcher) ends as a fresh `python -m` would: its exit code,
    its output, an exception's traceback; at once, without Python's finalisation of what the zygote imported."""
    (tmp_path / "ending.py").write_text(body + "\n")
    env = trial_environment()
    fresh = subprocess.run([sys.executable, "-m", "ending"], cwd=tmp_path, env=env, capture_output=True, text=True)
    forked = start_trial(sys.executable, None, str(tmp_path), env, str(tmp_path / "log"), 60, module=["ending"])
    assert forked is not None and forked.pid != os.getpid()
    assert forked.wait(60) == fresh.returncode
    # The same lines, but for a traceback's frames (the fresh one's start in runpy's -m, the forked one's in
    # the zygote).
    def unindented(text):
        return sorted(line for line in text.splitlines() if not line.startswith(" "))

    assert unindented((tmp_path / "log").read_text()) == unindented(fresh.stdout + fresh.stderr)


def test_a_request_beyond_the_pipes_buffer_reaches_the_zygote_whole(tmp_path):
    """A session's TensorBoard run travels to the zygote's child in its request (`call_forked`); a long
    session's is larger than the pipe's 64 KiB buffer. The child gets every byte."""
    (tmp_path / "sized.py").write_text("import pathlib, sys\npathlib.Path('size').write_text(str(len(sys.argv[1])))\n")
    forked = start_trial(sys.executable, None, str(tmp_path), trial_environment(), str(tmp_path / "log"), 60,
                         module=["sized", "x" * 300_000])
    assert forked is not None and forked.wait(60) == 0, (tmp_path / "log").read_text()
    assert (tmp_path / "size").read_text() == "300000"


@pytest.mark.skipif(not os.path.exists("/proc/self/environ"), reason="forked trials are Linux's")
def test_both_trials_of_a_pair_are_forked_from_one_zygote_and_each_is_its_own_process(tmp_path, monkeypatch):
    """Two trials at once, their windows in turns (the ending's pairs): the second is forked while the first runs,
    from the same zygote, rather than started afresh; each is a process of its own (its pid, group, token and
    numpy draw), and each ends with its own exit code."""
    monkeypatch.chdir(tmp_path)
    script = write_script(tmp_path, FACTS)
    results = pair_in_turns(script, tmp_path, windows=2)
    assert all(results[name].status == "ok" for name in "ab"), {n: r.message for n, r in results.items()}
    facts = [json.loads((tmp_path / f"facts-{trial_record(results[n].path)['pid']}.json").read_text()) for n in "ab"]
    assert facts[0]["ppid"] == facts[1]["ppid"] != os.getpid()  # both children of the one zygote
    assert facts[0]["pid"] != facts[1]["pid"] and all(f["pgid"] == f["pid"] == f["sid"] for f in facts)
    assert facts[0]["token"] != facts[1]["token"] and all(f["proc_token"] == f["token"] for f in facts)
    assert facts[0]["draw"] != facts[1]["draw"]


def test_a_zygote_started_from_a_thread_outlives_it_and_so_do_its_trials(tmp_path):
    """The kernel ends a process when the *thread* that started it ends (the zygote's `die_with_parent`): a zygote
    started by one trial of a pair, in that trial's thread, died once the thread ended, and its other child with
    it. A trial started from a thread that ends at once, in an environment no zygote served yet, runs to its own
    end and exit code."""
    import threading
    import uuid

    (tmp_path / "ends_later.py").write_text("import time\ntime.sleep(2)\nraise SystemExit(3)\n")
    env = {**trial_environment(), "ADVISOR_TEST_ONLY": uuid.uuid4().hex}  # a zygote of its own, started below
    started = []
    thread = threading.Thread(target=lambda: started.append(
        start_trial(sys.executable, None, str(tmp_path), env, str(tmp_path / "log"), 60, module=["ends_later"])))
    thread.start()
    thread.join()  # the thread that asked for the zygote has ended; its child has not
    child = started[0]
    assert child is not None, "not forked from a zygote"
    assert child.wait(60) == 3, (tmp_path / "log").read_text()


PARSES_IN_THREADS = """
import gc, sys, threading
from pathlib import Path
from advisor.trials.launch.runner import _locate_step

script, failures, parsed = Path(sys.argv[1]), [], threading.Event()


class Finalized:  # Python code run from the garbage collector: where CPython switches threads mid-parse
    def __del__(self):
        sum(range(50))


def litter():
    for _ in range(20_000):
        if parsed.is_set():
            return
        a, b = Finalized(), Finalized()
        a.other, b.other = b, a


def locate():
    for _ in range(100):
        try:
            _locate_step(script, script, "main")
        except Exception as exc:
            failures.append(repr(exc))
            return


sys.setswitchinterval(1e-6)
gc.set_threshold(50)
threading.Thread(target=litter, daemon=True).start()
parsers = [threading.Thread(target=locate) for _ in range(2)]
for thread in parsers:
    thread.start()
for thread in parsers:
    thread.join()
parsed.set()
print(failures)
"""


def test_the_two_trials_of_a_pair_locate_their_step_from_two_threads_at_once():
    """The ending starts a pair's two trials from two threads, and each parses the script to find its step: on
    CPython 3.11 two parses at once failed one trial with "SystemError: AST constructor recursion depth mismatch"
    (seen in this suite on the test above). The parses are taken one at a time."""
    done = subprocess.run([sys.executable, "-c", PARSES_IN_THREADS, str(EXAMPLES / "image_classifier.py")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout
