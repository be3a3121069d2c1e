"""`sdpa`: attention written by hand as `F.scaled_dot_product_attention` (its forward rewritten).

- **In the trial**: attention written by hand in a module's `forward` runs as one
  `F.scaled_dot_product_attention` call where the numbers say it computes the same. The source says only
  *where* a candidate is: a product of two tensors (`q @ k.transpose(...)`, `torch.matmul`, `torch.bmm`,
  `.matmul`, an `einsum`), any statements, a softmax of it over a dimension (a function, a method, a module
  of its own; cast after or not), a dropout, the weights multiplied with the values (`@`, `matmul`, `bmm`,
  `einsum`, inline with the softmax or not). At the model's first call the model runs once more on its
  batch (no grad, every module in eval, the random state put back) and each candidate's input is kept; on
  it, in float32 and in the dtype the step runs in (autocast):
    - a probe before the softmax reads q, k and the scores; the scores are read as a scale (a number,
      fitted) times q·kᵀ plus a mask (the positions at -1e3 or below): `is_causal=True` where they are the
      strict upper triangle for the sequence length, else the mask the source writes (`masked_fill`, `+`,
      `+=`, `torch.where`, under an `if` or not: boolean or additive, padding masks included);
    - `scale=` where the scale read is not 1/sqrt(d) (the source's own expression, else the number),
      `dropout_p=self.drop.p if self.training else 0.0` from the dropout;
    - the forward with the call runs on the same input and is compared with the original, within a
      tolerance per dtype; applied only where they agree (tests/test_attention_corpus.py: 25 spellings from
      nanoGPT, minGPT, Hugging Face's GPT-2, BERT and Llama, timm, whisper, x-transformers, fairseq, ...).
- **Proposed when**: attention by hand is ≥ 5% of the step (`advisor analyze` names its share); compute
  binds. `advisor analyze` of the sdpa trial also lists each attention module its check found, rewritable
  (the form read) or why not (the number).
- **Not applicable**: scores that are not a scale of q·kᵀ plus a mask (a relative position bias, ALiBi, a
  soft-cap: "they differ from 0.3568·q·kᵀ by up to 2.76 where they take part"); a fused call that differs
  from the original by more than the tolerance (the largest difference, the mask's shape); a forward that
  reads the weights or scores after the softmax (returns or keeps them); a dropout that is not
  `nn.Dropout`; no attention written by hand (`nn.MultiheadAttention` and SDPA calls are fused already); a
  class of an installed package; a model the check cannot run again on its first batch.
- **The patch writes**: the attention's lines in the module's `forward` replaced by the statements the trial
  ran (names the mask reads, then the one call; recorded in its trial.json), split to the file's width.
"""

from advisor.knobs.knob import AT_FIRST_CALL, FLAG, FROM_TRIAL, MODEL, Knob, Written

KNOB = Knob("sdpa", FLAG, MODEL, AT_FIRST_CALL, "scaled_dot_product_attention", advice="sdpa", spread=(0.15, 0.15),
            written=Written(FROM_TRIAL, record="attention_plan"),
            on_model="advisor.trials.interposition.fused_attention:AttentionRewrite")
