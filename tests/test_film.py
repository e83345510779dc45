"""The film of attention across training: frames saved at each evaluation, the page, and the script's errors."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from inspector import film, synthetic
from inspector.capture import Capture
from inspector.stats import head_stats
from inspector.viewer import decode_weights
from train.loop import train

ROOT = Path(__file__).resolve().parents[1]


def fake_run(tmp_path: Path, steps: list[int], induction_from: int) -> Path:
    """A run folder with frames whose induction head (layer 1, head 3) appears at step `induction_from`."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("")
    w, _ = synthetic.synthetic_weights(8)  # 5 heads: previous-token, first-token, induction-like, self, uniform
    uniform = np.repeat(w[:, 4:5], 5, axis=1)
    for step in steps:
        weights = np.concatenate([uniform, w if step >= induction_from else uniform])  # [2, 5, 16, 16]
        folder = run / "attention" / f"step_{step:06d}"
        stats = head_stats(weights, repeat_weights=weights, block=8)
        folder.mkdir(parents=True)
        (folder / "head_stats.json").write_text(json.dumps({"heads": stats}))
        cap = Capture(weights=weights, token_ids=list(range(16)), tokens=[f"t{i}" for i in range(16)],
                      layers=[0, 1], heads=list(range(5)))
        film.save_frame(folder, step, cap)
    return run


def test_frames_round_trip_and_find_the_first_crossing(tmp_path):
    run = fake_run(tmp_path, [10, 20, 30, 40], induction_from=30)
    frames = film.load_frames(run)
    assert [f.step for f in frames] == [10, 20, 30, 40]
    assert frames[0].layers == [0, 1] and frames[0].heads == list(range(5)) and frames[0].tokens[3] == "t3"
    back = decode_weights(__import__("base64").b64encode(frames[2].lower.tobytes()).decode(), 2, 5, 16)
    w, _ = synthetic.synthetic_weights(8)
    assert np.abs(back[1] - w).max() <= 1 / 510 + 1e-7
    crossing = film.first_crossing(frames)
    assert (crossing["step"], crossing["layer"], crossing["head"]) == (30, 1, 3) and crossing["score"] >= 0.4
    assert film.first_crossing(frames[:2]) is None


def test_the_page_is_self_contained(tmp_path):
    run = fake_run(tmp_path, [10, 20, 30], induction_from=20)
    result = film.write_film(run, tmp_path / "out")
    page = result["path"].read_text()
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page).group(1)
    assert "default-src 'none'" in csp and "connect-src" not in csp
    assert not re.search(r"(src|href)=\"(https?:)?//", page)
    assert film.asset("film.js") in page and film.asset("film.css") in page  # the package files, inline
    data = json.loads(re.search(r'id="film-data">(.*?)</script>', page, re.S).group(1))
    assert [f["step"] for f in data["frames"]] == [10, 20, 30]
    assert data["frames"][0]["scores"]["induction"][8] < 0.4 <= data["frames"][1]["scores"]["induction"][8]  # L1 H3
    assert "step 20" in page  # the subtitle names the crossing


def test_resume_drops_frames_past_the_checkpoint(tmp_path):
    run = fake_run(tmp_path, [10, 20, 30], induction_from=99)
    film.drop_frames_after(run, 20)
    assert [f.step for f in film.load_frames(run)] == [10, 20]


def script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scripts.attention", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.slow
def test_a_trained_run_makes_a_film_and_bad_runs_get_one_line(tiny_config, tmp_path):
    tiny_config.log.attention = True
    tiny_config.train.eval_interval = 5
    train(tiny_config)
    run = Path(tiny_config.train.out_dir)
    out = script("--run", str(run), "--over-training", "--out", str(tmp_path / "film"))
    assert out.returncode == 0, out.stderr
    assert "4 evaluations, steps 5..20" in out.stdout
    page = (tmp_path / "film" / "attention_over_training.html").read_text()
    assert len(json.loads(re.search(r'id="film-data">(.*?)</script>', page, re.S).group(1))["frames"]) == 4

    for path in run.glob("attention/step_*/frame.npz"):  # a run folder from before frames were saved
        path.unlink()
    cases = {str(run): "has no saved evaluations", str(tmp_path / "nowhere"): "is not a run folder",
             str(ROOT / "configs"): "is not a run folder"}
    for where, message in cases.items():
        bad = script("--run", where, "--over-training", "--out", str(tmp_path / "film2"))
        assert bad.returncode == 2 and message in bad.stderr, bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr
    assert not (tmp_path / "film2").exists()
    assert script("--over-training").returncode == 2
    assert script("--run", str(run)).returncode == 2
    # everything else still works on the old run folder
    old = script("--ckpt", str(run), "--prompt", "ROMEO:", "--out", str(tmp_path / "still"))
    assert old.returncode == 0, old.stderr
