"""attngpt's tokenizers as Hugging Face tokenizers, and back.

An export folder gets `tokenizer.json` (the `tokenizers` library's format), `tokenizer_config.json` and
`special_tokens_map.json`, so `transformers.AutoTokenizer.from_pretrained(folder)` encodes and decodes as attngpt:
- char: a WordLevel model mapping each character to its id, after a pre-tokenizer that splits every character;
  the decoder fuses the pieces without spaces.
- gpt2 and bpe: a byte-level BPE. tiktoken's ranks become the vocabulary (tokens spelled in GPT-2's printable byte
  alphabet), and every way of writing a token as two shorter tokens becomes a merge, ordered by the merged token's
  rank: that is the merge tiktoken would make, so the two agree. The split pattern travels as a Split pre-tokenizer.
  `<|endoftext|>` is the special token, and `split_special_tokens` makes the literal string in a text encode as
  ordinary text, as attngpt does.
Only the `tokenizers` library is needed to write or read these files; transformers is not imported.
"""
from __future__ import annotations

import json
from pathlib import Path

from data.atomic import write_text_atomic
from data.tokenizers import (EOT, GPT2_PATTERN, CharTokenizer, TiktokenTokenizer, Tokenizer, bpe_tokenizer,
                             byte_symbols, gpt2_tokenizer, symbols_to_bytes)

HF_TOKENIZER, HF_TOKENIZER_CONFIG = "tokenizer.json", "tokenizer_config.json"
HF_SPECIAL_TOKENS = "special_tokens_map.json"
EVERY_CHARACTER = r"[\s\S]"  # `.` skips newlines in some regex dialects; this class never does


def _spell(token: bytes) -> str:
    symbols = byte_symbols()
    return "".join(symbols[b] for b in token)


def bpe_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """Every (left, right) pair of tokens that concatenates to a token, ordered as tiktoken would merge them."""
    found = []
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in ranks and right in ranks:
                found.append((rank, ranks[left], ranks[right], left, right))
    found.sort()
    return [(left, right) for *_, left, right in found]


def to_hf_tokenizer(tokenizer: Tokenizer):
    """The `tokenizers.Tokenizer` that encodes and decodes exactly as `tokenizer` does."""
    from tokenizers import AddedToken, Regex, models, pre_tokenizers, decoders
    from tokenizers import Tokenizer as HFTokenizer

    if isinstance(tokenizer, CharTokenizer):
        hf = HFTokenizer(models.WordLevel({c: i for i, c in enumerate(tokenizer.chars)}, unk_token=None))
        hf.pre_tokenizer = pre_tokenizers.Split(Regex(EVERY_CHARACTER), behavior="isolated")
        hf.decoder = decoders.Fuse()
        return hf
    if not isinstance(tokenizer, TiktokenTokenizer) or tokenizer.ranks is None:
        raise ValueError(f"tokenizer {tokenizer.name!r} cannot be written as a Hugging Face tokenizer")
    ranks = tokenizer.ranks
    merges = [(_spell(a), _spell(b)) for a, b in bpe_merges(ranks)]
    hf = HFTokenizer(models.BPE({_spell(t): r for t, r in ranks.items()}, merges, ignore_merges=False))
    hf.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(tokenizer.pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens([AddedToken(EOT, special=True, normalized=False)])
    if hf.token_to_id(EOT) != tokenizer.eot_id:
        raise ValueError(f"{EOT} would get id {hf.token_to_id(EOT)}, not {tokenizer.eot_id}")
    return hf


def write_hf_tokenizer(tokenizer: Tokenizer, directory: str | Path, model_max_length: int) -> list[Path]:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json into `directory`."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    special = {} if tokenizer.eot_id is None else {"bos_token": EOT, "eos_token": EOT, "unk_token": EOT}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": model_max_length,
              "clean_up_tokenization_spaces": False, "split_special_tokens": True, "add_prefix_space": False,
              **special}
    if tokenizer.eot_id is not None:
        config["added_tokens_decoder"] = {str(tokenizer.eot_id): {
            "content": EOT, "lstrip": False, "rstrip": False, "normalized": False, "single_word": False,
            "special": True}}
    paths = [folder / HF_TOKENIZER, folder / HF_TOKENIZER_CONFIG, folder / HF_SPECIAL_TOKENS]
    write_text_atomic(paths[0], to_hf_tokenizer(tokenizer).to_str(pretty=False))
    write_text_atomic(paths[1], json.dumps(config, indent=2))
    write_text_atomic(paths[2], json.dumps(special, indent=2))
    return paths


def _split_pattern(pre: dict | None, source: str) -> str:
    """The regex a byte-level BPE splits text with: ours (Split, then ByteLevel without its regex), or GPT-2's
    (ByteLevel with its built-in regex, as in the hub's gpt2 tokenizer.json)."""
    kind = (pre or {}).get("type")
    if kind == "ByteLevel" and pre.get("use_regex", True) and not pre.get("add_prefix_space", False):
        return GPT2_PATTERN
    steps = pre.get("pretokenizers", []) if kind == "Sequence" else []
    if (len(steps) == 2 and steps[0].get("type") == "Split" and steps[0].get("behavior") == "Isolated"
            and "Regex" in steps[0].get("pattern", {}) and steps[1].get("type") == "ByteLevel"
            and not steps[1].get("use_regex", True)):
        return steps[0]["pattern"]["Regex"]
    raise ValueError(f"{source}: pre-tokenizer {kind!r} is not a byte-level split attngpt can reproduce")


def read_hf_tokenizer(directory: str | Path) -> Tokenizer:
    """The attngpt tokenizer behind a folder's tokenizer.json (one written here, or GPT-2's from the hub)."""
    path = Path(directory) / HF_TOKENIZER
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
        model, added = state["model"], state.get("added_tokens") or []
        vocab = model["vocab"]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a readable tokenizer.json ({type(e).__name__}: {e})") from None
    if model.get("type") == "WordLevel":
        chars = [c for c, _ in sorted(vocab.items(), key=lambda item: item[1])]
        if [vocab[c] for c in chars] != list(range(len(chars))) or added:
            raise ValueError(f"{path}: a WordLevel vocabulary that is not ids 0..n-1 of single characters")
        try:
            return CharTokenizer(chars)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
    if model.get("type") != "BPE":
        raise ValueError(f"{path}: tokenizer model {model.get('type')!r} is neither WordLevel (char) nor BPE")
    pattern = _split_pattern(state.get("pre_tokenizer"), str(path))
    try:
        ranks = {symbols_to_bytes(token): int(i) for token, i in vocab.items() if token != EOT}
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    specials = {t.get("content"): t.get("id") for t in added if t.get("special")}
    if specials.get(EOT, vocab.get(EOT)) != len(ranks) or len(specials.keys() - {EOT}):
        raise ValueError(f"{path}: expected {EOT} as the only special token, with id {len(ranks)}")
    gpt2 = gpt2_tokenizer()
    if pattern == GPT2_PATTERN and ranks == gpt2.ranks:
        return gpt2
    try:
        return bpe_tokenizer(ranks, pattern)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
