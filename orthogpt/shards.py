"""Token shards: llm.c's format, so its files and ours interoperate.

A shard is a 256 x int32 header (magic 20240520, version 1, token count, zeros) followed by that
many uint16 GPT-2 token ids. Shards are written atomically (files.write_atomic), so a reader never
sees half of one; read() checks the header against the file size.
"""

import os

import numpy as np

from orthogpt.errors import UserError
from orthogpt.files import write_atomic

MAGIC, VERSION, HEADER_INTS = 20240520, 1, 256
HEADER_BYTES = HEADER_INTS * 4


def write(path, tokens):
    tokens = np.asarray(tokens)
    if tokens.size and int(tokens.max()) > 65535:
        raise UserError(f"token id {int(tokens.max())} does not fit uint16")
    header = np.zeros(HEADER_INTS, dtype=np.int32)
    header[:3] = MAGIC, VERSION, len(tokens)

    def fill(f):
        f.write(header.tobytes())
        f.write(tokens.astype(np.uint16).tobytes())
    write_atomic(path, fill)


def read(path):
    """The tokens of a shard as a read-only memory map, after checking its header."""
    size = os.path.getsize(path)
    if size < HEADER_BYTES:
        raise UserError(f"{path} is {size} bytes, shorter than a shard header: truncated or not a token shard")
    magic, version, count = np.fromfile(path, dtype=np.int32, count=3)
    if magic != MAGIC:
        raise UserError(f"{path} is not a token shard (magic {magic}, expected {MAGIC}); "
                         f"prepare the data with data/prepare_text.py")
    if version != VERSION:
        raise UserError(f"{path} is a version {version} shard; this code reads version {VERSION} (uint16 ids)")
    if size != HEADER_BYTES + 2 * count:
        raise UserError(f"{path} holds {(size - HEADER_BYTES) // 2:,} tokens but its header says {count:,}: "
                         f"truncated; delete it and rerun the preparation, which redoes only missing shards")
    return np.memmap(path, dtype=np.uint16, mode='r', offset=HEADER_BYTES, shape=(int(count),))
