"""The session record's types (`advisor.search.record`): every recorded session fits them, what the search reads
of the record is declared there, and a record that does not fit is refused on resume with one line."""

from __future__ import annotations

import ast
import json
import shutil

import msgspec
import pytest

from conftest import ROOT

from advisor.errors import AdvisorError
from advisor.search.record import FIELDS, ROW_FIELDS, typed
from advisor.search.state import SESSION_FILE, resume_state, save

RECORDED = sorted([*ROOT.glob("sample_runs/*/session.json"), *ROOT.glob("tests/data/trials/*/session.json")])
ROW_SOURCES = ("best_row", "reference_row", "trial_row")  # functions that return a row of `trials`


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.parent.name)
def test_every_recorded_session_fits_the_types_and_comes_back_the_same(path):
    # Sessions written by earlier releases among them (sample_runs: `exhausted`, no `cwd`): nothing is lost or added.
    doc = json.loads(path.read_text())
    assert msgspec.to_builtins(typed(doc)) == doc


@pytest.mark.parametrize("path", RECORDED[:2], ids=lambda p: p.parent.name)
def test_a_session_of_an_earlier_release_resumes_and_is_written_back_unchanged(tmp_path, path):
    out = tmp_path / "session"
    shutil.copytree(path.parent, out)
    before = json.loads((out / SESSION_FILE).read_text())
    state = resume_state(out)
    save(state)
    after = json.loads((out / SESSION_FILE).read_text())
    kept = {k for k in before if k != "updated_at"}
    assert {k: after.get(k) for k in kept} == {k: before[k] for k in kept}
    assert set(after) - set(before) <= {"pooled"}  # the one key a resumed search needs that older releases lacked


def test_a_record_that_does_not_fit_is_refused_on_resume_naming_the_field(tmp_path):
    out = tmp_path / "session"
    shutil.copytree(RECORDED[0].parent, out)
    doc = json.loads((out / SESSION_FILE).read_text())
    doc["trials"][1]["samples_per_s"] = "fast"
    (out / SESSION_FILE).write_text(json.dumps(doc))
    with pytest.raises(AdvisorError) as error:
        resume_state(out)
    assert str(error.value).startswith(f"{out / SESSION_FILE}: not an advisor.session/1 document")
    assert "$.trials[1].samples_per_s" in str(error.value) and "\n" not in str(error.value)


def test_a_field_the_search_misspells_fails_where_it_is_written(tmp_path):
    out = tmp_path / "session"
    shutil.copytree(RECORDED[0].parent, out)
    state = resume_state(out)
    with pytest.raises(AttributeError, match="speed_up"):
        state.trials[0].speed_up = 1.2
    with pytest.raises(AttributeError, match="spedup"):
        state.spedup = 1.2
    with pytest.raises(KeyError, match="speed_up"):
        state.trials[0].get("speed_up")
    assert state.get("core_use") is None and "core_use" not in state  # unset in a session of an earlier release


def test_a_value_of_the_wrong_type_fails_the_save_under_the_suite_and_is_written_all_the_same(tmp_path):
    out = tmp_path / "session"
    shutil.copytree(RECORDED[0].parent, out)
    state = resume_state(out)
    state.trials[0].samples_per_s = "fast"
    with pytest.raises(ValueError, match=r"\$\.trials\[0\]\.samples_per_s"):
        save(state)
    assert json.loads((out / SESSION_FILE).read_text())["trials"][0]["samples_per_s"] == "fast"


def test_a_users_session_goes_on_past_a_record_that_does_not_fit_with_a_warning(tmp_path, monkeypatch, capsys):
    out = tmp_path / "session"
    shutil.copytree(RECORDED[0].parent, out)
    state = resume_state(out)
    state.trials[0].samples_per_s = "fast"
    monkeypatch.delenv("ADVISOR_STRICT_RECORD")
    save(state)
    warning = capsys.readouterr().err
    assert warning.startswith(f"advisor: warning: {out / SESSION_FILE}: the session wrote a record that does not fit")
    assert warning.count("\n") == 1 and "samples_per_s" in warning


