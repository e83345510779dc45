"""Prepare token shards: `python -m scripts.prepare --config configs/shakespeare_char.toml [--data.key value ...]`.

Reads the [data] section (defaults <- TOML file <- command line), writes token shards, meta.json and tokenizer.json
into data.dir, and prints what it wrote. A rerun with the same settings and the same text reuses the shards.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from scripts.cli import add_config_options, flag_errors, make_parser, resolve_config, run_main


def summary(directory: Path) -> str:
    from data.meta import read_meta

    meta = read_meta(directory)
    tokens, nbytes = meta["tokens"], meta["bytes"]
    lines = [f"data: {directory}",
             f"  source     {meta['source']}  (sha256 {meta['text_sha256'][:12]})",
             f"  tokenizer  {meta['tokenizer']}, vocab {meta['vocab_size']:,}, shards of {meta['dtype']}"]
    for split in ("train", "val"):
        lines.append(f"  {split:<5}      {tokens[split]:,} tokens in {len(meta['shards'][split])} shard(s), "
                     f"{nbytes[split]:,} bytes of text ({nbytes[split] / max(tokens[split], 1):.2f} bytes/token)")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = make_parser("python -m scripts.prepare", __doc__)
    add_config_options(parser, sections=("data",))
    return parser


@flag_errors(build_parser)
def main() -> int:
    cfg = resolve_config(build_parser().parse_args())
    from data.prepare import prepare  # after parsing, so -h and config errors answer at once

    print(summary(prepare(cfg.data)))
    return 0


if __name__ == "__main__":
    run_main(main)
