"""The attngpt architecture inside Hugging Face transformers: a config class and a causal-LM class around `GPT`.

This module is the last part of the `modeling_attngpt.py` that `model/hf_attngpt.py` writes into an export folder;
the model code it uses is copied in front of it there, so the folder loads with
`AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)` and no attngpt install. Generation recomputes
the whole window at every step (the model keeps no transformers cache), so `use_cache` is off.
"""
from __future__ import annotations

from dataclasses import fields

import torch
import torch.nn.functional as F
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from model.attention import rope_tables
from model.config import ModelConfig
from model.gpt import GPT
from model.layers import sinusoidal_table


class AttnGPTConfig(PretrainedConfig):
    """Holds attngpt's ModelConfig as the dict `attngpt`, beside the usual transformers names."""

    model_type = "attngpt"


def attngpt_model_config(config: PretrainedConfig) -> ModelConfig:
    saved = getattr(config, "attngpt", None) or {}
    known = {f.name for f in fields(ModelConfig)}
    return ModelConfig(**{key: value for key, value in saved.items() if key in known})


class AttnGPTForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = AttnGPTConfig
    base_model_prefix = "transformer"
    _no_split_modules = ["Block"]
    _tied_weights_keys = {"transformer.lm_head.weight": "transformer.wte.weight"}

    def __init__(self, config: AttnGPTConfig):
        super().__init__(config)
        self.transformer = GPT(attngpt_model_config(config))
        self.post_init()

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.transformer.wte

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.transformer.lm_head

    @torch.no_grad()
    def _init_weights(self, module: torch.nn.Module) -> None:
        """Weights come from the checkpoint (or GPT's own init); only the position tables, which are not saved,
        are rebuilt here, because transformers creates the model on the meta device first."""
        if not isinstance(module, GPT):
            return
        c = module.config
        if c.positions == "rope":
            cos, sin = rope_tables(c.head_dim, c.block_size, c.rope_base)
            module.rope_cos.copy_(cos)
            module.rope_sin.copy_(sin)
        elif c.positions == "sinusoidal":
            module.pos_table.copy_(sinusoidal_table(c.block_size, c.n_embd))

    def forward(self, input_ids: torch.LongTensor | None = None, attention_mask: torch.Tensor | None = None,
                labels: torch.LongTensor | None = None, logits_to_keep: int = 0, **kwargs) -> CausalLMOutputWithPast:
        """Logits (and, with labels, HF's shifted cross-entropy). Other generation arguments are accepted and
        unused: positions always start at 0 and there is no cache."""
        if input_ids is None:
            raise ValueError("attngpt: input_ids are required (inputs_embeds are not supported)")
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError("attngpt: padded batches are not supported; pass one prompt at a time")
        logits, _ = self.transformer(input_ids, logits_to_keep=logits_to_keep if labels is None else 0)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.size(-1)),
                                   labels[:, 1:].reshape(-1), ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits)
