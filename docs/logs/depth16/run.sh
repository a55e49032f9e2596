#!/usr/bin/env bash
# Every rule at 16 layers, in the modern block and in GPT-2's, each rule's learning rate tuned at that depth
# (docs/results.md, "Every rule at 16 layers, rates tuned there"): width 64 on the CPU recipe's data and length (2000
# steps of 12 x 64 characters), as the depth ladder. Each cell tunes AdamW's rate on seed 1337 over 1e-3, 2e-3, 4e-3
# (compare.py extends a grid whose best lies on its edge, twice at most a side) and reports seeds 1-5 at the chosen
# one; compare.py's --compile=auto compiles a run where a probe of its model says that pays (OUT/CELL/compile.md).
# GPT-2's block runs with the ladder's dynamics record so that the ladder's seeds 1-3 at 16 layers are its runs
# where the tuned rate is the 4-layer rate the ladder ran at: they are copied in first (the current code gives
# their losses bit for bit, eager), but Attention Residuals' (its first sublayer's unused query and norm have gone
# since, so its initial draw differs). Resumable: the same command keeps the finished runs. Then
# python docs/logs/depth16/table.py.
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-out-compare/depth16}
RULES="config/shakespeare_add.py config/shakespeare_ortho.py config/shakespeare_rot.py config/shakespeare_hc.py
  config/shakespeare_mhc.py config/shakespeare_ddl.py config/shakespeare_attnres.py config/shakespeare_denseformer.py"
ARGS="--set n_layer=16 --n_embd=64 --tune learning_rate=1e-3,2e-3,4e-3 --seeds=5 --nproc=${NPROC:-2}"
# shellcheck disable=SC2086
python tools/compare.py $RULES --stack=config/modern.py --stack=config/cpu.py $ARGS "$@" --out="$OUT/modern-adamw-16"
# the ladder's 4-layer rates (config/cpu.py), spelled as the grid spells them
for rule_rate in add:2e-3 ortho:4e-3 rot:2e-3 hc:2e-3 mhc:2e-3 ddl:2e-3 denseformer:4e-3; do
  rule=${rule_rate%:*} rate=${rule_rate#*:}
  for seed in 1 2 3; do
    dest="$OUT/gpt2-adamw-16/shakespeare_$rule-n_layer16-learning_rate$rate-s$seed"
    [[ -e $dest ]] && continue
    mkdir -p "$dest"
    cp docs/logs/depth_ladder/runs/shakespeare_$rule-n_layer16-s$seed/{log.jsonl,config.json,dynamics.jsonl} "$dest/"
  done
done
# shellcheck disable=SC2086
python tools/compare.py $RULES --stack=config/cpu.py $ARGS --dynamics=True --dynamics_interval=2000 "$@" \
  --out="$OUT/gpt2-adamw-16"
# Muon at 16 layers in the modern block: additive and every rule better than modern additive at 16 layers under
# AdamW, else orthogonal and rotation (table.py --muon says which, with each rule's AdamW rate from above for the
# parameters Muon leaves to AdamW); muon_lr tuned on seed 1337 as above, Muon's weight decay 0.1 (additive's, tuned
# at 4 layers in GPT-2's block: config/cpu.py).
MUON=$(python docs/logs/depth16/table.py --collect "$OUT" --muon)
# shellcheck disable=SC2086
python tools/compare.py $MUON --stack=config/modern.py --stack=config/muon.py --stack=config/cpu.py --set n_layer=16 \
  --n_embd=64 --muon_weight_decay=0.1 --tune muon_lr=0.005,0.01,0.02 --seeds=5 --nproc="${NPROC:-2}" "$@" \
  --out="$OUT/modern-muon-16"
