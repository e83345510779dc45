"""train.config_io and RunConfig's constructors: TOML, dicts, checkpoints and overrides, one path for each."""
from __future__ import annotations

from pathlib import Path

import pytest

from train.config import RunConfig
from train.config_io import apply_overrides, field_help, unescape
from train.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]


def test_from_toml_from_dict_and_overrides_agree():
    a = RunConfig.from_toml(str(ROOT / "configs/tiny.toml")).with_overrides({"train.lr": "1e-3", "model.n_layer": 3})
    b = RunConfig.from_dict({"model": {"block_size": 32, "n_layer": 3, "n_head": 2, "n_embd": 32},
                             "data": {"source": "shakespeare", "tokenizer": "char", "dir": "cache/tiny"},
                             "train": {"out_dir": "checkpoints/tiny", "max_iters": 20, "eval_interval": 10,
                                       "eval_iters": 2, "log_interval": 5, "batch_size": 8, "lr": 1e-3,
                                       "min_lr": 3e-4, "warmup_iters": 5, "device": "cpu"},
                             "log": {"sample_tokens": 32}})
    assert a.to_dict() == b.to_dict()


def test_overrides_return_a_copy_and_parse_strings_to_the_field_type():
    base = RunConfig()
    changed = apply_overrides(base, {"train.compile": "true", "train.max_iters": "7", "log.sample_prompt": "a\\nb"})
    assert (changed.train.compile, changed.train.max_iters, changed.log.sample_prompt) == (True, 7, "a\nb")
    assert base.train.compile is False and base.train.max_iters == 5000


@pytest.mark.parametrize("overrides, message", [({"train.nope": "1"}, "train.nope: unknown config key"),
                                                ({"nosection.x": 1}, "expected section.key"),
                                                ({"train.max_iters": "many"}, "train.max_iters: expected int"),
                                                ({"train.lr": True}, "train.lr: expected float")])
def test_bad_overrides_name_the_key(overrides, message):
    with pytest.raises(ValueError, match=message):
        RunConfig().with_overrides(overrides)


def test_from_checkpoint_gives_the_resolved_config_back(tiny_config):
    from train.loop import train

    tiny_config.train.max_iters = 2
    tiny_config.model.dropout = 0.05
    train(tiny_config)
    back = RunConfig.from_checkpoint(tiny_config.train.out_dir)
    assert back.model.dropout == 0.05 and back.train.max_iters == 2 and back.model.vocab_size > 0
    assert back.data.dir == tiny_config.data.dir


def test_field_help_is_the_comment_beside_the_field():
    assert field_help(TrainConfig)["max_iters"] == "optimizer steps"


def test_unescape_turns_only_the_three_escapes():
    assert unescape(r"a\nb\tc\\d\x") == "a\nb\tc\\d\\x"
