"""Load config files and --key=value overrides into a validated Config."""

import difflib
import importlib
import inspect
import math
import os
import re
import runpy
import sys
import traceback
import types
import typing
from dataclasses import MISSING, asdict, fields

from configure.schema import MODELS, Config, block_parameters
from model import RESIDUALS
from configure.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HINTS = {k: v for k, v in typing.get_type_hints(Config).items() if k != 'options'}
CHOICES = {f.name: f.metadata['choices'] for f in fields(Config) if 'choices' in f.metadata}  # registries
_GPT, _VIT = ({f.name for f in fields(MODELS[m][1])} for m in ('gpt', 'vit'))
MODEL_KEYS = {'gpt': _GPT - _VIT, 'vit': _VIT - _GPT}  # the keys of one model alone


def closest(word, choices, cutoff=0.5):
    """'; did you mean X?' for the choice nearest a mistyped word, or ''."""
    match = difflib.get_close_matches(word, list(choices), n=1, cutoff=cutoff)
    return f"; did you mean {match[0]!r}?" if match else ""


def option_hints():
    """{key: type} of every option of every registered residual rule (a rule's Options)."""
    hints = {}
    for rule in RESIDUALS.values():
        for key, hint in typing.get_type_hints(rule.Options).items():
            hints.setdefault(key, hint)
    return hints


def import_rule_module(name):
    """Import the module that defines a rule outside model.py (the key rule_module), which registers it there."""
    if name == '__main__':
        raise UserError("the rule was defined in the script that trained it (__main__), which no other program can "
                        "import: define it in a module of its own and name it with --rule_module=MODULE")
    try:
        importlib.import_module(name)
    except Exception as e:  # not found, or failing as it runs
        raise UserError(f"rule_module={name!r} cannot be imported here ({type(e).__name__}: {e}); put {name}.py "
                        f"beside train.py, or its folder on the path (PYTHONPATH=DIR)") from None


def type_name(hint, key=None):
    if key in CHOICES:
        return ' | '.join(repr(c) for c in CHOICES[key])
    if typing.get_origin(hint) is typing.Literal:
        return ' | '.join(repr(a) for a in typing.get_args(hint))
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        return ' | '.join(type_name(a) for a in typing.get_args(hint))
    if typing.get_origin(hint) is tuple:
        return 'tuple of int (e.g. 0,1,4)'
    return 'None' if hint is type(None) else hint.__name__


def coerce(key, value, hint):
    """Check a Python value against the field's type; return it normalised (list -> tuple, int -> float)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return coerce(key, value, arg)
            except UserError as e:
                errors.append(e)
        raise errors[0]
    if origin is typing.Literal:
        if value in args:
            return value
        raise UserError(f"{key}={value!r} is not one of {type_name(hint)}{closest(str(value), map(str, args))}")
    if key in CHOICES and isinstance(value, str) and value not in CHOICES[key]:
        own = "; a rule of your own: name its module first, --rule_module=MODULE" if key == 'residual' else ''
        raise UserError(f"{key}={value!r} is not one of {type_name(hint, key)}"
                        f"{closest(value, CHOICES[key], cutoff=0.6)}{own}")
    if origin is tuple:
        if isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return tuple(value)
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise UserError(f"{key}={value} must be a finite number")
            return float(value)
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif isinstance(value, hint):
        return value
    raise UserError(f"{key} expects {type_name(hint, key)}, got {type(value).__name__} {value!r}")


def parse(key, text, hint):
    """Turn the text of a --key=value override into a value of the field's type."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        if type(None) in args and text in ('None', 'none', 'null'):
            return None
        hint = next(a for a in args if a is not type(None))
        origin, args = typing.get_origin(hint), typing.get_args(hint)
    try:
        if hint is bool:
            lowered = text.lower()
            if lowered not in ('true', 'false', '1', '0', 'yes', 'no'):
                raise ValueError
            return lowered in ('true', '1', 'yes')
        if hint in (int, float):
            return coerce(key, hint(text), hint)
        if origin is tuple:
            items = text.strip('()[] ').replace(',', ' ').split()
            return tuple(int(t) for t in items)
    except UserError:
        raise
    except ValueError:
        raise UserError(f"--{key}={text}: {key} expects {type_name(hint)}") from None
    if len(text) >= 2 and text[0] == text[-1] and text[0] in '\'"':
        text = text[1:-1]
    return coerce(key, text, hint)


