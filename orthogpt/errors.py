"""One exception for what a user can fix, and the entry points that turn it into one line.

Anything that can go wrong because of the user's input or machine (a config, a missing dataset, a
damaged checkpoint, no network, out of memory) raises UserError with a message that names the
problem and the fix. A script's main() is wrapped in `entry`, which prints it as `error: ...` and
exits with status 1 (and a Ctrl-C the script leaves unhandled as `interrupted`, status 130); under torchrun the message also goes to the error file torchrun reads, so
that its failure report ends with it rather than with "To enable traceback see ...".
"""

import functools
import json
import os
import re
import sys
import time

from configure.errors import UserError


def entry(main):
    """main(argv=None), with a UserError ending the process as `error: ...`, exit status 1, and a
    Ctrl-C that the script did not handle as `interrupted`, exit status 130."""
    @functools.wraps(main)
    def run(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            raise SystemExit(130) from None
        except UserError as e:
            text = f"error: {e}"
            if os.environ.get('TORCHELASTIC_ERROR_FILE'):
                with open(os.environ['TORCHELASTIC_ERROR_FILE'], 'w') as f:
                    json.dump({'message': text, 'timestamp': int(time.time())}, f)
            raise SystemExit(text) from None
    return run


def one_line(text, limit=200):
    """A library's message for one of ours: on one line, cut after its last whole sentence within
    `limit` characters (the first sentence whole, however long), never in the middle of one."""
    first, *rest = re.split(r'(?<=[.!?:])\s+(?=[A-Z])', ' '.join(text.split()))
    for sentence in rest:
        if len(first) + 1 + len(sentence) > limit:
            break
        first += ' ' + sentence
    return first
