"""Shared fixtures: a small corpus and a tiny run config, prepared once per session."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINYSHAKESPEARE = ROOT / "data" / "corpora" / "tinyshakespeare.txt"  # shipped with the repo

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_ERROR_REPORTING", "false")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach the Hugging Face hub
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def small_corpus_text() -> str:
    """About 60 kB of real English: the head of the shipped tiny-Shakespeare."""
    return TINYSHAKESPEARE.read_text(encoding="utf-8")[:60_000]


@pytest.fixture(autouse=True)
def _torch_threads_back():
    """A script run in-process may lower torch's threads (--threads auto on a busy machine); the next test gets
    them back."""
    import torch

    before = torch.get_num_threads()
    yield
    if torch.get_num_threads() != before:
        torch.set_num_threads(before)


@pytest.fixture
def one_thread():
    """Tiny models are all per-op overhead; on a busy 2-core machine a second thread only adds waiting."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text(small_corpus_text(), encoding="utf-8")
    return path


@pytest.fixture
def tiny_config(tmp_path, corpus_file):
    """A RunConfig for a model that trains a step in milliseconds, on the small corpus, in temp folders."""
    from train.config import RunConfig

    cfg = RunConfig.from_toml(str(ROOT / "configs" / "tiny.toml"))
    cfg.data.source, cfg.data.path, cfg.data.dir = "files", str(corpus_file), str(tmp_path / "data")
    cfg.train.out_dir = str(tmp_path / "run")
    cfg.log.attention = False
    cfg.log.sample_tokens = 0
    return cfg


# Debian's Chromium, driven by Playwright (never `playwright install`); these flags keep it off the network.
CHROMIUM = os.environ.get("ATTNGPT_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium per test module (browser tests: .ci/browser_setup.sh installs it)."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()
