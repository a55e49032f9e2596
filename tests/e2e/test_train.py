"""End to end on a tiny corpus: training, resume, checkpoints, sampling and their errors."""

import os

import pytest
import torch

import sample
import train
from orthogpt import checkpoint
from orthogpt import logs as logs_module


@pytest.mark.parametrize('config,rule', [('shakespeare_add.py', 'additive'), ('shakespeare_ortho.py', 'orthogonal'),
                                         ('shakespeare_rot.py', 'rotation'), ('shakespeare_cayley.py', 'additive')])
def test_loss_falls_and_data_is_prepared_on_first_use(run, logs, char_data, config, rule):
    out = run('--max_iters=60', '--eval_interval=30', config=config)
    assert (char_data / 'train.bin').exists() and (char_data / 'meta.json').exists()
    history = logs.evals(out)
    assert [i for i, _ in history] == [0, 30, 60]
    assert history[-1][1] < 0.6 * history[0][1], history
    assert (out / 'ckpt.pt').exists() and (out / 'best.pt').exists()
    assert not any(name.startswith('ckpt.pt.tmp') for name in os.listdir(out))
    ckpt = checkpoint.load(out / 'ckpt.pt')
    assert ckpt['iter_num'] == 60 and ckpt['config']['residual'] == rule
    assert not any(k.startswith(('_orig_mod.', 'module.')) for k in ckpt['model'])


@pytest.mark.parametrize('dtype', ['bfloat16', 'float16'])
def test_mixed_precision_steps(run, logs, dtype):
    """The autocast path (and, for float16, the gradient scaler) on the CPU."""
    out = run('--max_iters=20', '--eval_interval=20', f'--dtype={dtype}',
              config='shakespeare_rot.py')
    history = logs.evals(out)
    assert history[-1][1] < history[0][1]
    scale = checkpoint.load(out / 'ckpt.pt')['scaler']['scale']
    assert scale == 1.0 if dtype == 'bfloat16' else scale >= 2.0 ** 10  # dynamic loss scaling for float16 only


@pytest.mark.parametrize('modern', [False, True], ids=['gpt2', 'modern'])
def test_resume_continues_exactly(run, logs, root, modern):
    # the schedule must not depend on where we stop; dropout and stochastic connections draw random numbers
    args = ['--eval_interval=10', '--lr_decay_iters=40', '--dropout=0.1', '--ortho_prob=0.5',
            *([f'{root}/config/modern.py'] if modern else [])]
    full, part = (run(f'--max_iters={n}', *args, config='shakespeare_ortho.py', out=out)
                  for n, out in ((40, 'full'), (20, 'part')))
    run('--max_iters=40', '--init_from=resume', *args, config='shakespeare_ortho.py', out='part')
    full, part = (out.with_name(out.name + '-modern') if modern else out for out in (full, part))  # the preset's
    resumed = logs.evals(part)
    assert [i for i, _ in resumed] == [0, 10, 20, 30, 40]  # iteration 20 is not evaluated twice
    assert resumed == logs.evals(full)  # same data, RNG and optimizer state: the same losses
    assert train_losses(logs, part) == train_losses(logs, full)


def train_losses(logs, out):
    return [(r['iter'], r['loss']) for r in logs.records(out) if 'loss' in r]


@pytest.mark.parametrize('config', ['shakespeare_add.py', 'shakespeare_rot.py', 'shakespeare_ngpt.py',
                                    'shakespeare_hc.py', 'shakespeare_mhc.py', 'shakespeare_ddl.py',
                                    'shakespeare_attnres.py', 'shakespeare_denseformer.py', 'shakespeare_add_x0.py'])
def test_every_rule_resumes_exactly_under_the_modern_preset(run, logs, root, config):
    """What each rule keeps (its parameters and buffers, nGPT's weights normalised after every step, the anchors'
    scalars), beside the preset's value embeddings and untied head: stopped at 10 and resumed, the same losses as
    one run to 20 (orthogonal's in the test above)."""
    args = [f'{root}/config/modern.py', '--eval_interval=5', '--lr_decay_iters=20']
    full, part = (run(f'--max_iters={n}', *args, config=config, out=out) for n, out in ((20, 'full'), (10, 'part')))
    run('--max_iters=20', '--init_from=resume', *args, config=config, out='part')
    full, part = (out.with_name(out.name + '-modern') for out in (full, part))
    assert [i for i, _ in logs.evals(part)] == [0, 5, 10, 15, 20]
    assert logs.evals(part) == logs.evals(full) and train_losses(logs, part) == train_losses(logs, full)


