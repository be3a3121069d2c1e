"""`advisor compare` shown: the terminal (rich), the HTML page (compare.html.j2, the report's style) and
the notebook cell. Formats the figures of a `Comparison`; never recomputes them. Everything from input
(paths, kernel and operator names, settings) is escaped: autoescape in HTML, `for_terminal` in the terminal.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from advisor.analysis.compare import ROLE_LABELS, WORDS, Comparison, Figure
from advisor.analysis.movers import Move
from advisor.escape import for_terminal, output_stream
from advisor.report.formatting import pct
from advisor.report.terminal import print_heading

TOP_ROWS = 8  # kernels and operators by name in the terminal; the page lists all the comparison kept


def value_text(value: float | str | None, unit: str) -> str:
    """A figure as the tables show it."""
    if value is None:
        return "n/a"
    if isinstance(value, str):
        return value
    if unit == "ms":
        return f"{value:,.2f} ms"
    if unit == "share":
        return pct(value)
    if unit == "bytes":
        return f"{value / 2**20:,.1f} MiB"
    return f"{value:,.1f}"


def change_text(f: Figure) -> str:
    """B less A, with its sign: '+1.20 ms', '-3.4 pts', '+12.0%' of A for rates; '' where it is not a number."""
    change = f.change
    if change is None:
        return "" if f.a == f.b else "changed"
    if f.unit == "ms":
        return f"{change:+,.2f} ms"
    if f.unit == "share":
        return f"{100 * change:+.1f} pts"
    if f.unit == "bytes":
        return f"{change / 2**20:+,.1f} MiB"
    return f"{change:+,.1f}" + (f" ({100 * change / f.a:+.1f}%)" if f.a else "")


def move_row(m: Move) -> tuple[str, str, str, str, str, str]:
    """(name, family, A, B, change, status) of a kernel's or operator's time per step."""
    return (m.name, m.family, f"{m.a_us / 1000:,.3f} ms", f"{m.b_us / 1000:,.3f} ms",
            f"{m.change_us / 1000:+,.3f} ms", m.status)


@dataclass(frozen=True)
class ComparisonView:
    """A Comparison's text, as the page, the notebook and the terminal show it."""

    comparison: Comparison
    title: str
    word: str  # "faster" | "slower" | "same"
    headline: str
    verdict: str
    rates: str  # A's and B's rate and step time
    moved_most: str | None
    breakdown_rows: tuple[tuple[str, str, str, str], ...]
    figure_rows: tuple[tuple[str, str, str, str], ...]
    kernel_families: tuple[tuple[str, ...], ...]
    kernels: tuple[tuple[str, ...], ...]
    operator_families: tuple[tuple[str, ...], ...]
    operators: tuple[tuple[str, ...], ...]
    tensor_cores: str
    moved_onto: tuple[tuple[str, ...], ...]
    settings: tuple[tuple[str, str, str], ...]
    ranks: tuple[tuple[str, str], ...]
    notes: tuple[str, ...]
    machines: str | None


def headline(c: Comparison) -> str:
    """'B is 42.7% slower than A', 'B is 2.10× faster than A', 'the same within the noise'."""
    v = c.verdict
    if v.ratio is None:
        return "no rate to compare"
    if v.word == "unknown":
        return f"B runs at {v.ratio:.2f}× A's rate: {WORDS['unknown']}"
    if v.word == "same":
        return WORDS["same"]
    if v.ratio >= 2:
        return f"B is {v.ratio:.2f}× faster than A"
    return f"B is {100 * abs(v.ratio - 1):.1f}% {v.word} than A"


def rates_text(c: Comparison) -> str:
    """'A: 318.8 samples/s, 100.38 ms a step · B: 182.6 samples/s, 175.27 ms a step'."""
    v = c.verdict

    def one(side: str, rate: float | None, step_s: float | None) -> str:
        if rate is None:
            return f"{side}: no rate"
        return f"{side}: {rate:,.1f} {v.unit}" + (f", {1000 * step_s:,.2f} ms a step" if step_s else "")

    return one("A", v.a_rate, v.a_step_s) + " · " + one("B", v.b_rate, v.b_step_s)


def rank_text(rank: dict | None) -> str:
    """A run's slowest rank in words."""
    if rank is None:
        return "one process"
    straggler = ", the straggler" if rank["straggler"] else ""
    return (f"rank {rank['rank']} of {rank['world_size']} ({rank['ranks']} traced): {rank['step_ms']:.2f} ms per "
            f"step, bound by {rank['bound'] or 'what its trace cannot say'}{straggler}")


