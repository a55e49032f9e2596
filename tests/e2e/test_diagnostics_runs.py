"""The diagnostics through their tools and train.py: the gradient-norm figure, the dynamics log
and its plots."""

import csv
import json
import math
import os

import pytest

from orthogpt import diagnostics
from tools import plot_dynamics, plot_grad_norms

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
SMALL = ['--n_embd=32', '--n_head=2', '--block_size=32', '--batch_size=4', '--batches=2', '--seeds=2']


def cfgfile(name):
    return os.path.join(ROOT, 'config', name)


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_grad_norm_tool_writes_one_row_per_layer(tmp_path, char_data):
    out = tmp_path / 'gn'
    plot_grad_norms.main([cfgfile('shakespeare_add.py'), '--n_layer=3', *SMALL, f'--data_dir={char_data}',
                          f'--out={out}'])
    rows = read_csv(f'{out}.csv')
    assert [int(r['layer']) for r in rows] == list(range(1, 7))
    assert [r['sublayer'] for r in rows] == ['attn', 'mlp'] * 3
    assert all(math.isfinite(float(r['grad_norm'])) and float(r['grad_norm']) > 0 for r in rows)
    assert os.path.getsize(f'{out}.png') > 1000


def test_rotation_gradients_stay_flat_where_additive_decays(tmp_path, char_data):
    """The Orthogonal Transformer paper's figure, at 16 layers: the ordering, not its numbers."""
    out = tmp_path / 'gn'
    plot_grad_norms.main([cfgfile('shakespeare_add.py'), cfgfile('shakespeare_rot.py'), '--sigma_w=0.3,1.0',
                          *SMALL, f'--data_dir={char_data}', f'--out={out}'])
    ratio = {}
    for r in read_csv(f'{out}.csv'):
        ratio.setdefault((r['residual'], float(r['sigma_w'])), []).append(float(r['grad_norm']))
    ratio = {k: max(v) / min(v) for k, v in ratio.items()}
    assert len(ratio) == 4
    assert ratio['rotation', 0.3] < 1.25
    assert ratio['additive', 1.0] > 2 * ratio['rotation', 0.3]
    assert ratio['additive', 1.0] > ratio['additive', 0.3]  # the decay grows with sigma_w


@pytest.mark.parametrize('block', [[], ['--pos=rope', '--qk_norm=True', '--activation=relu2', '--norm_gain=False',
                                          '--logit_softcap=15', '--value_embeds=True']], ids=['gpt2', 'modern'])
def test_dynamics_log_and_plots(run, logs, tmp_path, block):
    args = ['--max_iters=20', '--eval_interval=10', '--dropout=0.1', '--ortho_prob=0.5', *block]
    plain = run(*args, config='shakespeare_ortho.py', out='plain')
    assert not (plain / 'dynamics.jsonl').exists()
    out = run(*args, '--dynamics=True', '--dynamics_interval=5', '--dynamics_gain_interval=12',
              config='shakespeare_ortho.py')
    with open(out / 'dynamics.jsonl') as f:
        lines = [json.loads(line) for line in f]
    assert [r['iter'] for r in lines] == [5, 10, 15, 20]
    names = diagnostics.STATS + diagnostics.DEPTH_STATS
    assert all(len(r[sub][s]) == 2 for r in lines for sub in ('attn', 'mlp') for s in names)
    assert all(0 < t < 10 for r in lines for t in r['attn']['theta'] + r['mlp']['theta'])
    # the gradients measured, the stream map's gains in the first record at or past each multiple of 12 (15) and
    # in the last (20), no mixing in one stream: None
    depth = [r[sub][s] for r in lines for sub in ('attn', 'mlp') for s in diagnostics.DEPTH_STATS[:3]]
    assert all(v is not None and 0 < v < 100 for values in depth for v in values)
    assert [r['attn']['map_max'] != [None, None] for r in lines] == [False, False, True, True]
    gains = [r[sub][s] for r in lines[2:] for sub in ('attn', 'mlp') for s in ('map_max', 'map_rms')]
    assert all(v is not None and 0 < v < 100 for values in gains for v in values)
    assert all(r[sub]['map_rms'] == [None, None] for r in lines[:2] for sub in ('attn', 'mlp'))
    assert all(v is None for r in lines for s in diagnostics.MIXING_GAINS for v in r['attn'][s] + r['mlp'][s])
    assert all(r['attn']['map_rms'][b] <= r['attn']['map_max'][b] * 1.0001 for r in lines[2:] for b in range(2))
    ranks = [r['effective_rank'] for r in logs.records(out) if 'val_loss' in r]
    assert len(ranks) == 3 and all(1 <= e <= 32 for e in ranks)
    # measuring draws no random numbers and changes nothing: the same losses as without it
    strip = lambda d: [{k: v for k, v in r.items() if k in ('iter', 'loss', 'val_loss')} for r in logs.records(d)]  # noqa: E731
    assert strip(out) == strip(plain)
    plot_dynamics.main([str(out), '--out', str(tmp_path / 'dyn')])
    assert sorted(p.name for p in tmp_path.glob('dyn_*.png')) == [
        'dyn_cos.png', 'dyn_effective_rank.png', 'dyn_magnitudes.png', 'dyn_par_sq.png', 'dyn_perp_sq.png',
        'dyn_stream_by_depth.png', 'dyn_stream_gain.png', 'dyn_stream_sq.png', 'dyn_theta.png']


