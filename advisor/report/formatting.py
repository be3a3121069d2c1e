"""Figures as the report shows them: text only, the numbers come from session.json and each Diagnosis."""

from __future__ import annotations

from typing import Any


def pct(x: float | None) -> str:
    """0.123 → '12.3%'."""
    return "n/a" if x is None else f"{100 * x:.1f}%"


def ms(x: float | None) -> str:
    """Milliseconds with two decimals."""
    return "n/a" if x is None else f"{x:.2f} ms"


def spread(row: dict) -> str:
    """A trial's samples/s interval as ' ±12%' (half its 95% interval), or '' when it has none."""
    interval, sps = row.get("interval"), row.get("samples_per_s")
    if (not isinstance(interval, (list, tuple)) or len(interval) != 2 or not isinstance(sps, (int, float))
            or not all(isinstance(v, (int, float)) for v in interval) or not sps > 0):
        return ""
    return f" ±{50 * (interval[1] - interval[0]) / sps:.0f}%"


def step_time_s(row: dict) -> float | None:
    """A trial's step time: its batch over its samples/s (one step over its steps/s), from the same
    steady-state windows, so that the two always agree; None where it measured none."""
    sps, batch = row.get("samples_per_s"), row.get("batch_size")
    if not isinstance(sps, (int, float)) or not sps > 0:
        return None
    return (batch if isinstance(batch, int) and batch > 0 else 1) / sps


def seconds_ms(x: float | None) -> str:
    """Seconds shown as milliseconds."""
    return "n/a" if x is None else f"{1000 * x:.1f} ms"


def gb(x: float | None) -> str:
    """Bytes as GB."""
    return "n/a" if x is None else f"{x / 1e9:.2f} GB"


def num(x: float | None, digits: int = 1) -> str:
    """A plain number, or n/a."""
    return "n/a" if x is None else f"{x:,.{digits}f}"


def gain(x: float | None) -> str:
    """A share of step time saved, signed: '+12.0%'."""
    return "n/a" if x is None else f"{100 * x:+.1f}%"


def flatten(facts: dict, prefix: str = "") -> list[tuple[str, str]]:
    """Nested device facts as ('cpu.model', 'Intel ...') rows."""
    rows = []
    for key, value in facts.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            rows += flatten(value, name + ".")
        elif isinstance(value, (list, tuple)):
            rows.append((name, ", ".join(str(v) for v in value)))
        elif isinstance(value, float) or (isinstance(value, int) and key.endswith(("bytes", "memory", "mem"))):
            rows.append((name, gb(value) if key.endswith(("bytes", "memory", "mem")) else f"{value:g}"))
        else:
            rows.append((name, "n/a" if value is None else str(value)))
    return rows


def memory_cap_text(cap: object) -> str:
    """What --memory-limit capped, in words ('' when nothing was capped or the record is not readable)."""
    if not isinstance(cap, dict) or not isinstance(cap.get("bytes"), (int, float)):
        return ""
    return (f"{cap['bytes'] / 2**30:.2f} GiB of {cap.get('what') or 'memory'} on {cap.get('device') or '?'} "
            f"({cap.get('how') or '?'})")


def option_rows(options: dict) -> list[tuple[str, str]]:
    """A session's options as (name, value) text, without what was left unset: numbers as written (600,
    not 600.0), lists as their items, flags as yes/no."""
    rows = []
    for key, value in options.items():
        if value is None or value == [] or value == ():
            continue
        if isinstance(value, bool):
            text = "yes" if value else "no"
        elif isinstance(value, float):
            text = f"{value:g}"
        elif isinstance(value, (list, tuple)):
            text = " ".join(str(v) for v in value)
        else:
            text = str(value)
        rows.append((str(key), text))
    return rows


def whole_percentages(values: list[float]) -> list[int]:
    """Whole percentages of the values' sum that add up to 100 (largest remainders rounded up)."""
    total = sum(values)
    if total <= 0:
        return [0] * len(values)
    exact = [100 * v / total for v in values]
    whole = [int(e) for e in exact]
    for i in sorted(range(len(values)), key=lambda i: whole[i] - exact[i])[:100 - sum(whole)]:
        whole[i] += 1
    return whole


def time_text(time: dict[str, Any] | None) -> str | None:
    """'412 s in all: start-up 31%, warm-up and compile 22%, measurement 34%, re-runs 12%, between trials 1%;
    the best after 96 s and 5 trial(s)' — the closing line of a session; its parts add up to 100%."""
    keys = ("wall_s", "startup_s", "warmup_s", "measurement_s", "reruns_s")
    if not isinstance(time, dict) or not all(isinstance(time.get(k), (int, float)) for k in keys) \
            or not time["wall_s"] > 0:
        return None  # absent, or not what a session writes (the report reads the folder as untrusted)
    wall = time["wall_s"]
    labels = {"start-up": time["startup_s"], "warm-up and compile": time["warmup_s"],
              "measurement": time["measurement_s"], "re-runs": time["reruns_s"],
              "between trials": max(0.0, wall - time["startup_s"] - time["warmup_s"] - time["measurement_s"]
                                    - time["reruns_s"])}
    parts = ", ".join(f"{label} {share}%" for label, share in zip(labels, whole_percentages(list(labels.values()))))
    text = f"{wall:.0f} s{' (simulated)' if time.get('simulated') else ''} in all: {parts}"
    if isinstance(time.get("to_best_s"), (int, float)) and isinstance(time.get("trials_to_best"), int):
        text += f"; the best first measured after {time['to_best_s']:.0f} s and {time['trials_to_best']} trial(s)"
    return text


def attention_text(figure: dict | None) -> str | None:
    """Attention's share of the step and how it is computed ('27.4% (1.96 ms, 4 a step): hand-written'), or
    None where the trace shows no attention."""
    if not figure:
        return None
    kinds = ", ".join(figure.get("implementations") or ()) or "fused"
    split = (f"; {pct(figure['hand_written_share'])} by hand" if figure.get("hand_written_share")
             and figure.get("fused_share") else "")
    found = "".join(f"; {m['class']}: " + ("rewritable as scaled_dot_product_attention" if m["rewritable"] else
                                          "not rewritable") + f" ({m['why']})" for m in figure.get("modules") or ())
    return (f"{pct(figure['share'])} ({ms(figure['ms_per_step'])}, {figure['per_step']:.0f} a step): "
            f"{kinds}{split}{found}")
