"""Serve a checkpoint over HTTP: an OpenAI-compatible completions API with continuous batching, and a live page.

  python -m scripts.serve --ckpt checkpoints/quickstart                  # http://127.0.0.1:8000/
  python -m scripts.serve --ckpt gpt2 --host 0.0.0.0 --api-key "$KEY"    # beyond loopback a key is required

Endpoints: GET /health, GET /v1/models, POST /v1/completions (OpenAI's shapes; stream, n, stop, seed, logprobs,
plus top_k and repetition_penalty), GET / (the page). Ctrl-C or SIGTERM stops cleanly: streams still running end
with finish_reason "abort".
"""
from __future__ import annotations

import argparse
import ipaddress
import signal
import sys
from pathlib import Path

from model.inference import MAX_NEW_TOKENS
from scripts.cli import flag_errors, run_main
from scripts.inference_args import HelpFormatter, add_model_options, load_model
from serve.app import create_app
from serve.engine import Engine
from serve.server import Server, bind

LOOPBACK_NAMES = {"localhost"}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m scripts.serve", description=__doc__, formatter_class=HelpFormatter)
    add_model_options(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind; beyond loopback --api-key is required")
    p.add_argument("--port", type=int, default=8000, help="TCP port (0 = any free one)")
    p.add_argument("--max-batch", type=int, default=8, help="requests decoded together; more wait in a queue")
    p.add_argument("--max-tokens", type=int, default=2048, help="the most new tokens one request may ask for")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1/ and /api/")
    p.add_argument("--model-name", default=None, help="the model id clients see (default: from --ckpt)")
    return p


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def validate(args: argparse.Namespace) -> None:
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port: {args.port} must lie in [0, 65535]")
    if args.max_batch < 1:
        raise ValueError(f"--max-batch: {args.max_batch} must be >= 1")
    if not 1 <= args.max_tokens <= MAX_NEW_TOKENS:
        raise ValueError(f"--max-tokens: {args.max_tokens} must lie in [1, {MAX_NEW_TOKENS}]")
    if args.api_key is not None and not args.api_key.strip():
        raise ValueError("--api-key: empty")
    if not is_loopback(args.host) and not args.api_key:
        raise ValueError(f"--host {args.host} is reachable beyond this machine: give --api-key")


def model_name(spec: str) -> str:
    path = Path(spec.rstrip("/"))
    return path.stem if path.suffix == ".pt" else path.name or spec


@flag_errors(build_parser)
def main() -> int:
    args = build_parser().parse_args()
    validate(args)
    sock = bind(args.host, args.port)  # before loading: a port in use costs one line, not a model load
    ckpt = load_model(args.ckpt, args.device, args.dtype, args.quantize, args.threads)
    engine = Engine(ckpt.model, ckpt.tokenizer, max_batch=args.max_batch)
    name = args.model_name or model_name(args.ckpt)
    app = create_app(engine, name, api_key=args.api_key, max_tokens=args.max_tokens)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    print(f"serving {name} on http://{shown}:{port}/ (max batch {args.max_batch})", file=sys.stderr, flush=True)
    for sig in (signal.SIGINT, signal.SIGTERM):
        # uvicorn handles these while it runs, then re-raises the one it caught to these handlers: a no-op, so the
        # stop stays a clean exit 0 instead of a KeyboardInterrupt or a death by SIGTERM
        signal.signal(sig, lambda *_: None)
    Server(app, engine).run(sockets=[sock])
    engine.shutdown()
    print("stopped", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    run_main(main)
