"""Advice that is right on every kind of trace (issue #14): what bounds the step, and advice that follows
it. One section per kind of trace, on the real H100 traces of this repository's examples where they show
the kind, and on small traces built here (tests/trace_builder.py) where none does."""

from __future__ import annotations

import gzip
import json
import re
import shutil

import pytest
from tensorboard.plugin_util import markdown_to_safe_html

from advisor.analysis.analyze import analyze_file, analyze_path, diagnosis_to_dict
from advisor.analysis.bound import BOUNDS
from advisor.report.views import trace_view
from advisor.report.tensorboard import trial_text
from advisor.analysis.trace import load_trace
from conftest import SAMPLE_RUNS, SURFACES, TRACES, gpu_trace, advisor_main
from trace_builder import H100, V100, TraceBuilder

FP32 = "h100-char-transformer-fp32.pt.trace.json.gz"
BF16 = "h100-char-transformer-bf16.pt.trace.json.gz"
IMAGES = "h100-image-classifier-workers0.pt.trace.json.gz"

# The bound each recommendation addresses (the contract the session relies on).
BOUND_OF = {"more-workers": "input", "pin-memory": "copy", "non-blocking": "copy", "fewer-copy-bytes": "copy",
            "prefetch-to-device": "copy",
            "larger-batch": "host", "cuda-graphs": "host", "fused-optimizer": "host", "amp": "compute",
            "channels-last": "compute", "tf32": "compute", "cudnn-benchmark": "compute", "sdpa": "compute", "memory-growth": "memory", "activation-checkpointing": "memory",
            "ddp-buckets": "communication", "no-sync-accumulation": "communication"}


def ids(d) -> list[str]:
    return [r.id for r in d.recommendations]


def rec(d, rec_id):
    return next(r for r in d.recommendations if r.id == rec_id)


def load_doc(name: str) -> dict:
    with gzip.open(gpu_trace(name), "rt") as f:
        return json.load(f)


def write_doc(tmp_path, name: str, doc: dict):
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


# --- the bound contract ------------------------------------------------------------------------------

def test_bounds_are_the_contract():
    assert list(BOUNDS) == ["input", "copy", "host", "compute", "communication", "memory"]
    assert BOUNDS["input"] == "input pipeline (DataLoader)" and BOUNDS["host"] == "CPU/launch overhead"


@pytest.mark.parametrize("name", sorted(p.name for p in TRACES.glob("*.json*")))
def test_every_recommendation_names_its_bound_and_when_it_helps(name):
    d = analyze_file(gpu_trace(name))
    assert d.bound in BOUNDS and d.bound_evidence
    assert sum(d.bound_shares.values()) == pytest.approx(1.0, abs=1e-6)
    # One scale, what each is worth a trial (issue 66): no longer what helps now first, then the rest.
    speed = [r for r in d.recommendations if r.bound != "memory"]
    worth = [r.worth for r in speed]
    assert worth == sorted(worth, reverse=True) and all(w > 0 for w in worth)
    for r in speed:
        top = r.recoverable
        assert top is None or r.worth <= 1.0001 * (r.predicted_gain / (1 - r.predicted_gain) + top / (1 - top))
    for r in d.recommendations:
        assert r.bound == BOUND_OF[r.id]
        assert r.helps_now == (r.bound == d.bound)
        assert r.helps_once == ("" if r.helps_now else BOUNDS[d.bound])


def test_json_carries_the_bound_and_when_each_recommendation_helps():
    proc = advisor_main("analyze", "--json", str(gpu_trace(FP32)))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    (t,) = doc["traces"]
    assert t["bound"] == "host" and t["bound_label"] == BOUNDS["host"] and t["bound_evidence"]
    assert doc["summary"]["bounds"] == {t["source"]: "host"}
    later = [r for r in t["recommendations"] if not r["helps_now"]]
    assert later, "AMP and more workers wait for the launch overhead to go"
    for r in t["recommendations"]:
        assert r["bound"] == BOUND_OF[r["id"]]
        assert r["helps_once"] == ("" if r["helps_now"] else "CPU/launch overhead")


def test_terminal_and_report_show_the_bound(tmp_path):
    path = gpu_trace(IMAGES)
    text = " ".join(advisor_main("analyze", str(path)).stdout.split())
    assert re.search(r"Bound: input pipeline \(DataLoader\) — 9\d% of the step waiting on the DataLoader", text)
    proc = advisor_main("report", str(path), "-o", str(tmp_path / "r.html"))
    assert proc.returncode == 0, proc.stderr
    html = (tmp_path / "r.html").read_text()
    assert re.search(r"Bound: input pipeline \(DataLoader\) — 9\d% of the step waiting on the DataLoader", html)
    tensorboard_text = markdown_to_safe_html(trial_text({"name": "00-baseline"}, trace_view(path)))  # as it shows
    assert re.search(r"Bound: input pipeline \(DataLoader\) — 9\d% of the step", tensorboard_text)


def test_text_and_report_say_what_helps_only_later(tmp_path):
    text = advisor_main("analyze", str(gpu_trace(FP32))).stdout
    assert "helps once CPU/launch overhead is fixed" in " ".join(text.split())
    proc = advisor_main("report", str(gpu_trace(FP32)), "-o", str(tmp_path / "r.html"))
    assert proc.returncode == 0, proc.stderr
    assert "helps once CPU/launch overhead is fixed" in (tmp_path / "r.html").read_text()


