#!/usr/bin/env bash
# One command for a CUDA machine: the GPU tests, GPT-2 124M training MFU (bf16, compiled), and the time for the
# shakespeare_char recipe to reach val loss 1.47. Prints a short table at the end.
#   bash scripts/gpu_check.sh [path/to/tinyshakespeare.txt]
set -uo pipefail
cd "$(dirname "$0")/.."
PYBIN=${PYBIN:-.venv/bin/python}
[ -x "$PYBIN" ] || PYBIN=python3
TS=${1:-data/corpora/tinyshakespeare.txt}
[ -f "$TS" ] || TS=""   # empty: download tiny-Shakespeare from its public URL
OUT=${OUT:-checkpoints/gpu_check}
mkdir -p "$OUT"
export WANDB_MODE=disabled
"$PYBIN" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.__version__, torch.cuda.get_device_name())" || exit 1

echo "== 1/3 tests marked gpu"
"$PYBIN" -m pytest -q -m gpu tests 2>&1 | tail -n 15 | tee "$OUT/gpu_tests.txt"

echo "== 2/3 GPT-2 124M: bf16 autocast + torch.compile, batch 16 x 1024"
"$PYBIN" -m scripts.bench_train --only trainer --config configs/gpt2_124m.toml --steps 20 --warmup 5 \
  --train.device cuda --train.dtype bfloat16 --train.compile true --train.batch_size 16 --train.grad_accum 1 \
  --data.dir cache/shakespeare_gpt2 2>&1 | tee "$OUT/gpt2_mfu.txt"

echo "== 3/3 shakespeare_char to val 1.47"
"$PYBIN" -m scripts.train --config configs/shakespeare_char.toml --data.path "$TS" --train.device cuda \
  --train.compile true --train.out_dir "$OUT/shakespeare_char" --train.overwrite true --log.attention false \
  --log.sample_tokens 0 2>&1 | tail -n 5
"$PYBIN" - "$OUT" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
rows = [json.loads(l) for l in (out / "shakespeare_char" / "metrics.jsonl").read_text().splitlines()]
hit = next((r for r in rows if (r.get("val/loss") or 99) <= 1.47), None)
best = min((r["val/loss"] for r in rows if r.get("val/loss") is not None), default=float("nan"))
mfu = (out / "gpt2_mfu.txt").read_text().strip().splitlines()
print("\n| check | result |\n|---|---|")
print("| gpu tests |", (out / "gpu_tests.txt").read_text().strip().splitlines()[-1], "|")
print("| gpt2_124m bf16 compiled |", next((l for l in mfu if l.startswith("trainer")), "?"), "|")
print("| shakespeare_char to val 1.47 |", f"{hit['elapsed_s']:.0f} s of training, step {hit['step']}" if hit
      else f"not reached (best {best:.3f})", "|")
PY
