"""Train a GPT (or a ViT, for an image dataset) whose residual update is pluggable.

    python train.py config/shakespeare_rot.py                        # one process
    python train.py config/shakespeare_rot.py config/cpu.py          # nanoGPT's CPU recipe
    python train.py config/shakespeare_rot.py --max_iters=500        # any key: python train.py --help
    torchrun --standalone --nproc_per_node=8 train.py config/...     # DDP: nccl on CUDA, gloo on CPU

gradient_accumulation_steps counts the micro-steps of one optimizer step over all processes:
a step always sees gradient_accumulation_steps * batch_size * block_size tokens, and each of
the N processes runs gradient_accumulation_steps / N of them (which must divide evenly).

Stopping and resuming: Ctrl-C or SIGTERM saves a checkpoint at the next step boundary and
exits 0; --init_from=resume continues from the newest checkpoint that verifies, exactly as if
uninterrupted (same process count). A resumed run may switch residual between 'additive' and
'orthogonal' (and change ortho_* or dropout), with --reset_optimizer=True to restart AdamW and
the schedule there; the change is recorded in the checkpoint's history.
"""

import ctypes
import json
import math
import os
import signal
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import checkpoint
import configure
import diagnostics
from guards import Interrupt, NonFinite, StepScaler, rng_state, seed_all, set_rng_state
from model import maps_held, maps_once_per_step
from tasks import DataError, make_task

ROOT = os.path.dirname(os.path.abspath(__file__))
# model keys a resumed run may change: they choose the update rule or only the initial weights
SWITCHABLE = {'residual', 'ortho_mode', 'ortho_eps', 'ortho_prob', 'ortho_layers', 'dropout', 'init',
              'sigma_w', 'sigma_qk'}
UNRECORDED = {'init_from', 'eval_only', 'reset_optimizer'}


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


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)


def keep_freed_memory(device):
    """On a CPU device: keep the memory of freed tensors in the process for the next step's,
    rather than hand it back to the kernel. glibc serves large allocations with fresh mmap pages and
    trims the heap's top on free, by thresholds it adjusts as it goes, so a CPU step faults part of
    its activations in again, page by page, every step: up to 2,150 faults a step of
    config/cpu.py here, about 2 us each, and a speed that changes from run to run with the
    thresholds' history (docs/performance.md). Fixed thresholds (mallopt) serve every allocation
    below 1 GiB from a heap that is never trimmed, as PyTorch's caching allocator keeps GPU
    memory; the process holds its peak memory. Returns whether glibc took both settings (False
    for other devices, other C libraries and other systems)."""
    if device.split(':')[0] != 'cpu' or not sys.platform.startswith('linux'):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    # older glibc refuses mmap thresholds above 32 MiB (HEAP_MAX_SIZE / 2); 2.36 takes 1 GiB
    mmap = mallopt(M_MMAP_THRESHOLD, 1 << 30) or mallopt(M_MMAP_THRESHOLD, 32 << 20)
    return bool(mmap and mallopt(M_TRIM_THRESHOLD, 2**31 - 1))


def resolve_dtype(name, device_type):
    if name != 'auto':
        return name
    if device_type == 'cuda':
        return 'bfloat16' if torch.cuda.is_bf16_supported() else 'float16'
    return 'float32'


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


