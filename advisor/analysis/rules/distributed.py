"""Communication in data-parallel training: gradient all-reduce the rank waits for, not hidden behind
the backward pass."""

from __future__ import annotations

from advisor.analysis.diagnosis import Diagnosis
from advisor.analysis.rules.recommendation import Recommendation, ms, pct
from advisor.knobs import BY_NAME, advised_values

EXPOSED_SHARE = 0.05  # exposed communication worth tuning DDP for
NO_SYNC_SHARE = 0.15  # exposed communication worth skipping all-reduces for (accumulating gradients)

WAITING_CAVEAT = ("From one rank's trace, waiting for a slower rank looks the same as slow communication: "
                  "analyse every rank's trace together (advisor analyze FOLDER) to see whether a straggler "
                  "causes the wait.")


def _exposed(d: Diagnosis) -> tuple[float, list[str]] | None:
    c = d.communication
    if c is None or not d.step_time_us or not c.collectives:
        return None
    share = c.exposed_us / d.step_time_us
    evidence = [f"{pct(share)} of the step ({ms(c.exposed_us)}) waits in collectives with nothing computing; "
                f"{ms(c.overlapped_us)} of communication per step is hidden behind compute"]
    sizes = ", ".join(f"{k.count:g} {k.name} per step" + (f" ({k.bytes / 2**20:.1f} MiB)" if k.bytes else "")
                      for k in c.collectives)
    evidence.append(f"collectives: {sizes}")
    return share, evidence


def ddp_buckets(d: Diagnosis) -> Recommendation | None:
    """Exposed gradient all-reduce: let DDP overlap it with the backward pass (bucket size, bucket views,
    a static graph, no search for unused parameters)."""
    found = _exposed(d)
    if found is None or found[0] < EXPOSED_SHARE:
        return None
    share, evidence = found
    c = d.communication
    count = sum(k.count for k in c.collectives if k.name == "all_reduce") or c.count
    total = sum(k.bytes or 0.0 for k in c.collectives if k.name == "all_reduce")
    # Each DDP argument's module chooses its value (the bucket by the all-reduces' sizes).
    knobs = advised_values("ddp-buckets", {"all_reduces": count, "all_reduce_bytes": total,
                                           "user_values": (d.trial or {}).get("user_values") or {}})
    evidence += [BY_NAME[name].advised_because for name in knobs if BY_NAME[name].advised_because]
    code = "DistributedDataParallel(model, " + ", ".join(f"{BY_NAME[name].written.argument}={value}"
                                                        for name, value in knobs.items())
    return Recommendation(
        id="ddp-buckets",
        title="Overlap gradient all-reduce with the backward pass: tune DistributedDataParallel",
        knobs=knobs,
        predicted_gain=0.5 * share,
        evidence=tuple(evidence),
        code_change=code + ", static_graph=True)  # static_graph only if the graph is the same every step",
        caveat=WAITING_CAVEAT + " find_unused_parameters=False only when every parameter gets a gradient.",
        bound="communication",
    )


def no_sync_accumulation(d: Diagnosis) -> Recommendation | None:
    """Much exposed all-reduce: accumulate gradients over micro-batches under `no_sync()` and all-reduce
    once per optimizer step."""
    found = _exposed(d)
    if found is None or found[0] < NO_SYNC_SHARE:
        return None
    share, evidence = found
    return Recommendation(
        id="no-sync-accumulation",
        title="All-reduce less often: accumulate gradients under DDP's no_sync()",
        knobs={},
        predicted_gain=0.5 * share,
        evidence=tuple(evidence),
        code_change=("for i, (x, y) in enumerate(loader):\n"
                     "    last = (i + 1) % accumulation == 0\n"
                     "    with (contextlib.nullcontext() if last else model.no_sync()):\n"
                     "        (loss_fn(model(x), y) / accumulation).backward()\n"
                     "    if last:\n"
                     "        optimizer.step(); optimizer.zero_grad()"),
        caveat="The effective batch grows by the accumulation factor: keep the learning rate schedule in step. "
               + WAITING_CAVEAT,
        bound="communication",
    )
