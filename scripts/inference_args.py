"""Options shared by the scripts that run a trained model (sample, evaluate, serve, bench_decode): checkpoint,
device, dtype, CPU threads, quantization."""
from __future__ import annotations

import argparse

import torch

from train import runtime
from train.runtime import DTYPES

from model.checkpoint import Checkpoint, load_any
from model.param_error import ParamError
from model.quantize import QUANTIZE_CHOICES, check_quantize, quantize_model


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Every option shows its default; the description keeps its line breaks."""


def add_model_options(parser: argparse.ArgumentParser, many: bool = False) -> None:
    what = ("checkpoint folder or run folder (best/, else latest/), an HF GPT-2, Llama or attngpt folder, "
            "a nanoGPT ckpt.pt, or a hub name gpt2|gpt2-medium|gpt2-large|gpt2-xl (online only)")
    if many:
        parser.add_argument("--ckpt", action="append", required=True, help=what + "; repeat to compare")
    else:
        parser.add_argument("--ckpt", required=True, help=what)
    parser.add_argument("--device", default="auto", help="auto (cuda, mps, cpu) | cpu | cuda | cuda:N | mps")
    parser.add_argument("--dtype", default="auto", choices=["auto", *DTYPES],
                        help="weights and cache dtype; auto = bfloat16 on a CUDA GPU with native bf16 (float16 on "
                             "older ones), float32 on CPU and elsewhere (train/runtime.py, pick_dtype)")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch CPU threads; 0 = torch's default (one per core). Where other work keeps some "
                             "cores busy, fewer threads than free cores avoids stalls (model/linear.py)")
    add_quantize_option(parser)


def add_quantize_option(parser: argparse.ArgumentParser) -> None:
    # checked by check_quantize rather than argparse's choices, so a bad value costs one line like every other error
    parser.add_argument("--quantize", default="none", metavar="{" + ",".join(QUANTIZE_CHOICES) + "}",
                        help="int8: int8 weights with one scale per output channel for every Linear, applied at "
                             "load (model/quantize.py); the checkpoint on disk stays as it is")


def pick_device(name: str) -> torch.device:
    return runtime.pick_device(name, option="--device")


def placement(device_name: str, dtype_name: str) -> tuple[torch.device, torch.dtype]:
    """The device and the weights' dtype of --device and --dtype, by the trainer's own functions (one auto rule;
    the weights are cast, not autocast)."""
    device = pick_device(device_name)
    return device, runtime.pick_dtype(dtype_name, device, autocast=False, option="--dtype")


def set_threads(threads: int) -> None:
    """torch's CPU thread count from a --threads value: 0 leaves torch's default, a negative one is refused."""
    if threads < 0:
        raise ParamError("threads", f"{threads} must be >= 0 (0 = torch's default)")
    if threads:
        torch.set_num_threads(threads)


def load_model(spec: str, device_name: str, dtype_name: str, quantize: str = "none", threads: int = 0
               ) -> Checkpoint:
    """Load any supported checkpoint on the chosen device, cast to the chosen dtype, quantized as asked, in eval
    mode, with `threads` CPU threads (0: torch's default). A quantization the device or dtype cannot run is refused
    before anything is read."""
    set_threads(threads)
    device, dtype = placement(device_name, dtype_name)
    check_quantize(quantize, device, dtype)
    ckpt = load_any(spec, device)
    ckpt.model.to(dtype=dtype).eval()
    quantize_model(ckpt.model, quantize)
    return ckpt
