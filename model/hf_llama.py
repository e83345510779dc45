"""Hugging Face Llama (`LlamaForCausalLM`): config and weights both ways, and what a Llama cannot express.

A Llama is attngpt with rotary positions, RMSNorm, SwiGLU and dot-product attention scaled by 1/sqrt(d_k), with or
without grouped-query attention. The layouts line up without permutation: both rotate the two halves of a head
vector (HF's `rotate_half`), query heads are consecutive rows of the projection, and a key/value head serves
n_head / n_kv_head consecutive query heads. Only the fused matrices are cut: `c_attn` into q/k/v, and SwiGLU's
`c_fc` into gate (first half) and up (second half).
"""
from __future__ import annotations

import torch

from model.checkpoint import model_state
from model.config import ModelConfig
from model.gpt import GPT

MODEL_TYPE, ARCHITECTURE = "llama", "LlamaForCausalLM"
# nn.RMSNorm without eps uses the dtype's machine epsilon; in float32 that is this
RMS_EPS = torch.finfo(torch.float32).eps
_RENAMES = {"ln_1": "input_layernorm", "ln_2": "post_attention_layernorm", "attn.c_proj": "self_attn.o_proj",
            "mlp.c_proj": "mlp.down_proj"}


def problems(config: ModelConfig) -> list[str]:
    """Every setting of `config` that LlamaForCausalLM cannot express (empty: it can)."""
    wrong = [f"{key} = {getattr(config, key)!r} (Llama: {want!r})" for key, want in
             (("positions", "rope"), ("norm", "rmsnorm"), ("mlp", "swiglu"), ("qk_norm", False),
              ("scaled", True), ("logit_softcap", 0.0)) if getattr(config, key) != want]
    if config.attention == "additive":
        wrong.append("attention = 'additive' (Llama uses dot-product attention)")
    return wrong


def hf_config(config: ModelConfig, tokenizer) -> dict:
    """config.json of the LlamaForCausalLM that computes what a GPT of `config` computes."""
    eot = tokenizer.eot_id if tokenizer.eot_id is not None and tokenizer.eot_id < config.vocab_size else None
    rope = {"rope_type": "default", "rope_theta": config.rope_base}
    return {"model_type": MODEL_TYPE, "architectures": [ARCHITECTURE], "vocab_size": config.vocab_size,
            "hidden_size": config.n_embd, "intermediate_size": config.ffn_hidden,
            "num_hidden_layers": config.n_layer, "num_attention_heads": config.n_head,
            "num_key_value_heads": config.kv_heads, "head_dim": config.head_dim, "hidden_act": "silu",
            "max_position_embeddings": config.block_size, "rms_norm_eps": RMS_EPS,
            "rope_parameters": rope, "rope_theta": config.rope_base,  # the second for transformers 4.x readers
            "attention_bias": config.bias, "mlp_bias": config.bias, "attention_dropout": config.dropout,
            "tie_word_embeddings": config.tie_embeddings, "bos_token_id": eot, "eos_token_id": eot,
            "pretraining_tp": 1, "initializer_range": 0.02, "use_cache": True}


