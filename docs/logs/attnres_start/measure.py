"""How far Attention Residuals with zero queries start from the additive model with the same weights (docs/rules.md,
"Rules that look across depth"): the largest |logit difference| at init, float32, 4 sequences of 64 tokens over 65
tokens, width 128 (the CPU recipe's), 4 and 12 blocks, in the project's Shakespeare block (RMSNorm, sigma init) and in
GPT-2's (LayerNorm of eps 1e-5, its N(0, 0.02) init); and the embeddings' variance, against which n^2 eps counts.

    python docs/logs/attnres_start/measure.py
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', '..'))
from model import GPT, GPTConfig  # noqa: E402

BLOCKS = {"Shakespeare's (rmsnorm, sigma)": dict(norm='rmsnorm', init='sigma', tie_weights=False, activation='relu'),
          "GPT-2's (layernorm 1e-5, gpt2)": dict(norm='layernorm', init='gpt2', tie_weights=True)}
for name, arch in BLOCKS.items():
    for n_layer in (4, 12):
        torch.manual_seed(0)
        keys = dict(n_layer=n_layer, n_head=4, n_embd=128, block_size=64, vocab_size=65, **arch)
        plain, model = GPT(GPTConfig(residual='additive', **keys)), GPT(GPTConfig(residual='attnres', **keys))
        model.load_state_dict(plain.state_dict(), strict=False)
        idx = torch.randint(65, (4, 64))
        with torch.no_grad():
            gap = (model(idx)[0] - plain(idx)[0]).abs().max().item()
            x = plain.wte(idx) + plain.wpe(torch.arange(64))
        print(f"{name}, {n_layer} blocks: max |logit difference| {gap:.3g}; embeddings' variance "
              f"{x.var(-1, unbiased=False).mean().item():.3g}")
