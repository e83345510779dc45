"""Serving throughput and latency: 1 client, N clients at once, N requests one after another, side by side.

  python -m scripts.bench_serve                          # GPT-2 124M shape, random init, 8 clients, 128 new tokens
  python -m scripts.bench_serve --rounds 3 --threads 2

The real server (engine + FastAPI + uvicorn) runs in this process on 127.0.0.1; the clients stream completions
over HTTP (server-sent events) from threads of a second process, so they do not compete with the server for its
interpreter lock. Every request asks for --new-tokens tokens, greedy, with end-of-text
ignored by the random model only by chance (each request's count is checked). Per request: time to first token
(TTFT, from sending to the first streamed token) and its own tokens/s (tokens / its duration). Per arm: aggregate
tokens/s (all new tokens / the arm's wall time). Rounds alternate the arms, so a slow spell of this shared machine
hits them all alike; percentiles pool every request of every round. By default every client sends the same prompt,
which the engine prefills once for all of them (equal contexts share a cache row); `--distinct-prompts` gives each
client its own prompt of the same length, so the 8-client prefill has to run all 8.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import statistics
import threading
import time
from concurrent.futures import ProcessPoolExecutor

import httpx
import torch

from data.tokenizers import gpt2_tokenizer
from model.config import ModelConfig
from model.gpt import GPT
from model.kv_cache import RowKVCache
from model.linear import use_onednn
from scripts.bench_decode import gpt2_small
from scripts.cli import flag_errors, run_main
from scripts.inference_args import HelpFormatter, set_threads
from serve.app import create_app
from serve.engine import Engine
from serve.server import serve_in_thread

PROMPT = ("The quick brown fox jumps over the lazy dog, and then it runs far away into the deep green forest "
          "where nobody can find it again.")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m scripts.bench_serve", description=__doc__,
                                formatter_class=HelpFormatter)
    p.add_argument("--clients", type=int, default=8, help="concurrent clients (and sequential requests)")
    p.add_argument("--new-tokens", type=int, default=128, help="new tokens per request")
    p.add_argument("--prompt-tokens", type=int, default=16, help="prompt length in GPT-2 tokens")
    p.add_argument("--max-batch", type=int, default=8, help="the server's --max-batch")
    p.add_argument("--rounds", type=int, default=2, help="times every arm runs, alternating")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads; 0 = torch's default")
    p.add_argument("--distinct-prompts", action="store_true", help="a different prompt for each client (the same "
                   "length), so that no prefill can be shared")
    p.add_argument("--tiny", action="store_true", help="a 2-layer 64-wide model instead of GPT-2 124M (a smoke test)")
    return p


def one_request(http: httpx.Client, url: str, prompt: str, n: int) -> dict:
    """Stream one completion; returns ttft, seconds, tokens."""
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first, tokens = None, 0
    with http.stream("POST", url + "/v1/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"] and first is None:
                first = time.perf_counter() - t0
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    total = time.perf_counter() - t0
    return {"ttft": first if first is not None else total, "seconds": total, "tokens": tokens}


def run_arm(url: str, prompts: list[str], n: int, clients: int, concurrent: bool) -> tuple[float, list[dict]]:
    """(wall seconds, per-request results) of `clients` requests (client i sends prompts[i % len(prompts)]), all at
    once or one after another. The HTTP clients and their connections exist before the clock starts (an
    httpx.Client takes tens of ms to build)."""
    https = [httpx.Client(timeout=600) for _ in range(clients)]
    for http in https:
        http.get(url + "/health").raise_for_status()  # open the keep-alive connection
    results: list[dict] = []
    start = threading.Barrier(clients + 1)

    def client(http: httpx.Client, prompt: str) -> None:
        start.wait()
        results.append(one_request(http, url, prompt, n))

    try:
        if concurrent:
            threads = [threading.Thread(target=client, args=(http, prompts[i % len(prompts)]))
                       for i, http in enumerate(https)]
            for t in threads:
                t.start()
            start.wait()
            t0 = time.perf_counter()
            for t in threads:
                t.join()
        else:
            t0 = time.perf_counter()
            for i, http in enumerate(https):
                results.append(one_request(http, url, prompts[i % len(prompts)], n))
        wall = time.perf_counter() - t0
    finally:
        for http in https:
            http.close()
    if len(results) != clients:
        raise RuntimeError(f"{clients - len(results)} request(s) failed")
    return wall, results


@torch.inference_mode()
def batching_ceiling(model: GPT, rows: int, context: int, pairs: int = 6, onednn: bool = True) -> tuple[float, float]:
    """Median ms of one decode forward of the bare model (no engine, no HTTP) at batch 1 and at batch `rows`,
    `context` tokens cached, timed alternately: rows x the first / the second is the most batching can give now.
    `onednn=False`: with the Linear layers on F.linear (MKL) instead of the model's oneDNN path (model/linear.py)."""
    previous = use_onednn(onednn)
    try:
        return _ceiling(model, rows, context, pairs)
    finally:
        use_onednn(previous)


def _ceiling(model: GPT, rows: int, context: int, pairs: int) -> tuple[float, float]:
    caches = {}
    for b in (1, rows):
        caches[b] = RowKVCache(model.config, b, max_len=context + 2)
        caches[b].live = b
    times: dict[int, list[float]] = {1: [], rows: []}
    for _ in range(pairs):
        for b, cache in caches.items():
            cache.lengths[:] = context
            tokens = torch.zeros(b, 1, dtype=torch.long)
            t0 = time.perf_counter()
            model(tokens, cache=cache)
            times[b].append(time.perf_counter() - t0)
    return statistics.median(times[1]) * 1000, statistics.median(times[rows]) * 1000


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100])."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))]


