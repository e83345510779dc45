"""Where and how a run executes: device, precision, distributed process group, peak FLOP/s for MFU."""
from __future__ import annotations

import contextlib
import ctypes
import os
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

# Dense bf16 tensor-core peaks (no sparsity) from the vendors' data sheets, for MFU on CUDA.
GPU_PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "L4": 121e12, "A10": 125e12,
                 "RTX 4090": 165e12, "RTX 3090": 71e12, "V100": 125e12, "T4": 65e12}


@dataclass
class Runtime:
    device: torch.device
    dtype: torch.dtype  # autocast dtype; float32 = no autocast
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def autocast(self):
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def needs_grad_scaler(self) -> bool:
        return self.dtype == torch.float16


def pick_device(name: str, local_rank: int = 0, option: str = "train.device") -> torch.device:
    """auto = cuda, then mps, then cpu; a device that is asked for but missing is a one-line error naming `option`."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank)
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"{option}: {name} asked for, but no CUDA device is available")
    if name == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"{option}: mps asked for, but it is not available")
    if name == "cuda":
        return torch.device("cuda", local_rank)
    try:
        return torch.device(name)
    except RuntimeError:
        raise ValueError(f"{option}: {name!r} is not one of auto, cpu, cuda, cuda:N, mps") from None


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Below this width a CPU step is dominated by small element-wise work that bf16 autocast only adds casts to.
# Measured on a 2-core AMX Xeon: width 128 (configs/shakespeare_char_cpu.toml) ran 11% fewer steps in bf16; width 256
# 1.35x faster, 384 1.17x, GPT-2 small (768) 2.5x.
CPU_BF16_MIN_WIDTH = 256


def cpu_has_amx() -> bool:
    """Intel AMX tiles: bf16 matrix products at ~5x the fp32 rate (1.5 vs 0.27 TFLOP/s on 2 cores, measured)."""
    check = getattr(torch.cpu, "_is_amx_tile_supported", None)  # private in torch 2.x: absent means "don't know"
    try:
        return bool(check()) if check is not None else False
    except Exception:  # noqa: BLE001 - a failed probe only means "no AMX"
        return False


def pick_dtype(name: str, device: torch.device, width: int = 0) -> torch.dtype:
    """auto: bf16 on CUDA where supported, else fp16 (with a GradScaler). On CPU, bf16 autocast where the CPU has
    AMX and the model is at least CPU_BF16_MIN_WIDTH wide (`width` = n_embd); fp32 otherwise, because without AMX
    torch's bf16 products measured slower than fp32 (163 vs 286 GFLOP/s on an earlier reading of this machine)."""
    if name == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        if device.type == "cpu" and width >= CPU_BF16_MIN_WIDTH and cpu_has_amx():
            return torch.bfloat16
        return torch.float32
    dtype = DTYPES[name]
    if dtype == torch.float16 and device.type == "cpu":
        raise ValueError("train.dtype: float16 autocast is not supported on CPU; use bfloat16 or float32")
    return dtype


def keep_freed_memory() -> bool:
    """Ask glibc to keep freed blocks for reuse instead of handing them back to the kernel.

    By default big buffers (activations, logits, gradients) are mmap-ed and unmapped on every free, so each step
    faults in hundreds of MB of fresh zeroed pages: about a fifth of a CPU training step at GPT-2 small size.
    With mmap off and trimming off, the heap settles at the step's peak and is reused. Linux/glibc only.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold, m_mmap_max = -1, -3, -4
    mode = os.environ.get("ATTNGPT_MALLOC", "heap")
    if mode == "heap":
        return bool(libc.mallopt(m_mmap_max, 0)) and bool(libc.mallopt(m_trim_threshold, 2 ** 31 - 1))
    if mode == "threshold":
        return bool(libc.mallopt(m_mmap_threshold, 32 * 2 ** 20)) and bool(libc.mallopt(m_trim_threshold, 2 ** 31 - 1))
    return False


def setup(device_name: str, dtype_name: str, width: int = 0) -> Runtime:
    """Join the torchrun process group if there is one (NCCL on CUDA, gloo otherwise). `width` (the model's n_embd)
    steers dtype auto on CPU."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    device = pick_device(device_name, local_rank)
    if device.type == "cpu":
        keep_freed_memory()
    if world_size > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend=backend)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    dtype = pick_dtype(dtype_name, device, width)
    if world_size > 1 and dtype_name == "auto":  # machines may differ (AMX or not): all ranks take rank 0's choice
        box = [str(dtype).removeprefix("torch.")]
        dist.broadcast_object_list(box, src=0)
        dtype = DTYPES[box[0]]
    return Runtime(device=device, dtype=dtype, rank=rank, local_rank=local_rank, world_size=world_size)


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def peak_flops(device: torch.device, dtype: torch.dtype) -> tuple[float, str]:
    """Peak FLOP/s assumed for MFU, and where the figure came from."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, flops in GPU_PEAK_BF16.items():
            if key in name:
                scale = 1.0 if dtype in (torch.bfloat16, torch.float16) else 0.5  # TF32 runs at about half rate
                return flops * scale, f"{name} data sheet"
        return 0.0, f"unknown GPU {name}"
    name = "bf16" if dtype == torch.bfloat16 else "fp32"
    return measure_matmul_flops(device, dtype=dtype), f"measured {name} matmul on this CPU"


def measure_matmul_flops(device: torch.device, n: int = 1024, reps: int = 4,
                         dtype: torch.dtype = torch.float32) -> float:
    """A quick matrix-product throughput reading in the dtype the products run in: the practical ceiling on a CPU
    (on CUDA, where kernels run asynchronously, the clock waits for them)."""
    dtype = dtype if dtype in (torch.bfloat16, torch.float16) else torch.float32
    gen = torch.Generator(device=device).manual_seed(0)  # a private generator: the run's RNG stream stays untouched
    a, b = (torch.randn(n, n, device=device, generator=gen).to(dtype) for _ in range(2))
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    a @ b
    sync()
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync()
    return 2 * n ** 3 * reps / (time.perf_counter() - start)
