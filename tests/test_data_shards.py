"""data.shards: the shard writer's files hold exactly the tokens written, in order, in little-endian, split at
shard_tokens, and a shard only appears under its name once it is whole."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from data.atomic import is_temp_name
from data.shards import SHARD_RE, ShardWriter, shard_name, tokens_on_disk


def read_all(folder: Path, names: list[str], dtype: str) -> np.ndarray:
    return np.concatenate([np.fromfile(folder / n, dtype=np.dtype(dtype).newbyteorder("<")) for n in names])


@pytest.mark.parametrize("dtype, top", [("uint16", 2 ** 16 - 1), ("uint32", 2 ** 32 - 1)])
def test_round_trip_across_writes_and_shard_boundaries(tmp_path, dtype, top):
    rng = np.random.default_rng(0)
    pieces = [rng.integers(0, top, n, dtype=np.int64) for n in (3, 0, 10, 1, 7)]  # 21 tokens, one empty write
    pieces[0][0] = top  # the largest value the dtype holds survives
    w = ShardWriter(tmp_path, "train", dtype, shard_tokens=5)
    for p in pieces:
        w.write(p)
    names = w.close()
    assert names == [shard_name("train", i) for i in range(5)] and all(SHARD_RE.match(n) for n in names)
    assert [tokens_on_disk(tmp_path / n, dtype) for n in names] == [5, 5, 5, 5, 1]
    assert w.total == 21 and np.array_equal(read_all(tmp_path, names, dtype), np.concatenate(pieces))
    assert (tmp_path / names[0]).stat().st_size == 5 * np.dtype(dtype).itemsize


def test_bytes_are_little_endian_whatever_the_input_order(tmp_path):
    w = ShardWriter(tmp_path, "val", "uint16", shard_tokens=10)
    w.write(np.array([1, 258], dtype=">u2"))  # big-endian input
    assert (tmp_path / w.close()[0]).read_bytes() == b"\x01\x00\x02\x01"


def test_an_exact_multiple_opens_no_empty_shard(tmp_path):
    w = ShardWriter(tmp_path, "train", "uint16", shard_tokens=4)
    w.write(np.arange(8))
    assert w.close() == ["train_0000.bin", "train_0001.bin"] and sorted(p.name for p in tmp_path.iterdir()) == \
        ["train_0000.bin", "train_0001.bin"]
    empty = ShardWriter(tmp_path / "none", "val", "uint16", shard_tokens=4)
    assert empty.close() == [] and empty.total == 0


def test_a_shard_being_written_has_no_final_name_and_abort_leaves_only_finished_ones(tmp_path):
    w = ShardWriter(tmp_path, "train", "uint32", shard_tokens=4)
    w.write(np.arange(6))  # one full shard, one half
    present = sorted(p.name for p in tmp_path.iterdir())  # hidden temporaries sort first
    assert present[1] == "train_0000.bin" and len(present) == 2 and is_temp_name(present[0])
    assert tokens_on_disk(tmp_path / "train_0001.bin", "uint32") == -1
    w.abort()
    assert [p.name for p in tmp_path.iterdir()] == ["train_0000.bin"]
    assert np.array_equal(np.fromfile(tmp_path / "train_0000.bin", dtype="<u4"), np.arange(4))
