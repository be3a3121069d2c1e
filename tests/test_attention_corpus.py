"""The `sdpa` knob on attention as people write it: each file of tests/corpus/attention is one spelling from
public code people train with (nanoGPT, minGPT, Hugging Face's eager GPT-2, BERT and Llama, timm's ViT,
whisper, x-transformers, fairseq, ...), written small, in our own words. The run-time check is run directly on
each module and its input (no profiled session per spelling): it applies the fused call where the numbers
agree, and the module's outputs are then the same in float32 and, where the CPU computes bf16, under bf16
autocast; the forms it cannot rewrite (a position bias, ALiBi, a soft-cap, the weights read elsewhere) are
refused with the reason and, where the numbers decided it, the number."""

from __future__ import annotations

import importlib.util
import re
import sys

import pytest
import torch

from advisor.trials.interposition.fused_attention import FusedAttention
from advisor.trials.harness.trial_facts import cpu_computes_bf16
from conftest import ROOT

CORPUS = ROOT / "tests" / "corpus" / "attention"
APPLIED = "applied"
BIAS = "not a scale of q·kᵀ plus a mask"
READ_AFTER = "read after the softmax"
# Each spelling: applied with the form read from the numbers, or refused with the reason.
EXPECTED = {
    "nanogpt": (APPLIED, "causal mask, 1/sqrt(d), dropout"),
    "mingpt": (APPLIED, "causal mask, 1/sqrt(d), dropout"),
    "issue_gpt_block": (APPLIED, "causal mask, 1/sqrt(d)"),
    "hf_bert_eager": (APPLIED, "additive mask of shape (3, 1, 1, 12), 1/sqrt(d), dropout"),
    "hf_llama_eager": (APPLIED, "causal mask, 1/sqrt(d), dropout"),
    "timm_vit": (APPLIED, "no mask, scale 1, dropout"),
    "timm_vit_older": (APPLIED, "no mask, 1/sqrt(d), dropout"),
    "vit_pytorch": (APPLIED, "no mask, 1/sqrt(d), dropout"),
    "whisper_decoder_no_qk": (APPLIED, "causal mask, scale 1"),
    "x_transformers": (APPLIED, "causal mask, 1/sqrt(d)"),
    "fairseq_style_bmm": (APPLIED, "causal mask, scale 1, dropout"),
    "fairseq_mha": (APPLIED, "causal mask, scale 1, dropout"),
    "annotated_transformer": (APPLIED, "boolean mask of shape (3, 1, 1, 12), 1/sqrt(d)"),
    "llms_from_scratch": (APPLIED, "causal mask, 1/sqrt(d), dropout"),
    "method_chain": (APPLIED, "no mask, scale 0.5, dropout"),
    "ldm_cross_attention": (APPLIED, "no mask, 1/sqrt(d)"),
    "where_padding": (APPLIED, "boolean mask of shape (3, 1, 1, 12), 1/sqrt(d)"),
    "hf_gpt2_eager": ("refused", READ_AFTER),  # it returns the weights
    "whisper": ("refused", READ_AFTER),  # it returns qk.detach()
    "dino_vit": ("refused", READ_AFTER),  # it returns the weights (attention maps)
    "swin_relative_bias": ("refused", BIAS),
    "alibi": ("refused", BIAS),
    "gemma2_softcap": ("refused", BIAS),
    "t5_position_bias": ("refused", BIAS),
    "torch_multihead": ("refused", "no attention written by hand"),
}
BF16 = cpu_computes_bf16()


def spelling(name: str):
    """The corpus file `name` imported (inspect reads the forward's source from it)."""
    spec = importlib.util.spec_from_file_location(f"attention_corpus_{name}", CORPUS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def first(output):
    return output[0] if isinstance(output, tuple) else output


def test_the_corpus_is_every_file_and_at_least_twenty_spellings():
    assert sorted(p.stem for p in CORPUS.glob("*.py")) == sorted(EXPECTED)
    assert sum(outcome == APPLIED for outcome, _ in EXPECTED.values()) >= 17 and len(EXPECTED) >= 20


@pytest.mark.parametrize("name", sorted(EXPECTED))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_each_spelling_is_applied_with_the_same_outputs_or_refused_with_the_reason(name, dtype):
    if dtype == "bfloat16" and not BF16:
        pytest.skip("this CPU has no bf16 instructions: the trial proposes no bf16 autocast here (float32 checked)")
    module = spelling(name)
    torch.manual_seed(0)
    model = module.Attention().eval()
    args = module.inputs()
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16")
    fused = FusedAttention()
    with autocast, torch.no_grad():
        before = first(model(*args))
        fused.apply(model, args)
        after = first(model(*args))
    decided = fused.outcome()
    fused.undo()
    outcome, detail = EXPECTED[name]
    if outcome == APPLIED:
        assert decided == APPLIED, fused.refused
        assert fused.plans[0]["form"] == detail and "scaled_dot_product_attention" in fused.plans[0]["statement"]
        tolerance = {"float32": 1e-5, "bfloat16": 2e-2}[dtype]
        torch.testing.assert_close(after, before, rtol=tolerance, atol=tolerance)
    else:
        assert decided.startswith("not applicable") and detail in decided and not fused.plans
        if detail == BIAS:  # the number that decided it: the largest difference, above its tolerance
            largest, allowed = map(float, re.search(r"by up to (\S+) .*\(tolerance (\S+) in", decided).groups())
            assert largest > 10 * allowed


def test_a_rewritten_spelling_trains_with_the_same_gradients():
    """In training mode (the issue's GPT block has no dropout) the gradients agree too, in float64."""
    module = spelling("issue_gpt_block")
    torch.manual_seed(0)
    model = module.Attention().double()
    x = module.inputs()[0].double().requires_grad_(True)

    def gradients():
        model.zero_grad()
        x.grad = None
        (model(x) * torch.linspace(-1, 1, x.numel(), dtype=x.dtype).view_as(x)).sum().backward()
        return [x.grad.clone(), *(p.grad.clone() for p in model.parameters())]

    before = gradients()
    fused = FusedAttention()
    fused.apply(model, (x.detach(),))
    assert fused.outcome() == APPLIED, fused.refused
    for a, b in zip(before, gradients()):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)
    fused.undo()
