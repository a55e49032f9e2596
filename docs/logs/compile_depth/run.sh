#!/usr/bin/env bash
# Compile time and step time against depth (docs/performance.md, "Compiling deep models"): every rule at width 64 on
# the CPU recipe, 4, 32 and then 16 layers, eager, compiled a block at a time (compile_scope=blocks, the default) and
# compiled whole (compile_scope=model), in one bench process a cell so that the three are timed in interleaved rounds.
# bench.py compiles cold (no cache). A whole-model compile still running after LIMIT seconds
# (Attention Residuals' at 32 layers ran past 30 minutes before) ends the cell, which then runs again without it.
# Resumable: a cell with its output is kept. Then python docs/logs/compile_depth/table.py.
set -uo pipefail
cd "$(dirname "$0")/../../.."
HERE=docs/logs/compile_depth
LIMIT=${LIMIT:-300}
for L in 4 32 16; do
  for rule in add:additive ortho:orthogonal rot:rotation ngpt:ngpt hc:hc mhc:mhc ddl:ddl attnres:attnres \
              denseformer:denseformer; do
    file=${rule%%:*} name=${rule#*:} out=$HERE/$name-$L.txt
    [[ -s $out ]] && continue
    bench=(python tools/bench.py "config/shakespeare_$file.py" config/cpu.py --n_embd=64 "--n_layer=$L" --compile
           --steps=10 --repeats=7 --warmup=2)
    timeout "$LIMIT" "${bench[@]}" "--variants=$name:compile=False,$name,$name:compile_scope=model" > "$out.part" 2>&1
    status=$?
    if (( status == 124 )); then
      { echo "whole-model compile: not finished in $LIMIT s (timeout)"
        "${bench[@]}" "--variants=$name:compile=False,$name"; } > "$out.part" 2>&1 || status=1
    fi
    if (( status != 0 && status != 124 )); then
      echo "$out.part: failed (exit $status)" >&2
      exit 1
    fi
    mv "$out.part" "$out"
    echo "$out: $(grep -c '^| ' "$out") table lines"
  done
done
