"""nanoGPT checkpoints in (model/nanogpt.py): equal logits, its meta.pkl vocabulary, no code run from either file."""
from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

from model.nanogpt import load_nanogpt, read_nanogpt_meta
from tests.inference_fixtures import run_script, tiny_model
from tests.interop_fixtures import Payload, same_logits

pytestmark = pytest.mark.usefixtures("one_thread")


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
    with pytest.raises(ValueError, match="meta_path: .*no meta.pkl beside it"):
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


def test_convert_to_hf_and_from_nanogpt(tmp_path):
    chars = sorted(set("hello world\n!"))
    path, model = nanogpt_checkpoint(tmp_path, len(chars), compiled=True)
    write_meta(tmp_path / "meta.pkl", chars)
    res = run_script("scripts.convert", "from-nanogpt", "--src", str(path), "--out", str(tmp_path / "ours"))
    assert res.returncode == 0, res.stderr
    res = run_script("scripts.convert", "to-hf", "--ckpt", str(tmp_path / "ours"), "--out", str(tmp_path / "hf"))
    assert res.returncode == 0, res.stderr
    transformers = pytest.importorskip("transformers")
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    assert hf.config.activation_function == "gelu"  # nanoGPT's erf GELU survives the round trip
    assert same_logits(hf, model, len(chars)) < 1e-5
    again = run_script("scripts.convert", "to-hf", "--ckpt", str(tmp_path / "ours"), "--out", str(tmp_path / "hf"))
    assert again.returncode == 2 and again.stderr.startswith("error: --out") and len(again.stderr.splitlines()) == 1
