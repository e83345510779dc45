"""Options shared by the scripts that run a trained model (sample, evaluate, attention, bench_decode): checkpoint,
device, dtype, quantization."""
from __future__ import annotations

import argparse

import torch

from train.runtime import DTYPES
from train.runtime import pick_device as runtime_pick_device

from model.checkpoint import Checkpoint, load_any
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
                        help="weights and cache dtype; auto = bfloat16 on CUDA, float32 elsewhere")
    add_quantize_option(parser)


def add_quantize_option(parser: argparse.ArgumentParser) -> None:
    # checked by check_quantize rather than argparse's choices, so a bad value costs one line like every other error
    parser.add_argument("--quantize", default="none", metavar="{" + ",".join(QUANTIZE_CHOICES) + "}",
                        help="int8: int8 weights with one scale per output channel for every Linear, applied at "
                             "load (model/quantize.py); the checkpoint on disk stays as it is")


def pick_device(name: str) -> torch.device:
    return runtime_pick_device(name, option="--device")


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    return DTYPES[name]


def load_model(spec: str, device_name: str, dtype_name: str, quantize: str = "none") -> Checkpoint:
    """Load any supported checkpoint on the chosen device, cast to the chosen dtype, quantized as asked, in eval
    mode. A quantization the device or dtype cannot run is refused before anything is read."""
    device = pick_device(device_name)
    dtype = pick_dtype(dtype_name, device)
    check_quantize(quantize, device, dtype)
    ckpt = load_any(spec, device)
    ckpt.model.to(dtype=dtype).eval()
    quantize_model(ckpt.model, quantize)
    return ckpt
