"""What the step's kernels do: Tensor Core (matrix core) use, matmul work AMP could move, layout conversions,
and the layout-sensitive kernels that run on NCHW inputs (read from the trace's strides).

The Tensor Core patterns are one table (`TENSOR_CORE_PATTERNS`), one family per row, Volta to Hopper and
AMD CDNA, each family with its own test.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from advisor.analysis.breakdown import is_communication_kernel
from advisor.analysis.columns import among, distinct, rightmost_above
from advisor.analysis.events import input_lists
from advisor.analysis.steps import Step, starts_in_steps
from advisor.analysis.trace import Trace


# Tensor Core (NVIDIA) and matrix core (AMD) kernel name patterns, one table, one family per row.
# A kernel counts as Tensor Core when any family's pattern matches its name.
TENSOR_CORE_PATTERNS: tuple[tuple[str, str, str], ...] = (
    # (family, vendor, regex)
    ("volta-hmma", "nvidia", r"h884|s884|i884|hmma|884gemm|884cudnn"),
    ("turing-ampere-mma", "nvidia", r"h1688|s1688|c1688|i8816|16816|1688gemm|bf16816|tf32"),
    ("xmma", "nvidia", r"xmma"),
    ("cutlass-tensorop", "nvidia", r"tensorop"),
    ("hopper-wgmma", "nvidia", r"wgmma|gmma_|_gmma"),
    ("nvjet", "nvidia", r"nvjet"),
    ("sm80-sm90-gemm", "nvidia", r"\bsm_?(?:75|80|86|87|89|90|100|120)a?_\w*(?:gemm|conv|fprop|dgrad|wgrad)"),
    ("flash-attention", "nvidia", r"flash_fwd|flash_bwd|flash::|pytorch_flash|fmha_|_fmha|flash_attn"),
    ("cudnn-tensor-core-conv", "nvidia", r"dgrad_1x1_stride_2x2|first_layer_wgrad_kernel|conv1x1|conv2d_c1_k1|"
                                         r"direct_group"),
    ("amd-mfma", "amd", r"_MI\d+x\d+x\d+|mfma|xdlops|_xdl_"),
)
_TC_REGEX = {vendor: re.compile("|".join(p for _, v, p in TENSOR_CORE_PATTERNS if v == vendor))
             for vendor in ("nvidia", "amd")}
# Names that say the math ran on the ordinary FP32 units even where a pattern above matches: cuBLAS/cuDNN
# xmma kernels built for FFMA (`sm80_xmma_gemm_f32f32_..._ffma_...`) and cutlass SIMT kernels.
NOT_TENSOR_CORE = re.compile(r"ffma|_simt_")

# cuDNN/MIOpen layout conversions around convolutions (NCHW tensors fed to NHWC kernels): memory-bound
# copies that AMP does not remove; channels_last does.
LAYOUT_KERNEL = re.compile(r"nchw_?(?:2|to)_?nhwc|nhwc_?(?:2|to)_?nchw", re.IGNORECASE)

# Matmul, convolution and attention kernels by name, for kernels no operator launched (CUDA graph replays,
# compiled regions): cuBLAS/cutlass/nvjet GEMMs, cuDNN convolutions, AMD Tensile (Cijk_), attention.
MATMUL_KERNEL = re.compile(r"gemm|gemv|conv(?!ert)|fprop|dgrad|wgrad|winograd|[sh]\d*cudnn|nvjet|^Cijk_|fmha|"
                           r"flash_|_sdpa_|splitKreduce", re.IGNORECASE)


@lru_cache(maxsize=None)
def is_tensor_core(vendor: str, kernel_name: str) -> bool:
    """Whether a kernel of this vendor ran on Tensor Cores (matrix cores), by its name."""
    regex = _TC_REGEX.get(vendor)
    return regex is not None and regex.search(kernel_name) is not None and not NOT_TENSOR_CORE.search(kernel_name)


@lru_cache(maxsize=None)
def _is_layout_kernel(kernel_name: str) -> bool:
    return LAYOUT_KERNEL.search(kernel_name) is not None


@lru_cache(maxsize=None)
def _is_matmul_kernel(kernel_name: str) -> bool:
    return MATMUL_KERNEL.search(kernel_name) is not None and not _is_layout_kernel(kernel_name)


@lru_cache(maxsize=None)
def _kernel_class(vendor: str, kernel_name: str, op_name: str | None) -> tuple[bool, bool, bool]:
    """(on Tensor Cores, matmul/convolution work, layout conversion) of a kernel launched by `op_name`
    (None: no operator, so its name decides); cached, as a step repeats the same pairs thousands of times."""
    eligible = _is_matmul_kernel(kernel_name) if op_name is None else is_eligible_op(op_name)
    return is_tensor_core(vendor, kernel_name), eligible, _is_layout_kernel(kernel_name)


@lru_cache(maxsize=None)
def is_eligible_op(op_name: str) -> bool:
    """Whether an operator's kernels could run on Tensor Cores under AMP (`ELIGIBLE_OP`)."""
    return ELIGIBLE_OP.match(op_name) is not None


