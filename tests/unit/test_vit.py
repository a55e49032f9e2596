"""The ViT: the same Blocks on images, image data and augmentation, training through train.py."""

import gzip
import math
import os

import numpy as np
import pytest
import torch

from model import Block, OrthogonalUpdate, ViT, ViTConfig
from orthogpt import images
from orthogpt.errors import UserError

def tiny(**kw):
    base = dict(image_size=28, patch_size=4, channels=1, n_classes=10, n_layer=2, n_head=2, n_embd=32)
    base.update(kw)
    return ViTConfig(**base)


def test_vit_shapes_loss_and_shared_blocks():
    model = ViT(tiny())
    assert all(type(b) is Block and not b.attn.causal for b in model.blocks)
    x = torch.randn(5, 1, 28, 28)
    logits, loss = model(x, torch.randint(10, (5,)))
    assert logits.shape == (5, 10) and abs(loss.item() - math.log(10)) < 0.1
    soft = torch.softmax(torch.randn(5, 10), -1)
    assert torch.isfinite(model(x, soft)[1])
    assert model(x)[1] is None
    assert model.pos_emb.shape == (1, 50, 32)
    global_rule = ViT(tiny(residual='orthogonal', options=dict(ortho_mode='global'))).blocks[0].update_attn
    assert isinstance(global_rule, OrthogonalUpdate) and not global_rule.causal  # Alg. 2's plain projection


VARIANTS = [dict(residual='additive'), dict(residual='orthogonal'),
            dict(residual='orthogonal', options=dict(ortho_mode='global')),
            dict(residual='rotation')]


@pytest.mark.parametrize('variant,qkv', [(v, 'dense') for v in VARIANTS] + [(VARIANTS[0], 'cayley'), (VARIANTS[3], 'exp')],
                         ids=lambda v: '-'.join(map(str, v.values())) if isinstance(v, dict) else v)
def test_every_variant_learns_a_tiny_image_set(variant, qkv, images_kit):
    """Every rule, and each orthogonal Q/K/V map under one rule (the maps' every pairing with a rule is
    test_model.py's causality grid)."""
    torch.manual_seed(0)
    x, y = images_kit.synthetic(256)
    x = torch.from_numpy(x).float().div(255).sub(0.3).div(0.3)[:, None]
    y = torch.from_numpy(y).long()
    model = ViT(tiny(qkv=qkv, **variant))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step in range(60):
        i = torch.randint(256, (64,))
        _, loss = model(x[i], y[i])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert np.mean(losses[-5:]) < 0.8 * np.mean(losses[:5]), losses


def aug_cfg(**kw):
    import configure
    return configure.load([f'--{k}={v}' for k, v in dict(model='vit', n_classes=10, **kw).items()])


@pytest.mark.parametrize('mix', [dict(mixup_alpha=0.8), dict(cutmix_alpha=1.0), dict(mixup_alpha=0.8, cutmix_alpha=1.0)])
def test_augmentation_keeps_shapes_dtypes_and_label_mass(mix):
    imgs = torch.randint(0, 256, (16, 8, 8, 3), dtype=torch.uint8)
    labels = torch.randint(10, (16,))
    aug = images.Augment(aug_cfg(crop_padding=2, hflip=True, erase_prob=0.5, **mix),
                         torch.tensor([0.5] * 3), torch.tensor([0.25] * 3), 'cpu', seed=0)
    for _ in range(5):
        x, t = aug(imgs, labels)
        assert x.shape == (16, 3, 8, 8) and x.dtype == torch.float32 and torch.isfinite(x).all()
        assert t.shape == (16, 10) and torch.allclose(t.sum(1), torch.ones(16)) and (t >= 0).all()
    state = aug.state_dict()
    a = aug(imgs, labels)
    aug.load_state_dict(state)
    b = aug(imgs, labels)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_crop_and_flip_move_pixels_without_changing_them():
    imgs = torch.arange(2 * 6 * 6, dtype=torch.uint8).view(2, 6, 6, 1)
    aug = images.Augment(aug_cfg(crop_padding=2), torch.zeros(1), torch.ones(1) / 255, 'cpu', seed=1)
    x, t = aug(imgs, torch.tensor([3, 4]))
    padded = torch.nn.functional.pad(imgs.permute(0, 3, 1, 2).float(), (2, 2, 2, 2))
    for i in range(2):
        windows = [padded[i, :, dy:dy + 6, dx:dx + 6] for dy in range(5) for dx in range(5)]
        assert any(torch.allclose(x[i], w, atol=1e-3) for w in windows), "a crop is a window of the padded image"
    assert torch.equal(t.argmax(1), torch.tensor([3, 4]))
    flipped = images.Augment(aug_cfg(hflip=True), torch.zeros(1), torch.ones(1) / 255, 'cpu', seed=2)
    outs = [flipped(imgs, torch.tensor([0, 0]))[0][0] for _ in range(20)]
    plain = imgs[0].permute(2, 0, 1).float()
    assert any(torch.allclose(o, plain, atol=1e-3) for o in outs)
    assert any(torch.allclose(o, plain.flip(-1), atol=1e-3) for o in outs)


