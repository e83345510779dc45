"""Loss, perplexity and bits per byte of one or more checkpoints, on their val split or on any text file.

  python -m scripts.evaluate --ckpt checkpoints/shakespeare_char
  python -m scripts.evaluate --ckpt runs/a --ckpt runs/b --text-file notes.txt --json
  python -m scripts.evaluate --ckpt checkpoints/shakespeare_char --quantize int8   # as loaded and int8, side by side

The split (or file) is cut into consecutive windows of block_size + 1 tokens that overlap by one, so every token
but the first is predicted exactly once, from the tokens before it in its window. Bits per byte divides the total
loss by the text's UTF-8 bytes instead of its tokens, which makes models with different tokenizers comparable:
bpb = loss * tokens / bytes / ln 2.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from model.checkpoint import Checkpoint
from scripts.cli import flag_errors, run_main
from model.quantize import check_quantize, quantize_model
from scripts.inference_args import HelpFormatter, add_model_options, load_model, placement


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m scripts.evaluate", description=__doc__, formatter_class=HelpFormatter)
    add_model_options(p, many=True)
    p.add_argument("--text-file", default=None, help="evaluate on this UTF-8 file instead of the checkpoint's data")
    p.add_argument("--data-dir", default=None, metavar="DIR",
                   help="the prepared data folder, when the one recorded in the checkpoint cannot be found")
    p.add_argument("--split", default="val", choices=["val", "train"], help="split of the checkpoint's data folder")
    p.add_argument("--max-tokens", type=int, default=0, help="evaluate at most this many tokens; 0 = all")
    p.add_argument("--batch-size", type=int, default=8, help="windows per forward pass")
    p.add_argument("--json", action="store_true", help="print a JSON list, one object per checkpoint")
    return p


def split_tokens(ckpt: Checkpoint, split: str, max_tokens: int = 0, data_dir: str | None = None
                 ) -> tuple[np.ndarray, int, int, str]:
    """(token memmap view, tokens in the split, UTF-8 bytes in the split, description) of the checkpoint's data."""
    from data.loader import ShardLoader
    from model.run_data import find_data_dir

    try:
        found = find_data_dir(ckpt.path, ckpt.config, data_dir)
    except ValueError as e:
        raise ValueError(f"{e}; pass --data-dir with the prepared folder it used, or --text-file FILE") from None
    data_dir = str(found.relative_to(Path.cwd()) if found.is_relative_to(Path.cwd()) else found)
    loader = ShardLoader(data_dir, split, 1, 1, 0)
    meta = loader.meta
    if meta["tokenizer"] != ckpt.tokenizer.name or meta["vocab_size"] != ckpt.tokenizer.vocab_size:
        raise ValueError(f"{data_dir} was tokenized with {meta['tokenizer']} ({meta['vocab_size']} ids), but "
                         f"{ckpt.path} uses {ckpt.tokenizer.name} ({ckpt.tokenizer.vocab_size} ids)")
    tokens = loader.read(0, min(loader.n_tokens, max_tokens or loader.n_tokens))
    return tokens, loader.n_tokens, int(meta["bytes"][split]), f"{data_dir} ({split})"


def file_tokens(ckpt: Checkpoint, path: str) -> tuple[np.ndarray, int, int, str]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"--text-file: no such file {path}") from None
    except UnicodeDecodeError:
        raise ValueError(f"--text-file: {path} is not UTF-8 text") from None
    ids = np.asarray(ckpt.tokenizer.encode(text), dtype=np.int64)
    return ids, len(ids), len(text.encode("utf-8")), path


@torch.inference_mode()
def mean_loss(model, tokens: np.ndarray, batch_size: int) -> tuple[float, int]:
    """(mean next-token loss in nats, tokens scored) over consecutive windows of block_size + 1 tokens."""
    T = model.config.block_size
    device = model.wte.weight.device
    n_windows = (len(tokens) - 1) // T
    total, count = 0.0, 0
    starts = [i * T for i in range(n_windows)]
    rest = len(tokens) - 1 - n_windows * T
    batches = [starts[i:i + batch_size] for i in range(0, len(starts), batch_size)]
    for group in tqdm(batches, desc="evaluate", unit="batch", file=sys.stderr, leave=False, mininterval=0.5):
        w = torch.from_numpy(np.stack([tokens[s:s + T + 1] for s in group]).astype(np.int64)).to(device)
        total, count = _add(model, w, total, count)
    if rest > 0:
        w = torch.from_numpy(tokens[n_windows * T:].astype(np.int64)).unsqueeze(0).to(device)
        total, count = _add(model, w, total, count)
    if count == 0:
        raise ValueError("nothing to evaluate: the text holds fewer than 2 tokens")
    return total / count, count