def tensor_core_families(kernel_name: str) -> list[str]:
    """Every Tensor Core / matrix core family whose pattern matches a kernel name (often more than one);
    none when the name says FFMA or SIMT math."""
    if NOT_TENSOR_CORE.search(kernel_name):
        return []
    return [family for family, _vendor, pattern in TENSOR_CORE_PATTERNS if re.search(pattern, kernel_name)]


# Operators whose kernels could run on Tensor Cores under AMP (autocast's lower-precision list), and their
# backward. The innermost operator that launched a kernel is the one matched.
ELIGIBLE_OP = re.compile(
    r"^(aten::(_?convolution\w*|conv\d?d|conv_tbc|conv_transpose\dd|cudnn_convolution\w*|miopen_convolution\w*|"
    r"mkldnn_convolution|_?mm|addmm_?|addmv|addr|matmul|mv|linear|addbmm|baddbmm|bmm|chain_matmul|"
    r"linalg_multi_dot|prelu|_thnn_fused_\w+_cell|\w+_cell|_scaled_dot_product\w*|_flash_attention\w*|"
    r"_efficient_attention\w*|scaled_dot_product_attention)"
    r"|\w*(Convolution|Mm|Bmm|Addmm|Addbmm|Baddbmm|Mv|Addmv|Linear|Matmul)\w*Backward\d*)$"
)


# Convolution operators (forward and backward): the layers channels_last and cuDNN autotuning change.
CONV_OP = re.compile(r"^aten::(_?convolution\w*|conv[123]d|conv_transpose[123]d|cudnn_convolution\w*|"
                     r"miopen_convolution\w*|mkldnn_convolution)$|ConvolutionBackward\d*$")
CONV_KERNEL = re.compile(r"conv(?!ert)|fprop|dgrad|wgrad|winograd|implicit_?gemm", re.IGNORECASE)


@lru_cache(maxsize=None)
def is_conv_op(op_name: str) -> bool:
    """Whether an operator is a convolution (or its backward)."""
    return CONV_OP.search(op_name) is not None


# Operators whose kernels are chosen by the memory layout of their 4-D input: the convolutions and the
# normalisations and pools around them, forward and backward (on the H200 conv surface channels_last halved
# their kernel time in fp32 without a single layout conversion kernel in the trace).
NORM_POOL_OP = re.compile(r"^aten::(\w*batch_norm\w*|\w*group_norm\w*|\w*instance_norm\w*|"
                          r"\w*(?:max|avg)_pool[23]d\w*|adaptive_\w*pool[23]d\w*)$")


@lru_cache(maxsize=None)
def is_layout_sensitive_op(op_name: str) -> bool:
    """Whether an operator's kernels depend on its input's layout (a convolution, a norm or pool, or a backward)."""
    return is_conv_op(op_name) or NORM_POOL_OP.match(op_name) is not None


def nchw_input(op) -> bool | None:
    """Whether an operator's first input is a 4-D tensor laid out NCHW (contiguous), by its recorded strides:
    False where it is channels_last, None where the trace has no strides or the layouts cannot be told apart
    (one channel, or 1×1 images)."""
    found = input_lists(op.args, "input_dims", "input_strides")
    if found is None:
        return None
    dims, strides = found
    if not dims or not strides or len(dims[0]) != 4 or len(strides[0]) != 4:
        return None
    (_, c, h, w), stride = dims[0], strides[0]
    if c <= 1 or h * w <= 1:
        return None
    if list(stride[1:]) == [h * w, w, 1]:
        return True
    return False if list(stride[1:]) == [1, w * c, c] else None


