#!/usr/bin/env bash
# How long a checkpoint stalls the training loop: GPT-2 medium's shape (24 x 1024, GPT-2's vocabulary, 353.6M
# parameters; with its AdamW state a 4.24 GB checkpoint) on two processes, under DDP and under FSDP, saving at
# every iteration; the loop's seconds in each save are the log's save_s. GPT-2 large does not fit twice in the
# VM's 24 GiB under DDP. Block 64, one sequence a micro-step: the step's compute is beside the point here.
#   bash docs/logs/checkpoint_stall/run.sh [SHAPE ...]     # then python docs/logs/checkpoint_stall/table.py
#   ASYNC=True bash docs/logs/checkpoint_stall/run.sh       # the same with --async_save=True, saving every 3rd
#                                                           # iteration, so that a write can end before the next
# SHAPE: train.py arguments in place of GPT-2 medium's (--n_layer=2 --n_head=2 --n_embd=64 checks the script in a
# minute). Needs TIKTOKEN_CACHE_DIR (GPT-2's BPE files) and Tiny Shakespeare's text (TEXT), tokenized here into
# GPT-2 shards.
set -euo pipefail
cd "$(dirname "$0")/../../.."
HERE=docs/logs/checkpoint_stall
WORK=${WORK:-/tmp/checkpoint-stall}
TEXT=${TEXT:-data/shakespeare_char/input.txt}
mkdir -p "$WORK"
[[ -f $WORK/data/val_000000.bin ]] || python data/prepare_text.py --files "$TEXT" --name stall --out_dir "$WORK/data"
SHAPE=("$@")
(( ${#SHAPE[@]} )) || SHAPE=(--n_layer=24 --n_head=16 --n_embd=1024)
ASYNC=${ASYNC:-False}
SUFFIX=$([[ $ASYNC == True ]] && echo -async || true)
EVERY=$([[ $ASYNC == True ]] && echo 3 || echo 1)
for parallel in ddp fsdp; do
  NAME=$parallel$SUFFIX
  rm -rf "$WORK/$NAME"
  OMP_NUM_THREADS=1 python -m torch.distributed.run --standalone --nproc_per_node=2 train.py config/gpt2_124m_add.py \
    "${SHAPE[@]}" --block_size=64 --batch_size=1 --gradient_accumulation_steps=2 --max_iters=$(( 4 * EVERY )) --eval_interval=$EVERY \
    --eval_iters=1 --log_interval=1 --warmup_iters=1 --keep_last_n=2 --device=cpu --dtype=float32 --compile=False \
    --dataset=stall --data_dir="$WORK/data" --parallel=$parallel --out_dir="$WORK/$NAME" --init_from=auto --async_save=$ASYNC \
    > "$HERE/$NAME.txt" 2>&1
  cp "$WORK/$NAME/log.jsonl" "$HERE/$NAME.jsonl"
  du -sb "$WORK/$NAME"/ckpt.pt "$WORK/$NAME"/ckpt-*.dcp 2>/dev/null | tail -n 2 >> "$HERE/$NAME.txt" || true
  rm -rf "$WORK/$NAME"
done
