"""Decoding speed at GPT-2 124M shape (random init): our KV-cached decode, our full recompute, transformers' generate().

  python -m scripts.bench_decode                       # batch 1, 16-token prompt, 200 and 400 new tokens
  python -m scripts.bench_decode --new-tokens 100 --skip-recompute --threads 1

All decoders get the same weights (ours exported to GPT2LMHeadModel) and decode greedily, so they do the same work
and must produce the same tokens (checked and printed). tokens/s counts new tokens over the whole call, time to first
token included; ms/token is the steady per-step time after the first token. An extra row shows the cost of sampling
(temperature 0.8, top-k 200; top-p 0.9) on top of the cached decode. The "floor" row times the model's Linear layers
alone on a one-token input: the weight reads every batch-1 step pays, i.e. the memory-bandwidth bound. transformers
is optional: without it its rows are skipped.
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable, Iterator

import torch

from model.config import ModelConfig
from model.gpt import GPT
from model.inference import SamplingSettings, make_generator, stream_tokens
from scripts.cli import run_main
from scripts.inference_args import HelpFormatter


OURS_ROW = "attngpt cached, greedy"
HF_ROW = "transformers generate(), greedy"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m scripts.bench_decode", description=__doc__,
                                formatter_class=HelpFormatter)
    p.add_argument("--new-tokens", type=int, nargs="+", default=[200, 400], help="generation lengths to time")
    p.add_argument("--prompt-tokens", type=int, default=16, help="prompt length")
    p.add_argument("--batch-size", type=int, default=1, help="sequences decoded together")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads; 0 = torch's default")
    p.add_argument("--skip-recompute", action="store_true", help="leave out the (slow) full-recompute rows")
    p.add_argument("--skip-hf", action="store_true", help="leave out transformers' generate()")
    p.add_argument("--skip-sampling", action="store_true", help="leave out the sampling rows")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights and prompt")
    p.add_argument("--rounds", type=int, default=1, help="time every decoder this many times, alternating; "
                   "the table shows medians")
    return p


def gpt2_small() -> GPT:
    return GPT(ModelConfig(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768)).eval()


def time_stream(stream: Iterator[torch.Tensor]) -> tuple[float, float, list[torch.Tensor]]:
    """(seconds to first token, seconds in all, the tokens) of one generation."""
    t0 = time.perf_counter()
    first, tokens = None, []
    for tok in stream:
        tokens.append(tok)
        if first is None:
            first = time.perf_counter() - t0
    return first or 0.0, time.perf_counter() - t0, tokens


def ours(model: GPT, idx: torch.Tensor, cached: bool, settings: SamplingSettings) -> Callable:
    def run(n: int):
        gen = make_generator(0)
        first, total, toks = time_stream(stream_tokens(model, idx, n, settings, generator=gen, cached=cached))
        return first, total, torch.stack(toks, dim=1)
    return run


def hf_runner(model: GPT, idx: torch.Tensor) -> Callable | None:
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
        from transformers.generation.streamers import BaseStreamer
    except ImportError:
        return None
    from model.hf_gpt2 import hf_config, state_to_hf

    class FirstToken(BaseStreamer):
        def __init__(self):
            self.calls, self.first = 0, None

        def put(self, value):
            self.calls += 1
            if self.calls == 2:  # the first call carries the prompt
                self.first = time.perf_counter()

        def end(self):
            pass

    class _Tok:
        eot_id = None

    cfg = hf_config(model.config, _Tok())
    cfg.update(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    hf = GPT2LMHeadModel(GPT2Config(**cfg)).eval()
    hf.load_state_dict(state_to_hf(model), strict=False)
    mask = torch.ones_like(idx)

    def run(n: int):
        streamer = FirstToken()
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = hf.generate(idx, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                              pad_token_id=0, eos_token_id=None, streamer=streamer)
        total = time.perf_counter() - t0
        return (streamer.first or t0) - t0, total, out[:, idx.size(1):]
    return run


@torch.inference_mode()
def matvec_floor(model: GPT, batch_size: int, reps: int = 20) -> tuple[float, float]:
    """(seconds, bytes) of one pass over every Linear of the model on a one-token input: the weight reads that any
    batch-1 decode step must pay, with none of the rest (attention, norms, Python). Decode cannot beat this.
    Best of `reps`; measured once per round, as the machine's memory bandwidth drifts."""
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = [torch.randn(batch_size, 1, m.in_features) for m in layers]
    nbytes = sum(p.numel() * p.element_size() for m in layers for p in m.parameters())
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for m, x in zip(layers, inputs):
            m(x)
        best = min(best, time.perf_counter() - t0)
    return best, nbytes


