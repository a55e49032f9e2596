"""Every key a config file or a --key=value override may set, with its type, default and a comment
(which `python train.py --help` prints).

The model's keys are model.GPTConfig's and model.ViTConfig's, and `model` says which of the two
the run builds; a residual rule's own keys are declared by the rule (its Options in model.py)
and gathered in `options`. The keys below drive train.py.
"""

import inspect
from dataclasses import dataclass, fields
from typing import Literal

import torch

from model import GPT, RESIDUALS, ViT, GPTConfig, ViTConfig, at_least_one

STALE = {'cache', 'state', 'depth'}  # what prepare and forward took before the Sublayer protocol (docs/rules.md)


def stale_protocol(rule):
    """The arguments of rule's prepare and forward that name the protocol before Sublayer, sorted; none: []."""
    return sorted(STALE & {p for f in (rule.prepare, rule.forward) for p in inspect.signature(f).parameters})


# the image datasets `dataset` may name: their Hugging Face source (and Debian's IDX files), classes
IMAGE_DATASETS = {
    'cifar10': dict(hub='uoft-cs/cifar10', image='img', label='label', splits=('train', 'test'), classes=10),
    'cifar100': dict(hub='uoft-cs/cifar100', image='img', label='fine_label', splits=('train', 'test'), classes=100),
    'fashion_mnist': dict(hub='zalando-datasets/fashion_mnist', image='image', label='label',
                          splits=('train', 'test'), classes=10, idx_dir='/usr/share/datasets/fashion-mnist',
                          idx={'train': 'train', 'test': 't10k'}),
}


