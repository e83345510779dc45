"""Look at what the attention heads of a checkpoint do on a prompt.

    python -m scripts.attention --ckpt checkpoints/shakespeare_char --prompt "ROMEO:" --generate 60

writes into --out: attention_grid.png (layers x heads), attention_layer{i}.png, head_scores.png,
attention.html (self-contained viewer), head_stats.json / .csv and attention.npz (raw weights and tokens).

    python -m scripts.attention --run checkpoints/induction --over-training

writes --out/attention_over_training.html: the film of the heads across the run's evaluations.
"""
from __future__ import annotations

import argparse
import sys

from scripts.cli import Parser, flag_errors, run_main


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m scripts.attention", description=__doc__.split("\n\n")[0])
    p.add_argument("--ckpt", help="checkpoint directory, or a run folder (best/, else latest/); required "
                   "unless --over-training")
    p.add_argument("--prompt", help="text to run through the model; required with --ckpt")
    p.add_argument("--run", metavar="DIR", help="run folder whose saved evaluations --over-training shows")
    p.add_argument("--over-training", action="store_true",
                   help="write the film of --run: head scores and the probe's attention at every evaluation")
    p.add_argument("--generate", type=int, default=0, metavar="N",
                   help="generate N tokens after the prompt first, then capture prompt + continuation "
                        "(default: %(default)s)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="sampling temperature for --generate; 0 = greedy (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the sampler and of the induction probe's random tokens (default: %(default)s)")
    p.add_argument("--layers", type=int, nargs="+", default=None, metavar="L", help="layers to show (default: all)")
    p.add_argument("--heads", type=int, nargs="+", default=None, metavar="H", help="heads to show (default: all)")
    p.add_argument("--max-tokens", type=int, default=128, metavar="N",
                   help="keep at most the last N tokens, and at most block_size (default: %(default)s)")
    p.add_argument("--out", default="out/attention", help="output folder (default: %(default)s)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N | mps (default: %(default)s)")
    p.add_argument("--quantize", default="none", metavar="{none,int8}",  # checked by model.quantize after parsing
                   help="int8: int8 weights for every Linear, as in scripts.sample (default: %(default)s)")
    return p


def film(run: str, out: str) -> int:
    from inspector.film import write_film

    result = write_film(run, out)
    frames, crossing = result["frames"], result["crossing"]
    print(f"{len(frames)} evaluations, steps {frames[0].step}..{frames[-1].step}")
    if crossing:
        print(f"strongest induction head first >= {crossing['threshold']:g} at step {crossing['step']}: "
              f"L{crossing['layer']} H{crossing['head']} ({crossing['score']:.2f})")
    else:
        print("no head's induction score reached the induction label's threshold")
    print(f"wrote {result['path']}")
    return 0


@flag_errors(build_parser)
def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.over_training or args.run:
        if not (args.over_training and args.run) or args.ckpt:
            parser.error("--over-training goes with --run DIR (and not with --ckpt)")
        return film(args.run, args.out)
    if not args.ckpt or args.prompt is None:
        parser.error("--ckpt and --prompt are required (or --run DIR --over-training)")
    from model.checkpoint import load_checkpoint  # after parsing, so -h answers without importing torch
    import torch
    from scripts.inference_args import pick_device
    from inspector.report import inspect_attention
    from model.quantize import check_quantize, quantize_model

    device = pick_device(args.device)
    check_quantize(args.quantize, device, torch.float32)  # checkpoints load in fp32; refuse before reading one
    ck = load_checkpoint(args.ckpt, device=device)
    quantize_model(ck.model, args.quantize)
    result = inspect_attention(ck.model, ck.tokenizer, args.prompt, args.out, generate=args.generate,
                               layers=args.layers, heads=args.heads, max_tokens=args.max_tokens,
                               temperature=args.temperature, seed=args.seed, title=f"attention \u00b7 {ck.path}")
    cap = result["capture"]
    if result["dropped"]:
        print(f"note: kept the last {len(cap.token_ids)} tokens (dropped {result['dropped']})", file=sys.stderr)
    print(f"{len(cap.token_ids)} tokens, {len(cap.layers)} layers x {len(cap.heads)} heads")
    for name in ("induction", "prev_token", "first_token"):
        rows = [s for s in result["stats"] if s.get(name) is not None]
        if rows:
            best = max(rows, key=lambda s: s[name])
            print(f"strongest {name.replace('_', '-')} head: L{best['layer']} H{best['head']} ({best[name]:.2f})")
    labels: dict[str, int] = {}
    for s in result["stats"]:
        labels[s["label"]] = labels.get(s["label"], 0) + 1
    print("head labels: " + ", ".join(f"{k} {v}" for k, v in sorted(labels.items(), key=lambda kv: -kv[1])))
    for path in result["paths"].values():
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    run_main(main)
