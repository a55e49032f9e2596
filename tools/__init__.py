"""Tools around training, each a script run from the repository's root: `python tools/NAME.py`."""
