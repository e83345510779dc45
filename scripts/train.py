"""Train a GPT: `python -m scripts.train --config configs/tiny.toml [--section.key value ...]`.

Also under torchrun: `torchrun --nproc_per_node=N -m scripts.train --config ...` (gloo on CPU, NCCL on CUDA).
"""
from __future__ import annotations

from scripts.cli import add_config_options, make_parser, resolve_config, run_main


def main() -> int:
    parser = make_parser("python -m scripts.train", __doc__)
    add_config_options(parser)
    cfg = resolve_config(parser.parse_args())
    from train.loop import train  # after parsing, so -h and config errors answer at once

    train(cfg)
    return 0


if __name__ == "__main__":
    run_main(main)
