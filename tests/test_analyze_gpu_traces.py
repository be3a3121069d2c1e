"""`advisor analyze` on the real GPU traces in tests/data/traces, against the deprecated TensorBoard
profiler plugin's figures (tests/data/README.md) and the advice each trace should produce."""

from __future__ import annotations

import json

import pytest

from advisor.analysis.analyze import analyze_file
from conftest import gpu_trace, run_advisor

# What torch-tb-profiler 0.4.3 computes on each file (tests/data/README.md): average step in ms,
# breakdown in % of the step, GPU utilization.
PLUGIN = {
    "resnet50-v100-workers0.pt.trace.json.gz": dict(step=177.6, kernel=55.5, memcpy=1.1, runtime=1.6,
                                                     dataloader=33.4, cpu_op=7.7, util=0.555),
    "resnet50-v100-workers4.pt.trace.json.gz": dict(step=141.1, kernel=70.3, memcpy=2.2, runtime=7.5,
                                                     dataloader=0.8, cpu_op=16.1, util=0.703),
    "a100-rank3-of-8.pt.trace.json.gz": dict(step=77.5, kernel=79.4, memcpy=4.0, runtime=3.2, dataloader=0.1,
                                              cpu_op=13.0, util=0.794),
    "v100-memory-events.pt.trace.json.gz": dict(step=347.5, kernel=56.3, memcpy=1.3, runtime=5.4, dataloader=0.0,
                                                 cpu_op=31.3, util=0.563),
    "mi250-rocm-minitoy.pt.trace.json.gz": dict(step=9.3, kernel=1.2, memcpy=0.4, runtime=72.1, dataloader=0.0,
                                                 cpu_op=20.5, util=0.012),
}
# Deliberate definition change: NCCL kernels are "communication", not compute. The plugin counted them as
# Kernel except the few it could tie to an nccl:* operator, which it put under Communication (0.03% on
# a100-rank3, 2.48% on v100-memory-events, printed by benchmarks/tb_oracle.py). So our
# kernel + communication must equal the plugin's Kernel + Communication.
PLUGIN_COMMUNICATION = {"a100-rank3-of-8.pt.trace.json.gz": 0.03, "v100-memory-events.pt.trace.json.gz": 2.48}

EXPECTED_ADVICE = {
    "resnet50-v100-workers0.pt.trace.json.gz": ({"more-workers", "amp", "pin-memory"}, set()),
    "resnet50-v100-workers4.pt.trace.json.gz": ({"amp", "pin-memory"}, set()),
    "a100-rank3-of-8.pt.trace.json.gz": (set(), {"pin-memory"}),
    "v100-memory-events.pt.trace.json.gz": ({"larger-batch", "amp"}, set()),
    "mi250-rocm-minitoy.pt.trace.json.gz": (set(), {"amp"}),
    # This repository's examples on an H100: the char transformer is launch-bound (GPU busy ~20%), its
    # bf16 run already uses Tensor Cores; the image classifier waits on its DataLoader ~98% of the step.
    "h100-char-transformer-fp32.pt.trace.json.gz": ({"larger-batch", "cuda-graphs", "fused-optimizer", "amp"},
                                                    {"pin-memory", "channels-last"}),
    "h100-char-transformer-bf16.pt.trace.json.gz": ({"larger-batch", "cuda-graphs"}, {"amp"}),
    "h100-image-classifier-workers0.pt.trace.json.gz": ({"more-workers"}, {"larger-batch", "channels-last"}),
    # examples/gpt.py's model on an H200 (bf16, batch 32, context 512): attention by hand ~19% of the step, fused
    # once it is scaled_dot_product_attention.
    "h200-gpt-attention-by-hand.pt.trace.json.gz": ({"sdpa"}, set()),
    "h200-gpt-attention-sdpa.pt.trace.json.gz": (set(), {"sdpa"}),
}


@pytest.fixture(scope="module")
def diagnoses():
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = analyze_file(gpu_trace(name))
        return cache[name]

    return get


@pytest.mark.parametrize("name", sorted(PLUGIN))
def test_figures_agree_with_the_plugin(diagnoses, name):
    d = diagnoses(name)
    ref = PLUGIN[name]
    assert d.step_time_us / 1000 == pytest.approx(ref["step"], rel=0.01)
    share = {role: 100 * v for role, v in d.breakdown_share.items()}
    kernel = share["kernel"] + share["communication"] - PLUGIN_COMMUNICATION.get(name, 0.0)
    assert kernel == pytest.approx(ref["kernel"], abs=1.0)
    for role in ("memcpy", "runtime", "dataloader", "cpu_op"):
        assert share[role] == pytest.approx(ref[role], abs=1.0), role
    assert 100 * d.dataloader_share == pytest.approx(ref["dataloader"], abs=1.0)
    assert d.gpu_utilization == pytest.approx(ref["util"], abs=0.01)
    assert sum(share.values()) == pytest.approx(100.0, abs=0.01)


