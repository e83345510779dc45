"""Where and how a run executes: device, precision, distributed process group, peak FLOP/s for MFU."""
from __future__ import annotations

import contextlib
import ctypes
import datetime
import os
import sys
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

# Dense (no sparsity) bf16/fp16 tensor-core peaks from NVIDIA's data sheets, for MFU on CUDA, keyed by the exact name
# torch.cuda.get_device_name reports. Exact, because a substring would read "NVIDIA H100 PCIe" (756 TFLOP/s) or
# "NVIDIA H100 NVL" as the 989 TFLOP/s SXM part, and "NVIDIA L40" as an L4.
GPU_PEAK_BF16 = {
    "NVIDIA H100 80GB HBM3": 989.4e12,  # H100 SXM5
    "NVIDIA H100 PCIe": 756.5e12,
    "NVIDIA H100 NVL": 835.5e12,
    "NVIDIA H200": 989.4e12,  # H200 SXM
    "NVIDIA H200 NVL": 835.5e12,
    "NVIDIA A100-SXM4-40GB": 312e12,
    "NVIDIA A100-SXM4-80GB": 312e12,
    "NVIDIA A100-PCIE-40GB": 312e12,
    "NVIDIA A100 80GB PCIe": 312e12,
    "NVIDIA L4": 121e12,
    "NVIDIA L40": 181.05e12,
    "NVIDIA L40S": 362.05e12,
    "NVIDIA B200": 2250e12,
}
DIST_TIMEOUT_S = 3600.0  # default process-group timeout: rank 0 may prepare data or evaluate for a long while alone


@dataclass
class Runtime:
    device: torch.device
    dtype: torch.dtype  # autocast dtype; float32 = no autocast
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    saved_matmul_precision: str | None = None  # the fp32 matmul precision before setup, restored by teardown

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


def pick_device(name: str, local_rank: int = 0, option: str = "train.device",
                distributed: bool = False) -> torch.device:
    """auto = cuda, then mps, then cpu; a device that is asked for but missing is a one-line error naming `option`.

    `distributed` (several torchrun processes): CUDA is always cuda:LOCAL_RANK, whatever index was asked for, or all
    the processes of a node would share one GPU.
    """
    if distributed and (name.startswith("cuda") or (name == "auto" and torch.cuda.is_available())):
        if not torch.cuda.is_available():
            raise ValueError(f"{option}: {name} asked for, but no CUDA device is available")
        if local_rank >= torch.cuda.device_count():
            raise ValueError(f"{option}: LOCAL_RANK {local_rank} needs cuda:{local_rank}, but only "
                             f"{torch.cuda.device_count()} CUDA device(s) are visible")
        return torch.device("cuda", local_rank)
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
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"{option}: {name!r} is not one of auto, cpu, cuda, cuda:N, mps") from None
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise ValueError(f"{option}: {name} asked for, but only {torch.cuda.device_count()} CUDA device(s) are visible")
    return device


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


def pick_dtype(name: str, device: torch.device, width: int = 0, *, autocast: bool = True,
               option: str = "train.dtype") -> torch.dtype:
    """The dtype `name` (auto, or a DTYPES key) means on `device`, for every script: the trainer computes under
    autocast (`autocast=True`: fp32 master weights, products in this dtype), the inference scripts cast the
    weights themselves (`autocast=False`).

    auto is one rule: the fastest dtype the hardware computes natively, where it is faster.
    - CUDA: bf16 where the GPU computes it natively (Ampere and later), else fp16: an emulated bf16 runs far below
      the fp16 rate (a trainer's fp16 gets a GradScaler).
    - CPU, autocast: bf16 where the CPU has AMX and the model is at least CPU_BF16_MIN_WIDTH wide (`width` =
      n_embd), fp32 otherwise: without AMX torch's bf16 products measured slower than fp32 (163 vs 286 GFLOP/s on
      an earlier reading of this machine), and narrow models lose more to the casts than they gain.
    - CPU, weights cast (inference): fp32, always. Decoding reads every weight once per token, and oneDNN's AMX
      kernel for one-row products reads bf16 weights at 9-13 GB/s against fp32's 24-27 GB/s (README, "Decoding"):
      bf16 weights are no faster there, and they would round the model for good; int8 quantization on CPU also
      needs fp32.
    - anything else (mps): fp32.
    A dtype the device cannot use that way is a one-line error naming `option`."""
    if name == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if cuda_bf16_native() else torch.float16
        if autocast and device.type == "cpu" and width >= CPU_BF16_MIN_WIDTH and cpu_has_amx():
            return torch.bfloat16
        return torch.float32
    if name not in DTYPES:
        raise ValueError(f"{option}: {name!r} is not one of auto, {', '.join(DTYPES)}")
    dtype = DTYPES[name]
    if autocast and dtype == torch.float16 and device.type == "cpu":
        raise ValueError(f"{option}: float16 autocast is not supported on CPU; use bfloat16 or float32")
    return dtype


