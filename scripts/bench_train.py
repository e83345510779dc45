"""Training throughput, side by side in one run: a plain fp32 PyTorch loop against attngpt's trainer.

    python -m scripts.bench_train --config configs/gpt2_124m.toml --train.batch_size 1 --train.grad_accum 1 --steps 6

Each contestant runs in its own process (so peak memory is its own), on the same model shape and batch, and the
two alternate for `--rounds` rounds. Prints median tokens/s, MFU against the matmul peak measured in the dtype
each one computes in (the plain loop fp32; the trainer whatever `--train.dtype` resolves to), peak
resident memory, and the ratio to the plain loop.
"""
from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

from scripts.cli import add_config_options, make_parser, resolve_config, run_main


def plain_loop(cfg, steps: int) -> list[float]:
    """The textbook loop: fp32 forward, backward, clip, torch's default AdamW, random tokens."""
    import torch

    from model.gpt import GPT

    torch.manual_seed(0)
    model = GPT(cfg.model)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    B, T = cfg.train.batch_size, cfg.model.block_size
    times = []
    for _ in range(steps):
        x = torch.randint(0, cfg.model.vocab_size, (B, T))
        t0 = time.perf_counter()
        _, loss = model(x, x)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    return times


def trainer_loop(cfg, steps: int) -> list[float]:
    """attngpt's own training loop on the config's data, step times read back from metrics.jsonl."""
    from train.loop import train

    with tempfile.TemporaryDirectory() as tmp:
        cfg.train.out_dir, cfg.train.max_iters = tmp, steps
        cfg.train.eval_interval, cfg.train.eval_iters, cfg.train.log_interval = steps, 1, 1
        cfg.log.sample_tokens, cfg.log.attention, cfg.log.wandb = 0, False, False
        train(cfg)
        rows = [json.loads(line) for line in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
    return [r["step_time_ms"] / 1000 for r in rows if "step_time_ms" in r]


def child(which: str, argv: list[str], steps: int, warmup: int) -> None:
    parser = make_parser("bench_train (child)", None)
    add_config_options(parser)
    cfg = resolve_config(parser.parse_args(argv))
    from data.meta import read_meta
    from data.prepare import prepare

    prepare(cfg.data, verbose=False)
    cfg.model.vocab_size = cfg.model.vocab_size or read_meta(cfg.data.dir)["vocab_size"]
    times = (plain_loop if which == "plain" else trainer_loop)(cfg, steps + warmup)[warmup:]
    import torch

    from model.gpt import GPT
    from train.runtime import measure_matmul_flops, pick_device, pick_dtype

    short_name = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
    device = torch.device("cpu") if which == "plain" else pick_device(cfg.train.device, 0)  # plain runs on CPU
    dtype = torch.float32 if which == "plain" else pick_dtype(cfg.train.dtype, device, cfg.model.n_embd)
    with torch.device("meta"):
        flops_per_token = GPT(cfg.model).flops_per_token()
    tokens = cfg.train.batch_size * cfg.model.block_size * cfg.train.grad_accum
    step = statistics.median(times)
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"tokens_per_s": tokens / step, "step_s": step, "flops_per_token": flops_per_token,
                      "peak_rss": peak_rss, "dtype": short_name[dtype],
                      "matmul_peak": measure_matmul_flops(device, 2048, 3, dtype, budget_s=1.0)}))


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[5:], int(sys.argv[3]), int(sys.argv[4]))
        return 0
    parser = make_parser("python -m scripts.bench_train", __doc__)
    parser.add_argument("--steps", type=int, default=8, help="timed steps per contestant (default: 8)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed first steps (default: 2)")
    parser.add_argument("--only", choices=["plain", "trainer"], help="run one contestant (default: both)")
    parser.add_argument("--rounds", type=int, default=2,
                        help="alternate the contestants this many times; medians are reported (default: 2)")
    add_config_options(parser)
    args, _ = parser.parse_known_args()
    resolve_config(args)  # validate before spending minutes
    passthrough = _strip(sys.argv[1:], ("--steps", "--warmup", "--only", "--rounds"))
    runs: dict[str, list[dict]] = {}
    order = [args.only] if args.only else ["plain", "trainer"]
    jobs = [which for _ in range(max(1, args.rounds)) for which in order]  # alternating: a slow spell hits both
    for which in tqdm(jobs, desc="bench_train", unit="run", file=sys.stderr):
        proc = subprocess.run([sys.executable, "-m", "scripts.bench_train", "--child", which, str(args.steps),
                               str(args.warmup), *passthrough], capture_output=True, text=True,
                              env={**os.environ, "WANDB_MODE": "disabled"})
        if proc.returncode != 0:
            last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "?"
            raise RuntimeError(f"{which} failed: {last}")
        runs.setdefault(which, []).append(json.loads(proc.stdout.strip().splitlines()[-1]))
    results = {w: {k: rs[0][k] if k == "dtype" else statistics.median(r[k] for r in rs) for k in rs[0]}
               for w, rs in runs.items()}
    if len(runs) == 2:
        per_round = [t["tokens_per_s"] / p["tokens_per_s"] for p, t in zip(runs["plain"], runs["trainer"])]
        print("trainer / plain per round: " + ", ".join(f"{r:.2f}x" for r in per_round))
    base = results.get("plain", {}).get("tokens_per_s")
    print(f"{'contestant':<10} {'dtype':>6} {'tokens/s':>9} {'step s':>8} {'matmul peak':>12} {'MFU':>6} "
          f"{'peak RSS':>9} {'vs plain':>8}")
    for which, r in results.items():
        mfu = r["tokens_per_s"] * r["flops_per_token"] / r["matmul_peak"]  # against the peak of its own dtype
        ratio = f"{r['tokens_per_s'] / base:.2f}x" if base else "-"
        print(f"{which:<10} {r['dtype']:>6} {r['tokens_per_s']:>9.1f} {r['step_s']:>8.3f} "
              f"{r['matmul_peak'] / 1e9:>7.0f} GF/s {mfu:>6.1%} {r['peak_rss'] / 2**30:>7.2f}GB {ratio:>8}")
    fp32 = [r for r in results.values() if r["dtype"] == "fp32"]
    if fp32:
        ceiling = fp32[0]["matmul_peak"] / fp32[0]["flops_per_token"]
        print(f"fp32 ceiling at the measured fp32 matmul peak ({fp32[0]['matmul_peak'] / 1e9:.0f} GFLOP/s): "
              f"{ceiling:.0f} tokens/s; " + ", ".join(f"{w} reaches {r['tokens_per_s'] / ceiling:.0%}"
                                                     for w, r in results.items()))
    return 0


def _strip(argv: list[str], flags: tuple[str, ...]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in flags:
            skip = True
            continue
        out.append(a)
    return out


if __name__ == "__main__":
    run_main(main)
