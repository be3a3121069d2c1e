"""The multi-file plan: which files the knobs are written into, each rewritten and compiled, then diffed
against the original into one patch that `patch -p1` or `git apply` applies."""

from __future__ import annotations

import dataclasses
import difflib
import tokenize
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import libcst as cst

from advisor.code.patch.sdpa_calls import write_attention
from advisor.code.patch.ddp import ddp_changes, rewrite_ddp
from advisor.code.patch.facts import ScriptFacts
from advisor.code.patch.framework_settings import rewrite_frameworks
from advisor.code.patch.layout import fit, formatted, line_width
from advisor.code.patch.loader_arguments import loader_changes, rewrite_dataloaders
from advisor.code.patch.byte_step import rewrite_step_bytes
from advisor.code.patch.bytes import imports_name, rewrite_dataset_bytes, rewrite_pipeline_bytes
from advisor.code.patch.block_checkpoints import manual_note, rewrite_checkpointing
from advisor.code.patch.model_lines import rewrite_inputs, rewrite_model
from advisor.code.patch.step_rewrite import TargetRewrite, add_module_statements
from advisor.code.patch.step_body import StepPlan
from advisor.code.patch.written import add_after_imports, to_write
from advisor.code.syntax import after_imports
from advisor.code.settings import Elsewhere, search_files, set_definitions
from advisor.errors import AdvisorError
from advisor.knobs import BY_NAME, written_at
from advisor.knobs.knob import AFTER_IMPORTS, FROM_TRIAL, IN_OPTIMIZER, ON_MODEL
from advisor.trials.knobs import Knobs

PATCH_NAME = "suggested.patch"


@dataclass
class Patch:
    """A suggested change: the unified diff over one or more files of the repository, and notes on what
    it leaves to the user (a flag to pass, a change it could not write)."""

    diff: str
    notes: list[str] = field(default_factory=list)


def site_of(site: str | None) -> tuple[Path, int] | None:
    """`/path/file.py:LINE` -> (path, line)."""
    if not site or ":" not in site:
        return None
    path, _, line = site.rpartition(":")
    return (Path(path), int(line)) if line.isdigit() and Path(path).is_file() else None


