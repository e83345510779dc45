"""Token ids to printed text: incomplete UTF-8 is held back, stop strings are cut even when split over tokens."""
from __future__ import annotations

import pytest
import torch

from data.tokenizers import CharTokenizer, gpt2_tokenizer
from model.inference import SamplingSettings, generate
from model.text_stream import TextStream, generate_text, stream_text
from tests.inference_fixtures import tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")
TEXT = "héllo wörld 日本語 🙂 naïve"


def test_bpe_stream_holds_back_partial_characters():
    tok = gpt2_tokenizer()
    ids = tok.encode(TEXT)
    assert any(_invalid_utf8(tok.decode_bytes([i])) for i in ids)  # some token really ends inside a character
    stream = TextStream(tok)
    chunks = [stream.push(i) for i in ids] + [stream.finish()]
    assert all("\ufffd" not in c for c in chunks)
    assert "".join(chunks) == TEXT
    assert chunks[7] == ""  # b"\x97" completes nothing: it waits for the rest of 日


def _invalid_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return True


def test_stop_string_split_over_tokens_is_cut_and_never_printed():
    tok = CharTokenizer(sorted(set("ab\ncd")))
    stream = TextStream(tok, stop=["\n\n"])
    out = [stream.push(i) for i in tok.encode("ab\n")]
    assert "".join(out) == "ab"  # the "\n" could start the stop string: held back
    assert stream.push(tok.encode("\n")[0]) == "" and stream.done
    assert stream.push(tok.encode("c")[0]) == "" and stream.finish() == ""


def test_held_back_prefix_is_released_when_it_does_not_become_a_stop():
    tok = CharTokenizer(sorted(set("abcdEND")))
    stream = TextStream(tok, stop=["END"])
    text = "".join(stream.push(i) for i in tok.encode("abEN"))
    assert text == "ab"
    text += "".join(stream.push(i) for i in tok.encode("dc"))
    assert text == "abENdc" and not stream.done
    text += "".join(stream.push(i) for i in tok.encode("aEND")) + stream.finish()
    assert text == "abENdca"


def test_earliest_of_several_stop_strings_wins():
    tok = CharTokenizer(sorted(set("xyz.!")))
    stream = TextStream(tok, stop=["!", "y."])
    text = "".join(stream.push(i) for i in tok.encode("xzy.x!"))
    assert text == "xz" and stream.done


def test_end_of_text_stops_the_stream():
    tok = gpt2_tokenizer()
    stream = TextStream(tok)
    assert stream.push(tok.encode("Hi")[0]) == "Hi"
    assert stream.push(tok.eot_id) == "" and stream.done
    assert stream.push(tok.encode("there")[0]) == ""
    assert TextStream(tok, stop_at_eot=False).push(tok.eot_id) == "<|endoftext|>"


def test_stream_text_matches_generate_and_stops_every_sample():
    tok = CharTokenizer([chr(c) for c in range(ord("a"), ord("a") + 40)])
    model = tiny_model()
    prompt = tok.encode("abc")
    g = torch.Generator().manual_seed(4)
    texts = ["", ""]
    for row, chunk in stream_text(model, tok, prompt, 60, SamplingSettings(temperature=1.0), num_samples=2,
                                  generator=g):
        texts[row] += chunk
    ref = generate(model, [prompt, prompt], 60, SamplingSettings(temperature=1.0), seed=4)
    assert texts == [tok.decode(r[3:].tolist()) for r in ref]
    stop = texts[0][10:12]
    cut = generate_text(model, tok, "abc", 60, SamplingSettings(temperature=1.0), num_samples=2, stop=[stop], seed=4)
    assert cut[0] == texts[0][:texts[0].index(stop)]
    assert all(stop not in t for t in cut)


def test_an_empty_prompt_starts_from_the_tokenizers_start_token():
    from model.text_stream import encode_prompt
    from model.param_error import ParamError

    char = CharTokenizer.from_text("\tab\n")  # "\n" is id 1
    assert encode_prompt(char, "ab") == [2, 3] and encode_prompt(char, "") == [1]
    assert encode_prompt(gpt2_tokenizer(), "") == [50256]
    with pytest.raises(ParamError, match="^prompt: empty, and this tokenizer has neither"):
        encode_prompt(CharTokenizer.from_text("ab"), "")
    with pytest.raises(ParamError, match="^prompt: cannot be tokenized.*not in the char vocabulary"):
        encode_prompt(char, "abc")


def test_training_samples_from_an_empty_prompt_start_there_too():
    """train.evaluation.draw_samples once fell back to token id 0 for a vocabulary without end-of-text."""
    from train.evaluation import draw_samples

    tok = CharTokenizer.from_text("\t\nabcdefghij")  # "\n" is id 1, "\t" id 0
    model = tiny_model(vocab_size=tok.vocab_size)
    got = draw_samples(model, tok, "", 12, seed=3, n=2)
    ref = generate(model, [[1], [1]], 12, SamplingSettings(temperature=0.8, top_k=200), seed=3,
                   vocab_limit=tok.vocab_size)
    assert got == [tok.decode(row[1:].tolist()) for row in ref]
    assert got != [tok.decode(row[1:].tolist()) for row in generate(
        model, [[0], [0]], 12, SamplingSettings(temperature=0.8, top_k=200), seed=3, vocab_limit=tok.vocab_size)]
