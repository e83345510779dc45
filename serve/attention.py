"""The page's "why this token?": the attention of the position that produced a token, with the inspector's head
labels. It reuses the inspector's capture (hooks on `blocks.{i}.attn.hook_pattern`, the induction probe) and its
statistics; the engine runs it between two steps, so only the request that asks pays for it.
"""
from __future__ import annotations

import torch
from torch import nn

from inspector.capture import capture_attention, token_strings
from inspector.report import capture, stats_of

MAX_CAPTURE = 512  # the last this many tokens of the context: full [L, H, T, T] patterns grow as T^2


def attention_of(model: nn.Module, tokenizer, ids: list[int]) -> dict:
    """For context `ids` (the tokens before the one asked about): the last position's attention over the context,
    per layer and head ([L][H][T], rounded), the context's tokens, and per head the inspector's scores and label
    (measured on this context and the induction probe)."""
    ids = ids[-MAX_CAPTURE:]
    if len(ids) >= 2:
        cap = capture(model, tokenizer, ids)
        rows, heads = cap.weights[:, :, -1, :], stats_of(cap)
    else:  # one token attends to itself; there is no pattern to score
        _, w = capture_attention(model, torch.tensor([ids], device=next(model.parameters()).device))
        rows, heads = w[:, 0, :, -1, :].numpy(), []
    return {"tokens": token_strings(tokenizer, ids), "token_ids": ids,
            "n_layer": int(rows.shape[0]), "n_head": int(rows.shape[1]),
            "weights": [[[round(float(x), 4) for x in head] for head in layer] for layer in rows],
            "heads": heads}
