"""Helpers for the sampling, evaluation and interop tests: tiny models and checkpoints, scripts run as a user would."""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from data.tokenizers import CharTokenizer
from model.checkpoint import save_checkpoint
from model.config import ModelConfig
from model.gpt import GPT

ROOT = Path(__file__).resolve().parents[1]
TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
        "First Citizen:\nYou are all resolved rather to die than to famish?\n") * 4


def tiny_model(seed: int = 0, **overrides) -> GPT:
    """A 2-layer model with weights large enough that its distribution is far from uniform."""
    torch.manual_seed(seed)
    cfg = dict(vocab_size=40, block_size=32, n_layer=2, n_head=4, n_embd=32)
    cfg.update(overrides)
    model = GPT(ModelConfig(**cfg)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.mul_(8.0 if name == "wte.weight" else 4.0)  # wte is also the head: logits of std ~2
            else:
                p.add_(0.1 * torch.randn_like(p))
    return model


def char_checkpoint(directory: Path, data_dir: str = "", seed: int = 0, block_size: int = 32, tokenizer=None) -> Path:
    tok = tokenizer or CharTokenizer.from_text(TEXT)
    model = tiny_model(seed, vocab_size=tok.vocab_size, block_size=block_size)
    cfg = model.config
    return save_checkpoint(directory, model, tok, {"model": asdict(cfg), "data": {"tokenizer": "char", "dir": data_dir}})


def run_script(module: str, *args: str, input: str | None = None, timeout: float = 120, env: dict | None = None
               ) -> subprocess.CompletedProcess:
    """`python -m module args` from the repository root; `env` adds to (or blanks) environment variables."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})}  # tiny models: one thread
    env.pop("ATTNGPT_DEBUG", None)
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env, input=input or "",
                          capture_output=True, text=True, timeout=timeout)


def run_main_inprocess(main, argv: list[str], monkeypatch, capsys) -> tuple[int, str, str]:
    """Run a script's main through scripts.cli.run_main as `python -m` would, without a new interpreter."""
    from scripts.cli import run_main

    monkeypatch.setattr(sys, "argv", ["prog", *argv])
    monkeypatch.delenv("ATTNGPT_DEBUG", raising=False)
    with pytest.raises(SystemExit) as exc:
        run_main(main)
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err

