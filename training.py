"""What train.py shares with the other tools: the process and its device and dtype, DDP or FSDP,
the optimizer and its schedule, one optimizer step, and the checks that a checkpoint can be
resumed with a config."""

import json
import math
import os
import time
from contextlib import nullcontext
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.nn.utils import parametrize

from model import SWITCHABLE, maps_held
from tasks import build_model, model_classes


def fail(msg):
    """Exit with a user's error. Under torchrun it goes to the error file torchrun reads too, so
    that its failure report ends with the message rather than "To enable traceback see ..."."""
    text = f"error: {msg}"
    if os.environ.get('TORCHELASTIC_ERROR_FILE'):
        with open(os.environ['TORCHELASTIC_ERROR_FILE'], 'w') as f:
            json.dump({'message': text, 'timestamp': int(time.time())}, f)
    raise SystemExit(text)


def resolve_device(name):
    if name == 'auto':
        return 'cuda' if torch.cuda.is_available() else 'cpu'
    if name.startswith('cuda') and not torch.cuda.is_available():
        fail(f"--device={name} but torch {torch.__version__} sees no CUDA GPU "
             f"({'a CPU-only build' if torch.version.cuda is None else 'none visible'}); on a CPU use --device=cpu "
             f"and a model sized for it: stack config/cpu.py after the config")
    if name == 'mps' and not torch.backends.mps.is_available():
        fail("--device=mps but MPS is not available here; use --device=cpu")
    return name


def resolve_dtype(name, device_type):
    if name != 'auto':
        return name
    if device_type == 'cuda':
        return 'bfloat16' if torch.cuda.is_bf16_supported() else 'float16'
    return 'float32'


def autocast(device_type, dtype):
    """The forward's autocast context: none for float32."""
    return nullcontext() if dtype == 'float32' else torch.autocast(device_type, dtype=getattr(torch, dtype))


@dataclass
class Env:
    """Where this process runs: its rank among `world` processes, device, dtype and autocast."""
    rank: int
    local_rank: int
    world: int
    ddp: bool  # launched by torchrun: a process group, gradients synchronised
    fsdp: bool  # parameters sharded over it (parallel='fsdp')
    device: str
    dtype: str
    autocast: Any

    @property
    def master(self):
        return self.rank == 0

    @property
    def device_type(self):
        return self.device.split(':')[0]


def setup(cfg):
    """This process's Env: joins torchrun's process group, picks device and dtype."""
    device = resolve_device(cfg.device)
    rank, local_rank, world = 0, 0, 1
    ddp = 'RANK' in os.environ  # set by torchrun
    if ddp:
        rank, local_rank, world = (int(os.environ[k]) for k in ('RANK', 'LOCAL_RANK', 'WORLD_SIZE'))
        if device.startswith('cuda'):
            device = f'cuda:{local_rank}'
            torch.cuda.set_device(device)
        dist.init_process_group('nccl' if device.startswith('cuda') else 'gloo')
    fsdp = cfg.parallel == 'fsdp'
    if fsdp and not ddp:
        fail("parallel='fsdp' shards the model over torchrun's processes: launch with torchrun "
             "(--nproc_per_node=1 for one process)")
    if cfg.gradient_accumulation_steps % world:
        fail(f"gradient_accumulation_steps={cfg.gradient_accumulation_steps} is not divisible by the "
             f"{world} processes; use a multiple of {world}")
    device_type = device.split(':')[0]
    dtype = resolve_dtype(cfg.dtype, device_type)
    if fsdp and cfg.dynamics:
        fail("dynamics=True measures the stream with a forward of rank 0 alone, which FSDP's sharded model "
             "cannot run: use parallel='ddp' for it")
    if fsdp and cfg.optimizer == 'muon':
        fail("optimizer='muon' orthogonalises whole matrices, which parallel='fsdp' shards: use parallel='ddp'")
    if fsdp and dtype == 'float16':
        fail("parallel='fsdp' computes in bfloat16 or float32 here (float16 would need a sharded loss scaler): "
             "use --dtype=bfloat16")
    if device_type == 'cuda' and dtype == 'float32':  # else TF32 would only blur the orthogonal Q/K/V maps
        torch.set_float32_matmul_precision('high')
    if cfg.deterministic:
        os.environ.setdefault('CUBLAS_WORKSPACE_CONFIG', ':4096:8')
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
    return Env(rank, local_rank, world, ddp, fsdp, device, dtype, autocast(device_type, dtype))


