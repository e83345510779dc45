"""A static, preallocated key/value cache: prefill the prompt once, then decode one token per step.

Layout: `k` and `v` are [n_layer, batch, n_kv_head, max_len, head_dim]; positions [0, pos) are filled. Keys are
stored after rotary embedding and QK-norm, so cached entries never need recomputing. Nothing is allocated per step:
`update` writes the new slice in place and returns views of the filled prefix.
"""
from __future__ import annotations

import torch

from model.config import ModelConfig


class KVCache:
    def __init__(self, config: ModelConfig, batch_size: int, max_len: int | None = None,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
        self.max_len = max_len or config.block_size
        shape = (config.n_layer, batch_size, config.kv_heads, self.max_len, config.head_dim)
        # empty, not zeros: only positions [0, pos) are ever read, and they are written first; zeroing 2 x 8 MB at
        # GPT-2 size costs ~4 ms of time to first token
        self.k = torch.empty(shape, device=device, dtype=dtype)
        self.v = torch.empty(shape, device=device, dtype=dtype)
        self.pos = 0

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new keys/values [B, H_kv, T, d] at positions [pos, pos + T); return all filled ones."""
        end = self.pos + k.size(2)
        if end > self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} positions, asked for {end}")
        self.k[layer, :, :, self.pos:end] = k
        self.v[layer, :, :, self.pos:end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def advance(self, n: int) -> None:
        """Called by the model after every layer has stored its slice."""
        self.pos += n

    def reset(self) -> None:
        self.pos = 0


class RowKVCache:
    """The serving engine's cache: the same [n_layer, rows, n_kv_head, max_len, head_dim] layout, but every row has
    its own length, so requests of different lengths decode side by side and join or leave between steps.

    Rows [0, live) are the running batch (the engine keeps them packed, moving the last row into a freed slot), and
    a forward feeds one new token per live row: row b's token takes position lengths[b] (the model reads the
    per-row start from `pos`), and `attn_mask` [live, 1, 1, end] hides each row's keys past its own length.
    Prompts are prefilled into an ordinary KVCache and copied in with `load`.
    """

    def __init__(self, config: ModelConfig, rows: int, max_len: int | None = None,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
        self.max_len = max_len or config.block_size
        shape = (config.n_layer, rows, config.kv_heads, self.max_len, config.head_dim)
        # zeros, not empty: a row's masked keys get weight 0, but 0 x a NaN left in never-written memory is NaN;
        # later stale entries are finite values of earlier requests
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.lengths = torch.zeros(rows, dtype=torch.long, device=device)
        self.live = 0
        self.attn_mask: torch.Tensor | None = None
        self._rows = torch.arange(rows, device=device)

    @property
    def pos(self) -> torch.Tensor:
        return self.lengths[:self.live]

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store one new key/value [live, H_kv, 1, d] per row at its own length; return every row's keys up to the
        longest row, with `attn_mask` saying which of them each row may see."""
        B = k.size(0)
        if k.size(2) != 1 or B != self.live:
            raise ValueError(f"RowKVCache feeds one token for each of its {self.live} live rows, got {tuple(k.shape)}")
        lengths = self.lengths[:B]
        if layer == 0:  # the same for every layer of this forward
            end = int(lengths.max()) + 1
            if end > self.max_len:
                raise ValueError(f"KV cache holds {self.max_len} positions, asked for {end}")
            self._end = end
            self.attn_mask = (torch.arange(end, device=k.device) <= lengths.view(-1, 1)).view(B, 1, 1, end)
        rows = self._rows[:B]
        self.k[layer, rows, :, lengths] = k[:, :, 0]
        self.v[layer, rows, :, lengths] = v[:, :, 0]
        return self.k[layer, :B, :, :self._end], self.v[layer, :B, :, :self._end]

    def advance(self, n: int) -> None:
        self.lengths[:self.live] += n

    def load(self, row: int, source: KVCache, source_row: int, length: int) -> None:
        """Copy the first `length` positions of `source`'s row (a prefill) into `row`."""
        self.k[:, row, :, :length] = source.k[:, source_row, :, :length]
        self.v[:, row, :, :length] = source.v[:, source_row, :, :length]
        self.lengths[row] = length

    def move(self, src: int, dst: int) -> None:
        """Move row `src` into slot `dst` (to keep the live rows packed when `dst` has been freed)."""
        n = int(self.lengths[src])
        self.k[:, dst, :, :n] = self.k[:, src, :, :n]
        self.v[:, dst, :, :n] = self.v[:, src, :, :n]
        self.lengths[dst] = n
