"""What the training loop trains: a task builds the model, hands out training batches and evaluates.

    LanguageTask  a GPT on token windows (character data or GPT-2 BPE shards); eval: loss
    ImageTask     a ViT on an image dataset held on the device; eval: loss, top-1, top-5

make_task picks one by the config's model. Every task keeps the batch it will hand out next
already drawn (on CUDA its copy overlaps compute) and saves the data state from before that draw,
so a resumed run draws the same batch again.
"""

import json
import math
import os
from dataclasses import replace

import torch
import torch.distributed as dist

import configure
from orthogpt import bpe, chars, flops, images, progress, windows
from orthogpt.errors import UserError
from orthogpt.parallel import verdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def data_dir(cfg):
    return cfg.data_dir or os.path.join(ROOT, 'data', cfg.dataset)


def make_task(cfg, device, rank=0, world=1):
    return {'gpt': LanguageTask, 'vit': ImageTask}[cfg.model](cfg, device, rank, world)


def on_master_first(prepare, rank, world):
    """Run prepare() on rank 0 and let every process learn its error, so none waits forever."""
    error = None
    if rank == 0:
        try:
            prepare()
        except UserError as e:
            error = str(e)
    error = verdict(error, world > 1)
    if error:
        raise UserError(error)


def token_bytes(meta, vocab_size):
    """(vocab_size,) UTF-8 bytes of each token: its character's for character-level data, its GPT-2
    BPE token's otherwise (ids past GPT-2's 50257 have none); all 0 where the BPE files cannot be read."""
    if meta:
        sizes = [len(ch.encode('utf-8')) for ch in meta['itos']]
    else:
        try:
            enc = bpe.encoding()
        except UserError:
            return torch.zeros(vocab_size, dtype=torch.long)
        sizes = [len(enc.decode_single_token_bytes(i)) for i in range(min(enc.n_vocab, vocab_size))]
    return torch.tensor(sizes + [0] * (vocab_size - len(sizes)))


class Task:
    def model(self):
        return configure.build_model(self.cfg)

    def next_batch(self):
        """The pending batch; the following one is drawn now."""
        batch = self.batch
        self.pending = self.data_state()
        self.batch = self.draw()
        return batch

    def state_dict(self):
        return self.pending

    def load_state_dict(self, state):
        self.load_data_state(state)
        self.pending = state
        self.batch = self.draw()

    def resume_problems(self, saved_cfg, saved_meta):
        return []

    def progress(self):
        return ''


