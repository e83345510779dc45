"""The training loop: data -> model -> optimizer steps -> evaluation -> checkpoints, in one or many processes.

Determinism: batches are a pure function of (seed, step, micro-step, rank, world size), the model is built from the
seed, and the RNG state travels in every checkpoint, so a resumed CPU run repeats an uninterrupted one exactly.
"""
from __future__ import annotations

import contextlib
import math
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
from model.checkpoint import load_trainer_state, load_weights, save_checkpoint
from model.gpt import GPT
from model.run_data import KEY as DATA_LOCATION, data_location
from train.config import RunConfig
from train.evaluation import estimate_losses, eval_extras, probe_text
from train.optim import build_optimizer, lr_factor, set_lr
from train.rundir import RunLock, check_same_text, clear_run, resume_point
from train.runtime import Runtime, ddp_options, peak_flops, resumed_dtype, setup, teardown
from train.tracking import Tracker

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


def _rng_state(device: torch.device) -> dict:
    """The CPU generator's state and, on CUDA, that of this process's own GPU only: a resume may see fewer GPUs
    than the save did (another machine, CUDA_VISIBLE_DEVICES), and the run draws from no other."""
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    saved = state.get("cuda")
    if device.type != "cuda" or saved is None:
        return
    if isinstance(saved, (list, tuple)):  # older checkpoints: every visible GPU's state, by device index
        index = device.index or 0
        if index >= len(saved):
            return
        saved = saved[index]
    torch.cuda.set_rng_state(saved, device)


def _seed_rank(rt: Runtime, seed: int, step: int, state: dict | None) -> None:
    """Under DDP every rank draws its own dropout masks (the same masks on different data would correlate the
    noise). A resumed run restores each rank's saved stream when the world size is unchanged; otherwise (or on a
    new run) it starts a fresh one per (seed, rank, step). Runs after the model is built, so weights match anyway."""
    saved = (state or {}).get("rng_ranks")
    if saved and len(saved) == rt.world_size:
        _set_rng_state(saved[rt.rank], rt.device)
    else:
        torch.manual_seed(seed + 1_000_003 * (rt.rank + 1) + step)


def _on_rank0(rt: Runtime, job, what: str):
    """Run `job` on rank 0 alone; every rank returns its result or raises. Rank 0 re-raises its own exception, the
    others a RuntimeError naming it, instead of waiting in their next collective until the process-group timeout."""
    result, failure, error = None, None, ""
    if rt.is_main:
        try:
            result = job()
        except Exception as e:  # noqa: BLE001 - whatever it is, the other ranks must hear of it
            failure, error = e, f"rank 0 failed while {what}: {type(e).__name__}: {e}"
    error = _from_rank0(rt, error)  # also the barrier after rank 0's work
    if failure is not None:
        raise failure
    if error:
        raise RuntimeError(error)
    return result


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
    dist.all_gather_object(states, _rng_state(rt.device))
    return states


def _progress_bar(tc, step: int, elapsed: float, show: bool) -> tqdm:
    """Counts training seconds when train.max_seconds drives the run (its ETA is then the run's), else steps."""
    common = dict(disable=not show, dynamic_ncols=True, mininterval=1.0, desc="train", file=sys.stderr)
    if tc.max_seconds:
        return tqdm(total=tc.max_seconds, initial=min(elapsed, tc.max_seconds), unit="s", **common,
                    bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f}s [{elapsed}<{remaining}{postfix}]")
    return tqdm(total=tc.max_iters, initial=step, **common)


def train(cfg: RunConfig) -> dict:
    """Run (or continue) training as `cfg` says; returns a summary of the finished run."""
    rt = setup(cfg.train.device, cfg.train.dtype, cfg.model.n_embd, cfg.train.dist_timeout)
    lock = RunLock(Path(cfg.train.out_dir))
    try:
        error = ""
        if rt.is_main:  # one live run per out_dir, before anything in it is read or cleared
            try:
                lock.acquire()
            except ValueError as e:
                error = str(e)
        _raise_if_any(rt, error)
        return _train(cfg, rt)
    finally:
        lock.release()
        teardown(rt)


