"""Write-then-rename, so a killed process never leaves a half-written file under its final name."""
from __future__ import annotations

import os
from pathlib import Path


def temp_name(path: Path) -> Path:
    """The hidden temporary twin of `path` in the same folder (same filesystem, so os.replace is atomic)."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def is_temp_name(name: str) -> bool:
    return name.startswith(".") and name.endswith(".tmp")


def write_bytes_atomic(path: Path, data: bytes) -> None:
    tmp = temp_name(path)
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomic(path: Path, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))
