"""`suggested.patch`: a session's final `Knobs` as a change to the user's script, as a unified diff.

Trials apply knobs by interposition; this package writes the same changes into the user's source, with
libcst (a concrete syntax tree: formatting and comments survive), and diffs the result against the
original so that `patch -p1` or `git apply` applies it. Torch is never imported. `facts` reads what the
script defines, `loaders` rewrites DataLoader arguments, `step` and `step_body` rewrite the step
function, `plan` decides which files change and diffs them; `syntax` holds the small node edits.

What the patched script looks like, per knob:

- DataLoader knobs: each `DataLoader(...)` call gets the knob's value. A literal argument is replaced;
  a missing one is added as a keyword; a positional `batch_size` is replaced in place. An argument that
  is a name is followed to where its value is written: a module-level constant (`BATCH = 32`) or an
  argparse default (`parser.add_argument("--batch-size", default=32)` for `args.batch_size`) is changed
  there, when that literal is the value the trial saw. Otherwise the argument becomes a literal and the
  statement ends with `# advisor: was <expression>`. `persistent_workers=True` and `prefetch_factor`
  need worker processes: with a literal worker count of 0 they are left out; with a worker count known
  only at run time they are written as `persistent_workers=args.num_workers > 0` and
  `prefetch_factor=4 if args.num_workers > 0 else None`.
- `amp`: the target's body (its docstring aside) goes under
  `with torch.autocast(device_type=..., dtype=torch.bfloat16):` (fp16: `device_type="cuda"`,
  `torch.float16`), from the first statement up to, not including, the first statement that calls
  `.backward(`: backward runs outside autocast, as the PyTorch AMP docs advise. A body without
  `.backward(` is wrapped whole. For fp16 a module-level `scaler = torch.amp.GradScaler("cuda")` is added
  after the imports, `loss.backward()` becomes `scaler.scale(loss).backward()` and `optimizer.step()`
  becomes `scaler.step(optimizer)` with `scaler.update()` after the last optimizer step.
- `non_blocking`: in the target, `.to(<device>)` and `.cuda()` calls on tensors get `non_blocking=True`
  (dtype-only `.to(torch.float16)` and model/module receivers are left alone).
- `accumulation_steps=N` (gradient accumulation that keeps the effective batch)::

      ACCUMULATION_STEPS = N            # module level, after the imports
      accumulation_micro_step = 0

      def train_step(...):
          global accumulation_micro_step
          first_micro_step = accumulation_micro_step % ACCUMULATION_STEPS == 0
          last_micro_step = accumulation_micro_step % ACCUMULATION_STEPS == ACCUMULATION_STEPS - 1
          accumulation_micro_step += 1
          ...
          if first_micro_step:          # a zero_grad before the backward (after it: last_micro_step)
              optimizer.zero_grad()
          (loss / ACCUMULATION_STEPS).backward()
          if last_micro_step:           # optimizer (and scheduler) steps
              optimizer.step()
          return loss.detach()

  The loss is divided inside the backward call rather than reassigned, so the loss the step returns
  (and the user logs) keeps its meaning. Without an optimizer step in the target, accumulation (and
  the fp16 GradScaler) is not written: it could not be done correctly there.

A target that runs its own loop over batches gets the autocast block and the accumulation counters
inside the loop that holds the backward, once per iteration.
"""

from advisor.code.patch.plan import PATCH_NAME, Patch, plan_patch, patched_source, rewrite_step, suggest_patch, \
    write_patch

__all__ = ["PATCH_NAME", "Patch", "plan_patch", "patched_source", "rewrite_step", "suggest_patch", "write_patch"]
