"""The ViT through train.py on a synthetic Fashion-MNIST-shaped set: training, evaluation, exact resume."""

import os

import pytest

import sample
import train
from orthogpt import checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository


# the synthetic classes are positions (mirror images of one another): no flips, no crops
SMALL = ['--n_layer=2', '--n_head=2', '--n_embd=32', '--batch_size=32', '--log_interval=5', '--warmup_iters=5',
         '--device=cpu', '--hflip=False', '--crop_padding=0']


def run_vit(tmp_path, idx_dir, *args, config='vit_fashion_add.py', out='out'):
    out_dir = tmp_path / out
    train.main([os.path.join(ROOT, 'config', config), *SMALL, f'--image_dir={idx_dir}',
                f'--data_dir={tmp_path / "cache"}', f'--out_dir={out_dir}', *args])
    return out_dir


def test_train_a_vit_end_to_end(logs, tmp_path, idx_dir, capsys):
    out = run_vit(tmp_path, idx_dir, '--max_iters=120', '--eval_interval=60', config='vit_fashion_ortho.py')
    printed = capsys.readouterr().out
    assert ' img/s, epoch ' in printed and 'top1' in printed
    evals_ = [r for r in logs.records(out) if 'val_loss' in r]
    assert [r['iter'] for r in evals_] == [0, 60, 120]
    assert evals_[-1]['top1'] > 40 and evals_[-1]['top5'] >= evals_[-1]['top1']
    assert evals_[-1]['val_loss'] < evals_[0]['val_loss']
    with pytest.raises(SystemExit, match='is an image classifier'):
        sample.main([f'--out_dir={out}'])


def test_vit_resume_is_exact_with_every_augmentation(logs, tmp_path, idx_dir):
    args = ['--eval_interval=10', '--lr_decay_iters=40', '--mixup_alpha=0.8', '--cutmix_alpha=1.0',
            '--erase_prob=0.25', '--dropout=0.1', '--crop_padding=2', '--hflip=True']
    full = run_vit(tmp_path, idx_dir, '--max_iters=40', *args, out='full')
    run_vit(tmp_path, idx_dir, '--max_iters=20', *args, out='part')
    part = run_vit(tmp_path, idx_dir, '--max_iters=40', '--init_from=resume', *args, out='part')
    strip = lambda d: [(r['iter'], r.get('loss'), r.get('val_loss'), r.get('top1'))  # noqa: E731
                       for r in logs.records(d) if 'event' not in r]
    assert strip(part) == strip(full)
    assert checkpoint.load(part / 'ckpt.pt')['meta']['dataset'] == 'fashion_mnist'
