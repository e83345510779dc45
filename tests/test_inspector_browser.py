"""The viewer in headless Chromium: it draws, the pickers and clicks redraw, and nothing leaves the page.

Needs the Debian package `chromium` and Playwright's Python package (`.ci/browser_setup.sh` installs both);
skips only when one of them is missing. Set ATTNGPT_CHROMIUM to use another Chromium binary.
"""

import numpy as np
import pytest

from inspector import synthetic
from inspector.stats import head_stats
from inspector.viewer import render_viewer

pytestmark = pytest.mark.browser

HOSTILE = "</script><img src=x onerror=alert(1)>"


@pytest.fixture()
def page(browser, tmp_path):
    w, ids = synthetic.synthetic_weights(8)
    w = np.concatenate([w, w[:, ::-1]])  # layer 1 = the same heads in reverse order
    stats = head_stats(w, repeat_weights=w, block=8)
    tokens = ["The", " cat", " sat", "\n", HOSTILE, " on", " the", " mat"] * 2
    path = tmp_path / "attention.html"
    path.write_text(render_viewer(w, tokens, [0, 1], list(range(5)), stats, "test", "", n_prompt=12))
    url = path.as_uri()
    pg = browser.new_page(viewport={"width": 1300, "height": 900})
    events = {"requests": [], "blocked": [], "errors": [], "dialogs": []}
    pg.on("request", lambda r: events["requests"].append(r.url))
    pg.on("pageerror", lambda e: events["errors"].append(str(e)))
    pg.on("console", lambda m: events["errors"].append(m.text) if m.type == "error" else None)
    pg.on("dialog", lambda d: (events["dialogs"].append(d.message), d.dismiss()))

    def guard(route):
        if route.request.url == url:
            route.continue_()
        else:
            events["blocked"].append(route.request.url)
            route.abort()

    pg.route("**/*", guard)
    pg.goto(url)
    pg.wait_for_function("document.body.dataset.view !== undefined")
    yield pg, events, url
    pg.close()


MAP_PNG = "document.getElementById('map').toDataURL()"
MAP_COLOURS = """() => {
  const c = document.getElementById('map'), d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  const seen = new Set();
  for (let k = 0; k < d.length; k += 16) seen.add((d[k] << 16) | (d[k + 1] << 8) | d[k + 2]);
  return {width: c.width, height: c.height, colours: seen.size};
}"""


def test_draws_without_errors_or_requests(page):
    pg, events, url = page
    drawn = pg.evaluate(MAP_COLOURS)
    assert drawn["width"] > 100 and drawn["height"] > 100 and drawn["colours"] >= 5, drawn
    assert pg.locator("#thumbs canvas").count() == 6  # 5 heads + their average
    assert pg.locator("#stats tbody tr").count() == 10
    assert pg.locator("#tokens .tok").count() == 16
    assert events["errors"] == [] and events["dialogs"] == []
    assert events["requests"] == [url] and events["blocked"] == []
    # the hostile token is shown as text, not turned into an element
    assert pg.locator("#tokens img, body img").count() == 0
    assert pg.locator("#tokens .tok").nth(4).text_content() == HOSTILE


def test_switching_layer_and_head_redraws(page):
    pg, events, url = page
    seen = {pg.evaluate(MAP_PNG)}
    pg.select_option("#head", "0")
    assert pg.evaluate("document.body.dataset.view").startswith("L0 H0")
    seen.add(pg.evaluate(MAP_PNG))
    pg.select_option("#head", "2")
    seen.add(pg.evaluate(MAP_PNG))
    pg.select_option("#layer", "1")
    assert pg.evaluate("document.body.dataset.view").startswith("L1 H2")
    pg.select_option("#head", "0")  # layer 1 head 0 is layer 0 head 4 (uniform): a different picture again
    seen.add(pg.evaluate(MAP_PNG))
    assert len(seen) == 4
    assert "uniform" in pg.locator("#status").text_content()
    pg.locator("#thumbs .thumb").nth(3).click()
    assert pg.evaluate("document.body.dataset.view").startswith("L1 H3")
    pg.locator("#stats tbody tr").nth(1).click()  # layer 0 head 1, the first-token head
    assert pg.locator("#layer").input_value() == "0" and pg.locator("#head").input_value() == "1"
    assert "first-token" in pg.locator("#status").text_content()
    assert events["requests"] == [url] and events["errors"] == []


def test_click_a_query_token_and_hover_a_cell(page):
    pg, _, _ = page
    pg.select_option("#head", "0")  # previous-token head
    pg.locator("#tokens .tok").nth(5).click()
    assert pg.evaluate("document.body.dataset.view") == "L0 H0 Q5"
    assert "query" in pg.locator("#tokens .tok").nth(5).get_attribute("class")
    assert "future" in pg.locator("#tokens .tok").nth(6).get_attribute("class")
    # the previous-token head puts all of query 5's weight on token 4: that span is shaded fully
    shades = pg.evaluate("[...document.querySelectorAll('#tokens .tok')].slice(0, 6)"
                         ".map(s => s.style.backgroundColor)")
    assert shades[4] == "rgb(33, 113, 181)" and all(s.endswith(", 0)") for s in shades[:4])
    box = pg.locator("#map").bounding_box()
    pg.mouse.move(box["x"] + box["width"] - 12, box["y"] + box["height"] - 12)  # bottom-right: last query, itself
    assert pg.locator("#tip").is_visible()
    assert "weight" in pg.locator("#tip").text_content()
