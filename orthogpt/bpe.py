"""GPT-2's byte-pair encoding, through tiktoken, or one line that says how to get its files.

tiktoken downloads the two files of the encoding (vocab.bpe and encoder.json) on first use and
keeps them in its cache: TIKTOKEN_CACHE_DIR, else DATA_GYM_CACHE_DIR, else <tmp>/data-gym-cache.
"""

import hashlib
import os
import tempfile

from orthogpt.errors import UserError

URLS = {name: f'https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/{name}'
        for name in ('vocab.bpe', 'encoder.json')}


def encoding():
    """tiktoken's 'gpt2' encoding; a UserError where its files can be neither read nor downloaded."""
    import tiktoken
    try:
        return tiktoken.get_encoding('gpt2')
    except Exception as e:  # requests' ConnectionError offline, a cache file that does not verify, ...
        raise UserError(f"the GPT-2 BPE files could not be read or downloaded ({type(e).__name__}: {str(e)[:120]}); "
                        f"set TIKTOKEN_CACHE_DIR to a folder holding them (tiktoken's cache of {URLS['vocab.bpe']} "
                        f"and {URLS['encoder.json']}), or allow access to that site") from None


def cached_files():
    """{'vocab.bpe': path, 'encoder.json': path} where tiktoken's cache holds both, else {}."""
    folder = (os.environ.get('TIKTOKEN_CACHE_DIR') or os.environ.get('DATA_GYM_CACHE_DIR')
              or os.path.join(tempfile.gettempdir(), 'data-gym-cache'))
    paths = {name: os.path.join(folder, hashlib.sha1(url.encode()).hexdigest()) for name, url in URLS.items()}
    return paths if all(os.path.isfile(p) for p in paths.values()) else {}
