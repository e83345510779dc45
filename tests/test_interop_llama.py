"""Hugging Face Llama (model/hf_llama.py): a rope + RMSNorm + SwiGLU model exports as LlamaForCausalLM with equal
logits (GQA, tied or not, with or without biases), comes back with identical weights, and a Llama made by
transformers imports with equal logits."""
from __future__ import annotations

import pytest
import torch

from data.hf_tokenizer import write_hf_tokenizer
from data.tokenizers import CharTokenizer
from model.checkpoint import Checkpoint, model_state
from model.hf_folder import choose_arch, export_hf, load_hf
from model.hf_llama import RMS_EPS
from tests.inference_fixtures import TEXT, tiny_model
from tests.interop_fixtures import same_logits

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")
LLAMA = dict(positions="rope", norm="rmsnorm", mlp="swiglu", bias=False)
TOKENIZER = CharTokenizer.from_text(TEXT)


def llama_model(**overrides):
    return tiny_model(vocab_size=TOKENIZER.vocab_size, **{**LLAMA, **overrides})


@pytest.mark.parametrize("arch", [dict(), dict(n_kv_head=2), dict(n_kv_head=1, tie_embeddings=False),
                                  dict(bias=True, d_ff=48, rope_base=500.0), dict(attention="manual")])
def test_llama_shaped_model_exports_as_llama_with_equal_logits_and_comes_back_identical(tmp_path, arch):
    model = llama_model(**arch)
    assert export_hf(Checkpoint(model, TOKENIZER, {}, tmp_path), tmp_path / "hf") == "llama"
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert type(hf).__name__ == "LlamaForCausalLM"
    assert hf.config.num_key_value_heads == model.config.kv_heads
    assert same_logits(hf, model, TOKENIZER.vocab_size) < 1e-4
    back = load_hf(tmp_path / "hf")
    ours, theirs = model_state(model), model_state(back.model)
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert back.model.config == model.config and back.tokenizer.chars == TOKENIZER.chars


def test_llama_made_by_transformers_imports_with_equal_logits(tmp_path):
    cfg = transformers.LlamaConfig(vocab_size=TOKENIZER.vocab_size, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=32, rms_norm_eps=RMS_EPS, tie_word_embeddings=False)
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # norms away from 1, so a dropped norm weight would show
        for p in hf.parameters():
            p.add_(0.05 * torch.randn_like(p))
    hf.save_pretrained(tmp_path)
    write_hf_tokenizer(TOKENIZER, tmp_path, 32)
    ckpt = load_hf(tmp_path)
    assert ckpt.model.config.kv_heads == 2 and ckpt.model.config.d_ff == 64
    assert same_logits(hf, ckpt.model, TOKENIZER.vocab_size) < 1e-4


def test_llama_with_another_norm_epsilon_is_refused_by_name(tmp_path):
    cfg = transformers.LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, rms_norm_eps=1e-5)
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="rms_norm_eps"):
        load_hf(tmp_path)


def test_what_llama_cannot_express_is_named():
    model = llama_model(qk_norm=True, mlp="relu2")
    with pytest.raises(ValueError, match=r"not a Llama-shaped model: mlp = 'relu2'.*qk_norm = True"):
        choose_arch(model.config, "llama")
    assert choose_arch(model.config) == "attngpt"
    assert choose_arch(llama_model().config) == "llama"
