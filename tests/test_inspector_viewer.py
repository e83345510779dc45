"""The HTML viewer: self-contained, its embedded weights decode back, hostile tokens stay text."""
import base64
import hashlib
import json
import re

import numpy as np
import pytest

from inspector import synthetic
from inspector.stats import head_stats
from inspector.viewer import decode_weights, encode_weights, render_viewer

HOSTILE = "</script><img src=x onerror=alert(1)>"


def _random_causal(rng, L, H, T):
    logits = rng.normal(size=(L, H, T, T)) * 3
    logits = np.where(np.tril(np.ones((T, T), bool)), logits, -np.inf)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope="module")
def page():
    rng = np.random.default_rng(0)
    w = _random_causal(rng, 2, 3, 9)
    tokens = ["a", " b", "\n", HOSTILE, "&amp;", "\u2028", "'\"", "x", "\U0001f600"]
    stats = head_stats(w, layers=[1, 3], heads=[0, 2, 5])
    return w, tokens, render_viewer(w, tokens, [1, 3], [0, 2, 5], stats, title=f"t {HOSTILE}", subtitle="s", n_prompt=7)


def _data_block(html: str) -> str:
    m = re.search(r'<script type="application/json" id="attn-data">(.*?)</script>', html, re.S)
    assert m, "no data block"
    return m.group(1)


def test_embedded_weights_decode_within_the_quantisation_step(page):
    w, tokens, html = page
    data = json.loads(_data_block(html))
    L, H, T = len(data["layers"]), len(data["heads"]), data["T"]
    assert (L, H, T, data["scale"]) == (2, 3, 9, 255)
    # decode independently of the library: uint8 lower triangles, row-major, one (layer, head) after another
    q = np.frombuffer(base64.b64decode(data["weights"]), dtype=np.uint8)
    assert q.size == L * H * T * (T + 1) // 2  # compact: the upper triangle is not stored
    back = np.zeros_like(w)
    rows, cols = np.tril_indices(T)
    back[..., rows, cols] = q.reshape(L, H, -1) / 255.0
    assert np.abs(back - w).max() <= 0.5 / 255 + 1e-6
    assert np.all(back[..., ~np.tril(np.ones((T, T), bool))] == 0)
    np.testing.assert_allclose(decode_weights(encode_weights(w), L, H, T), back, atol=1e-7)


def test_tokens_survive_exactly_and_hostile_text_is_escaped(page):
    _, tokens, html = page
    assert json.loads(_data_block(html))["tokens"] == tokens
    assert HOSTILE not in html
    assert "<img" not in html
    assert html.count("<script") == 2 and html.count("</script>") == 2  # the data block and the code, nothing else
    assert "<title>t &lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;</title>" in html


def test_no_external_loads_and_a_strict_csp(page):
    _, _, html = page
    assert not re.search(r"https?:|//[a-z0-9.-]+\.[a-z]{2,}/|<[^>]*\b(src|href|action)\s*=|@import|url\(", html, re.I)
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', html).group(1)
    assert "default-src 'none'" in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    code = re.findall(r"<script>(.*?)</script>", html, re.S)[0]
    digest = base64.b64encode(hashlib.sha256(code.encode()).digest()).decode()
    assert f"script-src 'sha256-{digest}'" in csp  # the only script allowed is the one on the page


def test_shapes_that_do_not_match_are_rejected():
    w = np.zeros((1, 2, 3, 3))
    with pytest.raises(ValueError, match="do not match"):
        render_viewer(w, ["a", "b", "c"], [0], [0], [])


def test_stats_table_data_is_embedded():
    w, ids = synthetic.synthetic_weights(4)
    stats = head_stats(w, repeat_weights=w, block=4)
    html = render_viewer(w, [str(i) for i in ids], [0], list(range(5)), stats)
    data = json.loads(_data_block(html))
    assert [s["label"] for s in data["stats"]] == list(synthetic.HEAD_TYPES)
    assert '<table id="stats">' in html and 'id="layer"' in html and 'id="head"' in html
