"""Terminal rendering with rich: a diagnosis (figures first, then what to do) and a session's ladder."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

from rich.cells import cell_len
from rich.console import Console
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from advisor.analysis.bound import BOUNDS
from advisor.analysis.breakdown import ROLES
from advisor.analysis.diagnosis import Diagnosis
from advisor.analysis.job import Job, compute_us, exposed_us, jobs_of, own_us, rank_of
from advisor.escape import for_terminal, output_stream
from advisor.knobs import threads
from advisor.report.formatting import attention_text, gb as _gb, pct as _pct, step_time_s, time_text

ROLE_LABELS = {
    "kernel": "GPU kernels", "memcpy": "memory copies", "memset": "memset", "communication": "communication",
    "runtime": "CUDA/HIP runtime", "dataloader": "DataLoader", "cpu_op": "CPU operators", "other": "other",
}
RUNTIME_BY_VENDOR = {"nvidia": "CUDA runtime", "amd": "HIP runtime"}


def _text(text: object, style: str | None = None) -> Text:
    """Rich text, never markup, with control characters from trace or file names shown as escapes."""
    return Text(for_terminal(text), style=style or "")


def _row(table: Table, *cells: object) -> None:
    """A table row of plain (escaped, never markup) cells."""
    table.add_row(*(c if isinstance(c, Text) else _text(c) for c in cells))


def fits(table: Table, console: Console) -> bool:
    """Whether the table fits the console's width with every header and cell whole (wrapped at spaces at
    most): rich would otherwise cut them with '…' (an 80-column terminal, or output piped to a file)."""
    unbounded = console.options.update_width(10**6)  # rich clamps a measurement to the width it is given
    return console.measure(table, options=unbounded).minimum <= console.width


def _indented(text: Text, indent: int) -> Padding:
    """Text whose wrapped lines keep its indentation."""
    return Padding(text, (0, 0, 0, indent), expand=False)


def _hanging(marker: str, text: Text) -> Table:
    """`marker` then the text, whose wrapped lines hang under the text (' 1. title', '    - evidence')."""
    grid = Table.grid(padding=(0, 1, 0, 0))
    grid.add_column(no_wrap=True)
    grid.add_column()
    grid.add_row(_text(marker), text)
    return grid


def print_table(table: Table, headings: list[str], rows: list[list[str]], console: Console) -> None:
    """The table where it fits whole; where it does not, the same cells as a list: each row's first cell
    as its heading, then its other cells as 'column value', wrapped under it."""
    if fits(table, console):
        console.print(table)
        return
    if table.title:
        console.print(_text(str(table.title), style="italic"))
    for row in rows:
        console.print(_indented(_text(row[0], style="bold"), 1))
        console.print(_indented(_text(", ".join(_pair(h, v) for h, v in zip(headings[1:], row[1:]))), 4))


def _pair(heading: str, value: str) -> str:
    """A cell in a list: 'bound input', and the unit after the value: 'step 55.57 ms'."""
    name, _, unit = heading.rpartition(" ")
    return f"{name} {value} {unit}" if name and unit in ("ms", "MiB") else f"{heading} {value}"


def print_heading(title: str, console: Console) -> None:
    """A section's rule with its title, or a plain rule and the title under it where the title is too
    long for the rule (rich would cut it)."""
    if cell_len(for_terminal(title)) + 6 <= console.width:
        console.rule(_text(title))
    else:
        console.rule()
        console.print(_text(title, style="bold"))


def role_labels(d: Diagnosis) -> dict[str, str]:
    """Breakdown role names for this trace: the runtime and kernels named after its accelerator."""
    labels = dict(ROLE_LABELS)
    if d.platform == "gpu":
        vendor = d.device.vendor if d.device is not None else "unknown"
        labels["runtime"] = RUNTIME_BY_VENDOR.get(vendor, ROLE_LABELS["runtime"])
    elif d.platform != "cpu":
        labels["runtime"] = f"{d.platform.upper()} runtime"
        labels["kernel"] = f"{d.platform.upper()} kernels"
    return labels


def accelerator_name(d: Diagnosis) -> str:
    """'GPU', or the accelerator's own name ('MTIA')."""
    return "GPU" if d.platform in ("gpu", "cpu") else d.platform.upper()


def bound_line(d: Diagnosis) -> str:
    """'Bound: input pipeline (DataLoader) — 97% of the step waiting on the DataLoader'."""
    reason = d.bound_evidence[0] if d.bound_evidence else ""
    if d.bound is None:
        return f"Bound: cannot say — {reason}" if reason else "Bound: cannot say"
    return f"Bound: {BOUNDS[d.bound]} — {reason}" if reason else f"Bound: {BOUNDS[d.bound]}"


