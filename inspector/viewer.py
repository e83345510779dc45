"""The self-contained HTML attention viewer: one file, inline script and style, nothing loaded from anywhere.

(Named `viewer`, not `html`, so it never shadows the standard library's `html` module.)

Weights are stored compactly: for each (layer, head) in order, the lower triangle row by row (row i holds keys
0..i, the upper triangle is always 0), each weight rounded to uint8 = round(w * 255), all base64-encoded. The
decoded value q / 255 is within half a step (1/510) of the true weight. The data sits in a
`<script type="application/json">` block with `<`, `>` and `&` written as \\u escapes, so no token text can end
the block; the page's only script (inspector/assets/viewer.js, style viewer.css) is allowed by its sha256 hash in the Content-Security-Policy, which forbids
every network load (default-src 'none').
"""
from __future__ import annotations

import base64
import hashlib
import html
import json
from importlib import resources

import matplotlib
import numpy as np

from inspector.stats import STAT_KEYS, THRESHOLDS


def asset(name: str) -> str:
    """A file of inspector/assets (CSS, JS), shipped as package data and inlined into a page."""
    return resources.files("inspector").joinpath("assets", name).read_text(encoding="utf-8")


SCALE = 255
DESCRIPTIONS = {
    "layer": "layer index", "head": "head index", "label": "heuristic head type (thresholds below the table)",
    "entropy": "mean entropy of a query's attention (nats)",
    "entropy_norm": "entropy / log(number of visible keys): 1 = uniform, 0 = one key",
    "mean_distance": "mean look-back distance i - j, in tokens",
    "prev_token": "mean weight on the previous token", "first_token": "mean weight on the first token (sink)",
    "self": "mean weight on the query's own token",
    "induction": "mean weight on the token after the previous occurrence, on a random block repeated twice",
}
UNIT_KEYS = ["entropy_norm", "prev_token", "first_token", "self", "induction"]  # scores in [0, 1]


def quantize_lower(weights: np.ndarray) -> np.ndarray:
    """[L, H, T, T] causal weights -> uint8 [L, H, T(T+1)/2]: each lower triangle row by row, round(w * 255)."""
    w = np.asarray(weights, dtype=np.float64)
    rows, cols = np.tril_indices(w.shape[-1])
    return np.clip(np.rint(w[..., rows, cols] * SCALE), 0, SCALE).astype(np.uint8)


def encode_weights(weights: np.ndarray) -> str:
    """[L, H, T, T] causal weights -> base64 of the uint8-quantised lower triangles (see the module docstring)."""
    return base64.b64encode(quantize_lower(weights).tobytes()).decode("ascii")


def decode_weights(data: str, n_layers: int, n_heads: int, T: int) -> np.ndarray:
    """The inverse of `encode_weights`, up to quantisation: [L, H, T, T] float32."""
    q = np.frombuffer(base64.b64decode(data), dtype=np.uint8).reshape(n_layers, n_heads, T * (T + 1) // 2)
    out = np.zeros((n_layers, n_heads, T, T), dtype=np.float32)
    rows, cols = np.tril_indices(T)
    out[..., rows, cols] = q / SCALE
    return out


def _json_for_script(obj: object) -> str:
    """JSON that is safe inside a <script> element whatever strings it holds."""
    text = json.dumps(obj, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii") + "'"


def _colormap_hex(n: int = 64) -> list[str]:
    cmap = matplotlib.colormaps["viridis"]
    return [matplotlib.colors.to_hex(cmap(x)) for x in np.linspace(0, 1, n)]


def render_viewer(weights: np.ndarray, tokens: list[str], layers: list[int], heads: list[int],
                  stats: list[dict], title: str = "attention", subtitle: str = "", n_prompt: int | None = None) -> str:
    """The whole page as a string. `weights` [L, H, T, T] belong to model layers `layers` and heads `heads`."""
    w = np.asarray(weights)
    if w.ndim != 4 or w.shape != (len(layers), len(heads), len(tokens), len(tokens)):
        raise ValueError(f"weights {w.shape} do not match {len(layers)} layers, {len(heads)} heads, "
                         f"{len(tokens)} tokens")
    data = {
        "T": len(tokens), "tokens": list(tokens), "layers": list(layers), "heads": list(heads),
        "n_prompt": len(tokens) if n_prompt is None else n_prompt,
        "encoding": "uint8 lower triangle per (layer, head), row-major, base64", "scale": SCALE,
        "weights": encode_weights(w), "stats": stats, "stat_keys": list(STAT_KEYS), "unit_keys": UNIT_KEYS,
        "descriptions": DESCRIPTIONS, "colormap": _colormap_hex(),
    }
    rules = "; ".join(f"{name}: {key} \u2265 {value:g}" for name, (key, value) in THRESHOLDS.items())
    body = f"""<div class="controls">
<label>Layer <select id="layer"></select></label>
<label>Head <select id="head"></select></label>
<span id="status"></span>
</div>
<div class="main">
<div class="left">
<canvas id="map" aria-label="attention map: rows are queries, columns are keys"></canvas>
<div id="legend">0 <canvas id="legendbar" width="160" height="10"></canvas> 1
<span>(square-root scale; grey = future, masked) &middot; hover for values, click a row to pick the query</span></div>
</div>
<div class="right">
<h2>Heads of this layer (click to pick)</h2>
<div id="thumbs"></div>
<h2>What query <span id="qlabel"></span> attends to (click a token to pick it)</h2>
<div id="tokens"></div>
</div>
</div>
<h2>Head statistics (click a row to view the head, a column title to sort)</h2>
<table id="stats"></table>
<p class="note">Scores average over queries 1..T-1 of the prompt; induction is measured on a block of random tokens
repeated twice. Heuristic labels, first match wins: {html.escape(rules)}; otherwise mixed.</p>
<div id="tip" hidden></div>
<script type="application/json" id="attn-data">{_json_for_script(data)}</script>
"""
    return self_contained_page(title, subtitle, asset("viewer.css"), asset("viewer.js"), body)


def self_contained_page(title: str, subtitle: str, css: str, js: str, body: str) -> str:
    """One HTML file with its style and script inline, allowed by their sha256 in a Content-Security-Policy that
    forbids every network load; `body` goes between the subtitle and the script (data blocks included)."""
    csp = (f"default-src 'none'; script-src {_csp_hash(js)}; style-src {_csp_hash(css)}; img-src data:; "
           "base-uri 'none'; form-action 'none'")
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{csp}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title>
<style>{css}</style>
</head>
<body>
<h1>{html.escape(title)}</h1>
<p class="sub">{html.escape(subtitle)}</p>
{body}<script>{js}</script>
</body>
</html>
"""