def plan_patch(script: Path, target: str | None, knobs: Knobs, user_values: dict | None, *,
               root: Path | None = None, loader_site: str | None = None,
               step_file: Path | None = None, uint8_plan: dict | None = None,
               attention_plan: list | None = None, checkpoint_plan: dict | None = None,
               channels_last_inputs: list[int] | None = None) -> Patch:
    """The change that applies `knobs` where the script sets them.

    `target`: the step function in `step_file` (default: the script) that autocast, non_blocking and
    gradient accumulation are written into (None: none of those). `loader_site`: where the training
    loader is built (`file.py:LINE`; default: every DataLoader call of the script); its values are
    changed where they are set — in its call, a constant, a flag's default, a config in another module.
    `uint8_plan`, `attention_plan`, `checkpoint_plan`: what the best trial changed (its trial.json), for the
    knobs written from their trial's record (`Written.record`); the attention first, while every file's lines
    are still those the trial read. `channels_last_inputs`: the positions of the model's inputs the best trial
    found 4-D (default: the first), each moved to the device in channels_last. Each knob is written where its
    module's `Written` says: the DataLoader's arguments, the step, the model and the optimizer, lines after the
    script's imports.
    """
    script = Path(script).resolve()
    root = Path(root).resolve() if root is not None else script.parent
    user_values = user_values or {}
    sources: dict[Path, str] = {}
    encodings: dict[Path, str] = {}

    def module_of(path: Path) -> cst.Module:
        if path not in sources:
            sources[path], encodings[path] = read_source(path)
        return parse_source(sources[path], str(path))

    edited: dict[Path, cst.Module] = {}
    notes: list[str] = []
    records = {"attention_plan": attention_plan, "uint8_plan": uint8_plan, "checkpoint_plan": checkpoint_plan}
    step_path = Path(step_file).resolve() if step_file is not None else script
    notes += write_recorded(RECORDED_FIRST, edited, module_of, knobs, records, Sites(script, step_path, target),
                            user_values)
    found = site_of(loader_site)
    loader_file, line = (found[0].resolve(), found[1]) if found else (script, None)
    elsewhere = Elsewhere(search_files(script, loader_file, root), loader_file)
    # A framework the script configures (TrainingArguments, Accelerator, Lightning's Trainer) owns the
    # settings it builds from: those knobs are written there, the rest by the plain rules below.
    framework = rewrite_frameworks(edited, module_of, elsewhere.files, knobs, user_values, elsewhere)
    notes += framework.notes
    if framework.written:
        knobs = dataclasses.replace(knobs, **{k: None for k in framework.written})
    module = edited.get(loader_file) or module_of(loader_file)
    loader = rewrite_dataloaders(module, ScriptFacts.collect(module), knobs, user_values, line=line,
                                 elsewhere=elsewhere)
    if loader_changes(knobs, user_values) and loader.code == module.code and not elsewhere.changes \
            and not elsewhere.notes:
        notes.append(unwritten_loader(loader_changes(knobs, user_values), user_values, loader_site))
    edited[loader_file] = loader
    notes += elsewhere.notes
    for path in {d.file for d, _ in elsewhere.changes}:
        base = edited.get(path) or module_of(path)
        edited[path] = set_definitions(base, [(d, v) for d, v in elsewhere.changes if d.file == path])
    step = StepPlan.of(knobs)
    if target is not None and step.turned():
        base = edited.get(step_path) or module_of(step_path)
        edited[step_path] = rewrite_step(base, target, knobs, str(step_path))
    elif step.turned():
        at_top = rewrite_top_level_loop(edited.get(script) or module_of(script), knobs)
        if at_top is None:
            notes.append(step.unwritten())
        else:
            edited[script] = at_top
    if ddp_changes(knobs, user_values):
        edited[script], ddp_notes = rewrite_ddp(edited.get(script) or module_of(script), knobs, user_values)
        notes += ddp_notes
    changes = to_write(knobs, user_values, ON_MODEL, IN_OPTIMIZER)
    if changes:
        edited[script], model_notes = rewrite_model(edited.get(script) or module_of(script), changes)
        notes += model_notes
    for name in changes:  # the batch, where the step moves it (channels_last)
        written = BY_NAME[name].written
        placed = False
        if written.batch_keyword and target is not None:
            edited[step_path], placed = rewrite_inputs(edited.get(step_path) or module_of(step_path), target,
                                                       written.batch_keyword, channels_last_inputs)
        if written.batch_keyword and not placed:
            notes.append(written.batch_manual)
    notes += write_recorded(RECORDED, edited, module_of, knobs, records, Sites(script, step_path, target),
                            user_values)
    settings = to_write(knobs, user_values, AFTER_IMPORTS)
    if settings:
        edited[script] = add_after_imports(edited.get(script) or module_of(script), settings)
    diffs = []
    for path, after in sorted(edited.items()):
        if path not in sources:
            continue
        try:
            rel = path.relative_to(root).as_posix()
        except ValueError:
            if path == script:
                raise AdvisorError(f"{path}: cannot patch: the file is not inside {root}") from None
            # Another file (an installed package's): the script's own changes still stand.
            notes.append(f"not written into {path}: the file is not inside {root}; make the final settings "
                         "listed in this report where your code configures the package that file belongs to")
            continue
        text = formatted(fit(after, sources[path], line_width(path, root)).code, sources[path], path, root)
        try:
            compile(text, str(path), "exec", dont_inherit=True)
        except SyntaxError as exc:  # a bug here, never the user's: their file parsed
            raise AdvisorError(f"{path}: cannot patch: the patched source does not compile ({exc.msg})") from None
        diffs.append(unified_diff(sources[path], text, rel))
    return Patch("".join(diffs), notes)


def unwritten_loader(changes: dict, user_values: dict, site: str | None) -> str:
    """The note for DataLoader settings the patch found no place for: each setting, its value and where."""
    kept = ", ".join(f"{k}={v!r} (was {user_values.get(k)!r})" for k, v in changes.items())
    where = f"it is built from the call at {site}" if site else "no DataLoader call of the script built it"
    return (f"{kept} is not written: {where}, inside a library the patch does not know; set it where your code "
            "configures that library's training DataLoader")


@dataclass(frozen=True)
class Sites:
    """Where a change a trial recorded is written: beside the script, the step's file and function; and the
    script's own value of the knob."""

    script: Path
    step_path: Path
    target: str | None
    own: Any = None


def write_recorded(writers: dict, edited: dict, module_of, knobs: Knobs, records: dict, sites: Sites,
                   user_values: dict) -> list[str]:
    """Each knob written from its trial's record (`FROM_TRIAL`) whose record `writers` writes, in the registry's
    order, into `edited`; the notes for what is not found."""
    notes = []
    for knob in written_at(FROM_TRIAL):
        if knob.written.record in writers and getattr(knobs, knob.name):
            notes += writers[knob.written.record](edited, module_of, records.get(knob.written.record),
                                                  dataclasses.replace(sites, own=user_values.get(knob.name)))
    return notes


def write_attention_plan(edited: dict, module_of, plan: list | None, sites: Sites) -> list[str]:
    """The attention the trial rewrote (its record's lines), where the script does not use SDPA already."""
    return write_attention(edited, module_of, plan) if plan and not sites.own else []


