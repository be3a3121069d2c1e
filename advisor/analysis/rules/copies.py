"""Host-to-device copies: pinned memory, asynchronous copies, fewer bytes."""

from __future__ import annotations

from advisor.analysis.diagnosis import Diagnosis
from advisor.analysis.rules.recommendation import Recommendation, ms, pct

PAGEABLE_COPY_SHARE = 0.005
SYNC_WAIT_SHARE = 0.002
COPY_SHARE = 0.05  # copies and the host's waits on them, with no kernel running


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
        knobs={"pin_memory": True},
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
        knobs={"non_blocking": True},
        predicted_gain=wait,
        evidence=(f"{c.synchronous:.0f} synchronous host-to-device copies per step; the host waits "
                  f"{ms(c.sync_wait_us)} per step in synchronizes and blocking copies",),
        code_change="x = x.to(device, non_blocking=True)\ny = y.to(device, non_blocking=True)",
        caveat="Overlaps only with pinned host memory (pin_memory=True).",
        bound="copy",
    )


def fewer_copy_bytes(d: Diagnosis) -> Recommendation | None:
    """Copies take a large share of the step: send fewer bytes (uint8 or half on the host) and convert and
    normalize on the device."""
    c = d.copies
    if d.platform != "gpu" or not d.step_time_us:
        return None
    share = c.exposed_us / d.step_time_us
    if share < COPY_SHARE:
        return None
    per_step = f"{c.bytes / 1e6:.1f} MB per step" if c.bytes else "bytes not recorded"
    return Recommendation(
        id="fewer-copy-bytes",
        title="Copy fewer bytes to the device: uint8 (or half) on the host, convert on the device",
        knobs={},
        # float32 → uint8 sends a quarter of the bytes.
        predicted_gain=0.75 * share,
        evidence=(f"host-to-device copies and the host's waits on them take {pct(share)} of the step with no "
                  f"kernel running ({ms(c.exposed_us)})",
                  f"{c.count:.0f} copies, {per_step}; the host waits {ms(c.host_wait_us)} per step"),
        code_change=("# in the Dataset: keep the decoded image as uint8, no float conversion or normalization\n"
                     "pixels = torch.from_numpy(np.asarray(image, dtype=np.uint8)).permute(2, 0, 1)\n"
                     "# in the step: copy 1 byte per value, then convert and normalize on the device\n"
                     "x = x.to(device, non_blocking=True).float().div_(255)\n"
                     "x = (x - mean) / std  # mean, std: tensors created once on the device\n"
                     "# values that are not 8-bit: x.half() on the host, x.float() on the device"),
        caveat="Random augmentations that need floats can run on the device after the copy.",
        bound="copy",
    )
