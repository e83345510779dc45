"""prepare(): classic splits, shard contents equal the tokenized text, reuse and rebuild, multi-shard, dtypes,
parallel chunked tokenization, and failed runs that leave nothing a later run would trust."""
from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import numpy as np
import pytest

import data.encode
import data.prepare
from data.atomic import is_temp_name, temp_name
from data.config import DataConfig
from data.corpus import byte_offset, chunks, read_range, split_point
from data.loader import ShardLoader
from data.meta import read_meta
from data.prepare import prepare
from data.tokenizers import gpt2_tokenizer, load_tokenizer

TINY = Path(__file__).resolve().parents[1] / "data/corpora/tinyshakespeare.txt"  # shipped, with its sha256


def shard_tokens(folder: Path, split: str) -> np.ndarray:
    meta = read_meta(folder)
    return np.concatenate([np.fromfile(folder / name, dtype=meta["dtype"]) for name in meta["shards"][split]])


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if is_temp_name(p.name))


def tiny_cfg(folder: Path, **kw) -> DataConfig:
    return DataConfig(source="tinyshakespeare", path=str(TINY), dir=str(folder), **kw)


@pytest.fixture(scope="module")
def tiny_text() -> str:
    return TINY.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def char_dir(tmp_path_factory) -> Path:
    return prepare(tiny_cfg(tmp_path_factory.mktemp("char")), verbose=False)


def test_char_tiny_shakespeare_has_the_classic_split(char_dir, tiny_text):
    meta = read_meta(char_dir)
    assert meta["tokens"] == {"train": 1_003_854, "val": 111_540}
    assert meta["bytes"] == meta["chars"] == {"train": 1_003_854, "val": 111_540}
    assert (meta["vocab_size"], meta["dtype"], meta["tokenizer"], meta["eot_id"]) == (65, "uint16", "char", None)
    assert meta["text_sha256"] == hashlib.sha256(tiny_text.encode()).hexdigest()
    assert meta["shards"] == {"train": ["train_0000.bin"], "val": ["val_0000.bin"]}
    assert leftovers(char_dir) == []


def test_shards_equal_the_tokenized_text(char_dir, tiny_text):
    tok = load_tokenizer(char_dir)
    assert shard_tokens(char_dir, "train").tolist() == tok.encode(tiny_text[:1_003_854])
    assert shard_tokens(char_dir, "val").tolist() == tok.encode(tiny_text[1_003_854:])


@pytest.mark.slow
def test_gpt2_tiny_shakespeare_matches_nanogpt_counts(tmp_path, tiny_text):
    folder = prepare(tiny_cfg(tmp_path, tokenizer="gpt2"), verbose=False)
    meta = read_meta(folder)
    assert meta["tokens"] == {"train": 301_966, "val": 36_059}  # the numbers nanoGPT's prepare prints
    assert (meta["vocab_size"], meta["eot_id"], meta["dtype"]) == (50257, 50256, "uint16")
    tok = gpt2_tokenizer()
    assert shard_tokens(folder, "val").tolist() == tok.encode(tiny_text[1_003_854:])


