"""End to end on a tiny corpus: training, resume, checkpoints, sampling and their errors."""

import json
import os

import pytest
import torch

import checkpoint
import sample
import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ['--n_layer=2', '--n_head=2', '--n_embd=32', '--block_size=32', '--batch_size=8', '--eval_iters=4',
        '--log_interval=5', '--warmup_iters=5', '--learning_rate=1e-2', '--device=cpu', '--compile=False']


def run(tmp_path, data, *args, config='shakespeare_add.py', out='out'):
    out_dir = tmp_path / out
    train.main([os.path.join(ROOT, 'config', config), *TINY, f'--data_dir={data}', f'--out_dir={out_dir}', *args])
    return out_dir


def records(out_dir):
    with open(out_dir / 'log.jsonl') as f:
        return [json.loads(line) for line in f]


def evals(out_dir):
    return [(r['iter'], r['val_loss']) for r in records(out_dir) if 'val_loss' in r]


@pytest.mark.parametrize('config', ['shakespeare_add.py', 'shakespeare_ortho.py', 'shakespeare_rot.py',
                                    'shakespeare_cayley.py'])
def test_loss_falls_and_data_is_prepared_on_first_use(tmp_path, char_data, config):
    out = run(tmp_path, char_data, '--max_iters=60', '--eval_interval=30', config=config)
    assert (char_data / 'train.bin').exists() and (char_data / 'meta.json').exists()
    history = evals(out)
    assert [i for i, _ in history] == [0, 30, 60]
    assert history[-1][1] < 0.6 * history[0][1], history
    assert (out / 'ckpt.pt').exists() and (out / 'best.pt').exists()
    assert not any(name.startswith('ckpt.pt.tmp') for name in os.listdir(out))
    ckpt = checkpoint.load(out / 'ckpt.pt')
    assert ckpt['iter_num'] == 60 and ckpt['config']['residual'] in ('additive', 'orthogonal', 'rotation')
    assert not any(k.startswith(('_orig_mod.', 'module.')) for k in ckpt['model'])


@pytest.mark.parametrize('dtype', ['bfloat16', 'float16'])
def test_mixed_precision_steps(tmp_path, char_data, dtype):
    """The autocast path (and, for float16, the gradient scaler) on the CPU."""
    out = run(tmp_path, char_data, '--max_iters=20', '--eval_interval=20', f'--dtype={dtype}',
              config='shakespeare_rot.py')
    history = evals(out)
    assert history[-1][1] < history[0][1]
    assert set(checkpoint.load(out / 'ckpt.pt')['scaler']) == ({'scale', 'growth_factor', 'backoff_factor',
                                                                 'growth_interval', '_growth_tracker'}
                                                                if dtype == 'float16' else set())


def test_resume_continues_exactly(tmp_path, char_data):
    args = ['--eval_interval=10', '--lr_decay_iters=40']  # the schedule must not depend on where we stop
    full = run(tmp_path, char_data, '--max_iters=40', *args, config='shakespeare_ortho.py', out='full')
    part = run(tmp_path, char_data, '--max_iters=20', *args, config='shakespeare_ortho.py', out='part')
    run(tmp_path, char_data, '--max_iters=40', '--init_from=resume', *args, config='shakespeare_ortho.py', out='part')
    resumed = evals(part)
    assert [i for i, _ in resumed] == [0, 10, 20, 30, 40]  # iteration 20 is not evaluated twice
    assert resumed == evals(full)  # same data, RNG and optimizer state: the same losses
    train_losses = lambda d: [(r['iter'], r['loss']) for r in records(d) if 'loss' in r]  # noqa: E731
    assert train_losses(part) == train_losses(full)


def test_a_new_run_never_overwrites_a_checkpoint(tmp_path, char_data):
    out = run(tmp_path, char_data, '--max_iters=5', '--eval_interval=5')
    before = (out / 'ckpt.pt').read_bytes()
    with pytest.raises(SystemExit, match='would overwrite it; continue it with --init_from=resume'):
        run(tmp_path, char_data, '--max_iters=5', '--eval_interval=5')
    assert (out / 'ckpt.pt').read_bytes() == before


def test_eval_only(tmp_path, char_data, capsys):
    run(tmp_path, char_data, '--max_iters=5', '--eval_interval=5')
    capsys.readouterr()
    run(tmp_path, char_data, '--init_from=resume', '--eval_only=True')
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith('iter 5: train loss')


def test_resume_with_a_different_model_is_refused(tmp_path, char_data):
    run(tmp_path, char_data, '--max_iters=5', '--eval_interval=5')
    with pytest.raises(SystemExit, match=r"n_layer=2 \(saved\) vs 3 \(now\)"):
        run(tmp_path, char_data, '--max_iters=10', '--init_from=resume', '--n_layer=3')


def test_resume_without_checkpoint(tmp_path, char_data):
    with pytest.raises(SystemExit, match='no checkpoint at'):
        run(tmp_path, char_data, '--init_from=resume')


def test_unprepared_dataset_names_the_prepare_command(tmp_path):
    with pytest.raises(SystemExit, match=r'python data/openwebtext/prepare.py'):
        train.main(['--dataset=openwebtext', f'--data_dir={tmp_path}', '--device=cpu'])


def test_config_error_and_missing_gpu_exit_cleanly(tmp_path, char_data):
    with pytest.raises(SystemExit, match="did you mean 'n_layer'"):
        train.main(['--n_layers=2'])
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match='sees no CUDA GPU'):
            run(tmp_path, char_data, '--device=cuda')


@pytest.fixture
def trained(tmp_path, char_data):
    return run(tmp_path, char_data, '--max_iters=40', '--eval_interval=20', config='shakespeare_rot.py')


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


def test_sample_rejects_characters_outside_the_vocabulary(trained):
    with pytest.raises(SystemExit, match=r"outside the model's vocabulary: '\$', 'é'"):
        sample.main([f'--out_dir={trained}', '--start=ROMEO: $é'])


def test_sample_missing_and_corrupt_checkpoints(trained, tmp_path):
    with pytest.raises(SystemExit, match='no checkpoint at'):
        sample.main([f'--out_dir={tmp_path / "nowhere"}'])
    data = (trained / 'best.pt').read_bytes()
    (trained / 'best.pt').unlink()
    (trained / 'ckpt.pt').write_bytes(data[: len(data) // 2])
    with pytest.raises(SystemExit, match='not a readable checkpoint'):
        sample.main([f'--out_dir={trained}'])


def test_wandb_is_offline_without_a_key(monkeypatch, tmp_path):
    monkeypatch.delenv('WANDB_API_KEY', raising=False)
    monkeypatch.delenv('WANDB_MODE', raising=False)
    monkeypatch.setenv('HOME', str(tmp_path))
    assert train.wandb_mode() == 'offline'
    (tmp_path / '.netrc').write_text('machine api.wandb.ai\n  login user\n  password abc\n')
    assert train.wandb_mode() == 'online'
    (tmp_path / '.netrc').unlink()
    monkeypatch.setenv('WANDB_API_KEY', 'abc')
    assert train.wandb_mode() == 'online'
