"""`eval_mode`: run a block with dropout off and put the model back in the mode it was in, whatever happens."""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Sampling, evaluation and attention capture happen mid-training; leaving the model in eval mode afterwards
    would silently switch dropout off for the rest of the run."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)
