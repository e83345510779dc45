"""The TensorBoard backend of the tracker: event files in out_dir/tensorboard/, readable with no network and no
account (`tensorboard --logdir checkpoints` compares every run below it).

A resumed run appends to the same folder. Events past the resumed step, written by the process that was stopped
after its last checkpoint, are removed from the old event files first (rewritten under a temporary name and
renamed), so every tag has each step once for any reader, TensorBoard's own or another.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from data.atomic import atomic_file

EVENTS_PREFIX = "events.out.tfevents."
BEST_METRIC = "val/best_loss"  # the hparams dashboard's metric: logged as a scalar at every evaluation


def drop_events_after(folder: Path, step: int) -> int:
    """Rewrite each event file in `folder` without the events whose step is past `step`; returns how many went."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.summary.writer.record_writer import RecordWriter

    dropped = 0
    for path in sorted(folder.glob(EVENTS_PREFIX + "*")):
        records = list(RawEventFileLoader(str(path)).Load())  # stops quietly at a record cut short by a kill
        keep = [r for r in records if Event.FromString(r).step <= step]
        if len(keep) == len(records) and path.stat().st_size > 0:
            continue
        dropped += len(records) - len(keep)
        # tagged without "tfevents": TensorBoard reads every file whose name holds it, and must not see this one
        with atomic_file(path, fsync=True, tag="events-rewrite") as f:
            writer = RecordWriter(f)
            for r in keep:
                writer.write(r)
            writer.flush()
    return dropped


def flat_hparams(config: dict, prefix: str = "") -> dict[str, Any]:
    """{"model": {"n_layer": 2}} -> {"model.n_layer": 2}; values TensorBoard cannot hold become strings."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flat_hparams(value, name + "."))
        elif isinstance(value, (bool, int, float, str)):
            out[name] = value
        else:
            out[name] = str(value)
    return out


def _code_block(text: str) -> str:
    """Markdown that shows `text` verbatim (TensorBoard renders text summaries as markdown)."""
    return "\n".join("    " + line for line in text.splitlines() or [""])


def stats_table(stats: list[dict], keys: tuple[str, ...]) -> str:
    """The head statistics as a markdown table, one row per head."""
    head = ["layer", "head", "label", *keys]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in stats:
        cells = [str(s["layer"]), str(s["head"]), s["label"]]
        cells += ["" if s.get(k) is None else f"{s[k]:.3f}" for k in keys]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


class TensorBoardLog:
    """Scalars under their metrics.jsonl names, samples as text, the probe's figures as images, the resolved
    config as hparams (written once, into the run's first event file)."""

    def __init__(self, folder: Path, run_config: dict, resume_step: int | None = None):
        from torch.utils.tensorboard import SummaryWriter

        folder.mkdir(parents=True, exist_ok=True)
        if resume_step is not None:
            drop_events_after(folder, resume_step)
        first = not any(folder.glob(EVENTS_PREFIX + "*"))  # also a run resumed that had no TensorBoard before
        self.writer = SummaryWriter(log_dir=str(folder), flush_secs=10)
        self.last_step: dict[str, int] = {}
        if first:
            from torch.utils.tensorboard.summary import hparams

            for summary in hparams(flat_hparams(run_config), {BEST_METRIC: math.nan}):
                self.writer.file_writer.add_summary(summary)

    def log(self, record: dict[str, Any]) -> None:
        step = int(record["step"])
        for key, value in record.items():
            if key == "step" or not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            if self.last_step.get(key, -1) < step:  # `tokens` and `elapsed_s` come with both the train and eval lines
                self.writer.add_scalar(key, float(value), step)
                self.last_step[key] = step

    def log_eval(self, step: int, samples: list[str], probe: dict | None) -> None:
        if samples:
            text = "\n\n".join(f"sample {i + 1}:\n\n{_code_block(s)}" for i, s in enumerate(samples))
            self.writer.add_text("samples", text, step)
        if probe is not None:
            from inspector.plots import to_array
            from inspector.stats import STAT_KEYS

            for name, key in (("attn/grid", "figure"), ("attn/head_scores", "scores_figure")):
                self.writer.add_image(name, np.ascontiguousarray(to_array(probe[key])), step, dataformats="HWC")
            self.writer.add_text("attn/head_stats", stats_table(probe["stats"], STAT_KEYS), step)
        self.writer.flush()  # an evaluation is what a user opens the dashboard to see

    def finish(self) -> None:
        self.writer.close()
