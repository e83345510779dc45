"""Where a checkpoint's data folder is, wherever the run folder has gone since training.

A checkpoint's config.json keeps `data_location`: the prepared folder's absolute path, its path relative to the
checkpoint directory, and the sha256 of its text. The relative path finds the data after the run and data folders
were moved or copied together (another machine, another mount point), the absolute one after the run folder alone
moved, and the checksum tells a folder holding other text apart from the right one.
"""
from __future__ import annotations

import os
from pathlib import Path

from data.meta import read_meta

KEY = "data_location"


def data_location(data_dir: str | os.PathLike, checkpoint_dir: str | os.PathLike) -> dict:
    """What config.json records about the data folder of a checkpoint written to `checkpoint_dir`."""
    data = Path(data_dir).resolve()
    return {"dir": str(data), "dir_from_checkpoint": os.path.relpath(data, Path(checkpoint_dir).resolve()),
            "text_sha256": read_meta(data)["text_sha256"]}


def find_data_dir(checkpoint_dir: Path, config: dict, override: str | None = None) -> Path:
    """The prepared data folder the run trained on (`override`: the caller's guess, tried alone); a one-line
    ValueError saying where it looked and which text it wants when none is found."""
    where = config.get(KEY) or {}
    want = where.get("text_sha256")
    if override:
        candidates = [Path(override)]
    else:
        named = (config.get("data") or {}).get("dir")
        candidates = [Path(checkpoint_dir) / where["dir_from_checkpoint"]] if where.get("dir_from_checkpoint") else []
        candidates += [Path(p) for p in (where.get("dir"), named) if p]
    if not candidates:
        raise ValueError(f"{checkpoint_dir}: the checkpoint names no data folder")
    other = None
    for folder in dict.fromkeys(c.resolve() for c in candidates):
        try:
            sha = read_meta(folder)["text_sha256"]
        except ValueError:
            continue
        if want is None or sha == want:
            return folder
        other = other or folder
    hint = f" (its text has sha256 {want[:12]}...)" if want else ""
    if other is not None:
        raise ValueError(f"data folder {other} holds other text than {checkpoint_dir} was trained on{hint}")
    looked = ", ".join(str(c) for c in dict.fromkeys(candidates))
    raise ValueError(f"the data folder of {checkpoint_dir} was not found (looked in {looked}){hint}")
