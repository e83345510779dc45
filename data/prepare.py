"""Text -> tokenizer -> token shards + meta.json: everything training, evaluation and sampling read.

Steps: if meta.json shows shards built from the same settings and an unchanged source (a cheap stamp: file sizes and
times, package versions), reuse them at once; else stream the source into a staged corpus file (checksummed); if
meta.json shows shards built from the same settings and the same text, reuse them; otherwise split the text (the
last val_fraction of its characters is validation), build the tokenizer (char vocabulary of the whole text, or a
BPE trained on the train split), tokenize each split in chunks, possibly in parallel, into shards, and write
meta.json last.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from tqdm import tqdm

from data.atomic import temp_name, temp_owner
from data.config import DTYPE_LIMITS, DataConfig
from data.corpus import DOC_SEP, CorpusStats, byte_offset, chunks, read_range, split_point, write_corpus
from data.encode import CHUNK_BYTES, encode_range, resolve_num_proc
from data.meta import META_FILE, SPLITS, read_meta, write_meta
from data.shards import SHARD_RE, ShardWriter, tokens_on_disk
from data.sources import corpus_pieces, describe, documents, source_stamp
from data.tokenizers import TOKENIZER_FILE, CharTokenizer, Tokenizer, gpt2_tokenizer


def fingerprint(cfg: DataConfig) -> dict:
    """The settings that decide the shards' contents; meta.json keeps them, and any change rebuilds."""
    fp = {"source": cfg.source, "tokenizer": cfg.tokenizer, "val_fraction": cfg.val_fraction,
          "dtype": cfg.dtype, "shard_tokens": cfg.shard_tokens}
    if cfg.tokenizer == "bpe":
        fp["vocab_size"] = cfg.vocab_size
    if cfg.tokenizer != "char":
        fp["documents"] = "eot"  # documents end with the end-of-text token (shards of older builds joined by text)
    if cfg.source != "shakespeare":
        fp["path"] = cfg.path
    if cfg.source == "hf":
        fp.update(hf_name=cfg.hf_name, hf_config=cfg.hf_config, hf_split=cfg.hf_split, hf_text_field=cfg.hf_text_field)
    return fp


def shard_dtype(cfg: DataConfig, vocab_size: int) -> str:
    """uint16 when every id fits (data.dtype = auto), else uint32; an explicit dtype that is too small is an error."""
    if cfg.dtype == "auto":
        return "uint16" if vocab_size <= DTYPE_LIMITS["uint16"] else "uint32"
    if vocab_size > DTYPE_LIMITS[cfg.dtype]:
        raise ValueError(f"data.dtype: a vocabulary of {vocab_size} tokens does not fit {cfg.dtype} "
                         f"(at most {DTYPE_LIMITS[cfg.dtype]} ids); use auto or uint32")
    return cfg.dtype


def is_current(folder: Path, fp: dict, sha256: str | None = None, stamp: dict | None = None) -> bool:
    """meta.json matches these settings and either this text (sha256) or this source stamp, and every shard it lists
    is on disk with the right size."""
    try:
        meta = read_meta(folder)
    except ValueError:
        return False
    if meta.get("config") != fp or not (folder / TOKENIZER_FILE).is_file():
        return False
    if sha256 is not None and meta["text_sha256"] != sha256:
        return False
    if sha256 is None and (stamp is None or meta.get("source_stamp") != stamp):
        return False
    for split in SPLITS:
        on_disk = [tokens_on_disk(folder / name, meta["dtype"]) for name in meta["shards"][split]]
        if min(on_disk, default=-1) < 0 or sum(on_disk) != meta["tokens"][split]:
            return False
    return True


