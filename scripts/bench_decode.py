"""Decoding speed at GPT-2 124M shape (random init): our KV-cached decode in fp32 and int8, our full recompute,
transformers' generate().

  python -m scripts.bench_decode                       # batch 1, 16-token prompt, 200 and 400 new tokens
  python -m scripts.bench_decode --new-tokens 100 --skip-recompute --threads 1
  python -m scripts.bench_decode --ckpt checkpoints/quickstart --new-tokens 50 --skip-hf   # a trained model

All decoders get the same weights (ours exported to GPT2LMHeadModel) and decode greedily, so they do the same work
and must produce the same tokens (checked and printed). tokens/s counts new tokens over the whole call, time to first
token included; ms/token is the steady per-step time after the first token. An extra row shows the cost of sampling
(temperature 0.8, top-k 200; top-p 0.9) on top of the cached decode. The "floor" row times the model's Linear layers
alone on a one-token input: the weight reads every batch-1 step pays, i.e. the memory-bandwidth bound; the int8
floor row does the same for the int8 model (`--quantize int8`, model/quantize.py), whose greedy tokens are compared
with the fp32 ones position by position instead (they may differ). transformers is optional: without it its rows
are skipped.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from typing import Callable, Iterator

import torch
from tqdm import tqdm
from torch import nn

from model.config import ModelConfig
from model.gpt import GPT
from model.inference import SamplingSettings, make_generator, stream_tokens
from model.quantize import Int8Linear, check_quantize, import_torchao, quantize_model
from scripts.cli import flag_errors, run_main
from scripts.inference_args import HelpFormatter, load_model, pick_device, set_threads


OURS_ROW = "attngpt cached, greedy"
INT8_ROW = "attngpt cached, int8, greedy"
HF_ROW = "transformers generate(), greedy"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m scripts.bench_decode", description=__doc__,
                                formatter_class=HelpFormatter)
    p.add_argument("--new-tokens", type=int, nargs="+", default=[200, 400], help="generation lengths to time")
    p.add_argument("--ckpt", default=None, help="time this checkpoint instead of a random GPT-2 124M (any --ckpt "
                   "that sample takes; transformers' row only where it exports to GPT2LMHeadModel)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N (timers read after a device sync)")
    p.add_argument("--skip-int8", action="store_true", help="leave out the int8 rows")
    p.add_argument("--int8-kernels", action="store_true", help="instead of decoding, time one pass over the "
                   "model's Linear layers on one token with each candidate int8 kernel against fp32, and stop")
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


def clock(device: torch.device) -> float:
    """perf_counter once the device has finished its queued work: CUDA kernels run asynchronously, so without the
    sync a timer would stop while the GPU is still busy."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def time_stream(stream: Iterator[torch.Tensor], device: torch.device) -> tuple[float, float, list[torch.Tensor]]:
    """(seconds to first token, seconds in all, the tokens) of one generation."""
    t0 = clock(device)
    first, tokens = None, []
    for tok in stream:
        tokens.append(tok)
        if first is None:
            first = clock(device) - t0
    return first or 0.0, clock(device) - t0, tokens


def ours(model: GPT, idx: torch.Tensor, cached: bool, settings: SamplingSettings) -> Callable:
    def run(n: int):
        gen = make_generator(0, idx.device)  # sampling draws on the model's device: a CPU generator would not do
        first, total, toks = time_stream(stream_tokens(model, idx, n, settings, generator=gen, cached=cached),
                                         idx.device)
        return first, total, torch.stack(toks, dim=1)
    return run


