"""Host-to-device copies: pinned memory, asynchronous copies, fewer bytes."""

from __future__ import annotations

from advisor.analysis.diagnosis import Diagnosis
from advisor.analysis.rules.recommendation import Recommendation, ms, pct
from advisor.knobs import proposed_knobs

PAGEABLE_COPY_SHARE = 0.005
SYNC_WAIT_SHARE = 0.002
COPY_SHARE = 0.05  # copies and the host's waits on them, with no kernel running
LARGE_COPY_SHARE = 0.10  # the device's copy time, overlapped or not: pinned copies this large still cost
EXPOSED_PINNED_SHARE = 0.02  # pinned copies with no kernel running: the next batch's copy could hide them


def pin_memory(d: Diagnosis) -> Recommendation | None:
    """Copies from pageable host memory are slow and block the host: pin the loader's batches."""
    c = d.copies
    if d.platform != "gpu" or not d.step_time_us:
        return None
    cost = max(c.pageable_us, c.pageable_wait_us) / d.step_time_us
    if cost < PAGEABLE_COPY_SHARE:
        return None
    evidence = [f"{c.count:.0f} host-to-device copies per step, from pageable memory: {ms(c.pageable_us)} on "
                f"the device"]
    if c.pageable_wait_us:
        evidence.append(f"the host is blocked {ms(c.pageable_wait_us)} per step inside those copy calls, staging "
                        "the data itself")
    return Recommendation(
        id="pin-memory",
        title="Pin host memory: DataLoader(pin_memory=True)",
        knobs=proposed_knobs("pin-memory"),
        # Pinned copies run at the link's full speed (about twice pageable) and let the host go on.
        predicted_gain=0.5 * cost,
        evidence=tuple(evidence),
        code_change="DataLoader(dataset, ..., pin_memory=True)\nx = x.to(device, non_blocking=True)",
        bound="copy",
    )


def non_blocking(d: Diagnosis) -> Recommendation | None:
    """The host waits for each copy to finish: let copies run asynchronously."""
    c = d.copies
    if d.platform != "gpu" or not c.synchronous or not d.step_time_us:
        return None
    wait = c.sync_wait_us / d.step_time_us
    if wait < SYNC_WAIT_SHARE:
        return None
    return Recommendation(
        id="non-blocking",
        title="Copy batches asynchronously: .to(device, non_blocking=True)",
        knobs=proposed_knobs("non-blocking"),
        predicted_gain=wait,
        evidence=(f"{c.synchronous:.0f} synchronous host-to-device copies per step; the host waits "
                  f"{ms(c.sync_wait_us)} per step in synchronizes and blocking copies",),
        code_change="x = x.to(device, non_blocking=True)\ny = y.to(device, non_blocking=True)",
        caveat="Overlaps only with pinned host memory (pin_memory=True).",
        bound="copy",
    )


def saving(c, images: bool) -> str:
    """What 8-bit copies of float32 values would save per step: bytes and copy time (a quarter remains).
    `images`: the step runs convolutions, so the batch is likely images (else they are only values)."""
    saved = (f"{0.75 * c.bytes / 1e6:.1f} MB of the {c.bytes / 1e6:.1f} MB per step (as uint8: "
             f"{0.25 * c.bytes / 1e6:.1f} MB)" if c.bytes else "three quarters of the bytes")
    what = "8-bit images" if images else "8-bit values (where the data is 8-bit at its source)"
    return f"copied as {what} instead of float32 they would save {saved} and about {ms(0.75 * c.total_us)} " \
           "of copy time per step"


