"""The decoder-only GPT: embeddings and positions, a stack of blocks, final norm, LM head."""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from model.attention import rope_tables
from model.config import ModelConfig
from model.layers import Block, make_norm, sinusoidal_table
from model.linear import Linear
from model.loss import chunked_cross_entropy, chunked_loss_pays, logits_cross_entropy


class GPT(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        config.validate()
        if config.vocab_size < 1:
            raise ValueError("model.vocab_size: must be set (>= 1) before building a model")
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        if config.positions == "learned":
            self.wpe = nn.Embedding(config.block_size, config.n_embd)
        elif config.positions == "sinusoidal":
            self.register_buffer("pos_table", sinusoidal_table(config.block_size, config.n_embd), persistent=False)
        else:
            cos, sin = rope_tables(config.head_dim, config.block_size, config.rope_base)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = make_norm(config)
        self.lm_head = Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        self.activation_checkpointing = False  # set_activation_checkpointing: recompute blocks in backward
        self.reset_parameters()

    def set_activation_checkpointing(self, on: bool = True) -> "GPT":
        """Keep only each block's input through the forward and recompute its insides during backward: activation
        memory drops from every intermediate of every block to one [B, T, C] tensor per block, for about one more
        forward of compute. The RNG state is saved and replayed, so dropout draws the same masks (same losses)."""
        self.activation_checkpointing = on
        return self

    def reset_parameters(self) -> None:
        """GPT-2 init: N(0, 0.02) everywhere, residual projections scaled by 1/sqrt(2 * n_layer) (or zero)."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                if self.config.zero_init_proj:
                    nn.init.zeros_(p)
                else:
                    nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * self.config.n_layer))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, cache=None, logits_to_keep: int = 0,
                return_logits: bool = True) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """idx [B, T] -> (logits [B, T, vocab], mean cross-entropy or None). Targets of -1 are ignored.

        With a KV cache, idx holds only the new tokens; their positions start at `cache.pos`.
        `logits_to_keep` > 0 (as in Hugging Face) computes logits for the last that many positions only: a prefill
        then skips a [T, n_embd] x [n_embd, vocab] product it would throw away. Ignored when targets are given.
        `return_logits=False` with targets (the training step) returns (None, loss), so no [B, T, vocab] logits
        outlive the call. On CPU the loss is then computed chunk by chunk without ever holding them (model/loss.py);
        on CUDA and under torch.compile, from full logits with the fused cross-entropy (`chunked_loss_pays`).
        """
        B, T = idx.shape
        start = cache.pos if cache is not None else 0
        rows = isinstance(start, torch.Tensor)  # one start per row (kv_cache.RowKVCache): positions [B, T]
        end = int(start.max()) + T if rows else start + T
        if end > self.config.block_size:
            raise ValueError(f"sequence of {end} tokens exceeds block_size {self.config.block_size}")
        pos = start.view(-1, 1) + torch.arange(T, device=idx.device) if rows else slice(start, start + T)
        x = self.wte(idx)
        rope = None
        if self.config.positions == "learned":
            x = x + (self.wpe(pos) if rows else self.wpe(torch.arange(start, start + T, device=idx.device)))
        elif self.config.positions == "sinusoidal":
            # as in the original paper: embeddings scaled by sqrt(d_model) so the fixed table does not drown them
            x = x * math.sqrt(self.config.n_embd) + self.pos_table[pos]
        else:
            rope = (self.rope_cos[pos], self.rope_sin[pos])
            if rows:  # [B, T, d/2] -> [B, 1, T, d/2], broadcast over heads
                rope = (rope[0].unsqueeze(1), rope[1].unsqueeze(1))
        x = self.drop(x)
        recompute = self.activation_checkpointing and cache is None and torch.is_grad_enabled()
        for i, block in enumerate(self.blocks):
            if recompute:
                x = checkpoint(block, x, rope=rope, layer=i, use_reentrant=False)
            else:
                x = block(x, rope=rope, cache=cache, layer=i)
        if cache is not None:
            cache.advance(T)
        if logits_to_keep and targets is None:
            x = x[:, -logits_to_keep:]
        x = self.ln_f(x)
        keep_logits = targets is None or return_logits
        if not keep_logits and chunked_loss_pays(x):
            return None, chunked_cross_entropy(x, self.lm_head.weight, targets, softcap=self.config.logit_softcap)
        logits = self.lm_head(x)
        if self.config.logit_softcap:
            cap = self.config.logit_softcap
            logits = cap * torch.tanh(logits / cap)
        loss = None
        if targets is not None:
            loss = logits_cross_entropy(logits, targets)
        return (logits if keep_logits else None), loss

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameters, counting a tied matrix once; non_embedding drops the token and position tables."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.wte.weight.numel()
            if hasattr(self, "wpe"):
                n -= self.wpe.weight.numel()
        return n

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs per token (forward + backward): 6 per matmul weight plus 12 * L * T * C for attention.

        Lookup tables do no multiply-adds, but a tied table is also the head, which does.
        """
        c = self.config
        t = seq_len or c.block_size
        matmul = self.num_params(non_embedding=True)  # the blocks, and the head when it has its own matrix
        if c.tie_embeddings:
            matmul += c.vocab_size * c.n_embd  # the shared table multiplies as the head
        return 6.0 * matmul + 12.0 * c.n_layer * t * c.n_embd
