"""Export a run's language model in the Hugging Face format (orthogpt/hf.py), for transformers.

    python tools/export.py --out_dir=out-shakespeare-rot --to=hf-rot      # its best.pt (--ckpt=NAME)

A GPT with GPT-2's architecture (LayerNorm and Linear biases, activation='gelu_tanh', tied head,
dense Q/K/V) whose updates are all additive (what init_from='gpt2' and config/gpt2_tiny_cpu.py
train) is written in GPT-2's layout, which transformers loads with no custom code:

    from transformers import AutoModelForCausalLM; AutoModelForCausalLM.from_pretrained('hf-gpt2-ft')

Every other variant (the orthogonal, rotation, nGPT and hyper-connection rules, Cayley or exp
Q/K/V, RMSNorm, ...) is written in OrthoGPT's layout, with model.py and the code that fits it to
transformers beside the weights:

    AutoModelForCausalLM.from_pretrained('hf-rot', trust_remote_code=True)

and hf.from_pretrained('hf-rot') reads either back in OrthoGPT. The tokenizer goes beside the
model for AutoTokenizer: the run's characters (tokenizer.json), or GPT-2's BPE files where
tiktoken's cache holds them; the README.md (the model card) names the rule, its papers, the run's
config and its val loss. A folder that already holds any of these files is refused.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
from orthogpt import checkpoint, errors, hf  # noqa: E402


@errors.entry
def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--out_dir', default='out', help="the run's folder")
    p.add_argument('--ckpt', default=None, help=checkpoint.CHOICE)
    p.add_argument('--to', required=True, help='the folder to write')
    args = p.parse_args(argv)
    model, ckpt, cfg = checkpoint.load_language_model(args.out_dir, args.ckpt)
    meta = ckpt['meta']
    tokens = meta['itos'] if meta else 'gpt2' if cfg.vocab_size >= 50257 else None
    run = {k: ckpt[k] for k in ('config', 'iter_num', 'best_val_loss')}
    layout = hf.export(model, args.to, tokens=tokens, run=run)
    loads = ("GPT-2's layout: transformers' AutoModelForCausalLM (GPT2LMHeadModel) loads it" if layout == 'gpt2' else
             f"OrthoGPT's layout (residual={cfg.residual!r}, qkv={cfg.qkv!r}, norm={cfg.norm!r}, "
             f"activation={cfg.activation!r}): transformers' AutoModelForCausalLM loads it with "
             f"trust_remote_code=True, and hf.from_pretrained")
    print(f"wrote {args.to}/ in {loads}; its README.md says how")


if __name__ == '__main__':
    main()
