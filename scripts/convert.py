"""Convert between attngpt checkpoints and Hugging Face or nanoGPT folders.

  python -m scripts.convert to-hf --ckpt checkpoints/llama_char_cpu --out hf/llama_char   # LlamaForCausalLM
  python -m scripts.convert to-hf --ckpt checkpoints/quickstart --out hf/quick --push-to-hub me/quick-attngpt
  python -m scripts.convert from-hf --src hf/llama_char --out checkpoints/back           # GPT-2, Llama or attngpt
  python -m scripts.convert from-hf --src gpt2 --out checkpoints/gpt2                    # hub name (online)
  python -m scripts.convert from-nanogpt --src out-shakespeare-char/ckpt.pt --out checkpoints/nano

to-hf writes the closest architecture transformers knows: GPT2LMHeadModel for a GPT-2-shaped model,
LlamaForCausalLM for rope + RMSNorm + SwiGLU, else attngpt's own (AutoModelForCausalLM with trust_remote_code=True).
The tokenizer goes with it as tokenizer.json, so AutoTokenizer encodes as attngpt does. Imports write an ordinary
attngpt checkpoint folder that sample, evaluate and the inspector read like any other. Nothing read here can
execute code: safetensors, JSON, torch.load(weights_only=True), and a meta.pkl reader that admits only dicts,
strings and numbers.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from model.checkpoint import load_any, save_checkpoint
from model.hf_folder import ARCHS, check_logged_in, check_out_dir, choose_arch, export_hf, load_hf, push_to_hub
from model.nanogpt import load_nanogpt
from scripts.cli import flag_errors, run_main
from scripts.inference_args import HelpFormatter


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m scripts.convert", description=__doc__, formatter_class=HelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, metavar="{to-hf,from-hf,from-nanogpt}")
    out = sub.add_parser("to-hf", help="attngpt checkpoint -> Hugging Face folder (GPT-2, Llama or attngpt)",
                         formatter_class=HelpFormatter)
    out.add_argument("--ckpt", required=True, help="checkpoint or run folder (or anything sample --ckpt accepts)")
    out.add_argument("--arch", default="auto", choices=["auto", *ARCHS],
                     help="auto = the first of gpt2, llama, attngpt that expresses the model exactly")
    out.add_argument("--push-to-hub", default=None, metavar="REPO",
                     help="then upload the folder to this hub repo (user/name; needs `hf auth login` or HF_TOKEN)")
    out.add_argument("--private", action="store_true", help="create the hub repo as private")
    hf = sub.add_parser("from-hf", help="Hugging Face folder or GPT-2 hub name -> attngpt checkpoint",
                        formatter_class=HelpFormatter)
    hf.add_argument("--src", required=True, help="a GPT-2, Llama or attngpt folder (config.json, model.safetensors "
                                                 "or pytorch_model.bin, tokenizer), or gpt2 | gpt2-medium | "
                                                 "gpt2-large | gpt2-xl (downloaded)")
    nano = sub.add_parser("from-nanogpt", help="nanoGPT ckpt.pt -> attngpt checkpoint", formatter_class=HelpFormatter)
    nano.add_argument("--src", required=True, help="nanoGPT ckpt.pt, or the out_dir holding it")
    nano.add_argument("--meta", default=None, help="nanoGPT meta.pkl of a char-level dataset; default: beside "
                                                   "ckpt.pt, else GPT-2's BPE for a GPT-2-sized vocabulary")
    for parser in (out, hf, nano):
        parser.add_argument("--out", required=True, help="folder to write")
        parser.add_argument("--overwrite", action="store_true", help="replace what --out already holds")
    return p


def to_hf(args: argparse.Namespace) -> None:
    if args.push_to_hub:
        check_logged_in()  # before the export, so a missing login costs nothing
    ckpt = load_any(args.ckpt)
    try:
        arch = choose_arch(ckpt.model.config, args.arch)
    except ValueError as e:
        raise ValueError(f"--arch {args.arch}: {e}") from None
    export_hf(ckpt, args.out, arch=arch, overwrite=True)
    module = ARCHS[arch]
    remote = ", trust_remote_code=True" if arch == "attngpt" else ""
    print(f"wrote {args.out} as {module.ARCHITECTURE} ({ckpt.model.num_params() / 1e6:.2f}M params, "
          f"{ckpt.tokenizer.name} tokenizer); load it with "
          f"transformers.AutoModelForCausalLM.from_pretrained({args.out!r}{remote})")
    if args.push_to_hub:
        print(f"pushed to {push_to_hub(args.out, args.push_to_hub, private=args.private)}")


@flag_errors(build_parser, meta_path="--meta")
def main() -> int:
    args = build_parser().parse_args()
    try:
        check_out_dir(Path(args.out), args.overwrite)
    except ValueError:
        raise ValueError(f"--out: {args.out} already exists and is not empty "
                         "(pass --overwrite to replace it)") from None
    if args.command == "to-hf":
        to_hf(args)
        return 0
    ckpt = load_hf(args.src) if args.command == "from-hf" else load_nanogpt(args.src, args.meta)
    save_checkpoint(args.out, ckpt.model, ckpt.tokenizer, ckpt.config)
    print(f"wrote {args.out} ({ckpt.model.num_params() / 1e6:.2f}M params, {ckpt.tokenizer.name} tokenizer); "
          f"sample with: python -m scripts.sample --ckpt {args.out}")
    return 0


if __name__ == "__main__":
    run_main(main)
