"""experiments.variants: each variant changes the attention and nothing else."""
from pathlib import Path

import pytest

from experiments import variants as ablation
from train.config import RunConfig


def test_variant_config_changes_only_the_attention():
    base = RunConfig()
    base.model.attention = "manual"
    cfgs = {v: ablation.variant_config(base, v, "out") for v in ablation.VARIANTS}
    assert [(c.model.attention, c.model.scaled) for c in cfgs.values()] == [
        ("manual", True), ("manual", False), ("additive", True)]
    assert cfgs["unscaled"].train.out_dir == str(Path("out") / "unscaled")
    for c in cfgs.values():
        c.model.attention, c.model.scaled, c.train.out_dir = "manual", True, base.train.out_dir
        c.train.overwrite, c.log.attention = base.train.overwrite, base.log.attention
        assert c.to_dict() == base.to_dict()
    assert base.model.scaled is True  # the base is not modified
    with pytest.raises(ValueError, match="is not one of"):
        ablation.variant_config(base, "cosine", "out")