def main() -> int:
    args = build_parser().parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if min(args.new_tokens) < 2 or args.prompt_tokens < 1 or args.batch_size < 1 or args.rounds < 1:
        raise ValueError("--new-tokens must be >= 2, --prompt-tokens, --batch-size and --rounds >= 1")
    torch.manual_seed(args.seed)
    model = gpt2_small()
    idx = torch.randint(0, model.config.vocab_size, (args.batch_size, args.prompt_tokens))
    greedy = SamplingSettings(temperature=0.0)
    print(f"GPT-2 124M shape, random init, fp32, batch {args.batch_size}, {args.prompt_tokens}-token prompt, "
          f"{torch.get_num_threads()} CPU threads, torch {torch.__version__}")
    print(f"{'decoder':<38}{'new':>5}{'tok/s':>9}{'TTFT ms':>10}{'ms/token':>10}  same tokens")
    rows: list[tuple[str, Callable]] = [(OURS_ROW, ours(model, idx, True, greedy))]
    if not args.skip_sampling:
        rows.append(("attngpt cached, T 0.8 top-k 200", ours(model, idx, True, SamplingSettings(0.8, 200))))
        rows.append(("attngpt cached, top-p 0.9", ours(model, idx, True, SamplingSettings(1.0, 0, 0.9))))
    if not args.skip_recompute:
        rows.append(("attngpt full recompute, greedy", ours(model, idx, False, greedy)))
    hf = None if args.skip_hf else hf_runner(model, idx)
    if hf is not None:
        rows.append((HF_ROW, hf))
    for _, run in rows:
        run(8)  # warm-up: the first call pays one-off allocations and lazy initialisation
    ratios, floors = [], []
    for n in args.new_tokens:
        # rounds alternate the decoders so that a slow spell of this shared machine hits all of them alike
        results: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in rows}
        same: dict[str, str] = {}
        reference = None
        for _ in range(args.rounds):
            floors.append(matvec_floor(model, args.batch_size))
            for name, run in rows:
                first, total, toks = run(n)
                results[name].append((first, total))
                if "greedy" in name:
                    reference = toks if reference is None else reference
                    if same.get(name) != "NO":
                        same[name] = "yes" if torch.equal(toks, reference) else "NO"
        per_token = {}
        for name, _ in rows:
            first = statistics.median(f for f, _ in results[name])
            total = statistics.median(t for _, t in results[name])
            per_token[name] = total / n
            steady = statistics.median((t - f) / max(n - 1, 1) for f, t in results[name]) * 1000
            print(f"{name:<38}{n:>5}{n * args.batch_size / total:>9.1f}{first * 1000:>10.1f}{steady:>10.1f}  "
                  f"{same.get(name, '')}", flush=True)
        if HF_ROW in per_token:
            ratios.append(f"{per_token[HF_ROW] / per_token[OURS_ROW]:.2f}x at {n}")
    seconds, nbytes = statistics.median(s for s, _ in floors), floors[0][1]
    print(f"{'floor: weight reads alone':<38}{'':>5}{args.batch_size / seconds:>9.1f}{'':>10}{seconds * 1000:>10.1f}"
          f"  ({nbytes / 1e9:.2f} GB at {nbytes / seconds / 1e9:.1f} GB/s, median of {len(floors)})")
    if ratios:
        print(f"cached greedy decode / transformers generate(): {', '.join(ratios)} (tokens/s, medians of "
              f"{args.rounds} round(s))")
    return 0


if __name__ == "__main__":
    run_main(main)