# --- 1. launch-bound steps ----------------------------------------------------------------------------

def launch_bound_trace(tmp_path, steps: int = 5):
    """Steps of 200 small kernels, each behind a 25 µs launch call: runtime calls about half of the
    step, the GPU busy about a third; a per-parameter SGD step at the end; no memory events."""
    b = TraceBuilder(devices=(H100,))
    t = 0.0
    for n in range(steps):
        start = t
        optimizer_start = None
        for i in range(200):
            if i == 160:
                optimizer_start = t
            b.op("aten::add_" if optimizer_start is not None else "aten::mul", t, 48)
            b.launch("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>",
                     t + 10, 25, t + 30, 16)
            t += 50
        b.op("Optimizer.step#SGD.step", optimizer_start, t - optimizer_start, cat="user_annotation")
        b.step(n + 1, start, t - start)
    return b.write(tmp_path / "launch-bound.pt.trace.json")


def test_launch_bound_steps_get_fewer_larger_kernels(tmp_path):
    d = analyze_file(launch_bound_trace(tmp_path))
    assert 0.25 < d.gpu_utilization < 0.40 and d.breakdown_share["runtime"] > 0.35
    assert d.bound == "host"
    assert not any(m.peak_allocated for m in d.memory), "no memory events in this trace"
    now = [r.id for r in d.recommendations if r.helps_now]
    assert {"larger-batch", "cuda-graphs", "fused-optimizer"} <= set(now)
    assert "torch.compile" in rec(d, "cuda-graphs").code_change
    assert "fused=True" in rec(d, "fused-optimizer").code_change
    assert rec(d, "fused-optimizer").knobs == {"fused_optimizer": True} and rec(d, "cuda-graphs").knobs == {}


def test_launch_bound_h100_transformer(tmp_path):
    d = analyze_file(gpu_trace(FP32))
    assert d.bound == "host" and d.bound_shares["host"] > 0.5
    now = [r.id for r in d.recommendations if r.helps_now]
    assert now[:2] and set(now[:2]) <= {"larger-batch", "cuda-graphs"}
    optimizer = rec(d, "fused-optimizer")
    assert "AdamW" in optimizer.title and "fused=True" in optimizer.code_change  # it ran the foreach one
    amp = rec(d, "amp")
    assert not amp.helps_now and amp.helps_once == BOUNDS["host"]


# --- 2. accelerators that are not CUDA GPUs -----------------------------------------------------------

def mtia_trace(tmp_path, with_device: bool = True):
    """A Meta MTIA-like trace: its runtime in `mtia_runtime`, its device work in `mtia_ccp_events`, no
    deviceProperties; each step waits 4 ms on the DataLoader, then matmul operators run on the device."""
    b = TraceBuilder(devices=None, runtime_category="mtia_runtime")
    t = 0.0
    for n in range(4):
        start = t
        b.dataloader(t, 4000)
        t += 4000
        for i in range(20):
            b.op("aten::mm", t, 290)
            call = b.runtime("mtiaLaunchKernel", t + 20, 30)
            if with_device:
                b.device("mtia_ccp_events", "mm_fp32_kernel", t + 60, 200, call["args"]["correlation"])
            t += 300
        b.step(n + 1, start, t - start)
    return b.write(tmp_path / "mtia.pt.trace.json")


def test_mtia_is_an_accelerator_with_its_own_runtime_and_no_nvidia_or_cpu_advice(tmp_path):
    path = mtia_trace(tmp_path)
    d = analyze_file(path)
    assert d.platform == "mtia"
    assert d.device is not None and d.device.vendor == "mtia" and not d.device.described
    assert d.gpu_utilization == pytest.approx(0.4, abs=0.02)
    assert d.tensor_core_share is None and d.eligible_share is None
    assert d.bound == "input" and ids(d) == ["more-workers"]
    assert any("MTIA kernel names" in m for m in d.missing)
    assert any("host-to-device copies" in m for m in d.missing)
    text = " ".join(advisor_main("analyze", str(path)).stdout.split())
    assert "MTIA runtime" in text and "MTIA accelerator" in text
    assert "CPU only" not in text and "CUDA" not in text and "Tensor Core" not in text


def test_the_same_operators_on_a_cpu_get_cpu_advice(tmp_path):
    # Without the accelerator's events the very same operators are a CPU trace, where bf16 autocast is
    # advice: what kept the MTIA trace from it is recognising the accelerator, not the operators.
    doc = json.loads(mtia_trace(tmp_path, with_device=False).read_text())
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e["cat"] != "mtia_runtime"]
    d = analyze_file(write_doc(tmp_path, "cpu.json", doc))
    assert d.platform == "cpu" and "amp" in ids(d)


# --- 3. matmuls with no operator above them -----------------------------------------------------------

