"""parallel='fsdp' (FSDP2's fully_shard) under torchrun with gloo on the CPU: the weights DDP
reaches, checkpoints in torch.distributed.checkpoint's shards resumed on 2 processes exactly and
on 1, and the errors a user meets."""

import functools
import os
import shutil

import pytest
import torch

import sample
import train
from orthogpt import checkpoint

ARGS = ['--eval_interval=4', '--log_interval=2', '--warmup_iters=2']
MODERN = ['--pos=rope', '--qk_norm=True', '--activation=relu2', '--norm_gain=False', '--logit_softcap=15',
          '--value_embeds=True', '--tie_weights=False']  # config/modern.py's block


def spawn(torchrun, tiny, data, out, nproc, *args):
    done = torchrun(nproc, 'config/shakespeare_add.py', *tiny, *ARGS, f'--data_dir={data}', f'--out_dir={out}', *args)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def weights(out, name='ckpt.pt'):
    return checkpoint.load_language_model(out, name)[0].state_dict()


@pytest.mark.parametrize('variant', [
    ['--residual=mhc', '--qkv=cayley', '--gradient_accumulation_steps=4'],  # the maps' gradients accumulated unsharded
    ['--residual=orthogonal', '--ortho_prob=0.5', '--dropout=0.1', '--gradient_accumulation_steps=2'],
    ['--residual=ngpt', '--qkv=exp', '--gradient_accumulation_steps=2'],  # (rotation holds no parameter to shard)
    ['--residual=attnres', '--attnres_block=2', '--gradient_accumulation_steps=2'],  # blocks sharded as one group
    ['--residual=denseformer', *MODERN, '--gradient_accumulation_steps=2']],  # value embeddings beside the blocks
    ids=['mhc-cayley', 'orthogonal', 'ngpt-exp', 'attnres', 'denseformer-modern'])
def test_fsdp_reaches_the_weights_of_ddp(variant, torchrun, tiny, char_data, tmp_path):
    """The same logits and the same weights. mHC stands for both wide streams, which FSDP shards with their block.
    Read weights scale the input of the block's norm, so while the copies they read are equal their gradient is zero
    up to rounding (and the norm's eps), which the two reductions round differently; HC's read weights A_m would match
    only to a few 1e-5 while the copies are equal. mHC's first sublayer reads equal copies (of the embedding) at every
    step, and its b_pre's gradient stays at 1e-10 or so, below AdamW's eps, which turns it into steps of lr * g / eps:
    about 1e-4 at this lr, as far apart as the two runs' rounding makes them (2.2e-5 on an AVX-512 CPU). It is compared
    only through the logits, whose norm makes it irrelevant. (a_pre and phi's read columns get that gradient times
    a_pre = 0.01 and x', far below eps.)"""
    for parallel in ('ddp', 'fsdp'):
        spawn(torchrun, tiny, char_data, tmp_path / parallel, 2, '--max_iters=4', f'--parallel={parallel}', *variant)
    assert os.path.isdir(tmp_path / 'fsdp' / 'ckpt-0000004.dcp') and not os.path.exists(tmp_path / 'ddp' / 'ckpt-0000004.dcp')
    ddp, fsdp = (checkpoint.load_language_model(tmp_path / p, 'ckpt.pt')[0].eval() for p in ('ddp', 'fsdp'))
    idx = torch.randint(0, ddp.config.vocab_size, (4, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ddp(idx)[0], fsdp(idx)[0], rtol=1e-4, atol=1e-5)
    a, b = ddp.state_dict(), fsdp.state_dict()
    for name in a.keys() - {'blocks.0.update_attn.b_pre'}:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-5, msg=lambda m: f'{name}: {m}')


@pytest.fixture(scope='session')
def sharded(built_once, tiny_text, torchrun, tiny):
    """A run to 8 on 2 processes, and one stopped at 4 then resumed to 8 on 2; its checkpoint at 4 (part1, which one
    test resumes). Each test writes a run of its own beside them, and reads them, shared between xdist's workers (the
    sampling test's refused resume takes full's lock as it starts, writing nothing else)."""
    def run(base, out, nproc, *args):
        return spawn(torchrun, tiny, base / 'data', base / out, nproc, '--parallel=fsdp', '--qkv=cayley',
                     '--gradient_accumulation_steps=2', '--lr_decay_iters=8', *args)

    def build(base):
        (base / 'data').mkdir()
        (base / 'data' / 'input.txt').write_text(tiny_text, encoding='utf-8')
        run(base, 'full', 2, '--max_iters=8')
        run(base, 'part', 2, '--max_iters=4')
        shutil.copytree(base / 'part', base / 'part1')
        run(base, 'part', 2, '--max_iters=8', '--init_from=resume')
    base = built_once('fsdp', build)
    return base, functools.partial(run, base)


