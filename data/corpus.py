"""The corpus as one UTF-8 file on disk: written once from the source in bounded memory, then split and chunked.

Staging the text on disk lets prepare checksum it (to decide whether old shards still hold), count its characters
(the split point), and hand byte ranges to tokenizer processes, without ever holding the corpus in memory.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator

import numpy as np

SCAN_BYTES = 1 << 16
# Between documents, for tokenizers with an end-of-text token: this character in the staged text becomes that token
# in the shards (data.encode). NUL never reaches the corpus otherwise: files holding it are refused as binary, and
# it is dropped from dataset rows.
DOC_SEP = "\x00"
# A chunk boundary that no BPE split pattern can see across: right after a newline with a printable ASCII
# character on both sides (the pre-token before it ends at that character and the newline, and the next one starts
# fresh). Tokenizing the chunks one by one then gives exactly the tokens of the whole text.
_CUT = re.compile(rb"[\x21-\x7e]\n(?=[\x21-\x7e])")


@dataclass
class CorpusStats:
    chars: int = 0
    bytes: int = 0
    sha256: str = ""
    charset: set[str] = field(default_factory=set)  # filled only when asked (the char tokenizer's vocabulary)


def write_corpus(pieces: Iterable[str], path: Path, charset: bool = False, progress=None) -> CorpusStats:
    """Stream text pieces into `path`; return their character and byte counts, sha256 and (optionally) charset."""
    stats = CorpusStats()
    digest = hashlib.sha256()
    with open(path, "wb") as out:
        for piece in pieces:
            try:
                data = piece.encode("utf-8")
            except UnicodeEncodeError as e:
                raise ValueError(f"the text holds a character that is not valid UTF-8 ({e.reason})") from None
            out.write(data)
            digest.update(data)
            stats.chars += len(piece)
            stats.bytes += len(data)
            if charset:
                stats.charset.update(piece)
            if progress is not None:
                progress.update(len(data))
    stats.sha256 = digest.hexdigest()
    return stats


def split_point(n_chars: int, val_fraction: float) -> int:
    """Characters in the train split: the classic int(n * 0.9) for val_fraction 0.1."""
    return int(n_chars * (1.0 - val_fraction))


def byte_offset(path: Path, char_index: int, block: int = 8 << 20) -> int:
    """Byte offset where character number `char_index` starts in the UTF-8 file."""
    seen = 0
    offset = 0
    with open(path, "rb") as f:
        while data := f.read(block):
            starts = (np.frombuffer(data, dtype=np.uint8) & 0xC0) != 0x80  # bytes that begin a character
            count = int(starts.sum())
            if seen + count > char_index:
                positions = np.flatnonzero(starts)
                return offset + int(positions[char_index - seen])
            seen += count
            offset += len(data)
    return offset


def _next_cut(f: BinaryIO, probe: int, end: int) -> int:
    """The first safe boundary at or after `probe` and before `end`; `end` if there is none."""
    lo = max(probe - 1, 0)
    while lo < end:
        f.seek(lo)
        buf = f.read(min(SCAN_BYTES, end - lo))
        m = _CUT.search(buf)
        if m:
            return lo + m.end()
        if lo + len(buf) >= end or len(buf) < 3:
            return end
        lo += len(buf) - 2  # overlap, so a boundary straddling two reads is still found
    return end


def chunks(path: Path, start: int, end: int, target: int) -> Iterator[tuple[int, int]]:
    """Split the byte range [start, end) into pieces of about `target` bytes at safe boundaries."""
    with open(path, "rb") as f:
        pos = start
        while pos < end:
            cut = _next_cut(f, pos + target, end) if pos + target < end else end
            yield pos, cut
            pos = cut


def read_range(path: Path, start: int, end: int) -> str:
    with open(path, "rb") as f:
        f.seek(start)
        return f.read(end - start).decode("utf-8")
