"""A knob is one module of `advisor/knobs/`: its declaration and reference text, gathered by the registry.

What else still names a knob is listed, module by module, in tests/data/knobs_named_outside.json: the parts
not moved into the knob's module yet (its interposition, the search's moves, the patch; the what-if model where it
builds its graph from a trace).
The list only shrinks: a module that starts naming a knob fails here (read the knob from the registry
instead), and one that stops must be taken off the list, so that it says what is left.
A finding's id given as one (the diagnosis's "amp", "sdpa": a Recommendation's `id=`, the registry's look-ups by
finding) names the finding, not the knob: the registry says which knobs answer it.
"""

from __future__ import annotations

import ast
import dataclasses
import json
from types import SimpleNamespace

import pytest

from records import row
from conftest import ROOT

from advisor.analysis.whatif import priors, transform
from advisor.knobs import BY_NAME, DATALOADER_KNOBS, KNOBS, NAMES, OFFERING, ORDERED, PLANNED_AT_LOADER, \
    TRANSFORMATIONS, making
from advisor.knobs.graph import StepGraph, TrialSettings
from advisor.code.patch.plan import RECORDED, RECORDED_FIRST, plan_patch
from advisor.knobs.knob import AFTER_IMPORTS, APPLIED, CHOICE, COPIES, FLAG, FROM_TRIAL, IN_DDP, IN_LOADER, \
    IN_OPTIMIZER, IN_STEP, NEEDS_A_VALUE, ON_MODEL
from advisor.knobs.in_trial import ScriptSeen, workers_queue
from advisor.knobs.offer import Best, Learned, Offer
from advisor.search.state import SessionOptions
from advisor.search.strategy import SearchSpace
from advisor.trials.knobs import Knobs

OUTSIDE = ROOT / "tests" / "data" / "knobs_named_outside.json"


# The ids of the findings and changes knobs declare they answer (`Knob.advice`, `Knob.proposed_as`): a diagnosis
# names its finding ("amp", "sdpa"), and the registry gives the knobs that answer it. Where such an id is given as
# one (a Recommendation's `id=`, the first argument of the registry's look-ups) it names the finding, not a knob.
FINDING_IDS = {k.advice for k in KNOBS} | {k.proposed_as for k in KNOBS}
BY_FINDING = ("advised_by", "proposed_knobs", "advised_values", "tried_advice")


def finding_ids(tree: ast.AST) -> set[int]:
    """The nodes (by id) of the strings a module gives as a finding's id."""
    given = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
        candidates = [k.value for k in node.keywords if k.arg == "id"]
        if name in BY_FINDING:
            candidates += node.args[:1] if name != "tried_advice" else node.args[1:2]
        given |= {id(c) for c in candidates if isinstance(c, ast.Constant) and c.value in FINDING_IDS}
    return given


def knobs_named(path) -> set[str]:
    """The knobs a module names: as a string ("tf32"), an attribute (`knobs.tf32`) or a keyword (`tf32=True`); not
    a finding's id given as one (`finding_ids`)."""
    found = set()
    tree = ast.parse(path.read_text(), str(path))
    ids = finding_ids(tree)
    for node in ast.walk(tree):
        if id(node) in ids:
            continue
        if isinstance(node, ast.Constant) and node.value in BY_NAME:
            found.add(node.value)
        elif isinstance(node, ast.Attribute) and node.attr in BY_NAME \
                and not (isinstance(node.value, ast.Name) and node.value.id in ("torch", "re")):  # their compile
            found.add(node.attr)
        elif isinstance(node, ast.keyword) and node.arg in BY_NAME:
            found.add(node.arg)
    return found


def test_no_module_outside_the_knobs_names_a_knob_it_was_not_listed_for():
    named = {}
    for path in sorted((ROOT / "advisor").rglob("*.py")):
        relative = path.relative_to(ROOT / "advisor")
        if relative.parts[0] != "knobs" and (found := knobs_named(path)):
            named[relative.as_posix()] = sorted(found)
    listed = json.loads(OUTSIDE.read_text())["modules"]
    new = {m: sorted(set(k) - set(listed.get(m, ()))) for m, k in named.items() if set(k) - set(listed.get(m, ()))}
    gone = {m: sorted(set(k) - set(named.get(m, ()))) for m, k in listed.items() if set(k) - set(named.get(m, ()))}
    assert not new, f"modules that now name knobs outside advisor/knobs (read them from the registry): {new}"
    assert not gone, f"no longer named there: take them off {OUTSIDE.name}: {gone}"