class LanguageTask(Task):
    unit, item = 'tok', 'token'

    def __init__(self, cfg, device, rank=0, world=1):
        folder = data_dir(cfg)
        char = cfg.dataset == 'shakespeare_char'
        prepare_cmd = (f"python data/{cfg.dataset}/prepare.py" if char else
                       f"python data/prepare_text.py --dataset {cfg.dataset}  (local files: --files PATTERN "
                       f"--name {cfg.dataset})")
        meta_path = os.path.join(folder, 'meta.json')
        if char:  # rank 0 alone looks: a rank that looked for itself could see the files rank 0 had just written,
            # skip the verdict that rank 0 waits in, and hang the run in its next collective
            on_master_first(lambda: chars.ready(folder), rank, world)
        found = windows.find(folder)
        if found is None:
            raise UserError(f"dataset {cfg.dataset!r} is not prepared: {folder} holds neither train.bin/val.bin "
                            f"nor train_*.bin/val_*.bin shards.\nPrepare it first: {prepare_cmd}")
        is_shards, paths = found
        self.meta = None
        if os.path.exists(meta_path):
            with open(meta_path, encoding='utf-8') as f:
                self.meta = json.load(f)
            cfg = replace(cfg, vocab_size=self.meta['vocab_size'])
        if not is_shards:
            for split in ('train', 'val'):
                windows.check_tokens(paths[split][0], self.meta, f'{split}_tokens', prepare_cmd)
        arrays = {split: [windows.open_tokens(p, is_shards) for p in paths[split]] for split in ('train', 'val')}
        self.cfg, self.device, self.rank = cfg, device, rank
        self.items_per_iter = cfg.gradient_accumulation_steps * cfg.batch_size * cfg.block_size
        self.loader = windows.TokenWindows(arrays['train'], cfg.block_size, cfg.batch_size, cfg.seed, device, rank, world)
        self.eval_loaders = {split: windows.TokenWindows(a, cfg.block_size, cfg.batch_size, cfg.seed + 10_000, device,
                                                        rank, world) for split, a in arrays.items()}
        self.token_bytes = token_bytes(self.meta, cfg.vocab_size).to(device)
        self.pending, self.batch = self.data_state(), self.draw()

    def draw(self):
        return self.loader.next()

    def data_state(self):
        return {'loader': self.loader.state_dict()}

    def load_data_state(self, state):
        self.loader.load_state_dict(state['loader'])

    def counted_flops(self, model):
        """FLOPs per token of a training step of model, every rule's extra work counted (orthogpt.flops)."""
        c = self.cfg
        one = torch.zeros(1, c.block_size, dtype=torch.long, device=next(model.parameters()).device)
        return flops.per_item(model, (one, one), c.gradient_accumulation_steps * c.batch_size) / c.block_size

    def flops_per_item(self, model):
        """Per token: 6N for the matmuls of forward and backward (the embeddings looked up, of positions
        and of values, do none), plus attention's 12 L T d (PaLM, appendix B)."""
        c = self.cfg
        return 6 * (model.num_params() - flops.lookups(model)) + 12 * c.n_layer * c.n_embd * c.block_size

    def eval_inputs(self):
        self.eval_loaders['val'].reset()
        return self.eval_loaders['val'].next()[0]

    def eval_batches(self, eval_iters):
        """Batches of batch_size items one evaluation reads."""
        return 2 * eval_iters

    @torch.no_grad()
    def evaluate(self, model, autocast, ddp, eval_iters, check=lambda: None):
        """Mean loss per split over eval_iters batches, and the validation loss in bits per byte of
        its text (nanochat's val_bpb: the summed loss in bits over the UTF-8 bytes of the predicted
        tokens, so that tokenizers compare). The loaders restart, so every evaluation sees the same
        batches. Under DDP the processes draw distinct batches; the sums are averaged. check() runs
        before every batch (it raises to stop the evaluation)."""
        model.eval()
        out = {}
        try:
            for split, batches in self.eval_loaders.items():
                batches.reset()
                sums = torch.zeros(2, device=batches.device)  # the batches' mean losses, their targets' bytes
                with progress.bar(range(eval_iters), f"evaluating {split}", show=self.rank == 0) as bar:
                    for _ in bar:
                        check()
                        x, y = batches.next()
                        with autocast:
                            _, loss = model(x, y)
                        sums += torch.stack([loss.float(), self.token_bytes[y].sum().float()])
                if ddp:
                    dist.all_reduce(sums, op=dist.ReduceOp.AVG)
                total, nbytes = sums.tolist()
                out[f'{split}_loss'] = total / eval_iters
            if nbytes:  # the last split's: val
                out['val_bpb'] = total * y.numel() / (math.log(2) * nbytes)
        finally:
            model.train()
        return out

    def resume_problems(self, saved_cfg, saved_meta):
        if saved_cfg.vocab_size != self.cfg.vocab_size:
            return [f"the checkpoint was trained on a vocabulary of {saved_cfg.vocab_size} tokens, the dataset now "
                    f"has {self.cfg.vocab_size}; resume on the data it was trained on"]
        if saved_meta and self.meta and saved_meta['itos'] != self.meta['itos']:
            return ["the dataset's characters differ from the ones the checkpoint was trained on"]
        return []


