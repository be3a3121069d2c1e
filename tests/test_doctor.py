"""`advisor doctor` on this machine: each check's real answer, the --json document, and the failure paths
driven by real causes (no C++ compiler: CXX=/nonexistent; --device cuda where there is no CUDA device);
the profiler's check that `advisor profile` runs before a CUDA baseline; `make gpu-check` without CUDA."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import tarfile

import pytest
import torch

from advisor.doctor.checks import device_supported
from advisor.trials.harness.trial_facts import bf16_instructions, cpu_computes_bf16, cpuinfo
from advisor.trials.launch.profiler_check import CUPTI_PERMISSION, count_events, trace_problems
from conftest import ROOT, TRACES, advisor_main, run_advisor

pytestmark = pytest.mark.slow
CHECKS = ["torch", "cpu", "devices", "precision", "profiler", "nvml", "pinned_memory", "compile", "data_parallel"]
no_cuda_here = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")


@pytest.fixture(scope="module")
def document(tmp_path_factory) -> dict:
    # With a script: its imports (torch, a module beside it, an optional one that is missing) checked first.
    folder = tmp_path_factory.mktemp("script")
    (folder / "helper_beside_it.py").write_text("")
    (folder / "train.py").write_text("import torch\nfrom helper_beside_it import *\n"
                                     "try:\n    import not_installed_here\nexcept ImportError:\n    pass\n")
    done = run_advisor("doctor", "--json", str(folder / "train.py"), timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def test_each_check_answers_for_this_machine(document):
    assert document["schema"] == "advisor.doctor/1" and document["requested_device"] == "auto"
    checks = {c["name"]: c for c in document["checks"]}
    assert list(checks) == ["script_imports", *CHECKS]
    imports = checks.pop("script_imports")
    assert imports["status"] == "ok" and imports["details"]["python"] == document["python"] == sys.executable
    assert imports["details"]["missing_optional"] == ["not_installed_here"], imports
    cuda = torch.cuda.is_available()
    assert document["device"] == ("cuda" if cuda else "cpu")
    assert document["ok"] and document["exit_code"] == 0 and not document["failed_needed"]
    needed = {name for name, c in checks.items() if c["needed"]}
    assert needed == {"torch", "profiler"} | ({"devices"} if cuda else set())

    build = checks["torch"]["details"]
    assert build["version"] == torch.__version__ and build["cuda"] == torch.version.cuda
    assert torch.__version__ in checks["torch"]["summary"]

    cpu = checks["cpu"]["details"]
    assert cpu["logical_cores"] == os.cpu_count() and cpu["torch_threads"] == torch.get_num_threads()
    # the product's own detection of native bf16, and what it means for the advice
    assert cpu["bf16_instructions"] == bf16_instructions(cpuinfo()[1], os.environ)
    assert ("no bf16 instructions" in checks["cpu"]["summary"]) == (not cpu_computes_bf16())

    profiler = checks["profiler"]
    assert profiler["status"] == "ok", profiler
    assert profiler["details"]["cpu_ops"] > 0 and profiler["details"]["cpu_memory_events"] > 0
    if cuda:
        assert profiler["details"]["kernels"] > 0 and profiler["details"]["device_memory_events"] > 0
    else:
        assert profiler["details"]["device"] == "cpu" and "CPU operators" in profiler["summary"]
        for name in ("devices", "nvml", "pinned_memory"):
            assert checks[name]["status"] == "skipped" and not checks[name]["needed"]
        assert checks["precision"]["details"] == {"bf16_native": cpu_computes_bf16(), "tf32": False,
                                                  "autocast_dtype": "torch.bfloat16"}

    compiled = checks["compile"]  # inductor's C++ compiler on the CPU (CXX, else g++); Triton's kernels on CUDA
    assert compiled["status"] == ("ok" if cuda or shutil.which(os.environ.get("CXX", "g++")) else "failed"), compiled
    if compiled["status"] == "ok":
        assert compiled["details"]["compile_s"] > 0

    parallel = checks["data_parallel"]
    assert parallel["status"] == "ok" and parallel["details"]["gloo"] is True, parallel
    assert ("nccl" in parallel["details"]) == cuda
    assert all(c["seconds"] >= 0 for c in checks.values())


def test_without_a_compiler_the_compile_check_says_what_it_breaks_and_how_to_fix_it():
    done = run_advisor("doctor", "--device", "cpu", env={"CXX": "/nonexistent/c++"}, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr  # compile is optional: the CPU has what it needs
    lines = done.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.split()[:2] == ["failed", "compile"])
    assert "no C++ compiler for torch.compile" in lines[at] and "/nonexistent/c++" in lines[at]
    assert "breaks: the compile knob: a trial that compiles runs eagerly" in lines[at + 1]
    assert "fix: install a C++ compiler" in lines[at + 2] and "CXX" in lines[at + 2]
    assert lines[-1].startswith("everything the cpu device needs works (1 optional check(s) failed: compile)")
    assert any(line.split()[:2] == ["ok", "profiler"] for line in lines)


@no_cuda_here
def test_device_cuda_without_cuda_says_so_and_exits_1():
    # In this process (torch is imported already): with no CUDA device, no check but torch, cpu and devices runs.
    done = advisor_main("doctor", "--device", "cuda", "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    document = json.loads(done.stdout)
    assert document["exit_code"] == 1 and document["failed_needed"] == ["devices"] and document["device"] == "cuda"
    checks = {c["name"]: c for c in document["checks"]}
    devices = checks["devices"]
    assert devices["status"] == "failed" and devices["needed"]
    assert devices["summary"] == "no CUDA device is available to this process"
    assert devices["breaks"].startswith("--device cuda: no trial can run")
    assert ("CPU-only build" in devices["fix"]) == (torch.version.cuda is None)
    for name in ("precision", "profiler", "nvml", "pinned_memory", "compile", "data_parallel"):
        assert checks[name]["status"] == "skipped" and "needs a CUDA device" in checks[name]["summary"]
    assert checks["torch"]["status"] == checks["cpu"]["status"] == "ok"


@no_cuda_here
def test_profile_on_cuda_without_cuda_stops_before_the_baseline(tmp_path):
    out = tmp_path / "session"
    done = advisor_main("profile", f"{ROOT / 'examples' / 'conv_classifier.py'}:train_step", "--device", "cuda",
                        "--out", str(out))
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip() == "advisor: error: --device cuda: no CUDA device is available to this process"
    assert not out.exists()  # nothing was measured, nothing left behind


def test_a_trace_without_kernels_names_cupti_and_the_remedy():
    """A real H100 trace holds what the advisor reads; the same trace as a process that CUPTI refused writes it
    (its CPU side only, and Kineto's error on stderr) says what that breaks and the standard remedy."""
    with gzip.open(TRACES / "h100-image-classifier-workers0.pt.trace.json.gz", "rt") as f:
        events = json.load(f)["traceEvents"]
    counts = {"device": "cuda", **count_events(events), "cupti_errors": []}
    assert counts["kernels"] > 0 and not trace_problems(counts)
    device_side = ("kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver", "gpu_user_annotation")
    refused = {"device": "cuda", **count_events([e for e in events if e.get("cat") not in device_side]),
               "cupti_errors": [CUPTI_PERMISSION]}
    problems = trace_problems(refused)
    assert len(problems) == 1
    problem = problems[0]
    assert CUPTI_PERMISSION in problem.summary and "no GPU kernels" in problem.summary
    assert "NVreg_RestrictProfilingToAdminUsers=0" in problem.fix and "SYS_ADMIN" in problem.fix
    assert "--privileged" in problem.fix and "`advisor profile` stops before a CUDA baseline" in problem.breaks


@no_cuda_here
def test_gpu_check_without_cuda_checks_nothing(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(["make", "-s", "gpu-check", f"PY={sys.executable}", f"OUT={out}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "no CUDA device: nothing checked"
    assert not out.exists()


def test_a_gpu_is_supported_by_a_cubin_of_its_major_version_or_older_ptx():
    built = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "compute_120"]
    assert device_supported((9, 0), built) and device_supported((8, 9), built)  # sm_86 runs on 8.9
    assert device_supported((12, 1), built)  # through the PTX the driver compiles
    assert not device_supported((7, 0), built)  # a V100: no sm_70 and no older PTX
    assert not device_supported((11, 0), ["sm_100", "sm_120"])


def test_gpu_check_packs_a_session_within_its_budget_baseline_traces_first(tmp_path, monkeypatch):
    """What a remote run brings back: every record of a real session folder, then its traces while they fit
    (the baseline's first), and the list of what was left out."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_check

    session = ROOT / "sample_runs" / "image_classifier"
    files = [p for p in session.rglob("*") if p.is_file()]
    traces = [p for p in files if ".pt.trace.json" in p.name]
    records = sum(p.stat().st_size for p in files if p not in traces)
    baseline = next(p for p in traces if "00-baseline" in str(p))
    monkeypatch.setattr(gpu_check, "ARCHIVE_BUDGET", records + baseline.stat().st_size)
    archive = tmp_path / "sessions.tar.gz"
    left_out = gpu_check.pack(session, archive)
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    assert {f"image_classifier/{p.relative_to(session)}" for p in files if p not in traces} <= names
    assert f"image_classifier/{baseline.relative_to(session)}" in names
    assert sorted(left_out) == sorted(str(p.relative_to(session)) for p in traces if p != baseline)


def test_a_check_may_record_a_detail_called_name():
    """NVML's facts hold the device's `name`: the check records it beside its own (this raised a TypeError on
    the first real GPU, and the nvml check failed)."""
    from advisor.doctor.checks import ok

    check = ok("nvml", "NVML reads NVIDIA H200", name="NVIDIA H200", driver="580.159.04")
    assert check.name == "nvml" and check.details == {"name": "NVIDIA H200", "driver": "580.159.04"}


def test_gpu_check_counts_each_test_of_a_verbose_run_whatever_its_parameters():
    """The outcome of every line pytest -v writes, also for ids with spaces and commas (a real GPU run counted
    15 of its 22 passed tests: the torchvision pipelines' ids were dropped)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_check

    lines = ["tests/test_cuda.py::test_ddp_trial_on_nccl PASSED                       [  4%]",
             "tests/test_uint8_transforms.py::test_after[v1 ImageNet, PIL augmentations] PASSED [ 60%]",
             "tests/test_uint8_transforms.py::test_after[custom Dataset returning the transform's call] FAILED [ 90%]",
             "tests/test_cuda.py::test_fp16 SKIPPED (needs a CUDA device)             [ 95%]",
             "PASSED tests/test_cuda.py::test_summary_line_is_not_a_test"]
    found = dict(m.groups() for m in map(gpu_check.TEST_LINE.match, lines) if m)
    assert found == {"tests/test_cuda.py::test_ddp_trial_on_nccl": "PASSED",
                     "tests/test_uint8_transforms.py::test_after[v1 ImageNet, PIL augmentations]": "PASSED",
                     "tests/test_uint8_transforms.py::test_after[custom Dataset returning the transform's call]": "FAILED",
                     "tests/test_cuda.py::test_fp16": "SKIPPED"}
