"""The normalization a Dataset applies to its 8-bit images, fitted from pairs of 8-bit and float images (the
`uint8_copies` knob's evidence, `advisor.trials.interposition.uint8_probe`). Inside the trial only.

Per channel (the first axis, the last, or one for all), a least-squares scale and offset of the 8-bit values
onto the float ones, over every probed item at once; read as `(x / 255 - mean) / std`, and held only where the
step's own conversion (`BytePlan.convert`: float32 `x / 255`, then the constants in the image's dtype) gives
the float images back to float rounding.
"""

from __future__ import annotations

from typing import Any

ROUNDING = 8  # ulps of the image's dtype, on its largest magnitude (at least 1)


def channel_axes(shape: tuple[int, ...]) -> list[int | None]:
    """The axes a channel may be (3-D images: the first for CHW, the last for HWC), then one for all."""
    axes: list[int | None] = []
    if len(shape) == 3 and shape[0] in (1, 3, 4):
        axes.append(0)
    if len(shape) == 3 and shape[-1] in (1, 3, 4):
        axes.append(2)
    return axes + [None]


def nested(values: list[float], axis: int | None, rank: int) -> float | list:
    """Per-channel values in the image's layout: (C, 1, 1) for the first axis, (C,) for the last."""
    if axis == 0 and rank == 3:
        return [[[v]] for v in values]
    return list(values)


def converted(eight: Any, mean: float | list | None, std: float | list | None, dtype: str) -> Any:
    """What the step computes from the 8-bit images (as `BytePlan.convert` does for a Dataset's `__getitem__`)."""
    import numpy as np
    import torch

    x = torch.from_numpy(np.ascontiguousarray(eight)).float()
    x = x / torch.tensor(255.0)
    if mean is None:
        return x.numpy()
    if isinstance(mean, list):
        constant = {k: torch.as_tensor(v, dtype=getattr(torch, dtype)) for k, v in (("mean", mean), ("std", std))}
        return ((x - constant["mean"]) / constant["std"]).numpy()
    return ((x - mean) / torch.tensor(std, dtype=x.dtype)).numpy()


def candidates(mean: list[float], std: list[float]) -> list[tuple[list[float], list[float]]]:
    """The constants rounded as people write them (4, then 6 significant digits), then as fitted."""
    def rounded(value: float, digits: int) -> float:
        return 0.0 if abs(value) < 1e-7 else float(f"{value:.{digits}g}")  # a fitted zero is zero

    out = [([rounded(m, d) for m in mean], [rounded(s, d) for s in std]) for d in (4, 6)]
    return out + [([float(m) for m in mean], [float(s) for s in std])]


def fit(eight: list[Any], floats: list[Any]) -> tuple[float | list | None, float | list | None, str] | str:
    """(mean, std, the images' dtype) that make the 8-bit images the float ones, per channel; or why not, with
    the largest difference."""
    import numpy as np

    dtype = str(floats[0].dtype)
    shape = floats[0].shape
    u, x = np.stack(eight).astype(np.float64), np.stack(floats).astype(np.float64)
    eps = float(np.finfo(floats[0].dtype).eps)
    allowed = ROUNDING * eps * max(1.0, float(np.abs(x).max()))
    nearest = None
    for axis in channel_axes(shape):
        channels = shape[axis] if axis is not None else 1
        us = np.moveaxis(u, axis + 1, -1).reshape(-1, channels) if axis is not None else u.reshape(-1, 1)
        xs = np.moveaxis(x, axis + 1, -1).reshape(-1, channels) if axis is not None else x.reshape(-1, 1)
        means, stds = [], []
        for c in range(channels):
            if us[:, c].min() == us[:, c].max():
                return f"the probed images hold one value in channel {c}: no scale can be read from them"
            a, b = np.linalg.lstsq(np.stack([us[:, c], np.ones(len(us))], axis=1), xs[:, c], rcond=None)[0]
            stds.append(1.0 / (255.0 * a))
            means.append(-b / (255.0 * a))
        for mean, std in candidates(means, stds):
            if all(m == 0 for m in mean) and all(s == 1 for s in std):
                written = (None, None)
            elif len(set(mean)) == 1 and len(set(std)) == 1:
                written = (mean[0], std[0])
            else:
                written = (nested(mean, axis, len(shape)), nested(std, axis, len(shape)))
            gap = max(float(np.abs(converted(e, *written, dtype) - f).max()) for e, f in zip(eight, floats))
            if gap <= allowed:
                return written[0], written[1], dtype
            if nearest is None or gap < nearest[0]:
                nearest = (gap, axis)
    gap, axis = nearest
    where = {0: "the first axis", 2: "the last axis", None: "one for all"}[axis]
    return (f"the float image is not the 8-bit one scaled and offset per channel: the closest fit (channels on "
            f"{where}) misses by up to {gap:.3g} (float rounding allows {allowed:.2g})")