def conv_shapes_constant(trace: Trace, steps: list[Step]) -> bool | None:
    """Whether every step ran its convolutions on the same input shapes (what cuDNN autotuning needs to
    pay); None when the trace has no convolutions or no shapes (recorded without record_shapes)."""
    per_step: dict[int, list[bytes]] = defaultdict(list)
    convolutions = trace.columns["ops"].where_name(lambda name: name in ("aten::convolution", "aten::_convolution"))
    for op in map(trace.ops.__getitem__, np.flatnonzero(convolutions).tolist()):
        if op.args is not None:
            dims = bytes(op.args.input_dims)
            if not dims:
                return None
            for i, step in enumerate(steps):
                if step.start <= op.ts < step.end:
                    per_step[i].append(dims)
                    break
    if not per_step:
        return None
    shapes = {tuple(sorted(v)) for v in per_step.values()}
    return len(shapes) == 1


def launching_ops(trace: Trace, correlations: np.ndarray) -> np.ndarray:
    """For each correlation id given (`Columns.correlation`), the index in `trace.ops` of the innermost operator
    around the runtime call with that id, or -1 (user annotations are not operators; a call with no operator
    around it has none).

    Matched by time on the calling thread rather than by 'External id', which some Kineto versions
    write as the correlation id (so it names no operator). Operators are sorted by start, enclosing ones
    first: the innermost operator around a call is the last one to start by then that has not ended yet
    (`rightmost_above`), found for all the calls of a thread at once. Where calls share an id, the last
    call of the last thread (by first call) decides.
    """
    ops, runtime = trace.columns["ops"], trace.columns["runtime"]
    wanted = among(runtime.correlation, correlations)
    if (correlations == -1).any():  # an id of None: only calls that have arguments at all count
        wanted &= np.fromiter((r.args is not None for r in trace.runtime), bool, len(runtime))
    calls = np.flatnonzero(wanted)
    found = np.full(correlations.size, -1)
    if not calls.size or not len(ops):
        return found
    is_op = ~ops.annotation  # user annotations ('## forward ##', 'Optimizer.step#...') are not operators
    call_tids = runtime.tid[calls]
    _, first = np.unique(call_tids, return_index=True)
    ids, innermost = [], []
    for tid in call_tids[np.sort(first)].tolist():  # threads in the order their first call comes
        on_thread = calls[call_tids == tid]
        thread_ops = np.flatnonzero(is_op & (ops.tid == tid))
        if not thread_ops.size:
            continue
        starts = runtime.ts[on_thread]
        last = np.searchsorted(ops.ts[thread_ops], starts, side="right") - 1
        op = rightmost_above(ops.end[thread_ops], last, starts)
        ids.append(runtime.correlation[on_thread][op >= 0])
        innermost.append(thread_ops[op[op >= 0]])
    ids, innermost = (np.concatenate(ids), np.concatenate(innermost)) if ids else ((), ())
    if not len(ids):  # no call has an operator around it (those of its thread ended before it)
        return found
    # The last call with each id: unique ids of the reversed list keep their first (the last) occurrence.
    unique_ids, last_of = np.unique(ids[::-1], return_index=True)
    at = np.clip(np.searchsorted(unique_ids, correlations), 0, max(unique_ids.size - 1, 0))
    hit = unique_ids[at] == correlations
    found[hit] = innermost[::-1][last_of[at[hit]]]
    return found


@dataclass(frozen=True)
class KernelMix:
    """What the step's kernels do: Tensor Core use, matmul work AMP could move, layout conversions."""

    kernel_us: float = 0.0  # per step, communication kernels left out
    tensor_core_share: float | None = None
    eligible_share: float | None = None
    eligible_op_share: float | None = None
    layout_share: float | None = None
    by_name_share: float = 0.0  # kernel time no operator launched, classified by its name
    conv_share: float = 0.0  # kernel time of convolutions (by their operator, else by the kernel's name)
    nchw_share: float = 0.0  # kernel time of convolutions, norms and pools on NCHW inputs (`nchw_input`)