@dataclass
class Config(GPTConfig, ViTConfig):
    model: Literal['gpt', 'vit'] | None = None  # what to train; None: 'vit' for an image dataset, else 'gpt'
    rule_module: str | None = None  # a module defining residual's rule outside model.py, imported first; recorded by itself
    # output, evaluation, logging
    out_dir: str = 'out'  # the run's folder: checkpoints, log.jsonl, config.json
    init_from: str = 'scratch'  # 'scratch', 'resume', 'auto' (resume where out_dir holds a checkpoint, else scratch), or pretrained weights: a GPT-2 name or a Hugging Face folder
    reset_optimizer: bool = False  # on resume: a fresh optimizer state and a schedule restarted there
    keep_last_n: int = 2  # also keep the last n checkpoints as ckpt-<iter>.pt (0: none)
    async_save: bool = False  # write checkpoints in a thread, from a copy taken in the loop, while training goes on (docs/performance.md)
    eval_interval: int = 250  # iterations between evaluations (and checkpoints)
    eval_iters: int = 200  # batches per split per evaluation (a ViT evaluates its whole test split)
    eval_only: bool = False  # evaluate once and exit
    log_interval: int = 10  # iterations between log lines
    dynamics: bool = False  # log per-block stream statistics to out_dir/dynamics.jsonl (tools/plot_dynamics.py)
    dynamics_interval: int = 100  # iterations between those records (each about a step's work: docs/rules.md)
    dynamics_gain_interval: int = 1000  # the costly stream gains ride the first record at/past each multiple, the last
    wandb_log: bool = False  # mirror the log to Weights & Biases (offline mode when no API key is set)
    wandb_project: str = 'orthogpt'  # the W&B project
    wandb_run_name: str | None = None  # the W&B run's name (default: W&B's)
    # data
    dataset: str = 'shakespeare_char'  # a prepared dataset under data/, or an image dataset: cifar10, cifar100, fashion_mnist
    data_dir: str | None = None  # the dataset's folder (default: data/<dataset>)
    # image datasets: augmentation on the device, per batch
    image_dir: str | None = None  # fashion_mnist: a folder of IDX .gz files (default: Debian's)
    crop_padding: int = 0  # random crop after zero-padding by this many pixels (0: none)
    hflip: bool = False  # random horizontal flips (not for digit-like data)
    mixup_alpha: float = 0.0  # mixup's Beta(alpha, alpha); 0 disables
    cutmix_alpha: float = 0.0  # cutmix's Beta(alpha, alpha); 0 disables
    mix_prob: float = 1.0  # probability that a batch is mixed at all
    mix_switch_prob: float = 0.5  # with both alphas set: probability of cutmix rather than mixup
    erase_prob: float = 0.0  # random erasing, per image
    # size: one knob for a series of models (nanochat's --depth); put it after the config files, and the
    # keys it sets after it where they should differ
    depth: int = 0  # n_layer=n_head=depth, n_embd=aspect*depth, learning_rate x sqrt(width before / n_embd), max_iters from tokens_per_param; 0: off
    aspect: int = 64  # with depth: n_embd per layer, and so the heads' width (nanochat's 64)
    tokens_per_param: float = 20.0  # with depth: max_iters for this many tokens per block parameter (Chinchilla: ~20); 0: max_iters as set
    batch_size: int = 12  # sequences (or images) per micro-step, per process
    gradient_accumulation_steps: int = 1  # micro-steps per optimizer step, summed over all processes
    # optimizer and learning-rate schedule (linear warmup, cosine decay to min_lr_ratio of the peak)
    learning_rate: float = 6e-4  # AdamW's peak learning rate
    max_iters: int = 5000  # optimizer steps of the run
    weight_decay: float = 0.1  # AdamW's decoupled weight decay, on matrices and embeddings only
    beta1: float = 0.9  # AdamW's beta1
    beta2: float = 0.95  # AdamW's beta2
    optimizer: Literal['adamw', 'muon'] = 'adamw'  # 'muon': torch.optim.Muon for the blocks' matrices, AdamW for the rest
    muon_lr: float = 0.02  # Muon's peak learning rate, scheduled as learning_rate is
    muon_weight_decay: float | None = None  # Muon's decoupled weight decay (times its learning rate); None: weight_decay
    muon_momentum: float = 0.95  # Muon's momentum
    muon_momentum_warmup: int = 0  # iterations over which Muon's momentum rises from 0.85 to muon_momentum (0: none)
    grad_clip: float = 1.0  # max global gradient norm; 0 disables
    decay_lr: bool = True  # warmup and cosine decay; False: a constant learning rate
    warmup_iters: int = 100  # iterations of linear warmup
    lr_decay_iters: int | None = None  # where the cosine reaches its floor (default: max_iters)
    min_lr_ratio: float = 0.1  # the cosine's floor as a fraction of the peak, for both optimizers (nanoGPT: 0.1)
    # system
    device: str = 'auto'  # 'auto' (cuda when available), 'cpu', 'cuda', 'cuda:N', 'mps'
    parallel: Literal['ddp', 'fsdp'] = 'ddp'  # under torchrun: a replica per process, or FSDP2's sharded parameters
    dtype: Literal['auto', 'float32', 'bfloat16', 'float16'] = 'auto'  # auto: bf16/fp16 on CUDA, fp32 elsewhere
    compile: bool | None = None  # torch.compile; default: on for CUDA only
    compile_scope: Literal['blocks', 'model'] = 'blocks'  # 'blocks': one graph that every block reuses (compile time flat in depth; orthogonal Q/K/V maps: a graph a block); 'model': the whole model in one graph (and under FSDP)
    seed: int = 1337  # seeds the weights, the data order and every random draw
    dist_timeout: float = 600.0  # seconds a process waits for the others in a collective (torchrun): past it a silent machine ends the run (docs/cluster.md)
    deterministic: bool = False  # torch.use_deterministic_algorithms (bit-exact reruns on one GPU)
    nan_policy: Literal['stop', 'skip'] = 'stop'  # on a non-finite loss/gradient: stop, or skip the step
    nan_max_skips: int = 10  # 'skip': stop after this many consecutive skipped steps

    def __post_init__(self):  # the model's own checks run in model_config, for the model it builds
        if self.model is None:
            self.model = 'vit' if self.dataset in IMAGE_DATASETS else 'gpt'
        where = RESIDUALS[self.residual].__module__ if self.residual in RESIDUALS else 'model'
        if self.rule_module is None and where != 'model':  # so that every reader of the run imports it
            self.rule_module = where
        stale = stale_protocol(RESIDUALS[self.residual]) if where != 'model' else []
        if stale:
            raise ValueError(f"residual={self.residual!r} (module {where}) takes {', '.join(stale)} in prepare or "
                             f"forward, the rule protocol before Sublayer; they now take one context: prepare(x, sub) "
                             f"-> h and forward(x, u, sub), sub.cache, sub.depth, sub.state (docs/rules.md, "
                             f"'Writing a rule')")
        self.options = model_config(self).options
        at_least_one(self, 'batch_size', 'gradient_accumulation_steps', 'eval_interval', 'eval_iters', 'log_interval',
                     'dynamics_interval', 'dynamics_gain_interval', 'aspect')
        for key in ('max_iters', 'warmup_iters', 'learning_rate', 'muon_lr', 'weight_decay', 'grad_clip', 'dropout',
                    'keep_last_n', 'nan_max_skips', 'crop_padding', 'mixup_alpha', 'cutmix_alpha', 'muon_momentum_warmup',
                    'depth', 'tokens_per_param'):
            if getattr(self, key) < 0:
                raise ValueError(f"{key}={getattr(self, key)} must not be negative")
        if self.muon_weight_decay is not None and self.muon_weight_decay < 0:
            raise ValueError(f"muon_weight_decay={self.muon_weight_decay} must not be negative")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout={self.dropout} must lie in [0, 1)")
        for key in ('mix_prob', 'mix_switch_prob', 'erase_prob'):
            if not 0 <= getattr(self, key) <= 1:
                raise ValueError(f"{key}={getattr(self, key)} must lie in [0, 1]")
        for key in ('beta1', 'beta2', 'muon_momentum'):
            if not 0 <= getattr(self, key) < 1:
                raise ValueError(f"{key}={getattr(self, key)} must lie in [0, 1)")
        if not self.dist_timeout > 0:
            raise ValueError(f"dist_timeout={self.dist_timeout} must be positive: the seconds a process waits for the "
                             f"others in a collective")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate={self.learning_rate} must be positive: the schedule scales every "
                             f"group's rate by its fraction of it")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"min_lr_ratio={self.min_lr_ratio} must lie in [0, 1]: the floor is that fraction of the peak")


MODELS = {'gpt': (GPT, GPTConfig), 'vit': (ViT, ViTConfig)}  # the config value `model` -> its classes


def model_config(cfg):
    """The GPTConfig or ViTConfig part of a Config, as its `model` key says (checked by its class)."""
    cls = MODELS[cfg.model][1]
    return cls(**{f.name: getattr(cfg, f.name) for f in fields(cls)})


def build_model(cfg):
    """The GPT or ViT a Config describes, initialised."""
    return MODELS[cfg.model][0](model_config(cfg))


def block_parameters(cfg):
    """Parameters of the blocks of the model cfg describes (built on the meta device: no memory)."""
    with torch.device('meta'):
        return sum(p.numel() for p in build_model(cfg).blocks.parameters())

