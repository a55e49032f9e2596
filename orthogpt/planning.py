"""A comparison's runs, planned before any of them starts: every config x --set combination (a Case),
x length x seed, each a train.py argv in a folder of its own, OUT/CONFIG-key1value1-...-sSEED (the
names every compare.py gave, so that a half-finished study resumes in them), loaded with
configure.load first, so that a typo stops the comparison before it has spent anything. With
--switch a run is a first phase up to --switch_at and a second phase per switch value that
continues it. tools/compare.py's docstring tells the protocol; orthogpt/sweep.py runs the plan."""

import itertools
import os
from dataclasses import dataclass
from typing import Any

import configure
from orthogpt import resume
from orthogpt.errors import UserError

TUNING_SEED = 1337  # train.py's default seed: the one --tune tunes on
SEEDS = list(range(1, 100))  # the reported ones


@dataclass(frozen=True)
class Case:
    """A config at one combination of --set values; its runs make a row (a row per length, or per
    switch value, with --lengths or --switch)."""
    config: str  # the config file
    name: str  # its file name without .py: how --per, --baseline and the labels call it
    set: tuple  # its --set values, ((key, value), ...): the keys a --baseline pairs rows over
    setting: tuple  # its --per settings, then its --set values (then, once tuned, its --tune values)
    label: str  # its rows' label


@dataclass(eq=False)  # a run is its folder: two runs with the same fields are still two runs
class Run:
    """One train.py process in its own folder, OUT/name. A first phase (--switch) counts in no row:
    its second phases continue it, one per switch value."""
    name: str
    seed: int
    argv: list  # train.py's arguments
    out_dir: str
    cfg: Any  # configure.load(argv), checked before any run starts
    case: Case
    group: str | None  # the label of the row it counts in; None for a first phase
    length: int | None = None  # its max_iters under --lengths
    after: 'Run | None' = None  # the first phase a second phase continues
    reset: bool = False  # --switch_reset: a fresh optimizer and schedule after the switch
    switch: tuple = ()  # a second phase's --switch values


def parse_set(text):
    key, sep, values = text.partition('=')
    if not sep or not values:
        raise UserError(f"--set {text!r}: write --set key=v1,v2,...")
    return [(key, v) for v in values.split(',')]


def parse_per(text):
    """--per 'CONFIG[ key=value ...]:KEY=VALUE', a setting for the runs of one config (and, where
    given, of its --set values) alone: (config name, {key: value} it selects, (key, value))."""
    selector, colon, kv = text.partition(':')
    key, eq, value = kv.partition('=')
    stem, *picks = selector.split() or ['']
    if not stem or not colon or not eq or not key or not value or not all('=' in p for p in picks):
        raise UserError(f"--per {text!r}: write --per CONFIG:key=value or --per 'CONFIG k=v:key=value' (CONFIG: a "
                        f"config file's name, k=v: a --set value)")
    return config_name(stem), dict(p.split('=', 1) for p in picks), (key, value)


def config_name(path):
    return os.path.splitext(os.path.basename(path))[0]


def load(argv, name):
    try:
        return configure.load(argv)
    except UserError as e:
        raise UserError(f"{e} (run {name})") from None


def label_of(name, setting):
    return name + ''.join(f" {k}={v}" for k, v in setting)


def cases(spec):
    """Every config x --set combination, a Case each, with the --per settings that select it."""
    settings = list(itertools.product(*[parse_set(s) for s in spec.set])) or [()]
    per = [parse_per(p) for p in spec.per]
    names = {config_name(c) for c in spec.configs}
    for text, (name, picks, _) in zip(spec.per, per):
        if name not in names or not any(picks.items() <= dict(values).items() for values in settings):
            raise UserError(f"--per {text!r} selects no run: the configs are {', '.join(sorted(names))}"
                            + (f", the --set values {', '.join(s for s in spec.set)}" if spec.set else ''))
    found = []
    for config in spec.configs:
        name = config_name(config)
        for values in settings:
            setting = (*(kv for n, picks, kv in per if n == name and picks.items() <= dict(values).items()), *values)
            found.append(Case(config, name, values, setting, label_of(name, setting)))
    return found


def plan(spec, todo, seeds, lengths=(None,)):
    """The runs of each case in todo x length x seed (with --switch, a first phase and its second
    phases), each argv checked with configure.load first."""
    switches = list(itertools.product(*[parse_set(s) for s in spec.switch])) if spec.switch else []
    runs = []
    for case in todo:
        for length in lengths:
            setting = (*case.setting, *((('max_iters', length),) if length else ()))
            label = label_of(case.name, setting)
            stem = label.replace(' ', '-').replace('=', '')
            argv = [case.config, *spec.stack, *spec.extra, *(f'--{k}={v}' for k, v in setting)]
            for seed in seeds:
                if switches:
                    add_phases(spec, runs, switches, argv, stem, seed, case=case, group=label)
                else:
                    add_run(spec, runs, f'{stem}-s{seed}', seed, argv, case=case, group=label, length=length)
    return runs


def add_run(spec, runs, name, seed, argv, **where):
    """Appends to runs and returns the run of argv in OUT/name, its config loaded."""
    if any(r.name == name for r in runs):
        raise UserError(f"two runs would share the folder {name}: give the configs distinct file names")
    out_dir = os.path.join(spec.out, name)
    argv = [*argv, f'--seed={seed}', f'--out_dir={out_dir}']
    runs.append(Run(name, seed, argv, out_dir, load(argv, name), **where))
    return runs[-1]


def add_phases(spec, runs, switches, argv, stem, seed, case, group):
    """A first phase up to --switch_at (in the full run's schedule, or a complete run of its own
    with --switch_reset), then a second phase per --switch value that continues it to max_iters."""
    cfg = load(argv, stem)
    if not 0 < spec.switch_at < cfg.max_iters:
        raise UserError(f"--switch_at={spec.switch_at} must lie between 0 and max_iters={cfg.max_iters}")
    decay = cfg.max_iters if cfg.lr_decay_iters is None else cfg.lr_decay_iters
    first_decay = spec.switch_at if spec.switch_reset else decay
    first = add_run(spec, runs, f'{stem}-first{spec.switch_at}-s{seed}', seed,
                    [*argv, f'--max_iters={spec.switch_at}', f'--lr_decay_iters={first_decay}'], case=case, group=None)
    for switch in switches:
        second = add_run(spec, runs, f"{stem}-then-{'-'.join(f'{k}{v}' for k, v in switch)}-s{seed}", seed,
                         [*argv, *(f'--{k}={v}' for k, v in switch), f'--lr_decay_iters={decay}'], case=case,
                         group=group + ' → ' + ' '.join(f"{k}={v}" for k, v in switch), after=first,
                         reset=spec.switch_reset, switch=tuple(switch))
        problems = resume.problems(first.cfg, second.cfg)
        if problems:
            raise UserError(f"--switch: {second.name} cannot continue {first.name}: " + '; '.join(problems))