def cuda_bf16_native() -> bool:
    """bf16 in hardware on the current CUDA device (setup made it the run's)."""
    return torch.cuda.is_bf16_supported(including_emulation=False)


def dtype_runs_on(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether autocast in `dtype` is worth keeping on `device`: no fp16 on CPU, no emulated bf16 on CUDA."""
    if device.type == "cpu":
        return dtype != torch.float16
    if device.type == "cuda" and dtype == torch.bfloat16:
        return cuda_bf16_native()
    return True


def resumed_dtype(saved: dict | None, rt: Runtime, dtype_name: str) -> torch.dtype:
    """The dtype a resumed run computes in. Under auto it keeps the one it started with (so a resumed run repeats an
    uninterrupted one, even on a CPU where auto would answer otherwise), unless the run moved to another kind of
    device (CPU <-> CUDA, or to a GPU without native bf16): there it takes what auto picked for this device."""
    if dtype_name != "auto" or not saved:
        return rt.dtype
    dtype = DTYPES.get(saved.get("dtype", ""))
    if dtype is None or saved.get("device_type") != rt.device.type or not dtype_runs_on(dtype, rt.device):
        return rt.dtype
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


def cpu_ticks(path: str = "/proc/stat") -> dict[int, tuple[int, int]]:
    """CPU number -> (busy, all) clock ticks since boot, from /proc/stat's per-CPU lines. Busy is everything but idle
    and iowait; steal counts as busy, since a vCPU the host is running something else on is no free core either."""
    ticks = {}
    with open(path) as f:
        for line in f:
            name, *fields = line.split()
            if name.startswith("cpu") and name[3:].isdigit():
                v = [int(x) for x in fields[:8]]
                ticks[int(name[3:])] = (sum(v) - v[3] - v[4], sum(v))
    return ticks


def cores_busy_elsewhere(interval: float = 0.1, path: str = "/proc/stat") -> float | None:
    """How many of this process's usable cores other processes kept busy over the next `interval` seconds: the busy
    ticks of the CPUs in this process's affinity set, less this process's own CPU time. None where it cannot be
    read (no /proc/stat: not Linux)."""
    try:
        cpus = os.sched_getaffinity(0)
        before, own_before, t0 = cpu_ticks(path), os.times(), time.monotonic()
        time.sleep(interval)
        after, own_after, t1 = cpu_ticks(path), os.times(), time.monotonic()
    except (OSError, ValueError, AttributeError):
        return None
    busy = sum(after[c][0] - before[c][0] for c in cpus if c in before and c in after) / os.sysconf("SC_CLK_TCK")
    own = (own_after.user + own_after.system) - (own_before.user + own_before.system)
    return max(0.0, (busy - own) / max(t1 - t0, 1e-9))


def setup(device_name: str, dtype_name: str, width: int = 0, timeout_s: float = DIST_TIMEOUT_S) -> Runtime:
    """Join the torchrun process group if there is one (NCCL on CUDA, gloo otherwise), with a `timeout_s` timeout
    for every collective. `width` (the model's n_embd) steers dtype auto on CPU. On CUDA, fp32 matmuls may use TF32
    (torch.set_float32_matmul_precision("high")) until teardown puts the old precision back."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    device = pick_device(device_name, local_rank, distributed=world_size > 1)
    if world_size > 1 and device.type == "cuda" and device_name.startswith("cuda:") and rank == 0 \
            and device_name != f"cuda:{local_rank}":
        print(f"note: train.device {device_name} is ignored under torchrun: each process uses cuda:LOCAL_RANK",
              file=sys.stderr)
    if device.type == "cpu":
        keep_freed_memory()
    if device.type == "cuda":
        torch.cuda.set_device(device)  # NCCL, the allocator's statistics and new tensors default to this GPU
    if world_size > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_s))
    saved_precision = None
    if device.type == "cuda":
        saved_precision = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("high")
    dtype = pick_dtype(dtype_name, device, width)
    if world_size > 1 and dtype_name == "auto":  # machines may differ (AMX or not): all ranks take rank 0's choice
        box = [str(dtype).removeprefix("torch.")]
        dist.broadcast_object_list(box, src=0)
        dtype = DTYPES[box[0]]
    return Runtime(device=device, dtype=dtype, rank=rank, local_rank=local_rank, world_size=world_size,
                   saved_matmul_precision=saved_precision)


