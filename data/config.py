"""The `data` section of a run config: where text comes from, how it is tokenized, where shards go."""
from __future__ import annotations

from dataclasses import dataclass

SOURCES = ("shakespeare", "tinyshakespeare", "files", "hf", "repeats")
TOKENIZERS = ("char", "gpt2", "bpe")
DTYPES = ("auto", "uint16", "uint32")
DTYPE_LIMITS = {"uint16": 2**16, "uint32": 2**32}  # how many token ids each shard dtype can hold


@dataclass
class DataConfig:
    source: str = "shakespeare"  # shakespeare | tinyshakespeare | files | hf | repeats (random strings, each twice)
    path: str = ""  # file, folder or glob (files); a local copy of the file (tinyshakespeare); data files (hf)
    tokenizer: str = "char"  # char | gpt2 | bpe
    vocab_size: int = 4096  # target vocabulary size of a trained bpe tokenizer
    val_fraction: float = 0.1  # the last fraction of the corpus is the validation split
    dir: str = "cache/shakespeare_char"  # where shards, meta.json and tokenizer files go
    hf_name: str = ""  # hub dataset name, a builder (json, text, parquet) for data.path, or a save_to_disk folder
    hf_config: str = ""
    hf_split: str = "train"
    hf_text_field: str = "text"  # the column holding the text
    streaming: bool = False  # stream a large hf dataset instead of downloading it whole
    num_proc: int = 0  # tokenizer processes; 0 = one per CPU core for corpora over 16 MB, else 1
    dtype: str = "auto"  # shard dtype: auto (uint16 when the vocabulary fits, else uint32) | uint16 | uint32
    shard_tokens: int = 100_000_000  # tokens per shard file; the last shard of a split holds the rest
    repeats_docs: int = 4000  # repeats: how many documents (each 16 random strings, each written twice)
    repeats_max_len: int = 40  # repeats: longest random string; lengths are uniform in [max_len / 4, max_len]

    def validate(self) -> None:
        """Raise ValueError('data.KEY: why') on the first bad value."""
        if self.source not in SOURCES:
            raise ValueError(f"data.source: {self.source!r} is not one of {', '.join(SOURCES)}")
        if self.tokenizer not in TOKENIZERS:
            raise ValueError(f"data.tokenizer: {self.tokenizer!r} is not one of {', '.join(TOKENIZERS)}")
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"data.val_fraction: {self.val_fraction} must lie strictly between 0 and 1")
        if self.tokenizer == "bpe" and self.vocab_size < 257:
            raise ValueError(f"data.vocab_size: {self.vocab_size} must be at least 257 for a byte-level bpe")
        if self.source == "files" and not self.path:
            raise ValueError("data.path: source 'files' needs a file, folder or glob")
        if self.source == "hf" and not self.hf_name:
            raise ValueError("data.hf_name: source 'hf' needs a dataset name or a saved dataset folder")
        if self.dtype not in DTYPES:
            raise ValueError(f"data.dtype: {self.dtype!r} is not one of {', '.join(DTYPES)}")
        limit = DTYPE_LIMITS.get(self.dtype, DTYPE_LIMITS["uint32"])
        if self.tokenizer == "bpe" and self.vocab_size > limit:
            raise ValueError(f"data.vocab_size: {self.vocab_size} does not fit shard dtype "
                             f"{'uint32' if self.dtype == 'auto' else self.dtype} (at most {limit} ids)")
        if self.shard_tokens < 1:
            raise ValueError(f"data.shard_tokens: {self.shard_tokens} must be >= 1")
        if self.repeats_docs < 1:
            raise ValueError(f"data.repeats_docs: {self.repeats_docs} must be >= 1")
        if self.repeats_max_len < 2:
            raise ValueError(f"data.repeats_max_len: {self.repeats_max_len} must be >= 2")
        if self.num_proc < 0:
            raise ValueError(f"data.num_proc: {self.num_proc} must be >= 0")
        if not self.dir:
            raise ValueError("data.dir: must name a folder")
