"""Training, top to bottom: lock the run folder, decide new run or resume, prepare the data, build the model,
restore its state, then hand over to the `Trainer`'s step loop, in one process or many (torchrun).

Determinism: batches are a pure function of (seed, step, micro-step, rank, world size), the model is built from the
seed, and the RNG state travels in every checkpoint, so a resumed CPU run repeats an uninterrupted one exactly.
"""
from __future__ import annotations

from pathlib import Path

import torch

from data.meta import read_meta
from data.prepare import prepare
from data.tokenizers import Tokenizer, load_tokenizer
from model.checkpoint import load_weights
from model.gpt import GPT
from model.run_data import KEY as DATA_LOCATION, data_location
from train.collectives import checked_on_rank0, from_rank0, same_data_on_every_node
from train.config import RunConfig
from train.evaluation import probe_text
from train.rundir import WORLD_SIZE, RunLock, check_same_text, clear_run, resume_point
from train.runtime import Runtime, resumed_dtype, setup, teardown
from train.state import TrainerState
from train.trainer import Trainer


def train(cfg: RunConfig) -> dict:
    """Run (or continue) training as `cfg` says; returns a summary of the finished run."""
    rt = setup(cfg.train.device, cfg.train.dtype, cfg.model.n_embd, cfg.train.dist_timeout)
    lock = RunLock(Path(cfg.train.out_dir))
    try:
        checked_on_rank0(rt, lock.acquire)  # one live run per out_dir, before anything in it is read or cleared
        resume_from = checked_on_rank0(rt, lambda: _open_run(cfg, rt.world_size))
        resuming = from_rank0(rt, resume_from is not None)
        cfg.train.grad_accum = from_rank0(rt, cfg.train.grad_accum)  # a resume on another world size changes it
        same_data_on_every_node(cfg, rt)
        tokenizer = _fit_vocab(cfg)
        run_config = _run_config(cfg, rt, tokenizer)
        model, state = _build_model(cfg, rt, resume_from, resuming)
        return Trainer(cfg, rt, model, state, tokenizer, run_config, resume_from).run()
    finally:
        lock.release()
        teardown(rt)


def _open_run(cfg: RunConfig, world_size: int) -> Path | None:
    """Rank 0 alone (other nodes may not see its out_dir or data.dir): the checkpoint to resume from, or None for a
    new run (then out_dir is cleared); the data is prepared (or found prepared) either way."""
    out = Path(cfg.train.out_dir)
    resume_from = resume_point(cfg, out, world_size)
    prepare(cfg.data)
    if resume_from is not None:
        check_same_text(resume_from, cfg.data.dir)
    else:
        clear_run(out)
    out.mkdir(parents=True, exist_ok=True)
    return resume_from


def _fit_vocab(cfg: RunConfig) -> Tokenizer:
    """The model's vocabulary from the prepared data's (0 = take the data's), and the data's tokenizer."""
    meta = read_meta(cfg.data.dir)
    if cfg.model.vocab_size == 0:
        cfg.model.vocab_size = meta["vocab_size"]
    elif cfg.model.vocab_size < meta["vocab_size"]:
        raise ValueError(f"model.vocab_size: {cfg.model.vocab_size} is smaller than the data's {meta['vocab_size']}")
    return load_tokenizer(cfg.data.dir)


def _run_config(cfg: RunConfig, rt: Runtime, tokenizer: Tokenizer) -> dict:
    """The resolved config every checkpoint records, with where its data lies (so sample/evaluate find the val
    split from anywhere, also after the folders moved)."""
    if cfg.log.attention and rt.is_main:
        cfg.log.probe_prompt = probe_text(cfg, tokenizer)
    run_config = {**cfg.to_dict(), WORLD_SIZE: rt.world_size}
    if rt.is_main:
        run_config[DATA_LOCATION] = data_location(cfg.data.dir, Path(cfg.train.out_dir) / "latest")
    return run_config


def _build_model(cfg: RunConfig, rt: Runtime, resume_from: Path | None,
                 resuming: bool) -> tuple[GPT, TrainerState | None]:
    """The model from the seed (the same on every rank), with rank 0's saved weights and state when resuming."""
    torch.manual_seed(cfg.train.seed)
    model = GPT(cfg.model)
    state = checked_on_rank0(rt, lambda: _restore(model, resume_from))
    if resuming:  # optimizer, progress and RNG streams from rank 0; its weights reach the others in `wrap`
        state = from_rank0(rt, state)
        # the precision it started with, unless it moved to another kind of device
        rt.dtype = from_rank0(rt, resumed_dtype(state.to_dict(), rt, cfg.train.dtype))
    return model.to(rt.device), state


def _restore(model: GPT, resume_from: Path | None) -> TrainerState | None:
    if resume_from is None:
        return None
    load_weights(model, resume_from)
    return TrainerState.load(resume_from)
