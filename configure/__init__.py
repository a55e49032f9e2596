"""Typed configuration: config files (plain Python assignments) and --key=value overrides.

    cfg = configure.load(['config/shakespeare_rot.py', 'config/cpu.py', '--max_iters=500'])

Files and overrides apply left to right. A file runs with the keys set so far as globals, so
it may read them (`out_dir = out_dir + '-cpu'`); names starting with '_' are private helpers.
Unknown keys, values of the wrong type, impossible shapes and broken files raise UserError
with the file (and line) or override at fault and, for a typo, the closest valid key.
"""

from configure.loader import from_dict, load, usage
from configure.schema import Config, build_model, model_config

__all__ = ['Config', 'build_model', 'from_dict', 'load', 'model_config', 'usage']
