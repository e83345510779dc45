"""Train a GPT: `python -m scripts.train --config configs/tiny.toml [--section.key value ...]`.

Also under torchrun: `torchrun --nproc_per_node=N -m scripts.train --config ...` (gloo on CPU, NCCL on CUDA).
"""
from __future__ import annotations

import argparse

from scripts.cli import add_config_options, flag_errors, make_parser, resolve_config, run_main


def build_parser() -> argparse.ArgumentParser:
    parser = make_parser("python -m scripts.train", __doc__)
    add_config_options(parser)
    return parser


@flag_errors(build_parser)
def main() -> int:
    cfg = resolve_config(build_parser().parse_args())
    from train.loop import train  # after parsing, so -h and config errors answer at once

    train(cfg)
    return 0


if __name__ == "__main__":
    run_main(main)
