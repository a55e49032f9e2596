#!/usr/bin/env bash
# Decoding compiled a block at a time against the whole step (issue 70, item 1): tokens/s and time to compile of
# additive and mHC at 4 and 16 layers (width 128, the CPU recipe's character model, random weights), 300 new tokens
# (the 64-token window moves on), 3 interleaved rounds. Run on an idle machine; writes layers4.md and layers16.md here.
set -euo pipefail
cd "$(dirname "$0")/../../.."
for layers in 4 16; do
  python tools/bench.py config/shakespeare_add.py config/cpu.py --n_layer="$layers" --sample --compile \
    --sample_tokens=300 --repeats=3 --variants=additive,additive:compile_scope=model,mhc,mhc:compile_scope=model \
    2>&1 | grep -v -i warn | tee "docs/logs/decode_compile/layers$layers.md"
done
