"""train.collectives in one process (the identities the trainer relies on); their multi-process behaviour runs
under torchrun in test_distributed.py (an error on rank 0 stops every rank) and test_train_parallel_resume.py."""
from __future__ import annotations

import pytest
import torch

from train import collectives
from train.runtime import Runtime

ONE = Runtime(torch.device("cpu"), torch.float32)


def test_one_process_collectives_are_identities():
    collectives.barrier(ONE)
    assert collectives.from_rank0(ONE, {"a": 1}) == {"a": 1}
    assert collectives.agree(ONE, True, 2.5) == (True, 2.5)
    values = torch.tensor([1.0, 3.0])
    assert torch.equal(collectives.mean_over_ranks(ONE, values), torch.tensor([1.0, 3.0]))
    assert collectives.gather_rng(ONE) is None  # a single process saves its own stream anyway
    assert collectives.first_error(ONE, "") == "" and collectives.first_error(ONE, "bad") == "bad"


def test_errors_are_raised_as_the_callers_expect():
    collectives.raise_if_any(ONE, "")  # no error: nothing happens
    with pytest.raises(ValueError, match="^data.dir: gone$"):
        collectives.raise_if_any(ONE, "data.dir: gone")
    assert collectives.on_rank0(ONE, lambda: 42, "answering") == 42
    with pytest.raises(KeyError):  # rank 0 re-raises its own exception as it was
        collectives.on_rank0(ONE, lambda: {}["missing"], "looking up")
    assert collectives.checked_on_rank0(ONE, lambda: "ok") == "ok"
    with pytest.raises(ValueError, match="^bad input$"):
        collectives.checked_on_rank0(ONE, lambda: (_ for _ in ()).throw(ValueError("bad input")))


def test_on_rank0_runs_the_job_only_on_rank_0(monkeypatch):
    """Rank 1 of two: the job does not run there, and rank 0's failure arrives as a RuntimeError naming it."""
    rank1 = Runtime(torch.device("cpu"), torch.float32, rank=1, world_size=2)
    ran: list = []
    monkeypatch.setattr(collectives, "from_rank0", lambda rt, obj: "rank 0 failed while saving: OSError: full")
    with pytest.raises(RuntimeError, match="^rank 0 failed while saving: OSError: full$"):
        collectives.on_rank0(rank1, lambda: ran.append(1), "saving")
    assert ran == []
