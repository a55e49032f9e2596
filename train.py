"""Train a GPT whose residual update is pluggable.

    python train.py config/shakespeare_rot.py                        # one process
    python train.py config/shakespeare_rot.py config/cpu.py          # nanoGPT's CPU recipe
    python train.py config/shakespeare_rot.py --max_iters=500        # any key: python train.py --help
    torchrun --standalone --nproc_per_node=8 train.py config/...     # DDP: nccl on CUDA, gloo on CPU

gradient_accumulation_steps counts the micro-steps of one optimizer step over all processes:
a step always sees gradient_accumulation_steps * batch_size * block_size tokens, and each of
the N processes runs gradient_accumulation_steps / N of them (which must divide evenly).
"""

import json
import math
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, fields, replace

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import checkpoint
import configure
from data.loader import TokenWindows
from model import GPT, GPTConfig

ROOT = os.path.dirname(os.path.abspath(__file__))
MODEL_KEYS = [f.name for f in fields(GPTConfig)]


def fail(msg):
    sys.exit(f"error: {msg}")


def resolve_device(name):
    if name == 'auto':
        return 'cuda' if torch.cuda.is_available() else 'cpu'
    if name.startswith('cuda') and not torch.cuda.is_available():
        fail(f"--device={name} but torch {torch.__version__} sees no CUDA GPU "
             f"({'a CPU-only build' if torch.version.cuda is None else 'none visible'}); use --device=cpu")
    if name == 'mps' and not torch.backends.mps.is_available():
        fail("--device=mps but MPS is not available here; use --device=cpu")
    return name


def resolve_dtype(name, device_type):
    if name != 'auto':
        return name
    if device_type == 'cuda':
        return 'bfloat16' if torch.cuda.is_bf16_supported() else 'float16'
    return 'float32'


