"""`advisor analyze` on broken files, on valid traces that lack something, and without torch."""

from __future__ import annotations

import gzip
import json
import re
import sys

import pytest

from advisor.analysis.analyze import analyze_file
from advisor.analysis.kernels import TENSOR_CORE_PATTERNS, is_tensor_core, tensor_core_families
from conftest import gpu_trace, run_advisor

LEGACY = "legacy-format-computeProperties.json.gz"
MI250 = "mi250-rocm-minitoy.pt.trace.json.gz"


def load_json(name: str) -> dict:
    path = gpu_trace(name)
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def write(tmp_path, name: str, doc) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


# --- bad input: one line naming the file and the problem, exit code 2, no traceback -----------------

def _bad_inputs(tmp_path):
    legacy = json.dumps(load_json(LEGACY)).encode()
    cases = {
        "missing.json": (None, "no such file"),
        "empty.json": (b"", "empty file"),
        "not-json.json": (b"this is not json at all", "not valid JSON"),
        "truncated.json": (legacy[: len(legacy) // 2], "truncated JSON"),
        "truncated.json.gz": (gzip.compress(legacy)[:4000], "truncated gzip"),
        "not-gzip.json.gz": (legacy, "not gzip data"),
        "top-level-number.json": (b"42", "not a torch.profiler trace"),
        "no-trace-events.json": (b'{"schemaVersion": 1}', "traceEvents"),
        "events-not-a-list.json": (b'{"traceEvents": {"a": 1}}', "not a torch.profiler trace"),
        "empty-events.json": (b'{"traceEvents": []}', "no events"),
        "event-without-dur.json": (b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1}]}',
                                   "without 'dur'"),
        "event-with-string-ts.json": (b'{"traceEvents": [{"ph": "X", "name": "a", "ts": "soon", "dur": 1}]}',
                                      "not a torch.profiler trace"),
    }
    for name, (content, _) in cases.items():
        if content is not None:
            (tmp_path / name).write_bytes(content)
    return cases


def test_bad_inputs_give_one_line_and_exit_2(tmp_path):
    for name, (_, problem) in _bad_inputs(tmp_path).items():
        path = tmp_path / name
        proc = run_advisor("analyze", str(path))
        assert proc.returncode == 2, (name, proc.stdout, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, (name, proc.stderr)
        assert str(path) in lines[0] and problem in lines[0], (name, lines[0])
        assert "Traceback" not in proc.stderr
        assert proc.stdout == ""


def test_bad_input_in_process_raises_trace_error(tmp_path):
    from advisor.errors import TraceError

    (tmp_path / "empty.json").write_bytes(b"")
    with pytest.raises(TraceError, match="empty file"):
        analyze_file(tmp_path / "empty.json")


def test_folder_without_traces_is_an_error(tmp_path):
    proc = run_advisor("analyze", str(tmp_path))
    assert proc.returncode == 2
    assert "no .json or .json.gz trace files" in proc.stderr


# --- valid traces that lack something: say what is missing, never crash ----------------------------

def test_trace_without_profiler_steps_is_one_step(tmp_path):
    doc = load_json(LEGACY)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not e.get("name", "").startswith("ProfilerStep#")]
    d = analyze_file(write(tmp_path, "nosteps.json", doc))
    assert len(d.steps) == 1 and "whole trace is one step" in d.step_note
    assert any("ProfilerStep" in m for m in d.missing)
    proc = run_advisor("analyze", str(tmp_path / "nosteps.json"))
    assert proc.returncode == 0 and "whole trace is one step" in proc.stdout


def test_trace_without_device_properties_or_runtime(tmp_path):
    doc = load_json(LEGACY)
    del doc["computeProperties"]
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") != "Runtime"]
    d = analyze_file(write(tmp_path, "bare.json", doc))
    assert d.platform == "gpu"
    # Undescribed, the device is still known from its kernels' names: NVIDIA, volta_* kernels (sm_70).
    assert d.device.vendor == "nvidia" and not d.device.described
    assert d.device.compute_capability == (7, 0) and d.device.total_memory is None
    assert any("deviceProperties" in m for m in d.missing)
    assert any("runtime events" in m for m in d.missing)
    for r in d.recommendations:
        assert r.knobs.get("amp") in (None, "fp16"), "Volta has no bf16 Tensor Cores"


def test_nanosecond_integer_timestamps_give_the_same_figures(tmp_path):
    doc = load_json(LEGACY)
    original = analyze_file(gpu_trace(LEGACY))
    for e in doc["traceEvents"]:
        if "ts" in e:
            e["ts"] = int(e["ts"]) * 1000  # 64-bit integers, ~1.6e18
        if "dur" in e:
            e["dur"] = int(e["dur"]) * 1000
    d = analyze_file(write(tmp_path, "ns.json", doc))
    assert d.step_time_us == pytest.approx(original.step_time_us, rel=1e-9)
    for role, us in original.breakdown_us.items():
        assert d.breakdown_us[role] == pytest.approx(us, abs=1e-6)


def test_amd_trace_without_device_names_is_still_amd(tmp_path):
    doc = load_json(MI250)
    for p in doc["deviceProperties"]:
        p["name"] = ""
    d = analyze_file(write(tmp_path, "amd.json", doc))
    assert d.device.vendor == "amd"  # from hip* runtime calls