def rank_line(d: Diagnosis) -> str | None:
    """'Rank 3 of 8 (nccl)' when the trace has distributedInfo, else None."""
    info = d.distributed or {}
    if info.get("rank") is None:
        return None
    world = f" of {info['world_size']}" if info.get("world_size") is not None else ""
    backend = f" ({info['backend']})" if info.get("backend") else ""
    return f"Rank {info['rank']}{world}{backend}"


def device_line(d: Diagnosis) -> str:
    """'Tesla V100 (nvidia, sm 7.0, 34.1 GB)' or 'CPU only'."""
    dev = d.device
    if dev is None:
        return "CPU only" if d.platform == "cpu" else f"{accelerator_name(d)}, not described in the trace"
    if not dev.described:
        if d.platform != "gpu":
            return f"{accelerator_name(d)} accelerator (not described in the trace; from its event categories)"
        arch = f", kernels built for sm_{dev.capability_text.replace('.', '')} or newer" if dev.capability_text else ""
        vendor = {"nvidia": "NVIDIA", "amd": "AMD", "intel": "Intel"}.get(dev.vendor, dev.vendor)
        return f"{vendor} GPU (not described in the trace; from its kernel and runtime names{arch})"
    parts = [dev.vendor]
    if dev.capability_text:
        parts.append(f"compute {dev.capability_text}")
    if dev.total_memory:
        parts.append(f"{dev.total_memory / 1e9:.1f} GB")
    return f"{dev.name} ({', '.join(parts)})"


def figures_table(d: Diagnosis) -> Table:
    """Key figures: utilization, Tensor Cores, copies, memory."""
    t = Table(title="Key figures", show_header=False, title_justify="left")
    t.add_column("figure")
    t.add_column("value", justify="right")
    _row(t, "DataLoader share of step", _pct(d.dataloader_share))
    if d.loader_steady_share is not None:
        _row(t, "DataLoader share once its queue ran dry", _pct(d.loader_steady_share))
    if d.platform == "gpu":
        _row(t, "GPU utilization", _pct(d.gpu_utilization))
        unit = "Matrix core" if d.device is not None and d.device.vendor == "amd" else "Tensor Core"
        _row(t, f"{unit} share of kernel time", _pct(d.tensor_core_share))
        _row(t, "Eligible matmul/conv time not on them", _pct(d.eligible_share))
        if d.layout_share:
            _row(t, "Layout conversions (NCHW↔NHWC) of kernel time", _pct(d.layout_share))
        c = d.copies
        share = c.total_us / d.step_time_us if d.step_time_us else 0
        kinds = ", ".join(f"{k} {v / 1000:.2f} ms" for k, v in
                          (("pageable", c.pageable_us), ("pinned", c.pinned_us), ("host", c.unknown_us)) if v)
        size = f", {c.bytes / 1e6:.1f} MB" if c.bytes else ""
        _row(t, "Host-to-device copies per step", f"{c.count:.0f} ({kinds or 'none'}{size}; {_pct(share)})")
        if c.synchronous:
            _row(t, "Host blocked on copies per step",
                      f"{c.host_wait_us / 1000:.2f} ms over {c.synchronous:.0f} copies (pageable staging "
                      f"{c.pageable_wait_us / 1000:.2f} ms, synchronizes {c.sync_wait_us / 1000:.2f} ms)")
    elif d.platform != "cpu":
        _row(t, f"{accelerator_name(d)} utilization", _pct(d.gpu_utilization))
    else:
        _row(t, "Matmul/conv operators share of step", _pct(d.extra.get("cpu_eligible_share")))
    if attention_text(d.extra.get("attention")):
        _row(t, "Attention share of step", attention_text(d.extra.get("attention")))
    for m in d.memory:
        if m.peak_allocated is not None:
            cap = f" of {_gb(m.capacity)}, {_pct(m.headroom)} free" if m.capacity else ""
            _row(t, f"Peak memory {m.device}", f"{_gb(m.peak_allocated)} allocated{cap}")
        elif m.growth:
            _row(t, f"Memory growth {m.device}", f"+{_gb(m.growth)} (no totals in trace)")
    return t