def graph_replay_trace(tmp_path):
    """Each step replays a CUDA graph: one cudaGraphLaunch, no operator around it, 16 fp32 volta_sgemm
    kernels and 4 elementwise ones sharing the launch's correlation id (as CUPTI records replays)."""
    b = TraceBuilder(devices=(V100,))
    t = 0.0
    for n in range(5):
        start = t
        call = b.runtime("cudaGraphLaunch", t + 10, 40)
        k = t + 60
        for i in range(20):
            name, dur = ("volta_sgemm_128x64_nn", 200) if i % 5 else (
                "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", 50)
            b.device("kernel", name, k, dur, call["args"]["correlation"])
            k += dur
        b.runtime("cudaStreamSynchronize", t + 60, k - t - 60)
        t = k + 100
        b.step(n + 1, start, t - start)
    return b.write(tmp_path / "graphs.pt.trace.json")


def test_matmuls_in_graph_replays_are_classified_by_name(tmp_path):
    d = analyze_file(graph_replay_trace(tmp_path))
    assert d.extra["kernels_by_name_share"] == 1.0
    assert d.eligible_share == pytest.approx(3200 / 3400)
    assert d.bound == "compute"
    amp = rec(d, "amp")
    assert amp.helps_now and amp.knobs == {"amp": "fp16"}  # V100: fp16 Tensor Cores
    assert "cuda-graphs" not in ids(d), "the step already replays a CUDA graph"


@pytest.mark.parametrize("name", ["resnet50-v100-workers0.pt.trace.json.gz", FP32])
def test_kernel_names_give_the_eligible_share_operators_give(tmp_path, name):
    doc = load_doc(name)
    with_ops = analyze_file(gpu_trace(name))
    doc["traceEvents"] = [e for e in doc["traceEvents"]
                          if e.get("cat") not in ("Operator", "cpu_op") or e["name"].startswith("ProfilerStep#")]
    without = analyze_file(write_doc(tmp_path, "no-ops.json", doc))
    assert with_ops.extra["kernels_by_name_share"] == 0 and without.extra["kernels_by_name_share"] == 1
    assert without.eligible_share == pytest.approx(with_ops.eligible_share, abs=0.02)
    assert without.eligible_share > 0.5


# --- 4. no device description -------------------------------------------------------------------------

@pytest.mark.parametrize("name", [BF16, FP32])
def test_without_device_properties_kernel_names_say_vendor_and_units(tmp_path, name):
    described = analyze_file(gpu_trace(name))
    doc = load_doc(name)
    del doc["deviceProperties"]
    d = analyze_file(write_doc(tmp_path, "bare.json", doc))
    assert d.device.vendor == "nvidia" and not d.device.described
    # The newest architecture the kernels were built for: sm90_* (bf16 run), sm80_* (fp32 run).
    newest = 9 if any("sm90" in e["name"] for e in load_doc(name)["traceEvents"] if e.get("cat") == "kernel") else 8
    assert d.device.compute_capability == (newest, 0)
    assert d.tensor_core_share == pytest.approx(described.tensor_core_share)
    assert d.eligible_share == pytest.approx(described.eligible_share)
    assert any("deviceProperties" in m for m in d.missing)
    assert [r.id for r in d.recommendations if r.id == "amp"] == [r.id for r in described.recommendations
                                                                  if r.id == "amp"]


def test_fp32_xmma_kernels_are_not_tensor_core_work():
    doc = load_doc(FP32)
    ffma = {e["name"] for e in doc["traceEvents"] if e.get("cat") == "kernel" and "_ffma_" in e["name"]}
    assert ffma, "the fp32 H100 trace runs cuBLAS xmma kernels on FFMA units"
    d = analyze_file(gpu_trace(FP32))
    # TF32 is off by default: the fp32 matmuls ran on CUDA cores, so most matmul time is AMP work.
    assert d.tensor_core_share < 0.2 and d.eligible_share > 0.5


# --- 5. layout conversions ----------------------------------------------------------------------------

def test_layout_conversions_are_layout_work_on_the_h100_image_classifier():
    doc = load_doc(IMAGES)
    d = analyze_file(gpu_trace(IMAGES))
    spans = [(s.start, s.end) for s in d.steps]
    base = load_trace(gpu_trace(IMAGES)).origin_us  # the Diagnosis's times are from this origin
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"
               and any(a <= e["ts"] - base < b for a, b in spans)]
    layout = sum(e["dur"] for e in kernels if re.search("nchwToNhwc|nhwcToNchw", e["name"]))
    assert layout > 0
    assert d.layout_share == pytest.approx(layout / sum(e["dur"] for e in kernels), rel=1e-6)
    assert "channels-last" not in ids(d), "a few percent of kernel time, and the loader binds"


def conv_layout_trace(tmp_path):
    """Convolutions whose cuDNN kernels run on Tensor Cores (TF32) between two layout conversions each."""
    b = TraceBuilder(devices=(H100,))
    t = 0.0
    for n in range(5):
        start = t
        for i in range(10):
            b.op("aten::cudnn_convolution", t, 1100)
            for kernel, dur in (("void cudnn::engines_precompiled::nchwToNhwcKernel<float, float, float>", 300),
                                ("sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize64x64x32_"
                                 "stage4_warpsize2x2x1_g1_tensor16x8x8_execute_kernel__5x_cudnn", 400),
                                ("void cudnn::engines_precompiled::nhwcToNchwKernel<float, float, float>", 300)):
                b.launch(kernel, t + 5, 10, t + 20, dur)
                t += dur + 20
            t += 40
        b.step(n + 1, start, t - start)
    return b.write(tmp_path / "conv.pt.trace.json")


