"""attngpt tokenizers as Hugging Face tokenizers (data/hf_tokenizer.py): AutoTokenizer encodes and decodes exactly as
attngpt does for char, gpt2 and bpe, on a text with newlines, Chinese and emoji and on the built-in corpus, and the
files read back into the same attngpt tokenizer."""
from __future__ import annotations

import itertools
import json

import pytest

from data.bpe_train import train_bpe
from data.hf_tokenizer import read_hf_tokenizer, to_hf_tokenizer, write_hf_tokenizer
from data.shakespeare import iter_plays
from data.tokenizers import EOT, CharTokenizer, gpt2_files, gpt2_tokenizer

transformers = pytest.importorskip("transformers")

MIXED = ("First line\n\n  second, indented\tline\r\n中文的句子。 Emoji: 🙂👍🏽 naïve café 42,000 don't"
         "\n\n\n  end  ")


@pytest.fixture(scope="module")
def corpus() -> str:
    return "".join(itertools.islice(iter_plays(), 2))  # two plays, about 300k characters


@pytest.fixture(scope="module")
def tokenizers(corpus):
    return {"char": CharTokenizer.from_text(corpus + MIXED), "gpt2": gpt2_tokenizer(),
            "bpe": train_bpe([corpus[:200_000]], 700)}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["char", "gpt2", "bpe"])
def test_autotokenizer_encodes_and_decodes_as_attngpt(tmp_path, tokenizers, corpus, kind):
    ours = tokenizers[kind]
    write_hf_tokenizer(ours, tmp_path, model_max_length=64)
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
    for text in (MIXED, corpus):
        ids = hf(text)["input_ids"]
        assert ids == ours.encode(text)
        assert hf.decode(ids) == text == ours.decode(ids)
    assert hf.model_max_length == 64
    back = read_hf_tokenizer(tmp_path)
    assert back.name == kind and back.vocab_size == ours.vocab_size and back.encode(corpus) == ours.encode(corpus)


@pytest.mark.parametrize("kind", ["gpt2", "bpe"])
def test_end_of_text_is_the_special_token_but_never_injected_by_text(tmp_path, tokenizers, kind):
    ours = tokenizers[kind]
    write_hf_tokenizer(ours, tmp_path, model_max_length=64)
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert hf.eos_token == EOT and hf.eos_token_id == ours.eot_id
    text = f"one{EOT}two"
    assert hf(text)["input_ids"] == ours.encode(text) and ours.eot_id not in ours.encode(text)
    assert hf.decode([*ours.encode("one"), ours.eot_id], skip_special_tokens=True) == "one"
    assert json.loads((tmp_path / "special_tokens_map.json").read_text())["eos_token"] == EOT


def test_char_vocabulary_is_a_wordlevel_model_with_no_special_tokens(tmp_path, tokenizers):
    write_hf_tokenizer(tokenizers["char"], tmp_path, model_max_length=64)
    state = json.loads((tmp_path / "tokenizer.json").read_text())
    assert state["model"]["type"] == "WordLevel" and state["added_tokens"] == []
    assert state["model"]["vocab"] == {c: i for i, c in enumerate(tokenizers["char"].chars)}
    assert json.loads((tmp_path / "special_tokens_map.json").read_text()) == {}
    assert transformers.AutoTokenizer.from_pretrained(tmp_path).eos_token is None


def test_byte_level_bpe_keeps_its_merges_and_split_pattern(tokenizers):
    ours = tokenizers["bpe"]
    state = json.loads(to_hf_tokenizer(ours).to_str())
    assert state["model"]["type"] == "BPE" and len(state["model"]["merges"]) >= ours.vocab_size - 257
    assert state["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] == ours.pattern


def test_hub_style_gpt2_tokenizer_json_reads_as_gpt2(tmp_path):
    """GPT-2's tokenizer.json on the hub uses ByteLevel's built-in split and the original merges file."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    encoder_json, vocab_bpe = gpt2_files()
    hub = Tokenizer(models.BPE.from_file(str(encoder_json), str(vocab_bpe)))
    hub.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hub.decoder = decoders.ByteLevel()
    hub.add_special_tokens([AddedToken(EOT, special=True)])
    hub.save(str(tmp_path / "tokenizer.json"))
    assert read_hf_tokenizer(tmp_path).name == "gpt2"
    assert hub.encode(MIXED).ids == gpt2_tokenizer().encode(MIXED)


@pytest.mark.parametrize("content, match", [("{not json", "not a readable tokenizer.json"),
                                            ('{"model": {"type": "Unigram", "vocab": []}}', "Unigram"),
                                            ('{"model": {"type": "WordLevel", "vocab": {"ab": 0}}}', "single char")])
def test_unusable_tokenizer_json_is_one_clear_error(tmp_path, content, match):
    (tmp_path / "tokenizer.json").write_text(content)
    with pytest.raises(ValueError, match=match) as info:
        read_hf_tokenizer(tmp_path)
    assert "\n" not in str(info.value)
