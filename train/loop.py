"""The training loop: data -> model -> optimizer steps -> evaluation -> checkpoints, in one or many processes.

Determinism: batches are a pure function of (seed, step, micro-step, rank, world size), the model is built from the
seed, and the RNG state travels in every checkpoint, so a resumed CPU run repeats an uninterrupted one exactly.
"""
from __future__ import annotations

import contextlib
import math
import shutil
import signal
import sys
import time
import uuid
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from data.loader import ShardLoader
from data.meta import read_meta
from data.prepare import prepare
from data.tokenizers import load_tokenizer
from model.checkpoint import (load_trainer_state, load_weights, read_run_config, resolve_checkpoint_dir,
                              save_checkpoint, unwrap)
from model.gpt import GPT
from train.config import RunConfig
from train.evaluation import estimate_losses, eval_extras, probe_text
from train.optim import build_optimizer, lr_factor, set_lr
from train.runtime import DTYPES, Runtime, peak_flops, setup, teardown
from train.tracking import Tracker

RUN_ARTIFACTS = ("metrics.jsonl", "samples.txt", "latest", "best", ".latest.old", ".best.old", "attention", "wandb",
                 "tensorboard")


class StopRequested:
    """SIGINT/SIGTERM set a flag; the loop saves a checkpoint at the end of the current step and leaves."""

    def __init__(self):
        self.flag = False
        self._old = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        self.flag = True

    def __exit__(self, *exc):
        for sig, handler in self._old.items():
            signal.signal(sig, handler)


def _holds_run(out: Path) -> bool:
    return any((out / name).exists() for name in ("metrics.jsonl", "latest", "best", ".latest.old"))


def _resume_point(cfg: RunConfig, out: Path) -> Path | None:
    """The checkpoint to continue from, or None; refuses an out_dir holding another run unless overwrite."""
    if cfg.train.resume == "auto" and ((out / "latest").exists() or (out / ".latest.old").exists()):
        latest = resolve_checkpoint_dir(out / "latest" if (out / "latest").exists() else out / ".latest.old")
        if latest.name == "best":
            return None
        saved = read_run_config(latest)
        wanted = cfg.to_dict()["model"]
        if wanted["vocab_size"] == 0:  # "take it from the data": the saved run has the resolved number
            wanted["vocab_size"] = saved.get("model", {}).get("vocab_size")
        if saved.get("model") != wanted or saved.get("data", {}).get("tokenizer") != cfg.data.tokenizer:
            if cfg.train.overwrite:
                return None
            raise ValueError(f"train.out_dir: {out} holds a different run (its model config differs); "
                             "pick another out_dir or pass --train.overwrite true")
        return latest
    if _holds_run(out) and not cfg.train.overwrite:
        if cfg.train.resume == "auto":
            raise ValueError(f"train.out_dir: {out} holds a run with no checkpoint to resume from; "
                             "replace it with --train.overwrite true")
        raise ValueError(f"train.out_dir: {out} already holds a run; continue it with --train.resume auto "
                         "or replace it with --train.overwrite true")
    return None


def _clear_run(out: Path) -> None:
    leftovers = [p.name for p in out.glob(".*.tmp-*")] if out.exists() else []  # saves cut short by a kill
    for name in (*RUN_ARTIFACTS, *leftovers):
        path = out / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def _barrier(rt: Runtime) -> None:
    if rt.distributed:
        dist.barrier()


def _agree(rt: Runtime, flag: bool, elapsed: float) -> tuple[bool, float]:
    """All ranks take the same stop decision and the same clock (the slowest's), so their loops stay in step
    and a time-based LR schedule gives every replica the same LR."""
    if not rt.distributed:
        return flag, elapsed
    t = torch.tensor([1.0 if flag else 0.0, elapsed], dtype=torch.float64,
                     device=rt.device if rt.device.type == "cuda" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t[0].item() > 0), float(t[1].item())


def _rng_state() -> dict:
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["cpu"])
    if torch.cuda.is_available() and "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