def comparison_view(c: Comparison) -> ComparisonView:
    """The text of every part of a comparison."""
    ranks = ()
    if c.a.slowest_rank is not None or c.b.slowest_rank is not None:
        ranks = (("A", rank_text(c.a.slowest_rank)), ("B", rank_text(c.b.slowest_rank)))
    return ComparisonView(
        comparison=c, title=f"advisor compare: {c.a.label} → {c.b.label}", word=c.verdict.word,
        headline=headline(c), verdict=c.verdict.text, rates=rates_text(c), moved_most=c.moved_most[1] if c.moved_most else None,
        breakdown_rows=tuple((ROLE_LABELS[f.name], value_text(f.a, "ms"), value_text(f.b, "ms"), change_text(f))
                             for f in c.breakdown if f.a or f.b),
        figure_rows=tuple((f.name, value_text(f.a, f.unit), value_text(f.b, f.unit), change_text(f))
                          for f in c.figures if not (f.a == 0 and f.b == 0)),
        kernel_families=tuple(move_row(m) for m in c.kernel_families),
        kernels=tuple(move_row(m) for m in c.kernels),
        operator_families=tuple(move_row(m) for m in c.operator_families),
        operators=tuple(move_row(m) for m in c.operators),
        tensor_cores=c.tensor_cores["text"], moved_onto=tuple(move_row(m) for m in c.tensor_cores["moved_onto"]),
        settings=tuple((n, "—" if x is None else x, "—" if y is None else y) for n, x, y in c.settings),
        ranks=ranks, notes=c.notes, machines=c.machines)


# ---- HTML ----

def render_comparison_page(c: Comparison, command: str = "") -> str:
    """The comparison as one self-contained page in the report's style."""
    from advisor.report.html import environment

    return environment().get_template("compare.html.j2").render(title=comparison_view(c).title,
                                                                 view=comparison_view(c), command=command)


# ---- the terminal ----

def _table(title: str, headings: tuple[str, ...], rows, right_from: int = 1) -> Group:
    """A table under its title (the title on a line of its own: a narrow table would wrap it)."""
    table = Table(show_edge=False, pad_edge=False)
    for i, h in enumerate(headings):
        table.add_column(h, justify="right" if i >= right_from else "left", overflow="fold")
    for row in rows:
        table.add_row(*(Text(for_terminal(cell)) for cell in row))
    return Group(Text(for_terminal(title), style="italic"), table)


def print_comparison(c: Comparison, console: Console | None = None) -> None:
    """The comparison in the terminal: the verdict first, then where the time moved, what moved most, the
    figures and the settings that differ."""
    console = console or Console(file=output_stream())
    view = comparison_view(c)
    style = {"faster": "bold green", "slower": "bold red"}.get(view.word, "bold")
    print_heading(view.title, console)
    console.print(Text("A: ", style="bold") + Text(for_terminal(f"{c.a.path} ({c.a.kind})")))
    console.print(Text("B: ", style="bold") + Text(for_terminal(f"{c.b.path} ({c.b.kind})")))
    console.print(Text(view.headline, style=style))
    console.print(Text(for_terminal(view.verdict)))
    console.print(Text(view.rates))
    if view.machines:  # beside the verdict: it says whose the difference may be
        console.print(Text(for_terminal(view.machines), style="bold yellow"))
    if view.moved_most:
        console.print(Text("Moved most: ", style="bold") + Text(for_terminal(view.moved_most)))
    if view.breakdown_rows:
        console.print(_table("Where the step's time moved (per profiled step)", ("", "A", "B", "change"),
                             view.breakdown_rows))
    console.print(_table("Figures", ("", "A", "B", "change"), view.figure_rows))
    console.print(Text("Tensor Cores: ", style="bold") + Text(for_terminal(view.tensor_cores)))
    for title, rows in (("Kernels by family", view.kernel_families), ("Kernels that moved most", view.kernels),
                        ("Operators by family (self time)", view.operator_families),
                        ("Operators that moved most (self time)", view.operators)):
        if rows:  # the family column only where it names the families; the page shows each name's too
            console.print(_table(title, ("", "A", "B", "change", ""), [(r[0],) + r[2:] for r in rows[:TOP_ROWS]]))
    if view.settings:
        console.print(_table("Settings that differ", ("", "A", "B"), view.settings, right_from=3))
    else:
        console.print(Text("Settings: none differ (knobs, the script's own, torch, device)"))
    for side, text in view.ranks:
        console.print(Text(f"Slowest rank of {side}: ", style="bold") + Text(for_terminal(text)))
    for note in view.notes:
        console.print(Text(for_terminal(note), style="dim"))
