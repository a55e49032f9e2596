#!/usr/bin/env bash
# Resumes the two-block study (docs/results.md, "Every rule in GPT-2's block and in the modern block"): the finished
# runs' logs kept here go back into out-compare/, where compare.py keeps them, and the two comparisons run the rest,
# side by side, one thread each. Afterwards: python docs/logs/two_blocks/table.py --collect out-compare, then without
# --collect for the table.
set -euo pipefail
cd "$(dirname "$0")/../../.."
for block in gpt2 modern; do
  for run in docs/logs/two_blocks/$block/*/; do
    [[ -d $run ]] || continue
    mkdir -p "out-compare/blocks-$block/$(basename "$run")"
    cp -n "$run"log.jsonl "$run"config.json "out-compare/blocks-$block/$(basename "$run")/"
  done
done
RULES="config/shakespeare_add.py config/shakespeare_ortho.py config/shakespeare_rot.py config/shakespeare_hc.py
  config/shakespeare_mhc.py config/shakespeare_ddl.py config/shakespeare_attnres.py config/shakespeare_denseformer.py
  config/shakespeare_add_x0.py"
ARGS="--per shakespeare_add_x0:x0_mix=nanochat --tune learning_rate=1e-3,2e-3,4e-3 --seeds=3 --nproc=1"
export OMP_NUM_THREADS=1
# shellcheck disable=SC2086
python tools/compare.py $RULES --stack=config/cpu.py $ARGS "$@" --out=out-compare/blocks-gpt2 &
# shellcheck disable=SC2086
python tools/compare.py $RULES --stack=config/modern.py --stack=config/cpu.py $ARGS "$@" --out=out-compare/blocks-modern
wait
