"""Run under torchrun by test_train_gpu_paths.py: the training script, with rank 0's evaluation failing."""
import os

import train.trainer
from scripts.cli import run_main
from scripts.train import main


def broken(*args, **kwargs):
    raise OSError("disk full (simulated at rank 0's evaluation)")


if os.environ.get("RANK") == "0":
    train.trainer.estimate_losses = broken
run_main(main)
