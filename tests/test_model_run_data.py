"""Relocatable checkpoints: evaluate, sample and attention find a run's data from any directory, after the run and
data folders moved together or apart, and a folder holding other text is told apart by its checksum."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from data.config import DataConfig
from data.prepare import prepare
from model.run_data import find_data_dir

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def run(cwd: Path, module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=ENV, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, corpus_file) -> Path:
    """A run trained with relative paths (data.dir "data", out_dir "run") from its own folder, as users do."""
    home = tmp_path_factory.mktemp("reloc") / "project"
    home.mkdir()
    res = run(home, "scripts.train", "--config", str(ROOT / "configs/tiny.toml"), "--data.source", "files",
              "--data.path", str(corpus_file), "--data.dir", "data", "--train.out_dir", "run",
              "--log.attention", "false", "--log.sample_tokens", "0")
    assert res.returncode == 0, res.stderr[-2000:]
    return home


@pytest.fixture
def project(trained, tmp_path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(trained, copy)
    return copy


def eval_loss(cwd: Path, ckpt: Path, *extra: str) -> float:
    res = run(cwd, "scripts.evaluate", "--ckpt", str(ckpt), "--json", *extra)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout)[0]["loss"]


def forget_the_original_machine(project: Path) -> None:
    """The copy's absolute data path points at the original folder, still present here; on another machine it
    would not exist, so point it at nothing."""
    for name in ("latest", "best"):
        path = project / "run" / name / "config.json"
        cfg = json.loads(path.read_text())
        cfg["data_location"]["dir"] = cfg["data"]["dir"] = "/nonexistent/original/data"
        path.write_text(json.dumps(cfg))


def test_config_records_absolute_relative_and_checksum(trained):
    cfg = json.loads((trained / "run" / "latest" / "config.json").read_text())
    where = cfg["data_location"]
    assert where["dir"] == str((trained / "data").resolve())
    assert where["dir_from_checkpoint"] == os.path.join("..", "..", "data")
    assert where["text_sha256"] == json.loads((trained / "data" / "meta.json").read_text())["text_sha256"]


def test_all_three_scripts_work_from_another_directory_after_a_move(project, tmp_path):
    forget_the_original_machine(project)  # so only the path relative to the checkpoint can find the data
    moved = tmp_path / "elsewhere" / "moved"
    moved.parent.mkdir()
    shutil.move(project, moved)  # run and data folders together, as a copy to another machine would be
    away = tmp_path / "cwd"
    away.mkdir()
    assert eval_loss(away, moved / "run") < 5.0
    res = run(away, "scripts.sample", "--ckpt", str(moved / "run"), "--prompt", "ROMEO:", "--max-new-tokens", "8",
              "--seed", "1")
    assert res.returncode == 0 and res.stdout.startswith("ROMEO:"), res.stderr[-2000:]
    res = run(away, "scripts.attention", "--ckpt", str(moved / "run"), "--prompt", "ROMEO: hello there",
              "--out", str(away / "att"))
    assert res.returncode == 0 and (away / "att" / "attention.html").is_file(), res.stderr[-2000:]


def test_run_folder_moved_alone_finds_the_data_by_its_absolute_path(trained, tmp_path):
    lone = tmp_path / "lone_run"
    shutil.copytree(trained / "run", lone)
    assert eval_loss(tmp_path, lone) == eval_loss(trained, trained / "run")


def test_lost_data_is_one_line_naming_what_to_pass(project, tmp_path):
    forget_the_original_machine(project)
    shutil.move(project / "data", tmp_path / "hidden")
    shutil.move(project, tmp_path / "p2")
    res = run(tmp_path, "scripts.evaluate", "--ckpt", str(tmp_path / "p2" / "run"))
    err = res.stderr.strip()
    assert res.returncode == 2 and len(err.splitlines()) == 1 and "--data-dir" in err and "not found" in err, err
    assert eval_loss(tmp_path, tmp_path / "p2" / "run", "--data-dir", str(tmp_path / "hidden")) < 5.0


def test_a_folder_with_other_text_is_refused(project, tmp_path):
    other = tmp_path / "other.txt"
    other.write_text("quite different words, all of them lower case and plain\n" * 300)
    forget_the_original_machine(project)
    shutil.rmtree(project / "data")
    prepare(DataConfig(source="files", path=str(other), dir=str(project / "data")), verbose=False)
    ckpt = project / "run" / "best"
    with pytest.raises(ValueError, match="holds other text"):
        find_data_dir(ckpt, json.loads((ckpt / "config.json").read_text()))
    res = run(tmp_path, "scripts.evaluate", "--ckpt", str(project / "run"))
    assert res.returncode == 2 and "holds other text" in res.stderr and len(res.stderr.strip().splitlines()) == 1
