"""Tiny Shakespeare at the character level: train.bin / val.bin (uint16 ids) and meta.json.

    python data/shakespeare_char/prepare.py [--input PATH] [--out_dir DIR]

The text comes from --input, else <out_dir>/input.txt, else the canonical download. The first
90% of the characters is the training split, the last 10% validation (as nanoGPT). train.py runs
this itself on first use.
"""

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repository: orthogpt/
from orthogpt import chars, errors  # noqa: E402


@errors.entry
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--input', help='the text file (default: <out_dir>/input.txt, else download)')
    parser.add_argument('--out_dir', default=HERE, help='where to write the .bin files and meta.json')
    args = parser.parse_args(argv)
    chars.prepare(args.input, args.out_dir)


if __name__ == '__main__':
    main()