def test_steps_option_selects_profiler_steps():
    path = gpu_trace("resnet50-v100-workers0.pt.trace.json.gz")
    all_steps = analyze_file(path)
    some = analyze_file(path, steps="6-7")
    assert [s.name for s in some.steps] == ["ProfilerStep#6", "ProfilerStep#7"]
    assert some.step_time_us == pytest.approx(sum(s.duration for s in all_steps.steps[1:3]) / 2)
    proc = run_advisor("analyze", str(path), "--steps", "99")
    assert proc.returncode == 2 and "no such steps" in proc.stderr


# --- the analysis path never imports torch -----------------------------------------------------------

def test_analyze_does_not_import_torch():
    path = gpu_trace(MI250)
    code = ("import sys; sys.modules['torch'] = None  # any 'import torch' now raises\n"
            "from advisor.cli import main\n"
            f"rc = main(['analyze', {str(path)!r}]) + main(['analyze', '--json', {str(path)!r}])\n"
            "assert rc == 0, rc\n"
            "assert sys.modules['torch'] is None\n"
            "print('TORCH-FREE')")
    import subprocess

    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "TORCH-FREE" in proc.stdout


# --- the JSON document -------------------------------------------------------------------------------

def test_json_schema():
    proc = run_advisor("analyze", "--json", str(gpu_trace("resnet50-v100-workers0.pt.trace.json.gz")))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["schema"] == "advisor.analysis/1"
    (t,) = doc["traces"]
    assert set(t["breakdown_share"]) == {"kernel", "memcpy", "memset", "communication", "runtime", "dataloader",
                                        "cpu_op", "other"}
    assert t["device"]["compute_capability"] == "7.0"
    assert t["steps"]["count"] == 6
    assert [r["id"] for r in t["recommendations"]][:2] == ["more-workers", "amp"]
    for r in t["recommendations"]:
        assert {"id", "title", "knobs", "predicted_gain", "evidence", "code_change"} <= set(r)
    assert t["copies"]["bytes"] > 0


# --- Tensor Core patterns: one family per row, each tested with real kernel names --------------------

TENSOR_CORE_KERNELS = {
    "volta-hmma": "volta_h884gemm_64x64_ldg8_nn",
    "turing-ampere-mma": "ampere_s16816gemm_fp16_128x128_ldg8_stages_32x5_tn",
    "xmma": "xmma_fprop_implicit_gemm_indexed_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize128x128x32",
    "cutlass-tensorop": "void cutlass::Kernel<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>",
    "hopper-wgmma": "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_wgmma",
    "nvjet": "nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NTN",
    "sm80-sm90-gemm": "sm80_xmma_gemm_f16f16_f16f32_f32_nn_n_tilesize160x128x32_stage4_warpsize2x2x1_tensor16x8x16",
    "flash-attention": "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>",
    "cudnn-tensor-core-conv": "void cudnn::detail::dgrad_1x1_stride_2x2_kernel<float, float>",
    "amd-mfma": "Cijk_Alik_Bljk_SB_Bias_AS_SAV_UserArgs_MT64x16x32_MI16x16x1_SN_LDSB1_AFC1_AFEM1",
}
NOT_TENSOR_CORE = [
    "volta_sgemm_128x64_nn",
    "ampere_sgemm_128x64_nn",
    "void cutlass::Kernel<cutlass_80_simt_sgemm_128x128_8x4_nn_align1>",
    "void implicit_convolve_sgemm<float, float, 1024, 6, 7, 3, 3, 5, 1, false, false, true>",
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>",
    "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)",
]


def test_every_pattern_family_has_a_real_kernel_name():
    assert {family for family, _, _ in TENSOR_CORE_PATTERNS} == set(TENSOR_CORE_KERNELS)


@pytest.mark.parametrize("family", sorted(TENSOR_CORE_KERNELS))
def test_tensor_core_family(family):
    name = TENSOR_CORE_KERNELS[family]
    assert family in tensor_core_families(name)
    vendor = "amd" if family.startswith("amd") else "nvidia"
    assert is_tensor_core(vendor, name)


@pytest.mark.parametrize("name", NOT_TENSOR_CORE)
def test_not_tensor_core(name):
    assert tensor_core_families(name) == []
    assert not is_tensor_core("nvidia", name) and not is_tensor_core("amd", name)


def test_pattern_table_is_plain_regex():
    for _, vendor, pattern in TENSOR_CORE_PATTERNS:
        re.compile(pattern)
        assert vendor in ("nvidia", "amd")


def test_a_trace_read_again_is_parsed_once_and_a_file_written_again_is_read_again(tmp_path):
    import os
    import shutil

    from advisor.analysis.trace import load_trace

    path = tmp_path / "t.pt.trace.json.gz"
    shutil.copy2(gpu_trace("h100-char-transformer-fp32.pt.trace.json.gz"), path)
    first = load_trace(path)
    assert load_trace(path) is first and analyze_file(path).step_time_us == analyze_file(path).step_time_us
    # Another trace written over it, its modification time set back to the first's: read again all the same.
    stamp = path.stat()
    shutil.copyfile(gpu_trace("h100-char-transformer-bf16.pt.trace.json.gz"), path)
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    second = load_trace(path)
    assert second is not first and second.event_count != first.event_count
    assert second.event_count == load_trace(gpu_trace("h100-char-transformer-bf16.pt.trace.json.gz")).event_count
    # One byte changed in place, the size and both stamps as they were (a rewrite within one tick of the
    # kernel's clock looks so): read again.
    small = tmp_path / "small.json"
    for name in ("aten::aa", "aten::ab"):
        small.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": name, "ts": 1, "dur": 2}]}))
        os.utime(small, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
        assert [e.name for e in load_trace(small).ops] == [name]