def test_what_a_session_records_where_nothing_was_written_or_timed_fits():
    # No suggested.patch (it could not be written: patch and patch_root null), no trial that recorded its times.
    doc = json.loads(RECORDED[-1].read_text()) | {"patch": None, "patch_root": None, "time": None, "core_use": None}
    assert msgspec.to_builtins(typed(doc)) == doc


IN_MEMORY = {"folder"}  # the session's folder, held beside the fields and never written


def _record_reads(tree: ast.AST) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(the fields read of `state`, the fields read of a row of its trials) with their lines: `x.field`,
    `x["field"]`, `x.get("field")`, `x.setdefault("field")`, `x.pop("field")`. A row is a name bound by iterating
    `state.trials` or from a function that returns one (ROW_SOURCES)."""
    def is_trials(node):
        return isinstance(node, (ast.Subscript, ast.Attribute)) and isinstance(node.value, ast.Name) \
            and node.value.id == "state" and (node.attr == "trials" if isinstance(node, ast.Attribute) else
                                              isinstance(node.slice, ast.Constant) and node.slice.value == "trials")

    rows: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.comprehension)) and isinstance(node.target, ast.Name):
            source = node.iter
            while isinstance(source, ast.Call) and source.args:  # reversed(state.trials), enumerate(...)
                source = source.args[0]
            if is_trials(source):
                rows.add(node.target.id)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = node.value
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in ROW_SOURCES \
                    or isinstance(value, ast.Subscript) and is_trials(value.value):
                rows.add(node.targets[0].id)

    called = {id(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}  # a method, not a field
    state_reads, row_reads = [], []
    for node in ast.walk(tree):
        owner = key = None
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            owner, key = node.value, node.slice.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("get", "setdefault", "pop") and node.args \
                and isinstance(node.args[0], ast.Constant):
            owner, key = node.func.value, node.args[0].value
        elif isinstance(node, ast.Attribute) and node.attr not in IN_MEMORY and id(node) not in called:
            owner, key = node.value, node.attr
        if isinstance(owner, ast.Name) and isinstance(key, str):
            if owner.id == "state":
                state_reads.append((node.lineno, key))
            elif owner.id in rows:
                row_reads.append((node.lineno, key))
    return sorted(state_reads), sorted(row_reads)


def test_what_the_search_reads_of_the_record_is_declared_in_its_types():
    undeclared, counted = [], [0, 0]
    for path in sorted((ROOT / "advisor").rglob("*.py")):
        if path.parts[-2] == "report":  # the report reads a conformed copy (`load_session`), with keys of its own
            continue
        state_reads, row_reads = _record_reads(ast.parse(path.read_text(), str(path)))
        counted[0] += len(state_reads)
        counted[1] += len(row_reads)
        where = path.relative_to(ROOT)
        undeclared += [f"{where}:{line}: state[{key!r}]" for line, key in state_reads if key not in FIELDS]
        undeclared += [f"{where}:{line}: row[{key!r}]" for line, key in row_reads if key not in ROW_FIELDS]
    assert counted[0] > 200 and counted[1] > 100  # the walk finds the reads it is there to check
    assert not undeclared, "keys read of the session record that advisor.search.record does not declare:\n" + \
        "\n".join(undeclared)


def test_the_reads_check_catches_a_misspelt_key():
    source = ('def f(state):\n    for t in state.trials:\n        t.sampels_per_s\n    state.get("bset")\n'
              '    state.bets\n    row = best_row(state)\n    row["nmae"]\n')
    state_reads, row_reads = _record_reads(ast.parse(source))
    assert state_reads == [(2, "trials"), (4, "bset"), (5, "bets")] and row_reads == [(3, "sampels_per_s"), (7, "nmae")]


def test_a_figure_computed_with_numpy_is_saved_as_its_number(tmp_path):
    import numpy as np

    out = tmp_path / "session"
    shutil.copytree(RECORDED[0].parent, out)
    state = resume_state(out)
    state.speedup, state.trials[0].samples_per_s = np.float64(2.5), np.float32(100.0)
    save(state)
    saved = json.loads((out / SESSION_FILE).read_text())
    assert saved["speedup"] == 2.5 and saved["trials"][0]["samples_per_s"] == 100.0