def test_large_layout_conversions_get_channels_last_not_amp(tmp_path):
    d = analyze_file(conv_layout_trace(tmp_path))
    assert d.layout_share == pytest.approx(0.6)
    assert d.eligible_share == 0.0, "the convolution itself already runs on Tensor Cores"
    assert d.bound == "compute"
    cl = rec(d, "channels-last")
    assert cl.helps_now and cl.knobs == {"channels_last": True}
    assert "channels_last" in cl.code_change and "model" in cl.code_change
    assert "amp" not in ids(d)


# --- 6. copies: the host's wait and the bytes ---------------------------------------------------------

def test_host_wait_on_pageable_copies_is_the_whole_call(tmp_path):
    doc = load_doc(IMAGES)
    d = analyze_file(gpu_trace(IMAGES))
    events = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    base = load_trace(gpu_trace(IMAGES)).origin_us
    spans = [(s.start, s.end) for s in d.steps]
    htod = {e["args"]["correlation"] for e in events if e.get("cat") == "gpu_memcpy" and "HtoD" in e["name"]}
    calls = sorted((e for e in events if e.get("cat") == "cuda_runtime"), key=lambda e: e["ts"])
    wait = 0.0
    for i, c in enumerate(calls):
        if c["args"].get("correlation") in htod and any(a <= c["ts"] - base < b for a, b in spans):
            wait += c["dur"]
            if calls[i + 1]["name"] == "cudaStreamSynchronize":
                wait += calls[i + 1]["dur"]
    assert d.copies.host_wait_us == pytest.approx(wait / len(d.steps), rel=1e-6)
    assert d.copies.host_wait_us > 10 * d.copies.sync_wait_us, "the synchronize is the small part"
    text = " ".join(advisor_main("analyze", str(gpu_trace(IMAGES))).stdout.split())
    assert f"{d.copies.host_wait_us / 1000:.2f} ms over 2 copies" in text


def copy_bound_trace(tmp_path, loader_ms: float = 2.0):
    """float32 image batches of 154 MB a step copied from pageable memory: the host blocks 24 ms in the
    copy call and 1 ms in the synchronize after it, then 25 ms of kernels."""
    b = TraceBuilder(devices=(H100,))
    t = 0.0
    for n in range(4):
        start = t
        b.dataloader(t, loader_ms * 1000)
        t += loader_ms * 1000 + 50
        b.op("aten::to", t, 25100)
        b.copy(t + 50, 24000, t + 100, 23900, 154_140_672, sync_dur=1000)
        t += 25200
        for i in range(50):
            b.op("aten::convolution", t, 490)
            b.launch("sm80_xmma_fprop_implicit_gemm_f32f32_f32f32_f32_nchwkcrs_nchw_tilesize32x32x8_stage3_"
                     "warpsize1x2x1_g1_ffma_aligna4_alignc4_execute_kernel__5x_cudnn", t + 5, 10, t + 20, 470)
            t += 500
        t += 3000
        b.step(n + 1, start, t - start)
    return b.write(tmp_path / "copies.pt.trace.json")


def test_large_pageable_copies_bound_the_step_and_get_fewer_bytes(tmp_path):
    d = analyze_file(copy_bound_trace(tmp_path))
    assert d.copies.bytes == pytest.approx(154_140_672)
    assert d.copies.host_wait_us == pytest.approx(25_000) and d.copies.pageable_wait_us == pytest.approx(24_000)
    assert d.bound == "copy"
    now = [r.id for r in d.recommendations if r.helps_now]
    assert {"pin-memory", "fewer-copy-bytes"} <= set(now)
    fewer = rec(d, "fewer-copy-bytes")
    assert fewer.knobs == {"uint8_copies": True} and "uint8" in fewer.code_change and ".float().div_(255)" in fewer.code_change
    assert any("154.1 MB per step" in e for e in fewer.evidence)


def test_pinning_helps_only_once_the_loader_is_fixed(tmp_path):
    d = analyze_file(copy_bound_trace(tmp_path, loader_ms=200))
    assert d.bound == "input" and ids(d)[0] == "more-workers"
    pin = rec(d, "pin-memory")
    assert not pin.helps_now and pin.helps_once == BOUNDS["input"]
    fast = analyze_file(copy_bound_trace(tmp_path, loader_ms=2))
    # The same copies save the same time; it is only not available while the loader binds.
    assert pin.predicted_gain * d.step_time_us == pytest.approx(rec(fast, "pin-memory").predicted_gain * fast.step_time_us)


# --- 7. degenerate traces -----------------------------------------------------------------------------

def start_up_trace(tmp_path):
    """One 'step' that is 97% CUDA start-up calls, with a few small operators and kernels."""
    b = TraceBuilder(devices=(H100,))
    b.runtime("cudaGetDeviceProperties_v2", 100, 40_000)
    b.runtime("cuModuleLoadData", 40_200, 30_000)
    b.runtime("cudaFree", 70_300, 27_000)
    t = 97_400.0
    for i in range(10):
        b.op("aten::fill_", t, 200)
        b.launch("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>",
                 t + 10, 20, t + 40, 5)
        t += 250
    b.step(1, 0, 100_000)
    return b.write(tmp_path / "start-up.json")


