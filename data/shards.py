"""Token shards: raw little-endian uint16/uint32 arrays, `train_0000.bin`, `train_0001.bin`, ...

Each shard is written under a temporary name and renamed when full, and meta.json (written after the last shard)
is what makes a folder usable, so a failed or killed prepare never leaves shards that a later run would trust.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from data.atomic import AtomicFile

SHARD_RE = re.compile(r"^(train|val)_\d{4,}\.bin$")


def shard_name(split: str, index: int) -> str:
    return f"{split}_{index:04d}.bin"


def tokens_on_disk(path: Path, dtype: str) -> int:
    """How many tokens a shard file holds (-1 when it is missing)."""
    try:
        return path.stat().st_size // np.dtype(dtype).itemsize
    except FileNotFoundError:
        return -1


class ShardWriter:
    """Append token arrays; roll over to a new file every `shard_tokens` tokens."""

    def __init__(self, folder: Path, split: str, dtype: str, shard_tokens: int):
        self.folder, self.split, self.dtype, self.shard_tokens = folder, split, np.dtype(dtype), shard_tokens
        self.names: list[str] = []
        self.total = 0
        self._file: AtomicFile | None = None
        self._room = 0

    def _open(self) -> None:
        name = shard_name(self.split, len(self.names))
        self.names.append(name)
        self._file = AtomicFile(self.folder / name)
        self._room = self.shard_tokens

    def _finish(self) -> None:
        self._file.commit()
        self._file = None

    def write(self, tokens: np.ndarray) -> None:
        tokens = np.ascontiguousarray(tokens, dtype=self.dtype.newbyteorder("<"))
        while tokens.size:
            if self._file is None:
                self._open()
            take = min(self._room, tokens.size)
            self._file.file.write(tokens[:take].tobytes())
            self._room -= take
            self.total += take
            tokens = tokens[take:]
            if self._room == 0:
                self._finish()

    def close(self) -> list[str]:
        """Finish the last shard; return the shard file names in order."""
        if self._file is not None:
            self._finish()
        return list(self.names)

    def abort(self) -> None:
        """Drop the shard being written (finished shards stay, but no meta.json will point at them)."""
        if self._file is not None:
            self._file.discard()
            self._file = None
