"""Tiny Shakespeare at the character level: train.bin / val.bin (uint16 ids) and meta.json.

    python data/shakespeare_char/prepare.py [--input PATH] [--out_dir DIR]

The text comes from --input, else <out_dir>/input.txt, else the canonical download. A text given
with --input is copied to <out_dir>/input.txt first, where train.py and other commands (such as
`python data/prepare_text.py --files data/shakespeare_char/input.txt`) find it. The first 90% of
the characters is the training split, the last 10% validation (as nanoGPT). train.py runs this
itself on first use.
"""

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repository: orthogpt/
from orthogpt import chars, errors  # noqa: E402
from orthogpt.files import write_text  # noqa: E402


def keep_input(path, out_dir):
    """Copy the text at path to <out_dir>/input.txt (unless it is that file already)."""
    text = chars.read_text(path, out_dir)  # a missing file: its error, before anything is written
    local = os.path.join(out_dir, 'input.txt')
    if os.path.exists(local) and os.path.samefile(path, local):
        return
    os.makedirs(out_dir, exist_ok=True)
    write_text(local, text)
    print(f"copied {path} to {local}")


@errors.entry
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--input', help='the text file, copied to <out_dir>/input.txt (default: that file, '
                        'else download)')
    parser.add_argument('--out_dir', default=HERE, help='where to write input.txt, the .bin files and meta.json')
    args = parser.parse_args(argv)
    if args.input is not None:
        keep_input(args.input, args.out_dir)
    chars.prepare(None, args.out_dir)


if __name__ == '__main__':
    main()