def foreign_process_trace(tmp_path):
    """Steps recorded by process 1305; every operator and launch inside them by process 4242."""
    b = TraceBuilder(devices=(H100,))
    t = 0.0
    for n in range(3):
        start = t
        for i in range(30):
            b.op("aten::mm", t, 90, pid=4242, tid=4242)
            b.launch("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_wgmma",
                     t + 10, 20, t + 40, 10)
            t += 100
        b.step(n + 1, start, t - start)
    for e in b.events:
        if e["cat"] == "cuda_runtime":
            e["pid"] = e["tid"] = 4242
    return b.write(tmp_path / "foreign.json")


def two_event_trace(tmp_path):
    b = TraceBuilder(devices=(H100,))
    b.step(1, 0, 1000)
    call = 1  # a kernel whose launch was not recorded
    b.device("kernel", "volta_sgemm_128x64_nn", 100, 50, call)
    return b.write(tmp_path / "two.json")


@pytest.mark.parametrize("build, says", [(start_up_trace, "start-up calls"), (foreign_process_trace, "process 4242"),
                                         (two_event_trace, "too few")])
def test_degenerate_traces_get_figures_but_no_advice(tmp_path, build, says):
    path = build(tmp_path)
    d = analyze_file(path)
    assert d.bound is None and d.recommendations == ()
    assert says in d.bound_evidence[0]
    assert any(says in m for m in d.missing)
    text = " ".join(advisor_main("analyze", str(path)).stdout.split())
    assert "Bound: cannot say" in text and says in text and "Use a larger batch" not in text


def test_memory_binds_a_trial_that_ran_out_of_memory_even_when_its_trace_says_little(tmp_path):
    folder = tmp_path / "oom"
    folder.mkdir()
    path = start_up_trace(folder)
    (folder / "trial.json").write_text(json.dumps({"schema": "advisor.trial/1", "name": "00-baseline",
                                                   "status": "oom", "knobs": {}, "steps": []}))
    d = analyze_file(path)
    assert d.bound == "memory" and d.bound_evidence == ("the trial ran out of memory",)
    assert any("start-up calls" in m for m in d.missing)
    assert d.recommendations == (), "no speed advice from a trace that cannot carry it"


# --- 8. a short window can hide a loader limit --------------------------------------------------------

def queued_loader_run(tmp_path, walls_ms, calls_ms, recorded, workers=4, prefetch=2):
    """A trial folder: trial.json with per-step wall/call times and the trace of its recorded steps, whose
    DataLoader spans are as long as the trial's waits (wall − call)."""
    folder = tmp_path / "trial"
    folder.mkdir()
    b = TraceBuilder(devices=(H100,))
    t = 0.0
    for index in recorded:
        wait = (walls_ms[index] - calls_ms[index]) * 1000
        start = t
        b.dataloader(t, max(wait, 100), multiprocess=True)
        t += max(wait, 100)
        for i in range(20):
            b.op("aten::addmm", t, (calls_ms[index] * 1000) / 20 - 10)
            b.launch("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_wgmma",
                     t + 5, 10, t + 20, calls_ms[index] * 1000 / 20 - 40)
            t += calls_ms[index] * 1000 / 20
        b.step(index, start, t - start)
    trace = b.write(folder / "trial.1.pt.trace.json.gz")
    steps = [{"index": i, "wall_s": w / 1000, "call_s": c / 1000, "recorded": i in recorded, "batch_size": 32}
             for i, (w, c) in enumerate(zip(walls_ms, calls_ms))]
    effective = {"batch_size": 32, "num_workers": workers, "pin_memory": False, "persistent_workers": False,
                 "prefetch_factor": prefetch}
    trial = {"schema": "advisor.trial/1", "name": "00-baseline", "status": "ok", "knobs": {},
             "user_values": effective, "dataloaders": [{"user": effective, "effective": effective}],
             "steps": steps, "summary": {"batch_size": 32, "steps_recorded": len(recorded)},
             "trace_files": [trace.name]}
    (folder / "trial.json").write_text(json.dumps(trial))
    return trace


def test_a_window_fed_from_the_queue_still_shows_the_loader_bound(tmp_path):
    # 4 workers: the first step starts them; steps 1-3 come from the queue; step 4 finds it empty; the
    # profiled steps 5-7 are fed from what the workers queued meanwhile.
    walls = [500, 20.2, 20.2, 20.2, 90, 20.2, 20.2, 20.2]
    calls = [20] * 8
    d = analyze_file(queued_loader_run(tmp_path, walls, calls, recorded=[5, 6, 7]))
    assert d.dataloader_share < 0.02, "the window alone shows almost no waiting"
    assert d.loader_steady_share == pytest.approx((70 + 3 * 0.2) / (90 + 3 * 20.2))
    assert d.bound == "input"
    (finding,) = d.findings
    assert finding.code == "loader-queue" and "queue ran dry" in finding.message
    # The waits come from trial.json in seconds and read in milliseconds; "the others" are the steps not dry.
    assert "(1 of 7 steps waited up to 70.0 ms, the others 0.2 ms at the median)" in finding.message
    first = d.recommendations[0]
    assert first.id == "more-workers" and first.helps_now
    assert first.predicted_gain == pytest.approx(0.9 * d.loader_steady_share)
    text = " ".join(advisor_main("analyze", str(tmp_path / "trial")).stdout.split())
    assert "Finding: the DataLoader's queue ran dry" in text


