#!/usr/bin/env bash
# The eager training step against nanoGPT's on its CPU recipe (docs/performance.md, "Training step at nanoGPT's CPU
# recipe"): nanoGPT's own train.py (4 layers x 128, batch 12 x 64, dropout 0, LayerNorm and GELU, no biases), ours
# with the paper's block (config/shakespeare_add.py: RMSNorm and ReLU), and ours at nanoGPT's block (--norm=layernorm
# --activation=gelu), each 200 iterations in a process of its own, in interleaved rounds (A B C A B C ...). Prints a
# line a run: round, variant, the median ms/iter of its log lines after the first. Needs a checkout of nanoGPT
# (git clone https://github.com/karpathy/nanoGPT) and data/shakespeare_char prepared here; run from the repository's
# root with its venv active: NANOGPT=../nanoGPT bash docs/logs/nanogpt_step/run.sh > results.txt. With CALLS=1 it
# counts Python's work an iteration instead (calls.py).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
ROUNDS=${ROUNDS:-3} NANOGPT=$(cd "${NANOGPT:?set NANOGPT to a nanoGPT checkout}" && pwd) HERE=$(pwd)
work=$(mktemp -d) && trap 'rm -rf "$work"' EXIT
mkdir -p "$work/nano/data/shakespeare_char"  # nanoGPT's layout: its scripts, our token files, its meta.pkl
ln -s "$NANOGPT"/{train.py,model.py,configurator.py,config} "$work/nano/"
ln -s "$HERE"/data/shakespeare_char/{train,val}.bin "$work/nano/data/shakespeare_char/"
python -c "import json, pickle, sys; m = json.load(open('data/shakespeare_char/meta.json'))
pickle.dump({'vocab_size': m['vocab_size']}, open(sys.argv[1], 'wb'))" "$work/nano/data/shakespeare_char/meta.pkl"
RECIPE=(--max_iters=200 --lr_decay_iters=2000 --log_interval=10 --eval_interval=1000 --eval_iters=20)
if [[ ${CALLS:-} ]]; then python docs/logs/nanogpt_step/calls.py "$work/nano"; exit; fi  # Python's work instead
median() { python -c "import statistics, sys; print(f'{statistics.median_high(map(float, sys.argv[1:])):.1f}')" "$@"; }
for round in $(seq "$ROUNDS"); do
  for variant in nanogpt ours ours_ln_gelu; do
    case $variant in
      nanogpt) (cd "$work/nano" && python train.py config/train_shakespeare_char.py --device=cpu --compile=False \
                 --block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 --dropout=0.0 \
                 --always_save_checkpoint=False --out_dir="$work/out-nano" "${RECIPE[@]}") > "$work/log.txt" 2>&1
               ms=$(grep -o 'time [0-9.]*ms' "$work/log.txt" | grep -o '[0-9.]*' | tail -n +2) ;;
      ours*) extra=() && [[ $variant == ours_ln_gelu ]] && extra=(--norm=layernorm --activation=gelu)
             rm -rf "$work/out-ours"
             python train.py config/shakespeare_add.py config/cpu.py "${extra[@]}" --out_dir="$work/out-ours" \
               "${RECIPE[@]}" > "$work/log.txt" 2>&1
             ms=$(grep -o '[0-9.]* ms/iter,' "$work/log.txt" | grep -o '^[0-9.]*' | tail -n +2) ;;
    esac
    # shellcheck disable=SC2086
    echo "round=$round variant=$variant median_ms=$(median $ms) load=$(cut -d' ' -f1 /proc/loadavg)"
  done
done
