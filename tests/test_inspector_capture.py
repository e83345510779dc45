"""Capture through the hook points of the real GPT: shapes, causal distributions, no side effects."""
import json

import matplotlib.figure
import pytest
import torch

from data.tokenizers import CharTokenizer
from inspector.capture import capture_attention, hook_points, token_strings
from inspector.report import capture, inspect_attention, probe_attention
from inspector.stats import label_head
from model.config import ModelConfig
from model.gpt import GPT
from model.text_stream import encode_prompt

TEXT = "ROMEO:\nBut soft, what light through yonder window breaks?\n"


def tiny(**overrides) -> GPT:
    torch.manual_seed(0)
    cfg = dict(vocab_size=60, block_size=96, n_layer=2, n_head=3, n_embd=24)
    cfg.update(overrides)
    return GPT(ModelConfig(**cfg)).eval()


def no_hooks(model: GPT) -> bool:
    return all(not p._forward_hooks and not p._forward_pre_hooks for p in hook_points(model).values())


@pytest.fixture(scope="module")
def tok():
    return CharTokenizer(sorted(set(TEXT + "abcdefghijklmnopqrstuvwxyz ")))


@pytest.mark.parametrize("overrides", [{}, {"n_kv_head": 1, "positions": "rope"}, {"attention": "additive"}])
def test_weights_are_causal_distributions(overrides):
    model = tiny(**overrides)
    idx = torch.randint(0, 60, (2, 17))
    logits, w = capture_attention(model, idx)
    assert w.shape == (2, 2, 3, 17, 17) and w.dtype == torch.float32
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 2, 3, 17))
    assert torch.all(w.triu(diagonal=1) == 0)  # exactly zero, not merely small
    assert logits.shape == (2, 17, 60)


def test_capture_leaves_outputs_and_hooks_as_they_were():
    model = tiny()
    idx = torch.randint(0, 60, (1, 20))
    with torch.no_grad():
        before, _ = model(idx)
    assert no_hooks(model)
    logits, _ = capture_attention(model, idx)
    assert no_hooks(model)
    with torch.no_grad():
        after, _ = model(idx)
    torch.testing.assert_close(after, before, rtol=0, atol=0)  # the fused path again, bit for bit
    torch.testing.assert_close(logits, before, rtol=1e-4, atol=1e-5)  # the explicit path computes the same thing


def test_hooks_are_removed_when_the_forward_fails():
    model = tiny()
    with pytest.raises(ValueError, match="block_size"):
        capture_attention(model, torch.zeros(1, 97, dtype=torch.long))
    assert no_hooks(model)


def test_only_the_chosen_layers_are_hooked():
    model = tiny(n_layer=3)
    _, w = capture_attention(model, torch.randint(0, 60, (1, 8)), layers=[2])
    assert w.shape == (1, 1, 3, 8, 8)
    with pytest.raises(ValueError, match="out of range"):
        capture_attention(model, torch.randint(0, 60, (1, 8)), layers=[3])


def test_capture_selects_heads_and_measures_induction(tok):
    model = tiny().train()
    ids = encode_prompt(tok, TEXT)
    cap = capture(model, tok, ids, layers=[1], heads=[0, 2])
    assert model.training  # put back as it was found
    assert cap.weights.shape == (1, 2, len(ids), len(ids))
    assert tok.vocab_size == 36  # the random block is capped at the vocabulary, so its tokens are distinct
    assert cap.repeat_weights.shape == (1, 2, 72, 72)
    assert cap.repeat_ids[:36] == cap.repeat_ids[36:] and len(set(cap.repeat_ids)) == 36
    assert cap.tokens == list(TEXT) and cap.layers == [1] and cap.heads == [0, 2]
    with pytest.raises(ValueError, match="^heads: 3 out of range 0..2"):
        capture(model, tok, ids, heads=[3])
    with pytest.raises(ValueError, match="at least 2 tokens"):
        capture(model, tok, ids[:1])


def test_prompt_errors_are_one_line_value_errors(tok, tmp_path):
    model = tiny()
    with pytest.raises(ValueError, match="^prompt: empty prompt"):
        inspect_attention(model, tok, "", tmp_path)
    with pytest.raises(ValueError, match="^prompt: cannot be tokenized.*not in the char vocabulary"):
        inspect_attention(model, tok, "naïve", tmp_path)
    with pytest.raises(ValueError, match="^prompt: 1 token: attention needs at least 2 tokens"):
        inspect_attention(model, tok, "a", tmp_path)
    assert not list(tmp_path.iterdir())  # refused before anything was written
    assert token_strings(tok, tok.encode("a\nb")) == ["a", "\n", "b"]


def test_probe_for_the_trainer(tok, tmp_path):
    model = tiny().train()
    result = probe_attention(model, tok, TEXT, out_dir=tmp_path / "step_100", max_tokens=30)
    assert model.training
    assert len(result["stats"]) == 6
    assert all(s["label"] == label_head(s) for s in result["stats"])  # each label follows from that head's scores
    saved = json.loads((tmp_path / "step_100" / "head_stats.json").read_text())["heads"]
    assert [(s["layer"], s["head"], s["label"]) for s in saved] == [(s["layer"], s["head"], s["label"])
                                                                    for s in result["stats"]]
    assert set(result["scalars"]) >= {"attn/max_induction", "attn/max_prev_token"}
    assert 0 <= result["scalars"]["attn/max_induction"] <= 1
    assert isinstance(result["figure"], matplotlib.figure.Figure)
    names = sorted(p.name for p in (tmp_path / "step_100").iterdir())
    assert names == ["attention_grid.png", "head_scores.png", "head_stats.csv", "head_stats.json"]
    assert (tmp_path / "step_100" / "attention_grid.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
