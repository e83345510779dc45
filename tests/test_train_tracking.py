"""train.tracking: metrics.jsonl rows, a resume that never repeats a step, non-finite values as null.

(wandb and TensorBoard are driven end to end in test_train.py and test_tracking_tensorboard.py.)
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from train.tracking import MetricsLog, Tracker


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def tracker(out: Path, resume_step: int | None = None) -> Tracker:
    return Tracker(out, {"model": {}}, use_wandb=False, project="p", run_name="", resume_step=resume_step)


def test_every_record_is_one_json_line_in_order(tmp_path):
    t = tracker(tmp_path)
    t.log({"step": 1, "train/loss": 4.5, "lr": 1e-3})
    t.log({"step": 2, "train/loss": 4.25, "tokens": 512})
    t.finish()
    assert rows(tmp_path / "metrics.jsonl") == [{"step": 1, "train/loss": 4.5, "lr": 1e-3},
                                                {"step": 2, "train/loss": 4.25, "tokens": 512}]
    assert t.backends == [] and t.run_id is None


def test_non_finite_values_are_written_as_null(tmp_path):
    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.write({"step": 3, "train/loss": math.nan, "grad_norm": math.inf, "val/loss": -math.inf, "mfu": 0.25})
    text = (tmp_path / "metrics.jsonl").read_text()
    assert "NaN" not in text and "Infinity" not in text  # strict JSON
    assert rows(tmp_path / "metrics.jsonl") == [{"step": 3, "train/loss": None, "grad_norm": None,
                                                 "val/loss": None, "mfu": 0.25}]


def test_a_fresh_run_starts_an_empty_log(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 9}\n')
    tracker(tmp_path).log({"step": 1})
    assert rows(tmp_path / "metrics.jsonl") == [{"step": 1}]


def test_resume_drops_what_came_after_the_checkpoint_so_no_step_repeats(tmp_path):
    t = tracker(tmp_path)
    for step in (10, 20, 30):
        t.log({"step": step, "train/loss": 1.0 / step})
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 40, "train/lo')  # the stopped process was killed mid-line
    for step in (10, 30):  # the evaluations it saved attention frames for
        (tmp_path / "attention" / f"step_{step:06d}").mkdir(parents=True)
    resumed = tracker(tmp_path, resume_step=20)  # the checkpoint it resumes from is step 20
    assert [r["step"] for r in rows(tmp_path / "metrics.jsonl")] == [10, 20]
    assert sorted(p.name for p in (tmp_path / "attention").iterdir()) == ["step_000010"]
    resumed.log({"step": 30, "train/loss": 0.5})
    steps = [r["step"] for r in rows(tmp_path / "metrics.jsonl")]
    assert steps == [10, 20, 30] and len(set(steps)) == len(steps)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # the rewrite left no temporary


def test_resume_without_an_earlier_log_starts_one(tmp_path):
    tracker(tmp_path, resume_step=5).log({"step": 6})
    assert rows(tmp_path / "metrics.jsonl") == [{"step": 6}]
