"""Benchmark (not a test): tokenization throughput per tokenizer on the default corpus, and prepare time.

    python -m scripts.bench_tokenizers [--vocab-size 4096] [--repeat 1] [--tokenizers char,gpt2,bpe]

Throughput is measured on the whole default corpus in this process (one thread; prepare adds worker processes only
for corpora over 16 MB). Prepare time is a fresh `data.prepare.prepare` into a temporary folder, then a rerun that
reuses the shards.
"""
from __future__ import annotations

import argparse
import platform
import os
import sys
import tempfile
import time

from tqdm import tqdm

from data.config import DataConfig
from data.prepare import prepare
from data.sources import corpus_pieces, documents
from data.tokenizers import CharTokenizer, gpt2_tokenizer


def timed(fn, repeat: int = 1):
    """(best seconds over `repeat` runs, last result)."""
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.bench_tokenizers", description=__doc__.splitlines()[0])
    parser.add_argument("--vocab-size", type=int, default=4096, help="vocabulary of the trained bpe (default: 4096)")
    parser.add_argument("--repeat", type=int, default=1, help="timing runs per measurement, best kept (default: 1)")
    parser.add_argument("--tokenizers", default="char,gpt2,bpe", help="comma-separated (default: char,gpt2,bpe)")
    args = parser.parse_args()
    kinds = [k.strip() for k in args.tokenizers.split(",") if k.strip()]

    seconds, text = timed(lambda: "".join(corpus_pieces(documents(DataConfig()))))
    mb = len(text.encode("utf-8")) / 1e6
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}")
    print(f"default corpus: {mb:.2f} MB, {len(text):,} characters, built from markdown in {seconds:.2f} s\n")

    builders = {"char": lambda: CharTokenizer.from_text(text), "gpt2": gpt2_tokenizer}
    if "bpe" in kinds:
        from data.bpe_train import train_bpe
        builders["bpe"] = lambda: train_bpe([text], args.vocab_size)
    print(f"{'tokenizer':<10}{'vocab':>8}{'build s':>9}{'tokens':>12}{'bytes/tok':>10}{'MB/s':>9}"
          f"{'prepare s':>11}{'rerun s':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for kind in tqdm(kinds, desc="bench_tokenizers", unit="tokenizer", file=sys.stderr, leave=False):
            build_s, tok = timed(builders[kind])
            encode_s, ids = timed(lambda: tok.encode_array(text), args.repeat)
            cfg = DataConfig(tokenizer=kind, vocab_size=args.vocab_size, dir=os.path.join(tmp, kind))
            prepare_s, _ = timed(lambda: prepare(cfg, verbose=False))
            rerun_s, _ = timed(lambda: prepare(cfg, verbose=False))
            tqdm.write(f"{kind:<10}{tok.vocab_size:>8,}{build_s:>9.2f}{len(ids):>12,}{mb * 1e6 / len(ids):>10.2f}"
                       f"{mb / encode_s:>9.1f}{prepare_s:>11.2f}{rerun_s:>9.2f}", file=sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
