"""Where a process computes: the device, the dtype, and the autocast context of its forwards."""

from contextlib import nullcontext

import torch

from orthogpt.errors import UserError


def resolve_device(name):
    """'auto' -> 'cuda' when a GPU is visible, else 'cpu'; a device that is not here is refused."""
    if name == 'auto':
        return 'cuda' if torch.cuda.is_available() else 'cpu'
    if name.startswith('cuda') and not torch.cuda.is_available():
        raise UserError(f"--device={name} but torch {torch.__version__} sees no CUDA GPU "
                        f"({'a CPU-only build' if torch.version.cuda is None else 'none visible'}); on a CPU use "
                        f"--device=cpu and a model sized for it: stack config/cpu.py after the config")
    if name == 'mps' and not torch.backends.mps.is_available():
        raise UserError("--device=mps but MPS is not available here; use --device=cpu")
    return name


def resolve_dtype(name, device_type):
    """'auto' -> bfloat16 on a GPU that has it, float16 on one that does not, float32 elsewhere."""
    if name != 'auto':
        return name
    if device_type == 'cuda':
        return 'bfloat16' if torch.cuda.is_bf16_supported() else 'float16'
    return 'float32'


def autocast(device_type, dtype):
    """The forward's autocast context: none for float32."""
    return nullcontext() if dtype == 'float32' else torch.autocast(device_type, dtype=getattr(torch, dtype))
