"""channels_last on a GPU, read from the trace's strides: the H200 conv surface (tests/data/surfaces/
h200-conv-classifier), where channels_last pays +28% at batch 512 in fp32 without a single layout conversion
kernel worth removing, and where the search used to end at 0.77 of the best without ever measuring it alone."""

from __future__ import annotations

import json

import pytest

from advisor.analysis.analyze import analyze_path
from advisor.analysis.whatif import predict, step_graph
from conftest import SURFACES

SURFACE = SURFACES / "h200-conv-classifier"
NCHW = SURFACE / "amp=off-batch_size=512-channels_last=off-num_workers=0-r1"
NHWC = SURFACE / "amp=off-batch_size=512-channels_last=on-num_workers=0-r1"


def setting_rate(name: str) -> float:
    """A setting's median samples/s as the surface's summary gives it."""
    doc = json.loads((SURFACE / "surface.json").read_text())
    return next(s["samples_per_s"] for s in doc["settings"] if s["name"] == name)


def test_the_strides_in_the_trace_tell_nchw_kernels_from_channels_last_ones():
    nchw, nhwc = analyze_path(NCHW)[0], analyze_path(NHWC)[0]
    # Convolutions, batch norms and pools on NCHW inputs take most of the kernel time; in channels_last none.
    assert nchw.extra["nchw_share"] > 0.6 and nhwc.extra["nchw_share"] < 0.05
    assert nchw.layout_share < 0.05, "the conversion kernels alone are not worth the advice"
    advice = next(r for r in nchw.recommendations if r.id == "channels-last")
    assert advice.knobs == {"channels_last": True} and any("NCHW inputs" in e for e in advice.evidence)
    assert "channels-last" not in {r.id for r in nhwc.recommendations}


def test_the_model_prices_channels_last_from_the_kernels_on_nchw_inputs():
    # The change the surface measured (the medians of two runs each) against what the model predicts from the
    # NCHW trial's trace alone: the same sign, the right size within the surface's noise and the prior's.
    truth = setting_rate(NHWC.name[:-3]) / setting_rate(NCHW.name[:-3]) - 1
    graph = step_graph(analyze_path(NCHW)[0])
    predicted = predict(graph, {"channels_last": True})
    assert truth > 0.15 and predicted > 0.1, (truth, predicted)
    assert abs(predicted - truth) < 0.2, (truth, predicted)
    # Turning it off again from the channels_last trial brings back kernels its trace cannot show: no change.
    assert predict(step_graph(analyze_path(NHWC)[0]), {"channels_last": False}) == pytest.approx(0.0)