def hf_runner(model: GPT, idx: torch.Tensor) -> Callable | None:
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
        from transformers.generation.streamers import BaseStreamer
    except ImportError:
        return None
    from model.hf_gpt2 import hf_config, problems, state_to_hf

    if problems(model.config):  # only a GPT-2-shaped checkpoint has a transformers twin to race
        return None

    class FirstToken(BaseStreamer):
        def __init__(self):
            self.calls, self.first = 0, None

        def put(self, value):
            self.calls += 1
            if self.calls == 2:  # the first call carries the prompt
                self.first = clock(value.device)

        def end(self):
            pass

    class _Tok:
        eot_id = None

    cfg = hf_config(model.config, _Tok())
    cfg.update(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    hf = GPT2LMHeadModel(GPT2Config(**cfg)).eval()
    hf.load_state_dict(state_to_hf(model), strict=False)
    hf.to(idx.device)
    mask = torch.ones_like(idx)

    def run(n: int):
        streamer = FirstToken()
        t0 = clock(idx.device)
        with torch.inference_mode():
            out = hf.generate(idx, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                              pad_token_id=0, eos_token_id=None, streamer=streamer)
        total = clock(idx.device) - t0
        return (streamer.first or t0) - t0, total, out[:, idx.size(1):]
    return run


def weight_bytes(layer: nn.Module) -> int:
    return getattr(layer, "weight_bytes", 0) or sum(p.numel() * p.element_size() for p in layer.parameters())


@torch.inference_mode()
def matvec_floor(model: GPT, batch_size: int, reps: int = 20) -> tuple[float, float, int]:
    """(mean seconds, best seconds, bytes) of one pass over every Linear of the model (fp32 or int8) on a one-token
    input: the weight reads that any batch-1 decode step must pay, with none of the rest (attention, norms,
    Python). Decode cannot beat this. The ratio to decode uses the mean, the statistic the decode rows have (their
    ms/token is a mean over the generation): on this shared machine the best of 20 passes runs 10-25% under their
    mean, luck a whole generation never gets. Measured once per round, beside the decoders, as the memory
    bandwidth drifts."""
    layers = [m for m in model.modules() if isinstance(m, (nn.Linear, Int8Linear))]
    device, dtype = model.wte.weight.device, model.wte.weight.dtype
    inputs = [torch.randn(batch_size, 1, m.in_features, device=device, dtype=dtype) for m in layers]
    nbytes = sum(weight_bytes(m) for m in layers)
    passes = []
    for _ in range(reps):
        t0 = clock(device)
        for m, x in zip(layers, inputs):
            m(x)
        passes.append(clock(device) - t0)
    return statistics.mean(passes), min(passes), nbytes


@torch.inference_mode()
def compare_int8_kernels(model: GPT, rounds: int) -> None:
    """The int8 kernels torch and torchao offer for a one-token product, against fp32, on the model's own Linear
    shapes and weights, alternating: why model/quantize.py runs fbgemm on CPU."""
    tq = import_torchao()
    fp32 = [m for m in model.modules() if isinstance(m, nn.Linear)]
    ao = copy.deepcopy(fp32)
    for m in ao:
        tq.quantize_(m, tq.Int8WeightOnlyConfig(set_inductor_config=False, version=2), filter_fn=lambda *_: True)
    fbgemm = [Int8Linear(m.weight.qdata, m.weight.scale, m.bias) for m in ao]
    packed = [(m.weight.qdata, m.weight.scale.flatten(), m.bias) for m in ao]

    def int8pack(q, s, b):
        return lambda x: torch._weight_int8pack_mm(x, q, s) + (0 if b is None else b)

    kernels = {"fp32 Linear, oneDNN (the floor)": fp32, "fbgemm int8 (used on CPU)": fbgemm,
               "torchao Int8WeightOnlyConfig": ao, "torch._weight_int8pack_mm": [int8pack(*a) for a in packed]}
    inputs = [torch.randn(1, m.in_features) for m in fp32]
    times: dict[str, list[float]] = {name: [] for name in kernels}
    for _ in range(rounds * 5):
        for name, layers in kernels.items():
            t0 = time.perf_counter()
            for m, x in zip(layers, inputs):
                m(x)
            times[name].append(time.perf_counter() - t0)
    base = min(times["fp32 Linear, oneDNN (the floor)"])
    print(f"{'kernel, one token through every Linear':<40}{'best ms':>9}{'median ms':>11}{'vs fp32':>9}")
    for name, t in times.items():
        print(f"{name:<40}{min(t) * 1000:>9.1f}{statistics.median(t) * 1000:>11.1f}{base / min(t):>8.2f}x")


def agreement(toks: torch.Tensor, reference: torch.Tensor) -> str:
    """How far greedy tokens follow the reference: the matching prefix (after the first difference the contexts
    differ, so later matches mean less) and the share of equal positions."""
    same = (toks == reference).all(dim=0)
    prefix = int(same.long().cumprod(0).sum())
    return f"{prefix}/{same.numel()} prefix, {same.float().mean().item():.0%} equal"


@flag_errors(build_parser)
def main() -> int:
    args = build_parser().parse_args()
    set_threads(args.threads)
    if min(args.new_tokens) < 2 or args.prompt_tokens < 1 or args.batch_size < 1 or args.rounds < 1:
        raise ValueError("--new-tokens must be >= 2, --prompt-tokens, --batch-size and --rounds >= 1")
    torch.manual_seed(args.seed)
    device = pick_device(args.device)
    if not args.skip_int8:
        check_quantize("int8", device, torch.float32)
    if args.ckpt:
        model, what = load_model(args.ckpt, args.device, "float32").model, args.ckpt
    else:
        model, what = gpt2_small().to(device), "GPT-2 124M shape, random init"
    if args.int8_kernels:
        compare_int8_kernels(model, args.rounds)
        return 0
    if args.prompt_tokens + max(args.new_tokens) > model.config.block_size:
        raise ValueError(f"--prompt-tokens + --new-tokens exceeds the model's block_size {model.config.block_size}")
    idx = torch.randint(0, model.config.vocab_size, (args.batch_size, args.prompt_tokens), device=device)
    greedy = SamplingSettings(temperature=0.0)
    qmodel = None if args.skip_int8 else quantize_model(copy.deepcopy(model), "int8")
    print(f"{what}, fp32, batch {args.batch_size}, {args.prompt_tokens}-token prompt, {device}, "
          f"{torch.get_num_threads()} CPU threads, torch {torch.__version__}")
    print(f"{'decoder':<38}{'new':>5}{'tok/s':>9}{'TTFT ms':>10}{'ms/token':>10}  same tokens")
    rows: list[tuple[str, Callable]] = [(OURS_ROW, ours(model, idx, True, greedy))]
    if qmodel is not None:
        rows.append((INT8_ROW, ours(qmodel, idx, True, greedy)))
    if not args.skip_sampling:
        rows.append(("attngpt cached, T 0.8 top-k 200", ours(model, idx, True, SamplingSettings(0.8, 200))))
        rows.append(("attngpt cached, top-p 0.9", ours(model, idx, True, SamplingSettings(1.0, 0, 0.9))))
    if not args.skip_recompute:
        rows.append(("attngpt full recompute, greedy", ours(model, idx, False, greedy)))
    hf = None if args.skip_hf else hf_runner(model, idx)  # None without transformers or where it cannot export
    if hf is not None:
        rows.append((HF_ROW, hf))
    for _, run in rows:
        run(8)  # warm-up: the first call pays one-off allocations and lazy initialisation
    ratios, floors, int8_floors, vs_floor, vs_fp32 = [], [], [], [], []
    bar = tqdm(total=len(args.new_tokens) * args.rounds * len(rows), desc="bench_decode", unit="run",
               file=sys.stderr, leave=False)
    for n in args.new_tokens:
        # rounds alternate the decoders so that a slow spell of this shared machine hits all of them alike
        results: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in rows}
        same: dict[str, str] = {}
        reference = None
        for _ in range(args.rounds):
            floors.append(matvec_floor(model, args.batch_size))
            if qmodel is not None:
                int8_floors.append(matvec_floor(qmodel, args.batch_size))
            for name, run in rows:
                first, total, toks = run(n)
                bar.update(1)
                results[name].append((first, total))
                if name == INT8_ROW:
                    same[name] = agreement(toks, reference)
                elif "greedy" in name:
                    reference = toks if reference is None else reference
                    if same.get(name) != "NO":
                        same[name] = "yes" if torch.equal(toks, reference) else "NO"
        per_token, steady = {}, {}
        for name, _ in rows:
            first = statistics.median(f for f, _ in results[name])
            total = statistics.median(t for _, t in results[name])
            per_token[name] = total / n
            steady[name] = statistics.median((t - f) / max(n - 1, 1) for f, t in results[name])
            # through the bar, which clears its line first: a plain print would land after the bar on a terminal
            tqdm.write(f"{name:<38}{n:>5}{n * args.batch_size / total:>9.1f}{first * 1000:>10.1f}"
                       f"{steady[name] * 1000:>10.1f}  {same.get(name, '')}", file=sys.stdout)
        if HF_ROW in per_token:
            ratios.append(f"{per_token[HF_ROW] / per_token[OURS_ROW]:.2f}x at {n}")
        floor_now = statistics.median(s for s, _, _ in floors[-args.rounds:])
        vs_floor.append(f"{floor_now / steady[OURS_ROW]:.2f}x at {n}")
        if INT8_ROW in steady:
            int8_floor_now = statistics.median(s for s, _, _ in int8_floors[-args.rounds:])
            vs_floor[-1] += f" (int8 {int8_floor_now / steady[INT8_ROW]:.2f}x)"
            vs_fp32.append(f"{steady[OURS_ROW] / steady[INT8_ROW]:.2f}x at {n} (tokens/s "
                           f"{per_token[OURS_ROW] / per_token[INT8_ROW]:.2f}x)")
    bar.close()
    for label, measured in (("floor: weight reads alone", floors), ("int8 floor: int8 weight reads", int8_floors)):
        if measured:
            seconds, best, nbytes = (statistics.median(s for s, _, _ in measured),
                                     statistics.median(b for _, b, _ in measured), measured[0][2])
            print(f"{label:<38}{'':>5}{args.batch_size / seconds:>9.1f}{'':>10}{seconds * 1000:>10.1f}"
                  f"  ({nbytes / 1e9:.2f} GB at {nbytes / seconds / 1e9:.1f} GB/s; best pass {best * 1000:.1f} ms;"
                  f" medians of {len(measured)} rounds)")
    print(f"cached decode speed / its floor's (steady ms per token / mean pass): {', '.join(vs_floor)}")
    if vs_fp32:
        print(f"int8 cached decode / fp32 cached decode (steady ms per token): {', '.join(vs_fp32)}")
    if ratios:
        print(f"cached greedy decode / transformers generate(): {', '.join(ratios)} (tokens/s, medians of "
              f"{args.rounds} round(s))")
    return 0


if __name__ == "__main__":
    run_main(main)
