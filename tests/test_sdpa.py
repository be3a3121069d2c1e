"""The `sdpa` knob: attention written by hand, rewritten into F.scaled_dot_product_attention, computes the same
outputs and gradients (per supported form), refuses what it cannot prove the same, and reports it."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from advisor.analysis.analyze import analyze_file, diagnosis_to_dict
from advisor.trials.interposition.fused_attention import FusedAttention
from advisor.trials.interposition.attention_source import Candidate, Refusal, find_attention, statements
from conftest import ROOT, gpu_trace

HEADER = '''
import math
import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, width=32, heads=4, context=16, dropout=0.0):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.drop = nn.Dropout(dropout)
        self.p = dropout
        self.scale = 0.3
        self.register_buffer("mask", torch.tril(torch.ones(context, context)).view(1, 1, context, context))
        self.register_buffer("upper", torch.triu(torch.ones(context, context, dtype=torch.bool), diagonal=1))
        self.register_buffer("pad", torch.rand(context, context) > 0.7)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in self.qkv(x).split(c, 2))
'''

# Each supported form: the attention lines of the forward, ending in `y` (batch, heads, t, head width).
FORMS = {
    "causal buffer, dropout module, 1/sqrt(d)": '''
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        att = att.masked_fill(self.mask[:, :, :t, :t] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = self.drop(att)
        y = att @ v
''',
    "nanoGPT's scale, strict upper buffer, in-place fill": '''
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att.masked_fill_(self.upper[:t, :t], float("-inf"))
        att = att.softmax(dim=-1)
        y = att @ v
''',
    "inline tril, torch.matmul, scale of its own, F.dropout": '''
        scores = torch.matmul(q, k.transpose(-1, -2))
        scores = scores * self.scale
        scores = scores.masked_fill(torch.tril(torch.ones(t, t, device=x.device)) == 0, -1e9)
        weights = torch.softmax(scores, -1)
        weights = F.dropout(weights, p=self.p, training=self.training)
        y = torch.matmul(weights, v)
''',
    "no mask, no scale, product inside an expression": '''
        att = q @ k.mT
        att = F.softmax(att, dim=-1)
        y = (att @ v).contiguous()
''',
    "another boolean mask (padding)": '''
        att = q @ k.transpose(-2, -1) / k.shape[-1] ** 0.5
        att = att.masked_fill(self.pad[:t, :t], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v
''',
}
FOOTER = '''        return y.transpose(1, 2).reshape(b, t, c)
'''


def load(tmp_path: Path, body: str, name: str) -> type:
    """The Attention class of a file written with `body` as its attention lines."""
    path = tmp_path / f"{name}.py"
    path.write_text(HEADER + textwrap.indent(textwrap.dedent(body), " " * 8) + FOOTER)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module.Attention


def outputs_and_gradients(model: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """The output and the gradients of the input and every parameter, for one backward of a fixed loss."""
    x = x.clone().requires_grad_(True)
    model.zero_grad()
    y = model(x)
    (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
    return [y.detach(), x.grad, *(p.grad for p in model.parameters())]


@pytest.mark.parametrize("form", sorted(FORMS))
def test_each_supported_form_computes_the_same_outputs_and_gradients(tmp_path, form):
    cls = load(tmp_path, FORMS[form], f"attention_{abs(hash(form))}")
    torch.manual_seed(0)
    model = cls().double()  # float64: the two computations agree to rounding, not to float32's noise
    x = torch.randn(3, 12, 32, dtype=torch.float64)
    before = outputs_and_gradients(model, x)
    fused = FusedAttention()
    fused.apply(model, (x,))
    assert fused.outcome() == "applied", fused.refused
    assert "scaled_dot_product_attention" in fused.plans[0]["statement"]
    after = outputs_and_gradients(model, x)
    for a, b in zip(before, after):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)
    fused.undo()
    assert "scaled_dot_product_attention" not in str(cls.forward.__code__.co_names)


def test_causal_masks_become_is_causal_and_other_masks_attn_mask(tmp_path):
    kinds = {form: FusedAttention() for form in FORMS}
    for form, fused in kinds.items():
        fused.apply(load(tmp_path, FORMS[form], f"kind_{abs(hash(form))}")(), (torch.randn(2, 16, 32),))
    statement = {form: fused.plans[0]["statement"] for form, fused in kinds.items()}
    assert "is_causal=True" in statement["causal buffer, dropout module, 1/sqrt(d)"]
    assert "is_causal=True" in statement["nanoGPT's scale, strict upper buffer, in-place fill"]
    assert "is_causal=True" in statement["inline tril, torch.matmul, scale of its own, F.dropout"]
    assert "attn_mask=self.pad[:t, :t].logical_not()" in statement["another boolean mask (padding)"]
    assert "scale=" not in statement["causal buffer, dropout module, 1/sqrt(d)"]
    assert "scale=self.scale" in statement["inline tril, torch.matmul, scale of its own, F.dropout"]
    assert "scale=1.0" in statement["no mask, no scale, product inside an expression"]


def test_dropout_p_is_passed_in_training_and_zero_in_eval(tmp_path):
    cls = load(tmp_path, FORMS["causal buffer, dropout module, 1/sqrt(d)"], "attention_dropout")
    torch.manual_seed(0)
    model = cls(dropout=0.5).double()
    x = torch.randn(2, 8, 32, dtype=torch.float64)
    model.eval()
    reference = model(x)
    fused = FusedAttention()
    fused.apply(model, (x,))
    assert "dropout_p=self.drop.p if self.training else 0.0" in fused.plans[0]["statement"]
    torch.testing.assert_close(model(x), reference)  # eval: no dropout, the same numbers
    model.train()
    first, second = model(x), model(x)
    assert not torch.allclose(first, reference) and not torch.allclose(first, second)  # dropped, anew each call
    fused.undo()


def test_a_buffer_that_is_not_a_triangle_is_passed_as_a_mask_not_as_causal(tmp_path):
    cls = load(tmp_path, FORMS["causal buffer, dropout module, 1/sqrt(d)"], "attention_not_causal")
    torch.manual_seed(0)
    model = cls().double()
    model.mask.copy_(torch.rand_like(model.mask) > 0.3)
    model.mask[..., 0] = 1  # every row keeps a position: no row of -inf alone
    x = torch.randn(2, 16, 32, dtype=torch.float64)
    before = outputs_and_gradients(model, x)
    fused = FusedAttention()
    fused.apply(model, (x,))
    assert "attn_mask=" in fused.plans[0]["statement"] and "is_causal" not in fused.plans[0]["statement"]
    for a, b in zip(before, outputs_and_gradients(model, x)):
        torch.testing.assert_close(a, b)
    fused.undo()


def test_weights_read_after_the_softmax_are_not_applicable_with_the_reason(tmp_path):
    body = FORMS["causal buffer, dropout module, 1/sqrt(d)"] + "        self.last_weights = att\n"
    fused = FusedAttention()
    fused.apply(load(tmp_path, body, "attention_returns_weights")(), (torch.randn(2, 16, 32),))
    outcome = fused.outcome()
    assert outcome.startswith("not applicable") and "read after the softmax" in outcome
    assert "attention_returns_weights.py:" in outcome and not fused.plans


def test_a_bias_added_to_the_scores_is_not_applicable_with_its_size(tmp_path):
    body = FORMS["no mask, no scale, product inside an expression"].replace(
        "att = F.softmax", "att = att + self.pad[:t, :t]\n        att = F.softmax")
    fused = FusedAttention()
    fused.apply(load(tmp_path, body, "attention_additive")(), (torch.randn(2, 16, 32),))
    # The boolean buffer added to the scores is a bias of 0 or 1, not a mask: read from the numbers, and named.
    outcome = fused.outcome()
    assert "not a scale of q·kᵀ plus a mask" in outcome and not fused.plans
    assert 0.5 < float(outcome.split("by up to ")[1].split()[0]) < 2  # the bias of 1, less what the fitted scale took


def test_torch_attention_and_models_without_attention_are_not_applicable():
    fused = FusedAttention()
    fused.apply(torch.nn.Sequential(torch.nn.MultiheadAttention(16, 2), torch.nn.Linear(16, 4)))
    assert fused.outcome().startswith("not applicable: no attention written by hand")


def test_the_source_finder_returns_none_candidate_or_refusal():
    """The source says only where a candidate is; the statement is written from what the trial reads."""
    plain = "def forward(self, x):\n    return self.proj(x)\n"
    assert find_attention(plain) is None
    source = textwrap.dedent('''
        def forward(self, q, k, v):
            w = F.softmax(q @ k.transpose(-2, -1), dim=-1)
            return w @ v
    ''').lstrip()
    assert find_attention(source) is None  # the scores are not a statement of their own
    returned = textwrap.dedent('''
        def forward(self, q, k, v):
            s = q @ k.transpose(-2, -1)
            w = s.softmax(-1)
            return w @ v, w
    ''').lstrip()
    assert isinstance(find_attention(returned), Refusal)
    found = find_attention(returned.replace("w @ v, w", "w @ v"))
    assert isinstance(found, Candidate) and (found.first_line, found.last_line) == (2, 4)
    assert statements(found, "torch.nn.functional", "1.0", False) == [
        "return torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=1.0)"]


def test_the_gpt_examples_attention_is_rewritten():
    spec = importlib.util.spec_from_file_location("gpt_example", ROOT / "examples" / "gpt.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    model = module.GPT(64, 16, width=32, layers=2, heads=2, dropout=0.0).double()
    tokens = torch.randint(0, 64, (2, 16))
    before = model(tokens)
    fused = FusedAttention()
    fused.apply(model, (tokens,))
    plan = fused.plans[0]
    assert plan["class"] == "CausalSelfAttention" and plan["form"].startswith("causal mask")
    assert plan["last_line"] - plan["first_line"] == 4
    torch.testing.assert_close(model(tokens), before)
    fused.undo()


def test_attention_share_on_gpu_traces_by_hand_and_by_implementation():
    figures = {}
    for name in ("h200-gpt-attention-by-hand", "h200-gpt-attention-sdpa", "h100-char-transformer-bf16",
                 "h100-char-transformer-fp32", "resnet50-v100-workers0"):
        diagnosis = analyze_file(gpu_trace(f"{name}.pt.trace.json.gz"))
        figures[name] = (diagnosis_to_dict(diagnosis)["attention"], [r.id for r in diagnosis.recommendations])
    hand, advice = figures["h200-gpt-attention-by-hand"]
    assert hand["implementations"] == ["hand-written"] and hand["per_step"] == 4 and hand["fused_share"] == 0
    assert 0.05 < hand["hand_written_share"] == hand["share"] < 1 and "sdpa" in advice
    fused, advice = figures["h200-gpt-attention-sdpa"]
    assert fused["implementations"] == ["cuDNN"] and fused["hand_written_share"] == 0 and "sdpa" not in advice
    assert fused["ms_per_step"] < hand["ms_per_step"] / 2  # the fused kernels: a fraction of the time by hand
    assert figures["h100-char-transformer-bf16"][0]["implementations"] == ["cuDNN"]
    assert figures["h100-char-transformer-fp32"][0]["implementations"] == ["memory-efficient"]
    assert figures["resnet50-v100-workers0"][0] is None  # no attention: no figure
