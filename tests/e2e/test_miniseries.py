"""tools/miniseries.py: its table, json and figure from run folders of known laws (written here, no
training), found through the engine's plan, its refusals of bad input, and end to end on tiny models:
a series interrupted by SIGTERM that the same command finishes without rerunning what had finished,
and a Ctrl-C that each run gets once."""

import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time

import pytest

from orthogpt import progress
from orthogpt.errors import UserError
from orthogpt import logs, series, sweep
from tools import miniseries

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
CONFIGS = [os.path.join(ROOT, 'config', f'shakespeare_{r}.py') for r in ('add', 'rot', 'ngpt')]
E, A, ALPHA = 1.4, 300.0, 0.3  # the baseline's law
TOKENS = 1000  # tokens per iteration


def law(compute):
    return E + A * compute ** -ALPHA


def compute_of(depth, iters=100):
    return flops_of(depth) * TOKENS * iters


def flops_of(depth):
    return 6.0 * 10 ** (depth + 3)


def write_run(folder, depth, seed, loss, iters=100, finished=True, bpb=True):
    """A run folder as train.py leaves it: config.json, and log.jsonl's start record and evaluations
    (FLOPs per token flops_of(depth), TOKENS a step); unfinished: half way."""
    os.makedirs(folder)
    with open(os.path.join(folder, 'config.json'), 'w') as f:
        json.dump(dict(depth=depth, seed=seed, max_iters=iters, n_layer=depth), f)
    records = [dict(iter=0, event='start', parameters=10 ** (depth + 3), flops_per_token=flops_of(depth),
                    tokens_per_iter=TOKENS), dict(iter=iters // 2, val_loss=loss + 0.5, train_s=depth * 5.0)]
    if finished:
        records.append(dict(iter=iters, val_loss=loss, train_s=depth * 10.0 + seed,
                            **({'val_bpb': loss / math.log(2) * 0.3} if bpb else {})))
    with open(os.path.join(folder, 'log.jsonl'), 'w') as f:
        f.write(''.join(json.dumps(r) + '\n' for r in records))


@pytest.fixture
def out(tmp_path):
    """OUT with additive on its law (± 0.01 over the two seeds), rotation at the loss additive's law
    reaches with 4x the compute, nGPT below additive's asymptote at its largest size; rotation's depth 4
    seed 2 half done; folders of another size (depth 9) and of another config's name."""
    out = tmp_path / 'out'
    for depth in (2, 3, 4):
        for seed in (1, 2):
            noise, c = (0.01 if seed == 1 else -0.01), compute_of(depth)
            write_run(out / f'shakespeare_add-depth{depth}-s{seed}', depth, seed, law(c) + noise)
            write_run(out / f'shakespeare_rot-depth{depth}-s{seed}', depth, seed, law(4 * c),
                      finished=(depth, seed) != (4, 2))
            write_run(out / f'shakespeare_ngpt-depth{depth}-s{seed}', depth, seed, {2: 2.0, 3: 1.6, 4: 1.3}[depth],
                      bpb=False)
    write_run(out / 'shakespeare_add-depth9-s1', 9, 1, 1.0)
    write_run(out / 'other-depth2-s1', 2, 1, 1.0)
    return out


def args_of(out, *more):
    return [*CONFIGS, '--depths=2,3,4', '--seeds=2', f'--out={out}', *more]


def planned(argv):
    """(miniseries' arguments, its runs keyed (config, depth, seed)) of a command line."""
    args, spec = miniseries.parse_args(argv)
    return args, series.keyed(sweep.planned(spec))


def test_the_report_fits_each_rule_and_gives_the_multipliers_of_known_laws(out):
    args, runs = planned(args_of(out))
    results = miniseries.report(args, runs, 'python tools/miniseries.py ...')
    add, rot, ngpt = (results[f'shakespeare_{r}'] for r in ('add', 'rot', 'ngpt'))
    assert (add['fit'].E, add['fit'].A, add['fit'].alpha) == pytest.approx((E, A, ALPHA), rel=1e-6)
    assert add['fit'].n == 6 and add['fit'].se is not None  # seeds apart: six points, residuals ± 0.01
    for size in rot['sizes']:
        assert size['multiplier'].value == pytest.approx(4.0, rel=1e-6)
        assert size['fitted_multiplier'].value == pytest.approx(4.0, rel=1e-4)
    assert [s['seeds'] for s in rot['sizes']] == [[1, 2], [1, 2], [1]]  # depth 4 seed 2 did not finish
    assert rot['sizes'][2]['loss']['std'] is None
    below = ngpt['sizes'][2]['multiplier']
    assert below.value is None and 'below the baseline' in below.note
    text = (out / 'miniseries.md').read_text()
    rows = [line for line in text.splitlines() if line.startswith('| `shakespeare_')]
    assert len(rows) == 9 + 3  # 3 rules x 3 sizes, then a fit each
    add2 = rows[0].split(' | ')
    c2 = compute_of(2)
    assert add2[1:6] == ['2', '100,000', '6e+05', f'{c2:.3g}', '2']
    assert add2[6] == f"{law(c2):.4f} ± {statistics.stdev([law(c2) + 0.01, law(c2) - 0.01]):.4f}"
    assert add2[9:] == ['baseline', 'baseline |']
    assert rows[3].split(' | ')[9].startswith('4x ± ') and rows[3].split(' | ')[10].startswith('4x ± ')
    note = next(line for line in text.splitlines() if "loss 1.3000 is at or below the baseline's asymptote E = 1.4000"
                in line)
    assert rows[8].split(' | ')[9] == f"none {note.split()[0]}"
    assert '- `shakespeare_rot` depth 4 seed 2: not finished' in text
    assert 'depth 9' not in text and 'other' not in text
    data = json.loads((out / 'miniseries.json').read_text())
    assert data['baseline'] == 'shakespeare_add' and data['rules']['shakespeare_add']['fit']['alpha'] == pytest.approx(ALPHA)
    assert data['rules']['shakespeare_rot']['sizes'][0]['multiplier']['value'] == pytest.approx(4.0)
    assert data['rules']['shakespeare_ngpt']['sizes'][0]['bpb'] is None
    assert data['rules']['shakespeare_add']['sizes'][0]['bpb']['mean'] == pytest.approx(law(c2) / math.log(2) * 0.3)
    assert data['missing'] == [dict(config='shakespeare_rot', depth=4, seed=2, folder=str(out / 'shakespeare_rot-depth4-s2'),
                                    why='not finished')]
    assert (out / 'miniseries.png').stat().st_size > 10_000


def test_a_rule_without_a_fit_says_why_and_the_baseline_named_is_used(out):
    args, runs = planned(args_of(out, '--baseline=config/shakespeare_rot.py'))
    for seed in (1, 2):  # rotation's sizes 3 and 4 at one loss: no law through them
        for depth in (2, 3):
            path = out / f'shakespeare_add-depth{depth}-s{seed}' / 'log.jsonl'
            path.write_text(path.read_text().replace('"val_loss": ', '"val_loss": 1.0 + 0 * ', 1))
    results = miniseries.report(args, runs, 'cmd')
    assert results['shakespeare_rot']['sizes'][0]['multiplier'] is None  # the baseline now
    assert results['shakespeare_add']['sizes'][0]['multiplier'].value is not None
    text = (out / 'miniseries.md').read_text()
    assert 'compute multiplier over `shakespeare_rot`' in text


def test_the_progress_line_counts_finished_runs_and_estimates_the_time_left(out):
    """Rotation's depth 4 seed 2 is half done (its log just written: running); the FLOPs done went from 0 to all but
    its second half in the last 60 s, so the rest takes 60 s x 3e12 / 3.696e13 FLOPs, 5 s."""
    runs = series.survey(planned(args_of(out))[1])
    done, total = series.flops(runs)
    assert total - done == pytest.approx(compute_of(4, iters=50))  # its second half
    assert total == pytest.approx(6 * sum(compute_of(d) for d in (2, 3, 4)))
    speed = progress.Speed()
    speed.see(0.0, now=1000.0)
    assert miniseries.progress_line(runs, speed) == ('miniseries: 17/18 runs finished; shakespeare_rot-depth4-s2 at '
                                                     'iteration 50 of 100; time left: known once runs of two sizes '
                                                     'have run a while')
    speed.see(done, now=1060.0)
    assert miniseries.progress_line(runs, speed).endswith('; about 5 s left at the recent speed')


@pytest.mark.parametrize('more, message', [
    (['--depths=2,3'], 'give 3 or more distinct whole sizes'),
    (['--depths=2,x,4'], 'give 3 or more distinct whole sizes'),
    (['--baseline=shakespeare_mhc'], 'is none of the configs'),
    (['--tune=learning_rate=1e-3,2e-3'], "--tune is tools/compare.py's"),
    (['--depth=3'], 'the sizes go as --depths'),
    (['--seeds=0'], 'take a whole number of 1 or more'),
    (['learning_rate=1e-3'], 'config keys go as --key=value'),
    (['--n_embd=128'], 'give the width per layer with --aspect'),
    (['--max_iters=100'], '--max_iters goes with --tokens_per_param=0'),
    (['--tune', 'learning_rate=1e-3,2e-3'], "--tune is tools/compare.py's"),
])
def test_bad_input_is_refused_with_the_fix(tmp_path, more, message):
    with pytest.raises(UserError, match=message.replace('(', r'\(').replace('.', r'\.')):
        miniseries.parse_args(args_of(tmp_path, *more))


def test_a_missing_config_and_twin_names_are_refused(tmp_path):
    with pytest.raises(UserError, match='config file .*nope.py.* not found'):
        miniseries.parse_args(['config/nope.py', '--depths=1,2,3'])
    twin = tmp_path / 'shakespeare_add.py'
    twin.write_text('')
    with pytest.raises(UserError, match='share a file name'):
        miniseries.parse_args([CONFIGS[0], str(twin), '--depths=1,2,3'])


def test_the_runs_are_the_plans_not_folders_found_by_their_names(out):
    """A folder of another setting of one size and seed (an earlier --per, say) is not taken for the series' run:
    the engine's plan names each run's folder, and with that --per the plan's folder is that one."""
    write_run(out / 'shakespeare_ngpt-learning_rate0.01-depth2-s1', 2, 1, 1.0)
    _, runs = planned(args_of(out))
    assert runs['shakespeare_ngpt', 2, 1].out_dir == str(out / 'shakespeare_ngpt-depth2-s1')
    assert series.survey(runs)['shakespeare_ngpt', 2, 1]['final']['val_loss'] == 2.0
    _, runs = planned(args_of(out, '--per=shakespeare_ngpt depth=2:learning_rate=0.01'))
    assert runs['shakespeare_ngpt', 2, 1].out_dir == str(out / 'shakespeare_ngpt-learning_rate0.01-depth2-s1')
    assert series.survey(runs)['shakespeare_ngpt', 2, 1]['final']['val_loss'] == 1.0


# ------------------------------------------------------------------ end to end, tiny models
TINY = ['--aspect=8', '--tokens_per_param=0', '--max_iters=4', '--eval_interval=2', '--eval_iters=1', '--batch_size=2',
        '--block_size=16', '--log_interval=1', '--warmup_iters=1', '--device=cpu', '--compile=False']


def finished_logs(out):
    """{folder: log.jsonl's bytes and mtime} of the runs that hold their final evaluation."""
    found = {}
    for name in os.listdir(out):
        log = os.path.join(out, name, 'log.jsonl')
        cfg = os.path.join(out, name, 'config.json')
        if os.path.exists(log) and os.path.exists(cfg):
            with open(cfg) as f:
                last = json.load(f)['max_iters']
            with open(log, 'rb') as f:
                text = f.read()
            if any(r.get('iter') == last and 'val_loss' in r for r in map(json.loads, text.splitlines())):
                found[name] = (text, os.stat(log).st_mtime_ns)
    return found


@pytest.mark.slow
def test_an_interrupted_series_finishes_with_the_same_command_keeping_the_finished_runs(tmp_path, char_data):
    """In the modern block (config/modern.py stacked on each rule; the Ctrl-C test below runs GPT-2's)."""
    out = tmp_path / 'series'
    cmd = [sys.executable, 'tools/miniseries.py', *CONFIGS[:2], '--stack=config/modern.py', '--depths=1,2,3',
           '--seeds=1', '--nproc=2', f'--out={out}', f'--data_dir={char_data}', *TINY]
    first = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    while not (os.path.isdir(out) and finished_logs(out)) and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    first.send_signal(signal.SIGTERM)
    printed = first.communicate(timeout=120)[0]
    kept = finished_logs(out)
    assert first.returncode == 130, printed
    assert 1 <= len(kept) < 6, printed
    assert f'miniseries interrupted with {len(kept)}/6 runs finished' in printed
    second = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stdout + second.stderr
    assert f'miniseries: {len(kept)}/6 runs finished before this command' in second.stdout
    assert 'miniseries: 6/6 runs finished' in second.stdout
    now = finished_logs(out)
    assert len(now) == 6 and all(now[name] == kept[name] for name in kept)  # not rerun: the same log, untouched
    data = json.loads((out / 'miniseries.json').read_text())
    for rule in ('shakespeare_add', 'shakespeare_rot'):
        sizes = data['rules'][rule]['sizes']
        assert [s['depth'] for s in sizes] == [1, 2, 3] and all(s['seeds'] == [1] for s in sizes)
        for s in sizes:
            records = [json.loads(line) for line in open(s['runs'][0]['folder'] + '/log.jsonl')]
            start, final = records[0], records[-1]
            assert final['iter'] == 4 and s['loss']['mean'] == final['val_loss'] and s['bpb']['mean'] == final['val_bpb']
            assert s['compute'] == start['flops_per_token'] * start['tokens_per_iter'] * 4
            assert s['parameters'] == start['parameters']
            cfg = json.load(open(s['runs'][0]['folder'] + '/config.json'))
            block = [cfg[k] for k in ('pos', 'activation', 'logit_softcap', 'value_embeds')]
            assert block == ['rope', 'relu2', 15, True]
    text = (out / 'miniseries.md').read_text()
    assert text.count('| `shakespeare_') == 6 + 2 and (out / 'miniseries.png').stat().st_size > 10_000
    assert (out / 'results.md').exists()  # compare.py's own table, with the paired differences at each depth


@pytest.mark.parametrize('inherited', [signal.SIG_DFL, signal.SIG_IGN], ids=['terminal', 'ignored'])
def test_a_ctrl_c_reaches_each_run_once_and_the_runs_save(inherited, tmp_path, char_data):
    """A terminal's Ctrl-C goes to its foreground process group: the miniseries and the runs the engine started in
    its process. Each run takes it as its request to save and stop (a SIGTERM passed on after it would kill it
    first); the miniseries waits for them and says how far the series got. So too where the miniseries was started
    with SIGINT ignored, as a script's `&` starts a job: its runs still save and stop on it, and no run starts after
    them (found so: the runs stopped, and the series went on to the next)."""
    out = tmp_path / 'series'
    cmd = [sys.executable, 'tools/miniseries.py', *CONFIGS[:2], '--depths=1,2,3', '--seeds=1', '--nproc=2',
           f'--out={out}', f'--data_dir={char_data}', *TINY, '--max_iters=100000']
    # a process group of its own, as a terminal's foreground job
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, inherited))
    runs = [out / f'shakespeare_add-depth{d}-s1' for d in (1, 2)]  # the first two of the plan
    deadline = time.monotonic() + 300
    while (not all(any('loss' in r for r in logs.read(str(run))) for run in runs) and proc.poll() is None
           and time.monotonic() < deadline):
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)
    printed = proc.communicate(timeout=120)[0]
    assert proc.returncode == 130, printed
    assert 'miniseries interrupted with 0/6 runs finished' in printed
    for run in runs:
        assert 'stopped by SIGINT' in (run / 'stdout.log').read_text(), printed
