"""Hugging Face GPT-2 (model/hf_gpt2.py through model/hf_folder.py): in and out with equal logits, no code run
from any file read. The Hugging Face side is built from a random small GPT2Config: no download.
"""
from __future__ import annotations

import json

import pytest
import torch

from data.tokenizers import CharTokenizer, gpt2_tokenizer
from model.checkpoint import Checkpoint, load_any
from model.hf_folder import export_hf, load_hf
from tests.inference_fixtures import run_script, tiny_model
from tests.interop_fixtures import Payload, hf_model, same_logits

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("kw", [dict(), dict(n_inner=40), dict(tie_word_embeddings=False)])
def test_hf_gpt2_folder_loads_with_equal_logits(tmp_path, kw):
    hf = hf_model(vocab=50257, **kw)
    hf.save_pretrained(tmp_path)
    ckpt = load_hf(tmp_path)
    assert same_logits(hf, ckpt.model, 50257) < 1e-5 and ckpt.tokenizer.name == "gpt2"
    assert ckpt.model.config.tie_embeddings == kw.get("tie_word_embeddings", True)


def test_pytorch_model_bin_with_old_hub_names_and_mask_buffers(tmp_path):
    hf = hf_model(vocab=50257)
    state = {k.removeprefix("transformer."): v for k, v in hf.state_dict().items()}
    for i in range(2):  # what the original hub checkpoints carry besides weights
        state[f"h.{i}.attn.bias"] = torch.tril(torch.ones(1, 1, 24, 24))
        state[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    torch.save(state, tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_text(json.dumps(hf.config.to_dict()))
    ckpt = load_any(tmp_path)
    assert same_logits(hf, ckpt.model, 50257) < 1e-5
    assert ckpt.tokenizer.name == "gpt2"


def test_pickled_code_in_pytorch_model_bin_is_refused(tmp_path):
    hf_model().save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    marker = tmp_path / "pwned"
    torch.save({"transformer.wte.weight": Payload(marker)}, tmp_path / "pytorch_model.bin")
    with pytest.raises(ValueError, match="unreadable weights"):
        load_hf(tmp_path)
    assert not marker.exists()


def test_hf_folder_of_unknown_vocabulary_is_refused(tmp_path):
    hf_model(vocab=300).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="no tokenizer.json says which tokenizer"):
        load_hf(tmp_path)


def test_non_gpt2_hf_settings_are_refused(tmp_path):
    hf_model(activation_function="relu").save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="activation_function"):
        load_hf(tmp_path)


@pytest.mark.parametrize("arch", [dict(), dict(bias=False), dict(tie_embeddings=False, d_ff=48), dict(scaled=False)])
def test_export_loads_in_transformers_with_equal_logits(tmp_path, arch):
    model = tiny_model(vocab_size=300, block_size=24, **arch)
    export_hf(Checkpoint(model, CharTokenizer([chr(i) for i in range(300, 600)]), {}, tmp_path), tmp_path / "hf")
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    assert same_logits(hf, model, 300) < 1e-5
    back = load_any(tmp_path / "hf")  # our own tokenizer travels with the export
    assert back.tokenizer.vocab_size == 300 and same_logits(hf, back.model, 300) < 1e-5


def test_export_with_gpt2_tokenizer_writes_files_transformers_tokenizes_with(tmp_path):
    model = tiny_model(vocab_size=50257, block_size=24)
    export_hf(Checkpoint(model, gpt2_tokenizer(), {}, tmp_path), tmp_path / "hf")
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    text = "Hello world, naïve café 🙂"
    assert hf_tok(text)["input_ids"] == gpt2_tokenizer().encode(text)
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["eos_token_id"] == 50256


def test_export_refuses_models_gpt2_cannot_express(tmp_path):
    model = tiny_model(positions="rope", n_kv_head=2)
    with pytest.raises(ValueError, match="positions.*n_kv_head"):
        export_hf(Checkpoint(model, CharTokenizer(["a"]), {}, tmp_path), tmp_path / "hf", arch="gpt2")
    assert not (tmp_path / "hf").exists()


# --- the convert script, end to end ------------------------------------------------------------------------------------

def test_convert_from_hf_then_sample_with_gpt2_bpe_matches_transformers(tmp_path):
    hf = hf_model(vocab=50257)
    hf.save_pretrained(tmp_path / "hf")
    res = run_script("scripts.convert", "from-hf", "--src", str(tmp_path / "hf"), "--out", str(tmp_path / "ours"))
    assert res.returncode == 0, res.stderr
    res = run_script("scripts.sample", "--ckpt", str(tmp_path / "ours"), "--prompt", "Hello, world",
                     "--temperature", "0", "--max-new-tokens", "12", "--no-echo")
    assert res.returncode == 0, res.stderr
    tok = gpt2_tokenizer()
    ids = torch.tensor([tok.encode("Hello, world")])
    out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, min_new_tokens=12,
                      do_sample=False, pad_token_id=0)
    assert res.stdout == tok.decode(out[0, ids.size(1):].tolist()) + "\n"


def test_folder_of_an_architecture_we_do_not_read_is_one_line_naming_it(tmp_path):
    hf_model().save_pretrained(tmp_path / "hf")
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**cfg, "model_type": "mistral"}))
    res = run_script("scripts.convert", "from-hf", "--src", str(tmp_path / "hf"), "--out", str(tmp_path / "ours"))
    assert res.returncode == 2 and len(res.stderr.splitlines()) == 1
    assert "model_type 'mistral' is not one of gpt2, llama, attngpt" in res.stderr
    assert not (tmp_path / "ours").exists()
