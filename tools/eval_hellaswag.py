"""HellaSwag validation accuracy of a language model, scored as llm.c and build-nanogpt score it.

    python tools/eval_hellaswag.py --out_dir=out-gpt2-ft                   # a run trained on GPT-2 BPE tokens
    python tools/eval_hellaswag.py --init_from=gpt2                        # OpenAI's GPT-2 (or -medium, ..., a folder)
    python tools/eval_hellaswag.py --init_from=gpt2 --data=hellaswag_val.jsonl --limit=200

Each example is a context and four endings. Every ending, with a space before it, follows the
context in GPT-2's tokens, and the model's cross-entropy is summed over the ending's tokens:
acc counts the examples whose least total loss is the labelled ending, acc_norm those whose least
mean loss per token is (the "acc_norm" of llm.c and build-nanogpt). lm-evaluation-harness on an
exported model, with tools/lm_eval_tasks/hellaswag_local.yaml on the same file, gives the same acc;
its acc_norm divides the total by the ending's characters instead (the space before it not counted),
so the two acc_norm can pick different endings. A sequence longer than block_size loses its first tokens.
The data: the validation split of Rowan/hellaswag through `datasets`, or --data, a jsonl file of
the original release (hellaswag_val.jsonl: fields ctx, endings, label).
"""

import argparse
import json
import os
import sys
from contextlib import nullcontext

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
from model import GPT, GPTConfig  # noqa: E402
from orthogpt import bpe, checkpoint, errors, hf, hub, progress  # noqa: E402
from orthogpt.maps import maps_held  # noqa: E402
from orthogpt.device import autocast, resolve_device, resolve_dtype  # noqa: E402
from orthogpt.errors import UserError, one_line  # noqa: E402


def load_examples(path, split, limit):
    """The examples as dicts with 'ctx', 'endings' and 'label' (an int)."""
    if path:
        if not os.path.isfile(path):
            raise UserError(f"--data {path}: no such file; it is the original release's hellaswag_val.jsonl "
                            f"(https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl), "
                            f"or leave --data out to read Rowan/hellaswag through datasets")
        with open(path, encoding='utf-8') as f:
            rows = [json.loads(line) for line in f if line.strip()]
    else:
        hub.offline()  # out of reach: the datasets cache alone, at once
        try:
            import datasets
            rows = datasets.load_dataset('Rowan/hellaswag', split=split)
        except Exception as e:
            raise UserError(f"could not load Rowan/hellaswag ({type(e).__name__}: {one_line(str(e))}); offline, "
                             f"pass --data=hellaswag_val.jsonl (the original release's file)") from None
    rows = list(rows)[:limit] if limit else list(rows)
    return [{'ctx': r['ctx'], 'endings': list(r['endings']), 'label': int(r['label'])} for r in rows]


@torch.no_grad()
def score(model, examples, encode, device, amp=nullcontext()):
    """(pred, pred_norm) per example: the ending of least total and of least mean cross-entropy
    over its tokens, all four endings of every example in one padded batch."""
    block = model.config.block_size
    seqs, ends = [], []
    for ex in examples:
        ctx = encode(ex['ctx'])
        for ending in ex['endings']:
            end = encode(' ' + ending)
            seqs.append((ctx + end)[-(block + 1):])
            ends.append(min(len(end), len(seqs[-1]) - 1))
    T = max(len(s) for s in seqs) - 1
    x = torch.zeros(len(seqs), T, dtype=torch.long)
    y = torch.full((len(seqs), T), -1, dtype=torch.long)  # -1: no loss (the context, the padding)
    for i, (s, n) in enumerate(zip(seqs, ends)):
        x[i, :len(s) - 1] = torch.tensor(s[:-1])
        y[i, len(s) - 1 - n:len(s) - 1] = torch.tensor(s[-n:])
    with amp:
        logits, _ = model(x.to(device))
    losses = F.cross_entropy(logits.float().flatten(0, 1), y.to(device).flatten(), ignore_index=-1, reduction='none')
    total = losses.view(len(seqs), T).sum(1).view(len(examples), -1)  # (examples, endings)
    count = (y != -1).sum(1).to(device).view(len(examples), -1)
    return list(zip(total.argmin(1).tolist(), (total / count).argmin(1).tolist()))


def load_model(args, device):
    """The model to score, from --init_from or a run's checkpoint; one not in GPT-2's tokens is refused."""
    if args.init_from:
        keys, state = hf.read(args.init_from)
        model, source, own = hf.fit(GPT(GPTConfig(**keys)), state).eval(), args.init_from, False
    else:
        model, ckpt, _ = checkpoint.load_language_model(args.out_dir, args.ckpt, map_location=device)
        source, own = args.out_dir, ckpt['meta'] is not None
    if own or model.config.vocab_size < 50257:
        raise UserError(f"{source} holds a model of a {model.config.vocab_size}-token vocabulary of its own; HellaSwag "
                        f"is scored in GPT-2's tokens (train on data from data/prepare_text.py, or use --init_from)")
    return model


@errors.entry
def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group()
    src.add_argument('--out_dir', default='out', help="a run's folder")
    src.add_argument('--init_from', default=None, help="pretrained weights: 'gpt2', ..., or a Hugging Face folder")
    p.add_argument('--ckpt', default=None, help=checkpoint.CHOICE)
    p.add_argument('--data', default=None, help='a jsonl file in the original format (default: Rowan/hellaswag)')
    p.add_argument('--split', default='validation')
    p.add_argument('--limit', type=int, default=None, help='score only the first N examples')
    p.add_argument('--batch_size', type=int, default=8, help='examples per forward (four sequences each)')
    p.add_argument('--device', default='auto')
    args = p.parse_args(argv)
    device = resolve_device(args.device)
    model = load_model(args, device).to(device)
    enc = bpe.encoding()
    examples = load_examples(args.data, args.split, args.limit)
    amp = autocast(device.split(':')[0], resolve_dtype('auto', device.split(':')[0]))
    right = [0, 0]
    with maps_held(model), progress.bar(total=len(examples), desc='HellaSwag', unit='example') as bar:
        for i in range(0, len(examples), args.batch_size):
            batch = examples[i:i + args.batch_size]
            for ex, preds in zip(batch, score(model, batch, enc.encode_ordinary, device, amp)):
                right = [r + (p == ex['label']) for r, p in zip(right, preds)]
            bar.update(len(batch))
    n = len(examples)
    print(f"HellaSwag {args.data or args.split}: {n} examples, acc {right[0] / n:.4f}, acc_norm {right[1] / n:.4f}")
    return right[0] / n, right[1] / n


if __name__ == '__main__':
    main()
