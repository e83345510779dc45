"""data.atomic: a file or folder is either the old one or the whole new one, and no temporary is left behind."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from data import atomic
from data.atomic import (AtomicFile, atomic_dir, atomic_file, is_temp_name, old_name, swapped_out, temp_name,
                         temp_owner, write_text_atomic)


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_temp_names_are_hidden_siblings_that_say_their_owner(tmp_path):
    target = tmp_path / "meta.json"
    a, b = temp_name(target), temp_name(target)
    assert a.parent == tmp_path and a.name.startswith(".meta.json.tmp-") and a != b  # two writers never collide
    assert is_temp_name(a.name) and temp_owner(a.name) == os.getpid()
    assert temp_owner(temp_name(target, pid=4242).name) == 4242
    assert temp_owner("meta.json") is None and not is_temp_name(".hidden") and temp_owner(".x.tmp-abc-1") is None
    assert "tfevents" not in temp_name(tmp_path / "events.out.tfevents.1", tag="rewrite").name


def test_a_failure_mid_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "f.txt"
    path.write_text("old")
    with pytest.raises(RuntimeError, match="disk on fire"):
        with atomic_file(path, "w") as f:
            f.write("new, half")
            assert path.read_text() == "old"  # nothing reaches the final name while writing
            raise RuntimeError("disk on fire")
    assert path.read_text() == "old" and names(tmp_path) == ["f.txt"]
    with atomic_file(path, "w", encoding="utf-8") as f:
        f.write("new \u00e9")
    assert path.read_text(encoding="utf-8") == "new \u00e9" and names(tmp_path) == ["f.txt"]


def test_a_failed_rename_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "f.bin"
    path.write_bytes(b"old")

    def refuse(src, dst):
        raise OSError("read-only filesystem")

    monkeypatch.setattr(atomic.os, "replace", refuse)
    with pytest.raises(OSError, match="read-only"):
        atomic.write_bytes_atomic(path, b"new")
    assert path.read_bytes() == b"old" and names(tmp_path) == ["f.bin"]


def test_a_killed_writer_never_shows_under_the_final_name(tmp_path):
    """A process killed before commit leaves only its temporary, which `temp_owner` ties to the dead pid."""
    path = tmp_path / "train_0000.bin"
    out = AtomicFile(path)
    out.file.write(b"\x01\x02")
    out.file.close()  # the process dies here: no commit, no discard
    assert not path.exists() and [temp_owner(n) for n in names(tmp_path)] == [os.getpid()]


def test_fsync_reaches_the_disk_before_the_rename(tmp_path, monkeypatch):
    order = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(atomic.os, "fsync", lambda fd: (order.append("fsync"), real_fsync(fd)))
    monkeypatch.setattr(atomic.os, "replace", lambda a, b: (order.append("replace"), real_replace(a, b)))
    with atomic_file(tmp_path / "events", fsync=True, tag="rewrite") as f:
        f.write(b"record")
    assert order == ["fsync", "replace"] and (tmp_path / "events").read_bytes() == b"record"


def test_write_text_atomic_replaces_the_whole_file(tmp_path):
    path = tmp_path / "t.json"
    write_text_atomic(path, "a much longer first version")
    write_text_atomic(path, "short")
    assert path.read_text() == "short" and names(tmp_path) == ["t.json"]


def _folder(path: Path, text: str) -> None:
    path.mkdir()
    (path / "weights").write_text(text)


def test_a_folder_is_replaced_whole_or_not_at_all(tmp_path):
    out = tmp_path / "latest"
    with atomic_dir(out) as tmp:
        assert not out.exists() and is_temp_name(tmp.name)
        (tmp / "weights").write_text("v1")
    assert (out / "weights").read_text() == "v1"
    with pytest.raises(KeyboardInterrupt):
        with atomic_dir(out) as tmp:
            (tmp / "weights").write_text("v2, half")
            raise KeyboardInterrupt  # Ctrl-C mid-save
    assert (out / "weights").read_text() == "v1" and names(tmp_path) == ["latest"]
    with atomic_dir(out) as tmp:
        (tmp / "weights").write_text("v2")
        (tmp / "extra").write_text("x")
    assert names(out) == ["extra", "weights"] and (out / "weights").read_text() == "v2"
    assert names(tmp_path) == ["latest"]  # neither the temporary nor the old copy is left


def test_a_swap_cut_between_its_renames_is_found_and_repaired(tmp_path):
    out = tmp_path / "best"
    _folder(out, "v1")
    os.replace(out, old_name(out))  # killed after the first rename of a swap
    assert swapped_out(out) == old_name(out) and (swapped_out(out) / "weights").read_text() == "v1"
    with atomic_dir(out) as tmp:
        (tmp / "weights").write_text("v2")
    assert (out / "weights").read_text() == "v2" and names(tmp_path) == ["best"] and swapped_out(out) is None


def test_a_failed_save_after_a_cut_swap_keeps_the_old_folder(tmp_path):
    out = tmp_path / "best"
    _folder(out, "v1")
    os.replace(out, old_name(out))
    with pytest.raises(ValueError):
        with atomic_dir(out):
            raise ValueError("tokenizer would not save")
    assert (swapped_out(out) / "weights").read_text() == "v1"  # still where readers look for it