def parallelize(model, cfg, env):
    """(the model to train, its optimizer). FSDP2 shards every block and then the whole model over
    the process group (fully_shard), casting parameters to env's dtype for compute (the raw W of a
    Q/K/V map stays float32; autocast runs as without FSDP) and reducing gradients in float32; DDP
    keeps a replica per process. torch.compile (cfg.compile; default: on CUDA) comes between."""
    if env.fsdp:
        mp = MixedPrecisionPolicy(param_dtype=getattr(torch, env.dtype), reduce_dtype=torch.float32)
        whole = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)
        for block in model.blocks:
            if parametrize.is_parametrized(block.attn.c_attn):  # the Q/K/V map reads its raw W in float32
                fully_shard(block.attn.c_attn, mp_policy=whole)
            fully_shard(block, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
    optimizer = make_optimizer(model, cfg, env.device_type)
    if cfg.compile if cfg.compile is not None else env.device_type == 'cuda':
        model = torch.compile(model)
    if env.ddp and not env.fsdp:
        model = DDP(model, device_ids=[env.local_rank] if env.device_type == 'cuda' else None)
    return model, optimizer


def fingerprint(model):
    """Each parameter's sum in float64, of this process's shard under FSDP: equal across DDP replicas."""
    return torch.stack([(p.to_local() if isinstance(p, DTensor) else p).detach().double().sum()
                        for p in model.parameters()]).cpu()


def get_lr(it, cfg, start=0):
    """Linear warmup over warmup_iters from `start` (0, or where the optimizer was reset),
    then cosine decay to min_lr at lr_decay_iters."""
    if not cfg.decay_lr:
        return cfg.learning_rate
    min_lr = cfg.learning_rate / 10 if cfg.min_lr is None else cfg.min_lr
    decay_iters = (cfg.max_iters if cfg.lr_decay_iters is None else cfg.lr_decay_iters) - start
    it -= start
    if it < cfg.warmup_iters:
        return cfg.learning_rate * (it + 1) / (cfg.warmup_iters + 1)
    if it >= decay_iters:
        return min_lr
    ratio = (it - cfg.warmup_iters) / (decay_iters - cfg.warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (cfg.learning_rate - min_lr)


class Optimizers:
    """AdamW alone, or torch.optim.Muon for the blocks' matrices beside AdamW for the rest, stepped
    as one. Every param group keeps its own learning rate ('base_lr') for the schedule to scale."""

    def __init__(self, **named):
        self.named = named
        self.base = {name: [g['base_lr'] for g in o.param_groups] for name, o in named.items()}

    def __iter__(self):
        return iter(self.named.values())

    @property
    def param_groups(self):
        return [g for o in self for g in o.param_groups]

    def set_lr(self, fraction):
        """Each group at its base learning rate times fraction (the schedule's)."""
        for group in self.param_groups:
            group['lr'] = group['base_lr'] * fraction

    def zero_grad(self, set_to_none=True):
        for o in self:
            o.zero_grad(set_to_none=set_to_none)

    def state_dict(self):
        return {name: o.state_dict() for name, o in self.named.items()}

    def load_state_dict(self, state):
        if 'param_groups' in state:  # a checkpoint from before Muon: AdamW's state alone
            state = {'adamw': state}
        for name, o in self.named.items():
            o.load_state_dict(state[name])
        self.keep_base_lr()

    def keep_base_lr(self):
        """Each group's base learning rate from the config again: loading a state replaces the
        groups with the saved ones, whose rates are the old run's (or missing, before Muon)."""
        for name, o in self.named.items():
            for group, lr in zip(o.param_groups, self.base[name]):
                group['base_lr'] = lr


def make_optimizer(model, cfg, device_type):
    """AdamW; weight decay on matrices and embeddings, none on gains and biases, nor on the raw W
    behind orthogonal Q/K/V (decaying it pulls Q, K, V towards the identity, not towards zero).
    Fused where PyTorch has the kernel (CUDA, CPU): one kernel for all parameters, and the
    scaler's skip of a non-finite step stays on the device. With optimizer='muon', Muon takes the
    blocks' 2-D matrices (attention and MLP weights, the raw W behind Q/K/V maps) at muon_lr with
    the same weight decay; AdamW keeps the embeddings, head, gains, biases and scaling vectors."""
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    muon = [(n, p) for n, p in params if cfg.optimizer == 'muon' and n.startswith('blocks.') and p.dim() == 2]
    rest = [(n, p) for n, p in params if not any(p is q for _, q in muon)]

    def groups(named, lr):
        decay = [p for n, p in named if p.dim() >= 2 and '.parametrizations.' not in n]
        no_decay = [p for n, p in named if p.dim() < 2 or '.parametrizations.' in n]
        return [{'params': decay, 'weight_decay': cfg.weight_decay, 'base_lr': lr},
                {'params': no_decay, 'weight_decay': 0.0, 'base_lr': lr}]
    adamw = torch.optim.AdamW(groups(rest, cfg.learning_rate), lr=cfg.learning_rate, betas=(cfg.beta1, cfg.beta2),
                              fused=device_type in ('cuda', 'cpu'))
    if not muon:
        return Optimizers(adamw=adamw)
    return Optimizers(adamw=adamw, muon=torch.optim.Muon(groups(muon, cfg.muon_lr), lr=cfg.muon_lr,
                                                         momentum=cfg.muon_momentum))


def hold_across_micro_steps(maps, micro_step, micro_steps):
    """The orthogonal Q/K/V maps of one optimizer step (maps {map: value}, computed once by
    model.maps_held) across its micro-steps: until the last one, backward stops at a leaf copy of
    each value, where the gradients sum; the last backward runs through the maps once with that sum
    added, so the raw weights (and DDP's hooks on them) get the whole step's gradient at once."""
    for p, value in maps.items():
        if micro_step == 0:
            p.held = value.detach().requires_grad_()
        elif micro_step == micro_steps - 1 and p.held.grad is not None:
            extra, p.held = p.held.grad, value.view_as(value)
            p.held.register_hook(lambda g, extra=extra: g + extra)
        elif micro_step == micro_steps - 1:
            p.held = value


def maps_of(model, env, grad=False):
    """model.maps_held, except under FSDP, where each layer's raw W is whole only inside its own
    forward, which computes its map there (yields {} then)."""
    return nullcontext({}) if env is not None and env.fsdp else maps_held(model, grad=grad)


def synchronising(model, env, last):
    """A micro-step's context: gradients reduced across processes on the last micro-step only."""
    if env is not None and env.fsdp:
        model.set_requires_gradient_sync(last)
    return model.no_sync() if env is not None and env.ddp and not env.fsdp and not last else nullcontext()


def train_step(model, optimizer, scaler, next_batch, micro_steps, grad_clip, amp, env=None):
    """One optimizer step over micro_steps micro-batches from next_batch(); gradients average
    over micro-batches (and over env's processes, reduced on the last micro-step only), under the
    autocast context amp. The orthogonal Q/K/V maps are computed once for all micro-steps, except
    under FSDP, where each layer's raw W is whole only inside its own forward. A step with an
    inf/nan gradient anywhere is skipped, by every optimizer and every FSDP shard alike. Then the
    residual rule's after_step. Returns the last micro-batch's loss and the parameters' gradient
    norms (one tensor, in param_groups' order), on the device: nothing syncs, except Muon's step, which reads the scaler's verdict."""
    with maps_of(model, env, grad=True) as maps:
        for micro_step in range(micro_steps):
            x, y = next_batch()
            if micro_steps > 1:
                hold_across_micro_steps(maps, micro_step, micro_steps)
            with synchronising(model, env, micro_step == micro_steps - 1), amp:
                _, loss = model(x, y)
            scaler.scale(loss / micro_steps).backward()
    grads = [p.grad for group in optimizer.param_groups for p in group['params']]
    norms = torch.stack(torch._foreach_norm(grads))  # what clip_grad_norm_ computes, kept per parameter
    if isinstance(norms, DTensor):  # FSDP: partial norms of the shards, reduced at once
        norms = norms.full_tensor()
    norms = norms * scaler.inverse()
    # one pass over the gradients: the clipping factor (scaling by the scaler's power of two
    # commutes with it exactly), or nan everywhere where any gradient is non-finite, since the
    # scaler skips only an optimizer whose own gradients are: the whole step is skipped, not a part
    clip = torch.clamp(grad_clip / (torch.linalg.vector_norm(norms) + 1e-6), max=1.0) if grad_clip > 0 else 1.0
    torch._foreach_mul_(grads, torch.where(torch.isfinite(norms).all(), clip, float('nan')))
    for opt in optimizer:
        scaler.unscale_(opt)
    for opt in optimizer:  # Muon, without the fused kernels' on-device skip, reads the scaler's verdict
        scaler.step(opt)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    (model.module if isinstance(model, DDP) else model).after_step()
    return loss.detach(), norms


def parameter_shapes(cfg):
    """{name: shape} of the model cfg builds, built on the meta device (no memory, no init)."""
    with torch.device('meta'):
        return {n: tuple(t.shape) for n, t in build_model(cfg).state_dict().items()}


def resume_problems(saved, cfg):
    """Why the model of config `cfg` cannot continue one saved with config `saved` (empty if it can).
    A changed residual rule is refused where the two rules build different parameters."""
    problems = []
    for k in (f.name for f in fields(model_classes(cfg)[1])):
        before, now = getattr(saved, k), getattr(cfg, k)
        if before == now or k in SWITCHABLE or k == 'vocab_size':  # the task explains a vocabulary change
            continue
        if k == 'block_size':
            problems.append(f"block_size={now}: the checkpoint's position table has {before} positions; "
                            f"resume with --block_size={before}")
        else:
            problems.append(f"{k}={before!r} (saved) vs {now!r} (now)")
    if not problems and saved.residual != cfg.residual:
        old, new = parameter_shapes(saved), parameter_shapes(cfg)
        if old != new:
            differ = sorted({n for n, _ in set(old.items()) ^ set(new.items())})
            problems.append(f"residual {saved.residual!r} -> {cfg.residual!r}: the two rules build different "
                            f"parameters ({', '.join(differ[:3])}{', ...' if len(differ) > 3 else ''}), "
                            f"so the weights do not carry over; switch between rules that keep them, such as "
                            f"'additive' and 'orthogonal'")
    return problems
