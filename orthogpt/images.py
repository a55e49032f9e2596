"""Image datasets as uint8 tensors on the training device, and augmentation as batched tensor ops.

    cifar10        Hugging Face uoft-cs/cifar10 (columns img, label)
    cifar100       Hugging Face uoft-cs/cifar100 (columns img, fine_label)
    fashion_mnist  IDX .gz files from --image_dir, default /usr/share/datasets/fashion-mnist
                   (Debian: apt-get install dataset-fashion-mnist), else Hugging Face
                   zalando-datasets/fashion_mnist (columns image, label)

Each split is decoded once into data/<name>/<split>.pt ({'images': (N, H, W, C) uint8, 'labels':
(N,) int64}), read with weights_only=True. Normalisation uses the mean and std of the training
split's pixels, computed when it is cached.
"""

import gzip
import os
import random

import numpy as np
import torch

from configure.schema import IMAGE_DATASETS as DATASETS
from orthogpt import hub
from orthogpt.errors import UserError
from orthogpt.files import write_atomic



def read_idx(path):
    """An IDX file (optionally gzipped): magic 0x0000TTDD (type 0x08 = uint8, DD dimensions),
    DD big-endian int32 sizes, then the data."""
    opener = gzip.open if path.endswith('.gz') else open
    with opener(path, 'rb') as f:
        data = f.read()
    if len(data) < 4 or data[0] or data[1] or data[2] != 0x08:
        raise UserError(f"{path} is not a uint8 IDX file")
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], 'big') for i in range(ndim))
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(shape)):
        raise UserError(f"{path} holds {body.size} values but its header says {shape}: truncated")
    return body.reshape(shape)


def from_rows(rows, image_key, label_key):
    images = np.stack([np.asarray(r[image_key], dtype=np.uint8) for r in rows])
    if images.ndim == 3:  # greyscale (N, H, W)
        images = images[..., None]
    return torch.from_numpy(images), torch.tensor([int(r[label_key]) for r in rows], dtype=torch.long)


def decode(name, split, image_dir=None):
    """(images (N, H, W, C) uint8, labels (N,) int64) from the dataset's source."""
    spec = DATASETS[name]
    folder = image_dir or spec.get('idx_dir')
    if 'idx' in spec and folder:
        stem = os.path.join(folder, spec['idx'][split])
        paths = [f"{stem}-{kind}-idx{n}-ubyte" for kind, n in (('images', 3), ('labels', 1))]
        paths = [p + '.gz' if os.path.exists(p + '.gz') else p for p in paths]
        if all(os.path.exists(p) for p in paths):
            images, labels = (read_idx(p) for p in paths)
            return torch.from_numpy(images.copy())[..., None], torch.from_numpy(labels.astype(np.int64))
        if image_dir:
            raise UserError(f"{image_dir} has no {os.path.basename(paths[0])}")
    hub.offline()  # out of reach: the datasets cache alone, at once
    try:
        import datasets
        rows = datasets.load_dataset(spec['hub'], split=split)
    except Exception as e:
        how = ("install the Debian package (apt-get install dataset-fashion-mnist), pass --image_dir=DIR "
               "holding the IDX .gz files, or " if 'idx' in spec else "")
        raise UserError(f"could not load {name} ({type(e).__name__}: {str(e)[:200]}); {how}"
                             f"allow access to the Hugging Face hub ({spec['hub']})") from None
    return from_rows(rows, spec['image'], spec['label'])


def load(name, split, cache_dir, image_dir=None):
    """{'images', 'labels', 'mean', 'std'} for a split, decoding it into cache_dir on first use."""
    if name not in DATASETS:
        raise UserError(f"unknown image dataset {name!r}; choose from {', '.join(DATASETS)}")
    path = os.path.join(cache_dir, f'{split}.pt')
    if not os.path.exists(path):
        images, labels = decode(name, split, image_dir)
        train = images if split == 'train' else load(name, 'train', cache_dir, image_dir)['images']
        pixels = train.float().div(255).flatten(0, 2)  # (N*H*W, C)
        data = {'images': images, 'labels': labels, 'mean': pixels.mean(0), 'std': pixels.std(0)}
        write_atomic(path, lambda f: torch.save(data, f))
    return torch.load(path, weights_only=True)