def test_the_registry_holds_each_knob_module_once_and_knobs_has_a_field_each():
    # The registry, the declaration, what a knob uses inside the trial, the what-if model's graph, what a knob offers
    # the search.
    shared = ("__init__", "knob", "in_trial", "graph", "offer")
    modules = sorted(p.stem for p in (ROOT / "advisor" / "knobs").glob("*.py") if p.stem not in shared)
    assert sorted(NAMES) == modules  # a module not in the registry would be a knob nobody reads
    assert [k.name for k in KNOBS] == list(NAMES)
    assert [f.name for f in dataclasses.fields(Knobs)] == list(NAMES)


@pytest.mark.parametrize("knob", KNOBS, ids=lambda k: k.name)
def test_each_knob_reads_checks_and_labels_its_own_values(knob):
    value = knob.choices[-1] if knob.kind == CHOICE else True if knob.kind == FLAG else 3
    assert knob.problem(value) is None and knob.problem(None) is None
    assert Knobs(**{knob.name: value}).requested() == {knob.name: value}
    assert knob.problem("x") and knob.problem(-1)  # text and a negative number are no knob's values
    with pytest.raises(ValueError, match=knob.name):
        Knobs(**{knob.name: "x"})
    assert knob.parse(str(value).lower()) == value
    if knob.alone is NEEDS_A_VALUE:
        with pytest.raises(ValueError, match="needs a value"):
            knob.parse(None)
    else:
        assert knob.problem(knob.parse(None)) is None
    assert Knobs(**{knob.name: value}).label() == knob.label(value) != "baseline"
    assert knob.name.replace("_", "-") in knob.label(value)


def a_value(knob):
    """A value of the knob other than its default."""
    return knob.choices[-1] if knob.kind == CHOICE else True if knob.kind == FLAG else 3


@pytest.mark.parametrize("what_if", TRANSFORMATIONS, ids=lambda w: w.term)
def test_each_modelled_knob_reads_its_setting_and_transforms_the_graph_by_it(what_if):
    """A knob's what-if part, from its module: a trial that set the knobs making the change reads as that setting
    (one that set none, as off), the graph holding it is not moved by setting it again, and is by another value."""
    knobs = {name: a_value(BY_NAME[name]) for name in making(what_if.term)}
    counted = BY_NAME[next(iter(knobs))].kind not in (CHOICE, FLAG)
    setting = what_if.read(TrialSettings.of({"knobs": knobs}))
    assert setting == (3 if counted else True)
    if len(knobs) > 1:  # a change several knobs make together is not made by one of them alone
        assert not what_if.read(TrialSettings.of({"knobs": dict([next(iter(knobs.items()))])}))
    elif not counted:
        assert what_if.read(TrialSettings.of({})) is False
    # A CPU step whose call binds, and beside it the workers' share of the two cores.
    fields = dict(batch=32, workers=2, cores=2, step_s=0.1, produce_s=0.15, host_s=0.02, device_s=0.06, idle_s=0.04,
                  matmul_s=0.02, matmul_tc_s=0.02, copy_s=0.01, conv_s=0.01, optimizer_s=0.01, platform="cpu", threads=4)
    graph = StepGraph(**{**fields, what_if.field: setting})
    p = priors(graph)[what_if.family_of(graph)]
    again = transform(graph, what_if.term, setting, p)
    assert again.samples_per_s == pytest.approx(graph.samples_per_s, rel=1e-12)
    other = 5 if isinstance(setting, int) and not isinstance(setting, bool) else not setting
    moved = transform(graph, what_if.term, other, p)
    assert getattr(moved, what_if.field) == other
    assert dataclasses.replace(moved, **{what_if.field: setting}) != graph  # it moved the step's times, not only that
    for name in making(what_if.term):
        assert transform(graph, name, other, p) == moved  # each knob's name finds the same transformation