def config_from_hf(hf: dict, source: str = "config.json") -> ModelConfig:
    """ModelConfig from an HF LlamaConfig dict; settings we cannot reproduce exactly are refused by name."""
    if hf.get("model_type") != MODEL_TYPE:
        raise ValueError(f"{source}: model_type {hf.get('model_type')!r} is not llama")
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    checks = [("hidden_act", hf.get("hidden_act", "silu"), "silu"),
              ("rope type", rope.get("rope_type", rope.get("type", "default")), "default"),
              ("pretraining_tp", hf.get("pretraining_tp", 1), 1),
              ("mlp_bias", bool(hf.get("mlp_bias", False)), bool(hf.get("attention_bias", False)))]
    for key, got, want in checks:
        if got != want:
            raise ValueError(f"{source}: {key} = {got!r} is not supported (attngpt needs {want!r})")
    if abs(float(hf.get("rms_norm_eps", 1e-6)) - RMS_EPS) > 1e-12:
        raise ValueError(f"{source}: rms_norm_eps {hf.get('rms_norm_eps', 1e-6)} differs from attngpt's {RMS_EPS:.3g}")
    try:
        n_embd, n_head = int(hf["hidden_size"]), int(hf["num_attention_heads"])
        if int(hf.get("head_dim") or n_embd // n_head) * n_head != n_embd:
            raise ValueError("head_dim * num_attention_heads must equal hidden_size")
        return ModelConfig(vocab_size=int(hf["vocab_size"]), block_size=int(hf.get("max_position_embeddings", 2048)),
                           n_layer=int(hf["num_hidden_layers"]), n_head=n_head,
                           n_kv_head=int(hf.get("num_key_value_heads") or n_head), n_embd=n_embd,
                           d_ff=int(hf["intermediate_size"]), bias=bool(hf.get("attention_bias", False)),
                           norm="rmsnorm", positions="rope", mlp="swiglu",
                           rope_base=float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
                           tie_embeddings=bool(hf.get("tie_word_embeddings", False)))
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{source}: not a usable Llama config ({e})") from None


def _hf_name(key: str) -> str:
    if key in ("wte.weight", "ln_f.weight"):
        return "model." + {"wte.weight": "embed_tokens.weight", "ln_f.weight": "norm.weight"}[key]
    if key == "lm_head.weight":
        return key
    _, layer, rest = key.split(".", 2)
    for ours, theirs in _RENAMES.items():
        if rest.startswith(ours + "."):
            rest = theirs + rest[len(ours):]
    return f"model.layers.{layer}.{rest}"


def state_to_hf(model: GPT) -> dict[str, torch.Tensor]:
    """attngpt weights as a LlamaForCausalLM state dict (the tied head is left out, as HF saves it)."""
    c = model.config
    q, kv, hidden = c.n_head * c.head_dim, c.kv_heads * c.head_dim, c.ffn_hidden
    out = {}
    for key, value in model_state(model).items():
        name = _hf_name(key)
        if ".attn.c_attn." in key:
            prefix, kind = name.rsplit(".attn.c_attn.", 1)
            for part, piece in zip(("q", "k", "v"), value.split([q, kv, kv])):
                out[f"{prefix}.self_attn.{part}_proj.{kind}"] = piece.contiguous()
        elif ".mlp.c_fc." in key:
            prefix, kind = name.rsplit(".mlp.c_fc.", 1)
            for part, piece in zip(("gate", "up"), value.split([hidden, hidden])):
                out[f"{prefix}.mlp.{part}_proj.{kind}"] = piece.contiguous()
        else:
            out[name] = value
    return out


def state_from_hf(state: dict[str, torch.Tensor], config: ModelConfig, source: str) -> dict[str, torch.Tensor]:
    """HF Llama weights in attngpt's names: q/k/v fused into c_attn, gate and up into c_fc."""
    ours = {}
    for key, value in state.items():
        name = key.removeprefix("model.")
        if name.endswith("rotary_emb.inv_freq"):  # a buffer older exports carry; recomputed from rope_theta
            continue
        if name in ("embed_tokens.weight", "norm.weight", "lm_head.weight"):
            ours[{"embed_tokens.weight": "wte.weight", "norm.weight": "ln_f.weight"}.get(name, name)] = value
            continue
        parts = name.split(".")
        if parts[0] != "layers" or len(parts) < 4:
            raise ValueError(f"{source}: unexpected Llama weight {key}")
        rest = ".".join(parts[2:])
        for ours_name, theirs in _RENAMES.items():
            if rest.startswith(theirs + "."):
                rest = ours_name + rest[len(theirs):]
        ours[f"blocks.{parts[1]}.{rest}"] = value
    for i in range(config.n_layer):
        for kind in ("weight", "bias"):
            _fuse(ours, f"blocks.{i}.self_attn.", ("q_proj", "k_proj", "v_proj"), f"blocks.{i}.attn.c_attn.", kind)
            _fuse(ours, f"blocks.{i}.mlp.", ("gate_proj", "up_proj"), f"blocks.{i}.mlp.c_fc.", kind)
    return ours


def _fuse(state: dict, prefix: str, parts: tuple[str, ...], target: str, kind: str) -> None:
    keys = [f"{prefix}{p}.{kind}" for p in parts]
    if all(k in state for k in keys):
        state[target + kind] = torch.cat([state.pop(k) for k in keys]).contiguous()
