"""ShardLoader: shapes and shift, determinism from (seed, split, step, micro_step, rank, world_size), ranks that
split one global batch, windows across shard boundaries, and clear errors."""
from __future__ import annotations

import string
from pathlib import Path

import numpy as np
import pytest
import torch

from data.config import DataConfig
from data.loader import ShardLoader
from data.prepare import prepare

B, T = 4, 16


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("loader")
    text = root / "digits.txt"
    rng = np.random.default_rng(0)  # no period: a window read from a wrong offset cannot match by accident
    text.write_text("".join(rng.choice(list(string.ascii_lowercase), 5000)))
    # small shards, so many windows straddle a shard boundary
    return prepare(DataConfig(source="files", path=str(text), dir=str(root / "out"), shard_tokens=37), verbose=False)


@pytest.fixture(scope="module")
def stream(folder) -> np.ndarray:
    """The whole train split as one array, read independently of the loader."""
    names = sorted(folder.glob("train_*.bin"))
    assert len(names) > 100
    return np.concatenate([np.fromfile(n, dtype=np.uint16) for n in names]).astype(np.int64)


def test_batch_shape_dtype_and_shift(folder):
    x, y = ShardLoader(folder, "train", B, T, seed=1).get_batch(0)
    assert x.shape == y.shape == (B, T) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])


def test_windows_are_real_slices_of_the_split_even_across_shards(folder, stream):
    loader = ShardLoader(folder, "train", 64, T, seed=3)
    for step in range(5):
        x, y = loader.get_batch(step)
        for row, start in zip(range(64), loader.offsets(step)):
            assert x[row].tolist() == stream[start:start + T].tolist()
            assert y[row].tolist() == stream[start + 1:start + T + 1].tolist()
    assert loader.n_tokens == len(stream)


def test_same_arguments_same_batch_in_a_fresh_loader(folder):
    a = ShardLoader(folder, "train", B, T, seed=7, micro_steps=4)
    b = ShardLoader(folder, "train", B, T, seed=7, micro_steps=4)
    b.get_batch(99)  # consuming other batches first changes nothing: no hidden state
    for step, micro in [(0, 0), (5, 0), (5, 1), (1234, 3)]:
        assert torch.equal(a.get_batch(step, micro)[0], b.get_batch(step, micro)[0])


def test_step_micro_step_seed_and_split_change_the_batch(folder):
    base = ShardLoader(folder, "train", B, T, seed=7, micro_steps=2).get_batch(5, 0)[0]
    assert not torch.equal(base, ShardLoader(folder, "train", B, T, seed=7, micro_steps=2).get_batch(6, 0)[0])
    assert not torch.equal(base, ShardLoader(folder, "train", B, T, seed=7, micro_steps=2).get_batch(5, 1)[0])
    assert not torch.equal(base, ShardLoader(folder, "train", B, T, seed=8).get_batch(5, 0)[0])
    assert not torch.equal(base, ShardLoader(folder, "val", B, T, seed=7).get_batch(5, 0)[0])


def test_ranks_get_different_windows_that_together_make_the_single_process_batch(folder):
    world, micro = 3, 2
    ranks = [ShardLoader(folder, "train", B, T, seed=11, rank=r, world_size=world, micro_steps=micro)
             for r in range(world)]
    single = ShardLoader(folder, "train", B * world * micro, T, seed=11)
    accumulating = ShardLoader(folder, "train", B, T, seed=11, micro_steps=world * micro)  # one process, more micro
    for step in (0, 17):
        parts = [ranks[r].get_batch(step, m) for m in range(micro) for r in range(world)]
        whole = single.get_batch(step, 0)[0]
        assert torch.equal(torch.cat([p[0] for p in parts]), whole)
        assert torch.equal(torch.cat([accumulating.get_batch(step, m)[0] for m in range(world * micro)]), whole)
        assert not torch.equal(parts[0][0], parts[1][0])
        starts = [tuple(r.offsets(step, 1).tolist()) for r in ranks]
        assert len(set(starts)) == world
    with pytest.raises(ValueError, match="micro_step in 0..1"):
        ranks[0].get_batch(0, 2)


def test_device_argument(folder):
    """A device other than the default proves the loader moves its batches (meta needs no GPU)."""
    x, y = ShardLoader(folder, "val", B, T, seed=0, device="meta").get_batch(0)
    assert x.device.type == y.device.type == "meta" and x.shape == y.shape == (B, T)


def test_cuda_batches_are_pinned_and_copied_without_blocking(folder, monkeypatch):
    """Faked on CPU: every batch for a CUDA device goes through pinned memory and a non-blocking copy."""
    calls: list = []

    def pin_memory(self, *args):
        calls.append("pin")
        return self

    def to(self, device, *args, non_blocking=False, **kwargs):
        calls.append((torch.device(device), non_blocking))
        return self

    loader = ShardLoader(folder, "train", B, T, seed=3, device="cuda:1")
    expected = ShardLoader(folder, "train", B, T, seed=3).get_batch(2)
    monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)
    monkeypatch.setattr(torch.Tensor, "to", to)
    x, y = loader.get_batch(2)
    monkeypatch.undo()
    assert calls == ["pin", (torch.device("cuda", 1), True)] * 2
    assert torch.equal(x, expected[0]) and torch.equal(y, expected[1])


def test_batches_come_in_step_order_one_fetch_ahead(folder, monkeypatch):
    loader = ShardLoader(folder, "train", B, T, seed=5, micro_steps=3)
    fetched: list = []
    original = loader.get_batch
    monkeypatch.setattr(loader, "get_batch",
                        lambda step, micro=0: fetched.append((step, micro)) or original(step, micro))
    batches = loader.batches(7)
    assert fetched == [(7, 0)]  # the first fetch happens at the call
    first = next(batches)
    assert fetched == [(7, 0), (7, 1)]  # the next batch is on its way before the first is used
    got = [first] + [next(batches) for _ in range(4)]
    order = [(7, 0), (7, 1), (7, 2), (8, 0), (8, 1)]
    for (x, y), (step, micro) in zip(got, order):
        ex, ey = original(step, micro)
        assert torch.equal(x, ex) and torch.equal(y, ey)
    with pytest.raises(ValueError, match="micro_steps must be >= 1"):
        ShardLoader(folder, "train", B, T, seed=5, micro_steps=0)


@pytest.mark.parametrize("kwargs, message", [
    ({"split": "test"}, "split: 'test' is not one of train, val"),
    ({"block_size": 10_000}, "fewer than block_size"),
    ({"rank": 2, "world_size": 2}, "rank 2 is not in"),
    ({"batch_size": 0}, "must be >= 1"),
])
def test_bad_arguments(folder, kwargs, message):
    args = {"split": "train", "batch_size": B, "block_size": T, "seed": 0, **kwargs}
    with pytest.raises(ValueError, match=message):
        ShardLoader(folder, **args)


def test_missing_or_truncated_shards_are_reported(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("abcdefghij" * 100)
    out = prepare(DataConfig(source="files", path=str(text), dir=str(tmp_path / "o")), verbose=False)
    shard = out / "train_0000.bin"
    shard.write_bytes(shard.read_bytes()[:-2])
    with pytest.raises(ValueError, match="meta.json says 900; run python -m scripts.prepare again"):
        ShardLoader(out, "train", B, T, seed=0)
    shard.unlink()
    with pytest.raises(ValueError, match="shard train_0000.bin is missing"):
        ShardLoader(out, "train", B, T, seed=0)
    with pytest.raises(ValueError, match="no meta.json"):
        ShardLoader(tmp_path, "train", B, T, seed=0)