def test_a_torch_setting_knob_reads_sets_and_puts_back_its_own_setting():
    """The process-wide settings' own hooks on this machine's torch: cudnn.benchmark is a flag torch keeps on
    any device, and the matmul precision reads the script's own; TF32 itself needs an Ampere GPU."""
    import contextlib

    import torch

    cudnn, tf32 = BY_NAME["cudnn_benchmark"].setting, BY_NAME["tf32"].setting
    assert cudnn.own(torch) is None and tf32.own(torch) is None  # torch's defaults: the script set neither
    with contextlib.ExitStack() as undo:
        assert cudnn.apply(torch, undo) is None
        assert torch.backends.cudnn.benchmark and cudnn.own(torch) == "cudnn.benchmark"
    assert not torch.backends.cudnn.benchmark  # put back
    torch.set_float32_matmul_precision("medium")
    try:
        assert tf32.own(torch) == "float32 matmul precision 'medium'"
    finally:
        torch.set_float32_matmul_precision("highest")


def test_the_workers_queue_is_read_from_the_first_source_that_sets_it_else_from_dataloaders_defaults():
    """Workers and their prefetch as the DataLoader ran them (its effective arguments), else the knobs, else the
    script's; DataLoader's own where none sets them: no workers, two batches each."""
    assert workers_queue({}, {}, {}) == (0, 2)
    assert workers_queue({"num_workers": None}, {"num_workers": 4}, {"num_workers": 2, "prefetch_factor": 3}) == (4, 3)
    assert workers_queue({"num_workers": 0, "prefetch_factor": None}) == (0, 2)


def test_the_batch_after_a_move_is_the_moved_one_else_the_settings_else_the_scripts_else_the_measured_one():
    """A pair's second move is proposed from the best with the first made: the batch it runs at."""
    from advisor.knobs.batch_size import after_moves

    assert after_moves({"batch_size": 128}, Knobs(batch_size=64), {"batch_size": 32}, 16) == 128
    assert after_moves({"amp": "bf16"}, Knobs(batch_size=64), {"batch_size": 32}, 16) == 64
    assert after_moves({"amp": "bf16"}, Knobs(), {"batch_size": 32}, 16) == 32
    assert after_moves({}, Knobs(), {}, 16) == 16


@pytest.mark.parametrize("knob", [k for k in KNOBS if k.on_model and not isinstance(k.on_model, str)],
                         ids=lambda k: k.name)
def test_each_knob_that_changes_a_convnet_applies_at_its_first_call_and_puts_it_back(knob):
    """Its `ModelChange` on a real convnet: applied at the first call, the script's own value read (it had set
    neither), and undone to the model as it was (an in-process trial's model is the user's). The attention's and
    the checkpointed blocks' (in the trial's code) are tested on models that have them (test_sdpa,
    test_checkpointing)."""
    import torch

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten())
    forward, strides = model.forward, model[0].weight.stride()
    change = knob.on_model()
    change.apply(torch, model, (torch.randn(2, 3, 8, 8),))
    assert change.outcome == APPLIED and change.user is False
    change.undo(torch)
    assert model.forward == forward and "forward" not in model.__dict__ and model[0].weight.stride() == strides


READS_OWN = tuple(k for k in KNOBS if k.own_at_first_call or k.own_at_end or k.setting)


@pytest.mark.parametrize("knob", READS_OWN, ids=lambda k: k.name)
def test_each_knob_that_reads_the_scripts_own_setting_reads_none_where_the_script_set_nothing(knob):
    """Read by its module alone (`own_at_first_call`, `own_at_end`): a plain model at torch's defaults, an
    unfused optimizer, one backward a step and no autocast are nobody's setting."""
    import torch

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.LazyLinear(2))
    assert knob.own_on_model(torch, model) is None
    if knob.own_at_end is not None:
        seen = ScriptSeen(Knobs(), optimizers=[{"class": "AdamW", "user": {"lr": 0.001}, "site": "train.py:9"}],
                          backwards_per_step=[1, 1, 1, 1, 1])
        assert knob.own_at_end(seen) is None


def test_amp_reads_the_scripts_autocast_and_a_frameworks_only_where_the_knob_did_not_set_it():
    """A framework's autocast is the knob's own where the amp knob set the framework's precision for the trial;
    the script's code's is the script's either way; a 32-bit autocast is no AMP."""
    read = BY_NAME["amp"].own_at_end
    framework = {"dtype": "torch.bfloat16", "owner": "accelerate", "site": None}
    script = {"dtype": "torch.float16", "owner": None, "site": "train.py:84"}
    assert read(ScriptSeen(Knobs(), autocasts=[framework])) == ("bf16", "bf16 autocast (accelerate)", None)
    assert read(ScriptSeen(Knobs(amp="bf16"), autocasts=[framework])) is None
    assert read(ScriptSeen(Knobs(amp="bf16"), autocasts=[framework, script])) == ("fp16", "fp16 autocast",
                                                                                  "train.py:84")
    assert read(ScriptSeen(Knobs(), autocasts=[{**script, "dtype": "torch.float32"}])) is None


