"""Every lint rule: its stable id, title, why it matters, and the check that finds it. A check gets the
parsed script and yields (node, what, fix); `run.lint_tree` adds the rest."""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Callable, Iterator

from advisor.code.lint.autograd import check_eval_without_no_grad, check_loss_accumulation
from advisor.code.lint.gpu_use import check_data_parallel, check_empty_cache_in_loop, check_half_with_batchnorm
from advisor.code.lint.loading import check_dataloader_pin_memory, check_dataloader_workers, check_non_blocking_copy
from advisor.code.lint.script import Script

RuleCheck = Callable[[Script], Iterator[tuple[ast.AST, str, str]]]


@dataclasses.dataclass(frozen=True)
class Rule:
    """A lint rule: its stable id, a short title, why it matters, and the check."""

    id: str
    title: str
    why: str
    check: RuleCheck


RULES: dict[str, Rule] = {
    rule.id: rule
    for rule in [
        Rule(
            "loss-accumulation",
            "loss tensor accumulated across iterations",
            "The sum is a tensor that references the autograd graph of every iteration it was added in, so "
            "activations are never freed and memory grows step after step until the device (the GPU, or the "
            "host's RAM for a step on the CPU) runs out of memory.",
            check_loss_accumulation,
        ),
        Rule(
            "eval-without-no-grad",
            "evaluation with autograd enabled",
            "model.eval() changes dropout and BatchNorm, not autograd: without torch.no_grad() or "
            "torch.inference_mode() every forward pass stores its activations for a backward that never "
            "comes, costing memory (often a smaller possible eval batch) and time.",
            check_eval_without_no_grad,
        ),
        Rule(
            "half-with-batchnorm",
            "model.half() with BatchNorm layers",
            "BatchNorm running statistics and its variance computation in float16 overflow and lose "
            "precision, so training becomes unstable (NaN losses) and accuracy drops. torch.autocast runs "
            "matmuls and convolutions in float16 but keeps BatchNorm and the weights in float32.",
            check_half_with_batchnorm,
        ),
        Rule(
            "data-parallel",
            "nn.DataParallel",
            "DataParallel replicates the model and scatters inputs from one Python thread on every step; the "
            "GIL and the copies through GPU 0 make it slower than DistributedDataParallel (one process per "
            "GPU), which PyTorch recommends even on a single machine.",
            check_data_parallel,
        ),
        Rule(
            "dataloader-num-workers",
            "DataLoader without worker processes",
            "With num_workers=0 (the default) loading, decoding and augmenting each batch runs in the "
            "training process between steps, and the step waits for it. Start with 4 workers, up to the CPU "
            "cores per accelerator; for a step on the CPU, workers and the step share the cores "
            "(measure: `advisor profile`); persistent_workers=True keeps them alive between epochs.",
            check_dataloader_workers,
        ),
        Rule(
            "dataloader-pin-memory",
            "DataLoader without pin_memory on a CUDA path",
            "Copies from pageable host memory go through a staging buffer and cannot run asynchronously; "
            "pin_memory=True puts batches in page-locked memory, so host-to-device copies are faster and can "
            "overlap compute.",
            check_dataloader_pin_memory,
        ),
        Rule(
            "non-blocking-copy",
            "synchronous copy of a pinned batch",
            "Without non_blocking=True a copy from pinned memory still blocks the CPU until it finishes, so "
            "the next kernels are queued late; with it the copy overlaps the work already queued on the GPU.",
            check_non_blocking_copy,
        ),
        Rule(
            "empty-cache-in-loop",
            "torch.cuda.empty_cache() inside the training loop",
            "empty_cache() releases the caching allocator's free blocks to the driver; the next step has to "
            "cudaMalloc them again, which synchronizes the device and slows every step. It does not make "
            "more memory available to PyTorch itself.",
            check_empty_cache_in_loop,
        ),
    ]
}