def _seed_rank(rt: Runtime, seed: int, step: int, state: dict | None) -> None:
    """Under DDP every rank draws its own dropout masks (the same masks on different data would correlate the
    noise). A resumed run restores each rank's saved stream when the world size is unchanged; otherwise (or on a
    new run) it starts a fresh one per (seed, rank, step). Runs after the model is built, so weights match anyway."""
    saved = (state or {}).get("rng_ranks")
    if saved and len(saved) == rt.world_size:
        _set_rng_state(saved[rt.rank])
    else:
        torch.manual_seed(seed + 1_000_003 * (rt.rank + 1) + step)


def _raise_if_any(rt: Runtime, error: str) -> None:
    """Every rank raises the first rank's error, so no rank is left waiting in a collective for one that stopped."""
    if rt.distributed:
        errors: list = [None] * rt.world_size
        dist.all_gather_object(errors, error)
        error = next((e for e in errors if e), "")
    if error:
        raise ValueError(error)


def _data_identity(folder: str) -> tuple | None:
    try:
        meta = read_meta(folder)
    except ValueError:
        return None
    return meta["text_sha256"], meta.get("config")


def _same_data_on_every_node(cfg: RunConfig, rt: Runtime) -> None:
    """After rank 0 prepared: a node whose data.dir is missing or differs (no shared filesystem, or a stale copy)
    prepares its own from the same source, and must end up with rank 0's text and settings."""
    want = _from_rank0(rt, _data_identity(cfg.data.dir))
    error = ""
    if rt.local_rank == 0 and not rt.is_main and _data_identity(cfg.data.dir) != want:
        try:
            prepare(cfg.data, verbose=False)
            if _data_identity(cfg.data.dir) != want:
                source = cfg.data.path or cfg.data.source
                error = f"data.dir: rank {rt.rank} prepared other text than rank 0 from {source}; nodes need the same"
        except ValueError as e:
            error = f"rank {rt.rank}: {e}"
    _raise_if_any(rt, error)


def _from_rank0(rt: Runtime, obj):
    """Rank 0's value of `obj` on every rank (a collective)."""
    if not rt.distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _gather_rng(rt: Runtime) -> list | None:
    """Every rank's RNG state, for rank 0's checkpoint (a collective: all ranks call it at the same step)."""
    if not rt.distributed:
        return None
    states: list = [None] * rt.world_size
    dist.all_gather_object(states, _rng_state())
    return states


def train(cfg: RunConfig) -> dict:
    """Run (or continue) training as `cfg` says; returns a summary of the finished run."""
    rt = setup(cfg.train.device, cfg.train.dtype, cfg.model.n_embd)
    try:
        return _train(cfg, rt)
    finally:
        teardown()