def test_a_trial_too_short_to_drain_the_queue_says_so(tmp_path):
    walls = [500, 20.2, 20.2, 20.2, 20.2, 20.2]
    d = analyze_file(queued_loader_run(tmp_path, walls, [20] * 6, recorded=[3, 4, 5]))
    assert d.loader_steady_share is None and d.bound != "input"
    (finding,) = d.findings
    assert finding.code == "loader-window"
    assert any("could have come from the 8 batches" in m for m in d.missing)


def test_trace_alone_shows_a_draining_queue(tmp_path):
    # No trial record: the multi-process loader's own spans show the steps waiting more and more.
    b = TraceBuilder(devices=(H100,))
    t = 0.0
    for n, wait in enumerate([100, 100, 100, 2_000, 9_000, 30_000]):
        start = t
        b.dataloader(t, wait, multiprocess=True)
        t += wait
        for i in range(20):
            b.op("aten::addmm", t, 990)
            b.launch("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_wgmma",
                     t + 5, 10, t + 20, 960)
            t += 1000
        b.step(n + 1, start, t - start)
    d = analyze_file(b.write(tmp_path / "drain.json"))
    assert d.loader_steady_share > d.dataloader_share + 0.05
    assert "the queue is draining" in d.findings[0].message
    assert d.bound == "input"


def test_sample_run_with_workers_ran_dry_in_its_trial():
    folder = SAMPLE_RUNS / "image_classifier" / "trials" / "01-workers-2"
    trial = json.loads((folder / "trial.json").read_text())
    later = trial["steps"][1:]
    waits = [s["wall_s"] - s["call_s"] for s in later]
    (trace,) = sorted(folder.glob("*.pt.trace.json.gz"))
    d = analyze_file(trace)
    # The trial record shows one long wait among short ones: the two workers' queue ran dry.
    assert max(waits) > 5 * sorted(waits)[len(waits) // 2]
    assert d.loader_steady_share is not None and d.loader_steady_share > d.dataloader_share
    # The loader binds; with 2 workers on the 2 cores the trial ran on, more workers is no advice to give.
    assert d.bound == "input" and "more-workers" not in {r.id for r in d.recommendations}


# --- 9. folders with other .json files; rank and world size -------------------------------------------

def test_folder_with_other_json_files_skips_them_and_says_so(tmp_path):
    shutil.copy(gpu_trace("mi250-rocm-minitoy.pt.trace.json.gz"), tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"lr": 0.1, "epochs": 3}))
    (tmp_path / "notes.json").write_text("not json at all")
    proc = advisor_main("analyze", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())
    assert "Skipped" in text and "config.json" in text and "notes.json" in text
    doc = json.loads(advisor_main("analyze", "--json", str(tmp_path)).stdout)
    assert [t["source"].split("/")[-1] for t in doc["traces"]] == ["mi250-rocm-minitoy.pt.trace.json.gz"]
    assert sorted(s["path"].split("/")[-1] for s in doc["skipped"]) == ["config.json", "notes.json"]
    assert len(analyze_path(tmp_path)) == 1
    out = tmp_path / "report" / "r.html"
    proc = advisor_main("report", str(tmp_path), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "Skipped <code>config.json</code>" in out.read_text()


def test_folder_of_only_other_json_is_an_error(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"lr": 0.1}))
    proc = advisor_main("analyze", str(tmp_path))
    assert proc.returncode == 2 and "no torch.profiler trace" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_a_file_that_is_not_a_trace_is_still_an_error_when_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"lr": 0.1}))
    proc = advisor_main("analyze", str(tmp_path / "config.json"))
    assert proc.returncode == 2 and "not a torch.profiler trace" in proc.stderr


def test_text_shows_rank_and_world_size():
    text = " ".join(advisor_main("analyze", str(gpu_trace("a100-rank3-of-8.pt.trace.json.gz"))).stdout.split())
    assert "Rank 3 of 8 (nccl)" in text
    built = diagnosis_to_dict(analyze_file(gpu_trace("mi250-rocm-minitoy.pt.trace.json.gz")))
    assert built["distributed"] is None
    assert "Rank" not in advisor_main("analyze", str(gpu_trace("mi250-rocm-minitoy.pt.trace.json.gz"))).stdout


def test_the_loader_queue_finding_of_a_real_trial_reads_its_waits_in_milliseconds():
    """A recorded CPU trial with 2 workers: the finding's figures are the trial's own waits (wall - call)."""
    folder = SAMPLE_RUNS / "image_classifier" / "trials" / "01-workers-2"
    steps = json.loads((folder / "trial.json").read_text())["steps"][1:]
    waits_ms = [1e3 * max(0.0, s["wall_s"] - s["call_s"]) for s in steps]
    (d,) = analyze_path(folder)
    (finding,) = [f for f in d.findings if f.code == "loader-queue"]
    assert f"waited up to {max(waits_ms):.1f} ms" in finding.message, finding.message
    assert max(waits_ms) > 10  # the figure the message had read as 0.0 ms


