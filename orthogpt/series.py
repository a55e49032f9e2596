"""A scaling series (tools/miniseries.py) read back from its runs' folders and fitted: each planned
run's compute and final loss, the FLOPs done and left (for the time left), and per rule the fit of
L(C) = E + A·C^(−α) with its compute multiplier over a baseline's at each size
(orthogpt/scaling.py). The runs come from orthogpt/sweep.py's plan, keyed by (config name, depth,
seed): a folder is never taken for a run by its name."""

import json
import math
import os
import statistics

import numpy as np

from orthogpt import logs, scaling, stats


def keyed(runs):
    """{(config name, depth, seed): run} of a plan's runs (planning.Run), in plan order."""
    return {(run.case.name, run.cfg.depth, run.seed): run for run in runs}


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def inspect(folder):
    """What a run's folder shows (None before its config.json): its config, start record, last
    iteration, final evaluation (the one at max_iters, None before it) and FLOPs per iteration (None
    before its start record)."""
    cfg = read_json(os.path.join(folder, 'config.json'))
    if not cfg:
        return None
    records = logs.read(folder)
    start = next((r for r in records if r.get('event') == 'start'), {})
    final = next((r for r in records if 'val_loss' in r and r['iter'] == cfg['max_iters']), None)
    per_iter = start['flops_per_token'] * start['tokens_per_iter'] if 'flops_per_token' in start else None
    log = os.path.join(folder, 'log.jsonl')
    return dict(folder=folder, cfg=cfg, start=start, final=final, per_iter=per_iter,
                iter=max((r['iter'] for r in records), default=0),
                changed=os.path.getmtime(log) if os.path.exists(log) else 0)


def survey(runs):
    """{key: inspect(its run's folder)} of keyed runs."""
    return {key: inspect(run.out_dir) for key, run in runs.items()}


def flops(runs):
    """(FLOPs done, FLOPs of the whole series or None where unknown) of a survey: the runs'
    training FLOPs; a run not started yet counts the mean of its depth's started runs, or a power
    law in depth through the started depths' means (None with fewer than two)."""
    started = {k: r for k, r in runs.items() if r and r['per_iter']}
    done = sum(r['per_iter'] * min(r['iter'], r['cfg']['max_iters']) for r in started.values())
    by_depth = {}
    for (_, depth, _), r in started.items():
        by_depth.setdefault(depth, []).append(r['per_iter'] * r['cfg']['max_iters'])
    means = {d: statistics.mean(v) for d, v in by_depth.items()}
    if len(means) < 2 and len(started) < len(runs):
        return done, None
    slope, offset = np.polyfit(np.log(list(means)), np.log(list(means.values())), 1) if len(means) > 1 else (0, 0)
    total = sum(started[k]['per_iter'] * started[k]['cfg']['max_iters'] if k in started else
                means.get(k[1], math.exp(offset + slope * math.log(k[1]))) for k in runs)
    return done, total


def finished(runs):
    """How many runs of a survey hold their final evaluation."""
    return sum(1 for r in runs.values() if r and r['final'])


def measured(runs):
    """({config: {depth: [a dict per finished run: seed, folder, loss, bpb, compute, wall_s,
    parameters, flops_per_token]}}, [a dict per run left out: config, depth, seed, folder, why]) of
    a survey."""
    series, missing = {}, []
    for (name, depth, seed), r in runs.items():
        if not r or not r['final'] or r['per_iter'] is None or not math.isfinite(r['final']['val_loss']):
            why = ('not run' if not r else 'not finished' if not r['final'] else
                   'no FLOPs in its log (trained before they were logged)' if r['per_iter'] is None else 'non-finite loss')
            missing.append(dict(config=name, depth=depth, seed=seed, folder=r and r['folder'], why=why))
            continue
        series.setdefault(name, {}).setdefault(depth, []).append(dict(
            seed=seed, folder=r['folder'], loss=r['final']['val_loss'], bpb=r['final'].get('val_bpb'),
            compute=r['per_iter'] * r['final']['iter'], wall_s=r['final'].get('train_s'),
            parameters=r['start'].get('parameters'), flops_per_token=r['start']['flops_per_token']))
    return series, missing


def spread(values):
    """{'mean', 'std' (None for one value), 'n'} of the values that are not None, or None for none."""
    e = stats.estimate([v for v in values if v is not None])
    return None if e is None else dict(mean=e.mean, std=e.spread, n=e.n)


def fitted(sizes):
    """scaling.fit over every run of a config, or {'error': why there is none}."""
    points = [(r['compute'], r['loss']) for runs in sizes.values() for r in runs]
    try:
        return scaling.fit(*zip(*points))
    except scaling.NoFit as e:
        return {'error': str(e)}


def analyse(series, baseline):
    """{config: {'fit': Fit or {'error'}, 'sizes': [{depth, parameters, flops_per_token, compute,
    seeds, runs, loss, bpb, wall_s, multiplier, fitted_multiplier}]}}; the multipliers over
    baseline's fit (None for the baseline itself)."""
    fits = {name: fitted(sizes) for name, sizes in series.items()}
    base = fits.get(baseline, {'error': 'it has no finished run'})
    found = {}
    for name, sizes in series.items():
        rows = []
        for depth, runs in sorted(sizes.items()):
            loss, compute = spread([r['loss'] for r in runs]), statistics.mean(r['compute'] for r in runs)
            row = dict(depth=depth, parameters=runs[0]['parameters'], flops_per_token=runs[0]['flops_per_token'],
                       compute=compute, seeds=[r['seed'] for r in runs], runs=runs, loss=loss,
                       bpb=spread([r['bpb'] for r in runs]), wall_s=spread([r['wall_s'] for r in runs]),
                       multiplier=None, fitted_multiplier=None)
            if name != baseline:
                row['multiplier'], row['fitted_multiplier'] = multipliers(base, fits[name], loss, compute)
            rows.append(row)
        found[name] = dict(fit=fits[name], sizes=rows)
    return found


def multipliers(base, rule, loss, compute):
    """(measured, fitted) scaling.Multiplier of a size over the baseline's fit."""
    if isinstance(base, dict):
        none = scaling.Multiplier(None, None, f"the baseline has no fit: {base['error']}")
        return none, none
    se = loss['std'] / math.sqrt(loss['n']) if loss['std'] is not None else 0.0
    measured_m = scaling.multiplier(base, loss['mean'], compute, se)
    fitted_m = (scaling.fitted_multiplier(base, rule, compute) if not isinstance(rule, dict) else
                scaling.Multiplier(None, None, f"no fit: {rule['error']}"))
    return measured_m, fitted_m
