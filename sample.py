"""Sample text from a trained checkpoint.

    python sample.py --out_dir=out-shakespeare-rot-cpu --start="ROMEO:" --num_samples=3
    python sample.py --out_dir=out-shakespeare-rot --start=FILE:prompt.txt --temperature=0.8

Decodes with the character vocabulary saved in the checkpoint, or GPT-2 BPE (tiktoken) for
checkpoints trained on BPE tokens. Generation reads each new token against a KV cache of the
context (--no_cache: the whole context every step, the same tokens, slower). Past block_size the
context window moves on by --shift tokens at a time (default block_size/4; 1 is nanoGPT's
sliding window, which makes the cache re-read the window at every token). --compile compiles the
per-token forward (torch.compile) a block at a time, one graph that every block reuses (compile time
flat in depth, but with orthogonal Q/K/V maps), or whole with --compile_scope=model (one graph, a CUDA graph on a GPU): faster decoding
after seconds to minutes spent compiling, which pays off for long or many samples.
"""

import argparse

import torch

from orthogpt import bpe, checkpoint, decoding, errors
from orthogpt.device import resolve_device
from orthogpt.errors import UserError


def make_codec(meta):
    """(encode, decode) for the checkpoint's vocabulary."""
    if meta is None:
        enc = bpe.encoding()
        return (lambda s: enc.encode(s, allowed_special={'<|endoftext|>'})), enc.decode
    stoi, itos = meta['stoi'], meta['itos']

    def encode(s):
        unknown = sorted(set(s) - set(stoi))
        if unknown:
            raise UserError(f"the prompt has characters outside the model's vocabulary: "
                             f"{', '.join(repr(c) for c in unknown)}; the model knows {''.join(itos)!r}")
        return [stoi[c] for c in s]
    return encode, lambda ids: ''.join(itos[i] for i in ids)


@errors.entry
def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--out_dir', default='out', help='folder with the checkpoint')
    p.add_argument('--ckpt', default=None, help=checkpoint.CHOICE)
    p.add_argument('--start', default='\n', help='prompt text, or FILE:path to read it from a file')
    p.add_argument('--num_samples', type=int, default=3)
    p.add_argument('--max_new_tokens', type=int, default=500)
    p.add_argument('--temperature', type=float, default=0.8)
    p.add_argument('--top_k', type=int, default=200)
    p.add_argument('--seed', type=int, default=1337)
    p.add_argument('--shift', type=int, default=None, help='tokens the full context window moves at a time')
    p.add_argument('--no_cache', action='store_true', help='recompute the whole context for every token')
    p.add_argument('--compile', action='store_true', help='torch.compile the forward that runs once per token')
    p.add_argument('--compile_scope', choices=('blocks', 'model'), default='blocks',
                   help="with --compile: 'blocks', one graph that every block reuses; 'model', the whole step")
    p.add_argument('--device', default='auto', help="'auto', 'cpu', 'cuda', 'cuda:N'")
    args = p.parse_args(argv)
    if args.temperature <= 0:
        raise UserError(f"--temperature={args.temperature} must be positive (small values approach greedy decoding)")
    if args.top_k is not None and args.top_k < 1:
        raise UserError(f"--top_k={args.top_k} must be at least 1")

    device = resolve_device(args.device)
    model, ckpt, cfg = checkpoint.load_language_model(args.out_dir, args.ckpt)
    model.to(device)
    try:  # no new token: the arguments checked, before the prompt is read
        decoding.generate(model, torch.zeros(1, 1, dtype=torch.long, device=device), 0, shift=args.shift)
    except ValueError as e:
        raise UserError(f"--{e}") from None

    prompt = args.start
    if prompt.startswith('FILE:'):
        try:
            with open(prompt[5:], encoding='utf-8') as f:
                prompt = f.read()
        except OSError as e:
            raise UserError(f"cannot read the prompt file {prompt[5:]}: {e.strerror}") from None
    if not prompt:
        raise UserError("the prompt is empty; pass --start=TEXT")
    meta = ckpt['meta']
    if meta is None and cfg.vocab_size < 50257:
        raise UserError(f"the checkpoint's vocabulary of {cfg.vocab_size} tokens is not GPT-2's, and it holds no "
                 f"character table to decode with; sample from a checkpoint written by train.py on that data")
    if meta is not None and meta['vocab_size'] != cfg.vocab_size:
        raise UserError(f"the checkpoint's model has {cfg.vocab_size} tokens but its vocabulary "
                 f"{meta['vocab_size']}: it was not written by train.py")
    encode, decode = make_codec(meta)
    ids = encode(prompt)
    x = torch.tensor(ids, dtype=torch.long, device=device)[None]
    generator = torch.Generator(device=device).manual_seed(args.seed)
    bf16 = device.startswith('cuda') and torch.cuda.is_bf16_supported()
    with torch.autocast(device.split(':')[0], dtype=torch.bfloat16, enabled=bf16):
        for _ in range(args.num_samples):
            y = decoding.generate(model, x, args.max_new_tokens, args.temperature, args.top_k, generator=generator,
                                  use_cache=not args.no_cache, shift=args.shift, compile=args.compile,
                                  compile_scope=args.compile_scope)
            print(decode(y[0].tolist()))
            print('---------------')


if __name__ == '__main__':
    main()