def test_rerun_reuses_and_changed_settings_or_text_rebuild(tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_text("to be or not to be, that is the question\n" * 200)
    cfg = DataConfig(source="files", path=str(text), dir=str(tmp_path / "out"))
    folder = prepare(cfg, verbose=False)
    shard = folder / "train_0000.bin"
    first = shard.stat()
    prepare(cfg, verbose=False)
    assert (shard.stat().st_ino, shard.stat().st_mtime_ns) == (first.st_ino, first.st_mtime_ns)  # reused
    cfg.val_fraction = 0.5
    prepare(cfg, verbose=False)
    assert read_meta(folder)["chars"] == {"train": 4100, "val": 4100}  # settings changed: rebuilt
    text.write_text("a different text, of another length\n" * 100)
    prepare(cfg, verbose=False)
    assert read_meta(folder)["chars"]["train"] == 1800  # text changed: rebuilt
    (folder / "val_0000.bin").unlink()
    prepare(cfg, verbose=False)
    assert (folder / "val_0000.bin").is_file()  # a missing shard is noticed too


def test_unchanged_source_is_reused_without_reading_it(tmp_path, monkeypatch):
    """A train start must not re-read (or re-stream) a large corpus: an unchanged stamp skips the read entirely."""
    text = tmp_path / "corpus.txt"
    text.write_text("to be or not to be, that is the question\n" * 200)
    cfg = DataConfig(source="files", path=str(text), dir=str(tmp_path / "out"))
    prepare(cfg, verbose=False)
    assert read_meta(cfg.dir)["source_stamp"] is None  # just written: its mtime cannot be trusted yet
    past = time.time_ns() - 60 * 10**9
    os.utime(text, ns=(past, past))
    folder = prepare(cfg, verbose=False)  # read and checksummed (same text): reused, stamp remembered
    assert read_meta(folder)["source_stamp"]["files"][0] == [str(text), text.stat().st_size, past]

    def no_reading(_cfg):
        raise AssertionError("the source was read although it did not change")

    monkeypatch.setattr(data.prepare, "documents", no_reading)
    prepare(cfg, verbose=False)  # would raise if it read
    monkeypatch.undo()

    # touched but the same text: read and checksummed once, reused, and the new stamp remembered
    before = read_meta(folder)
    os_time = past + 10**9
    os.utime(text, ns=(os_time, os_time))
    prepare(cfg, verbose=False)
    after = read_meta(folder)
    assert after["shards"] == before["shards"] and after["source_stamp"] != before["source_stamp"]
    assert after["source_stamp"]["files"][0][2] == os_time
    monkeypatch.setattr(data.prepare, "documents", no_reading)
    prepare(cfg, verbose=False)


@pytest.mark.parametrize("kind", ["gpt2", "bpe"])
def test_documents_end_with_the_end_of_text_token(tmp_path, kind):
    """As GPT-2 was trained: doc, <|endoftext|>, doc. The char vocabulary has no such token: blank lines there."""
    folder = tmp_path / "docs"
    folder.mkdir()
    texts = ["First document.\nIt ends here.", "Second one, a little longer.\n" * 40, "Third <|endoftext|> text."]
    for i, text in enumerate(texts):
        (folder / f"{i}.txt").write_text(text)
    cfg = DataConfig(source="files", path=str(folder), dir=str(tmp_path / "out"), tokenizer=kind,
                     vocab_size=300, val_fraction=0.01)
    out = prepare(cfg, verbose=False)
    tok = load_tokenizer(out)
    ids = np.concatenate([shard_tokens(out, "train"), shard_tokens(out, "val")]).tolist()
    head = tok.encode(texts[0]) + [tok.eot_id] + tok.encode(texts[1]) + [tok.eot_id]
    assert ids[:len(head)] == head  # (the val split cuts the last document, so compare up to it)
    assert ids.count(tok.eot_id) == 2  # user text spelling <|endoftext|> stays ordinary text
    assert tok.decode(ids) == "<|endoftext|>".join(texts)
    assert "\x00" not in tok.decode(ids)

    char = prepare(DataConfig(source="files", path=str(folder), dir=str(tmp_path / "char"), val_fraction=0.01),
                   verbose=False)
    assert "\x00" not in load_tokenizer(char).decode(list(range(load_tokenizer(char).vocab_size)))


def test_source_stamps_of_hugging_face_sources(tmp_path):
    from data.sources import source_stamp

    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"text": "a"}\n')
    past = time.time_ns() - 60 * 10**9
    os.utime(rows, ns=(past, past))
    local = source_stamp(DataConfig(source="hf", hf_name="json", path=str(rows), dir=str(tmp_path)))
    assert local == {"hub": "json", "files": [[str(rows), rows.stat().st_size, past]]}
    # data files inside a hub repository or at a URL are not local: named, not an error
    remote = source_stamp(DataConfig(source="hf", hf_name="allenai/c4", path="en/c4-train.0000*-of-01024.json.gz",
                                     dir=str(tmp_path)))
    assert remote == {"hub": "allenai/c4", "data_files": "en/c4-train.0000*-of-01024.json.gz"}
    # a local folder of data files (not only save_to_disk folders) is watched file by file
    folder = tmp_path / "raw"
    folder.mkdir()
    (folder / "a.json").write_text("{}")
    os.utime(folder / "a.json", ns=(past, past))
    stamp = source_stamp(DataConfig(source="hf", hf_name=str(folder), dir=str(tmp_path)))
    assert stamp["files"] == [[str(folder / "a.json"), 2, past]]