def _add(model, windows: torch.Tensor, total: float, count: int) -> tuple[float, int]:
    _, loss = model(windows[:, :-1].contiguous(), windows[:, 1:].contiguous())
    n = windows[:, 1:].numel()
    return total + loss.item() * n, count + n


def scores(loss: float, n_tokens: int, n_bytes: int) -> dict:
    bpb = loss * n_tokens / max(n_bytes, 1) / math.log(2)
    return {"loss": round(loss, 6), "perplexity": round(math.exp(min(loss, 700.0)), 4), "bits_per_byte": round(bpb, 6)}


def evaluate_one(spec: str, args: argparse.Namespace) -> dict:
    """The checkpoint's scores; with --quantize, those of the quantized model too, on the same tokens."""
    ckpt = load_model(spec, args.device, args.dtype, threads=args.threads)
    if args.text_file:
        tokens, n_tokens, n_bytes, source = file_tokens(ckpt, args.text_file)
    else:
        tokens, n_tokens, n_bytes, source = split_tokens(ckpt, args.split, args.max_tokens, args.data_dir)
    if args.max_tokens:
        tokens = tokens[:args.max_tokens]
    if ckpt.model.config.vocab_size < ckpt.tokenizer.vocab_size:
        raise ValueError(f"{ckpt.path}: the model has {ckpt.model.config.vocab_size} ids, its tokenizer more")
    params = ckpt.model.num_params()
    loss, scored = mean_loss(ckpt.model, tokens, args.batch_size)
    result = {"checkpoint": str(ckpt.path), "data": source, "tokens": scored, **scores(loss, n_tokens, n_bytes),
              "params": params}
    if args.quantize != "none":
        q_loss, _ = mean_loss(quantize_model(ckpt.model, args.quantize), tokens, args.batch_size)
        result["quantize"] = args.quantize
        result["dtype"] = str(ckpt.model.wte.weight.dtype).removeprefix("torch.")
        result.update({f"{args.quantize}_{k}": v for k, v in scores(q_loss, n_tokens, n_bytes).items()})
        result[f"{args.quantize}_loss_change"] = round(q_loss / loss - 1.0, 6)
    return result


def print_table(results: list[dict]) -> None:
    q = results[0].get("quantize")
    if len(results) == 1:
        r = results[0]
        for key in ("checkpoint", "data", "tokens"):
            print(f"{key:<16}{r[key]:,}" if key == "tokens" else f"{key:<16}{r[key]}")
        if q:
            print(f"{'':<16}{r['dtype']:<12}{q}")
        for key in ("loss", "perplexity", "bits_per_byte"):
            line = f"{key.replace('_', ' '):<16}{r[key]}"
            if q:
                line = f"{line:<28}{r[f'{q}_{key}']}" + (f"  ({r[f'{q}_loss_change']:+.2%})" if key == "loss" else "")
            print(line)
        return
    rows = [[r["checkpoint"], f"{r['params'] / 1e6:.2f}M", f"{r['tokens']:,}", f"{r['loss']:.4f}",
             f"{r['perplexity']:.3f}", f"{r['bits_per_byte']:.4f}"]
            + ([f"{r[f'{q}_loss']:.4f}", f"{r[f'{q}_loss_change']:+.2%}"] if q else []) for r in results]
    header = ["checkpoint", "params", "tokens", "loss", "perplexity", "bits/byte"]
    header += [f"{q} loss", "change"] if q else []
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, ["-" * w for w in widths], *rows]:
        print("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))))


@flag_errors(build_parser)
def main() -> int:
    args = build_parser().parse_args()
    if args.max_tokens < 0:
        raise ValueError(f"--max-tokens: {args.max_tokens} must be >= 0")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size: {args.batch_size} must be >= 1")
    check_quantize(args.quantize, *placement(args.device, args.dtype))  # before any checkpoint is read
    results = [evaluate_one(spec, args) for spec in args.ckpt]
    if args.json:
        json.dump(results, sys.stdout, indent=2)
        print()
    else:
        print_table(results)
    return 0


if __name__ == "__main__":
    run_main(main)
