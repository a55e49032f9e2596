#!/usr/bin/env bash
# HC at 32 layers, eager and a block at a time: the code at 522bb7d (W_alpha, W_beta concatenated in every eager
# sublayer) against 3ae449d (one parameter W), one bench process each, alternated A B A B, to tell the code's effect
# from the VM's (docs/performance.md, "Compiling deep models"). OLD and NEW: worktrees at the two commits, each with
# data/shakespeare_char prepared. Output: hc32_ab.txt.
set -uo pipefail
OLD=${OLD:?a worktree at 522bb7d} NEW=${NEW:?a worktree at 3ae449d}
for round in 1 2; do
  for tree in "$OLD" "$NEW"; do
    (cd "$tree" && echo "== round $round, $(git log --oneline -1 | cut -c1-7)" &&
     python tools/bench.py config/shakespeare_hc.py config/cpu.py --n_embd=64 --n_layer=32 --compile --steps=10 \
       --repeats=5 --warmup=2 --variants=hc:compile=False,hc 2>&1 | grep "^| hc")
  done
done
