"""The live page in headless Chromium against a real server: type a prompt, generate, watch tokens arrive, click
one, see its alternatives and its attention; nothing is loaded from anywhere but the server itself.

Needs Debian's `chromium` and Playwright's Python package (`.ci/browser_setup.sh`); skips only without them.
"""
from __future__ import annotations

from urllib.parse import urlparse

import pytest

from tests.serve_fixtures import live_server

pytestmark = pytest.mark.browser



def test_generate_stream_and_inspect_a_token(browser, tmp_path):
    with live_server(block_size=64) as (url, engine):
        pg = browser.new_page(viewport={"width": 1400, "height": 900})
        errors, foreign = [], []
        pg.on("pageerror", lambda e: errors.append(str(e)))
        pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        origin = urlparse(url).netloc

        def guard(route):
            if urlparse(route.request.url).netloc == origin:
                route.continue_()
            else:
                foreign.append(route.request.url)
                route.abort()

        pg.route("**/*", guard)
        pg.goto(url + "/")
        pg.wait_for_function("() => document.body.dataset.ready === '1'")
        pg.wait_for_function("() => document.getElementById('model').textContent.includes('tiny-test')")
        pg.fill("#prompt", "First Citizen:\n")
        pg.fill("#max_tokens", "60")
        pg.fill("#seed", "3")
        pg.click("#go")
        # tokens arrive while the request is still running (the Stop button is live), then all 60
        pg.wait_for_function("() => document.querySelectorAll('#gen .tok').length > 0")
        pg.wait_for_function("() => document.querySelectorAll('#gen .tok').length === 60", timeout=60_000)
        pg.wait_for_function("() => document.getElementById('status').textContent.includes('finish: length')")
        text = pg.inner_text("#gen")
        assert len(text) == 60  # one character per token with a char vocabulary
        pg.hover("#gen .tok >> nth=5")
        rows = pg.locator("#alts tbody tr").count()
        assert rows in (5, 6)  # the top 5, and the sampled token below them when it was not among them
        assert pg.locator("#alts tr.chosen").count() == 1
        probs = [float(t.rstrip("%")) for t in pg.locator("#alts td.p").all_inner_texts()][:5]
        assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 100.01
        pg.click("#gen .tok >> nth=10")
        pg.wait_for_function("() => document.querySelectorAll('#attn .ctx').length > 0")
        # the position that chose token 10 sees the 15-character prompt and the 10 tokens before it
        assert pg.locator("#attn .ctx").count() == 15 + 10
        assert pg.locator("#layer option").count() == 2
        assert pg.locator("#head option").count() == 1 + 4  # the head average and 4 heads
        labels = pg.locator("#head option").all_inner_texts()[1:]
        assert all(" · " in s and s.split(" · ")[1] for s in labels)  # every head carries the inspector's label
        avg = pg.eval_on_selector_all("#attn .ctx", "els => els.map(e => parseFloat(e.title))")
        assert sum(avg) == pytest.approx(100, abs=1.0)  # a distribution over the context
        pg.select_option("#layer", "1")
        pg.select_option("#head", "2")
        one = pg.eval_on_selector_all("#attn .ctx", "els => els.map(e => parseFloat(e.title))")
        assert sum(one) == pytest.approx(100, abs=1.0) and one != avg
        pg.screenshot(path=str(tmp_path / "serve_page.png"), full_page=True)
        assert not errors and not foreign, (errors, foreign)
        assert engine.stats()["running"] == 0
        pg.close()


def test_stop_button_frees_the_slot(browser):
    with live_server(max_batch=1, max_tokens=100_000) as (url, engine):
        pg = browser.new_page()
        pg.goto(url + "/")
        pg.wait_for_function("() => document.body.dataset.ready === '1'")
        pg.fill("#prompt", "All:\n")
        pg.fill("#max_tokens", "100000")
        pg.click("#go")
        pg.wait_for_function("() => document.querySelectorAll('#gen .tok').length > 3")
        pg.click("#halt")
        pg.wait_for_function("() => document.getElementById('status').textContent.startsWith('stopped')")
        pg.click("#go")  # the only slot is free again: a second generation streams
        pg.wait_for_function("() => document.querySelectorAll('#gen .tok').length > 3", timeout=30_000)
        pg.click("#halt")
        pg.close()