def loader_then_kernels_trace(tmp_path, loader_us: float, kernel_us: float):
    """V100 steps of 1000 µs: the DataLoader's __next__ with the GPU idle, then fp32 kernels back to back."""
    b = TraceBuilder(devices=(V100,))
    for n in range(5):
        start = n * 1000.0
        b.step(n + 1, start, 1000)
        b.dataloader(start + 5, loader_us)
        t = start + 10 + loader_us
        b.op("aten::conv2d", t, 20)
        for i in range(8):
            b.launch("volta_sgemm_128x64_nn", t + 2 * i, 1, t + 20 + i * kernel_us / 8, kernel_us / 8)
    return b.write(tmp_path / f"loader{loader_us:.0f}.pt.trace.json.gz")


def test_a_quarter_of_the_step_waiting_on_the_loader_binds_though_kernels_are_busy(tmp_path):
    """GPU idle 36% of the step, 23% of it on the DataLoader: the loader binds (compute named next)."""
    d = analyze_file(loader_then_kernels_trace(tmp_path, loader_us=230, kernel_us=640))
    assert d.bound_shares["compute"] == pytest.approx(0.64, abs=0.01)
    assert d.bound_shares["input"] == pytest.approx(0.23, abs=0.01)
    assert d.bound == "input"
    assert "compute binds once the DataLoader keeps up" in " ".join(d.bound_evidence)
    assert next(r for r in d.recommendations if r.id == "more-workers").helps_now
    # A small wait beside busy kernels leaves compute the bound.
    small = analyze_file(loader_then_kernels_trace(tmp_path, loader_us=100, kernel_us=800))
    assert small.bound == "compute"


def test_a_trace_without_step_spans_gets_no_batch_advice_and_says_why(tmp_path):
    """The real H100 char-transformer trace (launch-bound: batch advice with its steps) with its
    ProfilerStep# spans taken out: one step, the whole trace, whose batch and launch cost per step are unknown."""
    source = gpu_trace(FP32)
    assert "larger-batch" in ids(analyze_file(source))
    doc = json.loads(gzip.decompress(source.read_bytes()))
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep#")]
    stripped = tmp_path / "no-steps.pt.trace.json.gz"
    stripped.write_bytes(gzip.compress(json.dumps(doc).encode(), compresslevel=1))  # level 9: a second more
    d = analyze_file(stripped)
    assert d.whole_trace and len(d.steps) == 1 and d.bound == "host"
    assert "larger-batch" not in ids(d)
    text = " ".join(advisor_main("analyze", str(stripped)).stdout.split())
    assert "the whole trace is one step" in text and "no batch-size advice" in text


def test_large_pinned_copies_get_their_own_advice_with_the_figures():
    """The real A100 rank: 25 pinned copies a step (70.7 MB, 10.9% of the step on the device, a third of it
    with no kernel running) — fewer bytes, and the next batch's copy overlapped with compute."""
    d = analyze_file(gpu_trace("a100-rank3-of-8.pt.trace.json.gz"))
    assert d.copies.pageable_us == 0 and d.copies.pinned_us / d.step_time_us > 0.10
    fewer, prefetch = rec(d, "fewer-copy-bytes"), rec(d, "prefetch-to-device")
    assert "10.9% of the step on the device" in fewer.evidence[0] and "70.7 MB per step" in fewer.evidence[2]
    # What the uint8_copies knob would save here: three quarters of the bytes and of the copy time.
    assert fewer.knobs == {"uint8_copies": True}
    assert "save 53.0 MB of the 70.7 MB per step (as uint8: 17.7 MB)" in fewer.evidence[-1]
    assert f"about {0.75 * d.copies.total_us / 1000:.2f} ms of copy time" in fewer.evidence[-1]
    assert prefetch.predicted_gain == pytest.approx(d.copies.exposed_us / d.step_time_us)
    assert "from pinned memory, 70.7 MB" in prefetch.evidence[0]
    assert "pin-memory" not in ids(d), "the copies are pinned already"
    # Pageable copies are not advised a side stream: pinning comes first.
    assert "prefetch-to-device" not in ids(analyze_file(gpu_trace("resnet50-v100-workers0.pt.trace.json.gz")))


def test_a_single_rank_file_is_one_trace_and_its_folder_is_the_job(tmp_path):
    """`advisor analyze FILE` of one rank: its own section only; the job view is the folder's."""
    trace = gpu_trace("a100-rank3-of-8.pt.trace.json.gz")
    folder = tmp_path / "ranks"
    folder.mkdir()
    shutil.copy(trace, folder / trace.name)
    single = advisor_main("analyze", str(folder / trace.name))
    assert single.returncode == 0 and "Data-parallel job" not in single.stdout
    assert json.loads(advisor_main("analyze", "--json", str(folder / trace.name)).stdout)["jobs"] == []
    whole = advisor_main("analyze", str(folder))
    assert "Data-parallel job" in whole.stdout and "Ranks without a trace here: 0, 1, 2, 4, 5, 6, 7" in whole.stdout