class ImageTask(Task):
    unit, item = 'img', 'image'

    def __init__(self, cfg, device, rank=0, world=1):
        folder = data_dir(cfg)
        on_master_first(lambda: [images.load(cfg.dataset, s, folder, cfg.image_dir) for s in ('train', 'test')],
                        rank, world)
        train, test = (images.load(cfg.dataset, s, folder, cfg.image_dir) for s in ('train', 'test'))
        _, H, W, C = train['images'].shape
        if H != W:
            raise UserError(f"{cfg.dataset} images are {H} x {W}; the ViT takes square images")
        cfg = replace(cfg, image_size=H, channels=C, n_classes=images.DATASETS[cfg.dataset]['classes'])
        self.cfg, self.device, self.rank, self.world = cfg, device, rank, world
        self.meta = {'dataset': cfg.dataset, 'mean': train['mean'].tolist(), 'std': train['std'].tolist()}
        self.items_per_iter = cfg.gradient_accumulation_steps * cfg.batch_size
        self.test = test['images'].to(device), test['labels'].to(device)
        self.loader = images.ImageBatches(train['images'].to(device), train['labels'].to(device), cfg.batch_size,
                                          cfg.seed, rank, world)
        self.augment = images.Augment(cfg, train['mean'], train['std'], device, cfg.seed + 1000 * (rank + 1))
        self.pending, self.batch = self.data_state(), self.draw()

    def draw(self):
        return self.augment(*self.loader.next())

    def data_state(self):
        return {'loader': self.loader.state_dict(), 'augment': self.augment.state_dict()}

    def load_data_state(self, state):
        self.loader.load_state_dict(state['loader'])
        self.augment.load_state_dict(state['augment'])

    def counted_flops(self, model):
        """FLOPs per image of a training step of model, every rule's extra work counted (orthogpt.flops)."""
        c, device = self.cfg, next(model.parameters()).device
        one = (torch.zeros(1, c.channels, c.image_size, c.image_size, device=device),
               torch.zeros(1, dtype=torch.long, device=device))
        return flops.per_item(model, one, self.items_per_iter)

    def flops_per_item(self, model):
        """Per image of T = patches + 1 tokens: 6 N T for the matmuls, plus attention's 12 L T^2 d."""
        c = self.cfg
        T = (c.image_size // c.patch_size) ** 2 + 1
        return 6 * (model.num_params() - model.pos_emb.numel()) * T + 12 * c.n_layer * c.n_embd * T * T

    def progress(self):
        return f", epoch {self.loader.epochs:.2f}"

    def eval_inputs(self):
        return self.augment.normalize(self.test[0][:self.cfg.batch_size])

    def eval_batches(self, eval_iters):
        """Batches of batch_size images one evaluation reads: this process's share of the test split."""
        return math.ceil(len(self.test[1]) / self.world / self.cfg.batch_size)

    @torch.no_grad()
    def evaluate(self, model, autocast, ddp, eval_iters, check=lambda: None):
        """Loss, top-1 and top-5 accuracy (%) over the whole test split, without augmentation;
        under DDP each process takes every world-th image and the sums are added. check() runs
        before every batch, as many times in every process (it raises to stop the evaluation)."""
        model.eval()
        images_, labels = (t[self.rank::self.world] for t in self.test)
        sums = torch.zeros(4, device=self.device)  # loss, top-1, top-5, count
        k, size = min(5, self.cfg.n_classes), 4 * self.cfg.batch_size
        starts = range(0, len(self.test[1]) // self.world + 1, size)
        try:
            with progress.bar(starts, 'evaluating', show=self.rank == 0) as bar:
                for i in bar:
                    check()
                    x, y = self.augment.normalize(images_[i:i + size]), labels[i:i + size]
                    if not len(y):  # past this process's share: the others may hold one image more
                        continue
                    with autocast:
                        logits, _ = model(x)
                    logits = logits.float()
                    top = logits.topk(k, dim=-1).indices
                    sums += torch.stack([torch.nn.functional.cross_entropy(logits, y, reduction='sum'),
                                         (top[:, 0] == y).sum().float(), (top == y[:, None]).any(-1).sum().float(),
                                         torch.tensor(float(len(y)), device=self.device)])
        finally:
            model.train()
        if ddp:
            dist.all_reduce(sums)
        loss, top1, top5, n = sums.tolist()
        return {'val_loss': loss / n, 'top1': 100 * top1 / n, 'top5': 100 * top5 / n}