def test_resuming_on_as_many_processes_is_exact(sharded, logs):
    base, _ = sharded
    assert logs.losses(base / 'part') == logs.losses(base / 'full')
    for a, b in zip(weights(base / 'part').values(), weights(base / 'full').values()):
        assert torch.equal(a, b)
    assert sorted(f for f in os.listdir(base / 'full') if f.endswith('.dcp')) == ['ckpt-0000004.dcp', 'ckpt-0000008.dcp']


def test_an_async_save_writes_the_shards_of_a_save_in_the_loop(sharded, logs):
    """--async_save=True: each process's shards staged in memory and written by torch.distributed.checkpoint's
    thread (dcp.async_save on a process group of the checkpoints' own) while training goes on; rank 0 names
    the folder once all are written. The log and the checkpoints at 4 and 8 are the synchronous run's."""
    base, run = sharded
    run('async', 2, '--max_iters=8', '--async_save=True')
    assert logs.losses(base / 'async') == logs.losses(base / 'full')
    for name in ('ckpt-0000004.pt', 'ckpt.pt'):
        for a, b in zip(weights(base / 'async', name).values(), weights(base / 'full', name).values()):
            assert torch.equal(a, b)
    assert sorted(f for f in os.listdir(base / 'async') if f.endswith('.dcp')) == ['ckpt-0000004.dcp', 'ckpt-0000008.dcp']


def test_a_run_saved_on_two_processes_resumes_on_one(sharded, logs):
    base, run = sharded
    out = run('part1', 1, '--max_iters=8', '--init_from=resume')
    assert 'checkpoint written by 2 processes, resuming on 1' in out
    assert [r['iter'] for r in logs.records(base / 'part1') if 'val_loss' in r] == [0, 4, 8]
    lr = lambda d: [(r['iter'], r['lr']) for r in logs.records(d) if 'lr' in r]  # noqa: E731
    assert lr(base / 'part1') == lr(base / 'full')  # the schedule went on from iteration 4, not from 0
    resumed, full = logs.evals(base / 'part1'), logs.evals(base / 'full')
    assert resumed[:2] == full[:2]  # the 2 processes' evaluations at 0 and 4, kept
    assert abs(resumed[2][1] - full[2][1]) < 0.1 * (full[0][1] - full[2][1])  # other batches, the same training


def test_sampling_and_the_users_errors(sharded, capsys, char_data):
    base, _ = sharded
    sample.main([f'--out_dir={base / "full"}', '--start=ROMEO:', '--num_samples=1', '--max_new_tokens=5'])
    assert capsys.readouterr().out.startswith('ROMEO:')
    with pytest.raises(SystemExit, match="parallel='fsdp' shards the model over torchrun's processes"):
        train.main(['--parallel=fsdp', '--device=cpu', f'--data_dir={char_data}'])
    with pytest.raises(SystemExit, match="written with parallel='fsdp'; resume it with that value"):
        train.main(['config/shakespeare_add.py', f'--out_dir={base / "full"}', '--init_from=resume',
                    f'--data_dir={base / "data"}', '--device=cpu', '--max_iters=9', '--n_layer=2', '--n_head=2',
                    '--n_embd=32', '--block_size=32', '--qkv=cayley', '--gradient_accumulation_steps=2', '--compile=False'])


@pytest.mark.parametrize('arg,expected', [('--dtype=float16', 'use --dtype=bfloat16'),
                                          ('--dynamics=True', "use parallel='ddp' for it"),
                                          ('--optimizer=muon', "which parallel='fsdp' shards")])
def test_fsdp_refuses_what_it_cannot_do(arg, expected, torchrun, tmp_path):
    done = torchrun(1, '--parallel=fsdp', arg, '--device=cpu', f'--out_dir={tmp_path}', timeout=120)
    assert done.returncode != 0 and expected in done.stdout + done.stderr


def test_a_damaged_sharded_checkpoint_falls_back_to_the_newest_intact_one(sharded, logs):
    """A file of the newest ckpt-<iter>.dcp folder lost (a disk that failed under it, say): resume
    refuses the checkpoints that name it, says so, takes the one before, and trains on from it."""
    base, run = sharded
    shutil.copytree(base / 'full', base / 'damaged')
    (base / 'damaged' / 'ckpt-0000008.dcp' / '__1_0.distcp').unlink()
    out = run('damaged', 2, '--max_iters=12', '--init_from=resume')
    for name in ('ckpt.pt', 'ckpt-0000008.pt'):
        assert (f"warning: {base / 'damaged' / name} names {base / 'damaged' / 'ckpt-0000008.dcp'}, whose file "
                f"__1_0.distcp is missing") in out
    assert (f"resuming from {base / 'damaged' / 'ckpt-0000004.pt'} (iteration 4), the newest checkpoint that "
            f"verifies") in out
    assert [i for i, _ in logs.evals(base / 'damaged')] == [0, 4, 8, 12]
    assert checkpoint.load(base / 'damaged' / 'ckpt.pt')['iter_num'] == 12
