"""Character-level text (Tiny Shakespeare): train.bin / val.bin (uint16 ids) and meta.json.

The text comes from a given file, else <out_dir>/input.txt, else the canonical download. The
first 90% of the characters is the training split, the last 10% validation (as nanoGPT). meta.json
holds the vocabulary (itos, stoi) and is written last: its presence marks a finished preparation.
"""

import json
import os
import urllib.request

import numpy as np

from orthogpt import windows
from orthogpt.errors import UserError
from orthogpt.files import write_bytes, write_text

URL = 'https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt'


def read_text(input_path, out_dir):
    if input_path is not None:
        if not os.path.isfile(input_path):
            raise UserError(f"--input {input_path}: no such file")
        with open(input_path, encoding='utf-8') as f:
            return f.read()
    local = os.path.join(out_dir, 'input.txt')
    if not os.path.isfile(local):
        print(f"downloading Tiny Shakespeare from {URL}")
        try:
            with urllib.request.urlopen(URL, timeout=30) as r:
                text = r.read().decode('utf-8')
        except Exception as e:
            raise UserError(f"could not download Tiny Shakespeare ({e}).\nPut the text at {local}, or run: "
                            f"python data/shakespeare_char/prepare.py --input PATH") from None
        write_text(local, text)
    with open(local, encoding='utf-8') as f:
        return f.read()


def ready(out_dir):
    """Prepare out_dir (from its input.txt, else the download) unless it holds a finished preparation: its token files,
    and meta.json (written last)."""
    if not (windows.find(out_dir) and os.path.isfile(os.path.join(out_dir, 'meta.json'))):
        prepare(None, out_dir)


def prepare(input_path, out_dir):
    """Write train.bin, val.bin and meta.json to out_dir; return the meta dict."""
    text = read_text(input_path, out_dir)
    if len(text) < 2:
        raise UserError(f"the input has {len(text)} characters; a training text needs more")
    chars = sorted(set(text))
    if len(chars) > 65536:
        raise UserError(f"{len(chars)} distinct characters do not fit uint16 ids")
    stoi = {c: i for i, c in enumerate(chars)}
    ids = np.array([stoi[c] for c in text], dtype=np.uint16)
    n_train = int(0.9 * len(ids))
    meta = {'vocab_size': len(chars), 'itos': chars, 'stoi': stoi,
            'train_tokens': n_train, 'val_tokens': len(ids) - n_train}
    write_bytes(os.path.join(out_dir, 'train.bin'), ids[:n_train].tobytes())
    write_bytes(os.path.join(out_dir, 'val.bin'), ids[n_train:].tobytes())
    write_text(os.path.join(out_dir, 'meta.json'), json.dumps(meta, ensure_ascii=False))
    print(f"{len(text):,} characters, vocabulary {len(chars)}: "
          f"{n_train:,} train and {len(ids) - n_train:,} val tokens in {out_dir}")
    return meta