@flag_errors(build_parser)
def main() -> int:
    args = build_parser().parse_args()
    if min(args.clients, args.new_tokens, args.prompt_tokens, args.max_batch, args.rounds) < 1:
        raise ValueError("--clients, --new-tokens, --prompt-tokens, --max-batch and --rounds must be >= 1")
    set_threads(args.threads)
    torch.manual_seed(0)
    tok = gpt2_tokenizer()
    model = (GPT(ModelConfig(vocab_size=50257, block_size=256, n_layer=2, n_head=2, n_embd=64)).eval()
             if args.tiny else gpt2_small())
    ids = (tok.encode(PROMPT) * (1 + args.prompt_tokens // 8))[:args.prompt_tokens]
    # distinct prompts: the same words, each client's starting one word further on
    prompts = [tok.decode(ids[i:] + ids[:i]) for i in range(args.clients if args.distinct_prompts else 1)]
    engine = Engine(model, tok, max_batch=args.max_batch)
    mid = len(ids) + args.new_tokens // 2  # a typical context length during the run
    server, thread, url = serve_in_thread(create_app(engine, "bench", max_tokens=args.new_tokens), engine)
    with contextlib.ExitStack() as stack:  # on the way out: stop the server, then the engine
        stack.callback(engine.shutdown)
        stack.callback(thread.join, 30)
        stack.callback(server.stop)
        clients = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        stack.callback(clients.shutdown)
        for n in (1, args.clients):  # warm-up of both batch sizes: one-off allocations, imports
            clients.submit(run_arm, url, prompts, 4, n, True).result()
        arms = [("1 client", 1, True), (f"{args.clients} clients at once", args.clients, True),
                (f"{args.clients} one after another", args.clients, False)]
        walls = {name: [] for name, _, _ in arms}
        reqs = {name: [] for name, _, _ in arms}
        ceilings, mkl_ceilings = [], []
        for _ in range(args.rounds):
            ceilings.append(batching_ceiling(model, args.clients, mid))
            mkl_ceilings.append(batching_ceiling(model, args.clients, mid, onednn=False))
            for name, n, concurrent in arms:
                wall, results = clients.submit(run_arm, url, prompts, args.new_tokens, n, concurrent).result()
                walls[name].append(wall)
                reqs[name].extend(results)
    shape = "2-layer 64-wide (--tiny)" if args.tiny else "GPT-2 124M shape"
    print(f"{shape}, random init, fp32, {len(ids)}-token prompt, {args.new_tokens} new tokens per request, greedy, "
          f"{'distinct prompts' if args.distinct_prompts else 'one prompt for all'}, max batch {args.max_batch}, "
          f"{torch.get_num_threads()} CPU threads, {args.rounds} round(s), "
          f"torch {torch.__version__}")
    print(f"{'arm':<26}{'agg tok/s':>10}{'TTFT p50 ms':>13}{'TTFT p95 ms':>13}{'req tok/s p50':>15}"
          f"{'req tok/s p95':>15}  tokens ok")
    summary = {}
    for name, clients, _ in arms:
        rs = reqs[name]
        agg = clients * args.new_tokens * args.rounds / sum(walls[name])
        ttft = [r["ttft"] * 1000 for r in rs]
        rate = [r["tokens"] / r["seconds"] for r in rs]
        ok = all(r["tokens"] == args.new_tokens for r in rs)
        # for tokens/s the slow tail is the low end: "p95" is the rate 95% of requests reach
        summary[name] = {"agg": agg, "ttft_p95": percentile(ttft, 95)}
        print(f"{name:<26}{agg:>10.1f}{percentile(ttft, 50):>13.0f}{percentile(ttft, 95):>13.0f}"
              f"{percentile(rate, 50):>15.1f}{percentile(rate, 5):>15.1f}  {'yes' if ok else 'NO'}", flush=True)
    one, many = summary["1 client"], summary[f"{args.clients} clients at once"]
    serial = summary[f"{args.clients} one after another"]
    print(f"aggregate tokens/s, {args.clients} at once / 1 client: {many['agg'] / one['agg']:.2f}x (target >= 5x)")
    # the same single stream, timed over `clients` times the requests: a steadier figure for one stream's rate
    print(f"aggregate tokens/s, {args.clients} at once / {args.clients} one after another: "
          f"{many['agg'] / serial['agg']:.2f}x")
    for label, measured in (("", ceilings), (" with F.linear (MKL) instead of oneDNN", mkl_ceilings)):
        one_ms, many_ms = (statistics.median(c[i] for c in measured) for i in (0, 1))
        print(f"bare model{label}, one decode forward at {mid} cached tokens (medians, alternating): batch 1 "
              f"{one_ms:.1f} ms, batch {args.clients} {many_ms:.1f} ms: batching can give at most "
              f"{args.clients * one_ms / many_ms:.2f}x")
    print(f"p95 TTFT, {args.clients} at once / 1 client: {many['ttft_p95'] / one['ttft_p95']:.2f}x (target <= 2x)")
    return 0


if __name__ == "__main__":
    run_main(main)