def test_pageable_copies_staged_on_the_training_process_bind_before_the_loader(tmp_path):
    """An H100 step of 1000 µs: 500 µs waiting on the DataLoader, then 200 µs with the host inside a pageable
    cudaMemcpyAsync (staging the batch itself), then kernels: the copies bind though the loader waits longer,
    and the trial's bound stays copy whatever its steady-state windows wait."""
    from advisor.search.bounds import trial_bound
    from advisor.trials.record.measurement import measure

    b = TraceBuilder(devices=(H100,))
    for n in range(5):
        start = n * 1000.0
        b.step(n + 1, start, 1000)
        b.dataloader(start + 5, 500)
        b.copy(start + 510, 200, start + 690, 20, nbytes=64 << 20)
        b.op("aten::mm", start + 720, 10)
        for i in range(4):
            b.launch("sm90_xmma_gemm_bf16bf16_bf16f32", start + 722 + i, 1, start + 730 + 60 * i, 60)
    d = analyze_file(b.write(tmp_path / "staging.pt.trace.json.gz"))
    assert d.bound_shares["input"] > d.bound_shares["copy"] >= 0.15
    assert d.bound == "copy"
    copies = [r for r in d.recommendations if r.id in ("pin-memory", "fewer-copy-bytes")]
    assert copies and all(r.helps_now for r in copies)
    waiting = measure([[{"index": i, "wall_s": 0.1, "call_s": 0.04, "batch_size": 32, "window": i // 2}
                        for i in range(6)]])
    assert waiting.wait_share > 0.5 and trial_bound("ok", d, waiting).name == "copy"


def test_more_workers_stops_at_the_cpu_count():
    """The recorded trials ran on 2 cores: the baseline (no workers) is advised 2 workers, not a fixed 4, and
    the trial that already has 2 workers is not advised more, though its loader still binds."""
    trials = SAMPLE_RUNS / "image_classifier" / "trials"
    baseline = {r.id: r for r in analyze_path(trials / "00-baseline")[0].recommendations}
    assert "num_workers=2," in baseline["more-workers"].code_change
    at_cap = analyze_path(trials / "01-workers-2")[0]
    assert at_cap.trial["device_facts"]["cpu"]["logical_cores"] == 2 and at_cap.bound == "input"
    assert "more-workers" not in {r.id for r in at_cap.recommendations}


def test_copy_advice_says_what_the_trace_shows_and_no_more():
    """Copies already pinned get no 'needs pin_memory'; a step without convolutions (the A100 rank's dense
    model) is told of 8-bit values, not images; the ResNet-50 trace's convolutions are images."""
    rank = analyze_file(gpu_trace("a100-rank3-of-8.pt.trace.json.gz"))
    assert rank.copies.pageable_us == 0 and not rank.extra["conv_share"]
    prefetch = rec(rank, "prefetch-to-device")
    assert "pin_memory" not in prefetch.caveat and "one more batch" in prefetch.caveat
    assert "8-bit values" in rec(rank, "fewer-copy-bytes").evidence[-1]
    assert "image" not in " ".join(rec(rank, "fewer-copy-bytes").evidence)
    resnet = analyze_file(gpu_trace("resnet50-v100-workers4.pt.trace.json.gz"))
    assert resnet.extra["conv_share"] > 0.5 and "8-bit images" in rec(resnet, "fewer-copy-bytes").evidence[-1]


def test_a_loader_wait_beside_pinned_copies_still_counts_as_waiting_on_the_loader():
    """The H100 image classifier, pinned copies and 14 workers: the breakdown counts the copies that run while
    the step waits for its next batch before the DataLoader; the worker advice counts that wait as the loader's
    (no kernel runs then) and says how much of it the breakdown credited to the copies."""
    d = analyze_path(SURFACES / "h100-image-classifier" / "fp32-b32-w14-pin")[0]
    idle = d.extra["loader_idle_share"]
    assert d.dataloader_share < idle <= d.dataloader_wait_share + 1e-9, (d.dataloader_share, idle)
    workers = rec(d, "more-workers")
    assert workers.predicted_gain == pytest.approx(0.9 * idle)
    assert any("beside host-to-device copies" in e and f"{100 * idle:.1f}% of the step" in e for e in workers.evidence)
    # Where no copy runs during the wait (pageable copies, inside the step), the figures agree: nothing added.
    plain = analyze_path(SURFACES / "h100-image-classifier" / "fp32-b32-w14-pageable")[0]
    assert plain.extra["loader_idle_share"] == pytest.approx(plain.dataloader_share, abs=0.003)
    assert len(rec(plain, "more-workers").evidence) == 1


def test_an_optimizer_without_a_foreach_implementation_is_not_told_to_use_one(tmp_path):
    # LBFGS (time_sequence_prediction's optimizer) steps parameter by parameter, but torch has neither a fused
    # nor a foreach LBFGS: the advice "Use the foreach LBFGS optimizer (foreach=True)" named an argument it
    # does not take. A real profiled CPU run of a small LBFGS step.
    import torch

    model = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(8)])
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=2)
    x = torch.randn(16, 32)

    def closure():
        optimizer.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        return loss
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            optimizer.step(closure)
            prof.step()
    path = tmp_path / "lbfgs.pt.trace.json"
    prof.export_chrome_trace(str(path))
    d = analyze_file(path)
    assert d.extra["optimizer"]["name"] == "LBFGS" and d.extra["optimizer"]["implementation"] == "for-loop"
    assert not any(r.id == "fused-optimizer" for r in d.recommendations), [r.title for r in d.recommendations]
