"""Convert weights between attngpt, Hugging Face GPT-2 and nanoGPT.

  python -m scripts.convert from-hf --src gpt2 --out checkpoints/gpt2            # hub name (online) or HF folder
  python -m scripts.convert from-nanogpt --src out-shakespeare-char/ckpt.pt --out checkpoints/nano
  python -m scripts.convert to-hf --ckpt checkpoints/gpt2_124m --out hf/gpt2_124m  # GPT2LMHeadModel.from_pretrained

Imports write an ordinary attngpt checkpoint folder (model.safetensors, config.json, tokenizer.json) that sample,
evaluate and the inspector read like any other. Nothing read here can execute code: safetensors, JSON,
torch.load(weights_only=True), and a meta.pkl reader that admits only dicts, strings and numbers.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from model.checkpoint import save_checkpoint
from model.interop import export_hf, load_any, load_hf_gpt2, load_nanogpt
from scripts.cli import run_main
from scripts.inference_args import HelpFormatter

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m scripts.convert", description=__doc__, formatter_class=HelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, metavar="{from-hf,from-nanogpt,to-hf}")
    hf = sub.add_parser("from-hf", help="HF GPT-2 folder or hub name -> attngpt checkpoint",
                        formatter_class=HelpFormatter)
    hf.add_argument("--src", required=True, help="gpt2 | gpt2-medium | gpt2-large | gpt2-xl, or a folder with "
                                                 "config.json and model.safetensors (or pytorch_model.bin)")
    nano = sub.add_parser("from-nanogpt", help="nanoGPT ckpt.pt -> attngpt checkpoint", formatter_class=HelpFormatter)
    nano.add_argument("--src", required=True, help="nanoGPT ckpt.pt, or the out_dir holding it")
    nano.add_argument("--meta", default=None, help="nanoGPT meta.pkl of a char-level dataset; default: beside "
                                                   "ckpt.pt, else GPT-2's BPE for a GPT-2-sized vocabulary")
    out = sub.add_parser("to-hf", help="attngpt checkpoint (GPT-2 shaped) -> HF GPT-2 folder",
                         formatter_class=HelpFormatter)
    out.add_argument("--ckpt", required=True, help="checkpoint or run folder (or anything sample --ckpt accepts)")
    for parser in (hf, nano, out):
        parser.add_argument("--out", required=True, help="folder to write")
        parser.add_argument("--overwrite", action="store_true", help="replace what --out already holds")
    return p


def check_out(out: str, overwrite: bool) -> None:
    path = Path(out)
    if path.exists() and (not path.is_dir() or any(path.iterdir())) and not overwrite:
        raise ValueError(f"--out: {out} already exists (pass --overwrite to replace it)")


def main() -> int:
    args = build_parser().parse_args()
    check_out(args.out, args.overwrite)
    if args.command == "to-hf":
        ckpt = load_any(args.ckpt)
        export_hf(ckpt, args.out, overwrite=True)
        print(f"wrote {args.out} ({ckpt.model.num_params() / 1e6:.1f}M params); load it with "
              f"transformers.GPT2LMHeadModel.from_pretrained({args.out!r})")
        return 0
    if args.command == "from-hf":
        ckpt = load_hf_gpt2(args.src)
    else:
        ckpt = load_nanogpt(args.src, args.meta)
    save_checkpoint(args.out, ckpt.model, ckpt.tokenizer, ckpt.config)
    print(f"wrote {args.out} ({ckpt.model.num_params() / 1e6:.1f}M params, {ckpt.tokenizer.name} tokenizer); "
          f"sample with: python -m scripts.sample --ckpt {args.out}")
    return 0


if __name__ == "__main__":
    run_main(main)