def test_many_shards_and_stale_ones_removed(tmp_path, tiny_text):
    cfg = tiny_cfg(tmp_path, shard_tokens=300_000)
    folder = prepare(cfg, verbose=False)
    meta = read_meta(folder)
    assert meta["shards"]["train"] == [f"train_{i:04d}.bin" for i in range(4)]
    sizes = [(folder / n).stat().st_size // 2 for n in meta["shards"]["train"]]
    assert sizes == [300_000, 300_000, 300_000, 103_854]
    tok = load_tokenizer(folder)
    assert shard_tokens(folder, "train").tolist() == tok.encode(tiny_text[:1_003_854])
    cfg.shard_tokens = 600_000
    prepare(cfg, verbose=False)
    assert sorted(p.name for p in folder.glob("train_*.bin")) == ["train_0000.bin", "train_0001.bin"]


def test_non_ascii_text_is_split_by_characters(tmp_path):
    text = "日本語のテキスト、そして English words.\n" * 40 + "émoji 🙂\n" * 10
    path = tmp_path / "t.txt"
    path.write_text(text, encoding="utf-8")
    folder = prepare(DataConfig(source="files", path=str(path), dir=str(tmp_path / "o")), verbose=False)
    meta = read_meta(folder)
    n_train = split_point(len(text), 0.1)
    assert meta["chars"] == {"train": n_train, "val": len(text) - n_train}
    assert meta["bytes"]["train"] == len(text[:n_train].encode()) == byte_offset(path, n_train)
    tok = load_tokenizer(folder)
    assert tok.decode(shard_tokens(folder, "val").tolist()) == text[n_train:]


def test_vocabulary_beyond_uint16_uses_uint32_or_is_refused(tmp_path):
    chars = [chr(c) for c in [*range(0x4E00, 0xA000), *range(0xAC00, 0xD7A4), *range(0x20000, 0x2A6D0)]]
    assert len(chars) > 65536
    path = tmp_path / "wide.txt"
    path.write_text("".join(chars) * 2, encoding="utf-8")
    cfg = DataConfig(source="files", path=str(path), dir=str(tmp_path / "o"))
    folder = prepare(cfg, verbose=False)
    meta = read_meta(folder)
    assert (meta["dtype"], meta["vocab_size"]) == ("uint32", len(chars))
    assert shard_tokens(folder, "val").max() >= 65536
    cfg.dtype = "uint16"
    with pytest.raises(ValueError, match=f"data.dtype: a vocabulary of {len(chars)} tokens does not fit uint16"):
        prepare(cfg, verbose=False)
    assert not (folder / "meta.json").exists()


@pytest.mark.parametrize("kind", ["gpt2", "bpe"])
def test_chunked_tokenization_equals_whole_text(tmp_path, kind):
    """Chunk boundaries are placed where no BPE pre-token can cross them, even in awkward whitespace."""
    text = ("Hello  \n\n   world\n\tindent\nx\ny\r\nz \u3000\nword\n\u00a0\nend's\n123\n456\n.\n,\n"
            "中文\n文本\n" + TINY.read_text()[:20_000]) * 3
    path = tmp_path / "t.txt"
    path.write_bytes(text.encode())
    if kind == "gpt2":
        tok = gpt2_tokenizer()
    else:
        from data.bpe_train import train_bpe
        tok = train_bpe([text], 400)
    pieces = list(chunks(path, 0, path.stat().st_size, 64))
    assert len(pieces) > 100 and pieces[0][0] == 0 and pieces[-1][1] == path.stat().st_size
    assert all(a < b for a, b in pieces) and all(p[1] == q[0] for p, q in zip(pieces, pieces[1:]))
    chunked = [i for a, b in pieces for i in tok.encode(read_range(path, a, b))]
    assert chunked == tok.encode(text)


@pytest.mark.slow
def test_bpe_in_two_processes_matches_single_process(tmp_path, monkeypatch, tiny_text):
    monkeypatch.setattr(data.encode, "CHUNK_BYTES", 100_000)  # ~10 tasks per split for the 2 workers
    folder = prepare(tiny_cfg(tmp_path, tokenizer="bpe", vocab_size=512, num_proc=2), verbose=False)
    meta = read_meta(folder)
    assert (meta["tokenizer"], meta["vocab_size"], meta["eot_id"]) == ("bpe", 512, 511)
    tok = load_tokenizer(folder)
    assert shard_tokens(folder, "train").tolist() == tok.encode(tiny_text[:1_003_854])
    assert shard_tokens(folder, "val").tolist() == tok.encode(tiny_text[1_003_854:])
    assert leftovers(folder) == []


def test_failed_prepare_leaves_nothing_a_later_run_would_use(tmp_path, monkeypatch):
    cfg = tiny_cfg(tmp_path, shard_tokens=200_000)
    folder = prepare(cfg, verbose=False)
    real = data.prepare.encode_range

    def dies_midway(*args, **kwargs):
        for n, ids in enumerate(real(*args, **kwargs)):
            if n == 1:
                raise KeyboardInterrupt  # as if killed while writing
            yield ids

    monkeypatch.setattr(data.encode, "CHUNK_BYTES", 300_000)
    monkeypatch.setattr(data.prepare, "encode_range", dies_midway)
    cfg.val_fraction = 0.2
    with pytest.raises(KeyboardInterrupt):
        prepare(cfg, verbose=False)
    assert not (folder / "meta.json").exists() and leftovers(folder) == []
    with pytest.raises(ValueError, match="no meta.json"):
        ShardLoader(folder, "train", 2, 8, seed=0)
    monkeypatch.setattr(data.prepare, "encode_range", real)
    prepare(cfg, verbose=False)
    assert read_meta(folder)["chars"]["val"] == 1_115_394 - split_point(1_115_394, 0.2)


def test_stale_temp_files_of_dead_runs_are_cleaned(tmp_path):
    folder = tmp_path / "o"
    folder.mkdir()
    temp_name(folder / "train_0000.bin", pid=999999999).write_bytes(b"partial")  # a dead writer's
    (folder / "notes.txt").write_text("mine")
    prepare(tiny_cfg(folder), verbose=False)
    assert leftovers(folder) == [] and (folder / "notes.txt").exists()


@pytest.mark.parametrize("content, cfg_change, message", [
    ("", {}, "empty corpus"),
    ("x", {}, "leaves an empty split"),
    ("some text", {"val_fraction": 1.0}, "data.val_fraction: 1.0 must lie strictly between 0 and 1"),
    ("some text", {"val_fraction": 0.0}, "data.val_fraction"),
    ("some text", {"tokenizer": "bpe", "vocab_size": 70000, "dtype": "uint16"}, "data.vocab_size: 70000 does not fit"),
])
def test_bad_input_is_a_one_line_value_error(tmp_path, content, cfg_change, message):
    path = tmp_path / "in.txt"
    path.write_text(content)
    cfg = DataConfig(source="files", path=str(path), dir=str(tmp_path / "o"), **cfg_change)
    with pytest.raises(ValueError, match=message) as err:
        prepare(cfg, verbose=False)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "o" / "meta.json").exists()