class Augment:
    """Training augmentation of a uint8 batch (B, H, W, C) on its device, as batched tensor ops:
    random crop after zero padding, horizontal flip, mixup / cutmix (timm's per-batch rules),
    normalisation, random erasing. Per-sample random numbers come from a generator on the batch's
    device, per-batch ones (mix or not, lambda, the cutmix box) from one on the host, so nothing
    waits for the device; both are saved with state_dict() for an exact resume."""

    def __init__(self, cfg, mean, std, device, seed):
        self.cfg, self.device = cfg, torch.device(device)
        self.mean, self.std = mean.to(device).view(1, -1, 1, 1), std.to(device).view(1, -1, 1, 1)
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.host = random.Random(seed)

    def rand(self, *shape):
        return torch.rand(shape, generator=self.generator, device=self.device)

    def normalize(self, images):
        """uint8 (B, H, W, C) -> float (B, C, H, W), standardised per channel."""
        return (images.permute(0, 3, 1, 2).float() / 255 - self.mean) / self.std

    def __call__(self, images, labels):
        """-> (x (B, C, H, W) float, targets (B, n_classes) class probabilities)."""
        cfg = self.cfg
        B, H, W, _ = images.shape
        x = images.permute(0, 3, 1, 2)  # (B, C, H, W)
        if cfg.crop_padding:
            p = cfg.crop_padding
            padded = torch.nn.functional.pad(x, (p, p, p, p))
            dy, dx = ((self.rand(B) * (2 * p + 1)).long() for _ in range(2))
            rows = (dy[:, None] + torch.arange(H, device=self.device))[:, None, :, None]  # (B, 1, H, 1)
            cols = (dx[:, None] + torch.arange(W, device=self.device))[:, None, None, :]  # (B, 1, 1, W)
            x = padded[torch.arange(B, device=self.device)[:, None, None, None],
                       torch.arange(x.shape[1], device=self.device)[None, :, None, None], rows, cols]
        if cfg.hflip:
            x = torch.where(self.rand(B, 1, 1, 1) < 0.5, x.flip(-1), x)
        x = (x.float() / 255 - self.mean) / self.std
        targets = torch.nn.functional.one_hot(labels, cfg.n_classes).float()
        x, targets = self.mix(x, targets)
        if cfg.erase_prob:
            x = self.erase(x)
        return x, targets

    def mix(self, x, targets):
        """Mixup (x -> lam x + (1 - lam) x_flipped) or cutmix (a box of x_flipped pasted in), with
        probability mix_prob per batch; cutmix instead of mixup with probability mix_switch_prob
        when both alphas are set; lam ~ Beta(alpha, alpha), the batch paired with its reverse."""
        cfg = self.cfg
        if not (cfg.mixup_alpha or cfg.cutmix_alpha) or self.host.random() >= cfg.mix_prob:
            return x, targets
        cutmix = cfg.cutmix_alpha > 0 and (cfg.mixup_alpha == 0 or self.host.random() < cfg.mix_switch_prob)
        lam = self.host.betavariate(*(2 * [cfg.cutmix_alpha if cutmix else cfg.mixup_alpha]))
        other = x.flip(0)
        if cutmix:
            H, W = x.shape[-2:]
            h, w = int(H * (1 - lam) ** 0.5), int(W * (1 - lam) ** 0.5)
            cy, cx = self.host.randrange(H), self.host.randrange(W)
            y0, y1, x0, x1 = max(cy - h // 2, 0), min(cy + h // 2, H), max(cx - w // 2, 0), min(cx + w // 2, W)
            x = x.clone()
            x[:, :, y0:y1, x0:x1] = other[:, :, y0:y1, x0:x1]
            lam = 1 - (y1 - y0) * (x1 - x0) / (H * W)
        else:
            x = lam * x + (1 - lam) * other
        return x, lam * targets + (1 - lam) * targets.flip(0)

    def erase(self, x):
        """Random erasing (Zhong et al.): per sample with probability erase_prob, a rectangle of 2% to
        1/3 of the area and aspect ratio 0.3 to 3.3 is replaced by standard-normal noise."""
        B, C, H, W = x.shape
        area = (0.02 + self.rand(B) * (1 / 3 - 0.02)) * H * W
        aspect = torch.exp(np.log(0.3) + self.rand(B) * (np.log(3.3) - np.log(0.3)))
        h = (area * aspect).sqrt().clamp(1, H)
        w = (area / aspect).sqrt().clamp(1, W)
        y0, x0 = self.rand(B) * (H - h + 1), self.rand(B) * (W - w + 1)
        ys = torch.arange(H, device=self.device)[None, :, None]
        xs = torch.arange(W, device=self.device)[None, None, :]
        box = ((ys >= y0.floor()[:, None, None]) & (ys < (y0 + h).floor()[:, None, None])
               & (xs >= x0.floor()[:, None, None]) & (xs < (x0 + w).floor()[:, None, None]))  # (B, H, W)
        box &= (self.rand(B) < self.cfg.erase_prob)[:, None, None]
        noise = torch.randn(x.shape, generator=self.generator, device=self.device)
        return torch.where(box[:, None], noise, x)

    def state_dict(self):
        return {'generator': self.generator.get_state(), 'host': self.host.getstate()}

    def load_state_dict(self, state):
        self.generator.set_state(state['generator'])
        self.host.setstate(state['host'])


class ImageBatches:
    """Batches of (uint8 images, labels) from tensors on the device, by epochs: each epoch one
    random permutation, drawn from a generator all processes seed alike, is cut into global
    batches of batch_size * world; process `rank` takes its slice (so processes never share an
    image in a step) and the incomplete last batch is dropped. Saved and restored with
    state_dict() / load_state_dict()."""

    def __init__(self, images, labels, batch_size, seed, rank=0, world=1):
        self.images, self.labels = images, labels
        self.batch_size, self.rank, self.world = batch_size, rank, world
        self.per_epoch = len(images) // (batch_size * world)
        if self.per_epoch == 0:
            raise UserError(f"{len(images)} images are too few for a batch of {batch_size} x {world} processes")
        self.generator = torch.Generator().manual_seed(seed)
        self.epoch = 0
        self.start_epoch()

    def start_epoch(self):
        self.epoch_state, self.step = self.generator.get_state(), 0
        self.order = torch.randperm(len(self.images), generator=self.generator).to(self.images.device)

    def next(self):
        if self.step == self.per_epoch:
            self.epoch += 1
            self.start_epoch()
        first = (self.step * self.world + self.rank) * self.batch_size
        idx = self.order[first:first + self.batch_size]
        self.step += 1
        return self.images[idx], self.labels[idx]

    @property
    def epochs(self):
        """Epochs done, fractional."""
        return self.epoch + self.step / self.per_epoch

    def state_dict(self):
        return {'generator': self.epoch_state, 'epoch': self.epoch, 'step': self.step}

    def load_state_dict(self, state):
        self.generator.set_state(state['generator'])
        self.epoch = state['epoch']
        self.start_epoch()
        self.step = state['step']
