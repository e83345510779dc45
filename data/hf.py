"""Hugging Face datasets as a source: a hub name (downloaded or streamed), a builder over local data files
(`hf_name = "json"` with `data.path = "stories/*.jsonl"`), or a folder written by `save_to_disk`.

`datasets` is imported only here, so the other sources start fast.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

from data.config import DataConfig

BATCH_ROWS = 1000


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def is_saved_dataset(path: Path) -> bool:
    """A folder written by Dataset.save_to_disk or DatasetDict.save_to_disk."""
    return (path / "dataset_dict.json").is_file() or (path / "state.json").is_file()


def load(cfg: DataConfig) -> Any:
    """The configured split as a datasets.Dataset or IterableDataset; failures become one-line ValueErrors."""
    import datasets

    folder = Path(cfg.hf_name).expanduser()
    if folder.is_dir() and is_saved_dataset(folder):
        try:
            ds = datasets.load_from_disk(str(folder))
        except Exception as e:  # a damaged or foreign folder
            raise ValueError(f"data.hf_name: cannot load the saved dataset {cfg.hf_name}: {_first_line(e)}") from None
        if isinstance(ds, datasets.DatasetDict):
            if cfg.hf_split not in ds:
                raise ValueError(f"data.hf_split: {cfg.hf_split!r} is not a split of {cfg.hf_name} "
                                 f"(splits: {', '.join(ds)})")
            ds = ds[cfg.hf_split]
        return ds.to_iterable_dataset() if cfg.streaming else ds
    try:
        return datasets.load_dataset(cfg.hf_name, cfg.hf_config or None, split=cfg.hf_split,
                                     streaming=cfg.streaming, data_files=cfg.path or None)
    except Exception as e:  # datasets raises many kinds (not found, offline, bad split); the user needs one line
        raise ValueError(f"data.hf_name: cannot load {cfg.hf_name!r}: {_first_line(e)}") from None


def hf_documents(cfg: DataConfig) -> Iterator[list[str]]:
    """One document per row: the text of column `data.hf_text_field`; empty rows are skipped."""
    ds = load(cfg)
    field = cfg.hf_text_field
    columns = getattr(ds, "column_names", None)  # None for some streamed datasets: checked on the first batch
    if columns is not None and field not in columns:
        raise ValueError(f"data.hf_text_field: {field!r} is not a column of {cfg.hf_name} (columns: {', '.join(columns)})")
    for batch in ds.iter(batch_size=BATCH_ROWS):
        if field not in batch:
            raise ValueError(f"data.hf_text_field: {field!r} is not a column of {cfg.hf_name} "
                             f"(columns: {', '.join(batch)})")
        for text in batch[field]:
            if text is None:
                continue
            if not isinstance(text, str):
                raise ValueError(f"data.hf_text_field: column {field!r} holds {type(text).__name__}, not text")
            yield [text]
