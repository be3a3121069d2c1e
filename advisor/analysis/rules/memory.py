"""Memory: whether the run fits at all (growth every step, activations that do not fit); no speed gain."""

from __future__ import annotations

from pathlib import Path

from advisor.analysis.diagnosis import Diagnosis
from advisor.analysis.memory_peaks import memory_leak
from advisor.analysis.rules.recommendation import Recommendation
from advisor.knobs import proposed_knobs

MEMORY_TIGHT = 0.70  # peak above this share of capacity: memory, not speed, is what binds


def memory_growth_advice(trial: dict | None, lint: list[dict] | None = None) -> Recommendation | None:
    """Memory that grows step after step: a tensor (usually the loss) kept across steps with its graph."""
    growth = memory_leak(trial)
    if growth is None:
        return None
    per_step = growth["bytes_per_step"]
    evidence = [f"memory grows {per_step / 2**20:.1f} MiB per step over {growth.get('steps')} steps "
                f"(R² {growth.get('r2', 0):.2f}, from {growth.get('source')})"]
    suspects = [f for f in (lint or []) if f.get("rule") == "loss-accumulation"]
    for f in suspects[:3]:
        evidence.append(f"{Path(str(f.get('file'))).name}:{f.get('line')}: {f.get('what')}")
    code = suspects[0].get("fix") if suspects else "total_loss += loss.item()  # or loss.detach()"
    return Recommendation(
        id="memory-growth",
        title="Stop memory from growing every step: do not keep tensors with their graph across steps",
        knobs={},
        predicted_gain=0.0,
        evidence=tuple(evidence),
        code_change=code,
        caveat="Until fixed, a long run ends in an out-of-memory error however much memory there is.",
        details={"bytes_per_step": per_step},
        bound="memory",
    )


def activation_checkpointing_advice(trial: dict | None, capacity: float | None = None,
                                    force: bool = False) -> Recommendation | None:
    """Memory-bound: recompute the largest repeated blocks' activations in backward instead of storing them."""
    summary = (trial or {}).get("summary") or {}
    acts = summary.get("activations") or {}
    candidates = acts.get("checkpoint_candidates") or []
    peak = summary.get("peak_memory_bytes")
    tight = force or (trial or {}).get("status") == "oom" or bool(summary.get("accumulation_steps", 1) not in (None, 1))
    if not tight and capacity and peak:
        tight = peak / capacity > MEMORY_TIGHT
    if not candidates or not tight:
        return None
    by_class = {c.get("class"): c for c in acts.get("by_class") or []}
    top = by_class.get(candidates[0]) or {}
    share = top.get("share") or 0.0
    name = candidates[0]
    evidence = [f"{name} ×{top.get('count', '?')} holds {100 * share:.0f}% of the activation memory saved for "
                f"backward ({(top.get('bytes') or 0) / 2**20:.0f} MiB)"]
    if (trial or {}).get("status") == "oom":
        evidence.append("the step ran out of memory")
    return Recommendation(
        id="activation-checkpointing",
        title=f"Checkpoint the {name} blocks: recompute their activations in backward",
        # The session measures it with the batch it buys (`advisor.knobs.checkpointing`).
        knobs=proposed_knobs("activation-checkpointing"),
        predicted_gain=0.0,
        evidence=tuple(evidence),
        code_change=("from torch.utils.checkpoint import checkpoint\n"
                     f"# in the forward that runs the {name} blocks:\n"
                     "for block in self.blocks:\n"
                     "    x = checkpoint(block, x, use_reentrant=False)"),
        caveat=f"Frees about {100 * share:.0f}% of activation memory for roughly one more forward pass of "
               "those blocks per step (about 30% more compute).",
        details={"module": name, "share": share},
        bound="memory",
    )


def memory_growth(d: Diagnosis) -> Recommendation | None:
    """Rule: the trial behind this trace shows memory growing step after step."""
    return memory_growth_advice(d.trial, d.extra.get("lint"))


def activation_checkpointing(d: Diagnosis) -> Recommendation | None:
    """Rule: memory is tight and a repeated block holds most of the activations."""
    capacity = next((m.capacity for m in d.memory if m.capacity), None)
    facts = (d.trial or {}).get("device_facts") or {}
    if capacity is None:
        capacity = ((facts.get("gpu") or {}).get("total_memory_bytes") if facts.get("type") == "cuda"
                    else (facts.get("cpu") or {}).get("ram_bytes"))
    if (d.trial or {}).get("memory_limit"):
        capacity = min(capacity or d.trial["memory_limit"], d.trial["memory_limit"])
    return activation_checkpointing_advice(d.trial, capacity)
