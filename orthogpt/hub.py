"""The Hugging Face hub, reachable or not. Offline, huggingface_hub and datasets retry each
request with back-off for tens of seconds before they fail; where the hub cannot be reached they
are told so first, and read their caches alone: a cached model or dataset still loads, a missing
one fails at once."""

import os
import socket

HOST = 'huggingface.co'


def offline():
    """Whether the hub is out of reach: HF_HUB_OFFLINE set, or its name does not resolve. Then
    HF_HUB_OFFLINE and HF_DATASETS_OFFLINE are set, for the libraries imported after this."""
    if os.environ.get('HF_HUB_OFFLINE', '0').lower() not in ('', '0', 'false', 'no'):
        found = True
    else:
        try:
            socket.getaddrinfo(HOST, 443)
            found = False
        except OSError:
            found = True
    if found:
        os.environ['HF_HUB_OFFLINE'] = os.environ['HF_DATASETS_OFFLINE'] = '1'
    return found