def write_checkpointing(edited: dict, module_of, plan: dict | None, sites: Sites | None = None) -> list[str]:
    """The checkpointing change into `edited`: the blocks' calls in the forward that runs them; a note where not."""
    path = Path(plan["file"]).resolve() if plan and plan.get("file") else None
    if path is None or not path.is_file():
        return [manual_note(plan or {})]
    module, changed = rewrite_checkpointing(edited.get(path) or module_of(path), plan)
    if not changed:
        return [manual_note(plan)]
    edited[path] = module
    return []


def write_uint8(edited: dict, module_of, plan: dict | None, sites: Sites) -> list[str]:
    """The 8-bit copies the trial made: of a torchvision pipeline, or of the Dataset's own conversion."""
    if not plan:
        return []
    if plan.get("kind") == "transform":
        return write_pipeline_bytes(edited, module_of, [Path(plan["file"]).resolve(), sites.script, sites.step_path],
                                    sites.step_path, sites.target, plan)
    return write_bytes(edited, module_of, Path(plan["file"]).resolve(), sites.step_path, sites.target, plan)


def write_bytes(edited: dict, module_of, dataset_file: Path, step_path: Path, target: str | None,
                plan: dict) -> list[str]:
    """The uint8_copies change into `edited`: the Dataset's file and the step's; notes for what is not found."""
    if not dataset_file.is_file():
        return [f"8-bit copies are not written: the Dataset's file {dataset_file} is not there"]
    base = edited.get(dataset_file) or module_of(dataset_file)
    dataset, found = rewrite_dataset_bytes(base, plan)
    moved = False
    if found and target is not None:
        same = step_path == dataset_file
        step, moved = rewrite_step_bytes(dataset if same else edited.get(step_path) or module_of(step_path),
                                         target, plan, same)
    if not (found and moved):
        return ["8-bit copies are not written: the conversion in the Dataset or the step's .to(device) of the "
                f"batch was not found; keep {plan['uint8']} in the Dataset and convert after the copy"]
    edited[dataset_file] = dataset
    edited[step_path] = step  # the same file: the step's rewrite holds the Dataset's too
    return []


def write_pipeline_bytes(edited: dict, module_of, files: list[Path], step_path: Path, target: str | None,
                         plan: dict) -> list[str]:
    """The uint8_copies change of a torchvision pipeline into `edited`: the `Compose([...])` made 8-bit in the
    first of `files` (where the loader is built, the script, the step's file) that holds it, the step's
    `.to(device)` converting and normalizing; notes for what is not found."""
    pipeline = " + ".join(plan.get("transforms") or [])
    for path in dict.fromkeys(f for f in files if f.is_file()):
        base = edited.get(path) or module_of(path)
        module, count, constants = rewrite_pipeline_bytes(base, plan)
        if count > 1:
            return [f"8-bit copies are not written: {count} pipelines {pipeline} in {path.name}; make the training "
                    f"one {plan['uint8']} without its Normalize, and convert and normalize after the copy"]
        if count == 0:
            continue
        if "PILToTensor()" in plan["uint8"] and not imports_name(module, "PILToTensor") and \
                "PILToTensor(" in module.code and ".PILToTensor(" not in module.code:
            at = after_imports(list(module.body))  # ToTensor was imported by name: PILToTensor beside it
            module = module.with_changes(body=[*module.body[:at],
                                               cst.parse_statement("from torchvision.transforms import PILToTensor"),
                                               *module.body[at:]])
        step, moved = (None, False) if target is None else rewrite_step_bytes(
            module if step_path == path else edited.get(step_path) or module_of(step_path), target,
            {**plan, **constants}, step_path == path)
        if not moved:
            return ["8-bit copies are not written: the step's .to(device) of the batch was not found; make the "
                    f"pipeline {plan['uint8']} without its Normalize and convert and normalize after the copy"]
        edited[path] = module
        edited[step_path] = step  # the same file: the step's rewrite holds the pipeline's too
        return []
    return [f"8-bit copies are not written: the pipeline Compose([{pipeline}]) was not found written as one list "
            "in the loader's, the script's or the step's file"]


# The writers of what trials record they changed (`Written.record`): the attention first, while every file's lines
# are those the trial read; the Dataset's bytes and the checkpointed blocks after the plain rules.
RECORDED_FIRST = {"attention_plan": write_attention_plan}
RECORDED = {"uint8_plan": write_uint8, "checkpoint_plan": write_checkpointing}


def suggest_patch(script: Path, target: str | None, knobs: Knobs, user_values: dict | None, *,
                  root: Path | None = None,
                  loader_site: str | None = None, step_file: Path | None = None,
                  uint8_plan: dict | None = None, attention_plan: list | None = None) -> str:
    """The unified diff (`a/<rel>`, `b/<rel>` headers per file) that applies `knobs`; '' if none."""
    return plan_patch(script, target, knobs, user_values, root=root,
                      loader_site=loader_site, step_file=step_file, uint8_plan=uint8_plan,
                      attention_plan=attention_plan).diff


