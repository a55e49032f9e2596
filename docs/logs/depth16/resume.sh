#!/usr/bin/env bash
# Resumes the 16-layer study (docs/results.md, "Every rule at 16 layers, rates tuned there") where its OUT folder is
# gone (another machine): the ended runs' logs kept here (table.py --collect copied them) go back into OUT/CELL/, where
# compare.py keeps them; then run.sh runs the rest (its probes anew: they time this machine). Where OUT is still there,
# run.sh alone resumes it. Same arguments and OUT as run.sh.
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-out-compare/depth16}
for run in docs/logs/depth16/*-*-16/*/; do
  dest="$OUT/$(basename "$(dirname "$run")")/$(basename "$run")"
  [[ -d $run && ! -e $dest ]] || continue  # a folder there is that run's own
  mkdir -p "$dest"
  cp "$run"* "$dest/"
done
OUT=$OUT bash docs/logs/depth16/run.sh "$@"
