"""`Knob`: what one knob is, declared once in its own module of `advisor.knobs`.

A knob's module holds its declaration (a `Knob`: its values, how they read on the command line and in a
folder's name, what part of the training it belongs to, where it is applied, its framework's field, its part
of the what-if model: a `WhatIf`, how the patch writes it: a `Written`) and its reference text, the module's
docstring, which the documentation site renders as the knob's section. The registry (`advisor.knobs`) gathers
them; `Knobs` (`advisor.trials.knobs`), the record's shapes, `--only`, `--skip` and `--try`, the recorded
surfaces, the what-if model, the patch and the docs iterate over it. What a knob's module uses inside the trial
(patching an attribute, the DataLoader's arguments as planned, `ModelChange`, `DataChange`, `ScriptSeen`) is
`advisor.knobs.in_trial`'s. Stdlib only: read by the analysis, which runs without torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # the trial's side of a knob: in_trial imports this module
    from advisor.knobs.in_trial import ModelChange, Own, ScriptSeen

# A requested knob's outcome in a trial: applied, or why not (`not_applicable`).
APPLIED = "applied"


def not_applicable(why: str) -> str:
    """The outcome text for a knob that could not be applied."""
    return f"not applicable: {why}"


# What values a knob takes.
FLAG = "flag"  # true or false
COUNT = "count"  # a whole number from 1
WORKERS = "workers"  # a whole number from 0
CHOICE = "choice"  # one of `choices`

# The part of the training a knob belongs to (how the search, the surfaces and the patch group them).
LOADER = "loader"  # an argument of the training DataLoader
STEP = "step"  # how the step runs: precision, copies, accumulation
PROCESS = "process"  # a setting of the whole training process
MODEL = "model"  # how the model runs: layout, compiler, kernels (taken off again where its place is in doubt)
DATA = "data"  # what the Dataset hands out
MEMORY = "memory"  # buys memory, not speed: proposed where memory binds
DDP = "ddp"  # an argument of DistributedDataParallel, on every rank

# Where inside the trial it is applied, and by which interposition (`advisor.trials.interposition.*`; the
# script is never edited).
AT_LOADER = "where the training DataLoader is built"  # loaders (the Trainer's fields: frameworks)
AROUND_STEP = "around each call of the step"  # step, gradients; with no step function, loop
AT_STEPS_START = "when the steps start"  # advisor.trials.harness.driver
AT_FIRST_CALL = "at the model's first call"  # model (attention, checkpointing)
AT_OPTIMIZER = "where the optimizer is built"  # optimizers
AT_DATASET = "in the training Dataset and the step's copies"  # uint8_copies
AT_DDP = "where DistributedDataParallel wraps the model"  # ddp_arguments, on every rank alike

# Where the patch (`advisor.code.patch`) writes it in a plain script, as a user would by hand.
IN_LOADER = "in the training DataLoader's arguments"  # its call, or the constant, flag default or config they read
IN_STEP = "in the step function"  # autocast, non_blocking copies, accumulation (`advisor.code.patch.step_rewrite`)
# IN_STEP: the part of the step's rewrite that writes it (`Written.step_part`).
AUTOCAST = "autocast"  # the forward under torch.autocast to the knob's dtype (fp16: with a GradScaler)
COPIES = "asynchronous copies"  # non_blocking=True on the step's host-to-device copies
ACCUMULATION = "gradient accumulation"  # one optimizer step every N calls of the step, its counter and guards
AFTER_IMPORTS = "after the script's imports"  # `Written.lines`
ON_MODEL = "on the model, just before the optimizer is built from it"  # `Written.lines`
IN_OPTIMIZER = "in the optimizer's constructor"  # fused=True (foreach=True for a class without a fused kernel)
IN_DDP = "in the DistributedDataParallel(...) call"  # `Written.argument`
FROM_TRIAL = "where the trial's record says it changed the code"  # `Written.record`: the trial's plan

TRUE, FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")
NEEDS_A_VALUE = object()  # `--try NAME` alone is not enough: the knob has no natural value to try


@dataclass(frozen=True)
class TorchSetting:
    """A knob that is a process-wide torch setting (CUDA's): applied at the model's first call and put back after
    the trial (`advisor.trials.interposition.model`), the script's own read there
    (`advisor.trials.interposition.own_settings`); the patch writes it as lines after the imports (its `Written`)."""

    off_cuda: str  # why it is not applicable on another device
    own: Callable[[Any], str | None]  # (torch) -> how the script's own setting reads, None where it set none
    apply: Callable[[Any, Any], str | None]  # (torch, an ExitStack to undo it) -> None, or why not applicable


@dataclass(frozen=True)
class Code:
    """A value the patch writes as code, not as a literal: set only where the call does not set it itself."""

    text: str


@dataclass(frozen=True)
class Written:
    """How the patch (`advisor.code.patch`) writes a knob the session kept: where in a plain script, and in a
    framework's own settings where the script configures one (transformers' TrainingArguments, accelerate's
    Accelerator, Lightning's Trainer). Text only: the patch's syntax-tree edits read it."""

    at: str  # where in a plain script (IN_*)
    # AFTER_IMPORTS, ON_MODEL: its lines, `{value}` the knob's value, `{model}` the model's name.
    lines: tuple[str, ...] = ()
    manual: str | None = None  # ON_MODEL, IN_OPTIMIZER: what to write by hand where that place is not found
    # IN_DDP: DistributedDataParallel's keyword; IN_STEP's COPIES: the keyword the step's copies to the device take
    argument: str | None = None
    position: int | None = None  # IN_LOADER: its position among DataLoader's arguments, where it has one
    excluded_by: str | None = None  # IN_LOADER: the DataLoader argument that, given, leaves it out
    record: str | None = None  # FROM_TRIAL: the field of trial.json that holds what the trial changed
    step_part: str | None = None  # IN_STEP: the part of the step's rewrite that writes it (AUTOCAST, COPIES, ACCUMULATION)
    # ON_MODEL: the keyword (and its code) the step's move of the batch to the device takes, and what to write by
    # hand where no such move is found.
    batch_keyword: tuple[str, str] | None = None
    batch_manual: str | None = None
    batch_record: str | None = None  # the field of trial.json naming the model's inputs it goes on (their positions)
    # TrainingArguments keywords for each of its values (whatever the script's own: amp's bf16=True), where the
    # Trainer has its own way to do what the trial applied by interposition, and ...
    trainer_for: dict[Any, tuple[tuple[str, Any], ...]] = field(default_factory=dict, compare=False)
    # ... for the knob turned on, where the script does not turn it on itself (`torch_compile=True`).
    trainer_keywords: tuple[tuple[str, Any], ...] = ()
    # Micro-batches of this knob (the batch's): its TrainingArguments field takes the batch over this knob's value,
    # and `trainer_count` the value.
    micro_batches_of: str | None = None
    trainer_count: str | None = None
    accelerator_argument: str | None = None  # the Accelerator(...) keyword that takes its value
    lightning_for: dict[Any, tuple[tuple[str, Any], ...]] = field(default_factory=dict, compare=False)  # Trainer(...)
    lightning_model: str | None = None  # under Lightning: the line on `{model}` right before `trainer.fit(model)`


@dataclass(frozen=True)
class WhatIf:
    """A knob's part of the what-if model (`advisor.analysis.whatif`): how a trial's record reads its setting, and
    the transformation of the step graph (`advisor.knobs.graph.StepGraph`) that a change of it makes, with the one
    parameter a session calibrates from what it measured."""

    term: str  # the model's name for the change: the knob's own, or one that several knobs make together
    field: str  # the StepGraph field that holds the setting
    read: Callable[[Any], Any]  # (TrialSettings) -> the setting the trial ran with
    transform: Callable[[Any, Any, float, dict], Any]  # (graph, value, parameter, all parameters) -> graph after
    family: str  # the name of its parameter
    prior: float  # the parameter before the session measured anything
    bounds: tuple[float, float]  # the range calibration may move it in
    prior_cpu: float | None = None  # ... on a CPU, where it differs there
    # One parameter per kind of graph (the batch's, per precision and loader), and the one a graph takes.
    families: tuple[str, ...] = ()
    family_for: Callable[[Any], str] | None = None
    # A second parameter, calibrated where the first cannot reproduce a measured change (`whatif.calibrate`),
    # with its own prior and range, and the StepGraph field it sets on every graph a prediction starts from (the
    # machine's, not the change's: the graph before the change pays it as the one after does).
    then: str | None = None
    then_prior: float = 0.0
    then_bounds: tuple[float, float] = (0.0, 0.0)
    then_field: str | None = None

    def prior_of(self, family: str) -> float:
        """The prior of one of its parameters."""
        return self.then_prior if family == self.then else self.prior

    def bounds_of(self, family: str) -> tuple[float, float]:
        """The range calibration may move one of its parameters in."""
        return self.then_bounds if family == self.then else self.bounds

    def parameters(self) -> tuple[str, ...]:
        """The names of its parameters."""
        return (self.families or (self.family,)) + ((self.then,) if self.then else ())

    def family_of(self, graph: Any) -> str:
        """The parameter that sets it on `graph`."""
        return self.family_for(graph) if self.family_for else self.family


@dataclass(frozen=True)
class Knob:
    """One knob's declaration; its module's docstring is its reference text."""

    name: str
    kind: str  # FLAG, COUNT, WORKERS or CHOICE
    part: str  # LOADER, STEP, PROCESS, MODEL, DATA, MEMORY or DDP
    applied: str  # where the trial applies it (AT_*)
    title: str  # how a change of it reads in a session ("TF32 matmuls")
    choices: tuple = ()  # CHOICE: the values it takes (None: the user's)
    alone: Any = True  # what `--try NAME` with no value tries (NEEDS_A_VALUE: it needs one)
    training_argument: str | None = None  # the field of transformers' TrainingArguments that sets it
    # `advisor.tune()` can apply it in the notebook's process. There the optimizer and the Dataset are built already,
    # and a compile is not: dynamo's caches and guards for the model's code would stay in the process after the
    # trial, which no undo short of torch._dynamo.reset() (dropping the user's own compiled code too) removes.
    in_process: bool = False
    on_surface: bool = True  # a recorded surface tells settings apart by it
    # The knob this one goes with, and its value when that one moves: never turned alone (workers persist with
    # their count). --only, --skip and --try do not take it.
    companion_of: tuple[str, Any] | None = None
    # A DataLoader argument torch accepts only with worker processes: the value it takes without them (False,
    # None), which the trial and the patch put in its place where there are none.
    needs_workers: bool = False
    # How the trial plans the training DataLoader's arguments for it (`LoaderArguments`), in the registry's order:
    # (knob, value or None, the arguments) -> its outcome, or None where it asked for nothing; `as_given`,
    # `with_workers` or its module's own.
    in_loader: Callable[[Any, Any, Any], str | None] | None = None
    # Values with which it changes nothing in the trial (one micro-batch a step): applied as they are.
    idle: tuple = ()
    # What is in effect where neither the knob nor the script sets it (DataLoader's no workers; one micro-batch a
    # step), where a recorded surface tells settings apart by it.
    unset: Any = None
    # How the trial applies it once the steps start, over what the script set itself: (value, torch) -> its outcome.
    at_steps_start: Callable[[Any, Any], str] | None = None
    compiles: bool = False  # it compiles the step: its first steps compile, its graphs are counted step by step
    # Why `advisor.tune()` cannot apply it in the notebook's process, where it cannot (its trial says so).
    not_in_notebook: str | None = None
    without_workers: Any = None
    numerics: bool = True  # changes what the step computes, not only how its batches reach it
    setting: TorchSetting | None = None  # where the knob is one process-wide torch setting
    # The finding (`advisor.analysis.rules`, by its id) whose advice turns this knob on, with the finding's gain
    # and bound: the search proposes it on the best wherever the trace gives that advice.
    advice: str | None = None
    # The id of the change it is proposed as where no finding's advice turns it on (a finding's, or the search's
    # own move: "more-workers", "amp"; a `Proposal.recommendation`).
    proposed_as: str | None = None
    # Where that finding chooses its value (DDP's arguments for exposed all-reduce): its value from the finding's
    # figures (a dict the rule gives), or None to leave it out of the change; and what the finding's evidence says
    # where it is in the change.
    advised: Callable[[dict[str, Any]], Any] | None = None
    advised_because: str | None = None
    # σ of what that change (its advice, or what it is proposed as) moves samples/s by, before a session measured any
    # (`advisor.analysis.worth`): on an accelerator, and on the CPU (None: the default spread).
    spread: tuple[float | None, float | None] = (None, None)
    # A knob that does less of what another does (TF32 of what AMP does): proposed only where the best does not hold
    # that one, and, where the trace advises that one too, once its change was tried (and not kept).
    after: str | None = None
    whatif: WhatIf | None = None  # where the what-if model predicts what a change of it does
    written: Written | None = None  # how the patch writes it
    # The move it offers the search from the best of now (`advisor.knobs.offer`: a function of a `Best` that
    # returns an `Offer`, several, or None), where the search proposes it on its own; and where its offers stand
    # among candidates the search ranks equal (the ladders first: the workers, then the batch; then the registry's
    # order).
    offer: Callable[[Any], Any] | None = None
    order: int = 2
    # Its moves in the recovery plan of a baseline that ran out of memory (a function of a `Best`, the baseline
    # of the user's settings, that returns an `Offer`, several, or None), and their place in that plan: the plan
    # tries what keeps the most of the user's settings first (AMP, checkpointing, micro-batches, a smaller batch).
    recover: Callable[[Any], Any] | None = None
    recovers_at: int = 0
    # How its move to a value reads in a change's words ("workers →8"; else "name=value"), and the knob it reads as
    # one change with where both move, with those words (pinned memory and non_blocking copies).
    moved: Callable[[Any], str] | None = None
    together: tuple[str, str] | None = None
    # The `advisor lint` rule whose fix sets this knob in the script: the report puts what the session measured of
    # the knob beside that finding.
    lint: str | None = None
    copies: bool = False  # acts on host-to-device copies: nothing to measure on the CPU, where batches are not copied
    # Seconds its first steps may take beyond a trial's --timeout where it is on (at least as long again: a compile).
    first_steps_s: float = 0.0
    # The seconds its first steps held in a trial beyond the steps' own (a compile's), read from the trial's row
    # (a function of a `TrialRow` -> seconds, or None where that trial measured none), and what it is taken to hold
    # before the session measured any: the search prices a candidate that turns it on by them
    # (`advisor.search.cost`). A trial's own time is its wall time less what these held.
    first_steps_held: Callable[[Any], float | None] | None = None
    first_steps_prior_s: float = 0.0
    # It changes the memory layout of the model's tensors (channels_last): a knob that compiles and measured slower is
    # not compiled again in another layout unless the what-if model says the layout was the cause.
    layout: bool = False
    # How the trial applies it at the model's first call, where it changes the model: a `ModelChange` class, or
    # where that class lives in the trial's code ("advisor.trials.interposition.fused_attention:AttentionRewrite":
    # a trial-side module this package may not import), which the trial imports.
    on_model: Callable[[], ModelChange] | str | None = None
    # How the trial applies it in the training Dataset and the step's copies: a `DataChange` class, or where it lives
    # in the trial's code (as `on_model`).
    on_data: Callable[[str], Any] | str | None = None
    # How the trial applies it around each call of the step function (and, where the script has none, over the whole
    # run): a `StepChange` class (given the knob's value and the device type), or where it lives (as `on_model`).
    on_step: Callable[[Any, str], Any] | str | None = None
    # How the trial builds the script's torch.optim optimizers for it: a class given the knob's name and value (None:
    # the script's own), installed for the whole trial, which records what each optimizer the script built ran with,
    # requested or not (`install`, `outcomes`, `user_values`, `record`); or where it lives (as `on_model`).
    on_optimizer: Callable[[str, Any], Any] | str | None = None
    # How the trial reads the script's own setting of it (`advisor.trials.interposition.own_settings`): at the
    # model's first call, before a knob changes the model or torch ((torch, the model) -> a phrase, or None where the
    # script did not set it; the value is True), with the torch function whose caller is where the script sets it
    # (`own_call`: "compile" for torch.compile); or by the trial's end, from a `ScriptSeen` -> an `Own` or None.
    # A torch setting's (`setting.own`) is read at the first call.
    own_at_first_call: Callable[[Any, Any], str | None] | None = None
    own_call: str | None = None
    own_at_end: Callable[[ScriptSeen], Own | None] | None = None

    def own_on_model(self, torch: Any, model: Any) -> str | None:
        """The script's own setting of it read at the model's first call, as a phrase; None where it set none or
        is not read there."""
        if self.own_at_first_call is not None:
            return self.own_at_first_call(torch, model)
        return self.setting.own(torch) if self.setting is not None else None

    def changes_nothing(self, value: Any) -> bool:
        """Whether the trial has nothing to change for this value (`idle`)."""
        return any(type(value) is type(v) and value == v for v in self.idle)

    def move_text(self, value: Any) -> str:
        """Its move to `value` in a change's words."""
        return self.moved(value) if self.moved else f"{self.name}={value}"

    def problem(self, value: Any) -> str | None:
        """Why `value` is not one of this knob's (one line), or None; None itself is "the user's value"."""
        if value is None:
            return None
        if self.kind == CHOICE:
            if value not in self.choices:
                named = ", ".join(str(c) for c in self.choices if c is not None)
                return f"{self.name} must be one of {named} or None, not {value!r}"
        elif self.kind == FLAG:
            if not isinstance(value, bool):
                return f"{self.name} must be true or false, not {value!r}"
        elif not isinstance(value, int) or isinstance(value, bool) or value < (0 if self.kind == WORKERS else 1):
            least = "an integer >= 0" if self.kind == WORKERS else "a positive integer"
            return f"{self.name} must be {least}, not {value!r}"
        return None

    def label(self, value: Any) -> str:
        """This knob at `value` in a folder's name: `amp-bf16`, `channels-last`, `no-compile`, `num-workers-4`."""
        dashed = self.name.replace("_", "-")
        if self.kind == CHOICE:
            return f"{dashed}-{value}"
        if isinstance(value, bool):
            return dashed if value else f"no-{dashed}"
        return f"{dashed}-{value}"

    def parse(self, text: str | None) -> Any:
        """A value as the command line gives it (`--try NAME=TEXT`, or `--try NAME` alone); ValueError if not one."""
        if text is None:
            if self.alone is NEEDS_A_VALUE:
                raise ValueError(f"{self.name} needs a value, e.g. {self.name}=4")
            return self.alone
        raw = text.strip().lower()
        if self.kind == FLAG:
            if raw in TRUE or raw in FALSE:
                return raw in TRUE
            raise ValueError(f"{self.name} is true or false, not {text!r}")
        if self.kind in (COUNT, WORKERS):
            try:
                return int(raw)
            except ValueError:
                raise ValueError(f"{self.name} is a whole number, not {text!r}") from None
        return None if raw in ("none", "off") else raw
