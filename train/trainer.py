"""One run's moving parts (model, optimizer, loader, tracker, state) and its step loop.

A step: set the LR, forward and backward over `grad_accum` micro-batches, clip, step the optimizer. The host runs
ahead of the GPU; only `_settle` waits for it, at log, eval and stop steps, not at every step. Under torchrun the
ranks agree on when to stop and on the clock every log interval, so their loops stay in step.
"""
from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch
from tqdm import tqdm

from data.loader import ShardLoader
from model.checkpoint import load_state, save_checkpoint
from model.gpt import GPT
from train.collectives import agree, barrier, from_rank0, gather_rng, mean_over_ranks, on_rank0
from train.config import RunConfig, TrainConfig
from train.evaluation import estimate_losses, eval_extras
from train.optim import build_optimizer, lr_factor, set_lr
from train.parallel import clip_grad_norm, gradient_sync, is_sharded, wrap
from train.runtime import Runtime, peak_flops
from train.sharded_checkpoint import full_model_state, save_sharded_checkpoint
from train.signals import StopRequested
from train.rng import seed_rank
from train.state import TrainerState
from train.tracking import Tracker


@dataclass
class _Marks:
    """What happens after this step."""
    log: bool
    eval: bool
    pause: bool  # train.stop_at reached
    signalled: bool  # single process: a signal stops at once; under torchrun at the ranks' next agreement

    @property
    def settling(self) -> bool:
        return self.log or self.eval or self.pause or self.signalled


