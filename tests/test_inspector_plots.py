"""The PNG figures and the wandb media built from them."""
import json
import os

import matplotlib.colors
import numpy as np
import pytest

from inspector import plots, synthetic
from inspector.stats import head_stats


@pytest.fixture(scope="module")
def heads():
    w, ids = synthetic.synthetic_weights(6)
    return w, [chr(97 + i % 26) for i in ids], head_stats(w, repeat_weights=w, block=6)


def test_grid_masks_the_future_and_titles_heads(heads):
    w, tokens, stats = heads
    fig = plots.plot_grid(w, tokens, [0], list(range(5)), stats)
    panels = [ax for ax in fig.axes if ax.images and ax.get_title()]
    assert len(panels) == 5
    image = panels[0].images[0].get_array()
    T = w.shape[-1]
    assert np.all(image.mask == np.triu(np.ones((T, T), bool), k=1))  # grey, not "zero attention"
    np.testing.assert_allclose(image.data[~image.mask], w[0, 0][~image.mask])
    expected = [f"L0 H{h} \u00b7 {name}" for h, name in enumerate(synthetic.HEAD_TYPES)]
    assert [ax.get_title() for ax in panels] == expected
    assert [t.get_text() for t in panels[0].get_yticklabels()][:3] == tokens[:3]  # short: token labels


def test_long_sequences_make_one_tiled_image(heads):
    w, tokens, stats = heads
    T = 96
    big = np.stack([np.stack([synthetic.previous_token_head(T), synthetic.uniform_head(T)])] * 3)  # [3, 2, T, T]
    fig = plots.plot_grid(big, tokens * 8, [0, 2, 5], [1, 3], head_stats(big, [0, 2, 5], [1, 3]))
    ax = fig.axes[0]
    assert len(ax.images) == 1 and [t.get_text() for t in ax.get_yticklabels()] == ["layer 0", "layer 2", "layer 5"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["head 1", "head 3"]
    rgba = ax.images[0].get_array()
    gap = T // 12
    assert rgba.shape[:2] == (3 * T + 2 * gap, 2 * T + gap)
    grey = np.array(matplotlib.colors.to_rgba("#d9d9d9"))
    np.testing.assert_allclose(rgba[0, T - 1], grey)  # future corner of the first tile
    np.testing.assert_allclose(rgba[5, 4], plots.CMAP(plots.NORM(1.0)))  # previous-token: full weight on i-1
    np.testing.assert_allclose(rgba[0, T], [1, 1, 1, 1])  # the white gap between tiles
    texts = [t.get_text() for t in ax.texts]
    assert texts[:2] == ["L0 H1\nprevious-token", "L0 H3\nuniform"]


def test_layer_figure_adds_the_head_average(heads, tmp_path):
    w, tokens, stats = heads
    fig = plots.plot_layer(w[0], tokens, 0, list(range(5)), stats)
    titles = [ax.get_title() for ax in fig.axes if ax.get_visible() and ax.images]
    assert titles[-1] == "L0 head average" and len(titles) == 6
    path = plots.save(fig, tmp_path / "sub" / "layer.png")
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_display_token_makes_whitespace_visible():
    assert plots.display_token(" a\n") == "\u2423a\u21b5"
    assert plots.display_token("x" * 30).endswith("\u2026") and len(plots.display_token("x" * 30)) == 12


def test_head_scores_figure_and_array(heads):
    _, _, stats = heads
    fig = plots.plot_head_scores(stats)
    assert [ax.get_title() for ax in fig.axes] == [name for _, name in plots.SCORE_PANELS]
    rgb = plots.to_array(fig)
    assert rgb.dtype == np.uint8 and rgb.ndim == 3 and rgb.shape[2] == 3 and rgb.std() > 10


@pytest.mark.slow
def test_an_offline_wandb_run_holds_the_images_and_the_table(heads, tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    from inspector.report import wandb_media

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_ERROR_REPORTING", "false")
    monkeypatch.setenv("WANDB_SILENT", "true")
    w, tokens, stats = heads
    result = {"stats": stats, "figure": plots.plot_grid(w, tokens, [0], list(range(5)), stats),
              "scores_figure": plots.plot_head_scores(stats)}
    run = wandb.init(project="attngpt-test", dir=str(tmp_path), mode="offline")
    try:
        run.log({"step": 1, **wandb_media(result)})
    finally:
        run.finish()
    files = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path) for f in fs]
    images = [f for f in files if "media/images" in f and f.endswith(".png")]
    tables = [f for f in files if "media/table" in f and f.endswith(".table.json")]
    assert len(images) == 2 and len(tables) == 1, files
    table = json.loads(open(tables[0]).read())
    assert table["columns"][:3] == ["layer", "head", "label"]
    assert [row[2] for row in table["data"]] == list(synthetic.HEAD_TYPES)
