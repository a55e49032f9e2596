"""nGPT and Muon through train.py: exact resume (with Muon's state), the diagnostics on nGPT's
unit-norm stream, float16 and DDP under Muon."""

import pytest
import torch

import configure
from model import GPT
from orthogpt import checkpoint, diagnostics


def test_resume_is_exact_and_the_diagnostics_measure_it(run, logs, root, gpt_config, grad_norms):
    args = ['--eval_interval=10', '--lr_decay_iters=20']
    full = run('--max_iters=20', *args, config='shakespeare_ngpt.py', out='full')
    run('--max_iters=10', *args, config='shakespeare_ngpt.py', out='part')
    part = run('--max_iters=20', '--init_from=resume', *args, '--dynamics=True', '--dynamics_interval=5',
               config='shakespeare_ngpt.py', out='part')
    assert logs.losses(part) == logs.losses(full) and logs.evals(full)[-1][1] < logs.evals(full)[0][1]
    cfg = configure.load([f'{root}/config/shakespeare_ngpt.py'])
    assert (cfg.residual, cfg.weight_decay, cfg.warmup_iters) == ('ngpt', 0.0, 0)  # the paper's: neither
    assert [r['iter'] for r in logs.records(part / 'dynamics.jsonl')] == [15, 20]
    stats = diagnostics.update_stats(GPT(gpt_config(residual='ngpt', n_layer=3, tie_weights=False)),
                                     torch.randint(11, (2, 16)))
    torch.testing.assert_close(stats[:, 0], torch.ones(6))  # ||x||^2 = 1 before every update
    rows = grad_norms(config='shakespeare_ngpt.py')
    assert [(r['residual'], int(r['layer'])) for r in rows] == [('ngpt', layer) for layer in range(1, 5)]
    assert all(0 < float(r['grad_norm']) < float('inf') for r in rows)


def test_muon_resumes_exactly_with_its_state_and_runs_under_ddp_and_float16(run, logs, torchrun, tiny, char_data, tmp_path):
    args = ['--eval_interval=10', '--lr_decay_iters=20', '--optimizer=muon']
    full = run('--max_iters=20', *args, out='full')
    run('--max_iters=10', *args, out='part')
    part = run('--max_iters=20', '--init_from=resume', *args, out='part')
    assert logs.losses(part) == logs.losses(full)
    state = checkpoint.load(full / 'ckpt.pt')['optimizer']
    assert set(state) == {'adamw', 'muon'} and state['muon']['state']
    with pytest.raises(SystemExit, match="optimizer 'muon' -> 'adamw'.*--reset_optimizer=True"):
        run('--max_iters=30', '--eval_interval=10', '--init_from=resume', out='full')
    half = run('--max_iters=10', '--eval_interval=10', '--optimizer=muon', '--dtype=float16', out='half')
    assert logs.evals(half)[-1][1] < logs.evals(half)[0][1]
    done = torchrun(2, 'config/shakespeare_ngpt.py', *tiny, f'--data_dir={char_data}', f'--out_dir={tmp_path / "ddp"}',
                    '--max_iters=6', '--eval_interval=6', '--optimizer=muon', '--gradient_accumulation_steps=4',
                    timeout=180)
    assert done.returncode == 0 and 'done: 6 iterations' in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