def hint_of(key, where):
    """The type of a config key or of a registered rule's option; an unknown key is refused."""
    options = option_hints()
    if key in HINTS or key in options:
        return HINTS.get(key) or options[key]
    raise UserError(f"unknown config key {key!r} in {where}{closest(key, [*HINTS, *options])}"
                    f" (all keys: python train.py --help)")


def config_files(path):
    """The config files beside `path` (or, for a bare name or a folder without any, the project's
    config/), the closest to it first."""
    def listed(folder):
        return [os.path.join(folder, f) for f in sorted(os.listdir(folder))
                if f.endswith('.py') and f != '__init__.py'] if os.path.isdir(folder) else []
    files = os.path.dirname(path) and listed(os.path.dirname(path)) or listed(os.path.relpath(os.path.join(ROOT, 'config')))
    ratio = {f: difflib.SequenceMatcher(None, os.path.basename(path), os.path.basename(f)).ratio() for f in files}
    files.sort(key=lambda f: -ratio[f])
    near = f"did you mean {files[0]!r}? " if files and ratio[files[0]] >= 0.5 else ''
    return f"{near}{'The' if near else 'the'} config files, closest first:\n  " + '\n  '.join(files)


def run_file(path, values):
    """Run a config file with the current values as globals; return the keys it set."""
    if not os.path.isfile(path):
        raise UserError(f"config file {path!r} not found; {config_files(path)}")
    if ROOT not in sys.path:  # lets config files import shared settings: from config.x import *
        sys.path.insert(0, ROOT)
    try:
        result = runpy.run_path(path, init_globals=dict(values))
    except SyntaxError as e:
        raise UserError(f"{path}:{e.lineno}: syntax error: {e.msg}\n    {(e.text or '').strip()}") from None
    except Exception as e:
        frames = [f for f in traceback.extract_tb(e.__traceback__)
                  if os.path.abspath(f.filename) == os.path.abspath(path)]
        line = f":{frames[-1].lineno}" if frames else ""
        raise UserError(f"{path}{line}: {type(e).__name__}: {e}") from None
    updates = {}
    for key, value in result.items():
        if key.startswith('_') or isinstance(value, types.ModuleType) or callable(value):
            continue
        if key not in values or value is not values[key]:
            try:
                updates[key] = coerce(key, value, hint_of(key, path))
            except UserError as e:
                raise UserError(f"{path}: {e}") from None
    return updates


def build(values):
    """A Config from flat values: a rule's options go into `options`, those of the chosen rule
    kept (the others' were checked for their types and are not the run's)."""
    values = dict(values)
    rule = RESIDUALS.get(values['residual'])
    declared = {f.name for f in fields(rule.Options)} if rule else set()
    values['options'] = {k: values.pop(k) for k in list(values) if k not in HINTS and k in declared}
    values = {k: v for k, v in values.items() if k in HINTS or k == 'options'}
    try:
        return Config(**values)
    except ValueError as e:
        raise UserError(str(e)) from None


def load(argv, base=None, given=None):
    """Config from a list of config-file paths and --key=value overrides, applied left to right
    to the defaults (or to the Config `base`). A set passed as `given` receives the keys that a
    file or an override set, at whatever value ('options' too, when a rule option was set)."""
    values = flat(base) if base is not None else {f.name: f.default for f in fields(Config)
                                                    if f.default is not MISSING}
    given = set() if given is None else given
    sizing = None  # (the width learning_rate was set for, the keys set since depth)
    for arg in argv:
        if arg.startswith('--'):
            key, eq, text = arg[2:].partition('=')
            if not eq:
                raise UserError(f"override {arg!r} has no value; write --{key}=VALUE")
            updates = {key: parse(key, text, hint_of(key, f"override {arg!r}"))}
        elif '=' in arg and not os.path.exists(arg):
            raise UserError(f"{arg!r} is neither a config file nor an override; did you mean --{arg}?")
        else:
            updates = run_file(arg, values)
        if updates.get('rule_module'):  # its rule and the rule's keys exist from here on
            import_rule_module(updates['rule_module'])
        values.update(updates)
        given.update(updates)
        if 'depth' in updates:
            sizing = values['n_embd'], set(updates) - {'depth'}
        elif sizing:
            sizing[1].update(updates)
    if given & set(option_hints()):
        given.add('options')
    if sizing and values['depth']:
        values = sized(values, *sizing)
    cfg = build(values)
    check_model_keys(cfg, given)
    return cfg


