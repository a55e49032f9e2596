"""Export a run's language model in the Hugging Face format (orthogpt/hf.py).

    python tools/export.py --out_dir=out-gpt2-ft --to=hf-gpt2-ft     # best.pt, else ckpt.pt (--ckpt=NAME)

A GPT with GPT-2's architecture (LayerNorm and Linear biases, activation='gelu_tanh', tied head,
dense Q/K/V) whose updates are all additive (what init_from='gpt2' and config/gpt2_tiny_cpu.py
train) is written in GPT-2's layout, which transformers loads with no custom code:

    from transformers import GPT2LMHeadModel; GPT2LMHeadModel.from_pretrained('hf-gpt2-ft')

with GPT-2's tokenizer files beside it, where tiktoken's cache holds them (a model of GPT-2's
tokens), for AutoTokenizer. Every other variant (the orthogonal, rotation, nGPT and
hyper-connection rules, Cayley or exp Q/K/V, RMSNorm, ...) is written in OrthoGPT's layout, which
hf.from_pretrained('DIR') reads back exactly. The folder's README.md says how to load it.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
from orthogpt import checkpoint, errors, hf  # noqa: E402
from orthogpt.errors import UserError  # noqa: E402


@errors.entry
def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--out_dir', default='out', help="the run's folder")
    p.add_argument('--ckpt', default=None, help='file in out_dir (default: best.pt, else ckpt.pt)')
    p.add_argument('--to', required=True, help='the folder to write')
    args = p.parse_args(argv)
    if os.path.exists(os.path.join(args.to, 'model.safetensors')):
        raise UserError(f"{args.to} already holds an exported model; pick another --to (or delete it)")
    model, ckpt, cfg = checkpoint.load_language_model(args.out_dir, args.ckpt)
    layout = hf.export(model, args.to, gpt2_tokens=ckpt['meta'] is None and cfg.vocab_size >= 50257)
    loads = ("GPT-2's layout: transformers' GPT2LMHeadModel.from_pretrained loads it" if layout == 'gpt2' else
             f"OrthoGPT's layout (residual={cfg.residual!r}, qkv={cfg.qkv!r}, norm={cfg.norm!r}, "
             f"activation={cfg.activation!r}): hf.from_pretrained loads it")
    print(f"wrote {os.path.join(args.to, 'config.json')} and model.safetensors in {loads}")


if __name__ == '__main__':
    main()
