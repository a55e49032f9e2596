"""tools/ablate.py on trained runs: a table of each ablation's validation loss against the model as trained, through
the run's own evaluation, and the errors a user meets."""

import pytest

from tools import ablate


def rows(text, tables):
    return {name: [tables.number(c) if c != '-' else None for c in cells] for name, cells in tables.cells(text).items()}


def test_every_ablation_of_a_rule_costs_what_the_evaluation_says(run, capsys, tables):
    out = run('--max_iters=20', '--eval_interval=20', '--residual=ddl')
    capsys.readouterr()
    ablate.main([f'--out_dir={out}', '--eval_iters=3'])
    table = rows(capsys.readouterr().out, tables)
    assert list(table) == ['none (as trained)', 'beta_zero', 'write_only']
    base = table['none (as trained)'][0]
    for loss, change in list(table.values())[1:]:
        assert change == pytest.approx(loss - base, abs=2e-4)
    assert table['beta_zero'][1] > 0.05  # no update at all: far worse than the trained model
    ablate.main([f'--out_dir={out}', '--eval_iters=3', '--what=write_only'])  # the same batches: the same losses
    assert rows(capsys.readouterr().out, tables)['write_only'] == table['write_only']


@pytest.mark.parametrize('residual,message', [
    ('mhc', "uniform_depth: residual='mhc' has mixing_identity, maps_at_init"),
    ('additive', "no ablation: residual='additive' has no ablation"),
])
def test_a_rule_offers_its_own_ablations_and_others_are_refused(run, residual, message):
    out = run('--max_iters=2', '--eval_interval=2', f'--residual={residual}')
    with pytest.raises(SystemExit, match=message):
        ablate.main([f'--out_dir={out}', '--what=uniform_depth' if residual == 'mhc' else '--eval_iters=1'])
