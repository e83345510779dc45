"""model.checkpoint: trainer state is loaded without running code, and a refusal costs the user one line."""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from model.checkpoint import TRAINER_STATE, load_trainer_state
from train.loop import train

ROOT = Path(__file__).resolve().parents[1]


class Payload:
    """Unpickling this would create a file: proof that code ran."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def plant(directory: Path, marker: Path) -> None:
    with open(directory / TRAINER_STATE, "wb") as f:
        pickle.dump({"step": 1, "x": Payload(marker)}, f, protocol=4)  # not torch's protocol: torch would warn


def test_pickle_payload_is_refused_silently_without_running(tmp_path):
    marker = tmp_path / "pwned"
    plant(tmp_path, marker)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning would reach the user's stderr
        with pytest.raises(ValueError, match="refused, it holds objects other than tensors"):
            load_trainer_state(tmp_path)
    assert not marker.exists()


def test_resume_from_a_planted_trainer_state_is_one_line(tiny_config, tmp_path):
    train(tiny_config)
    marker = tmp_path / "pwned"
    plant(Path(tiny_config.train.out_dir) / "latest", marker)
    res = subprocess.run([sys.executable, "-m", "scripts.train", "--config", "configs/tiny.toml",
                          "--data.source", "files", "--data.path", tiny_config.data.path,
                          "--data.dir", tiny_config.data.dir, "--train.out_dir", tiny_config.train.out_dir,
                          "--train.resume", "auto", "--log.attention", "false", "--log.sample_tokens", "0"], cwd=ROOT, capture_output=True, text=True, timeout=180,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    err = res.stderr.strip().splitlines()
    assert res.returncode == 2 and err[-1].startswith("error: ") and "refused" in err[-1], res.stderr[-2000:]
    assert [line for line in err if not line.startswith("data: ")] == err[-1:]  # no warning, no traceback
    assert not marker.exists()
