"""Hugging Face GPT-2 (`GPT2LMHeadModel`): config and weights both ways, and what a GPT-2 cannot express.

attngpt uses GPT-2's names under `blocks.{i}` instead of `transformer.h.{i}`. HF stores its four projections as
Conv1D, weight [in, out]; ours (and nanoGPT's) are nn.Linear, weight [out, in], so those are transposed.
"""
from __future__ import annotations

import torch

from model.checkpoint import model_state
from model.config import ModelConfig
from model.gpt import GPT

MODEL_TYPE, ARCHITECTURE = "gpt2", "GPT2LMHeadModel"
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
GPT2_VOCAB = 50257
# HF activation_function -> attngpt mlp: GPT-2's tanh GELU, or the exact erf GELU (nanoGPT-trained models)
HF_ACTIVATIONS = {"gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "gelu": "gelu_exact"}


def _to_ours(key: str) -> str | None:
    """HF/nanoGPT key -> attngpt key; None for buffers we do not keep (the causal-mask `attn.bias`)."""
    for prefix in ("_orig_mod.", "module.", "transformer."):
        key = key.removeprefix(prefix)
    parts = key.split(".")
    if len(parts) == 4 and parts[0] == "h" and parts[2] == "attn" and parts[3] in ("bias", "masked_bias"):
        return None
    if parts[0] == "h":
        parts[0] = "blocks"
    return ".".join(parts)


def state_from_external(state: dict[str, torch.Tensor], conv1d: bool) -> dict[str, torch.Tensor]:
    """An HF (conv1d=True) or nanoGPT (conv1d=False) GPT-2 state dict in attngpt's names and layouts."""
    out = {}
    for key, value in state.items():
        ours = _to_ours(key)
        if ours is None:
            continue
        if conv1d and ours.endswith(CONV1D):
            value = value.t()
        out[ours] = value.contiguous()
    return out


def state_from_hf(state: dict[str, torch.Tensor], config: ModelConfig, source: str) -> dict[str, torch.Tensor]:
    """HF GPT-2 weights for a model of `config`; the zero biases an export gave a bias-free model are dropped."""
    ours = state_from_external(state, conv1d=True)
    if not config.bias:
        for key in [k for k in ours if k.endswith(".bias")]:
            if ours[key].any():
                raise ValueError(f"{source}: {key} is not zero, but the model it was exported from has no biases")
            del ours[key]
    return ours


def state_to_hf(model: GPT) -> dict[str, torch.Tensor]:
    """attngpt weights as an HF GPT2LMHeadModel state dict; a model without biases gets zero biases (same output)."""
    state = model_state(model)
    out = {}
    for key, value in state.items():
        name = key.replace("blocks.", "h.", 1)
        if key.endswith(CONV1D):
            value = value.t()
        out[name if name == "lm_head.weight" else f"transformer.{name}"] = value.contiguous()
    if not model.config.bias:
        for key, value in list(out.items()):
            if key.endswith(".weight") and not key.endswith(("wte.weight", "wpe.weight", "lm_head.weight")):
                bias_len = value.shape[1] if key.endswith(CONV1D) else value.shape[0]
                out.setdefault(key[:-len("weight")] + "bias", torch.zeros(bias_len, dtype=value.dtype))
    return out


def config_from_hf(hf: dict, source: str = "config.json") -> ModelConfig:
    """ModelConfig from an HF GPT2Config dict; settings we cannot reproduce exactly are refused by name."""
    if hf.get("model_type") != MODEL_TYPE:
        raise ValueError(f"{source}: model_type {hf.get('model_type')!r} is not gpt2")
    activation = hf.get("activation_function", "gelu_new")
    if activation not in HF_ACTIVATIONS:
        raise ValueError(f"{source}: activation_function {activation!r} is not one of {', '.join(HF_ACTIVATIONS)}")
    for key, ok in (("scale_attn_by_inverse_layer_idx", False), ("add_cross_attention", False)):
        if hf.get(key, ok) != ok:
            raise ValueError(f"{source}: {key} = {hf[key]!r} is not supported")
    if abs(hf.get("layer_norm_epsilon", 1e-5) - 1e-5) > 1e-12:
        raise ValueError(f"{source}: layer_norm_epsilon {hf['layer_norm_epsilon']} differs from attngpt's 1e-5")
    try:
        return ModelConfig(vocab_size=int(hf["vocab_size"]), block_size=int(hf.get("n_positions", 1024)),
                           n_layer=int(hf["n_layer"]), n_head=int(hf["n_head"]), n_embd=int(hf["n_embd"]),
                           d_ff=int(hf.get("n_inner") or 0), bias=True, norm="layernorm", positions="learned",
                           mlp=HF_ACTIVATIONS[activation], scaled=bool(hf.get("scale_attn_weights", True)),
                           tie_embeddings=bool(hf.get("tie_word_embeddings", True)))
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{source}: not a usable GPT-2 config ({e})") from None


def problems(config: ModelConfig) -> list[str]:
    """Every setting of `config` that GPT2LMHeadModel cannot express (empty: it can)."""
    wrong = [f"{key} = {getattr(config, key)!r} (GPT-2: {want!r})" for key, want in
             (("positions", "learned"), ("norm", "layernorm"), ("qk_norm", False),
              ("logit_softcap", 0.0)) if getattr(config, key) != want]
    if config.mlp not in ("gelu", "gelu_exact"):
        wrong.append(f"mlp = {config.mlp!r} (GPT-2: 'gelu' or 'gelu_exact')")
    if config.kv_heads != config.n_head:
        wrong.append(f"n_kv_head = {config.n_kv_head} (GPT-2 has one key/value head per query head)")
    if config.attention == "additive":
        wrong.append("attention = 'additive' (GPT-2 uses dot-product attention)")
    return wrong


def hf_config(config: ModelConfig, tokenizer) -> dict:
    """config.json of the GPT2LMHeadModel that computes what a GPT of `config` computes."""
    eot = tokenizer.eot_id if tokenizer.eot_id is not None and tokenizer.eot_id < config.vocab_size else None
    return {"model_type": MODEL_TYPE, "architectures": [ARCHITECTURE], "vocab_size": config.vocab_size,
            "n_positions": config.block_size, "n_ctx": config.block_size, "n_embd": config.n_embd,
            "n_layer": config.n_layer, "n_head": config.n_head, "n_inner": config.d_ff or None,
            "activation_function": "gelu" if config.mlp == "gelu_exact" else "gelu_new",
            "layer_norm_epsilon": 1e-5, "resid_pdrop": config.dropout, "embd_pdrop": config.dropout,
            "attn_pdrop": config.dropout, "scale_attn_weights": config.scaled,
            "tie_word_embeddings": config.tie_embeddings, "bos_token_id": eot, "eos_token_id": eot,
            "initializer_range": 0.02, "use_cache": True}