def make_optimizer(model, cfg, device_type):
    """AdamW; weight decay on matrices and embeddings, none on gains and biases, nor on the raw W
    behind orthogonal Q/K/V (decaying it pulls Q, K, V towards the identity, not towards zero).
    Fused on CUDA and on CPU: one kernel for all parameters, no host sync for the scaler's skip,
    and on this project's CPU 4x faster than the per-parameter loop PyTorch uses by default there
    (docs/performance.md)."""
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decay = [p for n, p in params if p.dim() >= 2 and '.parametrizations.' not in n]
    no_decay = [p for n, p in params if p.dim() < 2 or '.parametrizations.' in n]
    groups = [{'params': decay, 'weight_decay': cfg.weight_decay}, {'params': no_decay, 'weight_decay': 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.learning_rate, betas=(cfg.beta1, cfg.beta2),
                             fused=device_type in ('cuda', 'cpu'))


def resume_problems(saved, cfg, model_keys):
    """Why this config cannot continue the saved model (empty if it can)."""
    problems = []
    for k in model_keys:
        before, now = getattr(saved, k), getattr(cfg, k)
        if before == now:
            continue
        if k == 'residual' and 'rotation' in (before, now):
            problems.append(f"residual {before!r} -> {now!r}: 'rotation' builds another architecture (no norms "
                            f"in the blocks, a weightless RMSNorm after the embeddings, no final norm), so its "
                            f"weights do not carry over; switch between 'additive' and 'orthogonal' only")
        elif k == 'block_size':
            problems.append(f"block_size={now}: the checkpoint's position table has {before} positions; "
                            f"resume with --block_size={before}")
        elif k not in SWITCHABLE and k != 'vocab_size':  # the task explains a vocabulary change
            problems.append(f"{k}={before!r} (saved) vs {now!r} (now)")
    return problems


def train_step(model, optimizer, scaler, next_batch, micro_steps, grad_clip, autocast, ddp=False):
    """One optimizer step over micro_steps micro-batches from next_batch(); gradients average
    over micro-batches (and, through DDP, over processes, synchronised on the last micro-step
    only). A step with an inf/nan gradient is skipped by the scaler. Returns the last
    micro-batch's loss and each parameter's gradient norm, as device tensors: nothing syncs."""
    with maps_once_per_step(model, micro_steps) as before:
        for micro_step in range(micro_steps):
            x, y = next_batch()
            before(micro_step)
            with model.no_sync() if ddp and micro_step < micro_steps - 1 else nullcontext(), autocast:
                _, loss = model(x, y)
            scaler.scale(loss / micro_steps).backward()
    scaler.unscale_(optimizer)
    grads = [p.grad for group in optimizer.param_groups for p in group['params']]
    norms = torch._foreach_norm(grads)  # what clip_grad_norm_ computes, kept per parameter
    if grad_clip > 0:
        total = torch.linalg.vector_norm(torch.stack(norms))
        torch._foreach_mul_(grads, torch.clamp(grad_clip / (total + 1e-6), max=1.0))
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach(), norms


def oom_advice(cfg, first):
    step = 'the first training step' if first else 'a training step'
    b, g = cfg.batch_size, cfg.gradient_accumulation_steps
    fix = (f"lower batch_size and raise gradient_accumulation_steps by the same factor, which keeps the tokens "
           f"per step: --batch_size={b // 2} --gradient_accumulation_steps={g * 2}" if b > 1 else
           "lower block_size, or the model size (n_layer, n_embd)")
    return f"out of memory in {step} (batch_size={b}, block_size={cfg.block_size}, gradient_accumulation_steps={g}): {fix}"


def open_log(path, start_iter):
    """log.jsonl for appending, holding only the records up to start_iter: a run that died after
    its last checkpoint logged steps the resumed run will log again."""
    kept = []
    if start_iter and os.path.exists(path):
        with open(path) as f:
            kept = [line for line in f if json.loads(line)['iter'] <= start_iter]
    f = open(path, 'w')
    f.writelines(kept)
    return f


def wandb_mode():
    """WANDB_MODE if set; else 'online' when a W&B key is configured (env or `wandb login`),
    else 'offline'."""
    if os.environ.get('WANDB_MODE'):
        return os.environ['WANDB_MODE']
    if os.environ.get('WANDB_API_KEY'):
        return 'online'
    netrc = os.path.expanduser('~/.netrc')
    if os.path.exists(netrc):
        with open(netrc) as f:
            if 'api.wandb.ai' in f.read():
                return 'online'
    return 'offline'


def flatten(record, prefix=''):
    """Numbers of a nested record as {'a/b/0': v} for wandb."""
    out = {}
    for k, v in record.items():
        if k == 'iter' and not prefix:
            continue
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}/"))
        elif isinstance(v, list):
            out.update({f"{prefix}{k}/{i}": e for i, e in enumerate(v) if isinstance(e, (int, float))})
        elif isinstance(v, (int, float)):
            out[prefix + k] = v
    return out


