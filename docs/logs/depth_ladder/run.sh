#!/usr/bin/env bash
# The depth ladder (docs/results.md, "The depth ladder"): every rule at width 64 and 4, 8, 16 and 32 layers on the CPU
# recipe's data and length (2000 steps of 12 x 64 characters, so every depth sees the same tokens), seed 1, and seeds
# 1-3 at 16 layers, --dynamics on, one record a run, after the last step: the tables read the last, and the stream-map
# gains cost a few hundred steps' work at 32 layers. Resumable: the same command keeps the finished runs. Then
# python docs/logs/depth_ladder/table.py.
set -euo pipefail
cd "$(dirname "$0")/../../.."
RULES="config/shakespeare_add.py config/shakespeare_hc.py config/shakespeare_mhc.py config/shakespeare_ortho.py
  config/shakespeare_rot.py config/shakespeare_ddl.py config/shakespeare_attnres.py config/shakespeare_denseformer.py"
ARGS="--stack=config/cpu.py --n_embd=64 --dynamics=True --dynamics_interval=2000 --nproc=${NPROC:-2}"
OUT=${OUT:-out-compare/ladder}
# shellcheck disable=SC2086
python tools/compare.py $RULES $ARGS "$@" --set n_layer=4,8,16,32 --seeds=1 --out="$OUT"
# shellcheck disable=SC2086
python tools/compare.py $RULES $ARGS "$@" --set n_layer=16 --seeds=3 --out="$OUT"
# Rotation collapsed at 32 layers (seed 1, loss 3.35): seed 2 at the same rate, and seeds 1-2 at half of it. The 0.002,
# seed-1 run is the ladder's cell again (copied in on the VM that ran it, so not retrained there).
# shellcheck disable=SC2086
python tools/compare.py config/shakespeare_rot.py $ARGS "$@" --set n_layer=32 --set learning_rate=0.002,0.001 --seeds=2 \
  --out="$OUT-rot32"
