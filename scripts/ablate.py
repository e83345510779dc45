"""Scaled vs unscaled vs additive attention, softmax saturation, and explicit vs fused attention cost.

    python -m scripts.ablate [--out checkpoints/ablation] [--config FILE] [--section.key VALUE ...]

Trains one small model three times (same data, seed and step budget; configs/ablation.toml unless --config says
otherwise) and writes results.md, results.json, ablation.png, saturation.png and attention_cost.png into --out.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from experiments.variants import VARIANTS
from scripts.cli import add_config_options, flag_errors, make_parser, resolve_config, run_main
from train.config_io import read_toml

PRESET = Path(__file__).resolve().parents[1] / "configs" / "ablation.toml"
FORCED = {"model.attention": "uses this for the dot-product variants (sdpa if additive) and additive for the third",
          "model.scaled": "sets it per variant", "train.out_dir": "uses --out/<variant> instead",
          "log.attention": "always turns it on (the entropy curve)", "train.resume": "always starts afresh",
          "train.overwrite": "replaces earlier runs in --out"}


def build_parser() -> argparse.ArgumentParser:
    p = make_parser("python -m scripts.ablate", __doc__)
    a = p.add_argument_group("ablation options")
    a.add_argument("--out", default="checkpoints/ablation", help="results folder; one run per variant inside "
                   "(default: %(default)s)")
    a.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS),
                   help="attention variants to train (default: %(default)s)")
    a.add_argument("--saturation-dims", nargs="+", type=int, default=[16, 64, 256, 1024], metavar="D",
                   help="d_k values of the softmax saturation demo; none with --saturation-dims 0 (default: %(default)s)")
    a.add_argument("--saturation-keys", type=int, default=64, help="keys per query in the demo (default: %(default)s)")
    a.add_argument("--cost-lengths", nargs="+", type=int, default=[128, 256, 512, 1024, 2048], metavar="T",
                   help="sequence lengths of the explicit-vs-fused benchmark; none with --cost-lengths 0 "
                   "(default: %(default)s)")
    a.add_argument("--cost-batch", type=int, default=1, help="batch of the benchmark (default: %(default)s)")
    a.add_argument("--cost-heads", type=int, default=4, help="heads of the benchmark (default: %(default)s)")
    a.add_argument("--cost-head-dim", type=int, default=64, help="head size of the benchmark (default: %(default)s)")
    a.add_argument("--cost-repeats", type=int, default=3, help="timed calls per path and length at least (more until "
                   "0.25 s have passed); the fastest is reported (default: %(default)s)")
    a.add_argument("--cost-forward-only", action="store_true",
                   help="time the forward pass only (default: forward + backward, as in training)")
    a.add_argument("--cost-device", default="cpu", help="device of the benchmark: cpu | cuda (default: %(default)s)")
    a.add_argument("--threads", type=int, default=0, help="torch CPU threads for everything; 0 = torch's default. "
                   "On a busy machine, fewer threads than free cores avoids stalls (default: %(default)s)")
    add_config_options(p)
    p.set_defaults(config=str(PRESET))
    _show_preset(p, PRESET)
    return p


def _show_preset(parser: argparse.ArgumentParser, preset: Path) -> None:
    """-h shows what the ablation actually uses: the preset's value beside each field's built-in default."""
    values = {f"{s}.{k}": v for s, table in read_toml(preset).items() for k, v in table.items()}
    for action in parser._actions:
        if action.dest == "config":
            action.help = f"TOML preset (default: {preset.relative_to(preset.parents[1])}); fields it does not set " \
                          "keep the defaults below"
        elif action.dest in FORCED:
            action.help = f"{action.help}; the ablation {FORCED[action.dest]}"
        elif action.dest in values and action.help:
            action.help = f"{action.help[:-1]}; ablation preset: {values[action.dest]!r})"


def _positive(name: str, values: list[int]) -> list[int]:
    if values == [0]:
        return []
    if any(v < 1 for v in values):
        raise ValueError(f"--{name}: values must be >= 1 (or a single 0 to skip)")
    return values


@flag_errors(build_parser, variant="--variants")
def main() -> int:
    args = build_parser().parse_args()
    cfg = resolve_config(args)
    dims, lengths = _positive("saturation-dims", args.saturation_dims), _positive("cost-lengths", args.cost_lengths)
    for name in ("saturation_keys", "cost_batch", "cost_heads", "cost_head_dim", "cost_repeats"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')}: {getattr(args, name)} must be >= 1")
    from experiments import attention_cost, report, saturation, variants  # after parsing: -h answers at once
    from scripts.inference_args import set_threads

    set_threads(args.threads)

    variants.check_budget(cfg)
    if lengths:  # a missing device fails now, not after minutes of training
        from train.runtime import pick_device
        pick_device(args.cost_device, option="--cost-device")
    runs = variants.run_variants(cfg, args.out, tuple(dict.fromkeys(args.variants)))
    print(report.variants_table(runs))
    sat = saturation.softmax_saturation(tuple(dims), args.saturation_keys) if dims else []
    if sat:
        print(report.saturation_table(sat))
    mode = "forward" if args.cost_forward_only else "forward + backward"
    cost = attention_cost.attention_cost(tuple(lengths), args.cost_heads, args.cost_head_dim, args.cost_batch,
                                         backward=not args.cost_forward_only, repeats=args.cost_repeats,
                                         device=args.cost_device) if lengths else []
    if cost:
        print(f"explicit vs fused attention, {mode}, {args.cost_device}:")
        print(report.cost_table(cost))
    paths = report.write_results(args.out, cfg, runs, sat, cost, mode, args.cost_device)
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


if __name__ == "__main__":
    run_main(main)
