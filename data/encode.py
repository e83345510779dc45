"""Tokenize a byte range of the staged corpus, in this process or in a pool of worker processes.

Workers get only (path, start, end) and rebuild the tokenizer from the saved tokenizer.json, so nothing large is
pickled; results come back in order with a bounded number in flight, so memory stays bounded on any corpus size.
Workers are spawned (not forked): the parent may already run Rust thread pools (tokenizers, tiktoken).
"""
from __future__ import annotations

import multiprocessing
import os
from collections import deque
from pathlib import Path
from typing import Iterator

import numpy as np

from data.corpus import DOC_SEP, chunks, read_range
from data.tokenizers import Tokenizer, load_tokenizer

CHUNK_BYTES = 4 << 20  # text per task
PARALLEL_MIN_BYTES = 16 << 20  # with num_proc = 0, smaller corpora are tokenized in-process

_worker: dict = {}


def resolve_num_proc(num_proc: int, n_bytes: int) -> int:
    """num_proc > 0 is taken as given; 0 means one per core, but only for corpora worth the start-up cost."""
    if num_proc > 0:
        return num_proc
    return (os.cpu_count() or 1) if n_bytes >= PARALLEL_MIN_BYTES else 1


def encode_text(tokenizer: Tokenizer, text: str, dtype: str) -> np.ndarray:
    """Tokens of a piece of staged corpus: each DOC_SEP becomes the end-of-text token (tokenizers that have one)."""
    if tokenizer.eot_id is None or DOC_SEP not in text:
        return tokenizer.encode_array(text, dtype)
    parts = text.split(DOC_SEP)
    eot = np.asarray([tokenizer.eot_id], dtype=dtype)
    pieces = [tokenizer.encode_array(parts[0], dtype)]
    for part in parts[1:]:
        pieces += [eot, tokenizer.encode_array(part, dtype)]
    return np.concatenate(pieces)


def _init_worker(tokenizer_dir: str, dtype: str) -> None:
    _worker["tokenizer"] = load_tokenizer(tokenizer_dir)
    _worker["dtype"] = dtype


def _encode_task(task: tuple[str, int, int]) -> np.ndarray:
    path, start, end = task
    return encode_text(_worker["tokenizer"], read_range(Path(path), start, end), _worker["dtype"])


def encode_range(path: Path, start: int, end: int, tokenizer: Tokenizer, tokenizer_dir: Path, dtype: str,
                 num_proc: int = 1, chunk_bytes: int | None = None, progress=None) -> Iterator[np.ndarray]:
    """Yield the tokens of bytes [start, end) of `path`, chunk by chunk, in order."""
    size = chunk_bytes or CHUNK_BYTES
    tasks = ((str(path), a, b) for a, b in chunks(path, start, end, size))
    if num_proc <= 1:
        for _, a, b in tasks:
            yield encode_text(tokenizer, read_range(path, a, b), dtype)
            if progress is not None:
                progress.update(b - a)
        return
    context = multiprocessing.get_context("spawn")
    with context.Pool(num_proc, initializer=_init_worker, initargs=(str(tokenizer_dir), dtype)) as pool:
        pending: deque = deque()
        for task in tasks:
            pending.append((task, pool.apply_async(_encode_task, (task,))))
            if len(pending) >= 2 * num_proc:  # bounded: at most 2 results per worker wait in memory
                yield _collect(pending.popleft(), progress)
        while pending:
            yield _collect(pending.popleft(), progress)


def _collect(item, progress) -> np.ndarray:
    (_, a, b), result = item
    tokens = result.get()
    if progress is not None:
        progress.update(b - a)
    return tokens