def _train(cfg: RunConfig, rt: Runtime) -> dict:
    tc = cfg.train
    out = Path(tc.out_dir)
    resume_from, error = None, ""
    if rt.is_main:  # rank 0 decides; other nodes may not see its out_dir or data.dir
        try:
            resume_from = resume_point(cfg, out)
            prepare(cfg.data)
            if resume_from is not None:
                check_same_text(resume_from, cfg.data.dir)
            if resume_from is None:
                clear_run(out)
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
    if rt.is_main:  # so sample/evaluate find the val split from anywhere, also after the folders moved
        run_config[DATA_LOCATION] = data_location(cfg.data.dir, out / "latest")

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
    if state is not None:  # the precision it started with, unless it moved to another kind of device
        rt.dtype = _from_rank0(rt, resumed_dtype(state, rt, tc.dtype))
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
        _set_rng_state(state["rng"], rt.device)
    if rt.distributed:
        _seed_rank(rt, tc.seed, step, state)
    raw_model = model
    if tc.compile:
        model = torch.compile(model)
    if rt.distributed:
        model = DDP(model, **ddp_options(rt))

    train_loader = ShardLoader(cfg.data.dir, "train", tc.batch_size, cfg.model.block_size, tc.seed,
                               rank=rt.rank, world_size=rt.world_size, device=rt.device)
    ShardLoader(cfg.data.dir, "val", tc.batch_size, cfg.model.block_size, tc.seed)  # a too-small val split fails now
    tokens_per_step = tc.batch_size * cfg.model.block_size * tc.grad_accum * rt.world_size
    flops_per_step = raw_model.flops_per_token() * tokens_per_step
    peak, peak_source = peak_flops(rt.device, rt.dtype) if rt.is_main else (0.0, "")
    tracker = _on_rank0(rt, lambda: Tracker(out, run_config, cfg.log.wandb, cfg.log.wandb_project,
                                            cfg.log.wandb_run_name, resume_step=step if state is not None else None,
                                            run_id=wandb_id, tensorboard=cfg.log.tensorboard),
                        "starting the metrics log")
    if rt.is_main:
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
                             "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict(),
                             "rng": _rng_state(rt.device), "rng_ranks": rank_rngs,
                             "dtype": str(rt.dtype).removeprefix("torch."), "device_type": rt.device.type}
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

    bar = _progress_bar(tc, step, elapsed, rt.is_main)
    batches = train_loader.batches(step, tc.grad_accum)  # one ahead: the next batch's copy overlaps this step
    # The host runs ahead of the GPU. Only `settle` waits for it: at log, eval and stop steps, not at every step.
    window_loss = torch.zeros((), device=rt.device)  # the losses since the last settle, so a NaN between is caught
    settled_step, settled_elapsed = step, elapsed
    shared_elapsed = elapsed  # DDP: the clock the ranks last agreed on (time-based LR and max_seconds use it)
    loss_sum = grad_norm = None

    def settle() -> tuple[float, float]:
        """This step's loss and grad norm on the host (averaged over ranks); raises if a loss since the last
        settle was not finite, before any checkpoint could keep the damage."""
        nonlocal window_loss
        values = torch.stack([loss_sum, window_loss, grad_norm.float()])
        if rt.distributed:
            dist.all_reduce(values, op=dist.ReduceOp.AVG if rt.device.type == "cuda" else dist.ReduceOp.SUM)
            if rt.device.type != "cuda":
                values /= rt.world_size
        loss_value, window_value, norm = values.tolist()
        window_loss = torch.zeros_like(window_loss)
        if not math.isfinite(window_value):
            raise RuntimeError(f"non-finite loss at or before step {step} (read every train.log_interval steps); "
                               f"stopped without saving, the last good checkpoint stays in {out / 'latest'} "
                               "(try a lower train.lr)")
        return loss_value, norm

    last_val, stop_reason = math.nan, "max_iters"
    with StopRequested() as stop:
        while step < tc.max_iters:
            clock = shared_elapsed if rt.distributed else elapsed
            if tc.max_seconds and clock >= tc.max_seconds:
                stop_reason = "max_seconds"
                break
            t0 = time.perf_counter()
            progress = clock / tc.max_seconds if tc.max_seconds else step / max(1, tc.max_iters - 1)
            lr = set_lr(optimizer, lr_factor(step, progress, tc))
            loss_sum = torch.zeros((), device=rt.device)
            for micro in range(tc.grad_accum):
                x, y = next(batches)
                sync = not rt.distributed or micro == tc.grad_accum - 1
                with contextlib.nullcontext() if sync else model.no_sync():  # no all-reduce on micro-steps
                    with rt.autocast():
                        _, loss = model(x, y, return_logits=False)  # no [B, T, vocab] logits outlive the forward
                        loss = loss / tc.grad_accum
                    scaler.scale(loss).backward()
                loss_sum += loss.detach()
            scaler.unscale_(optimizer)
            grad_norm = torch.nn.utils.clip_grad_norm_(raw_model.parameters(), tc.grad_clip or float("inf"))
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            window_loss += loss_sum
            step += 1
            tokens += tokens_per_step
            at_log = step % tc.log_interval == 0 or step == 1
            at_eval = step % tc.eval_interval == 0 or step == tc.max_iters
            at_pause = bool(tc.stop_at and step >= tc.stop_at)
            signalled = stop.flag and not rt.distributed  # under DDP a signal waits for the ranks' next agreement
            settling = at_log or at_eval or at_pause or signalled
            if settling:
                loss_value, grad_value = settle()
            dt = time.perf_counter() - t0
            elapsed += dt
            if rt.is_main:
                bar.update(min(dt, tc.max_seconds - bar.n) if tc.max_seconds else 1)
            if settling:
                window_s, window_steps = max(elapsed - settled_elapsed, 1e-9), step - settled_step
                settled_step, settled_elapsed = step, elapsed
                tok_s = tokens_per_step * window_steps / window_s
                if rt.is_main:
                    bar.set_postfix(step=step, loss=f"{loss_value:.4f}", tok_s=f"{tok_s:,.0f}", refresh=False)
                if rt.is_main and at_log:  # speeds over the steps since the last settle: one step's host time
                    step_ms = window_s / window_steps * 1000  # is only its launch time on CUDA
                    record = {"step": step, "tokens": tokens, "train/loss": loss_value, "lr": lr,
                              "grad_norm": grad_value, "tokens/s": tok_s, "step_time_ms": step_ms,
                              "elapsed_s": round(elapsed, 3)}
                    if peak:
                        record["mfu"] = flops_per_step * window_steps / window_s / (peak * rt.world_size)
                        record["peak_flops"] = peak
                    tracker.log(record)
            stopping = signalled
            if rt.distributed and (at_log or at_eval or at_pause):  # every log_interval steps, not every step
                stopping, shared_elapsed = _agree(rt, stop.flag, elapsed)
            if at_eval or stopping or at_pause:  # a checkpoint may follow
                rank_rngs = _gather_rng(rt)
            if at_eval:
                last_val = _on_rank0(rt, run_eval, f"evaluating at step {step}")
            if stopping or at_pause:
                stop_reason = "signal" if stopping else "stop_at"
                if not at_eval:
                    _on_rank0(rt, lambda: checkpoint("latest", with_state=True), f"saving at step {step}")
                break
        else:
            stop_reason = "max_iters"
        if stop_reason == "max_seconds" and step % tc.eval_interval != 0:
            if settled_step != step:
                settle()
            rank_rngs = _gather_rng(rt)
            last_val = _on_rank0(rt, run_eval, f"evaluating at step {step}")
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