def get_lr(it, cfg):
    """Linear warmup over warmup_iters, then cosine decay to min_lr at lr_decay_iters."""
    if not cfg.decay_lr:
        return cfg.learning_rate
    min_lr = cfg.learning_rate / 10 if cfg.min_lr is None else cfg.min_lr
    decay_iters = cfg.max_iters if cfg.lr_decay_iters is None else cfg.lr_decay_iters
    if it < cfg.warmup_iters:
        return cfg.learning_rate * (it + 1) / (cfg.warmup_iters + 1)
    if it >= decay_iters:
        return min_lr
    ratio = (it - cfg.warmup_iters) / (decay_iters - cfg.warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (cfg.learning_rate - min_lr)


def make_optimizer(model, cfg, device_type):
    """AdamW; weight decay on matrices and embeddings (dim >= 2), none on gains and biases."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{'params': [p for p in params if p.dim() >= 2], 'weight_decay': cfg.weight_decay},
              {'params': [p for p in params if p.dim() < 2], 'weight_decay': 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.learning_rate, betas=(cfg.beta1, cfg.beta2),
                             fused=device_type == 'cuda')


def data_dir(cfg):
    return cfg.data_dir or os.path.join(ROOT, 'data', cfg.dataset)


def dataset_files(cfg, master, ddp):
    """(train.bin, val.bin, meta or None); prepares Tiny Shakespeare when its files are missing."""
    folder = data_dir(cfg)
    train_bin, val_bin = os.path.join(folder, 'train.bin'), os.path.join(folder, 'val.bin')
    meta_path = os.path.join(folder, 'meta.json')
    ready = os.path.exists(train_bin) and os.path.exists(val_bin)
    if not ready and cfg.dataset != 'shakespeare_char':
        fail(f"dataset {cfg.dataset!r} is not prepared: {train_bin} is missing.\n"
             f"Prepare it first: python data/{cfg.dataset}/prepare.py")
    if not (ready and os.path.exists(meta_path)) and cfg.dataset == 'shakespeare_char':
        if master:
            from data.shakespeare_char.prepare import PrepareError, prepare
            try:
                prepare(out_dir=folder)
            except PrepareError as e:
                fail(str(e))
        if ddp:
            dist.barrier()
    meta = None
    if os.path.exists(meta_path):
        with open(meta_path, encoding='utf-8') as f:
            meta = json.load(f)
    return train_bin, val_bin, meta


def train_step(model, optimizer, scaler, next_batch, micro_steps, grad_clip, autocast, ddp=False):
    """One optimizer step over micro_steps micro-batches from next_batch(); gradients average
    over micro-batches (and, through DDP, over processes, synchronised on the last micro-step
    only). Returns the last micro-batch's loss as a tensor: reading it is the caller's choice."""
    for micro_step in range(micro_steps):
        x, y = next_batch()
        with model.no_sync() if ddp and micro_step < micro_steps - 1 else nullcontext(), autocast:
            _, loss = model(x, y)
        scaler.scale(loss / micro_steps).backward()
    if grad_clip > 0:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


@torch.no_grad()
def evaluate(model, loaders, eval_iters, autocast, ddp):
    """Mean loss per split over eval_iters batches; the loaders restart, so every evaluation
    sees the same batches. Under DDP each process draws its own and the means are averaged."""
    model.eval()
    out = {}
    for split, loader in loaders.items():
        loader.reset()
        total = torch.zeros((), device=loader.device)
        for _ in range(eval_iters):
            x, y = loader.next()
            with autocast:
                _, loss = model(x, y)
            total += loss.float()
        if ddp:
            dist.all_reduce(total, op=dist.ReduceOp.AVG)
        out[split] = total.item() / eval_iters
    model.train()
    return out


def wandb_mode():
    """'online' when a W&B key is configured (env or `wandb login`), else 'offline'."""
    if os.environ.get('WANDB_API_KEY') or os.environ.get('WANDB_MODE') == 'online':
        return 'online'
    netrc = os.path.expanduser('~/.netrc')
    if os.path.exists(netrc):
        with open(netrc) as f:
            if 'api.wandb.ai' in f.read():
                return 'online'
    return 'offline'


def format_eta(seconds):
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (['-h'], ['--help']):
        print(__doc__)
        print(configure.usage())
        return
    try:
        cfg = configure.load(argv)
    except configure.ConfigError as e:
        fail(f"config: {e}")

    ddp = 'RANK' in os.environ  # set by torchrun
    if ddp:
        rank, local_rank, world = (int(os.environ[k]) for k in ('RANK', 'LOCAL_RANK', 'WORLD_SIZE'))
        device = resolve_device(cfg.device)
        if device.startswith('cuda'):
            device = f'cuda:{local_rank}'
            torch.cuda.set_device(device)
        dist.init_process_group('nccl' if device.startswith('cuda') else 'gloo')
    else:
        rank, local_rank, world = 0, 0, 1
        device = resolve_device(cfg.device)
    master = rank == 0
    device_type = device.split(':')[0]
    if cfg.gradient_accumulation_steps % world:
        fail(f"gradient_accumulation_steps={cfg.gradient_accumulation_steps} is not divisible by the "
             f"{world} processes; use a multiple of {world}")
    micro_steps = cfg.gradient_accumulation_steps // world
    tokens_per_iter = cfg.gradient_accumulation_steps * cfg.batch_size * cfg.block_size
    dtype = resolve_dtype(cfg.dtype, device_type)
    autocast = nullcontext() if dtype == 'float32' else torch.autocast(device_type, dtype=getattr(torch, dtype))
    if device_type == 'cuda':
        torch.set_float32_matmul_precision('high')

    train_bin, val_bin, meta = dataset_files(cfg, master, ddp)
    if meta is not None:
        cfg = replace(cfg, vocab_size=meta['vocab_size'])

    ckpt = None
    existing = os.path.join(cfg.out_dir, 'ckpt.pt')
    if cfg.init_from == 'scratch' and os.path.exists(existing):
        fail(f"{existing} exists and a run from scratch would overwrite it; continue it with "
             f"--init_from=resume, or pick another --out_dir (or delete the old one)")
    if cfg.init_from == 'resume':
        try:
            ckpt = checkpoint.load(existing)
        except checkpoint.CheckpointError as e:
            fail(str(e))
        saved = configure.from_dict(ckpt['config'])
        changed = [k for k in MODEL_KEYS if getattr(saved, k) != getattr(cfg, k)]
        if changed:
            fail("the checkpoint's model differs from this config: "
                 + ', '.join(f"{k}={getattr(saved, k)!r} (saved) vs {getattr(cfg, k)!r} (now)" for k in changed)
                 + "; resume with the config it was trained with")

    torch.manual_seed(cfg.seed)  # the same initial weights in every process
    model = GPT(configure.model_config(cfg)).to(device)
    optimizer = make_optimizer(model, cfg, device_type)
    scaler = torch.amp.GradScaler(device_type, enabled=dtype == 'float16')
    train_loader = TokenWindows(train_bin, cfg.block_size, cfg.batch_size, cfg.seed + rank, device)
    eval_loaders = {split: TokenWindows(path, cfg.block_size, cfg.batch_size, cfg.seed + 10_000 + rank, device)
                    for split, path in (('train', train_bin), ('val', val_bin))}
    iter_num, best_val_loss = 0, float('inf')
    torch.manual_seed(cfg.seed + rank)  # dropout and stochastic connections differ per process
    if ckpt is not None:
        model.load_state_dict(ckpt['model'])
        optimizer.load_state_dict(ckpt['optimizer'])
        scaler.load_state_dict(ckpt['scaler'])
        iter_num, best_val_loss = ckpt['iter_num'], ckpt['best_val_loss']
        streams = ckpt['streams']
        if len(streams) == world:
            train_loader.load_state_dict(streams[rank]['loader'])
            torch.set_rng_state(streams[rank]['rng'])
        elif master:
            print(f"note: checkpoint written by {len(streams)} processes, resuming on {world}: data streams re-seeded")
        del ckpt
    start_iter = iter_num

    raw_model = model
    if cfg.compile if cfg.compile is not None else device_type == 'cuda':
        model = torch.compile(model)
    if ddp:
        model = DDP(model, device_ids=[local_rank] if device_type == 'cuda' else None)

    run = None
    if master:
        os.makedirs(cfg.out_dir, exist_ok=True)
        with open(os.path.join(cfg.out_dir, 'config.json'), 'w') as f:
            json.dump(asdict(cfg), f, indent=1)
        print(f"{raw_model.num_params() / 1e6:.2f}M parameters, residual={cfg.residual}, qkv={cfg.qkv}; "
              f"{tokens_per_iter:,} tokens per iteration; {world} process(es) on {device}, {dtype}")
        if cfg.wandb_log:
            import wandb
            run = wandb.init(project=cfg.wandb_project, name=cfg.wandb_run_name, config=asdict(cfg),
                             dir=cfg.out_dir, mode=wandb_mode())
    log_file = open(os.path.join(cfg.out_dir, 'log.jsonl'), 'a' if start_iter else 'w') if master else None

    def log(record):
        if master:
            log_file.write(json.dumps(record) + '\n')
            log_file.flush()
            if run is not None:
                run.log({k: v for k, v in record.items() if k != 'iter'}, step=record['iter'])

    def save(best):
        mine = {'loader': pending_batch_state, 'rng': torch.get_rng_state()}
        streams = [mine]
        if ddp:
            streams = [None] * world
            dist.all_gather_object(streams, mine)
        if not master:
            return
        path = os.path.join(cfg.out_dir, 'ckpt.pt')
        checkpoint.save({'model': raw_model.state_dict(), 'optimizer': optimizer.state_dict(),
                         'scaler': scaler.state_dict(), 'iter_num': iter_num, 'best_val_loss': best_val_loss,
                         'config': json.dumps(asdict(cfg)), 'meta': json.dumps(meta) if meta else None,
                         'streams': streams}, path)
        if best:
            checkpoint.link_or_copy(path, os.path.join(cfg.out_dir, 'best.pt'))

    if cfg.eval_only:
        losses = evaluate(model, eval_loaders, cfg.eval_iters, autocast, ddp)
        if master:
            print(f"iter {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        if ddp:
            dist.destroy_process_group()
        return

    pending_batch_state = train_loader.state_dict()  # saved, so a resumed run redraws the pending batch
    x, y = train_loader.next()

    def next_batch():
        """The pending batch; the following one is drawn now, so a CUDA copy overlaps compute."""
        nonlocal x, y, pending_batch_state
        batch = x, y
        pending_batch_state = train_loader.state_dict()
        x, y = train_loader.next()
        return batch

    dts, t_last, iters_since = [], time.perf_counter(), 0
    while True:
        if (iter_num % cfg.eval_interval == 0 or iter_num == cfg.max_iters) and not (iter_num == start_iter > 0):
            losses = evaluate(model, eval_loaders, cfg.eval_iters, autocast, ddp)
            best = losses['val'] < best_val_loss
            best_val_loss = min(best_val_loss, losses['val'])
            if master:
                print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}"
                      f"{' (best)' if best else ''}")
            log({'iter': iter_num, 'train_loss': losses['train'], 'val_loss': losses['val']})
            if iter_num > start_iter:
                save(best)
            t_last, iters_since = time.perf_counter(), 0
        if iter_num >= cfg.max_iters:
            break

        lr = get_lr(iter_num, cfg)
        for group in optimizer.param_groups:
            group['lr'] = lr
        loss = train_step(model, optimizer, scaler, next_batch, micro_steps, cfg.grad_clip, autocast, ddp)
        iter_num += 1
        iters_since += 1

        if iter_num % cfg.log_interval == 0 and master:
            lossf = loss.item()  # the host syncs here only, once per log line
            now = time.perf_counter()
            dt = (now - t_last) / iters_since
            t_last, iters_since = now, 0
            dts.append(dt)
            eta = sorted(dts)[len(dts) // 2] * (cfg.max_iters - iter_num)
            print(f"iter {iter_num}: loss {lossf:.4f}, lr {lr:.2e}, {dt * 1000:.1f} ms/iter, "
                  f"{tokens_per_iter / dt:,.0f} tok/s, eta {format_eta(eta)}")
            log({'iter': iter_num, 'loss': lossf, 'lr': lr, 'ms_per_iter': dt * 1000,
                 'tokens_per_s': tokens_per_iter / dt})

    if master:
        median = sorted(dts)[len(dts) // 2] if dts else float('nan')
        print(f"done: {iter_num} iterations, best val loss {best_val_loss:.4f}, "
              f"median {median * 1000:.1f} ms/iter, {tokens_per_iter / median:,.0f} tok/s")
        log_file.close()
        if run is not None:
            run.finish()
    if ddp:
        dist.destroy_process_group()


if __name__ == '__main__':
    main()
