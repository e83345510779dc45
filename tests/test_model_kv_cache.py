"""model.kv_cache: the batch cache (one position for every row) and RowKVCache (a length per row), each checked
on its own bookkeeping and against a plain forward over the same tokens: appending, positions, sliding windows."""
from __future__ import annotations

import pytest
import torch

from model.config import ModelConfig
from model.gpt import GPT
from model.kv_cache import KVCache, RowKVCache

ATOL = 1e-5


def model_of(positions: str = "learned") -> GPT:
    torch.manual_seed(0)
    return GPT(ModelConfig(vocab_size=23, block_size=16, n_layer=2, n_head=4, n_kv_head=2, n_embd=32,
                           positions=positions)).eval()


def last_logits(model: GPT, ids: list[int]) -> torch.Tensor:
    """The reference: the next-token logits of a forward over `ids` alone, no cache."""
    with torch.no_grad():
        return model(torch.tensor([ids]))[0][0, -1]


def test_update_appends_at_pos_and_returns_the_filled_prefix():
    cfg = ModelConfig(vocab_size=5, block_size=8, n_layer=2, n_head=2, n_embd=8)
    cache = KVCache(cfg, batch_size=3, max_len=6)
    assert cache.k.shape == (2, 3, cfg.kv_heads, 6, cfg.head_dim) and cache.pos == 0
    first = torch.randn(3, cfg.kv_heads, 4, cfg.head_dim)
    k, v = cache.update(1, first, -first)
    assert k.shape[2] == 4 and torch.equal(k, first) and torch.equal(v, -first)
    cache.advance(4)
    step = torch.randn(3, cfg.kv_heads, 1, cfg.head_dim)
    k, _ = cache.update(1, step, step)
    assert k.shape[2] == 5 and torch.equal(k[:, :, :4], first) and torch.equal(k[:, :, 4:], step)
    cache.advance(1)
    with pytest.raises(ValueError, match="holds 6 positions, asked for 7"):
        cache.update(0, torch.randn(3, cfg.kv_heads, 2, cfg.head_dim), torch.randn(3, cfg.kv_heads, 2, cfg.head_dim))
    cache.reset()
    assert cache.pos == 0 and cache.update(0, step, step)[0].shape[2] == 1


@pytest.mark.parametrize("positions", ["learned", "rope", "sinusoidal"])
def test_prefill_then_one_token_per_step_equals_a_forward_over_everything(positions):
    model = model_of(positions)
    ids = torch.randint(0, 23, (2, 12), generator=torch.Generator().manual_seed(1))
    cache = KVCache(model.config, 2)
    with torch.no_grad():
        logits, _ = model(ids[:, :5], cache=cache)
        assert cache.pos == 5  # the model advances the cache once per forward, after every layer stored its slice
        steps = [logits[:, -1]]
        for t in range(5, 12):
            steps.append(model(ids[:, t:t + 1], cache=cache)[0][:, -1])
        full, _ = model(ids)
    assert cache.pos == 12
    assert torch.allclose(torch.stack(steps[:-1], 1), full[:, 4:11], atol=ATOL)


def test_a_slid_window_refilled_from_position_zero_reads_nothing_stale():
    """The decoders' slide: reset, prefill the kept tail as a new window, continue; as if the tail were all."""
    model = model_of("learned")
    ids = list(range(1, 17))  # a full block
    cache = KVCache(model.config, 1)
    with torch.no_grad():
        model(torch.tensor([ids]), cache=cache)
        tail = ids[4:]  # drop the oldest 4
        cache.reset()
        model(torch.tensor([tail]), cache=cache)
        after = model(torch.tensor([[7]]), cache=cache)[0][0, -1]
    assert torch.allclose(after, last_logits(model, tail + [7]), atol=ATOL)


def prefill_rows(model: GPT, contexts: list[list[int]]) -> RowKVCache:
    """Each context prefilled alone and loaded into its own row, as the engine admits requests."""
    rows = RowKVCache(model.config, rows=4)
    for r, ids in enumerate(contexts):
        kv = KVCache(model.config, 1, max_len=len(ids))
        with torch.no_grad():
            model(torch.tensor([ids]), cache=kv)
        rows.load(r, kv, 0, len(ids))
    rows.live = len(contexts)
    return rows


@pytest.mark.parametrize("positions", ["learned", "rope"])
def test_rows_of_different_lengths_decode_side_by_side_each_at_its_own_position(positions):
    model = model_of(positions)
    contexts = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11]]
    rows = prefill_rows(model, contexts)
    assert rows.pos.tolist() == [3, 7, 1]
    nxt = [12, 13, 14]
    with torch.no_grad():
        logits, _ = model(torch.tensor([[t] for t in nxt]), cache=rows)
    assert rows.pos.tolist() == [4, 8, 2]  # every live row advanced by one
    mask = rows.attn_mask[:, 0, 0]
    assert mask.shape == (3, 8) and mask.sum(-1).tolist() == [4, 8, 2]  # each row sees its own keys only
    for r, ids in enumerate(contexts):
        assert torch.allclose(logits[r, -1], last_logits(model, ids + [nxt[r]]), atol=ATOL)


def test_one_row_slides_while_the_others_go_on():
    model = model_of("learned")
    contexts = [list(range(1, 17)), [2, 4, 6]]  # row 0 has filled block_size
    rows = prefill_rows(model, contexts)
    kept = contexts[0][4:]
    kv = KVCache(model.config, 1, max_len=len(kept))
    with torch.no_grad():
        model(torch.tensor([kept]), cache=kv)
        rows.load(0, kv, 0, len(kept))  # the engine's slide: row 0 alone is prefilled again from position 0
        logits, _ = model(torch.tensor([[9], [8]]), cache=rows)
    assert rows.pos.tolist() == [13, 4]
    assert torch.allclose(logits[0, -1], last_logits(model, kept + [9]), atol=ATOL)
    assert torch.allclose(logits[1, -1], last_logits(model, contexts[1] + [8]), atol=ATOL)


def test_move_packs_a_row_into_a_freed_slot_and_bad_feeds_are_refused():
    model = model_of("rope")
    contexts = [[1, 2], [3, 4, 5, 6], [7, 8, 9]]
    rows = prefill_rows(model, contexts)
    rows.move(2, 0)  # row 0 finished: the last row takes its slot
    rows.live = 2
    assert rows.pos.tolist() == [3, 4]
    with torch.no_grad():
        logits, _ = model(torch.tensor([[10], [11]]), cache=rows)
    assert torch.allclose(logits[0, -1], last_logits(model, contexts[2] + [10]), atol=ATOL)
    assert torch.allclose(logits[1, -1], last_logits(model, contexts[1] + [11]), atol=ATOL)
    c = model.config
    with pytest.raises(ValueError, match="one token for each of its 2 live rows"):
        rows.update(0, torch.zeros(3, c.kv_heads, 1, c.head_dim), torch.zeros(3, c.kv_heads, 1, c.head_dim))
    full = RowKVCache(model.config, rows=1, max_len=3)
    full.load(0, _kv(model, [1, 2, 3]), 0, 3)
    full.live = 1
    with pytest.raises(ValueError, match="holds 3 positions, asked for 4"):
        with torch.no_grad():
            model(torch.tensor([[4]]), cache=full)


def _kv(model: GPT, ids: list[int]) -> KVCache:
    kv = KVCache(model.config, 1, max_len=len(ids))
    with torch.no_grad():
        model(torch.tensor([ids]), cache=kv)
    return kv
