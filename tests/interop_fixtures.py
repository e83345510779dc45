"""Helpers for the interop tests: a random small HF GPT-2, a logits comparison, a pickle that would run code."""
from __future__ import annotations

import builtins
from pathlib import Path

import torch


def hf_model(vocab: int = 300, **kw):
    import transformers

    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=16, vocab_size=vocab, n_positions=24, bos_token_id=None,
                                  eos_token_id=None, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **kw)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # biases and norms away from their init, so a dropped bias would show
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def same_logits(hf, ours, vocab: int) -> float:
    idx = torch.randint(0, vocab, (2, 20))
    with torch.no_grad():
        return (hf(idx).logits - ours(idx)[0]).abs().max().item()


class Payload:
    """Unpickling this creates a file: proof that code ran."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return builtins.open, (str(self.marker), "w")
