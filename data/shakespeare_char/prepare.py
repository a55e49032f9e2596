"""Tiny Shakespeare at the character level: train.bin / val.bin (uint16 ids) and meta.json.

    python data/shakespeare_char/prepare.py [--input PATH] [--out_dir DIR]

The text comes from --input, else <out_dir>/input.txt, else the canonical download. The first
90% of the characters is the training split, the last 10% validation (as nanoGPT).
"""

import argparse
import json
import os
import sys
import urllib.request

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
URL = 'https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt'


class PrepareError(RuntimeError):
    pass


def read_text(input_path, out_dir):
    if input_path is not None:
        if not os.path.isfile(input_path):
            raise PrepareError(f"--input {input_path}: no such file")
        with open(input_path, encoding='utf-8') as f:
            return f.read()
    local = os.path.join(out_dir, 'input.txt')
    if not os.path.isfile(local):
        print(f"downloading Tiny Shakespeare from {URL}")
        try:
            with urllib.request.urlopen(URL, timeout=30) as r:
                text = r.read().decode('utf-8')
        except Exception as e:
            raise PrepareError(
                f"could not download Tiny Shakespeare ({e}).\n"
                f"Put the text at {local}, or run: python data/shakespeare_char/prepare.py --input PATH") from None
        write_atomic(local, text.encode('utf-8'))
    with open(local, encoding='utf-8') as f:
        return f.read()


def write_atomic(path, data):
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, 'wb') as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def prepare(input_path=None, out_dir=HERE):
    """Write train.bin, val.bin and meta.json to out_dir; return the meta dict."""
    os.makedirs(out_dir, exist_ok=True)
    text = read_text(input_path, out_dir)
    if len(text) < 2:
        raise PrepareError(f"the input has {len(text)} characters; a training text needs more")
    chars = sorted(set(text))
    if len(chars) > 65536:
        raise PrepareError(f"{len(chars)} distinct characters do not fit uint16 ids")
    stoi = {c: i for i, c in enumerate(chars)}
    ids = np.array([stoi[c] for c in text], dtype=np.uint16)
    n_train = int(0.9 * len(ids))
    meta = {'vocab_size': len(chars), 'itos': chars, 'stoi': stoi,
            'train_tokens': n_train, 'val_tokens': len(ids) - n_train}
    write_atomic(os.path.join(out_dir, 'train.bin'), ids[:n_train].tobytes())
    write_atomic(os.path.join(out_dir, 'val.bin'), ids[n_train:].tobytes())
    # meta.json last: its presence marks a finished preparation
    write_atomic(os.path.join(out_dir, 'meta.json'), json.dumps(meta, ensure_ascii=False).encode('utf-8'))
    print(f"{len(text):,} characters, vocabulary {len(chars)}: "
          f"{n_train:,} train and {len(ids) - n_train:,} val tokens in {out_dir}")
    return meta


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--input', help='the text file (default: <out_dir>/input.txt, else download)')
    parser.add_argument('--out_dir', default=HERE, help='where to write the .bin files and meta.json')
    args = parser.parse_args(argv)
    try:
        prepare(args.input, args.out_dir)
    except PrepareError as e:
        sys.exit(f"error: {e}")


if __name__ == '__main__':
    main()
