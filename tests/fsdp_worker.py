"""Run under torchrun by tests/test_fsdp.py: a small training loop built from train/parallel.py and
train/sharded_checkpoint.py, in the order the trainer uses them (model -> activation checkpointing -> wrap ->
optimizer on the wrapped parameters -> restore), on CPU with gloo.

    fsdp_worker.py equiv OUT                     20 steps of ddp, fsdp and both with activation checkpointing
    fsdp_worker.py train OUT PARALLEL STEPS CKPT [--from DIR] [--die-after-first-shard kill|raise]

`train` optionally restores from DIR, trains STEPS more steps and saves a resumable checkpoint to CKPT; OUT gets the
losses and the model and optimizer state (FQN-keyed whole tensors) just after the restore and at the save.
Batches are one global batch per (step, micro-step), split across ranks, so any world size sees the same data.
"""
import copy
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import FileSystemWriter

from data.tokenizers import CharTokenizer
from model.checkpoint import load_trainer_state, load_weights, save_checkpoint, unwrap
from model.config import ModelConfig
from model.gpt import GPT
from train.config import TrainConfig
from train.optim import build_optimizer
from train.parallel import clip_grad_norm, gradient_sync, is_sharded, wrap
from train.runtime import setup, teardown
from train.sharded_checkpoint import full_model_state, full_optimizer_state, restore, save_sharded_checkpoint

VOCAB, T, GLOBAL_BATCH, ACCUM = 40, 16, 8, 2
TC = TrainConfig(lr=1e-2, weight_decay=0.1, grad_clip=0.5)


def build(rt, parallel: str, checkpointing: bool, dropout: float, resume: Path | None = None):
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=VOCAB, block_size=T, n_layer=2, n_head=2, n_embd=32, dropout=dropout))
    model.set_activation_checkpointing(checkpointing)
    state = None
    if resume is not None and rt.is_main:  # rank 0 alone reads the consolidated weights; wrap shares them
        load_weights(model, resume)
    if resume is not None:
        state = load_trainer_state(resume)
    wrapped = wrap(model, rt, parallel)
    raw = unwrap(wrapped)
    optimizer = build_optimizer(raw, TC, "cpu")
    if state is not None:
        restore(raw, optimizer, state, resume, rt)
    return wrapped, raw, optimizer, (state or {}).get("step", 0)


def batch(step: int, micro: int, rt):
    g = torch.Generator().manual_seed(1000 * step + micro)
    starts = torch.randint(0, VOCAB, (GLOBAL_BATCH, 1), generator=g)
    data = (starts + torch.arange(T + 1)) % VOCAB  # counting: learnable, so the losses fall
    rows = GLOBAL_BATCH // rt.world_size
    mine = data[rt.rank * rows:(rt.rank + 1) * rows]
    return mine[:, :-1], mine[:, 1:]


def train_steps(rt, wrapped, raw, optimizer, start: int, steps: int) -> tuple[list[float], list[float]]:
    losses, norms = [], []
    for step in range(start, start + steps):
        total = torch.zeros(())
        for micro in range(ACCUM):
            x, y = batch(step, micro, rt)
            with gradient_sync(wrapped, micro == ACCUM - 1):
                _, loss = wrapped(x, y, return_logits=False)
                (loss / ACCUM).backward()
            total += loss.detach() / ACCUM
        norms.append(clip_grad_norm(raw.parameters(), TC.grad_clip).item())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if rt.distributed:
            dist.all_reduce(total)
            total /= rt.world_size
        losses.append(total.item())
    return losses, norms


def equiv(rt, out: Path) -> None:
    result = {}
    for parallel in ("ddp", "fsdp"):
        for checkpointing in (False, True):
            wrapped, raw, optimizer, _ = build(rt, parallel, checkpointing, dropout=0.1)
            torch.manual_seed(100 + rt.rank)  # each rank its own dropout stream, the same in every arm
            losses, norms = train_steps(rt, wrapped, raw, optimizer, 0, 20)
            result[f"{parallel}{'+ac' if checkpointing else ''}"] = {"loss": losses, "grad_norm": norms,
                                                                     "sharded": is_sharded(wrapped)}
    if rt.is_main:
        out.write_text(json.dumps(result))


def die_after_first_shard(how: str) -> None:
    """Rank 1 stops the moment its shard file is complete, before the metadata and the swap: killed (as by
    kill -9) or by an exception."""
    write = FileSystemWriter.write_data

    def write_then_die(self, plan, planner):
        future = write(self, plan, planner)
        future.wait()
        if dist.get_rank() == 1:
            if how == "kill":
                os._exit(9)
            raise OSError("injected: disk full")
        return future

    FileSystemWriter.write_data = write_then_die


def snapshot(raw, optimizer) -> dict:
    """Copies: a plain model's state dicts hold its live tensors, which the next steps change in place."""
    state = {"model": full_model_state(raw), "optimizer": full_optimizer_state(raw, optimizer)}
    return copy.deepcopy(state)


def train(rt, out: Path, parallel: str, steps: int, ckpt: Path, resume: Path | None) -> None:
    wrapped, raw, optimizer, start = build(rt, parallel, checkpointing=False, dropout=0.0, resume=resume)
    restored = snapshot(raw, optimizer)
    losses, _ = train_steps(rt, wrapped, raw, optimizer, start, steps)
    final = snapshot(raw, optimizer)
    trainer_state = {"step": start + steps}
    tokenizer = CharTokenizer([chr(65 + i) for i in range(VOCAB)])
    run_config = {"model": asdict(raw.config)}
    if is_sharded(wrapped):
        save_sharded_checkpoint(ckpt, raw, optimizer, tokenizer, run_config, trainer_state, rt)
    elif rt.is_main:
        save_checkpoint(ckpt, raw, tokenizer, run_config, {**trainer_state, "optimizer": optimizer.state_dict()})
    if rt.is_main:
        torch.save({"restored": restored, "final": final, "losses": losses, "start": start,
                    "sharded": is_sharded(wrapped), "world_size": rt.world_size}, out)


def main() -> None:
    mode, out = sys.argv[1], Path(sys.argv[2])
    rt = setup("cpu", "float32")
    try:
        if mode == "equiv":
            equiv(rt, out)
        else:
            rest = sys.argv[3:]
            resume = Path(rest[rest.index("--from") + 1]) if "--from" in rest else None
            if "--die-after-first-shard" in rest:
                die_after_first_shard(rest[rest.index("--die-after-first-shard") + 1])
            train(rt, out, rest[0], int(rest[1]), Path(rest[2]), resume)
    finally:
        teardown(rt)


if __name__ == "__main__":
    main()
