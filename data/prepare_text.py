"""Tokenize a text dataset with GPT-2 BPE into token shards for train.py.

    python data/prepare_text.py --dataset openwebtext      # preset, ~9.0B tokens, ~18 GB of shards
    python data/prepare_text.py --dataset fineweb-edu      # preset, sample-10BT: ~10B tokens, ~20 GB
    python data/prepare_text.py --dataset NAME [--config SUBSET] [--split train] [--text_column text]
    python data/prepare_text.py --files 'corpus/*.txt' --name mycorpus    # also .jsonl, .json, .parquet
    python train.py config/owt_smoke.py --dataset=mycorpus                # then train on it

Writes data/<name>/val_000000.bin (the first --val_tokens tokens: 10M for hub datasets, about
5% of local files) and train_000000.bin,
train_000001.bin, ... (--shard_size tokens each, the last shorter) in llm.c's shard format
(orthogpt/shards.py), and info.json. Every document is encoded with tiktoken's GPT-2
encode_ordinary and preceded by <|endoftext|>, in --num_proc processes. Hub datasets are
streamed (nothing needs the whole corpus in memory or on disk first); local files go through
the same datasets path (.txt files are one document each). A shard is written to a temporary
name and renamed; progress.json, updated after each shard, lets an interrupted run continue
after its last finished shard without redoing or duplicating anything.
"""

import argparse
import glob
import json
import multiprocessing as mp
import os
import signal
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
from orthogpt import bpe, errors, hub, progress, shards  # noqa: E402
from orthogpt.errors import UserError  # noqa: E402
from orthogpt.files import write_text  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
# name -> load_dataset arguments and what to expect
PRESETS = {
    'openwebtext': dict(path='Skylion007/openwebtext', revision='refs/convert/parquet', split='train', documents=8013769,
                        size='8,013,769 documents, about 9.0B GPT-2 tokens, about 18 GB of shards'),
    'fineweb-edu': dict(path='HuggingFaceFW/fineweb-edu', name='sample-10BT', split='train',
                        size='9.67M documents, about 10B GPT-2 tokens, about 20 GB of shards'),
}
BUILDERS = {'.txt': 'text', '.jsonl': 'json', '.json': 'json', '.parquet': 'parquet'}
_encoder = None


def encode(text):
    """[<|endoftext|>] + the GPT-2 BPE ids of one document, as uint16."""
    global _encoder
    if _encoder is None:
        _encoder = bpe.encoding()
    return np.array([_encoder.eot_token] + _encoder.encode_ordinary(text), dtype=np.uint16)


def documents(args):
    """An iterable of dataset rows (dicts), in a fixed order."""
    hub.offline()  # out of reach: the datasets cache alone, at once
    import datasets
    if args.files:
        paths = sorted(glob.glob(args.files, recursive=True))
        if not paths:
            raise UserError(f"--files {args.files!r} matches no file")
        kinds = {BUILDERS.get(os.path.splitext(p)[1]) for p in paths}
        if None in kinds or len(kinds) > 1:
            raise UserError(f"--files must match one kind of file among {', '.join(BUILDERS)}; got "
                             f"{sorted({os.path.splitext(p)[1] for p in paths})}")
        kind = kinds.pop()
        extra = {'sample_by': 'document'} if kind == 'text' else {}
        return datasets.load_dataset(kind, data_files=paths, split='train', streaming=True, **extra)
    preset = PRESETS.get(args.dataset, {})
    kwargs = dict(path=preset.get('path', args.dataset), name=args.config or preset.get('name'),
                  split=args.split or preset.get('split', 'train'), streaming=not args.no_streaming)
    if preset.get('revision'):
        kwargs['revision'] = preset['revision']
    try:
        return datasets.load_dataset(**kwargs)
    except Exception as e:  # no network, an unknown dataset or config, ...
        raise UserError(f"could not load {kwargs['path']} from the Hugging Face hub ({type(e).__name__}: "
                        f"{str(e)[:200]}); offline, prepare local files with --files PATTERN --name NAME") from None