def test_dynamics_log_h_res_and_its_plot(run, tmp_path, capsys):
    """mHC's H_res in the dynamics log: Sinkhorn's from lucidrains' start (0.525 from the other copies) with no
    angle, the Cayley mixer's from I with its rotation angle; the plot of each and the table of the last values."""
    args = ['--max_iters=20', '--eval_interval=20', '--dynamics=True', '--dynamics_interval=10']
    sinkhorn = run(*args, config='shakespeare_mhc.py', out='sinkhorn')
    cayley = run(*args, config='shakespeare_jpmhc.py', out='cayley')
    last = {}
    for name, out in (('sinkhorn', sinkhorn), ('cayley', cayley)):
        with open(out / 'dynamics.jsonl') as f:
            lines = [json.loads(line) for line in f]
        assert [r['iter'] for r in lines] == [10, 20]
        last[name] = {s: lines[-1]['attn'][s] + lines[-1]['mlp'][s]
                      for s in ('res_offdiag', 'res_dist', 'res_angle', 'comp_fwd_max', 'comp_fwd_min', 'comp_bwd_max')}
    assert all(0.3 < m < 0.75 for m in last['sinkhorn']['res_offdiag']) and last['sinkhorn']['res_angle'] == [None] * 4
    assert all(0 < m < 0.1 for m in last['cayley']['res_offdiag'])  # moved from I, a little, in 20 steps
    assert all(0 < a < math.pi for a in last['cayley']['res_angle'])
    # Sinkhorn's rows sum to 1, its columns not; the Cayley mixer's composite keeps sums near 1 after 20 steps
    assert all(abs(g - 1) < 1e-5 for g in last['sinkhorn']['comp_fwd_max'] + last['sinkhorn']['comp_fwd_min'])
    assert all(0.5 < g < 2 for g in last['cayley']['comp_fwd_max'] + last['cayley']['comp_bwd_max'])
    plot_dynamics.main([str(sinkhorn), str(cayley), '--out', str(tmp_path / 'dyn')])
    assert {'dyn_res_offdiag.png', 'dyn_res_dist.png', 'dyn_res_angle.png', 'dyn_mixing_gain.png'} <= {
        p.name for p in tmp_path.glob('*.png')}
    table = capsys.readouterr().out.splitlines()
    row = next(line for line in table if line.startswith('| cayley'))
    cells = row.strip('|').split('|')
    offdiag = float(cells[2 + diagnostics.STATS.index('res_offdiag')])
    assert offdiag == pytest.approx(sum(last['cayley']['res_offdiag']) / 4, rel=1e-3)
    assert next(line for line in table if line.startswith('| sinkhorn')).rstrip(' |').endswith('-')  # no angle


def test_dynamics_log_what_the_depth_rules_weigh_and_its_plots(run, tmp_path):
    """Attention Residuals' weights over depth (each read's sum to 1, the output's over 2L + 1 = 5 sources),
    DenseFormer's per block, DDL's beta as a histogram per sublayer, in the log and in their figures."""
    args = ['--max_iters=10', '--eval_interval=10', '--dynamics=True', '--dynamics_interval=10']
    outs = [run(*args, config=f'shakespeare_{rule}.py', out=rule) for rule in ('attnres', 'denseformer', 'ddl')]
    last = []
    for out in outs:
        with open(out / 'dynamics.jsonl') as f:
            last.append([json.loads(line) for line in f][-1])
    weights = last[0]['attnres_weights']
    assert [len(w) for w in weights] == [1, 2, 3, 4, 5] and all(sum(w) == pytest.approx(1) for w in weights)
    assert [len(a) for a in last[1]['denseformer_alpha']] == [2, 3]
    assert len(last[2]['ddl_beta']) == 4 and all(sum(h) == pytest.approx(1) for h in last[2]['ddl_beta'])
    assert last[0]['attn']['out_grad'] == [None, None] and None not in last[0]['attn']['branch_grad']
    plot_dynamics.main([*map(str, outs), '--out', str(tmp_path / 'dyn')])
    assert {'dyn_attnres_weights.png', 'dyn_denseformer_alpha.png', 'dyn_ddl_beta.png', 'dyn_magnitudes.png',
            'dyn_stream_gain.png'} <= {p.name for p in tmp_path.glob('*.png')}
    assert not (tmp_path / 'dyn_mixing_gain.png').exists()


def test_dynamics_off_measures_nothing(run, logs):
    out = run('--max_iters=10', '--eval_interval=5')
    assert not (out / 'dynamics.jsonl').exists()
    assert not any('effective_rank' in r for r in logs.records(out))


def test_plot_dynamics_needs_the_log(tmp_path):
    with pytest.raises(SystemExit, match='train the run with --dynamics=True'):
        plot_dynamics.main([str(tmp_path)])