def write_patch(script: Path, target: str | None, knobs: Knobs, user_values: dict | None, folder: Path, *,
                root: Path | None = None, loader_site: str | None = None,
                step_file: Path | None = None, uint8_plan: dict | None = None,
                attention_plan: list | None = None, checkpoint_plan: dict | None = None,
                channels_last_inputs: list[int] | None = None) -> tuple[Path | None, list[str]]:
    """Write `folder/suggested.patch`; return its path (None when nothing changes) and the patch's notes."""
    patch = plan_patch(script, target, knobs, user_values, root=root,
                       loader_site=loader_site, step_file=step_file, uint8_plan=uint8_plan,
                       attention_plan=attention_plan, checkpoint_plan=checkpoint_plan,
                       channels_last_inputs=channels_last_inputs)
    if not patch.diff:
        return None, patch.notes
    path = Path(folder) / PATCH_NAME
    _, encoding = read_source(Path(script))
    # The script's own encoding, untranslated newlines: the diff's context lines must match its bytes.
    with open(path, "w", encoding=encoding, newline="") as handle:
        handle.write(patch.diff)
    return path, patch.notes


def read_source(script: Path) -> tuple[str, str]:
    """The script's text exactly as on disk (newlines untranslated) and its encoding."""
    try:
        with open(script, "rb") as handle:
            encoding, _ = tokenize.detect_encoding(handle.readline)
        return script.read_bytes().decode(encoding), encoding
    except (OSError, SyntaxError, UnicodeDecodeError) as exc:
        raise AdvisorError(f"{script}: cannot patch: {exc}") from None


def unified_diff(before: str, after: str, rel: str) -> str:
    """`diff -u` of two texts, headers `a/<rel>` and `b/<rel>`; '' when they are equal."""
    if before == after:
        return ""
    out = []
    for line in difflib.unified_diff(split_lines(before), split_lines(after), f"a/{rel}", f"b/{rel}"):
        if not line.endswith("\n"):  # a last line without a newline needs patch's marker
            line += "\n\\ No newline at end of file\n"
        out.append(line)
    return "".join(out)


def split_lines(text: str) -> list[str]:
    """Lines with their endings, split on "\\n" only (str.splitlines also splits on form feeds)."""
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def parse_source(source: str, filename: str) -> cst.Module:
    """The syntax tree of a file to patch; a one-line error when it does not parse."""
    try:
        return cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        raise AdvisorError(f"{filename}: cannot patch: the script does not parse (line {exc.raw_line})") from None


def rewrite_top_level_loop(module: cst.Module, knobs: Knobs) -> cst.Module | None:
    """The module with the step plan written into the one loop at its top level that calls backward
    (`TargetRewrite.top_level_loop`), or None where there is none to write it in."""
    facts = ScriptFacts.collect(module)
    step = StepPlan.of(knobs, facts.free_name("scaler", "grad_scaler", "advisor_scaler"))
    transformer = TargetRewrite("", step, facts)
    body = transformer.top_level_loop(list(module.body))
    return None if body is None else add_module_statements(module.with_changes(body=body), facts, step, transformer)


def rewrite_step(module: cst.Module, target: str, knobs: Knobs, filename: str) -> cst.Module:
    """The module with autocast, the GradScaler, non_blocking copies and gradient accumulation written
    into the step function `target`, as the knobs written in the step ask (`StepPlan`)."""
    facts = ScriptFacts.collect(module)
    if not facts.target_exists(target):
        raise AdvisorError(f"{filename}: cannot patch: {facts.not_found_message(target)}")
    step = StepPlan.of(knobs, facts.free_name("scaler", "grad_scaler", "advisor_scaler"))
    transformer = TargetRewrite(target, step, facts)
    module = module.visit(transformer)
    return add_module_statements(module, facts, step, transformer)


def patched_source(source: str, target: str, knobs: Knobs, user_values: dict, *,
                   filename: str = "<script>") -> str:
    """The script's source with the knobs written in (every DataLoader call, the step `target`); raises
    AdvisorError if that cannot be done."""
    module = parse_source(source, filename)
    facts = ScriptFacts.collect(module)
    if not facts.target_exists(target):
        raise AdvisorError(f"{filename}: cannot patch: {facts.not_found_message(target)}")
    module = rewrite_dataloaders(module, facts, knobs, user_values)
    module = rewrite_step(module, target, knobs, filename)
    after = module.code
    try:
        compile(after, filename, "exec", dont_inherit=True)
    except SyntaxError as exc:  # a bug here, never the user's: their script parsed
        raise AdvisorError(f"{filename}: cannot patch: the patched source does not compile ({exc.msg})") from None
    return after
