"""scripts.plot: loss curves from metrics.jsonl, one colour per run."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from inspector.curves import plot_loss_curves, read_metrics, series
from scripts.cli import run_main
from scripts.plot import main

ROOT = Path(__file__).resolve().parents[1]


def write_run(folder: Path, scale: float = 1.0, torn: bool = False) -> Path:
    folder.mkdir(parents=True)
    lines = []
    for step in range(0, 101, 10):
        lines.append({"step": step, "tokens": step * 512, "train/loss": scale * (4 - step / 50), "lr": 1e-3})
        if step % 50 == 0:
            lines.append({"step": step, "tokens": step * 512, "val/loss": scale * (4.2 - step / 60),
                          "train/eval_loss": 4.0})
    text = "".join(json.dumps(r) + "\n" for r in lines)
    (folder / "metrics.jsonl").write_text(text + ('{"step": 110, "train/lo' if torn else ""))
    return folder


def test_series_reads_train_and_val(tmp_path):
    run = write_run(tmp_path / "a", torn=True)
    records = read_metrics(run)
    xs, ys = series(records, "val/loss")
    assert xs.tolist() == [0, 50, 100] and ys[0] == pytest.approx(4.2)
    xs, _ = series(records, "train/loss", "tokens")
    assert xs.tolist() == [s * 512 for s in range(0, 101, 10)]


def test_figure_has_one_line_per_run_and_series(tmp_path):
    runs = [write_run(tmp_path / "small"), write_run(tmp_path / "big", 0.8)]
    fig = plot_loss_curves(runs)
    by_step, by_tokens = fig.axes
    assert [line.get_label() for line in by_step.lines] == ["small train", "small val", "big train", "big val"]
    assert len(by_tokens.lines) == 4 and by_tokens.get_xlabel() == "tokens seen"
    assert by_step.lines[2].get_color() != by_step.lines[0].get_color()
    assert by_tokens.lines[1].get_xdata().tolist() == [0, 50 * 512, 100 * 512]


def test_script_writes_a_png(tmp_path):
    runs = [write_run(tmp_path / "a"), write_run(tmp_path / "b", 0.9)]
    out = tmp_path / "plots" / "loss.png"
    proc = subprocess.run([sys.executable, "-m", "scripts.plot", *map(str, runs), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    assert f"wrote {out}" in proc.stdout


def test_help_shows_every_default():
    proc = subprocess.run([sys.executable, "-m", "scripts.plot", "-h"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0
    for text in ("--out", "(default: loss.png)", "--labels", "--logy"):
        assert text in proc.stdout


@pytest.mark.parametrize("make, message", [
    (lambda tmp: [str(tmp / "missing")], "no metrics.jsonl"),
    (lambda tmp: [str(write_run(tmp / "a")), "--labels", "x", "y"], "--labels: 2 names for 1 runs"),
    (lambda tmp: [str(tmp)], "no metrics.jsonl"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, make, message):
    with pytest.raises(SystemExit) as e:
        run_main(lambda: main(make(tmp_path) + ["--out", str(tmp_path / "x.png")]))
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: ") and message in err and err.count("\n") == 1


def test_a_run_without_losses_is_refused(tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "metrics.jsonl").write_text('{"step": 1, "lr": 0.1}\n')
    with pytest.raises(ValueError, match="no train/loss or val/loss"):
        plot_loss_curves([tmp_path / "r"])
