"""Per-rank memory of ddp against fsdp, with and without activation checkpointing, on CPU with gloo:

    torchrun --standalone --nproc_per_node=2 -m scripts.bench_fsdp_memory [--tiny] [--json FILE]

The model is GPT-2 small's shape (configs/gpt2_124m.toml) at context 256, batch 4 per rank, fp32 AdamW. Per rank:
- held: the bytes of this rank's parameters, gradients and AdamW moments between steps (the local shards under
  fsdp), counted from the tensors themselves;
- step peak: the most tensor memory a training step (forward, backward, clipping, optimizer step) allocated at once
  on top of that, read from torch.profiler's allocation records (train/memory.py);
- peak: their sum. Each arm is measured on its second step, when AdamW's moments exist.
Rank 0 prints a Markdown table (MiB); `--json` writes the figures.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from model.config import ModelConfig
from model.gpt import GPT
from train.config import RunConfig, TrainConfig
from train.memory import peak_memory
from train.optim import build_optimizer
from train.parallel import clip_grad_norm, wrap
from train.runtime import setup, teardown
from model.checkpoint import unwrap

ARMS = [("ddp", False), ("fsdp", False), ("ddp", True), ("fsdp", True)]


def local_bytes(t: torch.Tensor) -> int:
    t = t.to_local() if isinstance(t, DTensor) else t
    return t.numel() * t.element_size()


def held_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    params = list(model.parameters())  # a tied matrix once
    total = sum(local_bytes(p) + (local_bytes(p.grad) if p.grad is not None else 0) for p in params)
    for state in optimizer.state.values():
        total += sum(local_bytes(v) for v in state.values() if isinstance(v, torch.Tensor) and v.dim() > 0)
    return total


def measure(rt, config: ModelConfig, parallel: str, checkpointing: bool, batch: int) -> dict:
    torch.manual_seed(0)
    model = GPT(config).set_activation_checkpointing(checkpointing)
    wrapped = wrap(model, rt, parallel)
    raw = unwrap(wrapped)
    optimizer = build_optimizer(raw, TrainConfig(), "cpu")
    gen = torch.Generator().manual_seed(rt.rank)
    x = torch.randint(0, config.vocab_size, (batch, config.block_size), generator=gen)

    def step() -> None:
        _, loss = wrapped(x, x, return_logits=False)
        loss.backward()
        clip_grad_norm(raw.parameters(), 1.0)
        optimizer.step()

    step()  # AdamW's moments now exist; gradients are kept (set_to_none=False) so they count as held
    optimizer.zero_grad(set_to_none=False)
    held = held_bytes(raw, optimizer)
    with peak_memory("cpu") as peak:
        step()
    return {"arm": parallel + (" + checkpointing" if checkpointing else ""), "held": held, "step_peak": peak.bytes,
            "peak": held + peak.bytes}


def main() -> int:
    parser = argparse.ArgumentParser(prog="torchrun ... -m scripts.bench_fsdp_memory", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="a tiny model (to check the script itself)")
    parser.add_argument("--json", help="write the per-rank figures to this file")
    args = parser.parse_args()
    rt = setup("cpu", "float32")
    if not rt.distributed:
        print("error: run under torchrun with 2 or more processes (torchrun --standalone --nproc_per_node=2 -m "
              "scripts.bench_fsdp_memory)", file=sys.stderr)
        return 2
    try:
        if args.tiny:
            config, batch = ModelConfig(vocab_size=256, block_size=32, n_layer=2, n_head=2, n_embd=64), 2
        else:
            config, batch = RunConfig.from_toml("configs/gpt2_124m.toml").model, 4
            config.block_size = 256
        rows = [measure(rt, config, parallel, ac, batch) for parallel, ac in ARMS]
        everyone: list = [None] * rt.world_size
        dist.all_gather_object(everyone, rows)
    finally:
        teardown(rt)
    if rt.is_main:
        mib = 2 ** 20
        print(f"{config.n_layer} layers x {config.n_embd}, vocab {config.vocab_size}, context {config.block_size}, "
              f"batch {batch} per rank, fp32 AdamW, {rt.world_size} processes; MiB per rank")
        print("| arm | " + " | ".join(f"rank {r}: held / step peak / peak" for r in range(rt.world_size)) + " |")
        print("|---|" + "---|" * rt.world_size)
        for i, (parallel, ac) in enumerate(ARMS):
            cells = [f"{rows[i]['held'] / mib:.0f} / {rows[i]['step_peak'] / mib:.0f} / {rows[i]['peak'] / mib:.0f}"
                     for rows in everyone]
            print(f"| {everyone[0][i]['arm']} | " + " | ".join(cells) + " |")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(everyone, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
