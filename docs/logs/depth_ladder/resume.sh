#!/usr/bin/env bash
# Resumes the depth ladder (docs/results.md, "The depth ladder") where its OUT folder is gone (another machine): the
# finished runs' logs kept in runs/ here go back into OUT (and rot32/'s into OUT-rot32), where compare.py keeps them,
# with the 16-layer runs' ablation tables (ablate.md, which table.py --ablate reads in place of their checkpoints);
# then run.sh runs the rest. Where OUT is still there, run.sh alone resumes it. Same arguments and OUT as run.sh.
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-out-compare/ladder}
for run in docs/logs/depth_ladder/runs/*/ docs/logs/depth_ladder/rot32/*/; do  # rot32/: run.sh's OUT-rot32
  dest="$OUT$([[ $run == */rot32/* ]] && echo -rot32)/$(basename "$run")"
  [[ -d $run && ! -e $dest ]] || continue  # a folder there is that run's own
  mkdir -p "$dest"
  cp "$run"* "$dest/"
done
OUT=$OUT bash docs/logs/depth_ladder/run.sh "$@"
