"""model.eval_mode: dropout off inside, the previous mode back afterwards, even after an error."""
from __future__ import annotations

import pytest
import torch

from model.eval_mode import eval_mode


@pytest.mark.parametrize("training", [True, False])
def test_mode_is_restored_after_the_block_and_after_an_error(training):
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5)).train(training)
    with eval_mode(net) as inner:
        assert inner is net and not net.training and not net[1].training
    assert net.training is training
    with pytest.raises(RuntimeError):
        with eval_mode(net):
            raise RuntimeError("boom")
    assert net.training is training