def test_accumulation_and_the_fused_optimizer_read_the_scripts_steps_and_optimizers():
    """The script's accumulation: the same count of backward passes, more than one, in every step after the
    first; not where the knob accumulated. Its fused optimizer: one built with fused=True."""
    read = BY_NAME["accumulation_steps"].own_at_end
    assert read(ScriptSeen(Knobs(), backwards_per_step=[3, 2, 2, 2])) == (2, "gradient accumulation over 2 batches",
                                                                         None)
    assert read(ScriptSeen(Knobs(), backwards_per_step=[2, 2, 2])) is None  # two steps after the first: too few
    assert read(ScriptSeen(Knobs(), backwards_per_step=[2, 2, 3, 2])) is None
    assert read(ScriptSeen(Knobs(accumulation_steps=2), backwards_per_step=[2, 2, 2, 2])) is None
    fused = {"class": "AdamW", "user": {"fused": True}, "site": "train.py:7"}
    assert BY_NAME["fused_optimizer"].own_at_end(ScriptSeen(Knobs(), optimizers=[fused])) == (
        True, "fused AdamW", "train.py:7")


@pytest.mark.parametrize("knob", OFFERING, ids=lambda k: k.name)
def test_each_offering_knob_offers_its_own_move_until_the_best_holds_it(knob):
    """A knob that offers the search a move: from an untouched best (a CUDA device with Tensor Cores, or this
    kind of CPU; two ranks of 8 cores, a script with 2 workers and 8 threads at batch 32, its baseline measured;
    each bound in turn) it offers a move of itself, and from the best that took that move it offers nothing more,
    or (a ladder) its next step up."""
    devices = {"cuda": {"type": "cuda", "gpu": {"compute_capability": "9.0", "bf16_supported": True}},
               "cpu": {"type": "cpu"}}
    baseline = row(name="00-baseline", status="ok", batch_size=32, knobs=Knobs().to_dict())
    learned = Learned((baseline,), {"num_workers": 2, "threads": 8})

    def offers(knobs: Knobs, device: dict, bound: str | None) -> list[Offer]:
        made = knob.offer(Best.of(knobs, {}, bound, device, 8, SearchSpace(), 2, learned,
                                  SimpleNamespace(name="00-baseline", batch_size=knobs.batch_size or 32),
                                  SessionOptions()))
        return [o for o in (made if isinstance(made, tuple) else (made,)) if o is not None]

    made = [(offer, device) for device in devices.values()
            for bound in ("input", "copy", "compute", "host", "communication", None)
            for offer in offers(Knobs(), device, bound)]
    assert made, f"{knob.name} offers nothing from any best"
    for offer, device in made:
        assert knob.name in offer.moves and offer.change and offer.slug, offer
        assert (offer.recommendation or knob.proposed_as), offer
        taken = dataclasses.replace(Knobs(), **offer.moves)
        for again in offers(taken, device, offer.bound):
            assert knob.name in ORDERED and again.moves[knob.name] > offer.moves[knob.name], (offer, again)


PLACES = (IN_LOADER, IN_STEP, AFTER_IMPORTS, ON_MODEL, IN_OPTIMIZER, IN_DDP, FROM_TRIAL)
TINY = """import torch
from torch import nn

model = nn.Linear(4, 2)
optimizer = torch.optim.AdamW(model.parameters())
"""


@pytest.mark.parametrize("knob", KNOBS, ids=lambda k: k.name)
def test_each_knob_declares_where_the_patch_writes_it_and_the_patch_writes_its_lines_there(knob, tmp_path):
    """A knob's `Written`, from its module: a place the patch knows; the lines it declares (after the imports, on
    the model) are in the patch of a script that builds a model and its optimizer, at the knob's value."""
    written = knob.written
    assert written is not None and written.at in PLACES
    assert bool(written.lines) == (written.at in (AFTER_IMPORTS, ON_MODEL))
    # A keyword: DistributedDataParallel's, or the one the step's copies to the device take.
    assert bool(written.argument) == (written.at == IN_DDP or written.step_part == COPIES)
    assert (written.record in {**RECORDED_FIRST, **RECORDED}) == (written.at == FROM_TRIAL)
    if written.lines:
        script = tmp_path / "train.py"
        script.write_text(TINY)
        diff = plan_patch(script, None, Knobs(**{knob.name: a_value(knob)}), {}).diff
        for line in written.lines:
            assert f"+{line.format(value=a_value(knob), model='model')}\n" in diff