def teardown(rt: Runtime | None = None) -> None:
    """Leave the process group and restore what setup changed globally (the fp32 matmul precision)."""
    if rt is not None and rt.saved_matmul_precision is not None:
        torch.set_float32_matmul_precision(rt.saved_matmul_precision)
    if dist.is_initialized():
        dist.destroy_process_group()


def peak_flops(device: torch.device, dtype: torch.dtype) -> tuple[float, str]:
    """Peak FLOP/s assumed for MFU, and where the figure came from."""
    if device.type == "cuda":
        return datasheet_peak(torch.cuda.get_device_name(device), dtype)
    name = "bf16" if dtype == torch.bfloat16 else "fp32"
    return measure_matmul_flops(device, dtype=dtype), f"measured {name} matmul on this CPU"


def datasheet_peak(gpu_name: str, dtype: torch.dtype) -> tuple[float, str]:
    """The data-sheet peak of the GPU called exactly `gpu_name` (0.0 when it is not in GPU_PEAK_BF16), in `dtype`:
    fp32 matmuls run as TF32 (setup's precision "high"), at half the bf16 rate on these parts."""
    flops = GPU_PEAK_BF16.get(gpu_name.strip())
    if flops is None:
        return 0.0, f"unknown GPU {gpu_name!r}: no data-sheet peak, so no MFU"
    scale = 1.0 if dtype in (torch.bfloat16, torch.float16) else 0.5
    return flops * scale, f"{gpu_name} data sheet, dense {'bf16/fp16' if scale == 1.0 else 'tf32'}"


def measure_matmul_flops(device: torch.device, n: int = 1024, reps: int = 4,
                         dtype: torch.dtype = torch.float32, budget_s: float = 0.1) -> float:
    """A quick matrix-product throughput reading in the dtype the products run in: the practical ceiling on a CPU
    (on CUDA, where kernels run asynchronously, the clock waits for them).

    The square side grows from 128 towards `n` while the next size (8x the work) would still take under
    `budget_s` a product: a dtype the CPU has no fast kernel for costs a fraction of a second, not the 13 s that
    five bf16 products of side 1024 took on the AVX2 EPYC (about 1 GFLOP/s) at every bf16 run's start."""
    dtype = dtype if dtype in (torch.bfloat16, torch.float16) else torch.float32
    gen = torch.Generator(device=device).manual_seed(0)  # a private generator: the run's RNG stream stays untouched
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def seconds(a: torch.Tensor, b: torch.Tensor, count: int) -> float:
        sync()
        start = time.perf_counter()
        for _ in range(count):
            a @ b
        sync()
        return time.perf_counter() - start

    side = min(128, n)
    while True:
        a, b = (torch.randn(side, side, device=device, generator=gen).to(dtype) for _ in range(2))
        seconds(a, b, 1)  # warm-up: first-call allocations and kernel set-up stay out of the timing
        if side >= n or 8 * seconds(a, b, 1) > budget_s:
            break
        side = min(2 * side, n)
    return 2 * side ** 3 * reps / seconds(a, b, reps)