def breakdown_table(d: Diagnosis) -> Table:
    """Step-time breakdown by role."""
    t = Table(title="Step-time breakdown", title_justify="left")
    t.add_column("role")
    t.add_column("ms / step", justify="right")
    t.add_column("share", justify="right")
    shares = d.breakdown_share
    labels = role_labels(d)
    for role in ROLES:
        if d.breakdown_us[role] > 0:
            _row(t, labels[role], f"{d.breakdown_us[role] / 1000:.2f}", _pct(shares[role]))
    return t


def print_recommendations(d: Diagnosis | Job, console: Console) -> None:
    """Ranked recommendations (a trace's or a job's), each with its evidence, as an indented list (reads
    well at 80 columns)."""
    if not d.recommendations:
        if d.bound is None:
            console.print(_text("No recommendation: the figures of this trace cannot carry any (see below).",
                               style="yellow"))
            return
        console.print(_text("No recommendation: nothing in this trace points to a change worth making.",
                           style="green"))
        return
    console.print(_text("Recommendations, by what each is worth a trial:", style="bold"))
    for i, r in enumerate(d.recommendations, 1):
        line = _text("")
        line.append(for_terminal(r.title), style="bold")
        # Each phrase after the title whole: on the title's line where it fits there, else on a line of its own.
        phrases = [(f"(~{100 * r.predicted_gain:.1f}% of step time; worth {100 * r.worth:+.0f}%)", "cyan")
                   if r.predicted_gain else ("(memory)", "magenta")]
        if not r.helps_now:
            phrases.append((for_terminal(f"helps once {r.helps_once} is fixed"), "yellow"))
        for phrase, style in phrases:
            last = line.plain.rpartition("\n")[2]
            if cell_len(last) + 2 + cell_len(phrase) <= console.width - 4:
                line.append("  ")
            else:
                line.append("\n")
            line.append(phrase, style=style)
        console.print(_hanging(f" {i}.", line))
        for e in r.evidence:
            console.print(_hanging("    -", _text(e)))
        if r.caveat:
            console.print(_indented(_text(f"note: {r.caveat}", style="dim"), 4))


def trace_label(d: Diagnosis) -> str:
    """How a trace is named in the output: its trial's name and file, or its file name."""
    name = Path(d.source).name
    if d.trial:
        script = Path(str(d.trial.get("script", "?"))).name
        return f"{script}, trial {d.trial.get('name', '?')} ({name})"
    return name


def print_diagnosis(d: Diagnosis, console: Console) -> None:
    """One trace's section."""
    print_heading(trace_label(d), console)
    console.print(_text(f"Device: {device_line(d)}"))
    rank = rank_line(d)
    if rank:
        console.print(_text(rank))
    if d.trial:
        summary = d.trial.get("summary") or {}
        sps = summary.get("samples_per_s")
        facts = [f"status {d.trial.get('status')}", f"batch size {summary.get('batch_size')}"]
        if sps:
            facts.append(f"{sps:.1f} {'samples/s' if summary.get('batch_size') else 'steps/s'}")
        console.print(_text("Trial: " + ", ".join(facts)))
    console.print(_text(f"Steps: {len(d.steps)}, mean {d.step_time_us / 1000:.2f} ms"
                       f" (median {d.extra['median_step_us'] / 1000:.2f} ms)"))
    if d.step_note:
        console.print(_text(f"  {d.step_note}", style="yellow"))
    console.print(_text(bound_line(d), style="bold" if d.bound else "yellow"))
    for reason in d.bound_evidence[1:]:
        console.print(_text(f"  {reason}"))
    console.print(breakdown_table(d))
    console.print(figures_table(d))
    for f in d.findings:
        console.print(_text(f"Finding: {f.message}", style="yellow"))
    print_recommendations(d, console)
    for m in d.missing:
        console.print(_text(f"Not in this trace: {m}", style="dim"))


def ranks_table(job: Job) -> tuple[Table, list[str], list[list[str]]]:
    """The ranks side by side: step, own time, waiting in collectives, DataLoader, compute, bound (the
    table, its headings and its rows, for `print_table`)."""
    t = Table(title=f"Ranks side by side ({job.backend or 'unknown backend'}, world size {job.world_size})",
              title_justify="left")
    headings = ["rank", "step ms", "own ms", "waits in collectives ms", "DataLoader ms", "compute ms", "bound"]
    for col in headings:
        t.add_column(col, justify="left" if col in ("rank", "bound") else "right")
    straggler = job.straggler.rank if job.straggler else None
    rows = []
    for d in job.ranks:
        rank = rank_of(d)
        rows.append([f"{rank}" + ("  ← straggler" if rank == straggler else ""), f"{d.step_time_us / 1000:.2f}",
                     f"{own_us(d) / 1000:.2f}", f"{exposed_us(d) / 1000:.2f}",
                     f"{d.breakdown_us['dataloader'] / 1000:.2f}", f"{compute_us(d) / 1000:.2f}", d.bound or "n/a"])
        _row(t, *rows[-1])
    rows = [[f"rank {row[0]}", *row[1:]] for row in rows]  # a list's heading names what the number is
    return t, headings, rows