def test_a_new_run_never_overwrites_a_checkpoint(run):
    out = run('--max_iters=5', '--eval_interval=5')
    before = (out / 'ckpt.pt').read_bytes()
    with pytest.raises(SystemExit, match='would overwrite it; continue it with --init_from=auto'):
        run('--max_iters=5', '--eval_interval=5')
    assert (out / 'ckpt.pt').read_bytes() == before


def test_eval_only(run, capsys):
    run('--max_iters=5', '--eval_interval=5')
    capsys.readouterr()
    run('--init_from=resume', '--eval_only=True')
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith('iter 5: train loss')


def test_resume_with_a_different_model_is_refused(run):
    run('--max_iters=5', '--eval_interval=5')
    with pytest.raises(SystemExit, match=r"n_layer=2 \(saved\) vs 3 \(now\)"):
        run('--max_iters=10', '--init_from=resume', '--n_layer=3')


def test_resume_without_checkpoint(run):
    with pytest.raises(SystemExit, match='no checkpoint in'):
        run('--init_from=resume')


def test_unprepared_dataset_names_the_prepare_command(tmp_path):
    with pytest.raises(SystemExit, match=r'python data/prepare_text.py --dataset openwebtext'):
        train.main(['--dataset=openwebtext', f'--data_dir={tmp_path}', '--device=cpu'])


def test_config_error_and_missing_gpu_exit_cleanly(run):
    with pytest.raises(SystemExit, match="did you mean 'n_layer'"):
        train.main(['--n_layers=2'])
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match='sees no CUDA GPU .* stack config/cpu.py'):
            run('--device=cuda')


@pytest.fixture
def trained(run):
    return run('--max_iters=40', '--eval_interval=20', config='shakespeare_rot.py')


def test_sample_produces_text(trained, capsys):
    sample.main([f'--out_dir={trained}', '--start=ROMEO:', '--num_samples=2', '--max_new_tokens=40', '--device=cpu'])
    out = capsys.readouterr().out
    texts = [t.strip('\n') for t in out.split('---------------') if t.strip()]
    assert len(texts) == 2 and all(t.startswith('ROMEO:') and len(t) == len('ROMEO:') + 40 for t in texts)


def test_sample_prompt_from_file_and_seed(trained, capsys, tmp_path):
    prompt = tmp_path / 'prompt.txt'
    prompt.write_text('JULIET:\n')
    args = [f'--out_dir={trained}', f'--start=FILE:{prompt}', '--num_samples=1', '--max_new_tokens=20', '--seed=7']
    sample.main(args)
    first = capsys.readouterr().out
    sample.main(args)
    assert capsys.readouterr().out == first and first.startswith('JULIET:\n')
    sample.main(args + ['--no_cache'])
    assert capsys.readouterr().out == first
    with pytest.raises(SystemExit, match=r'--shift=0 must lie in \[1, '):
        sample.main(args + ['--shift=0'])


def test_sample_rejects_characters_outside_the_vocabulary(trained):
    with pytest.raises(SystemExit, match=r"outside the model's vocabulary: '\$', 'é'"):
        sample.main([f'--out_dir={trained}', '--start=ROMEO: $é'])


