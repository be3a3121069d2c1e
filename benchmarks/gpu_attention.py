"""The sdpa knob on a GPU, as one prepared run: examples/gpt.py's model trained with its attention written by
hand and with the `sdpa` rewrite (`advisor.trials.interposition.fused_attention`), in fp32 and bf16 autocast.

Prints per setting: ms per step (CUDA events, after warm-up), peak allocated memory, the first losses without
dropout (hand and fused must agree within float tolerance); writes one profiled trace of each form
(`--out`), whose attention share `advisor analyze` reads. Needs torch only (no advisor dependencies).

    python benchmarks/gpu_attention.py --out /tmp/traces
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from advisor.trials.interposition.fused_attention import FusedAttention  # noqa: E402


def gpt_module():
    """examples/gpt.py as a module."""
    spec = importlib.util.spec_from_file_location("gpt_example", ROOT / "examples" / "gpt.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def train(gpt, device, fused: bool, amp: bool, steps: int, args, dropout: float, profile_to: Path | None = None):
    """(ms per step, peak bytes, losses) of `steps` steps after 3 warm-up steps."""
    torch.manual_seed(0)
    model = gpt.GPT(args.vocab, args.context, width=args.width, layers=4, heads=args.heads, dropout=dropout).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    attention = FusedAttention()
    if fused:
        attention.apply(model)
        assert attention.outcome() == "applied", attention.outcome()
    generator = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, args.vocab, (args.batch, args.context + 1), generator=generator).to(device)
               for _ in range(4)]
    losses = []

    def step(i):
        tokens = batches[i % len(batches)]
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss

    for i in range(3):
        losses.append(step(i).item())
    torch.cuda.synchronize() if device.type == "cuda" else None
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.Event(enable_timing=True) if device.type == "cuda" else None
    end = torch.cuda.Event(enable_timing=True) if device.type == "cuda" else None
    if start is not None:
        start.record()
    for i in range(steps):
        step(i)
    if end is not None:
        end.record()
        torch.cuda.synchronize()
    ms = start.elapsed_time(end) / steps if start is not None and steps else float("nan")  # 0 steps: losses only
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else 0
    if profile_to is not None:
        activities = [torch.profiler.ProfilerActivity.CPU] + (
            [torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with torch.profiler.profile(activities=activities, record_shapes=True, profile_memory=True,
                                    schedule=torch.profiler.schedule(wait=0, warmup=1, active=2, repeat=1),
                                    on_trace_ready=lambda p: p.export_chrome_trace(str(profile_to))) as prof:
            for i in range(3):
                step(i)
                prof.step()
    attention.undo()
    return ms, peak, losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    print(f"device {name}, torch {torch.__version__}, batch {args.batch}, context {args.context}, width {args.width}")
    gpt = gpt_module()
    for amp in (False, True):
        exact = [train(gpt, device, fused, amp, 0, args, 0.0)[2] for fused in (False, True)]
        print(f"{'bf16' if amp else 'fp32'} losses without dropout: hand {exact[0]} fused {exact[1]}")
        for fused in (False, True):
            label = f"{'sdpa' if fused else 'hand'}-{'bf16' if amp else 'fp32'}"
            trace = args.out / f"gpt-{label}.pt.trace.json" if amp else None
            ms, peak, _ = train(gpt, device, fused, amp, args.steps, args, 0.1, trace)
            print(f"{label}: {ms:.2f} ms/step, peak {peak / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
