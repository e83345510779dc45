"""Run under torchrun by test_distributed.py: one DDP step on gloo; rank 0 writes the loss and gradients."""
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from data.loader import ShardLoader
from model.config import ModelConfig
from model.gpt import GPT

data_dir, out_path, vocab = sys.argv[1], sys.argv[2], int(sys.argv[3])
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = DDP(GPT(ModelConfig(vocab_size=vocab, block_size=32, n_layer=2, n_head=2, n_embd=32)))
x, y = ShardLoader(data_dir, "train", 4, 32, seed=7, rank=rank, world_size=world).get_batch(3)
_, loss = model(x, y)
loss.backward()
dist.all_reduce(loss.detach(), op=dist.ReduceOp.SUM)
if rank == 0:
    grads = {n: p.grad for n, p in model.module.named_parameters()}
    torch.save({"loss": loss.detach() / world, "grads": grads}, out_path)
dist.destroy_process_group()