def print_job(job: Job, console: Console) -> None:
    """A data-parallel job: its ranks side by side, the straggler, the verdict and the job's advice."""
    print_heading(f"Data-parallel job: {job.source}", console)
    print_table(*ranks_table(job), console)
    if job.missing_ranks:
        console.print(_text(f"Ranks without a trace here: {', '.join(map(str, job.missing_ranks))}", style="dim"))
    console.print(_text(f"Job: {job.verdict}", style="bold"))
    print_recommendations(job, console)


def print_analysis(diagnoses: list[Diagnosis], console: Console | None = None, skipped: list | tuple = (),
                   jobs: list[Job] | None = None) -> None:
    """All sections, plus a summary table when there are several traces, and each data-parallel job's ranks
    side by side (`jobs`, default `jobs_of(diagnoses)`); files skipped as not traces."""
    console = console or Console(file=output_stream())
    for path, reason in skipped:
        console.print(_text(f"Skipped {path}: {reason}", style="yellow"))
    for d in diagnoses:
        print_diagnosis(d, console)
    if len(diagnoses) > 1:
        t = Table(title="Summary", title_justify="left")
        headings = ["trace", "steps", "mean step", "bound", "GPU util", "DataLoader", "top recommendation"]
        for col in headings:
            t.add_column(col)
        rows = []
        for d in diagnoses:
            top = d.recommendations[0].id if d.recommendations else "none"
            rows.append([trace_label(d), str(len(d.steps)), f"{d.step_time_us / 1000:.1f} ms", d.bound or "n/a",
                         _pct(d.gpu_utilization), _pct(d.dataloader_share), top])
            _row(t, *rows[-1])
        print_table(t, headings, rows, console)
    for job in jobs_of(diagnoses) if jobs is None else jobs:
        print_job(job, console)


# --- a session: the ladder of trials, the final settings -------------------------------------------

LADDER_HEADINGS = ("#", "change", "batch", "peak MiB", "step ms", "samples/s", "±95%", "speed-up", "bound",
                   "decision")


def ladder_cells(row: dict[str, Any]) -> list[str]:
    """One trial's row of the ladder as text, in the order of LADDER_HEADINGS ('-' where not measured)."""
    mem = f"{row['peak_memory_bytes'] / 2**20:.0f}" if row.get("peak_memory_bytes") else "-"
    step = f"{step_time_s(row) * 1e3:.1f}" if step_time_s(row) else "-"  # batch / samples/s: they agree
    sps = f"{row['samples_per_s']:.1f}" if row.get("samples_per_s") else "-"
    interval = row.get("interval")
    spread = (f"{50 * (interval[1] - interval[0]) / row['samples_per_s']:.0f}%"
              if interval and row.get("samples_per_s") else "-")
    speed = f"×{row['speedup']:.2f}" if row.get("speedup") else "-"
    return [f"{row['index']:02d}", row["change"], str(row.get("batch_size") or "-"), mem, step, sps, spread, speed,
            row.get("bound") or "-", row["decision"] or "-"]


def ladder_table(state: dict[str, Any]) -> Table:
    """The ladder as a rich table: one row per trial."""
    t = Table(title="Ladder (one row per trial)", title_justify="left")
    t.add_column("#", justify="right")
    # A table only where every change fits on its line: its width is the longest change's (rich measures a
    # no_wrap column's minimum as its longest word).
    width = max((cell_len(for_terminal(row["change"])) for row in state["trials"]), default=0)
    t.add_column("change", no_wrap=True, min_width=width)
    for col in ("batch", "peak MiB", "step ms", state.get("unit") or "samples/s", "±95%", "speed-up"):
        t.add_column(col, justify="right")
    t.add_column("bound")
    t.add_column("decision")
    for row in state["trials"]:
        _row(t, *ladder_cells(row))
    return t