def count_lines(path):
    with open(path, 'rb') as f:
        return sum(chunk.count(b'\n') for chunk in iter(lambda: f.read(1 << 24), b''))


def count_documents(args, rows):
    """How many documents the source holds, where that is cheap to know (for the ETA); else None."""
    if args.files:
        paths = sorted(glob.glob(args.files, recursive=True))
        ext = os.path.splitext(paths[0])[1]
        if ext == '.txt':
            return len(paths)
        if ext == '.jsonl':
            return sum(count_lines(p) for p in paths)
        if ext == '.parquet':
            import pyarrow.parquet as pq
            return sum(pq.ParquetFile(p).metadata.num_rows for p in paths)
        return None
    if 'documents' in PRESETS.get(args.dataset, {}):
        return PRESETS[args.dataset]['documents']
    splits = getattr(rows.info, 'splits', None) or {}
    split = splits.get(args.split or PRESETS.get(args.dataset, {}).get('split', 'train'))
    return split.num_examples if split is not None and split.num_examples else None


class Writer:
    """Fills shards in order: first val (val_tokens), then train (shard_size each)."""

    def __init__(self, out_dir, shard_size, val_tokens, state):
        self.out_dir, self.shard_size, self.val_tokens = out_dir, shard_size, val_tokens
        self.state = state  # shards written, documents consumed, tokens of the next document already written
        self.buffer, self.filled = np.empty(max(shard_size, val_tokens), dtype=np.uint16), 0

    def target(self):
        return self.val_tokens if self.state['shards'] == 0 else self.shard_size

    def name(self, index):
        return f"val_{index:06d}.bin" if index == 0 else f"train_{index - 1:06d}.bin"

    def add(self, tokens):
        """Append one document's tokens, writing every shard they complete."""
        while len(tokens):
            take = min(len(tokens), self.target() - self.filled)
            self.buffer[self.filled:self.filled + take] = tokens[:take]
            self.filled += take
            tokens = tokens[take:]
            self.state['skip'] += take
            if self.filled == self.target():
                self.flush()
        self.state['docs'] += 1
        self.state['skip'] = 0

    def flush(self):
        if self.filled == 0:
            return
        shards.write(os.path.join(self.out_dir, self.name(self.state['shards'])), self.buffer[:self.filled])
        self.state['shards'] += 1
        self.state['tokens'] += self.filled
        self.filled = 0
        save_json(os.path.join(self.out_dir, 'progress.json'), self.state)


def tokenize(texts, writer, num_proc, total):
    """Encode texts in num_proc processes into the writer's shards, with a progress bar (an ETA
    where the total is known); returns the tokens written by this run."""
    state, skip, done_tokens = writer.state, writer.state['skip'], 0
    # spawn, not fork: forking this process, whose torch / Arrow / tokenizer threads may hold a
    # lock at that moment, can leave a worker waiting on it forever
    # Ctrl-C reaches the workers too: they ignore it, and this process stops them
    with mp.get_context('spawn').Pool(num_proc, signal.signal, (signal.SIGINT, signal.SIG_IGN)) as pool, \
            progress.bar(pool.imap(encode, texts, chunksize=16), 'tokenizing', total=total, unit='doc',
                         initial=state['docs']) as bar:
        for i, tokens in enumerate(bar):
            if i == 0 and skip:  # the document that straddled the last finished shard
                tokens = tokens[skip:]
            writer.add(tokens)
            done_tokens += len(tokens)
            if i % 1000 == 0:
                bar.set_postfix_str(f"{state['tokens'] + writer.filled:,} tokens", refresh=False)
    return done_tokens


def save_json(path, data):
    write_text(path, json.dumps(data, indent=1))