def build_tokenizer(cfg: DataConfig, stats: CorpusStats, corpus: Path, train_end: int) -> Tokenizer:
    if cfg.tokenizer == "char":
        return CharTokenizer(sorted(stats.charset))
    if cfg.tokenizer == "gpt2":
        return gpt2_tokenizer()
    from data.bpe_train import train_bpe
    # document boundaries train as blank lines; the end-of-text token itself is reserved
    pieces = (read_range(corpus, a, b).replace(DOC_SEP, "\n\n") for a, b in chunks(corpus, 0, train_end, CHUNK_BYTES))
    return train_bpe(pieces, cfg.vocab_size)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_files(folder: Path, keep: set[str] | None = None) -> None:
    """Delete temp files left by killed runs and, when `keep` is given, shards that meta.json no longer lists."""
    for path in folder.iterdir():
        name = path.name
        pid = temp_owner(name)
        if pid is not None and os.name != "nt":  # os.kill(pid, 0) is a probe on POSIX only
            if pid != os.getpid() and not _pid_alive(pid):
                path.unlink(missing_ok=True)
        elif keep is not None and SHARD_RE.match(name) and name not in keep:
            path.unlink(missing_ok=True)


def prepare(cfg: DataConfig, verbose: bool = True) -> Path:
    """Write shards, meta.json and tokenizer.json into cfg.dir (or reuse them) and return that folder."""
    cfg.validate()
    out = Path(cfg.dir)
    out.mkdir(parents=True, exist_ok=True)
    remove_stale_files(out)
    fp, stamp = fingerprint(cfg), source_stamp(cfg)
    if stamp is not None and is_current(out, fp, stamp=stamp):
        if verbose:
            print(f"data: {out} is up to date (same settings, source unchanged); reusing its shards", file=sys.stderr)
        return out
    quiet = None if verbose else True  # tqdm: None shows bars on terminals only
    corpus = temp_name(out / "corpus.txt")
    try:
        with tqdm(desc="read", unit="B", unit_scale=True, disable=quiet) as bar:
            char = cfg.tokenizer == "char"  # the char vocabulary has no end-of-text token: blank lines separate
            pieces = corpus_pieces(documents(cfg), separator=None if char else DOC_SEP)
            stats = write_corpus(pieces, corpus, charset=char, progress=bar)
        if stats.chars == 0:
            raise ValueError(f"empty corpus: {describe(cfg)} holds no text")
        if is_current(out, fp, stats.sha256):
            if stamp is not None:  # the text is the same though the stamp moved (a touched file): remember the new one
                write_meta(out, {**{k: v for k, v in read_meta(out).items() if k != "format"}, "source_stamp": stamp})
            if verbose:
                print(f"data: {out} is up to date (same settings and text); reusing its shards", file=sys.stderr)
            return out
        (out / META_FILE).unlink(missing_ok=True)  # from here on the folder is incomplete until meta.json returns
        n_train = split_point(stats.chars, cfg.val_fraction)
        if not 0 < n_train < stats.chars:
            raise ValueError(f"data.val_fraction: {cfg.val_fraction} leaves an empty split of a "
                             f"{stats.chars}-character corpus")
        split_byte = n_train if stats.bytes == stats.chars else byte_offset(corpus, n_train)
        tokenizer = build_tokenizer(cfg, stats, corpus, split_byte)
        dtype = shard_dtype(cfg, tokenizer.vocab_size)
        tokenizer.save(out)
        num_proc = resolve_num_proc(cfg.num_proc, stats.bytes)
        regions = {"train": (0, split_byte), "val": (split_byte, stats.bytes)}
        shards, tokens = {}, {}
        for split, (start, end) in regions.items():
            writer = ShardWriter(out, split, dtype, cfg.shard_tokens)
            try:
                with tqdm(total=end - start, desc=f"tokenize {split}", unit="B", unit_scale=True, disable=quiet) as bar:
                    for ids in encode_range(corpus, start, end, tokenizer, out, dtype, num_proc, progress=bar):
                        writer.write(ids)
            except BaseException:
                writer.abort()
                raise
            shards[split], tokens[split] = writer.close(), writer.total
        write_meta(out, {
            "tokenizer": tokenizer.name, "vocab_size": tokenizer.vocab_size, "eot_id": tokenizer.eot_id,
            "dtype": dtype, "source": describe(cfg), "text_sha256": stats.sha256, "val_fraction": cfg.val_fraction,
            "chars": {"train": n_train, "val": stats.chars - n_train},
            "bytes": {"train": split_byte, "val": stats.bytes - split_byte},
            "tokens": tokens, "shards": shards, "config": fp, "source_stamp": stamp,
        })
        remove_stale_files(out, keep={name for names in shards.values() for name in names})
    finally:
        corpus.unlink(missing_ok=True)
    return out
