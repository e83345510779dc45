"""Tokenizers: char vocabulary and errors, GPT-2 ids offline, trained BPE round trips and determinism, save/load."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from data.bpe_train import ranks_from_merges, train_bpe
from data.tokenizers import (GPT2_ENCODER_JSON_SHA256, GPT2_VOCAB_BPE_SHA256, CharTokenizer, _read_checked,
                             byte_symbols, gpt2_files, gpt2_tokenizer, load_tokenizer, symbols_to_bytes)

REPO = Path(__file__).resolve().parents[1]
TINY = Path(__file__).resolve().parents[1] / "data/corpora/tinyshakespeare.txt"  # shipped, with its sha256
MIXED = "Hello, wörld! 你好，世界。中文文本 🙂🚀 tabs\tand\r\nnewlines\n\n  spaces  <|endoftext|> 'll 12345"


@pytest.fixture(scope="module")
def tiny_text() -> str:
    return TINY.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def small_bpe(tiny_text):
    return train_bpe([tiny_text[:200_000], MIXED], 600)


# --- characters -------------------------------------------------------------------------------------------------

def test_char_vocab_of_tiny_shakespeare_is_65(tiny_text):
    tok = CharTokenizer.from_text(tiny_text)
    assert tok.vocab_size == 65 and tok.eot_id is None and tok.name == "char"
    assert tok.chars[:3] == ["\n", " ", "!"] and tok.chars[-1] == "z"  # sorted by code point, as the classic recipe
    ids = tok.encode("First Citizen:")
    assert tok.decode(ids) == "First Citizen:"
    assert np.array_equal(tok.encode_array(tiny_text[:5000], "uint16"), np.array(tok.encode(tiny_text[:5000])))


def test_char_unknown_characters_error_names_them_on_one_line():
    tok = CharTokenizer.from_text("abc\n")
    for encode in (tok.encode, tok.encode_array):
        with pytest.raises(ValueError) as err:
            encode("abz\tx")
        message = str(err.value)
        assert "'z'" in message and "'x'" in message and "'\\t'" in message and "\n" not in message


def test_char_handles_non_ascii_and_bad_ids():
    tok = CharTokenizer.from_text(MIXED)
    assert tok.decode(tok.encode(MIXED)) == MIXED
    assert tok.decode_bytes(tok.encode("世")) == "世".encode()
    assert tok.encode_array(MIXED).tolist() == tok.encode(MIXED)
    with pytest.raises(ValueError, match="outside"):
        tok.decode([tok.vocab_size])
    with pytest.raises(ValueError, match="outside"):
        tok.decode([-1])


# --- GPT-2 ------------------------------------------------------------------------------------------------------

def test_gpt2_known_ids_offline():
    tok = gpt2_tokenizer()
    assert tok.encode("Hello world") == [15496, 995]
    assert tok.encode(" the") == [262]
    assert tok.vocab_size == 50257 and tok.eot_id == 50256 and tok.name == "gpt2"
    assert tok.decode(tok.encode(MIXED)) == MIXED
    # special-token text in user data stays ordinary text
    assert 50256 not in tok.encode("<|endoftext|>")


def test_gpt2_decode_bytes_can_end_inside_a_character():
    tok = gpt2_tokenizer()
    ids = tok.encode("世")
    assert len(ids) > 1  # this character spans two byte-level tokens
    partial = tok.decode_bytes(ids[:1])
    assert "世".encode().startswith(partial) and partial != "世".encode()
    assert tok.decode_bytes(ids) == "世".encode()


def test_gpt2_hashes_are_tiktoken_published_ones_and_are_checked(tmp_path):
    import importlib.util
    source = Path(importlib.util.find_spec("tiktoken_ext.openai_public").origin).read_text()
    assert GPT2_VOCAB_BPE_SHA256 in source and GPT2_ENCODER_JSON_SHA256 in source
    encoder, vocab = gpt2_files()
    assert encoder.is_file() and vocab.is_file()
    tampered = tmp_path / "vocab.bpe"
    tampered.write_bytes(vocab.read_bytes() + b"x")
    with pytest.raises(ValueError, match="sha256"):
        _read_checked(tampered, GPT2_VOCAB_BPE_SHA256)


def test_byte_symbols_are_reversible():
    table = byte_symbols()
    assert len(set(table.values())) == 256 and table[ord("A")] == "A" and table[ord(" ")] == "Ġ"
    assert symbols_to_bytes("".join(table[b] for b in range(256))) == bytes(range(256))


# --- trained BPE ------------------------------------------------------------------------------------------------

def test_bpe_round_trips_any_utf8_text(small_bpe):
    assert small_bpe.name == "bpe" and small_bpe.vocab_size == 600 and small_bpe.eot_id == 599
    for text in (MIXED, "纯中文的句子没有空格也应该完全还原。", "\x00\x01 control \u200b zero-width", ""):
        assert small_bpe.decode(small_bpe.encode(text)) == text
    ids = small_bpe.encode("ROMEO: the king")
    assert len(ids) < len("ROMEO: the king".encode())  # it learned merges from the corpus


def test_bpe_ranks_from_merges_are_dense_and_first_spelling_wins():
    sym = byte_symbols()
    merges = [(sym[ord("a")], sym[ord("b")]), (sym[ord("b")], sym[ord("c")]),
              (sym[ord("a")] + sym[ord("b")], sym[ord("c")]), (sym[ord("a")], sym[ord("b")] + sym[ord("c")])]
    ranks = ranks_from_merges(merges)
    assert ranks[b"ab"] == 256 and ranks[b"bc"] == 257 and ranks[b"abc"] == 258
    assert sorted(ranks.values()) == list(range(259))


@pytest.mark.slow
def test_bpe_training_is_deterministic_across_processes(tmp_path, small_bpe):
    script = ("import sys; sys.path.insert(0, sys.argv[1]); from data.bpe_train import train_bpe; "
              "from tests.test_data_tokenizers import TINY, MIXED; "
              "train_bpe([TINY.read_text()[:200_000], MIXED], 600).save(sys.argv[2])")
    for name in ("a", "b"):
        subprocess.run([sys.executable, "-c", script, str(REPO), str(tmp_path / name)], check=True, cwd=REPO)
    a = json.loads((tmp_path / "a/tokenizer.json").read_text())
    b = json.loads((tmp_path / "b/tokenizer.json").read_text())
    assert a == b
    small_bpe.save(tmp_path / "here")
    assert json.loads((tmp_path / "here/tokenizer.json").read_text()) == a


# --- save / load ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["char", "gpt2", "bpe"])
def test_save_and_load_from_any_folder(kind, tmp_path, small_bpe, tiny_text):
    tok = {"char": lambda: CharTokenizer.from_text(tiny_text), "gpt2": gpt2_tokenizer, "bpe": lambda: small_bpe}[kind]()
    tok.save(tmp_path / "first")
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    for f in (tmp_path / "first").iterdir():
        (moved / f.name).write_bytes(f.read_bytes())
    assert [f.name for f in moved.iterdir()] == ["tokenizer.json"]
    again = load_tokenizer(moved)
    sample = tiny_text[:3000]
    assert (again.name, again.vocab_size, again.eot_id) == (tok.name, tok.vocab_size, tok.eot_id)
    assert again.encode(sample) == tok.encode(sample) and again.decode(again.encode(sample)) == sample


def test_bpe_file_stores_base64_ranks_and_pattern(tmp_path, small_bpe):
    state = json.loads(small_bpe.save(tmp_path).read_text())
    assert state["name"] == "bpe" and "\\p{L}" in state["pattern"]
    assert len(state["ranks"]) == 599 and state["special_tokens"] == {"<|endoftext|>": 599}
    assert state["ranks"]["IA=="] == 32  # base64 of b" " -> its byte value


@pytest.mark.parametrize("content, message", [
    (None, "no tokenizer.json"),
    ("not json", "not a readable"),
    ('{"format": "other"}', "not an attngpt"),
    ('{"format": "attngpt-tokenizer", "name": "pickle"}', "unknown tokenizer"),
    ('{"format": "attngpt-tokenizer", "name": "char", "chars": ["b", "a"]}', "sorted"),
    ('{"format": "attngpt-tokenizer", "name": "bpe", "pattern": "x", "ranks": {"YQ==": 0}}', "single bytes"),
])
def test_load_rejects_broken_files_with_one_line(tmp_path, content, message):
    if content is not None:
        (tmp_path / "tokenizer.json").write_text(content)
    with pytest.raises(ValueError, match=message) as err:
        load_tokenizer(tmp_path)
    assert "\n" not in str(err.value)


# --- where generation from an empty prompt starts --------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["char", "gpt2", "bpe"])
def test_start_ids_are_the_tokenizers_own_start_never_id_0(kind, small_bpe, tiny_text):
    # a tab sorts before the newline, so the char start is not id 0 either (with Shakespeare alone it would be)
    tok = {"char": lambda: CharTokenizer.from_text("\t" + tiny_text), "gpt2": gpt2_tokenizer,
           "bpe": lambda: small_bpe}[kind]()
    start = tok.start_ids()
    expected = {"char": [1], "gpt2": [50256], "bpe": [599]}[kind]  # end-of-text where there is one, else "\n"
    assert start == expected
    assert tok.decode(start) == ("\n" if kind == "char" else "<|endoftext|>")


def test_a_char_vocabulary_without_newline_has_no_start():
    with pytest.raises(ValueError, match="neither an end-of-text token nor a newline"):
        CharTokenizer.from_text("abc").start_ids()