def test_moves_read_in_each_knobs_words_and_a_knobs_lint_rule_is_one_lint_has():
    from advisor.code.lint.rules import RULES
    from advisor.knobs import COPY_KNOBS, LINT_FIXES, moves_text

    assert moves_text({"num_workers": 8, "persistent_workers": True, "batch_size": 64}) == "workers →8 + batch →64"
    assert moves_text({"amp": None, "threads": 1}) == "AMP off + threads →1"
    # Pinned memory and non_blocking copies read as the one change they are tried as; either alone by its name.
    assert moves_text({"batch_size": 128, "pin_memory": True, "non_blocking": True}) == \
        "pin_memory + non_blocking copies + batch →128"
    assert moves_text({"pin_memory": True}) == "pin_memory=True"
    assert LINT_FIXES and all(rule in RULES and BY_NAME[knob].lint == rule for rule, knob in LINT_FIXES.items())
    assert set(COPY_KNOBS) == {"pin_memory", "non_blocking"}


def test_amp_says_why_it_is_never_tried_on_a_cpu_without_bf16_instructions():
    """On a CPU whose bf16 instructions torch will not use (none, or oneDNN capped below them), the session says why
    it never tries AMP, unless the script autocasts itself; on a CPU with them and on a GPU it says nothing. The
    facts are recorded trials' (the CPU surface's EPYC with avx512_bf16, the H100 surface's), read as the trial
    reads a machine (`bf16_instructions`)."""
    from advisor.knobs import amp
    from advisor.trials.harness.trial_facts import bf16_instructions

    surfaces = ROOT / "tests" / "data" / "surfaces"
    epyc = surfaces / "cpu-image-classifier" / "num_workers=0-batch_size=128-uint8_copies=off-threads=1-r1"
    facts = json.loads((epyc / "trial.json").read_text())["device_facts"]
    h100 = json.loads((surfaces / "h100-image-classifier" / "bf16-b128-w0-pin" / "trial.json").read_text())
    assert amp.not_tried_here(facts, {}) is None and amp.not_tried_here(h100["device_facts"], {}) is None
    flags = set(facts["cpu"]["bf16_instructions"]) | {"avx2"}
    for environ in ({"ONEDNN_MAX_CPU_ISA": "AVX2"}, {}):
        found = bf16_instructions(flags - ({"avx512_bf16"} if not environ else set()), environ)
        assert found == []
        without = {**facts, "cpu": {**facts["cpu"], "bf16_instructions": found}}
        note = amp.not_tried_here(without, {})
        assert note.startswith("bf16 autocast (AMP) is not tried on this CPU (AMD EPYC): it has no bf16 instructions")
        assert note.endswith("`advisor doctor` shows which bf16 instructions a machine has."), note  # a whole sentence
        own = {"amp": {"value": "bf16", "what": "bf16 autocast", "site": "train.py:84"}}
        assert amp.not_tried_here(without, own) is None  # the script's own autocast: the trials keep it
    assert amp.not_tried_here(None, {}) is None  # a baseline that recorded no facts: nothing known to say