def test_idx_reader(tmp_path, images_kit):
    x = np.random.default_rng(0).integers(0, 256, (7, 5, 3)).astype(np.uint8)
    images_kit.write_idx(tmp_path / 'a.gz', x)
    assert np.array_equal(images.read_idx(str(tmp_path / 'a.gz')), x)
    data = gzip.open(tmp_path / 'a.gz').read()
    with gzip.open(tmp_path / 'b.gz', 'wb') as f:
        f.write(data[:-4])
    with pytest.raises(UserError, match='truncated'):
        images.read_idx(str(tmp_path / 'b.gz'))


@pytest.mark.parametrize('name,label_column,channels', [('cifar10', 'label', 3), ('cifar100', 'fine_label', 3),
                                                        ('fashion_mnist', 'label', 1)])
def test_hugging_face_path_with_the_real_columns(tmp_path, monkeypatch, name, label_column, channels):
    import datasets
    spec = images.DATASETS[name]
    shape = (28, 28) if channels == 1 else (32, 32, 3)
    g = np.random.default_rng(0)
    rows = {spec['image']: [g.integers(0, 256, shape).astype(np.uint8) for _ in range(6)], label_column: [1, 2, 3, 0, 1, 2]}
    monkeypatch.setattr(datasets, 'load_dataset', lambda path, split: datasets.Dataset.from_dict(rows))
    monkeypatch.setitem(images.DATASETS[name], 'idx_dir', str(tmp_path / 'absent'))
    data = images.load(name, 'test', str(tmp_path / 'cache'))
    assert data['images'].shape == (6,) + shape[:2] + (channels,) and data['images'].dtype == torch.uint8
    assert data['labels'].tolist() == [1, 2, 3, 0, 1, 2] and data['mean'].shape == (channels,)
    assert os.path.exists(tmp_path / 'cache' / 'train.pt')  # the normalisation comes from the train split


def test_missing_fashion_mnist_says_how_to_get_it(tmp_path, monkeypatch):
    import datasets

    def offline(*a, **k):
        raise ConnectionError('no network')
    monkeypatch.setattr(datasets, 'load_dataset', offline)
    monkeypatch.setitem(images.DATASETS['fashion_mnist'], 'idx_dir', str(tmp_path / 'absent'))
    with pytest.raises(UserError, match='apt-get install dataset-fashion-mnist.*--image_dir'):
        images.load('fashion_mnist', 'train', str(tmp_path / 'cache'))


@pytest.mark.skipif(not os.path.exists('/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz'),
                    reason='Debian package dataset-fashion-mnist not installed')
def test_the_real_fashion_mnist_files(tmp_path):
    test = images.load('fashion_mnist', 'test', str(tmp_path))
    assert test['images'].shape == (10000, 28, 28, 1) and test['images'].dtype == torch.uint8
    assert torch.bincount(test['labels']).tolist() == [1000] * 10
    assert abs(test['mean'].item() - 0.2860) < 1e-3 and abs(test['std'].item() - 0.3530) < 1e-3  # of the train split
