"""Every key a config file or a --key=value override may set, with its type and default.

Model keys are inherited from model.GPTConfig and model.ViTConfig; the keys below drive train.py.
"""

from dataclasses import dataclass
from typing import Literal

from model import GPTConfig, ViTConfig, at_least_one


@dataclass
class Config(GPTConfig, ViTConfig):
    # output, evaluation, logging
    out_dir: str = 'out'
    # 'resume': continue from out_dir's checkpoint; pretrained weights: 'gpt2', 'gpt2-medium', 'gpt2-large',
    # 'gpt2-xl' (from the Hugging Face hub) or a folder with config.json and model.safetensors (hf.py)
    init_from: str = 'scratch'
    reset_optimizer: bool = False  # on resume: fresh AdamW state and a schedule restarted there
    keep_last_n: int = 2  # also keep the last n checkpoints as ckpt-<iter>.pt (0: none)
    eval_interval: int = 250  # iterations between evaluations (and checkpoints)
    eval_iters: int = 200  # batches per split per evaluation
    eval_only: bool = False  # evaluate once and exit
    log_interval: int = 10  # iterations between log lines
    dynamics: bool = False  # log per-block stream statistics to out_dir/dynamics.jsonl (plot_dynamics.py)
    dynamics_interval: int = 100  # iterations between those measurements (one extra forward each)
    wandb_log: bool = False  # offline mode when no WANDB_API_KEY is set
    wandb_project: str = 'orthogpt'
    wandb_run_name: str | None = None
    # data
    dataset: str = 'shakespeare_char'
    data_dir: str | None = None  # default: data/<dataset>
    # image datasets (cifar10, cifar100, fashion_mnist): augmentation on the device, per batch
    image_dir: str | None = None  # fashion_mnist: a folder of IDX .gz files (default: Debian's)
    crop_padding: int = 0  # random crop after zero-padding by this many pixels (0: none)
    hflip: bool = False  # random horizontal flips (not for digit-like data)
    mixup_alpha: float = 0.0  # mixup's Beta(alpha, alpha); 0 disables
    cutmix_alpha: float = 0.0  # cutmix's Beta(alpha, alpha); 0 disables
    mix_prob: float = 1.0  # probability that a batch is mixed at all
    mix_switch_prob: float = 0.5  # with both alphas set: probability of cutmix rather than mixup
    erase_prob: float = 0.0  # random erasing, per image
    batch_size: int = 12  # sequences per micro-step, per process
    gradient_accumulation_steps: int = 1  # micro-steps per optimizer step summed over all processes
    # AdamW and learning-rate schedule (linear warmup, cosine decay to min_lr)
    learning_rate: float = 6e-4
    max_iters: int = 5000
    weight_decay: float = 0.1  # on matrices and embeddings only
    beta1: float = 0.9
    beta2: float = 0.95
    optimizer: Literal['adamw', 'muon'] = 'adamw'  # 'muon': torch.optim.Muon for the blocks' matrices, AdamW for the rest
    muon_lr: float = 0.02  # Muon's learning rate, scheduled as learning_rate is
    muon_momentum: float = 0.95
    grad_clip: float = 1.0  # max global gradient norm; 0 disables
    decay_lr: bool = True
    warmup_iters: int = 100
    lr_decay_iters: int | None = None  # default: max_iters
    min_lr: float | None = None  # default: learning_rate / 10
    # system
    device: str = 'auto'  # 'auto' (cuda when available), 'cpu', 'cuda', 'cuda:N', 'mps'
    parallel: Literal['ddp', 'fsdp'] = 'ddp'  # under torchrun: a replica per process, or FSDP2's sharded parameters
    dtype: Literal['auto', 'float32', 'bfloat16', 'float16'] = 'auto'  # auto: bf16/fp16 on CUDA, fp32 elsewhere
    compile: bool | None = None  # torch.compile; default: on for CUDA only
    seed: int = 1337
    deterministic: bool = False  # torch.use_deterministic_algorithms (bit-exact reruns on one GPU)
    nan_policy: Literal['stop', 'skip'] = 'stop'  # on a non-finite loss/gradient: stop, or skip the step
    nan_max_skips: int = 10  # 'skip': stop after this many consecutive skipped steps

    def __post_init__(self):
        super().__post_init__()
        at_least_one(self, 'batch_size', 'gradient_accumulation_steps', 'eval_interval', 'eval_iters', 'log_interval',
                     'dynamics_interval')
        for key in ('max_iters', 'warmup_iters', 'learning_rate', 'muon_lr', 'weight_decay', 'grad_clip', 'dropout',
                    'keep_last_n', 'nan_max_skips', 'crop_padding', 'mixup_alpha', 'cutmix_alpha'):
            if getattr(self, key) < 0:
                raise ValueError(f"{key}={getattr(self, key)} must not be negative")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout={self.dropout} must lie in [0, 1)")
        for key in ('mix_prob', 'mix_switch_prob', 'erase_prob'):
            if not 0 <= getattr(self, key) <= 1:
                raise ValueError(f"{key}={getattr(self, key)} must lie in [0, 1]")
        for key in ('beta1', 'beta2', 'muon_momentum'):
            if not 0 <= getattr(self, key) < 1:
                raise ValueError(f"{key}={getattr(self, key)} must lie in [0, 1)")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate={self.learning_rate} must be positive: the schedule scales every "
                             f"group's rate by its fraction of it")
        if self.min_lr is not None and self.min_lr > self.learning_rate:
            raise ValueError(f"min_lr={self.min_lr} exceeds learning_rate={self.learning_rate}")
