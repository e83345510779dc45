"""Train a byte-level BPE on the user's corpus with the `tokenizers` library, then hand its merges to tiktoken.

`tokenizers` learns fast (Rust, parallel) and is deterministic for the same text and vocabulary size; tiktoken encodes
fast. The bridge: ranks = the 256 single bytes (in byte order), then each learned merge's bytes, in merge order.
"""
from __future__ import annotations

import json
from typing import Iterable

from data.tokenizers import BPE_PATTERN, TiktokenTokenizer, bpe_tokenizer, symbols_to_bytes


def ranks_from_merges(merges: Iterable[tuple[str, str]]) -> dict[bytes, int]:
    """Dense tiktoken ranks from `tokenizers` merges written in GPT-2's byte alphabet."""
    ranks = {bytes([b]): b for b in range(256)}
    for first, second in merges:
        token = symbols_to_bytes(first) + symbols_to_bytes(second)
        if token not in ranks:  # two merge paths can spell the same bytes; the first one wins
            ranks[token] = len(ranks)
    return ranks


def train_bpe(texts: Iterable[str], vocab_size: int, pattern: str = BPE_PATTERN) -> TiktokenTokenizer:
    """Learn vocab_size - 1 byte-level tokens from `texts` (pieces of the corpus); <|endoftext|> takes the last id.

    A small corpus can run out of pairs to merge, so the result may hold fewer than vocab_size ids.
    """
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    if vocab_size < 257:
        raise ValueError(f"data.vocab_size: {vocab_size} must be at least 257 for a byte-level bpe")
    model = Tokenizer(models.BPE())
    model.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - 1, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    model.train_from_iterator(texts, trainer)
    merges = json.loads(model.to_str())["model"]["merges"]
    pairs = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in merges]
    return bpe_tokenizer(ranks_from_merges(pairs), pattern)