def ladder_item(row: dict[str, Any], unit: str) -> tuple[Text, Text]:
    """One trial of the ladder as a list item (where the table does not fit): '00 baseline: baseline', then
    '204.5 samples/s ±2%, ×1.00; step 155.8 ms, batch 32, peak 370 MiB; bound input'."""
    index, change, batch, mem, step, sps, spread, speed, bound, decision = ladder_cells(row)
    heading = _text(f"{index} ", style="bold")
    heading.append(for_terminal(change), style="bold")
    heading.append(for_terminal(f": {decision}"))
    rate = f"{sps} {unit}" + (f" ±{spread}" if spread != "-" else "")
    parts = [rate if sps != "-" else f"{row.get('status')}", speed,
             f"step {step} ms" if step != "-" else "-", f"batch {batch}" if batch != "-" else "-",
             f"peak {mem} MiB" if mem != "-" else "-", f"bound {bound}" if bound != "-" else "-"]
    return heading, _text(", ".join(p for p in parts if p != "-"))


def print_ladder(state: dict[str, Any], console: Console) -> None:
    """The ladder: a table where it fits whole, else a list of the same figures (80 columns, a pipe)."""
    table = ladder_table(state)
    if fits(table, console):
        console.print(table)
        return
    console.print(_text(str(table.title), style="italic"))
    for row in state["trials"]:
        heading, figures = ladder_item(row, state.get("unit") or "samples/s")
        console.print(Text(" ").append_text(heading), soft_wrap=True)  # a change is never wrapped
        console.print(_indented(figures, 4))


def next_steps(state: dict[str, Any], out: Path) -> list[tuple[str, list[str]]]:
    """What to do once the session is over, each with the commands to run: apply the patch (how, from
    where), what still binds the best trial, whether its processes already take every core, and where
    the report is. From the record only."""
    steps: list[tuple[str, list[str]]] = []
    patch, root = state.get("patch"), state.get("patch_root")
    if patch and root:
        steps.append(("apply the kept settings to your code, from the folder the patch's paths start in:",
                      [f"cd {shlex.quote(str(root))}",
                       f"patch -p1 < {shlex.quote(os.path.relpath(out / patch, root))}"]))
    elif patch:  # a session recorded before the patch's folder was
        steps.append(("apply the kept settings to your code, from the folder the patch's paths start in:",
                      [f"patch -p1 < {shlex.quote(str(out / patch))}"]))
    elif any(v is not None for v in (state.get("final_knobs") or {}).values()):
        steps.append(("make the settings above in your code (there is no patch: see the notes)", []))
    elif len(state["trials"]) == 1 and (state.get("options") or {}).get("max_trials") == 1:
        # Nothing but the baseline was measured: no change was found slower, none was tried.
        steps.append(("no change was tried: this run measured your script as it is (--no-apply, or --max-trials "
                      "1); run `advisor profile` without it to try the recommendations and keep what pays", []))
    else:
        steps.append(("nothing to change: your own settings measured fastest", []))
    bound = state.get("bound") or {}
    if bound.get("name"):
        evidence = list(bound.get("evidence") or [])
        steps.append((f"the best trial is still bound by {bound.get('label') or bound['name']}"
                      + (f": {evidence[0]}" if evidence else ""), []))
    if (cores := threads.core_use_text(state.get("core_use") or {}, bound.get("name") == "input")) is not None:
        steps.append((cores, []))
    if (out / "report.html").exists():
        steps.append(("the full report:", [str(out / "report.html")]))  # a path is never cut
    return steps


def print_session(state: dict[str, Any], out: Path, reference: dict | None, console: Console | None = None) -> None:
    """Ladder, final settings, notes and what to do next (`reference`: the trial row speed-ups are measured
    against)."""
    console = console or Console(file=output_stream())
    print_ladder(state, console)
    final = {k: v for k, v in (state["final_knobs"] or {}).items() if v is not None}
    measured_over = "the baseline" if reference is None or reference["name"] == state["baseline"] else (
        f"{reference['name']}, the first configuration that fitted")
    unit = state.get("unit") or "samples/s"
    speed = f"×{state['speedup']:.2f} {unit} over {measured_over}" if state.get("speedup") else "no speed-up"
    console.print(_text(f"Best: {state['best']} ({speed}); settings: "
                        + (", ".join(f"{k}={v}" for k, v in final.items()) or "as written")))
    timing = time_text(state.get("time"))
    if timing:
        console.print(_text(f"Time: {timing}"))
    for note in state["notes"]:
        console.print(_hanging("note:", _text(note, style="dim")))
    console.print(_text("Next:", style="bold"))
    for step, commands in next_steps(state, out):
        console.print(_hanging("  -", _text(step)))
        for command in commands:  # one line each, never wrapped, so that it can be copied whole
            console.print(_text(f"      {command}", style="bold"), soft_wrap=True)
