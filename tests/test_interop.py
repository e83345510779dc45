"""GPT-2 interop: HF GPT-2 in and out with equal logits, nanoGPT ckpt.pt in, and no code run from any file read.

The Hugging Face side is built from a random small GPT2Config: no download.
"""
from __future__ import annotations

import builtins
import json
import pickle
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from data.tokenizers import CharTokenizer, gpt2_tokenizer
from model.checkpoint import Checkpoint, model_state
from model.interop import export_hf, load_any, load_hf_gpt2, load_nanogpt, read_nanogpt_meta
from tests.inference_fixtures import one_thread, run_script, tiny_model  # noqa: F401 - fixture

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")


def hf_model(vocab: int = 300, **kw):
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


@pytest.mark.parametrize("kw", [dict(), dict(n_inner=40), dict(tie_word_embeddings=False)])
def test_hf_gpt2_folder_loads_with_equal_logits(tmp_path, kw):
    hf = hf_model(vocab=50257, **kw)
    hf.save_pretrained(tmp_path)
    ckpt = load_hf_gpt2(tmp_path)
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
        load_hf_gpt2(tmp_path)
    assert not marker.exists()


def test_hf_folder_of_unknown_vocabulary_is_refused(tmp_path):
    hf_model(vocab=300).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="vocab_size 300"):
        load_hf_gpt2(tmp_path)


def test_non_gpt2_hf_settings_are_refused(tmp_path):
    hf_model(activation_function="relu").save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="activation_function"):
        load_hf_gpt2(tmp_path)


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
        export_hf(Checkpoint(model, CharTokenizer(["a"]), {}, tmp_path), tmp_path / "hf")


# --- nanoGPT ----------------------------------------------------------------------------------------------------------

def nanogpt_checkpoint(tmp_path: Path, vocab: int, compiled: bool, bias: bool = True) -> tuple[Path, torch.nn.Module]:
    """A ckpt.pt laid out as nanoGPT's train.py writes it (model_args, model, optimizer, iter_num, ...)."""
    model = tiny_model(vocab_size=vocab, bias=bias, mlp="gelu_exact")  # nanoGPT's MLP uses erf GELU
    prefix = "_orig_mod." if compiled else ""
    state = {f"{prefix}{k if k == 'lm_head.weight' else 'transformer.' + k.replace('blocks.', 'h.')}": v
             for k, v in model.state_dict().items()}
    state.update({f"{prefix}transformer.h.{i}.attn.bias": torch.tril(torch.ones(1, 1, 32, 32)) for i in range(2)})
    args = dict(n_layer=2, n_head=4, n_embd=32, block_size=32, bias=bias, vocab_size=vocab, dropout=0.0)
    path = tmp_path / "ckpt.pt"
    torch.save({"model": state, "model_args": args, "optimizer": {"state": {}}, "iter_num": 5,
                "best_val_loss": torch.tensor(1.5), "config": {"dataset": "shakespeare_char"}}, path)
    return path, model


def write_meta(path: Path, chars: list[str]) -> None:
    with open(path, "wb") as f:
        pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)),
                     "stoi": {c: i for i, c in enumerate(chars)}}, f)


@pytest.mark.parametrize("compiled, bias", [(True, False), (False, True)])
def test_nanogpt_checkpoint_with_meta_pkl(tmp_path, compiled, bias):
    chars = sorted(set("hello world\n!"))
    path, model = nanogpt_checkpoint(tmp_path, len(chars), compiled, bias)
    write_meta(tmp_path / "meta.pkl", chars)
    ckpt = load_nanogpt(path)
    idx = torch.randint(0, len(chars), (2, 16))
    with torch.no_grad():
        assert torch.allclose(ckpt.model(idx)[0], model(idx)[0], atol=1e-6)
    assert ckpt.tokenizer.chars == chars and ckpt.config["data"]["tokenizer"] == "char"
    assert ckpt.model.config.mlp == "gelu_exact"


def test_nanogpt_gpt2_vocab_without_meta_uses_gpt2_bpe(tmp_path):
    path, _ = nanogpt_checkpoint(tmp_path, 50304, compiled=True)
    assert load_nanogpt(tmp_path).tokenizer.name == "gpt2"  # the out_dir works too


def test_nanogpt_small_vocab_without_meta_is_refused(tmp_path):
    path, _ = nanogpt_checkpoint(tmp_path, 13, compiled=False)
    with pytest.raises(ValueError, match="--meta"):
        load_nanogpt(path)


def test_meta_pkl_that_would_run_code_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    with open(tmp_path / "meta.pkl", "wb") as f:
        pickle.dump({"itos": {0: "a"}, "x": Payload(marker)}, f)
    with pytest.raises(ValueError, match="refusing"):
        read_nanogpt_meta(tmp_path / "meta.pkl")
    assert not marker.exists()


def test_ckpt_pt_that_would_run_code_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    torch.save({"model": {}, "model_args": {}, "x": Payload(marker)}, tmp_path / "ckpt.pt")
    with pytest.raises(ValueError, match="not a loadable nanoGPT checkpoint"):
        load_nanogpt(tmp_path / "ckpt.pt")
    assert not marker.exists()


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


def test_convert_to_hf_and_from_nanogpt(tmp_path):
    chars = sorted(set("hello world\n!"))
    path, model = nanogpt_checkpoint(tmp_path, len(chars), compiled=True)
    write_meta(tmp_path / "meta.pkl", chars)
    res = run_script("scripts.convert", "from-nanogpt", "--src", str(path), "--out", str(tmp_path / "ours"))
    assert res.returncode == 0, res.stderr
    res = run_script("scripts.convert", "to-hf", "--ckpt", str(tmp_path / "ours"), "--out", str(tmp_path / "hf"))
    assert res.returncode == 0, res.stderr
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    assert hf.config.activation_function == "gelu"  # nanoGPT's erf GELU survives the round trip
    assert same_logits(hf, model, len(chars)) < 1e-5
    again = run_script("scripts.convert", "to-hf", "--ckpt", str(tmp_path / "ours"), "--out", str(tmp_path / "hf"))
    assert again.returncode == 2 and again.stderr.startswith("error: --out") and len(again.stderr.splitlines()) == 1
