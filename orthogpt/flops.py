"""FLOPs per token of a training step, counted on the model itself, so that every rule's extra work
is in it: the wide streams' coefficient projections (HC, mHC), the orthogonal Q/K/V maps' inverses,
exponentials and products, a gated MLP's shapes.

PyTorch's FlopCounterMode counts the matrix products (mm, bmm, attention) of one forward and backward
at batch size 1. Three formulas are added to its registry for ops it leaves out:
  - attention on a CPU (its fused kernel; CUDA's are registered), by torch's own formulas, so that
    a CPU and a GPU count the same: 4 T d per token and layer forward, 10 T d backward (the scores
    computed again, as flash attention does), the causal mask not discounted: 14 L T d where PaLM's
    convention (and MFU in tools/bench.py) counts 12 L T d;
  - linalg_inv_ex (the Cayley map): 2 n^3 per n x n matrix, Gauss-Jordan's count;
  - linalg_matrix_exp (the exp map): 6 products of 2 n^3, the degree-18 Taylor approximant's 5 (torch's
    algorithm: P. Bader, S. Blanes, F. Casas, "Computing the Matrix Exponential with an Optimized
    Taylor Polynomial Approximation", Mathematics 7(12), 2019) and one squaring; the actual number
    of squarings depends on the matrix's norm.
Elementwise work (norms, rotations, the streams' n x n mixing, Sinkhorn's iterations) is not
counted, as in the 6N convention. A Q/K/V map runs once per step whatever the batch: its share of
an item is its cost over the step's items.
"""

import torch
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode

aten = torch.ops.aten


@flop_counter.register_flop_formula(aten._scaled_dot_product_flash_attention_for_cpu)
def _cpu_attention(query, key, value, *args, out_shape=None, **kwargs):
    return flop_counter.sdpa_flop_count(query, key, value)


@flop_counter.register_flop_formula(aten._scaled_dot_product_flash_attention_for_cpu_backward)
def _cpu_attention_backward(grad_out, query, key, value, *args, out_shape=None, **kwargs):
    return flop_counter.sdpa_backward_flop_count(grad_out, query, key, value)


def _square(shape):
    *batch, n, _ = shape
    return int(torch.tensor(batch).prod()) if batch else 1, n


@flop_counter.register_flop_formula(aten.linalg_inv_ex)
def _inverse(a, *args, out_shape=None, **kwargs):
    count, n = _square(a)
    return count * 2 * n ** 3


@flop_counter.register_flop_formula(aten.linalg_matrix_exp)
def _matrix_exp(a, *args, out_shape=None, **kwargs):
    count, n = _square(a)
    return count * 6 * 2 * n ** 3


def per_item(model, one, items_per_step):
    """FLOPs per item (a sequence, an image) of a training step. `one` is a batch of one item,
    (inputs, targets). A step's cost is a x items + b, where b (the Q/K/V maps) does not grow with
    the batch: counting one and two items gives both. The model's gradients are left as None."""
    def count(x, y):
        with FlopCounterMode(display=False) as counter:
            _, loss = model(x, y)
            loss.backward()
        model.zero_grad(set_to_none=True)
        return counter.get_total_flops()
    one_item, two_items = count(*one), count(*(torch.cat([t, t]) for t in one))
    per_item, per_step = two_items - one_item, 2 * one_item - two_items
    return per_item + per_step / items_per_step


def lookups(gpt):
    """A GPT's parameters looked up, not multiplied, which the 6N convention leaves out: its positions, its value
    embeddings and an untied wte (a tied one is the head's matrix)."""
    tables = (gpt.wpe, gpt.value_embeds, None if gpt.config.tie_weights else gpt.wte)
    return sum(p.numel() for m in tables if m is not None for p in m.parameters())