class Trainer:
    def __init__(self, cfg: RunConfig, rt: Runtime, model: GPT, state: TrainerState | None, tokenizer,
                 run_config: dict, resume_from: Path | None = None):
        """`model` is built on rt.device, with the saved weights on rank 0 when resuming; `state` (every rank's) is
        None for a new run; `resume_from` is the checkpoint directory (rank 0's path, read by a sharded restore)."""
        self.cfg, self.rt, self.tc = cfg, rt, cfg.train
        self.out = Path(cfg.train.out_dir)
        self.tokenizer, self.run_config = tokenizer, run_config
        self.resumed = state is not None
        self.state = state if state is not None else TrainerState()
        if self.tc.activation_checkpointing:
            model.set_activation_checkpointing(True)
        self.raw_model = model
        self.model = wrap(model, rt, self.tc.parallel, self.tc.compile)  # fsdp: `model` itself, sharded in place
        self.sharded = is_sharded(self.model)
        self.optimizer = build_optimizer(model, self.tc, rt.device.type)  # on the (sharded) parameters
        self.scaler = torch.amp.GradScaler(rt.device.type, enabled=rt.needs_grad_scaler())
        if self.resumed:
            directory = from_rank0(rt, str(resume_from) if resume_from is not None else None)
            self.state.restore(self.raw_model, self.optimizer, self.scaler, rt, directory)
        if rt.distributed:
            seed_rank(state, self.tc.seed, rt.rank, rt.world_size, rt.device)
        self.loader = ShardLoader(cfg.data.dir, "train", self.tc.batch_size, cfg.model.block_size, self.tc.seed,
                                  rank=rt.rank, world_size=rt.world_size, device=rt.device,
                                  micro_steps=self.tc.grad_accum)
        ShardLoader(cfg.data.dir, "val", self.tc.batch_size, cfg.model.block_size, self.tc.seed)  # too small: now
        self.tokens_per_step = self.tc.batch_size * cfg.model.block_size * self.tc.grad_accum * rt.world_size
        self.peak, self.peak_source = peak_flops(rt.device, rt.dtype) if rt.is_main else (0.0, "")
        self.tracker: Tracker | None = on_rank0(rt, self._start_tracker, "starting the metrics log")
        self.rank_rngs: list | None = None  # every rank's RNG state at the latest possible checkpoint (DDP only)
        # The settle window: losses since the last settle (so a NaN between is caught), and its start.
        self.window_loss = torch.zeros((), device=rt.device)
        self.loss_sum = self.grad_norm = None
        self.settled_step, self.settled_elapsed = self.state.step, self.state.elapsed
        self.shared_elapsed = self.state.elapsed  # DDP: the clock the ranks last agreed on

    def _start_tracker(self) -> Tracker:
        log = self.cfg.log
        return Tracker(self.out, self.run_config, log.wandb, log.wandb_project, log.wandb_run_name,
                       resume_step=self.state.step if self.resumed else None, run_id=self.state.wandb_id,
                       tensorboard=log.tensorboard)

    # --- the loop -------------------------------------------------------------------------------------------------

    def run(self) -> dict:
        """Train until max_iters, max_seconds, stop_at or a signal; returns the run's summary."""
        self._announce()
        tc, st = self.tc, self.state
        bar = _progress_bar(tc, st.step, st.elapsed, self.rt.is_main)
        batches = self.loader.batches(st.step)  # one ahead: the next copy overlaps this step
        stop_reason, last_val = "max_iters", math.nan
        with StopRequested() as stop:
            while st.step < tc.max_iters:
                if tc.max_seconds and self._clock() >= tc.max_seconds:
                    stop_reason = "max_seconds"
                    break
                stopping, marks, val = self._step_and_after(batches, bar, stop.flag)
                last_val = val if marks.eval else last_val
                if stopping or marks.pause:
                    stop_reason = "signal" if stopping else "stop_at"
                    break
        if stop_reason == "max_seconds" and st.step % tc.eval_interval != 0:
            if self.settled_step != st.step:
                self._settle()  # a non-finite loss since the last log must not reach the checkpoint
            self.rank_rngs = gather_rng(self.rt)
            last_val = self._evaluate()
        bar.close()
        return self._finish(stop_reason, last_val)

    def _step_and_after(self, batches: Iterator, bar: tqdm, signal_flag: bool) -> tuple[bool, _Marks, float]:
        """One optimizer step, then whatever falls due: log, agreement, eval, checkpoint."""
        rt, st = self.rt, self.state
        t0 = time.perf_counter()
        lr = self._train_step(batches)
        marks = self._marks(signal_flag)
        settled = self._settle() if marks.settling else None
        dt = time.perf_counter() - t0
        st.elapsed += dt
        if rt.is_main:
            bar.update(min(dt, self.tc.max_seconds - bar.n) if self.tc.max_seconds else 1)
        if settled is not None:
            self._report(bar, marks, lr, *settled)
        stopping = marks.signalled
        if rt.distributed and (marks.log or marks.eval or marks.pause):  # every log_interval steps, not every step
            stopping, self.shared_elapsed = agree(rt, signal_flag, st.elapsed)
        if marks.eval or stopping or marks.pause:  # a checkpoint may follow
            self.rank_rngs = gather_rng(rt)
        val = self._evaluate() if marks.eval else math.nan
        if (stopping or marks.pause) and not marks.eval:
            self._save_everywhere("latest", with_state=True)
        return stopping, marks, val

    def _train_step(self, batches: Iterator) -> float:
        """Forward and backward over the micro-batches, then one optimizer step; returns the step's LR."""
        tc, rt, st = self.tc, self.rt, self.state
        progress = self._clock() / tc.max_seconds if tc.max_seconds else st.step / max(1, tc.max_iters - 1)
        lr = set_lr(self.optimizer, lr_factor(st.step, progress, tc))
        loss_sum = torch.zeros((), device=rt.device)
        for micro in range(tc.grad_accum):
            x, y = next(batches)
            with gradient_sync(self.model, micro == tc.grad_accum - 1):  # no all-reduce on micro-steps
                with rt.autocast():
                    _, loss = self.model(x, y, return_logits=False)  # no [B, T, vocab] logits outlive the forward
                    loss = loss / tc.grad_accum
                self.scaler.scale(loss).backward()
            loss_sum += loss.detach()
        self.scaler.unscale_(self.optimizer)
        self.grad_norm = clip_grad_norm(self.raw_model.parameters(), tc.grad_clip)  # sharded grads too
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.loss_sum = loss_sum
        self.window_loss += loss_sum
        st.step += 1
        st.tokens += self.tokens_per_step
        return lr

    def _clock(self) -> float:
        """The training seconds that max_seconds and a time-based LR read: under DDP the ranks' agreed clock."""
        return self.shared_elapsed if self.rt.distributed else self.state.elapsed

    def _marks(self, signal_flag: bool) -> _Marks:
        tc, step = self.tc, self.state.step
        return _Marks(log=step % tc.log_interval == 0 or step == 1,
                      eval=step % tc.eval_interval == 0 or step == tc.max_iters,
                      pause=bool(tc.stop_at and step >= tc.stop_at),
                      signalled=signal_flag and not self.rt.distributed)

    def _settle(self) -> tuple[float, float]:
        """This step's loss and grad norm on the host (averaged over ranks); raises if a loss since the last
        settle was not finite, before any checkpoint could keep the damage."""
        values = torch.stack([self.loss_sum, self.window_loss, self.grad_norm.float()])
        loss_value, window_value, norm = mean_over_ranks(self.rt, values).tolist()
        self.window_loss = torch.zeros_like(self.window_loss)
        if not math.isfinite(window_value):
            raise RuntimeError(f"non-finite loss at or before step {self.state.step} (read every "
                               f"train.log_interval steps); stopped without saving, the last good checkpoint stays "
                               f"in {self.out / 'latest'} (try a lower train.lr)")
        return loss_value, norm

    def _report(self, bar: tqdm, marks: _Marks, lr: float, loss_value: float, grad_value: float) -> None:
        """Speeds over the steps since the last settle (one step's host time is only its launch time on CUDA)."""
        st = self.state
        window_s, window_steps = max(st.elapsed - self.settled_elapsed, 1e-9), st.step - self.settled_step
        self.settled_step, self.settled_elapsed = st.step, st.elapsed
        tok_s = self.tokens_per_step * window_steps / window_s
        if not self.rt.is_main:
            return
        bar.set_postfix(step=st.step, loss=f"{loss_value:.4f}", tok_s=f"{tok_s:,.0f}", refresh=False)
        if not marks.log:
            return
        record = {"step": st.step, "tokens": st.tokens, "train/loss": loss_value, "lr": lr, "grad_norm": grad_value,
                  "tokens/s": tok_s, "step_time_ms": window_s / window_steps * 1000, "elapsed_s": round(st.elapsed, 3)}
        if self.peak:
            flops = self.raw_model.flops_per_token() * self.tokens_per_step * window_steps
            record["mfu"] = flops / window_s / (self.peak * self.rt.world_size)
            record["peak_flops"] = self.peak
        self.tracker.log(record)

    # --- evaluation and checkpoints --------------------------------------------------------------------------------

    def _evaluate(self) -> float:
        """Losses, then latest/ (and best/ when val improved), then samples and attention maps. A sharded model
        needs every rank for a forward: there all ranks evaluate and save, and the extras run on a whole copy."""
        if not self.sharded:
            return on_rank0(self.rt, lambda: self._evaluate_whole(self.raw_model),
                            f"evaluating at step {self.state.step}")
        losses = from_rank0(self.rt, estimate_losses(self.model, self.cfg, self.rt))  # every rank computes
        improved = self._record(losses)
        self.save("latest", with_state=True)
        if improved:
            self.save("best", with_state=False)
        whole = self._whole_copy() if self.cfg.log.sample_tokens > 0 or self.cfg.log.attention else None
        on_rank0(self.rt, lambda: self._extras(whole, losses, improved), f"sampling at step {self.state.step}")
        return losses["val"]

    def _evaluate_whole(self, model: GPT) -> float:
        losses = estimate_losses(model, self.cfg, self.rt)
        improved = self._record(losses)
        self.save("latest", with_state=True)
        if improved:
            self.save("best", with_state=False)
        self._extras(model, losses, improved)
        return losses["val"]

    def _record(self, losses: dict[str, float]) -> bool:
        """Log the losses and keep the best; True when val improved on it."""
        st = self.state
        improved = losses["val"] < st.best_val
        if improved:
            st.best_val = losses["val"]
        if self.tracker is not None:
            self.tracker.log({"step": st.step, "tokens": st.tokens, "val/loss": losses["val"],
                              "train/eval_loss": losses["train"], "elapsed_s": round(st.elapsed, 3),
                              "val/best_loss": st.best_val})
        return improved

    def _extras(self, model: GPT | None, losses: dict[str, float], improved: bool) -> None:
        if model is not None:
            eval_extras(model, self.tokenizer, self.cfg, self.rt, self.state.step, self.out, self.tracker)
        tqdm.write(f"step {self.state.step}: train {losses['train']:.4f}, val {losses['val']:.4f}"
                   f"{' (best)' if improved else ''}", file=sys.stderr)

    def _whole_copy(self) -> GPT | None:
        """Rank 0: an unsharded copy of the model for the samples and the attention probe (their hooks and KV cache
        want plain modules); the others None. A collective (the shards are gathered)."""
        full = full_model_state(self.model)
        if not self.rt.is_main:
            return None
        copy = GPT(self.cfg.model)
        load_state(copy, full, "gathered fsdp state does not match the model")
        return copy.to(self.rt.device)

    def save(self, name: str, with_state: bool) -> None:
        """A checkpoint folder under out_dir; with the trainer state only where a resume may start (latest/).
        Rank 0 alone for a whole model; every rank for a sharded one (each writes its shard)."""
        trainer_state = None
        if with_state:
            self.state.wandb_id = self.tracker.run_id if self.tracker else None
            trainer_state = self.state.snapshot(None if self.sharded else self.optimizer, self.scaler,
                                                self.rt.device, self.rt.dtype, self.rank_rngs)
        if self.sharded:
            save_sharded_checkpoint(self.out / name, self.model, self.optimizer if with_state else None,
                                    self.tokenizer, self.run_config, trainer_state, self.rt)
        else:
            save_checkpoint(self.out / name, self.raw_model, self.tokenizer, self.run_config, trainer_state)

    def _save_everywhere(self, name: str, with_state: bool) -> None:
        if self.sharded:
            self.save(name, with_state)
        else:
            on_rank0(self.rt, lambda: self.save(name, with_state), f"saving at step {self.state.step}")

    # --- start and end ---------------------------------------------------------------------------------------------

    def _announce(self) -> None:
        if not self.rt.is_main:
            return
        rt, m = self.rt, self.raw_model
        print(f"model: {m.num_params() / 1e6:.2f}M parameters, {m.flops_per_token() / 1e6:.1f} MFLOP/token; "
              f"device {rt.device} {str(rt.dtype).replace('torch.', '')}, world size {rt.world_size}; "
              f"{'resuming at step ' + str(self.state.step) if self.resumed else 'new run'} -> {self.out}",
              file=sys.stderr)
        if self.peak:
            print(f"MFU relative to {self.peak / 1e12:.2f} TFLOP/s ({self.peak_source})", file=sys.stderr)

    def _finish(self, stop_reason: str, last_val: float) -> dict:
        barrier(self.rt)
        st = self.state
        summary = {"step": st.step, "tokens": st.tokens, "elapsed_s": st.elapsed, "best_val": st.best_val,
                   "last_val": last_val, "stopped": stop_reason, "out_dir": str(self.out)}
        if self.rt.is_main:
            self.tracker.log({"step": st.step, "summary/best_val": st.best_val, "summary/train_seconds": st.elapsed})
            self.tracker.finish()
            verb = {"signal": "interrupted; saved", "stop_at": "paused; saved"}.get(stop_reason, "done")
            print(f"{verb} at step {st.step} after {st.elapsed:.1f}s of training; best val loss {st.best_val:.4f}; "
                  f"checkpoints in {self.out}", file=sys.stderr)
        return summary


def _progress_bar(tc: TrainConfig, step: int, elapsed: float, show: bool) -> tqdm:
    """Counts training seconds when train.max_seconds drives the run (its ETA is then the run's), else steps."""
    common = dict(disable=not show, dynamic_ncols=True, mininterval=1.0, desc="train", file=sys.stderr)
    if tc.max_seconds:
        return tqdm(total=tc.max_seconds, initial=min(elapsed, tc.max_seconds), unit="s", **common,
                    bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f}s [{elapsed}<{remaining}{postfix}]")
    return tqdm(total=tc.max_iters, initial=step, **common)