def describe(metrics):
    return ', '.join(f"{k.replace('_', ' ')} {v:.4f}" if 'loss' in k else f"{k} {v:.2f}%" for k, v in metrics.items())


def format_eta(seconds):
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if '-h' in argv or '--help' in argv:
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
    keep_freed_memory(device)
    if cfg.gradient_accumulation_steps % world:
        fail(f"gradient_accumulation_steps={cfg.gradient_accumulation_steps} is not divisible by the "
             f"{world} processes; use a multiple of {world}")
    micro_steps = cfg.gradient_accumulation_steps // world
    dtype = resolve_dtype(cfg.dtype, device_type)
    autocast = nullcontext() if dtype == 'float32' else torch.autocast(device_type, dtype=getattr(torch, dtype))
    if device_type == 'cuda' and dtype == 'float32':  # else TF32 would only blur the orthogonal Q/K/V maps
        torch.set_float32_matmul_precision('high')
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    if cfg.deterministic:
        os.environ.setdefault('CUBLAS_WORKSPACE_CONFIG', ':4096:8')
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False

    try:
        task = make_task(cfg, device, rank, world)
    except DataError as e:
        fail(str(e))
    cfg, meta, per_iter = task.cfg, task.meta, task.items_per_iter

    ckpt, history, changes = None, [], {}
    if cfg.init_from == 'scratch' and os.path.exists(os.path.join(cfg.out_dir, 'ckpt.pt')):
        fail(f"{os.path.join(cfg.out_dir, 'ckpt.pt')} exists and a run from scratch would overwrite it; continue "
             f"it with --init_from=resume, or pick another --out_dir (or delete the old one)")
    if cfg.init_from == 'resume':
        try:
            ckpt, path, refused = checkpoint.load_latest(cfg.out_dir)
        except checkpoint.CheckpointError as e:
            fail(str(e))
        if master:
            for _, reason in refused:
                print(f"warning: {reason}")
            print(f"resuming from {path} (iteration {ckpt['iter_num']})")
        saved = configure.from_dict(ckpt['config'])
        problems = resume_problems(saved, cfg, task.model_keys()) + task.resume_problems(saved, ckpt.get('meta'))
        if problems:
            fail(f"cannot resume {path} with this config:\n  " + "\n  ".join(problems))
        changes = {k: [v, getattr(cfg, k)] for k, v in asdict(saved).items()
                   if k not in UNRECORDED and v != getattr(cfg, k)}
        history = ckpt.get('history', [])

    seed_all(cfg.seed)  # the same initial weights in every process
    model = task.model().to(device)
    optimizer = make_optimizer(model, cfg, device_type)
    scaler = StepScaler(device_type, dtype)
    iter_num, best_val_loss, schedule_start = 0, float('inf'), 0
    seed_all(cfg.seed + rank)  # dropout and stochastic connections differ per process
    if ckpt is not None:
        model.load_state_dict(ckpt['model'])
        iter_num, best_val_loss = ckpt['iter_num'], ckpt['best_val_loss']
        schedule_start = ckpt.get('schedule_start', 0)
        if cfg.reset_optimizer:
            schedule_start = iter_num
        else:
            optimizer.load_state_dict(ckpt['optimizer'])
            if ckpt['scaler']:
                scaler.load_state_dict(ckpt['scaler'])
        streams = ckpt['streams']
        if len(streams) == world:
            task.load_state_dict(streams[rank]['data'])
            set_rng_state(streams[rank]['rng'])
        elif master:
            print(f"note: checkpoint written by {len(streams)} processes, resuming on {world}: data streams re-seeded")
        if changes or cfg.reset_optimizer:
            history.append({'iter': iter_num, 'changes': changes, 'reset_optimizer': cfg.reset_optimizer})
            if master:
                print(f"at iteration {iter_num}: " + ', '.join(f"{k} {a!r} -> {b!r}" for k, (a, b) in changes.items())
                      + (" (optimizer and schedule reset)" if cfg.reset_optimizer else ""))
        del ckpt
    start_iter = iter_num

    raw_model = model
    if cfg.compile if cfg.compile is not None else device_type == 'cuda':
        model = torch.compile(model)
    if ddp:
        model = DDP(model, device_ids=[local_rank] if device_type == 'cuda' else None)
    names = {p: n for n, p in raw_model.named_parameters()}
    nonfinite = NonFinite([names[p] for g in optimizer.param_groups for p in g['params']], device)

    run = None
    if master:
        os.makedirs(cfg.out_dir, exist_ok=True)
        if not cfg.eval_only:
            with open(os.path.join(cfg.out_dir, 'config.json'), 'w') as f:
                json.dump(asdict(cfg), f, indent=1)
        print(f"{raw_model.num_params() / 1e6:.2f}M parameters, residual={cfg.residual}, qkv={cfg.qkv}; "
              f"{per_iter:,} {task.unit} per iteration; {world} process(es) on {device}, {dtype}")
        if cfg.wandb_log:
            import wandb
            run = wandb.init(project=cfg.wandb_project, name=cfg.wandb_run_name, config=asdict(cfg),
                             dir=cfg.out_dir, mode=wandb_mode())
    log_file = open_log(os.path.join(cfg.out_dir, 'log.jsonl'), start_iter) if master else None
    dynamics_file = (open_log(os.path.join(cfg.out_dir, 'dynamics.jsonl'), start_iter)
                     if master and cfg.dynamics else None)

    def log(record, file=None):
        if master:
            (file or log_file).write(json.dumps(record) + '\n')
            (file or log_file).flush()
            if run is not None:
                run.log(flatten(record), step=record['iter'])

    if history and history[-1]['iter'] == start_iter:
        log({'iter': start_iter, 'event': 'resume', **history[-1]})

    def save(best):
        mine = {'data': task.state_dict(), 'rng': rng_state(device_type),
                'batch_starts': getattr(task.loader, 'last_starts', None),
                'weights': torch.stack([p.detach().double().sum() for p in raw_model.parameters()]).cpu()}
        streams = [mine]
        if ddp:
            streams = [None] * world
            dist.all_gather_object(streams, mine)
            if not all(torch.equal(s['weights'], mine['weights']) for s in streams):
                fail(f"at iteration {iter_num} the {world} processes hold different weights: DDP replicas diverged")
        if not master:
            return
        path = os.path.join(cfg.out_dir, 'ckpt.pt')
        checkpoint.save({'model': raw_model.state_dict(), 'optimizer': optimizer.state_dict(),
                         'scaler': scaler.state_dict(), 'iter_num': iter_num, 'best_val_loss': best_val_loss,
                         'schedule_start': schedule_start, 'history': history, 'streams': streams,
                         'config': json.dumps(asdict(cfg)), 'meta': json.dumps(meta) if meta else None}, path)
        checkpoint.snapshot(cfg.out_dir, iter_num, cfg.keep_last_n)
        if best:
            checkpoint.link(path, os.path.join(cfg.out_dir, 'best.pt'))

    def finish():
        interrupt.restore()
        torch.use_deterministic_algorithms(was_deterministic)
        if master:
            log_file.close()
            if dynamics_file:
                dynamics_file.close()
            if run is not None:
                run.finish()
        if ddp:
            if sys.exc_info()[0] is None:
                # all processes ended cleanly: tear down together, after rank 0's last checkpoint
                # (a rank that got there first was seen to abort at exit, twice in ~20 CI runs)
                dist.barrier()
            dist.destroy_process_group()

    def evaluate():
        with maps_held(model):
            return task.evaluate(model, autocast, ddp, cfg.eval_iters)

    interrupt = Interrupt()
    try:
        if cfg.eval_only:
            metrics = evaluate()
            if master:
                print(f"iter {iter_num}: " + describe(metrics))
            return

        dts, t_last, iters_since = [], time.perf_counter(), 0
        while True:
            if (iter_num % cfg.eval_interval == 0 or iter_num == cfg.max_iters) and not (iter_num == start_iter > 0):
                metrics = evaluate()
                best = metrics['val_loss'] < best_val_loss
                best_val_loss = min(best_val_loss, metrics['val_loss'])
                record = {'iter': iter_num, **metrics}
                if master and cfg.dynamics:  # Oh et al. App. D: effective rank of the final representation
                    raw_model.eval()
                    record['effective_rank'] = diagnostics.effective_rank(
                        diagnostics.final_features(raw_model, task.eval_inputs()))
                    raw_model.train()
                if master:
                    print(f"step {iter_num}: {describe(metrics)}{' (best)' if best else ''}")
                log(record)
                if iter_num > start_iter:
                    save(best)
                t_last, iters_since = time.perf_counter(), 0
            if iter_num >= cfg.max_iters:
                break

            lr = get_lr(iter_num, cfg, schedule_start)
            for group in optimizer.param_groups:
                group['lr'] = lr
            try:
                loss, grad_norms = train_step(model, optimizer, scaler, task.next_batch, micro_steps, cfg.grad_clip,
                                              autocast, ddp)
            except torch.OutOfMemoryError:
                fail(oom_advice(cfg, iter_num == start_iter))
            except RuntimeError as e:
                if "can't allocate memory" not in str(e) and 'out of memory' not in str(e):
                    raise
                fail(oom_advice(cfg, iter_num == start_iter))
            nonfinite.record(iter_num, loss, grad_norms)
            iter_num += 1
            iters_since += 1
            if master and cfg.dynamics and iter_num % cfg.dynamics_interval == 0:
                raw_model.eval()  # no dropout, expected stochastic connections: no random numbers drawn
                stats = diagnostics.update_stats(raw_model, task.batch[0])
                raw_model.train()
                log(diagnostics.stats_record(iter_num, raw_model, stats), dynamics_file)

            at_log = iter_num % cfg.log_interval == 0  # the host syncs here only
            if at_log:
                count, first, streak, bad = nonfinite.check()
                if master:
                    lossf = loss.item()
                    now = time.perf_counter()
                    dt = (now - t_last) / iters_since
                    t_last, iters_since = now, 0
                    dts.append(dt)
                    eta = sorted(dts)[len(dts) // 2] * (cfg.max_iters - iter_num)
                    print(f"iter {iter_num}: loss {lossf:.4f}, lr {lr:.2e}, {dt * 1000:.1f} ms/iter, "
                          f"{per_iter / dt:,.0f} {task.unit}/s{task.progress()}, eta {format_eta(eta)}")
                    log({'iter': iter_num, 'loss': lossf, 'lr': lr, 'ms_per_iter': dt * 1000,
                         f'{task.unit}_per_s': per_iter / dt})
                if count:
                    where = ', '.join(bad[:8]) + (f" and {len(bad) - 8} more" if len(bad) > 8 else '')
                    report = (f"non-finite loss or gradients at iteration {first} ({count} of the last "
                              f"{cfg.log_interval} steps, skipped); parameters with non-finite gradients: "
                              f"{where or 'none (the loss itself)'}")
                    log({'iter': iter_num, 'event': 'nonfinite', 'first': first, 'count': count, 'params': bad})
                    if cfg.nan_policy == 'stop' or streak >= cfg.nan_max_skips:
                        save(False)
                        why = ("nan_policy='stop'" if cfg.nan_policy == 'stop'
                               else f"{streak} consecutive steps skipped (nan_max_skips={cfg.nan_max_skips})")
                        fail(f"{report}.\nStopped ({why}); the parameters from before those steps are saved in "
                             f"{cfg.out_dir}/ckpt.pt. Resume with a lower learning_rate or longer warmup_iters, "
                             f"or with --nan_policy=skip")
                    if master:
                        print(f"warning: {report}")
            signum = interrupt.agreed(ddp, device) if at_log or not ddp else 0
            if signum:
                save(False)
                if master:
                    print(f"stopped by {signal.Signals(signum).name} at iteration {iter_num}; checkpoint saved to "
                          f"{cfg.out_dir}/ckpt.pt; continue with --init_from=resume")
                return

        if master:
            median = sorted(dts)[len(dts) // 2] if dts else float('nan')
            print(f"done: {iter_num} iterations, best val loss {best_val_loss:.4f}, "
                  f"median {median * 1000:.1f} ms/iter, {per_iter / median:,.0f} {task.unit}/s")
    finally:
        finish()


if __name__ == '__main__':
    main()
