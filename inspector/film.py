"""Attention across training: the frames the trainer saves at each evaluation, and the film page made of them.

A frame is `attention/step_NNNNNN/frame.npz` beside that evaluation's head_stats.json: the probe's attention
weights as uint8 lower triangles (the viewer's encoding, within 1/510 of the true weights; about 2 KB per head for
a 64-token probe, compressed), its tokens, and the layers and heads. The page is one self-contained HTML file like
the viewer: the data in a JSON block, the script and style from `inspector/assets/` inline and allowed by their
hashes in a Content-Security-Policy that forbids every network load.
"""
from __future__ import annotations

import base64
import html
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from data.atomic import atomic_file
from inspector.stats import THRESHOLDS
from inspector.viewer import SCALE, _colormap_hex, _json_for_script, asset, quantize_lower, self_contained_page
from model.param_error import ParamError

FRAME_FILE = "frame.npz"
STEP_DIR = re.compile(r"^step_(\d+)$")
SCORES = {"induction": "induction", "prev_token": "previous token", "first_token": "first token (sink)",
          "entropy_norm": "normalised entropy"}
RUN_MARKERS = ("metrics.jsonl", "latest", "best")


@dataclass
class Frame:
    step: int
    lower: np.ndarray  # uint8 [L, H, T(T+1)/2]
    tokens: list[str]
    layers: list[int]
    heads: list[int]
    stats: list[dict]


def save_frame(folder: Path, step: int, cap) -> Path:
    """Write the probe capture `cap` (an inspector.capture.Capture) as this evaluation's frame; its statistics are
    the head_stats.json that `probe_attention` wrote into the same folder."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / FRAME_FILE
    with atomic_file(path) as f:  # a file object, so numpy does not append .npz to the temporary name
        np.savez_compressed(f, step=step, lower=quantize_lower(cap.weights), tokens=np.array(cap.tokens, dtype=str),
                            layers=np.array(cap.layers), heads=np.array(cap.heads))
    return path


def _step_dirs(run: Path) -> list[tuple[int, Path]]:
    root = run / "attention"
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := STEP_DIR.match(p.name))]
    return sorted(found)


def drop_frames_after(run: Path, step: int) -> None:
    """On resume: evaluations past the resumed step belong to the stopped process, like its metrics lines."""
    for s, path in _step_dirs(run):
        if s > step:
            shutil.rmtree(path)


def is_run_folder(path: Path) -> bool:
    return path.is_dir() and any((path / name).exists() for name in RUN_MARKERS)


def load_frames(run: str | Path) -> list[Frame]:
    """Every saved frame of a run folder, by step. A ValueError (one line) when `run` is no run folder or holds
    no frames (trained with log.attention false, or before frames were saved)."""
    run = Path(run)
    if not is_run_folder(run):
        raise ParamError("run", f"{run} is not a run folder (no metrics.jsonl, latest/ or best/ in it)")
    frames = []
    for step, folder in _step_dirs(run):
        if not (folder / FRAME_FILE).is_file() or not (folder / "head_stats.json").is_file():
            continue
        with np.load(folder / FRAME_FILE) as z:
            frames.append(Frame(step=step, lower=z["lower"], tokens=z["tokens"].tolist(),
                                layers=z["layers"].tolist(), heads=z["heads"].tolist(),
                                stats=json.loads((folder / "head_stats.json").read_text())["heads"]))
    if not frames:
        raise ParamError("run", f"{run} has no saved evaluations with attention frames (train with "
                         "log.attention true; runs trained before frames were saved have none)")
    return frames


def first_crossing(frames: list[Frame], key: str = "induction", threshold: float | None = None) -> dict | None:
    """The first frame where some head's `key` score reaches `threshold` (default: that label's threshold)."""
    threshold = THRESHOLDS[key][1] if threshold is None else threshold
    for frame in frames:
        rows = [s for s in frame.stats if s.get(key) is not None]
        if rows:
            best = max(rows, key=lambda s: s[key])
            if best[key] >= threshold:
                return {"step": frame.step, "layer": best["layer"], "head": best["head"], "score": best[key],
                        "threshold": threshold}
    return None


def _frame_data(frame: Frame) -> dict:
    by_head = {(s["layer"], s["head"]): s for s in frame.stats}
    scores = {k: [by_head.get((l, h), {}).get(k) for l in frame.layers for h in frame.heads] for k in SCORES}
    return {"step": frame.step, "T": len(frame.tokens), "tokens": frame.tokens,
            "weights": base64.b64encode(np.ascontiguousarray(frame.lower).tobytes()).decode("ascii"),
            "scores": scores}


def render_film(frames: list[Frame], title: str = "attention over training", subtitle: str = "") -> str:
    """The whole film page as a string."""
    if not frames:
        raise ValueError("no frames to show")
    layers, heads = frames[-1].layers, frames[-1].heads
    frames = [f for f in frames if f.layers == layers and f.heads == heads]  # one model shape per page
    data = {"layers": layers, "heads": heads, "scale": SCALE, "scores": SCORES,
            "thresholds": {key: value for key, value in THRESHOLDS.values()},
            "frames": [_frame_data(f) for f in frames], "colormap": _colormap_hex()}
    score_panels = "\n".join(f'<figure><canvas class="score" data-key="{k}"></canvas><figcaption>{html.escape(v)}'
                             "</figcaption></figure>" for k, v in SCORES.items())
    options = "\n".join(f'<option value="{k}">{html.escape(v)}</option>' for k, v in SCORES.items())
    body = f"""<div class="controls">
<button id="play" type="button">play</button>
<input id="step" type="range" min="0" max="{len(frames) - 1}" value="{len(frames) - 1}" step="1"
 aria-label="evaluation step">
<span id="steplabel"></span>
</div>
<div class="main">
<section>
<h2>Head scores at this step (layers down, heads across)</h2>
<div id="scores">
{score_panels}
</div>
</section>
<section>
<h2>The probe's attention at this step (rows: queries, columns: keys)</h2>
<canvas id="grid" aria-label="attention of every head on the probe"></canvas>
</section>
</div>
<section>
<h2>Each head's <select id="metric">
{options}
</select> score against step</h2>
<svg id="chart" role="img" aria-label="head scores against step"></svg>
<div id="legend"></div>
</section>
<p class="note">Scores as in the viewer: induction on a random block repeated twice, the others on the probe text;
the dashed line is the label threshold. Weights are stored as uint8 (within 1/510).</p>
<script type="application/json" id="film-data">{_json_for_script(data)}</script>
"""
    return self_contained_page(title, subtitle, asset("film.css"), asset("film.js"), body)


def write_film(run: str | Path, out_dir: str | Path) -> dict:
    """Render the film of a run folder into out_dir/attention_over_training.html; returns the path and facts."""
    frames = load_frames(run)
    crossing = first_crossing(frames)
    L, H, T = len(frames[-1].layers), len(frames[-1].heads), len(frames[-1].tokens)
    subtitle = (f"{Path(run)} \u00b7 {len(frames)} evaluations, steps {frames[0].step}..{frames[-1].step} \u00b7 "
                f"{L} layers \u00d7 {H} heads \u00b7 a probe of {T} tokens")
    if crossing:
        subtitle += (f" \u00b7 induction first \u2265 {crossing['threshold']:g} at step {crossing['step']} "
                     f"(L{crossing['layer']} H{crossing['head']})")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "attention_over_training.html"
    path.write_text(render_film(frames, f"attention over training \u00b7 {Path(run).name}", subtitle),
                    encoding="utf-8")
    return {"path": path, "frames": frames, "crossing": crossing}
