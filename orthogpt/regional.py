"""Regional compilation: a model whose blocks are compiled one at a time, one graph that every block reuses, for
training (orthogpt/parallel.py) and for decoding's step (orthogpt/decoding.py)."""

import copy

import torch
import torch.nn as nn


def compiled_blocks(model, **options):
    """model (a GPT or ViT) with each block through torch.compile(**options), one graph that every block reuses
    ("regional compilation"): compile time about one block's whatever the depth. It shares every module but the
    blocks' list, so that model itself stays eager (diagnostics, estimates); in it the depth rules keep their lists of
    earlier outputs at one length (model.Depth)."""
    # process-wide, and felt only where a parameter's size differs between calls of one graph: DenseFormer's alphas
    # (one more weight each block) become one size symbol, not a graph a block
    torch._dynamo.config.force_parameter_static_shapes = False
    # an orthogonal Q/K/V map's parametrized Linear is a class of its own in each block: a graph a block there
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, len(model.blocks) + 2)
    view = copy.copy(model)
    view._modules = dict(model._modules)
    view.blocks, view.fixed_depth = nn.ModuleList(torch.compile(b, **options) for b in model.blocks), True
    return view
