#!/usr/bin/env bash
# The wide streams' cost over additive on a CPU (docs/performance.md, "Hyper-Connections and mHC"; issue 70, item 5),
# after HC's dynamic weights became one parameter: compiled (a block at a time) at width 512 (8 heads, batch 4) and at
# the CPU recipe's width 128, in 11 interleaved rounds, then a profile of the compiled step at width 128 (each
# operator's share). Alone on the machine: about 20 minutes on the 2-core VM. Writes its outputs beside this file.
# Run from the repository's root with its venv active: bash docs/logs/wide_streams/run.sh
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
HERE=docs/logs/wide_streams V=additive,hc,mhc
python tools/bench.py config/shakespeare_add.py config/cpu.py --n_embd=512 --n_head=8 --batch_size=4 --repeats=11 \
  --compile --variants=$V | tee $HERE/width512.txt
python tools/bench.py config/shakespeare_add.py config/cpu.py --repeats=11 --compile --variants=$V | tee $HERE/width128.txt
python tools/bench.py config/shakespeare_add.py config/cpu.py --repeats=1 --steps=5 --compile --variants=$V \
  --profile=/tmp/wide_profile128 | tee $HERE/profile128.txt
mkdir -p $HERE/profile128 && cp /tmp/wide_profile128/*.md $HERE/profile128/  # the traces (.json) stay out: megabytes
