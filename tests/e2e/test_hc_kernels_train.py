"""train.py with the fused kernels of the wide streams (hc_kernels='triton', on a CPU under Triton's interpreter,
which conftest.py turns on): twenty steps follow the rule's own code's losses to float32 rounding."""

import pytest

from conftest import read_records


@pytest.mark.parametrize('keys', [['--residual=hc'], ['--residual=mhc', '--mhc_sinkhorn_iters=3']], ids=['hc', 'mhc'])
def test_twenty_steps_on_the_kernels_follow_the_rule(run, keys):
    small = ['--n_layer=1', '--block_size=8', '--batch_size=2', '--max_iters=20', '--log_interval=1',
             '--eval_interval=20', '--eval_iters=1', *keys]
    losses = {}
    for kernels in ('triton', 'torch'):
        out = run(*small, f'--hc_kernels={kernels}', out=kernels)
        losses[kernels] = [r['loss'] for r in read_records(out) if 'loss' in r]
    assert len(losses['torch']) == 20 and losses['torch'][-1] < losses['torch'][0]  # it trains
    for fused, plain in zip(losses['triton'], losses['torch']):
        assert abs(fused - plain) <= 1e-5 * abs(plain)