@pytest.mark.parametrize("name", sorted(EXPECTED_ADVICE))
def test_expected_advice(diagnoses, name):
    d = diagnoses(name)
    ids = [r.id for r in d.recommendations]
    must, must_not = EXPECTED_ADVICE[name]
    assert must <= set(ids), ids
    assert not (must_not & set(ids)), ids
    # By what each is worth a trial (memory advice first where memory binds), one scale for what helps now
    # and what helps once the current bound is fixed.
    order = [(not (r.bound == "memory" and r.helps_now), -r.worth) for r in d.recommendations]
    assert order == sorted(order)
    for r in d.recommendations:
        assert r.evidence and r.code_change


def test_a_small_loader_wait_is_advised_for_the_little_it_can_take_back(diagnoses):
    """ResNet-50 on a V100 with 4 workers waits 0.8 % of its step on the DataLoader: below the 5 % a rule once
    asked for, it was no advice at all. It is a candidate whatever its size, worth no more than the wait it can
    take back (issue 66: the diagnosis feeds the prior, not a gate), and so ranked after every other change."""
    d = diagnoses("resnet50-v100-workers4.pt.trace.json.gz")
    workers = next(r for r in d.recommendations if r.id == "more-workers")
    assert 0 < workers.recoverable < 0.02 and not workers.helps_now
    assert workers.worth <= 2 * workers.recoverable
    assert d.recommendations[-1] is workers and d.recommendations[0].id == "amp"


def test_v100_memory_headroom_is_about_80_percent(diagnoses):
    d = diagnoses("v100-memory-events.pt.trace.json.gz")
    cuda = [m for m in d.memory if m.device.startswith("cuda")]
    assert len(cuda) == 1
    assert cuda[0].peak_allocated / 1e9 == pytest.approx(6.63, abs=0.01)
    assert cuda[0].capacity / 1e9 == pytest.approx(34.1, abs=0.1)
    assert cuda[0].headroom == pytest.approx(0.80, abs=0.01)
    # The memory timeline keeps the peak while thinning 28k events to a chartable series.
    assert 100 < len(cuda[0].timeline_ms) <= 400
    assert max(cuda[0].timeline_bytes) == cuda[0].peak_allocated
    assert list(cuda[0].timeline_ms) == sorted(cuda[0].timeline_ms)
    batch = next(r for r in d.recommendations if r.id == "larger-batch")
    assert any("80.6% unused" in e for e in batch.evidence)
    amp = next(r for r in d.recommendations if r.id == "amp")
    assert amp.knobs == {"amp": "fp16"}, "V100 (sm_70) has no bf16 Tensor Cores"


def test_a100_copies_are_pinned_and_tensor_cores_seen(diagnoses):
    d = diagnoses("a100-rank3-of-8.pt.trace.json.gz")
    assert d.copies.pageable_us == 0 and d.copies.pinned_us > 0
    assert d.copies.count == pytest.approx(25.0)  # 150 pinned HtoD copies over 6 steps
    assert d.tensor_core_share > 0.15
    assert d.distributed == {"backend": "nccl", "rank": 3, "world_size": 8}


def test_workers0_copies_are_pageable_and_synchronous(diagnoses):
    d = diagnoses("resnet50-v100-workers0.pt.trace.json.gz")
    assert d.copies.count == pytest.approx(2.0)  # 12 pageable copies over 6 steps
    assert d.copies.pinned_us == 0 and d.copies.pageable_us > 0
    assert d.copies.synchronous == pytest.approx(2.0)  # each cudaMemcpyAsync is followed by a sync
    assert d.eligible_share == pytest.approx(0.676, abs=0.01)  # the plugin's tc_eligible_ops_kernel_ratio
    assert d.tensor_core_share == 0.0


def test_mi250_makes_no_nvidia_tensor_core_claim(diagnoses):
    d = diagnoses("mi250-rocm-minitoy.pt.trace.json.gz")
    assert d.device.vendor == "amd"
    text = json.dumps([r.__dict__ for r in d.recommendations])
    assert "Tensor Core" not in text
    assert "one step" not in d.step_note  # it has ProfilerSteps; the last one launched no kernels
    proc = run_advisor("analyze", str(gpu_trace("mi250-rocm-minitoy.pt.trace.json.gz")))
    assert proc.returncode == 0
    assert "Tensor Core" not in proc.stdout
    assert "Matrix core" in proc.stdout


def test_legacy_compute_properties(diagnoses):
    d = diagnoses("legacy-format-computeProperties.json.gz")
    assert d.device.name == "Tesla V100-DGXS-32GB"
    assert d.device.compute_capability == (7, 0)
    assert len(d.steps) == 1
    assert d.step_time_us / 1000 == pytest.approx(13.41, abs=0.01)  # the plugin's 13410 us


def test_folder_gives_one_section_per_file_and_a_summary():
    folder = gpu_trace("mi250-rocm-minitoy.pt.trace.json.gz").parent
    proc = run_advisor("analyze", "--json", str(folder))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["schema"] == "advisor.analysis/1"
    names = sorted(p.name for p in folder.iterdir() if p.name.endswith((".json", ".json.gz")))
    assert [t["source"].split("/")[-1] for t in doc["traces"]] == names
    assert doc["summary"]["traces"] == len(names)
    text = run_advisor("analyze", str(folder)).stdout
    assert "Summary" in text
    for name in names:
        assert name in text