@pytest.mark.parametrize("knob", PLANNED_AT_LOADER, ids=lambda k: k.name)
def test_each_loader_knob_plans_its_own_argument_and_says_why_not_where_the_loader_refuses_it(knob):
    """A knob the training DataLoader's arguments take, from its module (`Knob.in_loader`): on a batching loader
    with workers feeding an accelerator it is applied and changes what the loader is built with; asked nothing, it
    changes nothing; on a loader with a batch_sampler of the script's, no workers and no accelerator, it is applied
    or says why not, and never leaves an argument DataLoader rejects without workers."""
    import inspect

    from torch.utils.data import DataLoader

    from advisor.trials.interposition.loaders import plan_loader_arguments

    value = 4 if knob.alone is NEEDS_A_VALUE else knob.alone  # what `--try NAME` alone tries
    # What a script that left DataLoader's defaults gives, at batch 32 with 2 workers.
    defaults = {name: p.default for name, p in inspect.signature(DataLoader.__init__).parameters.items()}
    user = {**{name: defaults[name] for name in DATALOADER_KNOBS}, "batch_sampler": None, "batch_size": 32,
            "num_workers": 2}
    effective, outcomes = plan_loader_arguments(user, Knobs(**{knob.name: value}), accelerator=True)
    assert outcomes == {knob.name: APPLIED}
    assert effective != {k: user[k] for k in effective}
    assert plan_loader_arguments(user, Knobs(), accelerator=True)[1] == {}
    refusing = {**user, "batch_sampler": object(), "num_workers": 0, "prefetch_factor": 2, "persistent_workers": True}
    effective, outcomes = plan_loader_arguments(refusing, Knobs(**{knob.name: value}), accelerator=False)
    assert outcomes[knob.name] == APPLIED or outcomes[knob.name].startswith("not applicable: "), outcomes
    if effective["num_workers"] == 0:
        assert all(effective[k.name] == k.without_workers for k in KNOBS if k.needs_workers)


@pytest.mark.parametrize("knob", [k for k in KNOBS if k.written and k.written.step_part], ids=lambda k: k.name)
def test_each_knob_written_in_the_step_turns_on_its_part_of_the_rewrite(knob):
    from advisor.code.patch.step_body import StepPlan

    value = a_value(knob)
    plan = StepPlan.of(Knobs(**{knob.name: value}))
    assert knob.written.at == IN_STEP and plan.turned() and plan.asked == ((knob.name, value),)
    assert f"{knob.name}={value}" in plan.unwritten()
    assert not StepPlan.of(Knobs()).turned()


@pytest.mark.parametrize("knob", [k for k in KNOBS if k.on_optimizer], ids=lambda k: k.name)
def test_each_knob_that_builds_the_optimizers_builds_them_its_way_and_reads_the_scripts_own(knob):
    import torch

    from advisor.knobs.in_trial import declared_class

    model = torch.nn.Linear(4, 2)
    for value, own in ((True, {}), (None, {}), (None, {"fused": True})):
        change = declared_class(knob.on_optimizer)(knob.name, value)
        change.install()
        try:
            optimizer = torch.optim.Adam(model.parameters(), lr=0.1, **own)
        finally:
            change.undo()
        outcome = change.outcomes().get(knob.name)
        assert outcome == (APPLIED if value else None), outcome  # Adam takes fused=True on the CPU
        assert change.user_values() == {knob.name: bool(own)}
        assert [o["class"] for o in change.record()] == ["Adam"]
        assert optimizer.defaults.get("fused") is (True if value or own else None)
    assert torch.optim.Adam([torch.zeros(1)]).defaults.get("fused") is None  # the constructors put back


def test_the_compile_knob_says_after_how_many_steps_its_compile_pays_back():
    from advisor.knobs.compile import figures_text, note_payback, payback_steps, row_text

    before = {"samples_per_s": 100.0, "batch_size": 10}  # 0.1 s a step
    row = {"samples_per_s": 125.0, "batch_size": 10, "compile": {"compile_s": 12.0, "graphs": 1, "graph_breaks": 0}}
    note_payback(row, before)  # 0.02 s saved a step: 12 s back after 600 steps
    assert row["compile"]["pays_back_after_steps"] == 600
    assert row_text(row) == ("compiled in 12.0 s (first steps, not in the speed); 1 graph, no graph breaks; "
                             "pays back after 600 steps")
    assert payback_steps(12.0, before, {"samples_per_s": 90.0, "batch_size": 10}) is None  # slower: never
    # A batch grown with it: per sample, at the trial's batch (0.2 s a step of 20 at 100/s; 0.16 s at 125/s).
    assert payback_steps(12.0, before, {"samples_per_s": 125.0, "batch_size": 20}) == 300
    eager = {"samples_per_s": 125.0, "batch_size": 10, "compile": None}
    note_payback(eager, before)
    assert eager["compile"] is None and row_text(eager) == ""
    assert figures_text({"compile_s": 3.0, "graphs": 2, "graph_breaks": 1, "break_reasons": ["data-dependent"]}) \
        == "compiled in 3.0 s (first steps, not in the speed); 2 graphs, 1 graph break (data-dependent); " \
           "does not pay back: no faster"
