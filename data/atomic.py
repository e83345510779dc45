"""Atomic writes, one scheme for files and for folders: build under a hidden temporary name beside the target, then
rename into place, so a killed process never leaves a half-written file or folder under its final name.

Temporary names are `.NAME.tmp-PID-RANDOM` (same folder, so the rename stays on one filesystem and is atomic; the
pid tells a later run whether their writer is still alive, `temp_owner`). A folder cannot replace a non-empty folder
in one rename, so `atomic_dir` swaps in two: the old one goes to `.NAME.old` first, and a swap cut between its
renames is repaired by the next one (`swapped_out` finds it meanwhile): at every moment either the old or the new
folder is whole.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from pathlib import Path
from typing import IO, Iterator

TEMP_MARK = ".tmp-"


def temp_name(path: Path, pid: int | None = None, tag: str | None = None) -> Path:
    """The hidden temporary twin of `path` in the same folder. `tag` replaces the name part, for readers that
    would pick up any file whose name holds the target's (TensorBoard reads every "*tfevents*")."""
    return path.with_name(f".{tag or path.name}{TEMP_MARK}{os.getpid() if pid is None else pid}-{uuid.uuid4().hex[:8]}")


def is_temp_name(name: str) -> bool:
    return name.startswith(".") and TEMP_MARK in name


def temp_owner(name: str) -> int | None:
    """The pid of the process that made the temporary name `name`; None if it is not one."""
    if not is_temp_name(name):
        return None
    pid = name.rsplit(TEMP_MARK, 1)[1].split("-", 1)[0]
    return int(pid) if pid.isdigit() else None


class AtomicFile:
    """A file written under its temporary name: `commit` renames it into place, `discard` deletes it. For writers
    that stream into a file across calls (the shard writer); `atomic_file` is the one-block form."""

    def __init__(self, path: Path, mode: str = "wb", fsync: bool = False, tag: str | None = None, **open_kw):
        self.path, self.fsync = Path(path), fsync
        self.tmp = temp_name(self.path, tag=tag)
        self.file: IO = open(self.tmp, mode, **open_kw)

    def commit(self) -> Path:
        try:
            if self.fsync:  # the bytes reach the disk before the name does: a power cut keeps the old file
                self.file.flush()
                os.fsync(self.file.fileno())
            self.file.close()
            os.replace(self.tmp, self.path)
        finally:
            self.discard()
        return self.path

    def discard(self) -> None:
        self.file.close()
        self.tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_file(path: Path, mode: str = "wb", fsync: bool = False, tag: str | None = None,
                **open_kw) -> Iterator[IO]:
    """`with atomic_file(path, "w") as f: ...`: `path` holds the old content until the block succeeds, then all of
    the new; an exception leaves the old file as it was and no temporary file behind."""
    out = AtomicFile(Path(path), mode, fsync, tag, **open_kw)
    try:
        yield out.file
    except BaseException:
        out.discard()
        raise
    out.commit()


def write_bytes_atomic(path: Path, data: bytes) -> None:
    with atomic_file(path, "wb") as f:
        f.write(data)


def write_text_atomic(path: Path, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def old_name(final: Path) -> Path:
    return final.with_name(f".{final.name}.old")


def swapped_out(final: Path) -> Path | None:
    """Where the whole previous version of folder `final` is after a swap cut between its two renames (final/
    gone, `.NAME.old` left), else None."""
    old = old_name(final)
    return old if old.is_dir() and not final.exists() else None


@contextlib.contextmanager
def atomic_dir(final: Path) -> Iterator[Path]:
    """`with atomic_dir(out) as tmp: write into tmp`: then tmp replaces `out` (any previous `out` is removed only
    once the new one is in place); an exception removes tmp and leaves `out` as it was."""
    final = Path(final)
    tmp = staging_dir(final)
    try:
        yield tmp
        swap_in(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def staging_dir(final: Path) -> Path:
    """A fresh hidden twin of folder `final` to write into; `swap_in` makes it `final`. The two halves of
    `atomic_dir`, for writers that fill the twin from several processes (a sharded checkpoint)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(final)
    tmp.mkdir()
    return tmp


def swap_in(tmp: Path, final: Path) -> None:
    """Replace folder `final` by the complete folder `tmp` with renames; between them `.NAME.old` holds the old."""
    old = old_name(final)
    if swapped_out(final):
        os.replace(old, final)  # an earlier swap was cut between its renames: restore before replacing
    if old.exists():
        shutil.rmtree(old)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)
