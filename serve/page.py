"""The live page at `/`: one self-contained file. Its HTML, CSS and JavaScript are real files shipped as package
data (serve/static/), read with importlib.resources and inlined; the Content-Security-Policy admits exactly that
script and style by their sha256 hashes, lets the page talk only to its own server, and forbids every other load.
"""
from __future__ import annotations

import base64
import hashlib
from importlib import resources


def _hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii") + "'"


def _read(name: str) -> str:
    return resources.files("serve").joinpath("static", name).read_text(encoding="utf-8")


def page_csp(css: str, js: str) -> str:
    return (f"default-src 'none'; script-src {_hash(js)}; style-src {_hash(css)}; connect-src 'self'; "
            "img-src data:; base-uri 'none'; form-action 'none'")


def render_page() -> tuple[str, str]:
    """(the page's HTML, its Content-Security-Policy, also worth sending as a header)."""
    css, js = _read("page.css"), _read("page.js")
    csp = page_csp(css, js)
    html = _read("index.html").replace("{csp}", csp).replace("{css}", css).replace("{js}", js)
    return html, csp
