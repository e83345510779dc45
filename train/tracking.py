"""Where metrics go: one Tracker fans the same records out to its backends, always a local metrics.jsonl, plus
wandb and TensorBoard when the config enables them (both can be on at once).

wandb's mode comes from the environment (WANDB_MODE=offline|disabled), so the same code serves online users,
air-gapped machines and tests. TensorBoard only ever writes local event files (train/tensorboard_log.py).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from data.atomic import write_text_atomic
from data.json_safe import json_safe


def _step_of(line: str) -> int | None:
    """The step of a metrics line; None for a line cut short by a kill (it is dropped)."""
    try:
        return int(json.loads(line).get("step", 0))
    except (ValueError, AttributeError, TypeError):
        return None


class MetricsLog:
    """Append-only JSON lines; on resume, lines past the resumed step are dropped so none repeat."""

    def __init__(self, path: Path, resume_step: int | None = None):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is None:
            write_text_atomic(path, "")
        elif path.exists():  # rewritten whole or not at all: a kill here must not lose the run's history
            keep = [ln for ln in path.read_text().splitlines() if _step_of(ln) is not None and _step_of(ln) <= resume_step]
            write_text_atomic(path, "".join(ln + "\n" for ln in keep))

    def write(self, record: dict[str, Any]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(json_safe(record)) + "\n")


class WandbLog:
    """A wandb run: scalars against `step`, samples and head statistics as tables, attention figures as images."""

    def __init__(self, out_dir: Path, run_config: dict, project: str, run_name: str, run_id: str | None):
        import wandb  # imported lazily: starting wandb costs seconds

        os.environ.setdefault("WANDB_ERROR_REPORTING", "false")
        try:
            self.run = wandb.init(project=project, name=run_name or None, config=run_config,
                                  dir=str(out_dir), id=run_id, resume="allow" if run_id else None)
        except Exception as e:  # noqa: BLE001 - wandb raises its own error types (no login, no network)
            raise ValueError(f"log.wandb: wandb could not start ({type(e).__name__}: {e}); run `wandb login`, "
                             "or set WANDB_MODE=offline to log locally") from None
        self.run.define_metric("*", step_metric="step")

    def log(self, record: dict[str, Any]) -> None:
        self.run.log(record)

    def log_eval(self, step: int, samples: list[str], probe: dict | None) -> None:
        import wandb

        from inspector.report import wandb_media

        media: dict = {}
        if samples:
            media["samples"] = wandb.Table(columns=["step", "sample"], data=[[step, s] for s in samples])
        if probe is not None:
            media.update(wandb_media(probe))
        if media:
            self.run.log({"step": step, **media})

    def finish(self) -> None:
        self.run.finish()


class Tracker:
    """metrics.jsonl plus the optional wandb and TensorBoard backends (rank 0 only), fed the same records."""

    def __init__(self, out_dir: Path, run_config: dict, use_wandb: bool, project: str, run_name: str,
                 resume_step: int | None = None, run_id: str | None = None, tensorboard: bool = False):
        self.metrics = MetricsLog(out_dir / "metrics.jsonl", resume_step)
        if resume_step is not None:  # attention frames past the resumed step would repeat too
            from inspector.film import drop_frames_after

            drop_frames_after(out_dir, resume_step)
        self.wandb = WandbLog(out_dir, run_config, project, run_name, run_id) if use_wandb else None
        self.tensorboard = None
        if tensorboard:
            from train.tensorboard_log import TensorBoardLog  # lazily: tensorboard imports take a second

            self.tensorboard = TensorBoardLog(out_dir / "tensorboard", run_config, resume_step)

    @property
    def backends(self) -> list:
        return [b for b in (self.wandb, self.tensorboard) if b is not None]

    @property
    def run_id(self) -> str | None:
        return self.wandb.run.id if self.wandb is not None else None

    def log(self, record: dict[str, Any]) -> None:
        self.metrics.write(record)
        for backend in self.backends:
            backend.log(record)

    def log_eval(self, step: int, samples: list[str], probe: dict | None) -> None:
        """What an evaluation saw beyond scalars: the samples and the attention probe (`probe_attention`'s result)."""
        for backend in self.backends:
            backend.log_eval(step, samples, probe)

    def finish(self) -> None:
        for backend in self.backends:
            backend.finish()
