"""Draw train and val loss against step and against tokens from one or more runs' metrics.jsonl.

    python -m scripts.plot checkpoints/shakespeare_char checkpoints/other_run --out loss.png
"""
from __future__ import annotations

import argparse

from scripts.cli import run_main


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m scripts.plot", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", metavar="RUN_DIR",
                   help="run folders holding metrics.jsonl (or the files); each becomes one colour")
    p.add_argument("--out", default="loss.png", help="PNG to write (default: %(default)s)")
    p.add_argument("--labels", nargs="+", default=None, metavar="NAME",
                   help="legend names, one per run (default: the run folder names)")
    p.add_argument("--logy", action="store_true", help="log-scale loss axis (default: off)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.labels is not None and len(args.labels) != len(args.runs):
        raise ValueError(f"--labels: {len(args.labels)} names for {len(args.runs)} runs")
    from inspector.curves import plot_loss_curves
    from inspector.plots import save

    path = save(plot_loss_curves(args.runs, args.labels, args.logy), args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    run_main(main)