def fewer_copy_bytes(d: Diagnosis) -> Recommendation | None:
    """Copies take a large share of the step: send fewer bytes (uint8 or half on the host) and convert and
    normalize on the device."""
    c = d.copies
    if d.platform != "gpu" or not d.step_time_us:
        return None
    share = c.exposed_us / d.step_time_us
    total = c.total_us / d.step_time_us
    if share < COPY_SHARE and total < LARGE_COPY_SHARE:
        return None
    per_step = f"{c.bytes / 1e6:.1f} MB per step" if c.bytes else "bytes not recorded"
    overlap = (f", {pct(c.overlap_with_kernels)} of it alongside kernels" if c.overlap_with_kernels is not None
               else "")
    return Recommendation(
        id="fewer-copy-bytes",
        title="Copy fewer bytes to the device: uint8 (or half) on the host, convert on the device",
        knobs=proposed_knobs("fewer-copy-bytes"),
        # float32 → uint8 sends a quarter of the bytes.
        predicted_gain=0.75 * share,
        evidence=(f"host-to-device copies take {pct(total)} of the step on the device ({ms(c.total_us)}{overlap})",
                  f"with the host's waits on them, {pct(share)} of the step with no kernel running "
                  f"({ms(c.exposed_us)})",
                  f"{c.count:.0f} copies, {per_step}; the host waits {ms(c.host_wait_us)} per step",
                  saving(c, bool(d.extra.get("conv_share")))),
        code_change=("# in the Dataset: keep the decoded image as uint8, no float conversion or normalization\n"
                     "pixels = torch.from_numpy(np.array(image, dtype=np.uint8)).permute(2, 0, 1)\n"
                     "# (torchvision: ToTensor() -> PILToTensor(), or v2 ToDtype(torch.uint8, scale=True); no Normalize)\n"
                     "# in the step: copy 1 byte per value, then convert and normalize on the device\n"
                     "x = x.to(device, non_blocking=True).float().div_(255)\n"
                     "x = (x - mean) / std  # mean, std: tensors created once on the device\n"
                     "# values that are not 8-bit: x.half() on the host, x.float() on the device"),
        caveat="Random augmentations that need floats can run on the device after the copy.",
        bound="copy",
    )


def prefetch_to_device(d: Diagnosis) -> Recommendation | None:
    """Pinned copies that still run with no kernel beside them: copy the next batch while this one computes."""
    c = d.copies
    if d.platform != "gpu" or not d.step_time_us or not c.pinned_us or c.pageable_us > c.pinned_us:
        return None  # pageable copies cannot overlap anything: pin_memory comes first
    exposed = c.exposed_us / d.step_time_us
    if exposed < EXPOSED_PINNED_SHARE:
        return None
    overlap = pct(c.overlap_with_kernels) if c.overlap_with_kernels is not None else "an unknown share"
    per_step = f", {c.bytes / 1e6:.1f} MB" if c.bytes else ""
    return Recommendation(
        id="prefetch-to-device",
        title="Copy the next batch while this one computes (prefetch to the device on a side stream)",
        knobs={},
        predicted_gain=exposed,  # the copies' exposed time, all of which can hide behind the step's kernels
        evidence=(f"{c.count:.0f} host-to-device copies per step from pinned memory{per_step}: "
                  f"{ms(c.pinned_us)} on the device, {overlap} of it alongside kernels",
                  f"{pct(exposed)} of the step ({ms(c.exposed_us)}) in copies with no kernel running"),
        code_change=("copy_stream = torch.cuda.Stream()\n"
                     "def to_device(batch):  # issue the copy on the side stream\n"
                     "    with torch.cuda.stream(copy_stream):\n"
                     "        return [t.to(device, non_blocking=True) for t in batch]\n"
                     "batches = iter(loader); ahead = to_device(next(batches))\n"
                     "for batch in batches:\n"
                     "    torch.cuda.current_stream().wait_stream(copy_stream)\n"
                     "    current, ahead = ahead, to_device(batch)  # the next copy runs during this step\n"
                     "    for t in current: t.record_stream(torch.cuda.current_stream())\n"
                     "    train_step(*current)"),
        # Only what the trace shows: the pageable rest needs pinning first; copies already pinned need nothing.
        caveat=("Holds one more batch on the device." if not c.pageable_us else
                f"The {ms(c.pageable_us)} of pageable copies need pin_memory=True first; holds one more batch "
                "on the device."),
        bound="copy",
    )