@errors.entry
def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument('--dataset', help=f"Hugging Face dataset, or a preset: {', '.join(PRESETS)}")
    src.add_argument('--files', help="local files (glob): .txt, .jsonl/.json or .parquet")
    p.add_argument('--config', help='dataset subset (load_dataset name=)')
    p.add_argument('--split', help='dataset split (default train)')
    p.add_argument('--text_column', default='text')
    p.add_argument('--no_streaming', action='store_true', help='download the whole dataset before tokenizing')
    p.add_argument('--name', help='folder name under data/ (default: the dataset name)')
    p.add_argument('--out_dir', help='output folder (default data/<name>)')
    p.add_argument('--shard_size', type=int, default=10 ** 8, help='tokens per train shard (llm.c: 1e8)')
    p.add_argument('--val_tokens', type=int, default=None,
                   help='tokens of the val shard, taken first (default: 10M; local files: ~5%% of them)')
    p.add_argument('--num_proc', type=int, default=max(1, (os.cpu_count() or 2) - 1))
    p.add_argument('--max_docs', type=int, default=None, help='stop after this many documents (trials)')
    args = p.parse_args(argv)
    if args.val_tokens is None:  # GPT-2 BPE averages about 4 bytes of English per token
        local = sum(os.path.getsize(f) for f in glob.glob(args.files, recursive=True)) if args.files else 0
        args.val_tokens = max(1000, local // 4 // 20) if args.files else 10 ** 7
    if args.shard_size < 1 or args.val_tokens < 1:
        raise UserError("--shard_size and --val_tokens must be positive")
    name = args.name or (args.dataset or '').split('/')[-1]
    if not name:
        raise UserError("--files needs --name, the dataset name train.py will use (--dataset=NAME)")
    out_dir = args.out_dir or os.path.join(HERE, name)
    os.makedirs(out_dir, exist_ok=True)
    progress = os.path.join(out_dir, 'progress.json')
    source = {k: getattr(args, k) for k in ('dataset', 'files', 'config', 'split', 'text_column', 'shard_size',
                                            'val_tokens', 'max_docs')}
    state = {'source': source, 'shards': 0, 'docs': 0, 'skip': 0, 'tokens': 0, 'done': False}
    if os.path.exists(progress):
        with open(progress) as f:
            saved = json.load(f)
        if saved['source'] != source:
            raise UserError(f"{out_dir} holds a preparation with other settings ({saved['source']}); "
                             f"use another --out_dir or delete it")
        state = saved
        if state['done']:
            print(f"{out_dir} is complete: {state['tokens']:,} tokens in {state['shards']} shards")
            return
        print(f"resuming after {state['shards']} finished shards ({state['docs']:,} documents)")
    if args.dataset in PRESETS:
        print(f"{args.dataset}: {PRESETS[args.dataset]['size']}")

    bpe.encoding()  # here, before the worker processes: its files, or the error that says how to get them
    rows = documents(args)
    total = count_documents(args, rows)
    if args.max_docs is not None:
        total = min(total or args.max_docs, args.max_docs)
    if state['docs']:
        rows = rows.skip(state['docs'])
    if args.max_docs is not None:
        rows = rows.take(args.max_docs - state['docs'])
    writer = Writer(out_dir, args.shard_size, args.val_tokens, state)
    start = time.perf_counter()
    done_tokens = tokenize((row[args.text_column] for row in rows), writer, args.num_proc, total)
    writer.flush()
    if state['shards'] < 2:
        raise UserError(f"the corpus has {state['tokens']:,} tokens, all taken by the val shard "
                         f"(--val_tokens={args.val_tokens:,}); rerun with a smaller --val_tokens and a new --out_dir")
    elapsed = time.perf_counter() - start
    state['done'] = True
    save_json(progress, state)
    save_json(os.path.join(out_dir, 'info.json'), {
        'tokenizer': 'gpt2', 'vocab_size': 50257, 'eot': 50256, 'format': 'llm.c shard v1 (orthogpt/shards.py)',
        'tokens': state['tokens'], 'documents': state['docs'], 'shards': state['shards'], 'source': source})
    print(f"{state['docs']:,} documents, {state['tokens']:,} tokens in {state['shards']} shards in {out_dir}; "
          f"this run: {done_tokens:,} tokens in {elapsed:.1f} s, {done_tokens / elapsed:,.0f} tokens/s "
          f"with {args.num_proc} process{'es' if args.num_proc != 1 else ''}")


if __name__ == '__main__':
    main()