def check_model_keys(cfg, keys):
    """Refuse keys of the model that cfg does not build: a ViT's in a GPT run, or the reverse."""
    other = 'vit' if cfg.model == 'gpt' else 'gpt'
    found = sorted(set(keys) & MODEL_KEYS[other])
    if found:
        raise UserError(f"{', '.join(found)}: {'keys' if len(found) > 1 else 'a key'} of model={other!r}, and this run "
                        f"builds model={cfg.model!r} (dataset={cfg.dataset!r}), which has no such key; remove "
                        f"{'them' if len(found) > 1 else 'it'}, or set --model={other} and a dataset of its kind")


def sized(values, width, later):
    """The keys that follow from depth, as nanochat's one knob, but those set after it:
    - n_layer = depth, n_embd = aspect x depth, n_head = depth (heads aspect wide);
    - learning_rate, set for `width`, times sqrt(width / n_embd): AdamW's rate as 1/sqrt(width), as
      nanochat scales it (Muon's update is normalised per matrix and keeps muon_lr);
    - max_iters for tokens_per_param tokens per parameter of the blocks (J. Hoffmann et al.,
      "Training Compute-Optimal Large Language Models", arXiv:2203.15556: about 20). Embeddings
      are not counted (J. Kaplan et al., arXiv:2001.08361), so that a character-level and a BPE
      vocabulary give one budget."""
    values = dict(values)
    d = values['depth']
    values.update({k: v for k, v in dict(n_layer=d, n_head=d, n_embd=values['aspect'] * d).items() if k not in later})
    if 'learning_rate' not in later:
        values['learning_rate'] *= math.sqrt(width / values['n_embd'])
    if values['tokens_per_param'] and 'max_iters' not in later:
        blocks = block_parameters(build(values))
        tokens = values['gradient_accumulation_steps'] * values['batch_size'] * values['block_size']
        values['max_iters'] = math.ceil(values['tokens_per_param'] * blocks / tokens)
    return values


def flat(cfg):
    """A Config's values with its rule's options as keys of their own."""
    values = asdict(cfg)
    values.update(values.pop('options'))
    return values


def from_dict(data):
    """Config from plain data (a checkpoint's JSON), checked like a config file; the other model's
    keys, which it holds at their defaults, may not differ from them."""
    if data.get('rule_module') and data.get('residual') not in RESIDUALS:
        import_rule_module(data['rule_module'])
    values = {}
    for key, value in {**data, **data.get('options', {})}.items():
        if key != 'options':
            values[key] = coerce(key, value, hint_of(key, 'saved config'))
    cfg = build(values)
    check_model_keys(cfg, {f.name for f in fields(Config) if f.name in values and values[f.name] != f.default})
    return cfg


def comments(cls):
    """{field: its trailing comment} of a dataclass and its bases, from their source."""
    found = {}
    for klass in reversed(cls.__mro__):
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        found.update(re.findall(r'^\s+(\w+): [^\n]*?  # ([^\n]*)$', source, re.M))
    return found


def usage():
    """Every key as key=default, its comment and its type: the config's, then each rule's options."""
    def line(key, default, hint, note):
        return f"  {f'{key}={default!r}':<36} {note} [{type_name(hint, key)}]"
    notes = comments(Config)
    lines = ["usage: python train.py [CONFIG_FILE ...] [--key=value ...]", "", "keys (=default):"]
    lines += [line(f.name, f.default if f.default is not MISSING else f.default_factory(), HINTS[f.name],
                   notes.get(f.name, '')) for f in fields(Config) if f.name in HINTS]
    for name, rule in RESIDUALS.items():
        hints, notes = typing.get_type_hints(rule.Options), comments(rule.Options)
        if hints:
            lines += ["", f"options of residual={name!r}:"]
            lines += [line(f.name, f.default, hints[f.name], notes.get(f.name, '')) for f in fields(rule.Options)]
    return '\n'.join(lines)