def kernel_mix(trace: Trace, steps: list[Step], vendor: str) -> KernelMix:
    """Shares of the steps' kernel time: on Tensor Cores, eligible for AMP but not on them, layout work.

    A kernel is matmul/convolution work when the innermost operator that launched it is (`ELIGIBLE_OP`),
    or, where no operator launched it (a CUDA graph replay, a compiled region), when its name says so
    (`MATMUL_KERNEL`). Layout conversions (`LAYOUT_KERNEL`) count as layout work even under a convolution:
    AMP does not remove them. Eligible share differs from the plugin's ratio on purpose: it counts only
    the eligible kernels that did *not* use Tensor Cores (what AMP could still move); the plugin's figure
    (all kernels of eligible ops) is `eligible_op_share`. Without a Tensor Core table for the vendor, the
    Tensor Core and eligible shares are unknown (None), not zero.
    """
    columns = trace.columns["kernels"]
    chosen = np.flatnonzero(starts_in_steps(columns.ts, steps) & ~columns.where_name(is_communication_kernel))
    durations = columns.dur[chosen]
    total = sum(durations.tolist())
    if not total:
        return KernelMix()
    correlations = columns.correlation[chosen]
    # Ids of kernels without arguments are not asked for: they are looked up as None all the same.
    has_args = np.fromiter((trace.kernels[i].args is not None for i in chosen.tolist()), bool, chosen.size) \
        if (correlations == -1).any() else np.ones(chosen.size, dtype=bool)
    asked = distinct(correlations[has_args])
    op_index = np.full(chosen.size, -1)
    if asked.size:
        at = np.clip(np.searchsorted(asked, correlations), 0, asked.size - 1)
        op_index = np.where(asked[at] == correlations, launching_ops(trace, asked)[at], -1)
    ops = trace.columns["ops"]
    op_names = list(ops.names) + [None]
    op_code = np.where(op_index >= 0, ops.name_code[np.clip(op_index, 0, None)], len(ops.names)) if len(ops) else \
        np.full(chosen.size, len(ops.names))
    # Each (kernel name, operator) pair classified once: a step repeats the same few hundred pairs.
    pairs, pair_of = np.unique(columns.name_code[chosen].astype(np.int64) * len(op_names) + op_code,
                               return_inverse=True)
    table = []
    for pair in pairs.tolist():
        name, op = columns.names[pair // len(op_names)], op_names[pair % len(op_names)]
        conv = (is_conv_op(op) if op is not None else CONV_KERNEL.search(name) is not None) \
            and not _is_layout_kernel(name)
        sensitive = op is not None and is_layout_sensitive_op(op)
        table.append((conv, op is None, sensitive) + _kernel_class(vendor, name, op))
    table = np.array(table, dtype=bool).reshape(-1, 6)[pair_of.reshape(-1)]
    conv_k, by_name_k, sensitive_k, on_tc, eligible, is_layout = table.T

    def time_of(mask) -> float:
        return sum(durations[mask].tolist(), 0.0)  # in the kernels' order, as they were always added

    tc, by_name, eligible_all, layout = time_of(on_tc), time_of(by_name_k), time_of(eligible), time_of(is_layout)
    # Kernels of layout-sensitive operators whose input the trace shows NCHW: each such operator read once.
    sensitive = np.flatnonzero(sensitive_k)
    nchw_k = np.zeros(chosen.size, dtype=bool)
    if sensitive.size:
        launched, which = np.unique(op_index[sensitive], return_inverse=True)
        nchw_k[sensitive] = np.array([nchw_input(trace.ops[i]) is True for i in launched.tolist()])[which]
    eligible_left, conv = time_of(~is_layout & eligible & ~on_tc), time_of(conv_k)
    known = vendor in _TC_REGEX
    return KernelMix(
        kernel_us=total / len(steps),
        tensor_core_share=tc / total if known else None,
        eligible_share=eligible_left / total if known else None,
        eligible_op_share=eligible_all / total,
        layout_share=layout / total,
        by_name_share=by_name / total,
        conv_share=conv / total,
        nchw_share=time_of(nchw_k & ~is_layout) / total,
    )
