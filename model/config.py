"""The `model` section: every architectural choice of the GPT, validated with messages that name the key."""
from __future__ import annotations

from dataclasses import dataclass

NORMS = ("layernorm", "rmsnorm")
POSITIONS = ("learned", "rope", "sinusoidal")
MLPS = ("gelu", "gelu_exact", "swiglu", "relu2", "relu")
ATTENTIONS = ("sdpa", "manual", "additive")


@dataclass
class ModelConfig:
    vocab_size: int = 0  # 0 = take it from the prepared data's meta.json
    block_size: int = 256  # longest context the model sees
    n_layer: int = 6
    n_head: int = 6
    n_kv_head: int = 0  # key/value heads for grouped-query attention; 0 = n_head, 1 = multi-query
    n_embd: int = 384
    d_ff: int = 0  # hidden width of the FFN; 0 = 4 * n_embd (swiglu: 8/3 * n_embd rounded up to 64)
    dropout: float = 0.0
    bias: bool = True  # biases in linear layers and norms
    norm: str = "layernorm"  # layernorm | rmsnorm
    positions: str = "learned"  # learned | rope | sinusoidal
    rope_base: float = 10000.0
    mlp: str = "gelu"  # gelu (tanh form, GPT-2) | gelu_exact (erf, nanoGPT) | swiglu | relu2 | relu
    attention: str = "sdpa"  # sdpa (fused kernel) | manual (explicit formula) | additive (Bahdanau)
    scaled: bool = True  # divide scores by sqrt(d_k); off only to study saturation
    qk_norm: bool = False  # normalise q and k per head before the dot product
    tie_embeddings: bool = True  # share the token embedding with the LM head
    zero_init_proj: bool = False  # start residual projections at zero (modded-nanogpt)
    logit_softcap: float = 0.0  # tanh soft-cap on the logits; 0 = off

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def ffn_hidden(self) -> int:
        if self.d_ff:
            return self.d_ff
        if self.mlp == "swiglu":  # keep the parameter count of a 4x GELU FFN
            return (int(8 * self.n_embd / 3) + 63) // 64 * 64
        return 4 * self.n_embd

    def validate(self) -> None:
        """Raise ValueError('model.KEY: why') on the first bad value."""
        for key in ("block_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, key) < 1:
                raise ValueError(f"model.{key}: {getattr(self, key)} must be >= 1")
        for key in ("vocab_size", "n_kv_head", "d_ff"):
            if getattr(self, key) < 0:
                raise ValueError(f"model.{key}: {getattr(self, key)} must be >= 0")
        if self.n_embd % self.n_head:
            raise ValueError(f"model.n_embd: {self.n_embd} is not divisible by model.n_head = {self.n_head}")
        if self.n_head % self.kv_heads:
            raise ValueError(f"model.n_kv_head: model.n_head = {self.n_head} is not divisible by {self.kv_heads}")
        if self.positions == "rope" and self.head_dim % 2:
            raise ValueError(f"model.positions: rope needs an even head size, got {self.head_dim}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"model.dropout: {self.dropout} must lie in [0, 1)")
        if self.logit_softcap < 0:
            raise ValueError(f"model.logit_softcap: {self.logit_softcap} must be >= 0")
        if self.rope_base <= 0:
            raise ValueError(f"model.rope_base: {self.rope_base} must be > 0")
        for key, allowed in (("norm", NORMS), ("positions", POSITIONS), ("mlp", MLPS), ("attention", ATTENTIONS)):
            if getattr(self, key) not in allowed:
                raise ValueError(f"model.{key}: {getattr(self, key)!r} is not one of {', '.join(allowed)}")