def test_sample_missing_and_corrupt_checkpoints(trained, tmp_path, capsys):
    """A damaged best.pt: sample.py samples from the newest checkpoint that verifies and says so in one line; a
    damaged checkpoint asked for by name is refused in one line naming those that verify; none: refused."""
    with pytest.raises(SystemExit, match='no checkpoint in .*nowhere; train one first'):
        sample.main([f'--out_dir={tmp_path / "nowhere"}'])
    assert os.path.samefile(trained / 'best.pt', trained / 'ckpt-0000040.pt')  # its val loss fell
    with open(trained / 'best.pt', 'r+b') as f:  # ckpt.pt, ckpt-0000040.pt and best.pt: one file
        f.truncate(os.path.getsize(trained / 'best.pt') // 2)
    capsys.readouterr()
    sample.main([f'--out_dir={trained}', '--start=ROMEO:', '--num_samples=1', '--max_new_tokens=10'])
    warning, *text = capsys.readouterr().out.splitlines()
    assert warning.startswith(f"warning: {trained / 'best.pt'} is not a readable checkpoint (truncated, corrupt or "
                              f"not ours: ") and warning.endswith(
        f"(the same file as ckpt.pt and ckpt-0000040.pt); using {trained / 'ckpt-0000020.pt'} (iteration 20), the "
        f"newest checkpoint that verifies")
    assert text[0].startswith('ROMEO:')
    with pytest.raises(SystemExit) as e:
        sample.main([f'--out_dir={trained}', '--ckpt=best.pt'])
    assert '\n' not in str(e.value) and str(e.value).endswith(
        "; these verify: ckpt-0000020.pt (iteration 20); pass one with --ckpt")
    (trained / 'ckpt-0000020.pt').write_bytes(b'damaged too')
    with pytest.raises(SystemExit, match=f"^error: no checkpoint in {trained} verifies: .*best.pt is not a readable "
                                         f"checkpoint .*ckpt-0000020.pt is not a readable checkpoint"):
        sample.main([f'--out_dir={trained}'])


def test_wandb_is_offline_without_a_key(monkeypatch, tmp_path):
    monkeypatch.delenv('WANDB_API_KEY', raising=False)
    monkeypatch.delenv('WANDB_MODE', raising=False)
    monkeypatch.setenv('HOME', str(tmp_path))
    assert logs_module.wandb_mode() == 'offline'
    (tmp_path / '.netrc').write_text('machine api.wandb.ai\n  login user\n  password abc\n')
    assert logs_module.wandb_mode() == 'online'
    (tmp_path / '.netrc').unlink()
    monkeypatch.setenv('WANDB_API_KEY', 'abc')
    assert logs_module.wandb_mode() == 'online'


def test_help_anywhere(root, capsys):
    train.main([os.path.join(root, 'config', 'cpu.py'), '--help'])
    assert 'keys (=default):' in capsys.readouterr().out


@pytest.mark.parametrize('args,expected', [
    (['--start=FILE:/nonexistent/prompt.txt'], 'cannot read the prompt file'),
    (['--top_k=0'], 'top_k=0 must be at least 1'),
    (['--temperature=0'], 'temperature=0.0 must be positive'),
])
def test_sample_argument_errors(trained, args, expected):
    with pytest.raises(SystemExit, match=expected):
        sample.main([f'--out_dir={trained}', *args])


@pytest.mark.skipif(not os.environ.get('TIKTOKEN_CACHE_DIR'), reason='GPT-2 BPE files: set TIKTOKEN_CACHE_DIR')
def test_bpe_tokens_train_and_sample(tmp_path, capsys, tiny_text):
    """A dataset without meta.json is GPT-2 BPE: sample.py decodes it with tiktoken."""
    import numpy as np
    import tiktoken

    ids = np.array(tiktoken.get_encoding('gpt2').encode_ordinary(tiny_text), dtype=np.uint16)
    data = tmp_path / 'bpe'
    data.mkdir()
    ids[:len(ids) * 9 // 10].tofile(data / 'train.bin')
    ids[len(ids) * 9 // 10:].tofile(data / 'val.bin')
    out = tmp_path / 'out'
    train.main(['--dataset=tiny_bpe', f'--data_dir={data}', f'--out_dir={out}', '--n_layer=1', '--n_head=2',
                '--n_embd=32', '--block_size=16', '--batch_size=4', '--max_iters=4', '--eval_interval=4',
                '--eval_iters=2', '--device=cpu'])
    capsys.readouterr()
    sample.main([f'--out_dir={out}', '--start=ROMEO:', '--num_samples=1', '--max_new_tokens=5'])
    assert capsys.readouterr().out.startswith('ROMEO:')
