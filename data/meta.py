"""meta.json: what a prepared data folder holds. Written last by prepare, so its presence means the shards are complete.

Layout (every count is per split, keyed "train" and "val"):
    format        1
    tokenizer     "char" | "gpt2" | "bpe"   (tokenizer.json in the same folder rebuilds it)
    vocab_size    number of token ids; eot_id: the end-of-text id or null
    dtype         "uint16" | "uint32": raw little-endian token ids in each shard, no header
    source        a description of where the text came from; text_sha256: checksum of the UTF-8 corpus text
    val_fraction  the last fraction of the corpus (in characters) that is validation
    chars, bytes, tokens   text characters, UTF-8 bytes, and tokens per split (bits per byte = loss * tokens / bytes / ln 2)
    shards        {"train": ["train_0000.bin", ...], "val": [...]}: file names, in order
    config        the data settings the shards were built from (a change rebuilds them)
    source_stamp  a cheap identity of the source (file sizes and times, ...; see data.sources.source_stamp) or null
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from data.atomic import write_text_atomic

META_FILE = "meta.json"
FORMAT = 1
SPLITS = ("train", "val")
_REQUIRED = ("tokenizer", "vocab_size", "dtype", "source", "text_sha256", "chars", "bytes", "tokens", "shards")


def read_meta(directory: str | Path) -> dict[str, Any]:
    """Load and sanity-check `directory`/meta.json."""
    path = Path(directory) / META_FILE
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"no {META_FILE} in {directory}: run python -m scripts.prepare first") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: unreadable ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{path}: not a format-{FORMAT} attngpt meta file; run python -m scripts.prepare again")
    missing = [k for k in _REQUIRED if k not in meta]
    if missing:
        raise ValueError(f"{path}: missing {', '.join(missing)}")
    return meta


def write_meta(directory: str | Path, meta: dict[str, Any]) -> Path:
    path = Path(directory) / META_FILE
    write_text_atomic(path, json.dumps({"format": FORMAT, **meta}, indent=2, ensure_ascii=False) + "\n")
    return path
