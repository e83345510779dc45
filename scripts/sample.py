"""Sample from a checkpoint, streaming each token to stdout as it is generated.

  python -m scripts.sample --ckpt checkpoints/shakespeare_char --prompt "ROMEO:" --max-new-tokens 300
  echo "To be" | python -m scripts.sample --ckpt gpt2_dir --temperature 0.7 --top-p 0.9 --stop "\\n\\n"
  python -m scripts.sample --ckpt checkpoints/shakespeare_char -i        # a prompt per line until end of input

The prompt comes from --prompt, else --prompt-file, else standard input when it is not a terminal, else "\\n".
An empty prompt starts from the tokenizer's start token (end-of-text; a newline for a char vocabulary). With --num-samples N the samples
decode together as one batch and are printed one after another, separated by a line of dashes.
"""
from __future__ import annotations

import argparse
import sys

from model.inference import SamplingSettings, check_max_new_tokens, make_generator
from model.text_stream import encode_prompt, stream_text
from scripts.cli import flag_errors, run_main
from train.config_io import unescape
from scripts.inference_args import HelpFormatter, add_model_options, load_model

SEPARATOR = "---------------"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m scripts.sample", description=__doc__, formatter_class=HelpFormatter)
    add_model_options(p)
    p.add_argument("--prompt", default=None, help="text to continue")
    p.add_argument("--prompt-file", default=None, help="read the prompt from this file ('-' = standard input)")
    p.add_argument("-i", "--interactive", action="store_true", help="read a prompt per line, stream, repeat until EOF")
    p.add_argument("--max-new-tokens", type=int, default=256, help="tokens to generate per sample")
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy; < 1 sharper, > 1 flatter")
    p.add_argument("--top-k", type=int, default=200, help="sample among the k most likely tokens; 0 = off")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus: smallest set reaching probability p; 1 = off")
    p.add_argument("--repetition-penalty", type=float, default=1.0,
                   help="> 1 lowers tokens already in the context (HF semantics); 1 = off")
    p.add_argument("--seed", type=int, default=None, help="same seed, same text; none = fresh randomness")
    p.add_argument("--num-samples", type=int, default=1, help="samples decoded together as one batch")
    p.add_argument("--stop", nargs="+", action="extend", default=[], metavar="TEXT",
                   help="stop a sample at the first of these strings (not printed); \\n and \\t are understood")
    p.add_argument("--window-shift", type=int, default=0,
                   help="past block_size, drop this many oldest tokens at once; 0 = block_size/4, 1 = exact sliding")
    p.add_argument("--no-cache", action="store_true", help="recompute the whole window every step (the slow check)")
    p.add_argument("--echo", action=argparse.BooleanOptionalAction, default=True,
                   help="print the prompt before its continuation (never in -i mode)")
    return p


def read_prompt(args: argparse.Namespace) -> str:
    if args.prompt is not None:
        return args.prompt
    if args.prompt_file == "-" or (args.prompt_file is None and not sys.stdin.isatty()):
        return sys.stdin.read()
    if args.prompt_file is not None:
        try:
            with open(args.prompt_file, encoding="utf-8") as f:
                return f.read()
        except UnicodeDecodeError:
            raise ValueError(f"--prompt-file: {args.prompt_file} is not UTF-8 text") from None
    return "\n"


def validate(args: argparse.Namespace) -> SamplingSettings:
    settings = SamplingSettings(args.temperature, args.top_k, args.top_p, args.repetition_penalty)
    settings.validate()
    check_max_new_tokens(args.max_new_tokens)
    if args.num_samples < 1:
        raise ValueError(f"--num-samples: {args.num_samples} must be >= 1")
    if args.window_shift < 0:
        raise ValueError(f"--window-shift: {args.window_shift} must be >= 0")
    if args.prompt is not None and args.prompt_file is not None:
        raise ValueError("--prompt and --prompt-file: give one of them")
    return settings


def run_one(ckpt, args, settings, gen, prompt: str, echo: bool) -> None:
    ids = encode_prompt(ckpt.tokenizer, prompt)
    if args.window_shift > ckpt.model.config.block_size:
        raise ValueError(f"--window-shift: {args.window_shift} exceeds block_size {ckpt.model.config.block_size}")
    texts = [""] * args.num_samples
    chunks = stream_text(ckpt.model, ckpt.tokenizer, ids, args.max_new_tokens, settings,
                         num_samples=args.num_samples, stop=[unescape(s) for s in args.stop], generator=gen,
                         cached=not args.no_cache, window_shift=args.window_shift)
    if args.num_samples == 1:
        if echo:
            sys.stdout.write(prompt)
        for _, chunk in chunks:
            sys.stdout.write(chunk)
            sys.stdout.flush()
        sys.stdout.write("\n")
    else:
        for row, chunk in chunks:
            texts[row] += chunk
        for text in texts:
            sys.stdout.write((prompt if echo else "") + text + f"\n{SEPARATOR}\n")
    sys.stdout.flush()


def interactive(ckpt, args, settings, gen) -> None:
    tty = sys.stdin.isatty()
    while True:
        if tty:
            print("> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        if not line:
            return
        prompt = line.rstrip("\n")
        if not prompt:
            continue
        try:
            run_one(ckpt, args, settings, gen, prompt, echo=False)
        except ValueError as e:  # a bad prompt (e.g. characters outside a char vocabulary) costs one line, not the session
            print(f"error: {e}", file=sys.stderr, flush=True)


@flag_errors(build_parser)
def main() -> int:
    args = build_parser().parse_args()
    settings = validate(args)
    ckpt = load_model(args.ckpt, args.device, args.dtype, args.quantize, args.threads)
    gen = make_generator(args.seed, ckpt.model.wte.weight.device)
    if args.interactive:
        interactive(ckpt, args, settings, gen)
    else:
        run_one(ckpt, args, settings, gen, read_prompt(args), echo=args.echo)
    return 0


if __name__ == "__main__":
    run_main(main)
