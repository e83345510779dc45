"""Both offline dashboards in headless Chromium: the film (the slider redraws the heatmaps) and TensorBoard served
by `tensorboard --logdir` on 127.0.0.1 for a tiny run (the val/loss chart and an attention image show, and the
page loads nothing from any other host). Set ATTNGPT_SCREENSHOTS=DIR to keep the screenshots."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.test_film import fake_run

pytestmark = [pytest.mark.browser, pytest.mark.slow]
SHOTS = os.environ.get("ATTNGPT_SCREENSHOTS")


def guarded_page(browser, allowed: str):
    """A page that lets through only URLs starting with `allowed` and records everything else it tried."""
    pg = browser.new_page(viewport={"width": 1400, "height": 1000})
    events = {"blocked": [], "errors": []}
    pg.on("pageerror", lambda e: events["errors"].append(str(e)))

    def guard(route):
        if route.request.url.startswith(allowed):
            route.continue_()
        else:
            events["blocked"].append(route.request.url)
            route.abort()

    pg.route("**/*", guard)
    return pg, events


def screenshot(pg, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        pg.screenshot(path=str(Path(SHOTS) / name), full_page=True)


HEATMAP = "document.querySelector('canvas.score[data-key=induction]').toDataURL()"


def test_the_film_slider_moves_through_the_steps(browser, tmp_path):
    from inspector.film import write_film

    path = write_film(fake_run(tmp_path, [10, 20, 30, 40], induction_from=30), tmp_path / "out")["path"]
    pg, events = guarded_page(browser, path.as_uri())
    pg.goto(path.as_uri())
    pg.wait_for_function("document.body.dataset.view === 'step 40'")
    last, grid_last = pg.evaluate(HEATMAP), pg.evaluate("document.getElementById('grid').toDataURL()")
    assert "strongest induction: L1 H3" in pg.locator("#steplabel").text_content()
    slider = pg.locator("#step")
    slider.focus()
    pg.keyboard.press("Home")  # the first evaluation: no induction head yet
    pg.wait_for_function("document.body.dataset.view === 'step 10'")
    first = pg.evaluate(HEATMAP)
    assert first != last and pg.evaluate("document.getElementById('grid').toDataURL()") != grid_last
    pg.keyboard.press("ArrowRight")
    pg.keyboard.press("ArrowRight")
    pg.wait_for_function("document.body.dataset.view === 'step 30'")
    assert pg.evaluate(HEATMAP) == last  # the same heads as at step 40: the same picture
    screenshot(pg, "film.png")
    assert pg.locator("#chart polyline").count() == 10  # one line per head
    pg.select_option("#metric", "prev_token")
    assert "strongest previous token" in pg.locator("#steplabel").text_content()
    assert events == {"blocked": [], "errors": []}
    pg.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def tensorboard_server(tiny_config, tmp_path):
    """A tiny run trained with --log.tensorboard true, and `tensorboard --logdir` over its parent folder."""
    from train.loop import train

    tiny_config.log.tensorboard = True
    tiny_config.log.attention = True
    tiny_config.log.sample_tokens = 8
    tiny_config.train.eval_interval = 10
    tiny_config.train.out_dir = str(tmp_path / "runs" / "tiny")
    train(tiny_config)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(tmp_path / "runs"),
                             "--host", "127.0.0.1", "--port", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)  # its data server shares the group
    base = f"http://127.0.0.1:{port}"
    try:
        deadline, runs = time.time() + 120, []
        while time.time() < deadline and "tiny/tensorboard" not in runs and proc.poll() is None:
            try:
                with urllib.request.urlopen(base + "/data/runs", timeout=5) as r:
                    runs = json.load(r)
            except OSError:
                time.sleep(0.5)
        assert "tiny/tensorboard" in runs, proc.stderr.read().decode()[-2000:] if proc.poll() is not None else runs
        yield base
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)


def test_tensorboard_shows_the_run_offline(browser, tensorboard_server):
    base = tensorboard_server
    pg, events = guarded_page(browser, base + "/")
    pg.goto(base + "/")
    tags = pg.locator("input[placeholder*='Filter tags']")
    tags.wait_for(timeout=60_000)
    tags.fill("val/loss|attn/grid")
    tags.press("Escape")
    chart = pg.locator("card-view", has_text="val/loss")
    chart.locator("canvas, svg.line-chart, line-chart").first.wait_for(timeout=60_000)
    image = pg.locator("card-view", has_text="attn/grid").locator("img")
    image.first.wait_for(timeout=60_000)
    pg.wait_for_function("[...document.querySelectorAll('card-view img')].some(i => i.naturalWidth > 100)",
                         timeout=60_000)
    assert "/imageData" in image.first.get_attribute("src")
    assert chart.locator("text=tiny/tensorboard").count() >= 1  # the chart's run table names the run
    screenshot(pg, "tensorboard.png")
    assert events["blocked"] == [], events["blocked"]
    pg.close()
