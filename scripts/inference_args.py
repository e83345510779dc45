"""Options shared by the scripts that run a trained model (sample, evaluate, serve, bench_decode): checkpoint,
device, dtype, CPU threads, quantization."""
from __future__ import annotations

import argparse
import os
import sys

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
    parser.add_argument("--threads", type=threads_value, default="auto",
                        help="torch CPU threads: auto = torch's default (one per core) less the cores other "
                             "processes keep busy at start, since a product split over a busy core waits for it "
                             "(model/linear.py); 0 = torch's default; N = N")
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


def threads_value(text: str) -> int | str:
    """A --threads value as typed: "auto" or a whole number (checked by set_threads)."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither auto nor a whole number") from None


def auto_threads(default: int, usable: int, busy: float | None) -> int:
    """The thread count `--threads auto` picks: torch's `default`, less the cores of the `usable` ones that other
    processes keep `busy` (a core counts once it is half busy), and at least one. A product split evenly over the
    threads waits for the slowest: with one of 2 cores busy, one GPT-2 124M decode pass took 115-141 ms on 2 threads
    and 66-70 ms on 1 (README, "Decoding")."""
    if busy is None:
        return default
    return max(1, min(default, round(usable - busy + 1e-9)))


def set_threads(threads: int | str) -> None:
    """torch's CPU thread count from a --threads value: "auto" (`auto_threads`, measured over 0.1 s; a terminal is
    told when it takes fewer than torch's default, a pipe is not, so that stderr carries only errors there), 0
    leaves torch's default, a negative one is refused."""
    if threads == "auto":
        default, busy = torch.get_num_threads(), runtime.cores_busy_elsewhere()
        usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else default
        threads = auto_threads(default, usable, busy)
        if threads >= default:
            return
        if sys.stderr.isatty():
            print(f"threads: {threads} of torch's {default}, as other processes keep {busy:.1f} cores busy "
                  f"(--threads N to choose)", file=sys.stderr)
    if threads < 0:
        raise ParamError("threads", f"{threads} must be >= 0 (0 = torch's default)")
    if threads:
        torch.set_num_threads(threads)


def load_model(spec: str, device_name: str, dtype_name: str, quantize: str = "none", threads: int | str = 0
               ) -> Checkpoint:
    """Load any supported checkpoint on the chosen device, cast to the chosen dtype, quantized as asked, in eval
    mode, with `threads` CPU threads (a --threads value; 0: torch's default). A quantization the device or dtype
    cannot run is refused before anything is read."""
    device, dtype = placement(device_name, dtype_name)
    if device.type == "cpu" or threads != "auto":  # a GPU's run does not wait on the CPU's threads
        set_threads(threads)
    check_quantize(quantize, device, dtype)
    ckpt = load_any(spec, device)
    ckpt.model.to(dtype=dtype).eval()
    quantize_model(ckpt.model, quantize)
    return ckpt
