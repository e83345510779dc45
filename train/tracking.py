"""Where metrics go: always a local metrics.jsonl, and wandb when the config enables it.

wandb's mode comes from the environment (WANDB_MODE=offline|disabled), so the same code serves online users,
air-gapped machines and tests.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any


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
            path.write_text("")
        elif path.exists():
            keep = [ln for ln in path.read_text().splitlines() if _step_of(ln) is not None and _step_of(ln) <= resume_step]
            path.write_text("".join(ln + "\n" for ln in keep))

    def write(self, record: dict[str, Any]) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        with self.path.open("a") as f:
            f.write(json.dumps(clean) + "\n")


class Tracker:
    """metrics.jsonl plus an optional wandb run (rank 0 only)."""

    def __init__(self, out_dir: Path, run_config: dict, use_wandb: bool, project: str, run_name: str,
                 resume_step: int | None = None, run_id: str | None = None):
        self.metrics = MetricsLog(out_dir / "metrics.jsonl", resume_step)
        self.wandb = None
        if use_wandb:
            import wandb  # imported lazily: starting wandb costs seconds

            os.environ.setdefault("WANDB_ERROR_REPORTING", "false")
            try:
                self.wandb = wandb.init(project=project, name=run_name or None, config=run_config,
                                        dir=str(out_dir), id=run_id, resume="allow" if run_id else None)
            except Exception as e:  # noqa: BLE001 - wandb raises its own error types (no login, no network)
                raise ValueError(f"log.wandb: wandb could not start ({type(e).__name__}: {e}); run `wandb login`, "
                                 "or set WANDB_MODE=offline to log locally") from None
            self.wandb.define_metric("*", step_metric="step")

    @property
    def run_id(self) -> str | None:
        return self.wandb.id if self.wandb is not None else None

    def log(self, record: dict[str, Any]) -> None:
        self.metrics.write(record)
        if self.wandb is not None:
            self.wandb.log(record)

    def log_media(self, step: int, media: dict[str, Any]) -> None:
        """wandb-only objects (images, tables), built by the caller from plain data."""
        if self.wandb is not None and media:
            self.wandb.log({"step": step, **media})

    def finish(self) -> None:
        if self.wandb is not None:
            self.wandb.finish()