def _train(cfg: RunConfig, rt: Runtime) -> dict:
    tc = cfg.train
    out = Path(tc.out_dir)
    resume_from, error = None, ""
    if rt.is_main:  # rank 0 decides; other nodes may not see its out_dir or data.dir
        try:
            resume_from = _resume_point(cfg, out)
            prepare(cfg.data)
            if resume_from is None:
                _clear_run(out)
            out.mkdir(parents=True, exist_ok=True)
        except ValueError as e:
            error = str(e)
    _raise_if_any(rt, error)
    resuming = _from_rank0(rt, resume_from is not None)
    if rt.distributed:
        _same_data_on_every_node(cfg, rt)
    meta = read_meta(cfg.data.dir)
    if cfg.model.vocab_size == 0:
        cfg.model.vocab_size = meta["vocab_size"]
    elif cfg.model.vocab_size < meta["vocab_size"]:
        raise ValueError(f"model.vocab_size: {cfg.model.vocab_size} is smaller than the data's {meta['vocab_size']}")
    tokenizer = load_tokenizer(cfg.data.dir)
    if cfg.log.attention and rt.is_main:
        cfg.log.probe_prompt = probe_text(cfg, tokenizer)
    run_config = cfg.to_dict()

    torch.manual_seed(tc.seed)
    model = GPT(cfg.model)
    state, error = None, ""
    if resume_from is not None:
        try:
            load_weights(model, resume_from)
            state = load_trainer_state(resume_from)
        except ValueError as e:
            error = str(e)
    _raise_if_any(rt, error)
    if resuming and rt.distributed:  # optimizer, progress and RNG streams from rank 0; DDP copies its weights
        state = _from_rank0(rt, state)
    if state is not None and tc.dtype == "auto" and state.get("dtype") in DTYPES:
        rt.dtype = DTYPES[state["dtype"]]  # a resumed run keeps the precision it started with
    model.to(rt.device)
    optimizer = build_optimizer(model, tc, rt.device.type)
    scaler = torch.amp.GradScaler(rt.device.type, enabled=rt.needs_grad_scaler())
    step, elapsed, tokens, best_val, run_id = 0, 0.0, 0, math.inf, uuid.uuid4().hex[:12]
    wandb_id = None
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
        if state.get("scaler"):
            scaler.load_state_dict(state["scaler"])
        step, elapsed, tokens = state["step"], state["elapsed"], state["tokens"]
        best_val, run_id, wandb_id = state["best_val"], state["run_id"], state.get("wandb_id")
        _set_rng_state(state["rng"])
    if rt.distributed:
        _seed_rank(rt, tc.seed, step, state)
    raw_model = model
    if tc.compile:
        model = torch.compile(model)
    if rt.distributed:
        model = DDP(model, device_ids=[rt.local_rank] if rt.device.type == "cuda" else None)

    train_loader = ShardLoader(cfg.data.dir, "train", tc.batch_size, cfg.model.block_size, tc.seed,
                               rank=rt.rank, world_size=rt.world_size)
    ShardLoader(cfg.data.dir, "val", tc.batch_size, cfg.model.block_size, tc.seed)  # a too-small val split fails now
    tokens_per_step = tc.batch_size * cfg.model.block_size * tc.grad_accum * rt.world_size
    flops_per_step = raw_model.flops_per_token() * tokens_per_step
    peak, peak_source = peak_flops(rt.device, rt.dtype) if rt.is_main else (0.0, "")
    tracker = None
    if rt.is_main:
        tracker = Tracker(out, run_config, cfg.log.wandb, cfg.log.wandb_project, cfg.log.wandb_run_name,
                          resume_step=step if state is not None else None, run_id=wandb_id,
                          tensorboard=cfg.log.tensorboard)
        n_params = raw_model.num_params()
        print(f"model: {n_params / 1e6:.2f}M parameters, {raw_model.flops_per_token() / 1e6:.1f} MFLOP/token; "
              f"device {rt.device} {str(rt.dtype).replace('torch.', '')}, world size {rt.world_size}; "
              f"{'resuming at step ' + str(step) if state else 'new run'} -> {out}", file=sys.stderr)
        if peak:
            print(f"MFU relative to {peak / 1e12:.2f} TFLOP/s ({peak_source})", file=sys.stderr)

    rank_rngs = None  # every rank's RNG state at the latest possible checkpoint (DDP only)

    def checkpoint(name: str, with_state: bool) -> None:
        trainer_state = None
        if with_state:
            trainer_state = {"step": step, "elapsed": elapsed, "tokens": tokens, "best_val": best_val,
                             "run_id": run_id, "wandb_id": tracker.run_id if tracker else None,
                             "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict(), "rng": _rng_state(),
                             "rng_ranks": rank_rngs, "dtype": str(rt.dtype).removeprefix("torch.")}
        save_checkpoint(out / name, raw_model, tokenizer, run_config, trainer_state)

    def run_eval() -> float:
        nonlocal best_val
        losses = estimate_losses(raw_model, cfg, rt)
        record = {"step": step, "tokens": tokens, "val/loss": losses["val"], "train/eval_loss": losses["train"],
                  "elapsed_s": round(elapsed, 3)}
        improved = losses["val"] < best_val
        if improved:
            best_val = losses["val"]
        record["val/best_loss"] = best_val
        tracker.log(record)
        checkpoint("latest", with_state=True)
        if improved:
            checkpoint("best", with_state=False)
        eval_extras(raw_model, tokenizer, cfg, rt, step, out, tracker)
        tqdm.write(f"step {step}: train {losses['train']:.4f}, val {losses['val']:.4f}"
                   f"{' (best)' if improved else ''}", file=sys.stderr)
        return losses["val"]

    bar = tqdm(total=tc.max_iters, initial=step, disable=not rt.is_main, dynamic_ncols=True, mininterval=1.0,
               desc="train", file=sys.stderr)
    last_val, stop_reason = math.nan, "max_iters"
    with StopRequested() as stop:
        while step < tc.max_iters:
            if tc.max_seconds and elapsed >= tc.max_seconds:
                stop_reason = "max_seconds"
                break
            t0 = time.perf_counter()
            progress = elapsed / tc.max_seconds if tc.max_seconds else step / max(1, tc.max_iters - 1)
            lr = set_lr(optimizer, lr_factor(step, progress, tc))
            loss_sum = torch.zeros((), device=rt.device)
            for micro in range(tc.grad_accum):
                x, y = train_loader.get_batch(step, micro)
                x, y = x.to(rt.device, non_blocking=True), y.to(rt.device, non_blocking=True)
                sync = not rt.distributed or micro == tc.grad_accum - 1
                with contextlib.nullcontext() if sync else model.no_sync():  # no all-reduce on micro-steps
                    with rt.autocast():
                        # the chunked head+loss keeps no [B, T, vocab] logits; compiled graphs get the plain path
                        _, loss = model(x, y, return_logits=tc.compile)
                        loss = loss / tc.grad_accum
                    scaler.scale(loss).backward()
                loss_sum += loss.detach()
            scaler.unscale_(optimizer)
            grad_norm = torch.nn.utils.clip_grad_norm_(raw_model.parameters(), tc.grad_clip or float("inf"))
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            if rt.distributed:
                dist.all_reduce(loss_sum, op=dist.ReduceOp.AVG if rt.device.type == "cuda" else dist.ReduceOp.SUM)
                if rt.device.type != "cuda":
                    loss_sum /= rt.world_size
            loss_value = loss_sum.item()
            if not math.isfinite(loss_value):
                raise RuntimeError(f"non-finite loss ({loss_value}) at step {step}; stopped without saving, "
                                   f"the last good checkpoint stays in {out / 'latest'} (try a lower train.lr)")
            step += 1
            tokens += tokens_per_step
            dt = time.perf_counter() - t0
            elapsed += dt
            if rt.is_main:
                tok_s = tokens_per_step / dt
                bar.set_postfix(loss=f"{loss_value:.4f}", tok_s=f"{tok_s:,.0f}", refresh=False)
                bar.update(1)
                if step % tc.log_interval == 0 or step == 1:
                    record = {"step": step, "tokens": tokens, "train/loss": loss_value, "lr": lr,
                              "grad_norm": float(grad_norm), "tokens/s": tok_s, "step_time_ms": dt * 1000,
                              "elapsed_s": round(elapsed, 3)}
                    if peak:
                        record["mfu"] = flops_per_step / dt / (peak * rt.world_size)
                        record["peak_flops"] = peak
                    tracker.log(record)
            stopping, elapsed = _agree(rt, stop.flag, elapsed)
            at_eval = step % tc.eval_interval == 0 or step == tc.max_iters
            if at_eval or stopping or (tc.stop_at and step >= tc.stop_at):  # a checkpoint may follow
                rank_rngs = _gather_rng(rt)
            if rt.is_main and at_eval:
                last_val = run_eval()
            if stopping or (tc.stop_at and step >= tc.stop_at):
                stop_reason = "signal" if stopping else "stop_at"
                if rt.is_main and not at_eval:
                    checkpoint("latest", with_state=True)
                break
            _barrier(rt) if at_eval else None
        else:
            stop_reason = "max_iters"
        if stop_reason == "max_seconds" and step % tc.eval_interval != 0:
            rank_rngs = _gather_rng(rt)
            if rt.is_main:
                last_val = run_eval()
    bar.close()
    _barrier(rt)
    summary = {"step": step, "tokens": tokens, "elapsed_s": elapsed, "best_val": best_val, "last_val": last_val,
               "stopped": stop_reason, "out_dir": str(out)}
    if rt.is_main:
        tracker.log({"step": step, "summary/best_val": best_val, "summary/train_seconds": elapsed})
        tracker.finish()
        verb = {"signal": "interrupted; saved", "stop_at": "paused; saved"}.get(stop_reason, "done")
        print(f"{verb} at step {step} after {elapsed:.1f}s of training; best val loss {best_val:.4f}; "
              f"checkpoints in {out}", file=sys.stderr)
    return summary
