#!/usr/bin/env bash
# Installs OrthoGPT's dependencies into the active Python environment (a virtual environment is
# best: python3 -m venv .venv && . .venv/bin/activate).
#
# torch comes first, pinned, and chosen for the machine, because a plain `pip install torch` on
# Linux takes PyPI's CUDA build with several GB of CUDA libraries, even where no GPU exists:
#   - a torch (>= 2.9, for torch.optim.Muon) already installed is kept (a cluster's own build, say);
#   - with an NVIDIA GPU (nvidia-smi lists one): torch 2.13.0 from PyPI, the CUDA build;
#   - outside Linux: torch 2.13.0 from PyPI, whose builds there have no CUDA libraries;
#   - on Linux without a GPU: torch 2.13.0+cpu from PyTorch's CPU index, or from any wheel folder or mirror in
#     pip's own configuration (PIP_FIND_LINKS, PIP_EXTRA_INDEX_URL), so that it works offline
#     where a CPU wheel is at hand. If none is, it stops and says what to do.
# Then requirements.txt, which a torch installed this way already satisfies.
set -euo pipefail
cd "$(dirname "$0")"
python=${PYTHON:-python3}
torch_version=2.13.0
cpu_index=https://download.pytorch.org/whl/cpu

if "$python" -c 'import sys, torch; sys.exit(tuple(map(int, torch.__version__.split(".")[:2])) < (2, 9))' 2>/dev/null; then
  echo "keeping the installed torch $("$python" -c 'import torch; print(torch.__version__)')"
elif command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  echo "NVIDIA GPU found: torch $torch_version with CUDA from PyPI"
  "$python" -m pip install "torch==$torch_version"
elif [[ $(uname -s) != Linux ]]; then
  echo "torch $torch_version from PyPI (outside Linux its builds carry no CUDA libraries)"
  "$python" -m pip install "torch==$torch_version"
else
  echo "no NVIDIA GPU: the CPU build of torch $torch_version"
  # pip's own sources first (a wheel folder or mirror it is configured with), quietly: where they
  # lack it, PyTorch's CPU index, which pip would otherwise ask again for each of torch's needs
  if ! "$python" -m pip install -q --timeout 15 --retries 1 "torch==$torch_version+cpu" 2>/dev/null &&
     ! "$python" -m pip install --extra-index-url "$cpu_index" --timeout 15 --retries 1 "torch==$torch_version+cpu"; then
    echo "error: no CPU build of torch $torch_version could be reached ($cpu_index, or pip's configured wheel" >&2
    echo "folders and mirrors). Point pip at one (PIP_FIND_LINKS=DIR or PIP_EXTRA_INDEX_URL=URL), or accept the" >&2
    echo "CUDA build, which also runs on a CPU: $python -m pip install torch==$torch_version; then run this again." >&2
    exit 1
  fi
fi
"$python" -m pip install -r requirements.txt
